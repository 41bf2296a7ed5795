"""Samplers and RNG of the CPU engine (csrc/sampler.c, csrc/rng.c).

Schedules and whole denoising loops are compared with diffusers 0.42.1
(tests/fixtures/sampler, made by tools/fixtures/fixtures_sampler.py); the RNG is
compared with a numpy implementation of the algorithm docs/ENGINE.md specifies,
written here independently of the C code, and with Random123's known answers.
"""

from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from conftest import FIXTURES, rel_err

from h3render.engine.binding import load_library, schedule
from h3render.engine.exceptions import InvalidRequestError

# Tolerances (each with its reason)
SIGMA_TOL = 1e-5     # abs; sigmas in [0, 1]. The schedule is computed in the same
                     # precision and order as diffusers; measured bit-exact.
TIMESTEP_TOL = 1e-5  # abs; timesteps up to 1000 (float32 ulp there is 6e-5), so
                     # this demands exact values, as the DiT embeds them.
LOOP_TOL = 1e-5      # rel_err of x after every step. The latent arithmetic is in
                     # float32 in diffusers' order of operations; the only drift is
                     # torch's SIMD (Sleef) log/expm1 in UniPC's step scalars vs
                     # libm, 1 ulp on a coefficient (measured <= 2.4e-7 abs).
NORMAL_TOL = 1e-6    # abs; Box-Muller in double rounded to float32 (libm vs numpy
                     # cos/sin/log can differ in the last double bit only).

SAMPLERS = {0: "unipc", 1: "euler"}
_F32P = C.POINTER(C.c_float)
_U32P = C.POINTER(C.c_uint32)


@pytest.fixture(scope="module")
def lib():
    lib = load_library()
    lib.h3r_test_sampler_run.argtypes = [C.c_int, C.c_int, C.c_float, C.c_int64, _F32P,
                                         _F32P, _F32P]
    lib.h3r_test_sampler_run.restype = C.c_int
    lib.h3r_test_randn.argtypes = [C.c_uint64, _F32P, C.c_int64]
    lib.h3r_test_randn.restype = C.c_int
    lib.h3r_test_philox.argtypes = [_U32P, _U32P, _U32P]
    lib.h3r_test_philox.restype = None
    return lib


def _p(a: np.ndarray, ctype=C.c_float):
    return a.ctypes.data_as(C.POINTER(ctype))


# ---------------------------------------------------------------- schedules

SCHED = np.load(FIXTURES / "sampler" / "schedules.npz")


@pytest.mark.parametrize("key", [str(k) for k in SCHED["keys"]])
def test_schedule_matches_diffusers(key):
    sampler_id, steps, shift = SCHED[key + "_meta"]
    sigmas, timesteps = schedule(SAMPLERS[int(sampler_id)], int(steps), float(shift))
    ref_s, ref_t = SCHED[key + "_sigmas"], SCHED[key + "_timesteps"]
    assert sigmas.shape == ref_s.shape and timesteps.shape == ref_t.shape
    err_s = float(np.max(np.abs(sigmas - ref_s)))
    err_t = float(np.max(np.abs(timesteps - ref_t)))
    assert err_s <= SIGMA_TOL, f"{key}: sigmas max abs err {err_s:.3g}"
    assert err_t <= TIMESTEP_TOL, f"{key}: timesteps max abs err {err_t:.3g}"
    assert sigmas[-1] == 0.0 and np.all(np.diff(sigmas) < 0)


@pytest.mark.parametrize(
    "sampler,steps,shift,field",
    [(1, 0, 3.0, "steps"), (0, -4, 3.0, "steps"), (0, 10, 0.0, "shift"),
     (1, 10, float("nan"), "shift"), (1, 10, -1.0, "shift"), (7, 3, 3.0, "sampler")],
)
def test_schedule_rejects_bad_arguments(lib, sampler, steps, shift, field):
    buf = np.zeros(16, np.float32)
    rc = lib.h3r_schedule(sampler, steps, shift, _p(buf), _p(buf))
    msg = lib.h3r_last_error(None).decode()
    assert rc == -3, (rc, msg)  # H3R_ERR_INVALID
    assert f"{field}=" in msg and "allowed" in msg, msg


def test_binding_schedule_raises_typed_error():
    with pytest.raises(InvalidRequestError, match="shift=-1 .*allowed"):
        schedule("euler", 4, -1.0)


# ---------------------------------------------------------------- full loops

LOOPS = np.load(FIXTURES / "sampler" / "loops.npz")
CASES = sorted({k.rsplit("_", 1)[0] for k in LOOPS.files})


