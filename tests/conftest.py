"""Shared test helpers: fixture paths, model conversion, error metrics."""

from __future__ import annotations

pytest_plugins = ["redis_fixture"]

import os
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"

# Subprocesses started by tests (CLI runs, workers) may import h3render from the
# source tree; they must still load the engine library this process loads, the
# one `pip install .` compiled.
from h3render.engine.binding import library_path  # noqa: E402

os.environ.setdefault("H3RENDER_LIB", str(library_path()))


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Max absolute error scaled by the reference's largest magnitude.

    This is the "relative error" every numerics tolerance in the suite uses:
    elementwise ratios blow up near zero, a norm ratio hides one bad element.
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference {ref.shape}"
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(got - ref))) / scale


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 255.0) -> float:
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(peak * peak / mse)


@pytest.fixture(scope="session")
def converted_models(tmp_path_factory):
    """convert(name, quants) -> model dir: a fixture pipeline converted once per session."""
    from h3render.engine.convert import convert_pipeline

    root = tmp_path_factory.mktemp("models")
    cache: dict[tuple[str, tuple[str, ...]], Path] = {}

    def convert(name: str, quants: tuple[str, ...] = ("f32", "f16")) -> Path:
        key = (name, tuple(quants))
        if key not in cache:
            src = FIXTURES / name
            if not src.is_dir():
                src = Path(__file__).parents[1] / "h3render" / "data" / name
            dst = root / f"{name}-{'-'.join(quants)}"
            convert_pipeline(src, dst, quants=list(quants))
            cache[key] = dst
        return cache[key]

    return convert
