"""Admission: will this job fit in memory now? Estimate, compare, explain.

The estimate of a CPU-engine job is the engine's own (Engine.estimate_memory, the C
engine's h3r_estimate_json), computed from the same size tables its allocations use:

    weights   the mapped model pages the render reads (transformer, text encoder, VAE)
    encode    the text encoder's buffers
    denoise   latents, sampler history, contexts and one DiT forward's scratch, with the
              per-thread matmul tiles of the render's thread count
    decode    the decoded video as f32 and the VAE decoder's working set and caches

plus OVERHEAD_BYTES, the render process itself (the interpreter, numpy, rq, the engine's
code), which the engine cannot see:

    peak = weights + max(encode, denoise, decode) + overhead

Callers pass `estimate`, a function from a GenerateRequest to a MemoryEstimate
(`engine_estimator(engine)`), so Python keeps no copy of the engine's formula; the
hints for a job that does not fit ask the same function about lower quant levels
(dataclasses.replace(req, quant=q)) and smaller sizes (replace(req, width=, height=)).
tests/test_engine_estimate.py and tests/faults/test_admission_faults.py compare the
estimate with the measured peak RSS of real renders.

h3.c jobs (an H3 snapshot) use `admit_h3` over h3render.engine.h3.estimate instead; see
the end of the file. `output_bytes` bounds what a render writes to disk (the disk side
of admission).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict

from h3render.engine.h3.estimate import estimate_h3_memory

GiB = 1024**3
MiB = 1024**2
F32 = 4
# The render process itself, which the engine's estimate cannot see: the work horse with the
# interpreter, numpy, rq, redis, pydantic, the tokenizer and the engine library loaded. Measured
# on Linux x86-64, CPython 3.11: VmHWM 67 MiB in such a process before the engine opens, and
# 69 MiB in a worker's render process (its recorded peak RSS less the engine's estimate, tiny-wan
# 64x64x17). Rounded up for allocator slack; tests/test_admission.py holds a worker render's
# estimate within 20% of its peak.
OVERHEAD_BYTES = 72 * MiB
META_ALLOWANCE_BYTES = 1 * MiB  # meta.json (health samples, step times) and file system slack
SIZE_MULTIPLE = 16  # the size grid when the engine's info names none (VAE stride 8 x patch 2)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryEstimate(_Model):
    weights: int
    encode: int
    denoise: int
    decode: int
    overhead: int = OVERHEAD_BYTES
    tokens: int

    @classmethod
    def from_engine(cls, est: dict, overhead: int = OVERHEAD_BYTES) -> "MemoryEstimate":
        """From Engine.estimate_memory's dict (its total is weights + max of the phases)."""
        return cls(weights=int(est["weights"]), encode=int(est["encode"]), denoise=int(est["denoise"]),
                   decode=int(est["decode"]), tokens=int(est["tokens"]), overhead=overhead)

    @property
    def total(self) -> int:
        return self.weights + max(self.encode, self.denoise, self.decode) + self.overhead

    def as_meta(self) -> dict:
        return {"bytes": self.total, "weights": self.weights, "encode": self.encode,
                "denoise": self.denoise, "decode": self.decode, "overhead": self.overhead,
                "tokens": self.tokens, "source": "engine"}


Estimator = Callable[[Any], MemoryEstimate]  # GenerateRequest -> MemoryEstimate


def engine_estimator(engine) -> Estimator:
    """The estimate of an open h3render.engine.binding.Engine. Raises what the engine raises
    for a request it would refuse (InvalidRequestError naming the field)."""

    def estimate(req) -> MemoryEstimate:
        return MemoryEstimate.from_engine(engine.estimate_memory(req))

    return estimate


class Admission(_Model):
    fits: bool
    need: int
    available: int
    usable: int  # available minus headroom
    headroom: float
    message: str
    suggestion: str = ""


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def admit(req, estimate: Estimator, levels: Sequence[str], available: int, headroom: float,
          size_multiple: int = SIZE_MULTIPLE) -> Admission:
    """Whether the render of `req` (a GenerateRequest) fits `available` bytes keeping
    `headroom` (a fraction) free.

    `levels` are the model's usable quant levels (Engine.info()["quant_levels"]); when the
    job does not fit, the message suggests the largest lower quant level that would (lower:
    fewer weight bytes), else a smaller size at the job's level (keeping the aspect ratio,
    on the `size_multiple` grid)."""
    est = estimate(req)
    usable = int(available * (1.0 - headroom))
    need = est.total
    head = f"headroom {headroom:.0%}"
    if need <= usable:
        return Admission(fits=True, need=need, available=available, usable=usable,
                         headroom=headroom,
                         message=f"needs {_gib(need)}, {_gib(available)} available ({head})")
    hints = []
    lower = _lower_levels(req, estimate, levels, est.weights)
    for q, e in lower:  # the best quality lower level that fits at full size
        if e.total <= usable:
            hints.append(f"quant {q}")
            break
    size = smaller_size(req, estimate, usable, size_multiple)
    if size:
        hints.append(f"a smaller size such as {size[0]}x{size[1]}")
    elif not hints and lower:
        q = lower[-1][0]
        size = smaller_size(replace(req, quant=q), estimate, usable, size_multiple)
        if size:
            hints.append(f"quant {q} at a smaller size such as {size[0]}x{size[1]}")
    if not hints:
        hints.append("a machine with more free memory (even the smallest size does not fit)")
    suggestion = "try " + " or ".join(hints)
    return Admission(fits=False, need=need, available=available, usable=usable,
                     headroom=headroom, suggestion=suggestion,
                     message=f"needs {_gib(need)}, {_gib(available)} available ({head}); "
                             f"{suggestion}")


