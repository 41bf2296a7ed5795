"""The render task: the only function a job may name (h3render.worker.render.render_job).

It runs inside rq's work horse (a fresh spawned process per job), so it owns the
engine for exactly one render and all memory goes back to the OS afterwards.

    validate (RenderJob, resolved)        -> PermanentJobError on failure
    resolve the model by name             -> PermanentJobError when missing
    model files (the engine's view)       -> PermanentJobError naming the file when the job's
                                             level broke after conversion (info
                                             "unusable_levels"); H3: `models inspect`
    admission (memory estimate vs now)    -> PermanentJobError at once when the job cannot fit
                                             this machine's total memory (figures and the
                                             nearest size that fits); else waits for memory
                                             and for disk space (output estimate + margin),
                                             then RetryableJobError; the estimate is the CPU
                                             engine's own for the exact request it will render
                                             (Engine.estimate_memory, h3render.worker.admission)
                                             or, for an H3 snapshot, h3.c's (admit_h3, with the
                                             DiT bytes from `models inspect`)
    engine: load, encode, denoise, decode -> progress/ETA/peak RSS into meta each tick;
                                             cancel key polled each tick; heat pause
                                             between denoising steps; the latest preview
                                             frame as a small PNG (h3render.worker.preview);
                                             threads from `h3render tune` when measured
    outputs: video.mp4, poster.png, meta.json, written and flushed in this attempt's
             staging folder, which becomes the job folder by one rename
             (h3render.worker.staging); stale staging folders are swept first

Failures are classified and recorded by h3render.worker.failures: permanent ones
set the job's retries_left to 0 so rq does not retry them; transient ones keep
rq's Retry; a full disk sends the job back to the queue without spending a retry.
A job that fails for good gets a job folder holding only meta.json with the reason.
A cancel returns normally with meta state "canceled" and leaves no job folder;
the worker then moves the job to rq's canceled registry (the horse's own
bookkeeping would say finished). The cancel key is read at every step and at
least every CANCEL_POLL_S while the job waits (for memory, for disk, paused hot).
Every state write goes through h3render.queue.jobstate.save_h3r.
"""

from __future__ import annotations

import datetime as dt
import os
import resource
import signal
import socket
import sys
import time
from pathlib import Path

from h3render.queue.job import JobPhase, RenderJob
from h3render.queue.jobstate import save_h3r
from h3render.settings import Settings
from h3render.worker import admission as adm
from h3render.worker import staging
from h3render.worker.failures import (  # noqa: F401 - the error classes are part of this module's face
    DiskFull,
    JobError,
    NotEnoughDisk,
    NotEnoughMemory,
    PermanentJobError,
    RetryableJobError,
    ThermalAbort,
    WorkerLost,
    classify,
    record_failure,
)
from h3render.worker.health import Readings, decide_thermal, format_bytes
from h3render.worker.sensors import read_readings
from h3render.keys import CANCEL_KEY, RENDER_FUNC

ALLOWED_FUNC = RENDER_FUNC
PHASE_STATE = {"load": JobPhase.loading, "encode": JobPhase.encoding,
               "denoise": JobPhase.denoising, "decode": JobPhase.decoding}
THERMAL_CHECK_MIN_S = 2.0  # at most one sensor read per this many seconds during a render
CANCEL_POLL_S = 0.5  # while waiting: a cancel ends the job within this plus the horse's exit


