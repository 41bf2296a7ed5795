"""Quantized blocks and kernels (csrc/quant.c) against gguf-py and numpy.

- dequantize: bit-identical to gguf-py's ``dequantize`` for F16, Q8_0, Q4_0, Q6_K
  (Q6_K blocks are random bytes with a finite scale, so every bit pattern of
  ql/qh/scales is exercised);
- quantize: Q8_0 and Q4_0 bit-identical to gguf-py's ``quantize``, including
  zero blocks, ties, huge and subnormal values;
- our Q6_K quantizer (h3render/engine/quantize.py) is read back by gguf-py;
- the SIMD dot kernel against the scalar reference, and its independence of
  how many activation rows share a call;
- the quantized matmul against float64 numpy on the same quantized operands,
  and byte-identical for 1, 2 and 3 threads.
"""

from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from conftest import rel_err
from gguf_fuzz_child import core_lib, last_error

from h3render.engine.quantize import quantize_q6_k

# Tolerances (relative error = max abs error / max |reference|, conftest.rel_err):
# SIMD vs scalar dot: the integer block sums are exact in both; they differ only in
# the f32 order of adding K/32 block terms (8 or 4 lanes + a fixed tree vs in
# order), a few ulps of the sum of |terms|; measured <= 2e-7 for K <= 4096.
TOL_SIMD_VS_REF = 1e-5
# quantized matmul vs float64 numpy on the same dequantized weights and activation
# blocks: f32 products of exact integers and f32 block-term sums; measured 2e-7.
TOL_QMATMUL = 1e-5
# quantized matmul vs the unquantized float64 product (a sanity bound, not a
# precision claim): activation rounding to 8 bits (half step 1/254 of each
# block's max) plus the weight rounding. Worst over QSHAPES on N(0,1) data,
# measured: q8_0 1.2e-2, q6_k 2.6e-2, q4_0 1.2e-1.
TOL_VS_FLOAT = {"q8_0": 2e-2, "q6_k": 4e-2, "q4_0": 2e-1}

TYPES = {"q8_0": (QT.Q8_0, 32, 34), "q4_0": (QT.Q4_0, 32, 18), "q6_k": (QT.Q6_K, 256, 210)}
ACT = 99  # h3r_test_quantize's code for the activation blocks


def lib():
    L = core_lib()
    if not getattr(L, "_quant_declared", False):
        vp, fp, i64 = C.c_void_p, C.c_void_p, C.c_int64
        L.h3r_test_dequantize.argtypes = [C.c_int, vp, fp, i64]
        L.h3r_test_dequantize.restype = C.c_int
        L.h3r_test_quantize.argtypes = [C.c_int, fp, vp, i64]
        L.h3r_test_quantize.restype = C.c_int
        L.h3r_test_vec_dot.argtypes = [C.c_int, C.c_int, i64, vp, fp, C.c_int, fp]
        L.h3r_test_vec_dot.restype = C.c_int
        L.h3r_test_simd_name.argtypes = []
        L.h3r_test_simd_name.restype = C.c_char_p
        L._quant_declared = True
    return L


def ptr(a):
    return None if a is None else a.ctypes.data


def c_dequantize(qtype: int, raw: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, np.nan, np.float32)
    rc = lib().h3r_test_dequantize(qtype, ptr(raw), ptr(out), n)
    assert rc == 0, last_error()
    return out


def c_quantize(qtype: int, x: np.ndarray, nbytes: int) -> np.ndarray:
    out = np.zeros(nbytes, np.uint8)
    rc = lib().h3r_test_quantize(qtype, ptr(x), ptr(out), x.size)
    assert rc == 0, last_error()
    return out


def random_blocks(name: str, n_blocks: int, rng) -> np.ndarray:
    """Random bytes for n_blocks of a type, with finite f16 scales of varied size."""
    qtype, _, size = TYPES[name]
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-6, 3, n_blocks)).astype(np.float16)
    if n_blocks > 2:
        d[:2] = [0.0, np.float16(6e-8)]  # a zero scale and a subnormal one
    where = slice(size - 2, size) if name == "q6_k" else slice(0, 2)
    raw[:, where] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw


def quantized_weights(name: str, w: np.ndarray) -> np.ndarray:
    if name == "q6_k":
        return quantize_q6_k(w)
    return gguf_quantize(w, TYPES[name][0])


