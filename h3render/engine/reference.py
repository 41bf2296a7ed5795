"""An independent float64 numpy forward of the Wan 2.1 DiT, for verify mode.

It reads weights and config from a converted ``transformer-<quant>.gguf`` with
gguf-py's ``GGUFReader`` (not our C reader), or from the diffusers source folder
with ``safetensors`` (to catch conversion bugs), turns each weight into float64
when it is used, and computes diffusers' ``WanTransformer3DModel`` forward (text
to video) in float64 with plain numpy: conv3d patch embedding, sinusoidal time
embedding, 3-D rope, RMS-normed q/k attention, gated FFN, AdaLN head.

It produces the same named stages as the engine's taps (``dit.patch_embed``,
``dit.temb``, ``dit.timestep_proj``, ``dit.context``, ``dit.block.<i>``,
``dit.out``), so verify mode can compare them one by one. Weights are read per
block, so a real checkpoint verifies without holding float64 copies of all of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

Tap = Callable[[str, np.ndarray], None]


class ReferenceError(ValueError):
    """The GGUF file cannot be read as a Wan DiT; the message names file and field."""


@dataclass(frozen=True)
class DitConfig:
    patch: tuple[int, int, int]
    heads: int
    head_dim: int
    in_channels: int
    out_channels: int
    text_dim: int
    freq_dim: int
    ffn_dim: int
    num_layers: int
    eps: float
    cross_attn_norm: bool
    rope_max_seq_len: int

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim


class GGUFWeights:
    """Config values and float64 tensors (original numpy shapes) from one GGUF file."""

    def __init__(self, path: Path | str):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self._reader = GGUFReader(self.path, "r")
        except (OSError, ValueError) as exc:
            raise ReferenceError(f"{self.path}: cannot read as GGUF: {exc}") from None
        self._tensors = {t.name: t for t in self._reader.tensors}

    def meta(self, key: str, default=None):
        field = self._reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor `name` as float64 in its original shape, checked against `shape`."""
        from gguf import GGMLQuantizationType as Q
        from gguf.quants import dequantize

        t = self._tensors.get(name)
        if t is None:
            raise ReferenceError(f"{self.path}: tensor '{name}' is missing")
        if t.tensor_type in (Q.F32, Q.F16):
            arr = np.asarray(t.data, dtype=np.float64)
        else:
            arr = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
        original = self.meta(f"h3r.shape.{name}")
        if original is not None:
            arr = arr.reshape([int(d) for d in original])
        return _checked(self.path, name, arr, shape)


class DiffusersWeights:
    """Config and float64 tensors straight from a diffusers ``transformer/`` folder.

    Read with the ``safetensors`` package, so a converter bug (a tensor renamed,
    reshaped or rounded wrongly) shows up as a difference against the engine.
    Accepts the pipeline folder (with ``transformer/``) or the transformer folder.
    """

    def __init__(self, folder: Path | str):
        import json

        folder = Path(folder)
        if (folder / "transformer" / "config.json").is_file():
            folder = folder / "transformer"
        self.path = folder
        cfg_path = folder / "config.json"
        try:
            self._config = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as exc:
            raise ReferenceError(f"{cfg_path}: cannot read the transformer config: {exc}") from None
        index = folder / "diffusion_pytorch_model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._where = {name: folder / shard for name, shard in weight_map.items()}
        else:
            from safetensors import safe_open

            self._where = {}
            for f in sorted(folder.glob("*.safetensors")):
                with safe_open(f, framework="numpy") as st:
                    self._where.update({name: f for name in st.keys()})
        if not self._where:
            raise ReferenceError(f"{folder}: no .safetensors weights")

    def meta(self, key: str, default=None):
        if not key.startswith("h3r.") or key.startswith("h3r.shape."):
            return default  # tensors keep their original shapes here
        value = self._config.get(key[len("h3r."):])
        return default if value is None else value

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        from safetensors import safe_open

        f = self._where.get(name)
        if f is None:
            raise ReferenceError(f"{self.path}: tensor '{name}' is missing")
        try:
            with safe_open(f, framework="numpy") as st:
                arr = np.asarray(st.get_tensor(name), dtype=np.float64)
        except (TypeError, ValueError) as exc:  # e.g. bf16, which numpy cannot hold
            raise ReferenceError(f"{f}: tensor '{name}' cannot be read as numpy: {exc}") from None
        return _checked(f, name, arr, shape)


Weights = GGUFWeights | DiffusersWeights


def open_weights(path: Path | str) -> Weights:
    """A converted ``transformer-<quant>.gguf`` file, or a diffusers folder."""
    path = Path(path)
    return DiffusersWeights(path) if path.is_dir() else GGUFWeights(path)


def _checked(path: Path, name: str, arr: np.ndarray, shape: tuple[int, ...] | None) -> np.ndarray:
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ReferenceError(
            f"{path}: tensor '{name}' has shape {tuple(arr.shape)}, expected {tuple(shape)}"
        )
    return arr