@pytest.mark.parametrize("case", CASES)
def test_denoising_loop_matches_diffusers(lib, case):
    """The scheduler alone, driven by recorded model outputs, step by step."""
    sampler_id, steps, shift = LOOPS[case + "_meta"]
    steps = int(steps)
    x0 = np.ascontiguousarray(LOOPS[case + "_x0"], np.float32)
    vs = np.ascontiguousarray(LOOPS[case + "_v"], np.float32)
    ref = LOOPS[case + "_xs"]
    xs = np.zeros_like(ref, dtype=np.float32)
    rc = lib.h3r_test_sampler_run(int(sampler_id), steps, float(shift), x0.size, _p(x0),
                                  _p(vs), _p(xs))
    assert rc == 0, lib.h3r_last_error(None).decode()
    errs = [rel_err(xs[i], ref[i]) for i in range(steps)]
    print(f"{case}: per-step rel_err max {max(errs):.3g} (final {errs[-1]:.3g})")
    worst = int(np.argmax(errs))
    assert errs[worst] <= LOOP_TOL, f"{case}: step {worst} rel_err {errs[worst]:.3g}"


def test_sampler_run_rejects_bad_steps(lib):
    x = np.zeros(4, np.float32)
    rc = lib.h3r_test_sampler_run(0, 0, 3.0, 4, _p(x), _p(x), _p(x))
    assert rc == -3 and "steps=0" in lib.h3r_last_error(None).decode()


# ---------------------------------------------------------------- RNG

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = np.uint64(0xFFFFFFFF)


def np_philox(ctr: np.ndarray, k0: int, k1: int) -> np.ndarray:
    """Philox4x32-10 over rows of ctr (m, 4) uint32, as Salmon et al. define it."""
    c = [ctr[:, i].astype(np.uint64) for i in range(4)]
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & MASK,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & MASK]
    return np.stack(c, axis=1).astype(np.uint32)


def np_randn(seed: int, n: int) -> np.ndarray:
    """docs/ENGINE.md "Noise": one Philox block per pair, 53-bit uniforms, Box-Muller."""
    pairs = (n + 1) // 2
    p = np.arange(pairs, dtype=np.uint64)
    ctr = np.zeros((pairs, 4), np.uint32)
    ctr[:, 0], ctr[:, 1] = p & MASK, p >> np.uint64(32)
    x = np_philox(ctr, seed & 0xFFFFFFFF, seed >> 32).astype(np.uint64)
    a = ((x[:, 0] << np.uint64(32)) | x[:, 1]) >> np.uint64(11)
    b = ((x[:, 2] << np.uint64(32)) | x[:, 3]) >> np.uint64(11)
    u1 = (a.astype(np.float64) + 0.5) * 2.0**-53
    u2 = (b.astype(np.float64) + 0.5) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)], axis=1)
    return z.reshape(-1)[:n].astype(np.float32)


# Random123's known-answer vectors for philox4x32-10 (kat_vectors): ctr, key, out.
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers(lib, ctr, key, want):
    c = np.array(ctr, np.uint32)
    k = np.array(key, np.uint32)
    out = np.zeros(4, np.uint32)
    lib.h3r_test_philox(_p(c, C.c_uint32), _p(k, C.c_uint32), _p(out, C.c_uint32))
    assert [hex(v) for v in out] == [hex(v) for v in want]
    assert np.array_equal(np_philox(c[None], int(k[0]), int(k[1]))[0], np.array(want, np.uint32))


@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 + 7, 2**64 - 1])
def test_philox_stream_bit_exact(lib, seed):
    rng = np.random.default_rng(seed % 1000)
    ctr = rng.integers(0, 2**32, size=(64, 4), dtype=np.uint32)
    ctr[0] = [0, 0, 0, 0]
    ctr[1] = [5, 1, 0, 0]  # a pair index past 2^32
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    key = np.array([k0, k1], np.uint32)
    got = np.zeros_like(ctr)
    for i in range(len(ctr)):
        lib.h3r_test_philox(_p(ctr[i], C.c_uint32), _p(key, C.c_uint32),
                            _p(got[i], C.c_uint32))
    assert np.array_equal(got, np_philox(ctr, k0, k1))


@pytest.mark.parametrize("seed,n", [(0, 1), (1, 7), (42, 1000), (2**40 + 3, 4097), (2**64 - 1, 33)])
def test_randn_matches_numpy_spec(lib, seed, n):
    got = np.zeros(n, np.float32)
    assert lib.h3r_test_randn(seed, _p(got), n) == 0
    ref = np_randn(seed, n)
    err = float(np.max(np.abs(got - ref)))
    assert err <= NORMAL_TOL, f"seed {seed} n {n}: max abs err {err:.3g}"


def test_randn_statistics_and_prefix(lib):
    n = 1 << 20
    z = np.zeros(n, np.float32)
    assert lib.h3r_test_randn(1234, _p(z), n) == 0
    # 1M samples: the standard error of the mean is 1e-3, of the std 7e-4; 5 sigma.
    assert abs(float(z.mean())) < 5e-3
    assert abs(float(z.std()) - 1.0) < 5e-3
    assert np.isfinite(z).all() and 4.0 < float(np.abs(z).max()) < 7.0
    # element i depends on (seed, i) only: a shorter draw is a prefix
    head = np.zeros(11, np.float32)
    lib.h3r_test_randn(1234, _p(head), 11)
    assert np.array_equal(head, z[:11])
    other = np.zeros(11, np.float32)
    lib.h3r_test_randn(1235, _p(other), 11)
    assert not np.array_equal(head, other)