def refusal(job) -> str | None:
    """Why an rq job must not run here, or None when it may.

    A job may run only when it names ALLOWED_FUNC (not a method of some instance),
    passes nothing but the payload (kwargs {"job": dict}, or one dict positionally),
    and carries no success/failure/stopped callback and no webhook: rq imports and
    calls callbacks by name too, and our enqueue never sets any of them. Data that
    is not readable JSON is refused as well. Used by the worker before it spawns the
    render process and again by that process on the job it fetched itself (someone
    who can write to Redis could swap the job in between). Reads only `job`.
    """
    try:
        func, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as e:  # noqa: BLE001 - rq's DeserializationError, bad JSON, ...
        return (f"refused: job {job.id}'s data cannot be read as a JSON job ({type(e).__name__}); "
                f"this worker runs only {ALLOWED_FUNC}")
    if func != ALLOWED_FUNC:
        return f"refused: job {job.id} names function {func!r}; this worker runs only {ALLOWED_FUNC}"
    if instance is not None:
        return (f"refused: job {job.id} calls {func!r} on an instance ({type(instance).__name__}); "
                "a render job names the module function only")
    one_dict = ((not args and set(kwargs or {}) == {"job"} and isinstance(kwargs["job"], dict))
                or (len(args or ()) == 1 and not kwargs and isinstance(args[0], dict)))
    if not one_dict:
        return (f"refused: job {job.id} passes args={_short(args)} kwargs={_short(kwargs)} to "
                f"{func}; allowed: the payload only, as kwargs {{'job': {{...}}}}")
    hooks = {"success callback": getattr(job, "_success_callback_name", None),
             "failure callback": getattr(job, "_failure_callback_name", None),
             "stopped callback": getattr(job, "_stopped_callback_name", None)}
    named = {k: v for k, v in hooks.items() if v}
    if named:
        return (f"refused: job {job.id} names {', '.join(f'{k} {v!r}' for k, v in named.items())}; "
                "render jobs carry no callbacks")
    if getattr(job, "webhooks", None):
        return f"refused: job {job.id} carries {len(job.webhooks)} webhook(s); render jobs carry none"
    return None


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def peak_rss_bytes() -> int:
    """Peak resident set of this process: VmHWM from /proc/self/status where there is one
    (on Linux ru_maxrss carries the parent's peak across fork and exec, so a render process
    forked from a large worker would report the worker's), else ru_maxrss (KiB on Linux,
    bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class _Meta:
    """job.meta["h3r"], saved on every update through jobstate.save_h3r (one MULTI/EXEC:
    the meta, and the sweep's state index when the state is among the fields)."""

    def __init__(self, job):
        self.job = job
        self.data = dict(job.meta.get("h3r") or {}) if job is not None else {}

    def update(self, **kw) -> None:
        self.data.update({k: (v.value if isinstance(v, JobPhase) else v) for k, v in kw.items()})
        if self.job is not None:
            self.job.meta["h3r"] = dict(self.data)
            self.data = save_h3r(self.job, **kw)

    def drop(self, *keys: str) -> None:
        """Forget fields of an earlier attempt (saved with the next update)."""
        for k in keys:
            self.data.pop(k, None)


class _Files:
    """Where this attempt writes: the job folder it may publish and its staging folder."""

    def __init__(self):
        self.final: Path | None = None
        self.staging: Path | None = None
        self.attempt = 1


def _output_dir(settings: Settings, job_id: str, sweep_id: str | None) -> Path:
    group = sweep_id or dt.date.today().isoformat()
    for part in (group, job_id):  # ids only, never prompt text
        if (not isinstance(part, str) or not part or "/" in part or part.startswith(".")
                or os.sep in part or "\0" in part):
            raise PermanentJobError(f"id {part!r} cannot name an output folder")
    return Path(settings.renders_dir()) / group / job_id


def available_memory(r: Readings) -> int | None:
    """Bytes a new render can use now: the smallest of the estimates we have
    (psutil available; macOS free percentage of RAM; a cgroup's remaining limit)."""
    m = r.memory
    cands = []
    if m.available_bytes is not None:
        cands.append(m.available_bytes)
    if m.free_percent is not None and m.total_bytes:
        cands.append(m.total_bytes * m.free_percent // 100)
    return min(cands) if cands else None


def render_job(job: dict) -> dict:
    """rq entry point. Returns a small summary (JSON-serializable) on success or cancel."""
    from rq import get_current_job

    rq_job = get_current_job()
    settings = Settings()
    meta = _Meta(rq_job)
    job_id = rq_job.id if rq_job is not None else "local"
    parent = os.getppid()
    files = _Files()
    try:
        return _render(job, rq_job, settings, meta, job_id, parent, files)
    except _Canceled:
        staging.discard(files.staging)
        if files.final is not None:
            staging.remove_failure_record(files.final)
        meta.update(state=JobPhase.canceled, canceled_at=time.time(), peak_rss=peak_rss_bytes(),
                    error=None, reason=None)
        return {"canceled": True, "job_id": rq_job.id if rq_job else None}
    except BaseException as exc:  # noqa: BLE001 - classified, recorded, re-raised
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            staging.discard(files.staging)
            raise
        err = record_failure(exc, rq_job, settings, meta, files, job, peak_rss_bytes())
        if err is exc:
            raise
        raise err from exc


def _render(payload: dict, rq_job, settings: Settings, meta: _Meta, job_id: str,
            parent: int, files: _Files) -> dict:
    from h3render.engine import models
    from h3render.engine.exceptions import EngineError
    from h3render.queue.errors import JobValidationError
    from h3render.queue.validation import check_id

    t0 = time.time()
    timings: dict[str, float] = {}
    health: list[dict] = []
    files.attempt = int(meta.data.get("attempt", 0)) + 1
    meta.drop("output_dir")  # set again only once this attempt's job folder is in place
    meta.update(host=socket.gethostname(), pid=os.getpid(), started_at=t0, pauses=[],
                attempt=files.attempt, error=None, engine_error="", reason=None)
    try:  # an earlier attempt killed mid-render (of this job or another) left its staging
        staging.sweep_staging(settings.renders_dir())
    except OSError:
        pass

    # -- validate
    try:
        job = RenderJob.parse(payload)
    except JobValidationError as e:
        raise PermanentJobError(f"invalid job: {e}") from None
    try:  # the sweep id becomes a folder name: a NUL or a '/' in it is refused once, not retried
        if meta.data.get("sweep_id") is not None:
            check_id("sweep_id", meta.data["sweep_id"])
    except JobValidationError as e:
        raise PermanentJobError(f"invalid job record: {e}") from None
    files.final = _output_dir(settings, job_id, (meta.data.get("sweep_id") or _sweep_of(rq_job)))
    if not job.resolved:
        missing = [k for k in ("seed", "negative_prompt", "width", "height", "frames", "steps",
                               "guidance", "shift", "sampler", "quant", "fps")
                   if getattr(job, k) in (None, "random")]
        raise PermanentJobError(f"invalid job: fields {missing} were not resolved at enqueue "
                                "(enqueue through h3render.queue, which fills the model's defaults)")

    # -- model
    try:
        model_dir = models.resolve_model(job.model)
    except EngineError as e:
        raise PermanentJobError(f"missing model: {e}", e.message) from None
    threads, threads_source = engine_threads(job)
    meta.update(threads=threads, threads_source=threads_source)

    # -- model files, then admission
    if models.model_kind(model_dir) == "h3":
        est, check = _h3_admission(job, model_dir, settings)
        _admit(job, settings, meta, rq_job, parent, est, check, health)
    else:
        from h3render.engine.binding import Engine

        with _open_engine(Engine, model_dir, threads) as engine:  # maps files, reads no weight pages
            est, check = _cpu_admission(job, model_dir, settings, engine)
            _admit(job, settings, meta, rq_job, parent, est, check, health)
    timings["admission"] = time.time() - t0

    files.staging = staging.new_staging(files.final, files.attempt)
    meta.update(state=JobPhase.loading, phase="load", reason=None)
    return _run_engine(job, model_dir, files, settings, meta, rq_job, parent, est, timings,
                       health, t0, threads)


def _admit(job: RenderJob, settings: Settings, meta: _Meta, rq_job, parent: int, est, check,
           health: list) -> None:
    """Wait until the job fits this machine's memory and disk now; fail it at once when it
    can never fit (its estimate exceeds the total), retryably when the wait runs out."""
    out = adm.output_bytes(job.width, job.height, job.frames)
    margin = settings.gate_min_free_bytes
    disk_need = out + margin
    deadline = time.time() + settings.admission_wait_limit_s
    while True:
        readings = read_readings(settings)
        health.append(_health_sample(readings))
        total, disk = readings.memory.total_bytes, readings.disk
        if total:
            whole = check(total)
            if not whole.fits:
                raise PermanentJobError(
                    f"does not fit this machine's memory: needs {adm._gib(whole.need)}, machine "
                    f"has {adm._gib(total)} total ({adm._gib(whole.usable)} usable, headroom "
                    f"{whole.headroom:.0%}); {whole.suggestion}")
        if disk.total_bytes is not None and disk_need > disk.total_bytes:
            raise PermanentJobError(
                f"does not fit the disk: needs up to {format_bytes(out)} for its outputs plus the "
                f"{format_bytes(margin)} margin, and the file system under {disk.path} holds "
                f"{format_bytes(disk.total_bytes)} in all")
        avail = available_memory(readings)
        a = check(avail) if avail is not None else None
        meta.update(estimate={**meta.data.get("estimate", {}), **est.as_meta()},
                    output_estimate=out,
                    admission=a.message if a else "no memory reading on this machine; admitted")
        short_disk = disk.free_bytes is not None and disk.free_bytes < disk_need
        if (a is None or a.fits) and not short_disk:
            return
        if a is not None and not a.fits:
            state, why = JobPhase.waiting_memory, a.message
        else:
            state = JobPhase.waiting_disk
            why = (f"needs up to {format_bytes(out)} for its outputs plus the "
                   f"{format_bytes(margin)} margin, {format_bytes(disk.free_bytes)} free under "
                   f"{disk.path}")
        if time.time() >= deadline:
            if state == JobPhase.waiting_memory:
                raise NotEnoughMemory(f"not enough memory: {why}")
            raise NotEnoughDisk(f"not enough disk space: {why}")
        what = "memory" if state == JobPhase.waiting_memory else "disk space"
        meta.update(state=state, reason=f"waiting for {what}: {why}")
        _wait(min(settings.admission_poll_s, max(deadline - time.time(), 0.1)), rq_job, parent)


def _wait(seconds: float, rq_job, parent: int) -> None:
    """Sleep `seconds`, reading the cancel key every CANCEL_POLL_S: raises _Canceled on a
    cancel, WorkerLost when the worker died."""
    end = time.time() + seconds
    while True:
        if _check_cancel_or_parent(rq_job, parent):
            raise _Canceled()
        left = end - time.time()
        if left <= 0:
            return
        time.sleep(min(CANCEL_POLL_S, left))


def engine_threads(job: RenderJob) -> tuple[int, str]:
    """(threads, source) for the engine: the count `h3render tune` measured fastest on this
    machine for the job's model and quant level, else 0 (all cores)."""
    from h3render.engine.tune import best_threads

    try:
        best = best_threads(job.model, str(job.quant))
    except Exception:  # noqa: BLE001 - a broken tune file must not fail a render
        best = None
    return (best, "tune") if best else (0, "all cores")


def _cpu_admission(job: RenderJob, model_dir: Path, settings: Settings, engine):
    """(estimate, check(available) -> Admission) for the CPU engine's GGUF model dir, from the
    engine's own estimate of the exact request the render will make (its real thread count).

    The model's files are checked first, as the engine sees them now: a level whose file broke
    after conversion (the engine set it aside, info "unusable_levels") fails the job at once,
    naming the file, with no retry; so does a level the model lacks, or a request the engine
    refuses (InvalidRequestError or UnsupportedError from the estimate)."""
    from dataclasses import replace

    from h3render.engine.exceptions import InvalidRequestError, UnsupportedError
    from h3render.queue.contract import request

    info = engine.info()
    broken = (info.get("unusable_levels") or {}).get(job.quant)
    if broken:
        raise PermanentJobError(f"quant={job.quant} of model {model_dir.name!r} is unusable: {broken}")
    levels = [str(q) for q in info.get("quant_levels") or []]
    if job.quant not in levels:
        raise PermanentJobError(f"quant={job.quant!r} is not available for model {job.model!r}; "
                                f"available: {', '.join(sorted(levels)) or 'none'}")
    req = request(job, info, model_dir)
    req = replace(req, threads=int(info.get("threads") or os.cpu_count() or 1))
    estimate = adm.engine_estimator(engine)
    try:
        est = estimate(req)
    except (InvalidRequestError, UnsupportedError) as e:  # what generate would refuse too
        raise PermanentJobError(f"invalid job: {e}", e.message) from None
    grid = int(info.get("size_multiple") or adm.SIZE_MULTIPLE)
    return est, lambda avail: adm.admit(req, estimate, levels, avail,
                                        settings.admission_headroom_fraction, grid)


def _h3_admission(job: RenderJob, model_dir: Path, settings: Settings):
    """(estimate, check(available) -> Admission) for an h3.c job on an H3 snapshot.

    The snapshot's headers are checked first (`models inspect`: a truncated or
    missing shard fails the job permanently, naming the file, before h3.c runs),
    and the job's options again (the payload may come from anyone who can write to
    Redis); the DiT bytes feed h3render.engine.h3.estimate.
    """
    from h3render.engine.h3.inspect import inspect_model_dir
    from h3render.engine.h3.options import H3OptionsError, validate_h3_options

    report = inspect_model_dir(model_dir)
    if not report.ok:
        raise PermanentJobError(f"model {job.model!r} has broken files (see `h3render models inspect "
                                f"{model_dir}`): " + "; ".join(str(p) for p in report.problems))
    try:
        request, _ = validate_h3_options(dict(job.engine_options), job.width, job.height, job.frames,
                                         quant=job.quant, steps=job.steps)
    except H3OptionsError as e:
        raise PermanentJobError(f"invalid job: {e}") from None
    if request.frames != job.frames:
        raise PermanentJobError(f"invalid job: frames={job.frames} is not 17n+5 (enqueue through "
                                "h3render.queue, which rounds it up)")
    preview = True if job.preview_every > 0 else None
    dit = report.dit_bytes()
    est = adm.estimate_h3_memory(dit, request, preview=preview)
    return est, lambda avail: adm.admit_h3(request, dit, avail, settings.admission_headroom_fraction, preview)


def _sweep_of(rq_job) -> str | None:
    if rq_job is None:
        return None
    h = rq_job.meta.get("h3r") or {}
    return h.get("sweep_id") or rq_job.meta.get("sweep_id")


def _health_sample(r: Readings) -> dict:
    return {"time": r.time, "available": r.memory.available_bytes,
            "pressure_level": r.memory.pressure_level, "psi_some": r.memory.psi_some_avg10,
            "thermal_state": r.thermal.state.value if r.thermal.state else None,
            "on_battery": r.power.on_battery}


def _check_cancel_or_parent(rq_job, parent: int) -> bool:
    """True when a cancel was requested; raises WorkerLost when our worker died."""
    if os.getppid() != parent:
        raise WorkerLost(f"the worker process (pid {parent}) died while this job was running")
    if rq_job is None:
        return False
    return bool(rq_job.connection.exists(CANCEL_KEY.format(id=rq_job.id)))


def _run_engine(job: RenderJob, model_dir: Path, files: _Files, settings: Settings, meta: _Meta,
                rq_job, parent: int, est, timings: dict, health: list, t0: float,
                threads: int = 0) -> dict:
    from h3render.engine.binding import FRAME_FINAL, FRAME_PREVIEW, Engine
    from h3render.engine.exceptions import EngineCanceled, EngineError
    from h3render.engine.video import RenderOutputs

    state = {"phase": "load", "phase_t": time.time(), "step_t": None, "step_times": [],
             "canceled": False, "last_thermal": 0.0, "prev_readings": None, "preview_step": None}
    pauses: list[dict] = []

    def on_progress(phase: str, done: int, total: int) -> bool:
        now = time.time()
        if phase != state["phase"]:
            timings[state["phase"]] = round(timings.get(state["phase"], 0.0) + now - state["phase_t"], 4)
            state["phase"], state["phase_t"] = phase, now
        upd = dict(state=PHASE_STATE.get(phase, JobPhase.loading), phase=phase,
                   done=done, total=total, peak_rss=peak_rss_bytes())
        if phase == "denoise":
            if state["step_t"] is not None and done > 0:
                state["step_times"].append(now - state["step_t"])
            state["step_t"] = now
            per = (sum(state["step_times"]) / len(state["step_times"])) if state["step_times"] else None
            upd.update(step=done, steps=total,
                       eta_s=round(per * (total - done), 2) if per is not None else None)
        meta.update(**upd)
        if _check_cancel_or_parent(rq_job, parent):
            state["canceled"] = True
            return True
        if phase == "denoise" and 0 < done < total:
            _thermal_pause(settings, meta, state, pauses, health, rq_job, parent)
            if state["canceled"]:
                return True
        return False

    info: dict = {}
    with _open_engine(Engine, model_dir, threads) as engine:
        info = engine.info()
        meta.update(engine={k: info.get(k) for k in ("engine", "engine_version", "abi", "model", "threads")})
        if rq_job is not None:  # clients validate new jobs against what workers serve
            from h3render.queue.engine_info import publish_engine_info

            publish_engine_info(rq_job.connection, job.model, info)
        from h3render.queue.contract import request

        req = request(job, info, model_dir)  # the request `h3render run` builds for the same job
        outputs = RenderOutputs(width=job.width, height=job.height, total=job.frames,
                                fps=float(job.fps or info.get("fps", 16)),
                                video=files.staging / "video.mp4",
                                poster=files.staging / "poster.png")
        with outputs:
            def on_frame(kind: int, index: int, rgb) -> bool:
                if kind == FRAME_FINAL:
                    outputs.add(index, rgb)
                elif kind == FRAME_PREVIEW and index + 1 != state["preview_step"]:
                    from h3render.worker.preview import preview_b64

                    state["preview_step"] = index + 1  # steps done, as meta "step" counts
                    meta.update(preview_png=preview_b64(rgb), preview_step=index + 1)
                return False

            try:
                engine.generate(req, on_progress=on_progress, on_frame=on_frame)
            except EngineError as e:
                meta.update(engine_error=engine.last_error() or e.message)
                if isinstance(e, EngineCanceled) and state["canceled"]:
                    raise _Canceled() from None
                raise
            now = time.time()
            timings[state["phase"]] = round(timings.get(state["phase"], 0.0) + now - state["phase_t"], 4)
            meta.update(state=JobPhase.writing, phase="write")
            t_w = time.time()
            written = outputs.close(fsync=True)
            timings["write"] = round(time.time() - t_w, 4)

    timings["total"] = round(time.time() - t0, 4)
    doc = {
        "job_id": rq_job.id if rq_job else None,
        "sweep_id": meta.data.get("sweep_id"),
        "parameters": job.payload(),
        "engine": info,
        "model_dir_name": model_dir.name,
        "timings_s": timings,
        "step_times_s": [round(s, 4) for s in state["step_times"]],
        "peak_rss": peak_rss_bytes(),
        "estimate": est.as_meta(),
        "health": health,
        "pauses": pauses,
        "host": socket.gethostname(),
        "attempt": meta.data.get("attempt"),
        "outputs": {k: Path(v).name for k, v in written.items()},
        "finished_at": time.time(),
    }
    staging.write_json(files.staging / "meta.json", doc)
    out_dir = staging.publish(files.staging, files.final)
    files.staging = None
    meta.update(state=JobPhase.finished, phase="done", output_dir=str(out_dir),
                peak_rss=doc["peak_rss"], timings=timings, eta_s=0, pauses=pauses,
                finished_at=doc["finished_at"])
    return {"output_dir": str(out_dir), "peak_rss": doc["peak_rss"], "timings_s": timings}


class _Canceled(Exception):
    pass


def _open_engine(engine_cls, model_dir: Path, threads: int):
    """Engine(model_dir, threads); an H3 snapshot the library cannot open says what to build."""
    from h3render.engine import models
    from h3render.engine.exceptions import EngineError

    try:
        return engine_cls(model_dir, threads=threads)
    except EngineError as e:
        if models.model_kind(model_dir) != "h3":
            raise
        raise PermanentJobError(
            f"cannot open the H3 snapshot {model_dir.name!r}: {e}. H3 snapshots run on antirez's h3.c: "
            "build h3render against it (H3_SOURCE_DIR=... pip install . on a Mac; docs/H3C.md)",
            e.message) from None


def _thermal_pause(settings: Settings, meta: _Meta, state: dict, pauses: list, health: list,
                   rq_job, parent: int) -> None:
    """Between denoising steps: if the machine is hot, wait until it cools (recorded
    in meta "pauses"); give up after thermal_pause_max_s with ThermalAbort. The
    sensors are read every thermal_pause_poll_s, the cancel key every CANCEL_POLL_S.

    While paused, rq's job timeout alarm (SIGALRM, armed by the horse for the job's
    timeout) is held and re-armed with what was left, so a pause never times the
    job out; the worker moves its own copy of the timeout on by the recorded pauses
    (H3Worker.maintain_heartbeats)."""
    now = time.time()
    if now - state["last_thermal"] < THERMAL_CHECK_MIN_S:
        return
    state["last_thermal"] = now
    r = read_readings(settings)
    d = decide_thermal(r, settings, state["prev_readings"])
    state["prev_readings"] = r
    if d.open:
        return
    start = time.time()
    pause = {"start": start, "reason": d.state, "step": meta.data.get("step")}
    pauses.append(pause)
    health.append(_health_sample(r))
    prev_state = meta.data.get("state")
    meta.update(state=JobPhase.paused_thermal, reason=d.state, pauses=pauses)
    held = signal.alarm(0)  # rq's job timeout (SIGALRM) stands still while paused
    try:
        while True:
            if time.time() - start > settings.thermal_pause_max_s:
                pause["end"] = time.time()
                meta.update(pauses=pauses)
                raise ThermalAbort(f"thermal abort: still hot after {settings.thermal_pause_max_s:g} s "
                                   f"({d.state})")
            try:
                _wait(settings.thermal_pause_poll_s, rq_job, parent)
            except _Canceled:
                state["canceled"] = True
                pause["end"] = time.time()
                return
            r = read_readings(settings)
            d = decide_thermal(r, settings, state["prev_readings"])
            state["prev_readings"] = r
            if d.open:
                break
    finally:
        if held:
            signal.alarm(held)
    pause["end"] = time.time()
    pause["seconds"] = round(pause["end"] - start, 3)
    health.append(_health_sample(r))
    meta.update(state=prev_state or JobPhase.denoising, reason=None, pauses=pauses)
    state["step_t"] = time.time()  # the pause is not step time