def read_config(w: Weights) -> DitConfig:
    def req(key: str):
        v = w.meta(f"h3r.{key}")
        if v is None:
            raise ReferenceError(f"{w.path}: config h3r.{key} is missing")
        return v

    patch = tuple(int(p) for p in req("patch_size"))
    if len(patch) != 3 or min(patch) < 1:
        raise ReferenceError(f"{w.path}: config h3r.patch_size = {patch}; expected 3 values >= 1")
    cfg = DitConfig(
        patch=patch,  # type: ignore[arg-type]
        heads=int(req("num_attention_heads")),
        head_dim=int(req("attention_head_dim")),
        in_channels=int(req("in_channels")),
        out_channels=int(w.meta("h3r.out_channels", req("in_channels"))),
        text_dim=int(req("text_dim")),
        freq_dim=int(w.meta("h3r.freq_dim", 256)),
        ffn_dim=int(req("ffn_dim")),
        num_layers=int(req("num_layers")),
        eps=float(w.meta("h3r.eps", 1e-6)),
        cross_attn_norm=bool(w.meta("h3r.cross_attn_norm", True)),
        rope_max_seq_len=int(w.meta("h3r.rope_max_seq_len", 1024)),
    )
    if cfg.head_dim % 2:
        raise ReferenceError(f"{w.path}: config h3r.attention_head_dim = {cfg.head_dim} must be even")
    if w.meta("h3r.image_dim") is not None or w.meta("h3r.added_kv_proj_dim") is not None:
        raise ReferenceError(f"{w.path}: image-to-video models are not supported")
    return cfg


# ---------------------------------------------------------------- pieces


def _linear(w: Weights, prefix: str, x: np.ndarray, n_in: int, n_out: int) -> np.ndarray:
    W = w.tensor(f"{prefix}.weight", (n_out, n_in))
    b = w.tensor(f"{prefix}.bias", (n_out,))
    return x @ W.T + b


