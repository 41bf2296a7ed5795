"""Engine ops (csrc/ops.c, csrc/types.c) against float64 numpy references.

Every op is reached through the test-only exports (csrc/test_exports.h). Shapes
include sizes that are not multiples of the kernels' 8-lane dot product, the
matmul column block (8) or the attention tiles (16 queries x 64 keys), and
Nq != Nk. Threaded ops must give byte-identical output for 1, 2 and 3 threads,
and the SIMD kernels byte-identical output to the scalar _ref kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import rel_err
from gguf_fuzz_child import core_lib, last_error

# Tolerances (relative error = max abs error / max |reference|, conftest.rel_err):
# matmul: float32 products summed over K <= 777 terms in float32 (8 partial sums);
# rounding grows ~sqrt(K) * 2^-24 relative to the largest term; measured 1.6e-7.
TOL_MATMUL = 1e-5
# attention: float32 dots over Dh, the softmax exp (ops.c exp_ref: Cephes polynomial, within
# 2 ulp of expf, SIMD lanes bit-identical), and an online softmax rescale per key tile
# (64 keys); measured 4.8e-7 with biases of std 3.
TOL_ATTENTION = 1e-5
# norms: statistics in double, one float32 rounding of the output and one of the
# affine; ~1 ulp (6e-8) each, measured 8e-8.
TOL_NORM = 1e-6
# activations: libm expf/tanhf/erff (gelu_tanh: ops.c exp_ref, within 2 ulp of expf) are
# within a few ulp; one float32 rounding.
TOL_ACT = 1e-6


def ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data


def with_ref_kernels(fn, *args, **kw):
    """Run fn with the ops forced onto their scalar _ref kernels."""
    core_lib().h3r_test_force_ref(1)
    try:
        return fn(*args, **kw)
    finally:
        core_lib().h3r_test_force_ref(0)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_thread_pool_runs_every_index_once(threads):
    """h3r_pool_run calls fn once per ith in [0, nth), nth = pool size, over many rounds."""
    n = core_lib().h3r_test_pool(threads, 2000)
    assert n == threads, last_error()


def test_thread_pool_default_size():
    """threads <= 0: one per online CPU."""
    import os

    assert core_lib().h3r_test_pool(0, 10) == os.cpu_count()


def matmul(x, w, b, threads, f16=False):
    N, K = x.shape
    M = w.shape[0]
    y = np.full((N, M), np.nan, np.float32)
    rc = core_lib().h3r_test_matmul(threads, ptr(y), ptr(x), ptr(w), 1 if f16 else 0, ptr(b), N, K, M)
    assert rc == 0, last_error()
    return y


# Odd K (8-lane tails), N around the 4-row tile, M around the column blocks (6 or 8) and the
# 2- and 3-column tiles; K past the 256-element chunks of the AVX2 tile, with a short last chunk.
MATMUL_SHAPES = [(1, 1, 1), (1, 300, 7), (5, 37, 19), (17, 64, 33), (3, 130, 8), (40, 9, 2), (2, 16, 65),
                 (8, 23, 17), (9, 40, 3), (9, 777, 26), (13, 520, 40)]


@pytest.mark.parametrize("N,K,M", MATMUL_SHAPES)
@pytest.mark.parametrize("wtype", ["f32", "f16"])
@pytest.mark.parametrize("bias", [True, False])
def test_matmul(N, K, M, wtype, bias):
    rng = np.random.default_rng(N * 1000 + K * 10 + M)
    x = rng.standard_normal((N, K)).astype(np.float32)
    w32 = rng.standard_normal((M, K)).astype(np.float32)
    w = w32.astype(np.float16) if wtype == "f16" else w32
    b = rng.standard_normal(M).astype(np.float32) if bias else None
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    if bias:
        ref += b
    outs = [matmul(x, w, b, t, f16=wtype == "f16") for t in (1, 2, 3)]
    err = rel_err(outs[0], ref)
    assert err < TOL_MATMUL, f"matmul {N}x{K}x{M} {wtype}: rel err {err:.2e}"
    for t, o in zip((2, 3), outs[1:]):
        assert o.tobytes() == outs[0].tobytes(), f"{t} threads differ from 1 thread"
    scalar = with_ref_kernels(matmul, x, w, b, 2, f16=wtype == "f16")
    assert scalar.tobytes() == outs[0].tobytes(), "SIMD matmul differs from matmul_ref"


def test_matmul_rejects_unknown_weight_type():
    x = np.zeros((1, 4), np.float32)
    y = np.zeros((1, 4), np.float32)
    # 3 is q4_1: a GGML type the matmul kernels do not take (8 q8_0 is valid now)
    rc = core_lib().h3r_test_matmul(1, ptr(y), ptr(x), ptr(x), 3, None, 1, 4, 4)
    assert rc < 0
    assert "wtype 3" in last_error()


def attention_ref(q, k, v, H, Dh, scale, bias=None):
    Nq, Nk = q.shape[0], k.shape[0]
    qh = q.astype(np.float64).reshape(Nq, H, Dh).transpose(1, 0, 2)
    kh = k.astype(np.float64).reshape(Nk, H, Dh).transpose(1, 0, 2)
    vh = v.astype(np.float64).reshape(Nk, H, Dh).transpose(1, 0, 2)
    s = scale * qh @ kh.transpose(0, 2, 1)
    if bias is not None:
        s = s + bias
    with np.errstate(invalid="ignore"):  # fully masked rows give NaN here; tests compare them apart
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
    return (s @ vh).transpose(1, 0, 2).reshape(Nq, H * Dh)


def attention(q, k, v, H, Dh, scale, threads, bias=None):
    Nq, Nk = q.shape[0], k.shape[0]
    out = np.full((Nq, H * Dh), np.nan, np.float32)
    rc = core_lib().h3r_test_attention(threads, ptr(out), ptr(q), ptr(k), ptr(v), Nq, Nk, H, Dh, scale, ptr(bias))
    assert rc == 0, last_error()
    return out


ATT_SHAPES = [(1, 1, 1, 1), (37, 70, 3, 12), (16, 64, 2, 8), (33, 130, 2, 16), (70, 5, 1, 128), (3, 200, 4, 7),
              (20, 75, 2, 112)]   # Dh 112: the 64-, 32- and 16-column P V tiles (AVX2: 24 and 16) in one row


@pytest.mark.parametrize("Nq,Nk,H,Dh", ATT_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_attention(Nq, Nk, H, Dh, with_bias):
    rng = np.random.default_rng(Nq * 7 + Nk * 3 + H + Dh)
    q = rng.standard_normal((Nq, H * Dh)).astype(np.float32)
    k = rng.standard_normal((Nk, H * Dh)).astype(np.float32)
    v = rng.standard_normal((Nk, H * Dh)).astype(np.float32)
    bias = rng.standard_normal((H, Nq, Nk)).astype(np.float32) * 3 if with_bias else None
    scale = Dh**-0.5
    ref = attention_ref(q, k, v, H, Dh, scale, bias)
    outs = [attention(q, k, v, H, Dh, scale, t, bias) for t in (1, 2, 3)]
    err = rel_err(outs[0], ref)
    assert err < TOL_ATTENTION, f"attention Nq={Nq} Nk={Nk} H={H} Dh={Dh}: rel err {err:.2e}"
    for o in outs[1:]:
        assert o.tobytes() == outs[0].tobytes(), "thread count changed the attention output"
    scalar = with_ref_kernels(attention, q, k, v, H, Dh, scale, 2, bias)
    assert scalar.tobytes() == outs[0].tobytes(), "SIMD attention differs from the _ref kernels"


def test_attention_large_logits_stay_finite():
    """Scores of several hundred: a softmax without max subtraction overflows expf."""
    rng = np.random.default_rng(5)
    H, Dh, Nq, Nk = 2, 16, 20, 150
    q = (rng.standard_normal((Nq, H * Dh)) * 10).astype(np.float32)
    k = (rng.standard_normal((Nk, H * Dh)) * 10).astype(np.float32)
    v = rng.standard_normal((Nk, H * Dh)).astype(np.float32)
    out = attention(q, k, v, H, Dh, 1.0, 2)
    assert np.isfinite(out).all()
    err = rel_err(out, attention_ref(q, k, v, H, Dh, 1.0))
    assert err < TOL_ATTENTION, f"rel err {err:.2e}"


def test_attention_masked_bias():
    """-inf bias entries get zero weight; a fully masked row gives zeros (not NaN)."""
    rng = np.random.default_rng(6)
    H, Dh, Nq, Nk = 2, 8, 5, 90
    q = rng.standard_normal((Nq, H * Dh)).astype(np.float32)
    k = rng.standard_normal((Nk, H * Dh)).astype(np.float32)
    v = rng.standard_normal((Nk, H * Dh)).astype(np.float32)
    bias = np.zeros((H, Nq, Nk), np.float32)
    bias[:, :, 70:] = -np.inf      # padding keys, spanning the second key tile
    bias[:, 1, :65] = -np.inf      # row 1: the whole first key tile masked
    bias[1, 4, :] = -np.inf        # head 1, row 4: everything masked
    out = attention(q, k, v, H, Dh, Dh**-0.5, 1, bias)
    ref = attention_ref(q[:, :], k[:70], v[:70], H, Dh, Dh**-0.5, bias[:, :, :70].copy())
    ref = ref.reshape(Nq, H, Dh)
    ref[4, 1, :] = 0.0
    got = out.reshape(Nq, H, Dh)
    assert np.isfinite(got).all()
    assert np.all(got[4, 1] == 0.0)
    err = rel_err(got, ref)
    assert err < TOL_ATTENTION, f"rel err {err:.2e}"


def test_attention_rejects_bad_shape():
    x = np.zeros((1, 4), np.float32)
    rc = core_lib().h3r_test_attention(1, ptr(x), ptr(x), ptr(x), ptr(x), 1, 0, 1, 4, 1.0, None)
    assert rc < 0 and "Nk=0" in last_error()


NORM_SHAPES = [(1, 1), (7, 33), (3, 1536), (2, 5)]


@pytest.mark.parametrize("N,D", NORM_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm(N, D, affine):
    rng = np.random.default_rng(N + D)
    # A large common offset: a float32 single-pass variance would lose digits.
    x = (rng.standard_normal((N, D)) * 2 + 300).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32) if affine else None
    b = rng.standard_normal(D).astype(np.float32) if affine else None
    eps = 1e-6
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + eps)
    if affine:
        ref = ref * w + b
    got = x.copy()
    assert core_lib().h3r_test_layernorm(ptr(got), N, D, ptr(w), ptr(b), eps) == 0
    err = rel_err(got, ref)
    assert err < TOL_NORM, f"layernorm {N}x{D}: rel err {err:.2e}"


@pytest.mark.parametrize("N,D", NORM_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm(N, D, affine):
    rng = np.random.default_rng(10 + N + D)
    x = (rng.standard_normal((N, D)) * 50).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32) if affine else None
    eps = 1e-6
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps)
    if affine:
        ref = ref * w
    got = x.copy()
    assert core_lib().h3r_test_rmsnorm(ptr(got), N, D, ptr(w), eps) == 0
    err = rel_err(got, ref)
    assert err < TOL_NORM, f"rmsnorm {N}x{D}: rel err {err:.2e}"


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf)(x)


ACTIVATIONS = {
    0: ("gelu_tanh", lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))),
    1: ("gelu_erf", lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    2: ("silu", lambda x: x / (1 + np.exp(-x))),
}


@pytest.mark.parametrize("which", sorted(ACTIVATIONS))
def test_activation(which):
    name, f = ACTIVATIONS[which]
    x = np.concatenate([np.linspace(-12, 12, 4001), [-80.0, -30.0, 0.0, 1e-30, 30.0, 80.0]]).astype(np.float32)
    ref = f(x.astype(np.float64))
    got = x.copy()
    assert core_lib().h3r_test_activation(which, ptr(got), got.size) == 0
    err = rel_err(got, ref)
    assert err < TOL_ACT, f"{name}: rel err {err:.2e}"
    # Relative to each value, away from zero crossings: catches errors the global scale hides.
    far = np.abs(ref) > 1e-3
    local = np.max(np.abs(got[far] - ref[far]) / np.abs(ref[far]))
    assert local < 1e-5, f"{name}: worst elementwise relative error {local:.2e}"


def test_gelu_tanh_export_matches_activation():
    x = np.linspace(-5, 5, 101).astype(np.float32)
    a, b = x.copy(), x.copy()
    core_lib().h3r_test_gelu_tanh(ptr(a), a.size)
    core_lib().h3r_test_activation(0, ptr(b), b.size)
    assert a.tobytes() == b.tobytes()


def test_gelu_tanh_simd_matches_ref():
    """The 8-lane gelu_tanh (ops.c exp_avx) against the scalar exp_ref loop, byte for byte,
    over a length that leaves a scalar tail and values where the exp clamps at +-88."""
    x = np.concatenate([np.linspace(-60, 60, 4003), [-1e4, -0.0, 1e-30, 1e4, np.inf, -np.inf]]).astype(np.float32)

    def gelu(v):
        out = v.copy()
        core_lib().h3r_test_gelu_tanh(ptr(out), out.size)
        return out

    simd, scalar = gelu(x), with_ref_kernels(gelu, x)
    assert simd.tobytes() == scalar.tobytes(), "SIMD gelu_tanh differs from the _ref loop"


def test_f16_to_f32_every_half():
    """All 65536 half bit patterns convert exactly (numpy's float16 is the reference)."""
    bits = np.arange(65536, dtype=np.uint16)
    got = np.empty(65536, np.float32)
    core_lib().h3r_test_f16_to_f32(ptr(bits), ptr(got), bits.size)
    ref = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert got[~nan].tobytes() == ref[~nan].tobytes()
    # and back: every non-NaN half survives the round trip bit for bit
    back = np.empty(65536, np.uint16)
    core_lib().h3r_test_f32_to_f16(ptr(got), ptr(back), got.size)
    assert np.array_equal(back[~nan], bits[~nan])
    assert np.isnan(back[nan].view(np.float16)).all()


def test_f32_to_f16_rounding():
    """Round to nearest even, overflow, subnormals and ties agree bit for bit with numpy."""
    rng = np.random.default_rng(7)
    random_bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    # Dense around the interesting boundaries: max half (65504), the overflow tie
    # (65520), the smallest normal (2^-14) and subnormal (2^-24) and half of it.
    edges = []
    for v in (65504.0, 65520.0, 2.0**-14, 2.0**-24, 2.0**-25, 1.0, 1.0 + 2.0**-11, 3.0 * 2.0**-25):
        c = np.array([v], np.float32).view(np.uint32)[0]
        edges.append(np.arange(int(c) - 3000, int(c) + 3000, dtype=np.uint64).astype(np.uint32))
    pos = np.concatenate([random_bits] + edges)
    allbits = np.concatenate([pos, pos | np.uint32(0x80000000)])
    x = allbits.view(np.float32)
    got = np.empty(x.size, np.uint16)
    core_lib().h3r_test_f32_to_f16(ptr(x), ptr(got), x.size)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.isnan(got[nan].view(np.float16)).all()
    bad = np.nonzero(got[~nan] != ref[~nan])[0]
    assert bad.size == 0, f"{bad.size} mismatches, first: {x[~nan][bad[:5]]}"


def test_type_table_sizes():
    """Block sizes of the types the engine knows, as in ggml / gguf-py."""
    nb = core_lib().h3r_test_type_nbytes
    assert nb(0, 10) == 40          # f32
    assert nb(1, 10) == 20          # f16
    assert nb(2, 64) == 2 * 18      # q4_0: 32 per block, 18 bytes
    assert nb(8, 64) == 2 * 34      # q8_0: 32 per block, 34 bytes
    assert nb(14, 512) == 2 * 210   # q6_k: 256 per block, 210 bytes
    assert nb(8, 33) == 0           # not a whole block
    assert nb(4, 32) == 0           # type 4 (removed q4_2) is unknown
    assert nb(99, 32) == 0
