"""The models that ship inside the package, and which one a job gets by default.

Plain constants, importable without the engine library (the queue, the ComfyUI
bridge and the CLI name the default model before any engine is loaded).

shapes-wan  the demo model: a tiny Wan pipeline trained on procedural clips of
            coloured shapes (docs/DEMO_MODEL.md); its renders can be checked
            by `h3render eval-demo`. Converted at every quant level.
tiny-wan    random weights, for tests of the plumbing (it renders noise).
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
ALL_QUANTS = ("f32", "f16", "q8_0", "q6_k", "q4_0")

DEFAULT_MODEL = "shapes-wan"
# name -> quant levels converted on first use
BUILTIN_QUANTS: dict[str, tuple[str, ...]] = {
    "shapes-wan": ALL_QUANTS,
    "tiny-wan": ("f32", "f16"),
}
BUILTIN: dict[str, Path] = {name: DATA_DIR / name for name in BUILTIN_QUANTS}