def _layernorm(x: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def _rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def timestep_embedding(t: float, dim: int) -> np.ndarray:
    """get_timestep_embedding(flip_sin_to_cos=True, downscale_freq_shift=0): [cos, sin].

    diffusers forms the angles t * f_i in float32 whatever the model's dtype,
    and at t ~ 1000 that rounding (~6e-5 rad) is part of the model's
    definition, so the angles are formed in float32 here too; sin and cos are
    then taken in float64.
    """
    half = dim // 2
    exponent = np.float32(-math.log(10000.0)) * np.arange(half, dtype=np.float32)
    freqs = np.exp(exponent / np.float32(half))
    arg = (np.float32(t) * freqs).astype(np.float64)
    emb = np.concatenate([np.cos(arg), np.sin(arg)])
    return np.pad(emb, (0, dim - 2 * half))


def rope_angles(cfg: DitConfig, grid: tuple[int, int, int]) -> np.ndarray:
    """(N, Dh/2) rotation angles: head dim split t | h | w as WanRotaryPosEmbed."""
    h_dim = w_dim = 2 * (cfg.head_dim // 6)
    t_dim = cfg.head_dim - h_dim - w_dim
    parts = []
    for axis, d in enumerate((t_dim, h_dim, w_dim)):
        inv = 1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d))  # (d/2,)
        pos = np.arange(grid[axis], dtype=np.float64)
        shape = [1, 1, 1, d // 2]
        shape[axis] = grid[axis]
        ang = (pos[:, None] * inv[None, :]).reshape(shape)
        parts.append(np.broadcast_to(ang, (*grid, d // 2)))
    return np.concatenate(parts, axis=-1).reshape(-1, cfg.head_dim // 2)


def _apply_rope(x: np.ndarray, ang: np.ndarray, heads: int) -> np.ndarray:
    """x (N, H*Dh) with pairs (2i, 2i+1) of each head turned by ang (N, Dh/2)."""
    n = x.shape[0]
    z = x.reshape(n, heads, -1, 2)
    x1, x2 = z[..., 0], z[..., 1]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    return np.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).reshape(n, -1)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int) -> np.ndarray:
    nq, nk = q.shape[0], k.shape[0]
    qh = q.reshape(nq, heads, -1).transpose(1, 0, 2)  # (H, Nq, Dh)
    kh = k.reshape(nk, heads, -1).transpose(1, 0, 2)
    vh = v.reshape(nk, heads, -1).transpose(1, 0, 2)
    s = qh @ kh.transpose(0, 2, 1) / math.sqrt(qh.shape[-1])
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    p = s / s.sum(axis=-1, keepdims=True)
    return (p @ vh).transpose(1, 0, 2).reshape(nq, -1)


# ---------------------------------------------------------------- model


class ReferenceDiT:
    """diffusers WanTransformer3DModel forward in float64.

    `path` is a converted transformer GGUF file or a diffusers folder."""

    def __init__(self, path: Path | str):
        self.weights = open_weights(path)
        self.config = read_config(self.weights)

    def _attn(self, prefix: str, xq: np.ndarray, xkv: np.ndarray, ang: np.ndarray | None):
        cfg, w, D = self.config, self.weights, self.config.dim
        q = _linear(w, f"{prefix}.to_q", xq, D, D)
        k = _linear(w, f"{prefix}.to_k", xkv, D, D)
        v = _linear(w, f"{prefix}.to_v", xkv, D, D)
        q = _rmsnorm(q, w.tensor(f"{prefix}.norm_q.weight", (D,)), cfg.eps)
        k = _rmsnorm(k, w.tensor(f"{prefix}.norm_k.weight", (D,)), cfg.eps)
        if ang is not None:
            q = _apply_rope(q, ang, cfg.heads)
            k = _apply_rope(k, ang, cfg.heads)
        return _linear(w, f"{prefix}.to_out.0", _attention(q, k, v, cfg.heads), D, D)

    def forward(self, x: np.ndarray, timestep: float, context: np.ndarray,
                tap: Tap | None = None) -> np.ndarray:
        """x (C, T, Y, X), context (L, text_dim) -> flow prediction (Co, T, Y, X), float64."""
        cfg, w, D = self.config, self.weights, self.config.dim
        emit = tap or (lambda _name, _arr: None)
        x = np.asarray(x, np.float64)
        context = np.asarray(context, np.float64)
        C, T, Y, X = x.shape
        pt, py, px = cfg.patch
        if C != cfg.in_channels or T % pt or Y % py or X % px:
            raise ValueError(
                f"x shape {x.shape}: channels must be {cfg.in_channels} and (T, Y, X) "
                f"multiples of the patch {cfg.patch}"
            )
        if context.ndim != 2 or context.shape[1] != cfg.text_dim:
            raise ValueError(f"context shape {context.shape}: expected (L, {cfg.text_dim})")
        grid = (T // pt, Y // py, X // px)
        N = grid[0] * grid[1] * grid[2]

        # patch embedding: Conv3d with kernel = stride = patch, as one product
        patches = (
            x.reshape(C, grid[0], pt, grid[1], py, grid[2], px)
            .transpose(1, 3, 5, 0, 2, 4, 6)
            .reshape(N, C * pt * py * px)
        )
        Wp = w.tensor("patch_embedding.weight", (D, C, pt, py, px)).reshape(D, -1)
        h = patches @ Wp.T + w.tensor("patch_embedding.bias", (D,))
        emit("dit.patch_embed", h)

        # condition embedder
        te = "condition_embedder.time_embedder"
        temb = _linear(w, f"{te}.linear_1", timestep_embedding(float(timestep), cfg.freq_dim),
                       cfg.freq_dim, D)
        temb = _linear(w, f"{te}.linear_2", _silu(temb), D, D)
        emit("dit.temb", temb)
        tproj = _linear(w, "condition_embedder.time_proj", _silu(temb), D, 6 * D).reshape(6, D)
        emit("dit.timestep_proj", tproj)
        tx = "condition_embedder.text_embedder"
        ctx = _linear(w, f"{tx}.linear_1", context, cfg.text_dim, D)
        ctx = _linear(w, f"{tx}.linear_2", _gelu_tanh(ctx), D, D)
        emit("dit.context", ctx)

        ang = rope_angles(cfg, grid)
        for i in range(cfg.num_layers):
            b = f"blocks.{i}"
            mod = w.tensor(f"{b}.scale_shift_table", (1, 6, D))[0] + tproj
            shift, scale, gate, c_shift, c_scale, c_gate = mod
            n = _layernorm(h, cfg.eps) * (1.0 + scale) + shift
            h = h + self._attn(f"{b}.attn1", n, n, ang) * gate
            if cfg.cross_attn_norm:
                n = (_layernorm(h, cfg.eps) * w.tensor(f"{b}.norm2.weight", (D,))
                     + w.tensor(f"{b}.norm2.bias", (D,)))
            else:
                n = h
            h = h + self._attn(f"{b}.attn2", n, ctx, None)
            n = _layernorm(h, cfg.eps) * (1.0 + c_scale) + c_shift
            f = _gelu_tanh(_linear(w, f"{b}.ffn.net.0.proj", n, D, cfg.ffn_dim))
            h = h + _linear(w, f"{b}.ffn.net.2", f, cfg.ffn_dim, D) * c_gate
            emit(f"dit.block.{i}", h)

        shift, scale = w.tensor("scale_shift_table", (1, 2, D))[0] + temb
        n = _layernorm(h, cfg.eps) * (1.0 + scale) + shift
        Co = cfg.out_channels
        o = _linear(w, "proj_out", n, D, Co * pt * py * px)
        out = (
            o.reshape(*grid, pt, py, px, Co)
            .transpose(6, 0, 3, 1, 4, 2, 5)
            .reshape(Co, T, Y, X)
        )
        emit("dit.out", out)
        return out
