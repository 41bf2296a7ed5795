"""Golden render: one seeded shapes-wan job per quant level, pinned to stored frames.

The job in tests/fixtures/golden/shapes-wan.json ("job": prompt, seed, size, steps, ...) is
rendered at each level of LEVELS on shapes-wan converted from h3render/data/shapes-wan, through
the job contract (h3render.queue.contract.check, then .request, as `run` and the worker build
it) and Engine.generate; its final RGB frames (9 x 32 x 32 x 3 uint8, as the engine hands them
to the video writer) are compared with the stored ones:

    same build    the build fingerprint equals the stored one: the frames' sha256 must equal
                  the stored hash (byte-identical frames)
    other build   PSNR against the stored reference frames (shapes-wan-<quant>.npy) must be at
                  least the level's floor ("psnr_floor_db" in the JSON)

The build fingerprint is what the library reports about itself: engine, engine_version and abi
(Engine.info()), the kernel set it was compiled with (h3r_test_simd_name: avx512-vnni, avx2,
neon-dotprod, neon or scalar; -march=native picks it) and the CPU architecture. A change of the
engine's numerics on the same build fails the hash check: regenerate deliberately, then.

Floors: 45 dB at every level, measured when the references were made ("measured" per level in
the JSON). A build of the same sources without -march=native (the scalar kernels, the farthest
from the avx512-vnni build that made them) gave identical f32 and f16 frames and 54.5-55.0 dB
for q8_0, q6_k and q4_0; the same job with seed 8 gives 37.5 dB (the shapes' black background
keeps PSNR high), so the floor sits between the two, and a test holds a wrong seed below it.
The levels' own quantization error against f32 (70, 55, 52, 42 dB for f16, q8_0, q6_k, q4_0)
is larger than the cross-build one, so a floor taken from it would pass a wrong seed.

Regenerate the references (on the build whose frames should become the reference):

    PYTHONPATH=. .venv/bin/python tests/test_golden_render.py --update

It renders each level, writes shapes-wan-<quant>.npy and the JSON (hashes and fingerprint; the
floors and the measurements are kept: measure again). `--check` prints each level's hash and
PSNR against the stored frames without writing; with H3RENDER_LIB naming another build of the
library (e.g. cmake -DH3R_NATIVE=OFF) it measures the cross-build PSNR.
About 3 s on 2 cores.
"""

from __future__ import annotations

import ctypes as C
import hashlib
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
SPEC = GOLDEN / "shapes-wan.json"
LEVELS = ("f32", "f16", "q8_0", "q6_k", "q4_0")
THREADS = 2  # the frames do not depend on it (checked when the references were made); fixed anyway


def fingerprint(engine) -> dict:
    """The build as the library reports it (see the module doc)."""
    from h3render.engine.binding import load_library

    lib = load_library()
    lib.h3r_test_simd_name.restype = C.c_char_p
    info = engine.info()
    return {"engine": info.get("engine"), "engine_version": info.get("engine_version"),
            "abi": info.get("abi"), "kernels": lib.h3r_test_simd_name().decode(),
            "arch": platform.machine()}


def convert(dst: Path) -> Path:
    from h3render.engine.convert import convert_pipeline

    convert_pipeline(ROOT / "h3render" / "data" / "shapes-wan", dst, quants=list(LEVELS))
    return dst


def render(engine, job: dict, quant: str) -> np.ndarray:
    """The job's final frames at `quant`, (frames, height, width, 3) uint8."""
    from h3render.engine.binding import FRAME_FINAL
    from h3render.queue import contract
    from h3render.queue.engine_info import with_model_facts

    info = with_model_facts("shapes-wan", engine.info(), engine.model_dir)
    checked = contract.check({**job, "model": "shapes-wan", "quant": quant}, lambda _model: info)
    req = contract.request(checked.job, info, engine.model_dir, THREADS)
    frames: dict[int, np.ndarray] = {}

    def on_frame(kind: int, index: int, rgb) -> bool:
        if kind == FRAME_FINAL:
            frames[index] = np.array(rgb, dtype=np.uint8)  # the engine reuses its buffer
        return False

    engine.generate(req, on_frame=on_frame)
    assert sorted(frames) == list(range(checked.job.frames)), sorted(frames)
    return np.stack([frames[i] for i in range(checked.job.frames)])


