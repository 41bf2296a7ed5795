"""Bench helper, run with the bench venv (pip install ggml-python numpy): ggml's matmul.

    python bench/ggml_matmul.py N K M THREADS REPEATS

Times ggml_mul_mat of a weight (M, K) in F32, F16, Q8_0, Q6_K, Q4_0 (quantized
by ggml's own ggml_quantize_chunk) with activations (N, K) F32, on THREADS
threads, best of REPEATS, and prints one JSON line {type: GFLOP/s, ...}.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import ggml
import numpy as np

TYPES = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16, "q8_0": ggml.GGML_TYPE_Q8_0,
         "q6_k": ggml.GGML_TYPE_Q6_K, "q4_0": ggml.GGML_TYPE_Q4_0}


def bench(name: str, N: int, K: int, M: int, threads: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((M, K)).astype(np.float32)
    x = rng.standard_normal((N, K)).astype(np.float32)
    mem = 4 * (M * K + N * K + N * M) + 2 * M * K + (256 << 20)
    params = ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False)
    ctx = ggml.ggml_init(params)
    try:
        a = ggml.ggml_new_tensor_2d(ctx, TYPES[name], K, M)
        b = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, K, N)
        dst = ggml.ggml_get_data(a)
        if name == "f32":
            ctypes.memmove(dst, w.ctypes.data, w.nbytes)
        elif name == "f16":
            h = w.astype(np.float16)
            ctypes.memmove(dst, h.ctypes.data, h.nbytes)
        else:
            ggml.ggml_quantize_chunk(TYPES[name], w.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                     dst, 0, M, K, None)
        ctypes.memmove(ggml.ggml_get_data(b), x.ctypes.data, x.nbytes)
        c = ggml.ggml_mul_mat(ctx, a, b)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, c)
        ggml.ggml_graph_compute_with_ctx(ctx, gf, threads)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            ggml.ggml_graph_compute_with_ctx(ctx, gf, threads)
            best = min(best, time.perf_counter() - t0)
        # sanity: ggml's result against numpy (catches a wrong layout in this script)
        y = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(c), ctypes.POINTER(ctypes.c_float)),
                                  shape=(N, M))
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        err = float(np.abs(y - ref).max() / np.abs(ref).max())
        if err > 0.2:
            raise SystemExit(f"ggml {name}: result differs from numpy by {err:.3g}: layout bug in the bench")
        return 2.0 * N * K * M / best / 1e9
    finally:
        ggml.ggml_free(ctx)


def main() -> None:
    N, K, M, threads, repeats = (int(v) for v in sys.argv[1:6])
    print(json.dumps({name: bench(name, N, K, M, threads, repeats) for name in TYPES}))


if __name__ == "__main__":
    main()