def _lower_levels(req, estimate: Estimator, levels: Sequence[str],
                  weights: int) -> list[tuple[str, MemoryEstimate]]:
    """(level, estimate) of each level with fewer weight bytes than the job's, best first."""
    from h3render.engine.exceptions import EngineError

    out = []
    for q in levels:
        if q == req.quant:
            continue
        try:
            e = estimate(replace(req, quant=q))
        except EngineError:  # a level the engine refuses is no hint
            continue
        if e.weights < weights:
            out.append((q, e))
    return sorted(out, key=lambda qe: -qe[1].weights)


def smaller_size(req, estimate: Estimator, usable: int,
                 size_multiple: int = SIZE_MULTIPLE) -> tuple[int, int] | None:
    """The largest (width, height) with the request's aspect ratio, on the size grid, whose
    estimate fits `usable`, or None."""
    from h3render.engine.exceptions import EngineError

    grid = max(int(size_multiple), 1)
    for k in range(1, 64):
        f = 1.0 - k / 64.0
        w = max(grid, int(req.width * f) // grid * grid)
        h = max(grid, int(req.height * f) // grid * grid)
        if (w, h) == (req.width, req.height):
            continue
        try:
            total = estimate(replace(req, width=w, height=h)).total
        except EngineError:
            continue
        if total <= usable:
            return w, h
    return None


# ---------------------------------------------------------------- disk


def output_bytes(width: int, height: int, frames: int) -> int:
    """An upper bound of the bytes one render writes: video.mp4, poster.png, meta.json.

    The mp4 is counted as raw RGB24 (3 bytes a pixel a frame): H.264 yuv420p at the
    crf we use stays well under raw yuv420p (1.5 bytes), even for noise. The poster
    is one raw RGB frame plus 1% for PNG's row filters and zlib framing."""
    px = width * height
    return frames * px * 3 + px * 3 * 101 // 100 + META_ALLOWANCE_BYTES


# ---------------------------------------------------------------- h3.c jobs


def admit_h3(request, dit_bytes: int, available: int, headroom: float,
             preview: bool | None = None) -> Admission:
    """Whether an h3.c job fits `available` bytes keeping `headroom` free.

    request: a validated h3render.engine.h3.options.H3Request; dit_bytes: the FL2VA
    DiT's tensor bytes (`models inspect`); preview: previews on (None: the request's
    preview_denoise). The estimate is h3render.engine.h3.estimate.estimate_h3_memory.
    When the job does not fit, the message suggests the first single change, in order
    of lost quality, that would: previews off, dit_layers 45, 40, 35, then
    ssd_streaming (with quant int8 when the job asked for int8-row, which SSD
    streaming excludes).
    """
    est = estimate_h3_memory(dit_bytes, request, preview=preview)
    usable = int(available * (1.0 - headroom))
    need = est.total
    head = f"headroom {headroom:.0%}"
    if need <= usable:
        return Admission(fits=True, need=need, available=available, usable=usable, headroom=headroom,
                         message=f"needs {_gib(need)}, {_gib(available)} available ({head})")
    opts = request.options
    on = opts.preview_denoise if preview is None else bool(preview)
    tries: list[tuple[str, dict, bool]] = []  # (hint, option updates, previews on)
    if on:
        tries.append(("previews off (preview_every=0, preview_denoise=false)", {"preview_denoise": False}, False))
    if not opts.ssd_streaming:
        for layers in (45, 40, 35):
            if layers < opts.dit_layers:
                tries.append((f"engine option dit_layers={layers}", {"dit_layers": layers}, on))
        hint = "engine option ssd_streaming=true"
        tries.append((hint + (" with quant int8" if request.quant == "int8-row" else ""),
                      {"ssd_streaming": True}, on))
    hints = []
    for hint, upd, prev in tries:
        cand = request.model_copy(update={"options": opts.model_copy(update=upd)})
        if estimate_h3_memory(dit_bytes, cand, preview=prev).total <= usable:
            hints.append(hint)
            break
    if not hints:
        hints.append("a smaller size or fewer frames with ssd_streaming=true, or a machine with more free memory")
    suggestion = "try " + hints[0]
    return Admission(fits=False, need=need, available=available, usable=usable, headroom=headroom,
                     suggestion=suggestion,
                     message=f"needs {_gib(need)}, {_gib(available)} available ({head}); {suggestion}")