def sha256(frames: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frames, np.uint8).tobytes()).hexdigest()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0**2 / mse)


def reference(quant: str) -> np.ndarray:
    return np.load(GOLDEN / f"shapes-wan-{quant}.npy", allow_pickle=False)


# ---------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from h3render.engine.binding import Engine

    with Engine(convert(tmp_path_factory.mktemp("golden") / "shapes-wan"), threads=THREADS) as e:
        yield e


@pytest.fixture(scope="module")
def spec() -> dict:
    return json.loads(SPEC.read_text())


def test_the_references_are_complete(spec):
    assert set(spec["levels"]) == set(LEVELS)
    for q in LEVELS:
        ref = reference(q)
        j = spec["job"]
        assert ref.dtype == np.uint8 and ref.shape == (j["frames"], j["height"], j["width"], 3), (q, ref.shape)
        assert sha256(ref) == spec["levels"][q]["sha256"], f"{q}: the stored frames are not the hashed ones"
        assert 0 < spec["levels"][q]["psnr_floor_db"] < 99


@pytest.mark.parametrize("quant", LEVELS)
def test_golden_render(engine, spec, quant):
    frames = render(engine, spec["job"], quant)
    level, here = spec["levels"][quant], fingerprint(engine)
    db = psnr(frames, reference(quant))
    same = here == spec["fingerprint"]
    print(f"{quant}: sha256 {sha256(frames)[:16]} (stored {level['sha256'][:16]}), PSNR {db:.1f} dB "
          f"(floor {level['psnr_floor_db']} dB), {'same build' if same else 'other build'}: {here}")
    if same:
        assert sha256(frames) == level["sha256"], (
            f"{quant}: frames differ from the reference on the build that made it (PSNR {db:.1f} dB); "
            "if the engine's numerics changed on purpose, regenerate: python tests/test_golden_render.py --update")
    else:
        assert db >= level["psnr_floor_db"], (
            f"{quant}: PSNR {db:.1f} dB against the reference frames, below the floor "
            f"{level['psnr_floor_db']} dB on build {here} (reference build {spec['fingerprint']})")


@pytest.mark.parametrize("quant", ("f32", "q4_0"))
def test_a_different_seed_falls_below_the_floor(engine, spec, quant):
    """The PSNR check has teeth: the same job with another seed fails it."""
    db = psnr(render(engine, {**spec["job"], "seed": spec["job"]["seed"] + 1}, quant), reference(quant))
    print(f"{quant}, seed {spec['job']['seed'] + 1}: PSNR {db:.1f} dB against the seed-{spec['job']['seed']} frames")
    assert db < spec["levels"][quant]["psnr_floor_db"]


def test_quant_levels_differ_from_each_other(spec):
    """The references are five renders, not one copied: each lower level's frames differ from f32's."""
    hashes = {spec["levels"][q]["sha256"] for q in LEVELS}
    assert len(hashes) == len(LEVELS)


# ---------------------------------------------------------------- regenerate


def main(argv: list[str]) -> int:
    from h3render.engine.binding import Engine

    update = "--update" in argv
    if not update and "--check" not in argv:
        print(__doc__)
        return 2
    spec = json.loads(SPEC.read_text())
    with tempfile.TemporaryDirectory() as tmp, Engine(convert(Path(tmp) / "shapes-wan"), threads=THREADS) as e:
        here = fingerprint(e)
        for q in LEVELS:
            frames = render(e, spec["job"], q)
            level = spec["levels"].setdefault(q, {})
            old = GOLDEN / f"shapes-wan-{q}.npy"
            db = psnr(frames, reference(q)) if old.is_file() else float("nan")
            print(f"{q}: sha256 {sha256(frames)}  PSNR vs stored {db:.2f} dB  floor {level.get('psnr_floor_db')}")
            if update:
                np.save(old, frames, allow_pickle=False)
                level["sha256"] = sha256(frames)
        print(f"build: {here}")
    if update:
        spec["fingerprint"] = here
        SPEC.write_text(json.dumps(spec, indent=2) + "\n")
        print(f"wrote {SPEC.relative_to(ROOT)} and {len(LEVELS)} .npy files")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