# ---------------------------------------------------------------- dequantize


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_bit_identical_to_gguf_py(name):
    qtype, bs, _ = TYPES[name]
    rng = np.random.default_rng(len(name))
    raw = random_blocks(name, 300, rng)
    ref = gguf_dequantize(raw, qtype).reshape(-1).astype(np.float32)
    got = c_dequantize(int(qtype), raw, 300 * bs)
    assert got.tobytes() == ref.tobytes(), f"{name}: first mismatch at {np.flatnonzero(got != ref)[:5]}"


def test_dequantize_f16_bit_identical():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    h = h[(h & 0x7C00) != 0x7C00]  # finite halves only (NaN payloads are not compared)
    got = c_dequantize(1, h, h.size)
    assert got.tobytes() == h.view(np.float16).astype(np.float32).tobytes()


def test_dequantize_rejects_partial_block_and_unknown_type():
    raw = np.zeros(34, np.uint8)
    out = np.zeros(64, np.float32)
    assert lib().h3r_test_dequantize(8, ptr(raw), ptr(out), 31) < 0
    assert "31 elements" in last_error() and "q8_0" in last_error()
    assert lib().h3r_test_dequantize(3, ptr(raw), ptr(out), 32) < 0
    assert "q4_1" in last_error()


# ---------------------------------------------------------------- quantize


def awkward_rows(rng) -> np.ndarray:
    """(12, 256) rows: normal, zeros, ties at half steps, huge, tiny, subnormal."""
    rows = [rng.standard_normal(256) * s for s in (1.0, 1e-3, 1e4, 3e-7)]
    rows.append(np.zeros(256))
    ties = np.tile(np.arange(-16, 16) + 0.5, 8)  # x*id lands on .5 for Q8_0 with amax 127
    ties[0] = 127.0
    rows.append(ties)
    rows.append(np.tile(np.linspace(-8, 8, 32), 8))  # Q4_0 max at -8 and +8 (first wins)
    rows.append(np.full(256, -2.5))
    rows.append(rng.standard_normal(256) * 1e-30)  # d far below the f16 range: stored as 0
    rows.append(np.where(rng.random(256) < 0.9, 0.0, rng.standard_normal(256)))
    rows.append(rng.integers(-127, 128, 256).astype(np.float64))
    rows.append(rng.standard_normal(256) * 60000.0)  # d close to the f16 range
    return np.asarray(rows, dtype=np.float32)


@pytest.mark.parametrize("name", ["q8_0", "q4_0"])
def test_quantize_bit_identical_to_gguf_py(name):
    qtype, bs, size = TYPES[name]
    rng = np.random.default_rng(7)
    x = np.concatenate([awkward_rows(rng), rng.standard_normal((20, 256)).astype(np.float32)])
    ref = gguf_quantize(x, qtype).reshape(-1)
    got = c_quantize(int(qtype), x.reshape(-1), ref.size)
    bad = np.flatnonzero(got != ref)
    assert bad.size == 0, f"{name}: {bad.size} bytes differ, first in block {bad[0] // size}"


@pytest.mark.parametrize("name", ["q8_0", "q4_0"])
def test_quantize_tiny_block_is_zero(name):
    """max|x| so small that 1/d overflows f32: gguf-py casts inf/NaN to int there
    (undefined, platform-dependent), so the engine defines it: d = 0, decodes to 0."""
    qtype, bs, size = TYPES[name]
    x = (np.random.default_rng(1).standard_normal(64) * 1e-40).astype(np.float32)
    got = c_quantize(int(qtype), x, 2 * size)
    assert not np.any(c_dequantize(int(qtype), got, 64))


def test_q6_k_quantizer_reads_back_through_gguf_py():
    """Our Q6_K blocks decode (gguf-py and the engine, identically) to within half a step."""
    rng = np.random.default_rng(3)
    x = np.concatenate([awkward_rows(rng), rng.standard_normal((8, 256)).astype(np.float32)])
    q = quantize_q6_k(x)
    assert q.shape == (x.shape[0], 210)
    y = gguf_dequantize(q, QT.Q6_K)
    assert c_dequantize(int(QT.Q6_K), q, x.size).tobytes() == y.astype(np.float32).reshape(-1).tobytes()
    # Per 16-element sub-block the step is ~max|x|/32 (half a step: 1.6% of the
    # block max); the least-squares refit of each sub-block scale trades a little
    # max error (an extreme element may clip) for a lower RMS error. Bounds, as
    # fractions of the row's max|x|: max error 3% (measured 2.4%), RMS error 1%
    # (measured 0.5%). Rows with max|x| < 0.1 are left out: their super-block
    # scale d is an f16 subnormal or 0 (as in ggml), which costs precision by design.
    for row, back in zip(x, y):
        peak = np.abs(row).max()
        if peak >= 0.1:
            assert rel_err(back, row) < 0.03, rel_err(back, row)
            assert np.sqrt(np.mean((back.astype(np.float64) - row) ** 2)) / peak < 0.01
    assert not np.any(y[4]), "an all-zero row must stay zero"


