"""Verify mode: the engine's DiT beside an independent reference, stage by stage.

The engine's forward runs with a tap that copies every named stage
(``dit.patch_embed`` ... ``dit.block.<i>`` ... ``dit.out``); the float64 numpy
reference (h3render.engine.reference, weights read by gguf-py) computes the same
stages from the same GGUF file. Each stage gets a relative error (max abs error
/ max |reference|); the first stage over its tolerance is where a conversion or
kernel bug lives.

The probe input is deterministic (seeded), at a small latent that still tests
every axis: a token grid of (2, 3, 4) patches, so a t/y/x mix-up in patchify,
rope or unpatchify changes the result, plus a short context with zero-padded
rows as Wan's pipeline pads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from h3render.engine.reference import ReferenceDiT

# Tolerance per quant level of the transformer file. The reference reads the
# same (possibly rounded) weights, so what remains is float32 compute against
# float64: ~1e-6 on the fixtures, a deep real model stays far under 1e-4.
FLOAT_TOL = 1e-4
TOLERANCES: dict[str, float] = {"f32": FLOAT_TOL, "f16": FLOAT_TOL}
# Quantized levels: kernels may quantize activations too (8-bit, ~1e-2 of a
# row's max per product). Provisional until the quantized kernels land.
QUANT_TOL = 5e-2

PROBE_GRID = (2, 3, 4)     # token grid (t, y, x) of the probe input
PROBE_TEXT_LEN = 16        # context rows
PROBE_TEXT_VALID = 10      # rows past this are zero, as the pipeline pads
PROBE_TIMESTEP = 500.0


def tolerance_for(quant: str) -> float:
    return TOLERANCES.get(quant, QUANT_TOL)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Max absolute error over the reference's largest magnitude (the suite's metric)."""
    got = np.asarray(got, np.float64).ravel()
    ref = np.asarray(ref, np.float64).ravel()
    if got.shape != ref.shape:
        return float("inf")
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(got - ref))) / scale


class StageResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    shape: list[int]
    rel_err: float
    tolerance: float
    ok: bool
    note: str = ""


class VerifyResult(BaseModel):
    model_dir: str
    quant: str
    threads: int
    latent_shape: list[int]
    text_len: int
    timestep: float
    stages: list[StageResult]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.stages)

    @property
    def first_failure(self) -> str | None:
        return next((s.name for s in self.stages if not s.ok), None)


def probe_input(ref: ReferenceDiT, seed: int = 0) -> tuple[np.ndarray, float, np.ndarray]:
    """Deterministic x (C, T, Y, X), timestep and context (L, text_dim) for this model."""
    cfg = ref.config
    rng = np.random.default_rng(seed)
    T, Y, X = (g * p for g, p in zip(PROBE_GRID, cfg.patch))
    x = rng.standard_normal((cfg.in_channels, T, Y, X)).astype(np.float32)
    context = rng.standard_normal((PROBE_TEXT_LEN, cfg.text_dim)).astype(np.float32)
    context[PROBE_TEXT_VALID:] = 0.0
    return x, PROBE_TIMESTEP, context


def transformer_file(model_dir: Path, quant: str) -> Path:
    return Path(model_dir) / f"transformer-{quant}.gguf"


def verify_dit(model_dir: Path | str, quant: str, threads: int = 0, seed: int = 0,
               engine=None) -> VerifyResult:
    """Run engine and reference on one probe input; per-stage errors in forward order.

    `engine` may be an open h3render.engine.binding.Engine on model_dir (reused
    across quant levels); otherwise one is opened with `threads`. Raises
    EngineError (engine side) or ReferenceError (reference side) when the model
    cannot be run at all.
    """
    from h3render.engine.binding import Engine

    model_dir = Path(model_dir)
    ref = ReferenceDiT(transformer_file(model_dir, quant))
    x, t, context = probe_input(ref, seed)

    expected: dict[str, np.ndarray] = {}
    out_ref = ref.forward(x, t, context, tap=lambda n, a: expected.__setitem__(n, a))
    del out_ref

    got: dict[str, np.ndarray] = {}
    own = engine is None
    eng = Engine(model_dir, threads) if own else engine
    try:
        eng.set_tap(lambda n, a: got.__setitem__(n, a))
        try:
            eng.dit_forward(quant, x, t, context)
        finally:
            eng.set_tap(None)
    finally:
        if own:
            eng.close()

    tol = tolerance_for(quant)
    stages = []
    for name, want in expected.items():
        if name not in got:
            stages.append(StageResult(name=name, shape=list(want.shape), rel_err=float("inf"),
                                      tolerance=tol, ok=False, note="engine did not report it"))
            continue
        err = rel_err(got[name], want)
        note = "" if got[name].size == want.size else f"engine size {got[name].size} != {want.size}"
        stages.append(StageResult(name=name, shape=list(want.shape), rel_err=err, tolerance=tol,
                                  ok=bool(err <= tol), note=note))
    return VerifyResult(model_dir=str(model_dir), quant=quant, threads=threads,
                        latent_shape=list(x.shape), text_len=int(context.shape[0]), timestep=t,
                        stages=stages)
