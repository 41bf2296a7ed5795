"""Will a job ever fit? Checked at enqueue against the memory of the machines that run jobs.

    check(r, planned, settings)   raises DoesNotFitError (exit 2) for jobs no live machine can
                                  ever admit; returns warnings; adds a job's own to its Planned

A job fits a machine when its memory estimate (the engine's own, Engine.estimate_memory on
the model installed here, as the worker's admission computes it: h3render.worker.admission)
is at most the machine's usable bytes: its total minus the admission headroom, the bound
above which the worker's admission fails a job at once. Workers publish both figures
(h3render.worker.publish.live_machines). A job that fits no live machine is refused with the
figures and the nearest size that fits the biggest one (admission.smaller_size, same aspect
ratio, on the size grid), or a lower quant level when one fits at full size.

With no worker published, this machine's memory (psutil) stands in: a job that would not
fit here gets a warning only, since the worker that will run it may have more.

When the model is not installed here, only its engine info is known: its weight bytes per
quant level, not its layer sizes. The check then uses a lower bound (the weights, the
decoded video as f32 and the fixed overhead, each a term of the full estimate) and says
so in a warning. h3.c jobs are left to the worker's admission (h3render.worker.admission.
admit_h3 needs the snapshot's files), as are jobs whose model's info has no weight bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from h3render.queue.errors import JobValidationError, Problem
from h3render.settings import Settings


class DoesNotFitError(JobValidationError):
    """Jobs whose memory estimate exceeds what every live machine can admit."""

    heading = "does not fit any machine"

    def to_dict(self) -> dict:
        return {**super().to_dict(), "error": self.heading}


@dataclass(frozen=True)
class Machine:
    host: str
    total: int  # bytes of memory (a cgroup limit caps it)
    usable: int  # the most a job may need there: total minus the admission headroom
    published: bool = True  # False: this machine, standing in for workers that published nothing

    def describe(self) -> str:
        head = 1.0 - self.usable / self.total if self.total else 0.0
        who = f"machine {self.host}" if self.published else "this machine (no worker has published its memory)"
        return f"{who} can admit {_gib(self.usable)} ({_gib(self.total)} total, headroom {head:.0%})"


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def live(r: redis.Redis, settings: Settings) -> list[Machine]:
    """The machines whose workers published their memory within its TTL."""
    from h3render.worker.publish import live_machines

    out = []
    for doc in live_machines(r):
        total, usable = doc.get("total_bytes"), doc.get("usable_bytes")
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            continue  # a machine that could not read its memory says nothing about fitting
        if not isinstance(usable, int) or isinstance(usable, bool) or not 0 < usable <= total:
            usable = int(total * (1.0 - settings.admission_headroom_fraction))
        out.append(Machine(str(doc.get("host")), total, usable))
    return out


def this_machine(settings: Settings) -> Machine | None:
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no reading: nothing stands in
        return None
    return Machine(os.uname().nodename, total, int(total * (1.0 - settings.admission_headroom_fraction)),
                   published=False)


def local_engine(model: str):
    """An open Engine on a CPU-engine model installed here (it maps the files and reads no
    weight pages), or None: not installed here, not a GGUF model, or files the engine cannot
    open (a broken file is the worker's to report, naming the file)."""
    from h3render import paths
    from h3render.engine import models
    from h3render.engine.binding import Engine
    from h3render.engine.exceptions import EngineError

    path = paths.models_dir() / model
    if not path.is_dir() or models.model_kind(path) != "gguf":
        return None
    try:
        return Engine(path, threads=0)  # all cores: the worker's count when `tune` measured none
    except EngineError:
        return None


def check(r: redis.Redis, planned: Sequence, settings: Settings, infos: dict[str, dict]) -> None:
    """Refuse (DoesNotFitError) the planned jobs no live machine can ever admit; add a warning to
    each Planned whose job would not fit the stand-in machine or was checked against a lower
    bound only. `infos`: model -> the engine info the jobs were resolved against."""
    from h3render.queue.validation import is_h3

    machines = live(r, settings)
    if not machines:
        here = this_machine(settings)
        if here is None:
            return  # nothing to compare with; the worker's admission decides
        machines = [here]
    biggest = max(machines, key=lambda m: m.usable)
    verdicts: dict[tuple, Problem | str | None] = {}  # None: fits (or unchecked); str: a warning; Problem: refused
    engines: dict[str, object] = {}  # model -> its Engine here, or None; one open per model
    try:
        for p in planned:
            job = p.job
            key = (job.model, job.quant, job.width, job.height, job.frames, job.guidance > 1.0)
            if key not in verdicts:
                info = infos.get(job.model) or {}
                if is_h3(info):
                    verdicts[key] = None
                else:
                    if job.model not in engines:
                        engines[job.model] = local_engine(job.model)
                    verdicts[key] = _verdict(job, info, biggest, engines[job.model])
            v = verdicts[key]
            if isinstance(v, str) and v not in p.warnings:
                p.warnings.append(v)
    finally:
        for engine in engines.values():
            if engine is not None:
                engine.close()
    problems = list(dict.fromkeys(v for v in verdicts.values() if isinstance(v, Problem)))
    if problems:
        raise DoesNotFitError(problems)


def _verdict(job, info: dict, biggest: Machine, engine=None) -> Problem | str | None:
    """None when `job` fits `biggest`; else the refusal (a published machine) or the warning
    (this machine standing in), with the figures and the nearest size that fits. `engine`:
    the model's Engine here (the full estimate), or None (the lower bound)."""
    head = 1.0 - biggest.usable / biggest.total
    full = _full_estimate(job, engine, biggest, head) if engine is not None else None
    if full is not None:
        a, size = full
        if a.fits:
            return None
        need, hint, bound = a.need, a.suggestion, ""
    else:
        wb = (info.get("weight_bytes") or {}).get(job.quant)
        if not isinstance(wb, int) or isinstance(wb, bool) or wb < 0:
            return None  # no figure to bound it with: the worker's admission decides
        need = lower_bound(job.width, job.height, job.frames, wb)
        size = _smaller_by_bound(job, wb, biggest.usable, int(info.get("size_multiple") or 16))
        hint = (f"a size of at most {size[0]}x{size[1]} passes this bound (the worker's full estimate may "
                "want a smaller one)" if size else "try a machine with more memory")
        bound = " at least"
        if need <= biggest.usable:
            return (f"memory checked against a lower bound only ({_gib(need)}): model {job.model!r} is not "
                    "installed on this machine; the worker checks the full estimate")
    nearest = f"{size[0]}x{size[1]}" if size else None
    rule = (f"needs{bound} {_gib(need)} of memory ({job.frames} frames, quant {job.quant}); the largest "
            f"{biggest.describe()}; {hint}")
    if biggest.published:
        return Problem("width x height", f"{job.width}x{job.height}", rule, nearest)
    return f"{job.width}x{job.height} would not fit: {rule}"


def _full_estimate(job, engine, biggest: Machine, head: float):
    """(Admission against `biggest`, the nearest size that fits or None) from the engine's
    estimate of the job's request, or None when the engine refuses it (the worker reports it)."""
    from dataclasses import replace

    from h3render.engine.exceptions import EngineError
    from h3render.queue.contract import request
    from h3render.worker import admission as adm

    info = engine.info()
    levels = [str(q) for q in info.get("quant_levels") or []]
    if job.quant not in levels:
        return None
    grid = int(info.get("size_multiple") or adm.SIZE_MULTIPLE)
    try:
        req = replace(request(job, info, engine.model_dir), threads=int(info.get("threads") or 1))
        estimate = adm.engine_estimator(engine)
        a = adm.admit(req, estimate, levels, biggest.total, head, grid)
        size = None if a.fits else adm.smaller_size(req, estimate, biggest.usable, grid)
    except (EngineError, OSError):
        return None
    return a, size


def lower_bound(width: int, height: int, frames: int, weight_bytes: int) -> int:
    """Bytes every render of this size needs whatever the model's layers: its weights, the
    decoded video as f32 (3 x frames x height x width) and the fixed process overhead."""
    from h3render.worker.admission import F32, OVERHEAD_BYTES

    return weight_bytes + F32 * 3 * frames * height * width + OVERHEAD_BYTES


def _smaller_by_bound(job, weight_bytes: int, usable: int, grid: int) -> tuple[int, int] | None:
    """The largest size with the job's aspect ratio, on `grid`, whose lower bound fits `usable`."""
    for k in range(1, 64):
        f = 1.0 - k / 64.0
        w = max(grid, int(job.width * f) // grid * grid)
        h = max(grid, int(job.height * f) // grid * grid)
        if (w, h) != (job.width, job.height) and lower_bound(w, h, job.frames, weight_bytes) <= usable:
            return w, h
    return None
