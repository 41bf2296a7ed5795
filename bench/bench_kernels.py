"""One kernel at one shape, for tuning: matmul GFLOP/s per weight type, or attention time.

    python bench/bench_kernels.py matmul --shape 1024 512 2048 --levels f32,f16,q8_0 [--threads 2]
    python bench/bench_kernels.py attention --tokens 1024 --heads 4 --head-dim 128 [--threads 1]

Set H3RENDER_LIB to compare two builds of the library, alternating runs: this machine
is shared, so only the best of many repeats (and the same comparison run again) means
anything. Prints one line per kernel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speed import CODES, LEVELS, _lib, best_of, ours_matmul  # noqa: E402


def matmul(N: int, K: int, M: int, levels: list[str], threads: int, repeats: int) -> None:
    for level, gflops in ours_matmul(threads, repeats, (N, K, M), tuple(levels)).items():
        print(f"matmul {level} ({N}, {K}) @ ({M}, {K})^T, {threads} threads: {gflops:.1f} GFLOP/s")


def attention(N: int, H: int, Dh: int, threads: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((N, H * Dh)).astype(np.float32) for _ in range(3))
    out = np.zeros_like(q)
    t = best_of(lambda: _lib().h3r_test_attention(threads, out.ctypes.data, q.ctypes.data, k.ctypes.data,
                                                  v.ctypes.data, N, N, H, Dh, Dh ** -0.5, None), repeats)
    print(f"attention N {N}, H {H}, Dh {Dh}, {threads} threads: {t * 1e3:.2f} ms, "
          f"{4.0 * N * N * Dh * H / t / 1e9:.1f} GFLOP/s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="kernel", required=True)
    mm = sub.add_parser("matmul")
    mm.add_argument("--shape", type=int, nargs=3, metavar=("N", "K", "M"), default=(1024, 512, 2048))
    mm.add_argument("--levels", default=",".join(LEVELS))
    at = sub.add_parser("attention")
    at.add_argument("--tokens", type=int, default=1024)
    at.add_argument("--heads", type=int, default=4)
    at.add_argument("--head-dim", type=int, default=128)
    for p in (mm, at):
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args()
    if a.kernel == "matmul":
        levels = a.levels.split(",")
        bad = [lv for lv in levels if lv not in CODES]
        if bad:
            ap.error(f"--levels: {','.join(bad)} not among {','.join(LEVELS)}")
        matmul(*a.shape, levels, a.threads, a.repeats)
    else:
        attention(a.tokens, a.heads, a.head_dim, a.threads, a.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