def test_activation_blocks():
    """36-byte blocks: f32 d = amax/127, int8 = round(x * 127/amax)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(64).astype(np.float32)
    x[32:] = 0.0
    raw = c_quantize(ACT, x, 2 * 36).reshape(2, 36)
    d = raw[:, :4].copy().view(np.float32)[:, 0]
    qs = raw[:, 4:].view(np.int8)
    amax = np.abs(x[:32]).max()
    assert d[0] == np.float32(amax / np.float32(127)) and d[1] == 0
    expect = np.sign(x[:32]) * np.floor(np.abs(x[:32] * (np.float32(127) / amax)) + 0.5)
    assert np.array_equal(qs[0], expect.astype(np.int8)) and not qs[1].any()


def test_activation_blocks_round_half_away_from_zero():
    """Every block (SIMD or scalar path) rounds x * (127/amax) as C's roundf: halves away from zero."""
    rng = np.random.default_rng(8)
    n_blocks = 512
    x = (rng.standard_normal((n_blocks, 32)) * 10.0 ** rng.integers(-4, 4, (n_blocks, 1))).astype(np.float32)
    # blocks whose amax is 127 (so id = 1 and v = x exactly) holding ties and near-ties
    ties = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -126.5, 0.49999997, -0.49999997, 0.0, -0.0], np.float32)
    for i in range(0, 64):
        x[i, :] = rng.choice(ties, 32)
        x[i, i % 32] = 127.0 if i % 2 else -127.0
    raw = c_quantize(ACT, x.reshape(-1), n_blocks * 36).reshape(n_blocks, 36)
    d = raw[:, :4].copy().view(np.float32)[:, 0]
    qs = raw[:, 4:].view(np.int8)
    amax = np.abs(x).max(axis=1)
    assert np.array_equal(d, (amax / np.float32(127)).astype(np.float32))
    v = (x * (np.float32(127) / amax)[:, None]).astype(np.float32).astype(np.float64)
    expect = np.sign(v) * np.floor(np.abs(v) + 0.5)
    assert np.array_equal(qs, expect.astype(np.int8))


# ---------------------------------------------------------------- dot kernels


