"""Weight quantization for the converter, in the GGML block layouts.

Q8_0 and Q4_0 come from gguf-py (``gguf.quants.quantize``), which computes
them bit for bit as ggml's reference quantizers do. gguf-py has no Q6_K
quantizer, so :func:`quantize_q6_k` is written here from the block layout
(see csrc/quant.h); gguf-py's ``dequantize`` reads its output.

Q6_K, per 256-element super-block::

    x[i] ~ d * scales[i // 16] * (q[i] - 32),   q in 0..63, scales int8, d f16

Each 16-element sub-block first gets its own best scale (the signed element of
largest magnitude maps to -32, then one least-squares refit of the scale for
the rounded values); the 16 sub-block scales are then quantized to int8
against the super-block scale d = max_scale / -128, and the values are
re-rounded against the scales actually stored.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
Q6_K_BYTES = 210

# Smallest |scale| treated as nonzero; below it a sub-block is stored as zeros.
_TINY = 1e-30


def _round_half_away(a: np.ndarray) -> np.ndarray:
    return np.sign(a) * np.floor(np.abs(a) + 0.5)


def quantize_q6_k(data: np.ndarray) -> np.ndarray:
    """data (..., K) float32, K a multiple of 256 -> uint8 (..., K // 256 * 210)."""
    data = np.asarray(data, dtype=np.float32)
    if data.shape[-1] % QK_K:
        raise ValueError(f"q6_k needs rows of a multiple of {QK_K} elements, got {data.shape[-1]}")
    lead = data.shape[:-1]
    blocks = data.reshape(-1, QK_K // 16, 16).astype(np.float64)  # (nb, 16 sub-blocks, 16)
    nb = blocks.shape[0]

    # Per sub-block scale: the signed max maps to -32, then a least-squares refit.
    imax = np.abs(blocks).argmax(axis=-1)[..., None]
    vmax = np.take_along_axis(blocks, imax, axis=-1)  # (nb, 16, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(np.abs(vmax) > _TINY, -32.0 / vmax, 0.0)
    lv = np.clip(_round_half_away(blocks * iscale), -32, 31)
    sumlx = (lv * blocks).sum(axis=-1, keepdims=True)
    suml2 = (lv * lv).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 > 0, sumlx / suml2, 0.0)[..., 0]  # (nb, 16)

    # Super-block scale: the signed largest sub-block scale maps to -128.
    jmax = np.abs(scale).argmax(axis=-1)[:, None]
    smax = np.take_along_axis(scale, jmax, axis=-1)  # (nb, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        isc = np.where(np.abs(smax) > _TINY, -128.0 / smax, 0.0)
    sc = np.clip(_round_half_away(scale * isc), -128, 127).astype(np.int8)  # (nb, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(isc != 0, 1.0 / isc, 0.0).astype(np.float16)  # (nb, 1)

    # Values against the stored scales (as the decoder will see them).
    ds = d.astype(np.float32).astype(np.float64) * sc.astype(np.float64)  # (nb, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(ds[..., None] != 0, _round_half_away(blocks / ds[..., None]), 0.0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(nb, QK_K)

    # Pack: element i = 128*h + 32*s + l.
    q = q.reshape(nb, 2, 4, 32)  # (nb, h, s, l)
    ql = np.empty((nb, 2, 2, 32), np.uint8)  # (nb, h, s & 1, l)
    ql[:, :, 0] = (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4)
    ql[:, :, 1] = (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    out = np.concatenate(
        [ql.reshape(nb, 128), qh.reshape(nb, 64).astype(np.uint8), sc.view(np.uint8), d.view(np.uint8)], axis=1
    )
    return out.reshape(*lead, -1)


def quantize(data: np.ndarray, level: str) -> np.ndarray:
    """data (M, K) float32 -> the bytes of GGML type `level` (q8_0, q4_0, q6_k)."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import quantize as gguf_quantize

    if level == "q6_k":
        return quantize_q6_k(data)
    qtype = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0}[level]
    return gguf_quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)
