"""Verify mode: the engine's DiT beside an independent reference, stage by stage.

The engine's forward runs with a tap that copies every named stage
(``dit.patch_embed`` ... ``dit.block.<i>`` ... ``dit.out``); the float64 numpy
reference (h3render.engine.reference) computes the same stages. Each stage gets
a relative error (max abs error / max |reference|); the first stage over its
tolerance is where a conversion or kernel bug lives.

Where the reference takes its weights decides what verify can catch:
  - the diffusers source folder (``source=``), read with safetensors: any bug
    of the converter, the C reader or the kernels;
  - otherwise the model's most precise file, ``transformer-f32.gguf``, read with
    gguf-py: bugs of the C reader and kernels at every level, and of the
    rounding/quantizing conversion for every level other than f32;
  - the file under test itself when it is the only one.

The probe input is deterministic (seeded), at a small latent that still tests
every axis: a token grid of (2, 3, 4) patches, so a t/y/x mix-up in patchify,
rope or unpatchify changes the result, plus a short context with zero-padded
rows as Wan's pipeline pads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from h3render.engine.reference import GGUFWeights, ReferenceDiT, ReferenceError, read_config

# Same weights on both sides (f32 against f32 weights, or a file against
# itself): only float32 compute against float64 remains, ~1e-6 on the fixtures;
# the F32 bound.
COMPUTE_TOL = 1e-4
# F16 weights against F32 ones: each weight rounded to half (2^-11 relative);
# 2.4e-4 at worst on the fixtures; the F16 bound.
F16_TOL = 2e-3
# Quantized levels: block quantization of weights (and possibly activations)
# is ~1e-2 of a row's max per product. Provisional until those kernels land.
QUANT_TOL = 5e-2

PROBE_GRID = (2, 3, 4)     # token grid (t, y, x) of the probe input
PROBE_TEXT_LEN = 16        # context rows
PROBE_TEXT_VALID = 10      # rows past this are zero, as the pipeline pads
PROBE_TIMESTEP = 500.0


class ConfigMismatchError(ReferenceError):
    """The reference source is another model than the file under test."""


def tolerance_for(quant: str, same_weights: bool) -> float:
    """Stage tolerance for the engine at `quant` against a reference whose weights
    are the same file (same_weights) or a more precise source."""
    if quant == "f32" or (same_weights and quant == "f16"):
        return COMPUTE_TOL
    if quant == "f16":
        return F16_TOL
    return QUANT_TOL


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
    reference: str          # where the reference's weights came from
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


def reference_source(model_dir: Path, quant: str, source: Path | None = None) -> Path:
    """The diffusers folder if given, else transformer-f32.gguf if present, else the file itself."""
    if source is not None:
        return Path(source)
    f32 = transformer_file(model_dir, "f32")
    return f32 if f32.is_file() else transformer_file(model_dir, quant)


def verify_dit(model_dir: Path | str, quant: str, threads: int = 0, seed: int = 0,
               engine=None, source: Path | str | None = None) -> VerifyResult:
    """Run engine and reference on one probe input; per-stage errors in forward order.

    `source` is an optional diffusers pipeline (or transformer) folder to take
    the reference's weights from. `engine` may be an open
    h3render.engine.binding.Engine on model_dir (reused across quant levels);
    otherwise one is opened with `threads`. Raises EngineError (engine side) or
    ReferenceError (reference side, or the two configs differ) when the model
    cannot be run at all.
    """
    from h3render.engine.binding import Engine

    model_dir = Path(model_dir)
    tested = transformer_file(model_dir, quant)
    ref_path = reference_source(model_dir, quant, Path(source) if source else None)
    ref = ReferenceDiT(ref_path)
    if ref_path != tested:
        tested_cfg = read_config(GGUFWeights(tested))
        diff = [
            f"{k} {v} != {getattr(ref.config, k)}"
            for k, v in vars(tested_cfg).items() if v != getattr(ref.config, k)
        ]
        if diff:
            raise ConfigMismatchError(
                f"{tested} and the reference {ref_path} are different models: {'; '.join(diff)}"
            )
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

    tol = tolerance_for(quant, same_weights=ref_path == tested)
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
    return VerifyResult(model_dir=str(model_dir), quant=quant, reference=str(ref_path),
                        threads=threads,
                        latent_shape=list(x.shape), text_len=int(context.shape[0]), timestep=t,
                        stages=stages)