def vec_dot(name, w_raw, x, ref: bool):
    qtype = int(TYPES[name][0])
    out = np.full(x.shape[0], np.nan, np.float32)
    rc = lib().h3r_test_vec_dot(qtype, int(ref), x.shape[1], ptr(w_raw), ptr(x), x.shape[0], ptr(out))
    assert rc == 0, last_error()
    return out


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("K", [256, 1024, 4096])
def test_simd_dot_matches_scalar_reference(name, K):
    print(f"SIMD variant: {lib().h3r_test_simd_name().decode()}")
    rng = np.random.default_rng(K + len(name))
    w_raw = random_blocks(name, K // TYPES[name][1], rng).reshape(-1)
    x = (rng.standard_normal((4, K)) * rng.choice([1e-3, 1.0, 50.0], (4, 1))).astype(np.float32)
    simd = vec_dot(name, w_raw, x, ref=False)
    ref = vec_dot(name, w_raw, x, ref=True)
    # the bound is relative to the sum of |block terms|, which is what the rounding scales with
    wf = c_dequantize(int(TYPES[name][0]), w_raw, K)
    scale = np.abs(wf[None, :] * x).sum(axis=1)
    err = np.abs(simd.astype(np.float64) - ref) / np.maximum(scale, 1e-30)
    assert err.max() < TOL_SIMD_VS_REF, err
    # a row's result does not depend on how many rows share the call
    for r in range(4):
        single = vec_dot(name, w_raw, x[r : r + 1].copy(), ref=False)
        assert single.tobytes() == simd[r : r + 1].tobytes()


# ---------------------------------------------------------------- matmul


def matmul(name, x, w_raw, b, M, threads, force_ref=False):
    N, K = x.shape
    y = np.full((N, M), np.nan, np.float32)
    L = lib()
    L.h3r_test_force_ref(int(force_ref))
    try:
        rc = L.h3r_test_matmul(threads, ptr(y), ptr(x), ptr(w_raw), int(TYPES[name][0]), ptr(b), N, K, M)
    finally:
        L.h3r_test_force_ref(0)
    assert rc == 0, last_error()
    return y


def activation_dequant(x: np.ndarray) -> np.ndarray:
    """The activation blocks the engine makes, read back as float64."""
    N, K = x.shape
    raw = c_quantize(ACT, np.ascontiguousarray(x).reshape(-1), N * K // 32 * 36).reshape(-1, 36)
    d = raw[:, :4].copy().view(np.float32).astype(np.float64)
    return (raw[:, 4:].view(np.int8).astype(np.float64) * d).reshape(N, K)


# N around the 4-row kernel, M around the 16-row weight block and thread chunks.
# N = 20: two 8-row groups of the Q8_0 GEMM and one of 4; K = 288: an odd block count (9),
# for the 32-element types only.
QSHAPES = [(1, 256, 1), (3, 256, 17), (4, 512, 33), (9, 256, 16), (13, 768, 40), (70, 256, 5),
           (20, 512, 24), (20, 288, 24)]


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("N,K,M", QSHAPES)
def test_quantized_matmul(name, N, K, M):
    if K % TYPES[name][1]:
        pytest.skip(f"{name} blocks hold {TYPES[name][1]} elements; K={K} is not a multiple")
    rng = np.random.default_rng(N * 7 + K + M)
    x = rng.standard_normal((N, K)).astype(np.float32)
    w = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    w_raw = np.ascontiguousarray(quantized_weights(name, w))
    outs = [matmul(name, x, w_raw, b, M, t) for t in (1, 2, 3)]
    for t, y in zip((2, 3), outs[1:]):
        assert y.tobytes() == outs[0].tobytes(), f"{name}: {t} threads differ from 1"
    for n in range(N):  # row tiles (8 / 4 / 1 rows per kernel call) do not change a row's result
        one = matmul(name, x[n:n + 1], w_raw, b, M, 1)
        assert one.tobytes() == outs[0][n:n + 1].tobytes(), f"{name}: row {n} alone differs from its tile"
    wq = gguf_dequantize(w_raw, TYPES[name][0]).astype(np.float64)
    exact = activation_dequant(x) @ wq.T + b
    assert rel_err(outs[0], exact) < TOL_QMATMUL
    assert rel_err(matmul(name, x, w_raw, b, M, 2, force_ref=True), exact) < TOL_QMATMUL
    vs_float = rel_err(outs[0], x.astype(np.float64) @ w.T.astype(np.float64) + b)
    print(f"{name} N={N} K={K} M={M}: rel_err vs unquantized float64 {vs_float:.2e}")
    assert vs_float < TOL_VS_FLOAT[name]


# K: an odd number of 32-blocks (q8_0/q4_0), a multiple of 8 blocks, and past the 16384 the
# AVX-512 GEMV takes (the AVX2 kernel then runs).
GEMV_CASES = [(n, k) for n in TYPES for k in (544, 4352, 16640) if k % TYPES[n][1] == 0]


@pytest.mark.parametrize("name,K", GEMV_CASES)
def test_gemv_rows_match_gemm_rows(name, K):
    """Rows left over after the 4-row tiles (N = 1: the GEMV) take another kernel; each output is
    bit-identical to the same row computed inside a 4-row tile, with 1 and 2 threads."""
    rng = np.random.default_rng(K + 3)
    M = 37
    w_raw = random_blocks(name, M * K // TYPES[name][1], rng).reshape(-1)
    x = rng.standard_normal((4, K)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    full = matmul(name, x, w_raw, b, M, 1)
    for threads in (1, 2):
        for n in (1, 2, 3):
            part = matmul(name, x[:n].copy(), w_raw, b, M, threads)
            assert part.tobytes() == full[:n].tobytes(), f"N={n}, {threads} threads"


def test_quantized_matmul_rejects_bad_row_length():
    x = np.zeros((1, 64), np.float32)
    y = np.zeros((1, 2), np.float32)
    raw = np.zeros(2 * 210, np.uint8)
    rc = lib().h3r_test_matmul(1, ptr(y), ptr(x), ptr(raw), int(QT.Q6_K), None, 1, 64, 2)
    assert rc < 0
    msg = last_error()
    assert "q6_k" in msg and "64 inputs" in msg and "256" in msg
