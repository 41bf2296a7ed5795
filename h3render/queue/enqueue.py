"""Enqueue jobs and sweeps: validate, resolve, estimate, then one Redis pipeline for all of them.

Every job goes to rq Queue(settings.queue_name) with the JSON serializer, names
RENDER_FUNC (the only function a worker runs), carries kwargs={"job": payload},
a job_timeout from its estimate, 30-day result/failure TTLs and Retry from the
settings. Sweeps also write "h3render:sweep:<id>" (hash), "h3render:sweep:<id>:jobs"
(list, in run order) and add the id to "h3render:sweeps"; all in the same
MULTI/EXEC, so a sweep is queued whole or not at all.

Acknowledged means stored (h3render.queue.durability): before the EXEC the server's
persistence is probed and the AOF's disk checked for room; the EXEC is sent once
(never re-sent after a lost reply, which could queue a sweep twice); after it the
write is confirmed (WAITAOF on Redis >= 7.2, else INFO persistence). Any doubt raises
NotStoredError and nothing is reported queued. EnqueueResult.stored says what the
acknowledgement means on this server (fsynced, written, memory, unknown).
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from h3render.queue import capacity, contract, durability
from h3render.queue import estimate as est
from h3render.queue.connection import single_attempt
from h3render.queue.engine_info import engine_info
from h3render.queue.errors import JobValidationError, Problem
from h3render.queue.jobstate import record_state
from h3render.queue.job import RENDER_FUNC, JobPhase, RenderJob, new_job_id, new_sweep_id
from h3render.queue.sweep import expand, preview_version
from h3render.settings import Settings
from h3render.keys import SWEEPS_KEY, SWEEP_JOBS_KEY, SWEEP_KEY


def queue(r: redis.Redis, settings: Settings) -> Queue:
    """The one queue every front end and worker uses, always with the JSON serializer."""
    return Queue(settings.queue_name, connection=r, serializer=JSONSerializer)


@dataclass
class Planned:
    """One job ready to enqueue: its id, the resolved job and its estimate."""

    job_id: str
    job: RenderJob
    seconds: float
    time_source: str = "default"  # TimeModel.source of the estimate
    preview_of: str | None = None
    warnings: list[str] = field(default_factory=list)  # from the engine's validation (h3.c: frames rounded up)


@dataclass
class EnqueueResult:
    job_ids: list[str]
    seconds: float  # estimated total run time
    time_source: str  # "default" or "measured from N jobs"
    sweep_id: str | None = None
    preview_ids: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # distinct warnings of all jobs, in order
    stored: str = durability.Stored.fsynced.value  # what the acknowledgement means (durability.Stored)

    def to_dict(self) -> dict:
        return {
            "sweep_id": self.sweep_id,
            "jobs": len(self.job_ids),
            "job_ids": self.job_ids,
            "preview_jobs": len(self.preview_ids),
            "estimate_s": round(self.seconds, 1),
            "estimate_source": self.time_source,
            "warnings": self.warnings,
            "stored": self.stored,
        }


def distinct_warnings(planned: Sequence[Planned]) -> list[str]:
    """Every warning of the planned jobs once, in order (a sweep repeats them per job)."""
    seen: dict[str, None] = {}
    for p in planned:
        for w in p.warnings:
            seen.setdefault(w, None)
    return list(seen)


def plan(
    r: redis.Redis,
    payloads: Sequence[Mapping[str, Any]],
    settings: Settings,
    preview: bool = False,
    rng: random.Random | None = None,
) -> list[Planned]:
    """Validate and resolve every payload; with preview, small versions of all come first.

    Raises JobValidationError with every distinct problem (a sweep with one bad fixed
    field reports it once, not once per job), capacity.DoesNotFitError (a JobValidationError)
    for jobs no live machine can ever admit, NotStoredError when Redis refuses the
    writes planning makes (rq's registry cleanup) because it cannot persist.
    """
    try:
        return _plan(r, payloads, settings, preview, rng)
    except redis.ResponseError as e:
        if durability.is_refusal(e):
            raise durability.not_stored(e, durability.probe(r)) from None
        raise


def _plan(r: redis.Redis, payloads: Sequence[Mapping[str, Any]], settings: Settings, preview: bool,
          rng: random.Random | None) -> list[Planned]:
    infos: dict[str, dict] = {}
    models: dict[tuple[str, str], est.TimeModel] = {}
    problems: list[Problem] = []
    full: list[Planned] = []
    for payload in payloads:
        try:
            # a Mapping becomes a dict; anything else goes to parse as it is, which refuses it.
            # Both layers at once: every problem of the job in one answer (h3render.queue.contract).
            checked = contract.check(dict(payload) if isinstance(payload, Mapping) else payload,
                                     lambda model: engine_info(r, model, infos), rng)
            job, info, warnings = checked.job, checked.info, checked.warnings
        except JobValidationError as e:
            problems.extend(p for p in e.problems if p not in problems)
            continue
        key = (job.model, str(job.quant))
        if key not in models:
            samples = est.measured_samples(r, settings.queue_name, *key)
            models[key] = est.fit(samples, info, est.default_model(settings))
        tm = models[key]
        full.append(Planned(new_job_id(), job, est.job_seconds(job, info, tm), tm.source, warnings=warnings))
    if problems:
        raise JobValidationError(problems)
    capacity.check(r, full, settings, infos)  # the full versions: a preview is smaller
    if not preview:
        return full
    small = []
    for p in full:
        info = infos[p.job.model]
        try:  # the small version passes the engine's rules too (a resolved job is a fixed point)
            pj, warnings = contract.resolve_with_warnings(preview_version(p.job, info), info)
        except JobValidationError as e:
            problems.extend(q for q in e.problems if q not in problems)
            continue
        tm = models[(pj.model, str(pj.quant))]
        small.append(Planned(new_job_id(), pj, est.job_seconds(pj, info, tm), tm.source, p.job_id, warnings))
    if problems:
        raise JobValidationError(problems)
    return small + full


def enqueue_planned(
    r: redis.Redis,
    planned: Sequence[Planned],
    settings: Settings,
    sweep_id: str | None = None,
    sweep_record: Mapping[str, Any] | None = None,
) -> EnqueueResult:
    """Put every planned job (and the sweep record, if any) on the queue in one MULTI/EXEC."""
    q = queue(r, settings)
    retry = Retry(max=settings.retry_max, interval=settings.retry_intervals_s) if settings.retry_max > 0 else None
    host = socket.gethostname()
    now = time.time()
    datas = []
    for i, p in enumerate(planned):
        meta = {
            "state": JobPhase.queued.value,
            "estimate": {"seconds": round(p.seconds, 2), "bytes": None},
            "sweep_id": sweep_id,
            "index": i,
            "preview": p.preview_of is not None,
            "preview_of": p.preview_of,
            "enqueued_by": host,
            "enqueued_at": now,
            "warnings": list(p.warnings),
        }
        datas.append(Queue.prepare_data(
            RENDER_FUNC,
            kwargs={"job": p.job.payload()},
            timeout=est.timeout_for(p.seconds, settings),
            result_ttl=settings.result_ttl_s,
            failure_ttl=settings.failure_ttl_s,
            description=p.job.label(),
            job_id=p.job_id,
            at_front=p.job.priority == "high",
            meta={"h3r": meta},
            retry=retry,
        ))
    # at_front jobs are LPUSHed one by one: push them last-first so they run in plan order.
    front = [d for d in datas if d.at_front][::-1]
    back = [d for d in datas if not d.at_front]
    persistence = durability.probe(r)
    wr = single_attempt(r)
    try:
        pipe = wr.pipeline(transaction=True)
        q.enqueue_many(back + front, pipeline=pipe)
        if sweep_id is not None:
            pipe.hset(SWEEP_KEY.format(id=sweep_id), mapping={
                k: (v if isinstance(v, (str, int, float)) else json.dumps(v)) for k, v in (sweep_record or {}).items()
            } | {"created_at": now, "jobs": len(planned), "estimate_s": sum(p.seconds for p in planned)})
            pipe.rpush(SWEEP_JOBS_KEY.format(id=sweep_id), *[p.job_id for p in planned])
            for p in planned:
                record_state(pipe, sweep_id, p.job_id, JobPhase.queued, now)
            pipe.sadd(SWEEPS_KEY, sweep_id)
        durability.check_room(persistence, durability.write_bytes(pipe.command_stack))
        try:
            pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as e:
            raise durability.not_stored(e, persistence) from None
        stored_warnings = durability.confirm(wr, persistence)
    finally:
        if wr is not r:
            wr.connection_pool.disconnect()
    if persistence.stored != durability.Stored.fsynced:
        stored_warnings.append(f"acknowledged means {persistence.stored.text}")
    return EnqueueResult(
        job_ids=[p.job_id for p in planned],
        seconds=sum(p.seconds for p in planned),
        time_source=", ".join(sorted({p.time_source for p in planned})) or "default",
        sweep_id=sweep_id,
        preview_ids=[p.job_id for p in planned if p.preview_of],
        warnings=distinct_warnings(planned) + stored_warnings,
        stored=persistence.stored.value,
    )


def enqueue(r: redis.Redis, payload: Mapping[str, Any], settings: Settings) -> EnqueueResult:
    """Validate, resolve and enqueue one job; its id is result.job_ids[0]."""
    return enqueue_planned(r, plan(r, [payload], settings), settings)


def enqueue_sweep(
    r: redis.Redis,
    fixed: Mapping[str, Any],
    axes: Mapping[str, list[Any]],
    settings: Settings,
    preview: bool = False,
    rng: random.Random | None = None,
) -> EnqueueResult:
    """Expand the grid, validate every job, and enqueue the sweep in one pipeline."""
    check_grid(fixed, axes)
    planned = plan(r, expand(fixed, axes), settings, preview=preview, rng=rng)
    return enqueue_sweep_planned(r, planned, fixed, axes, settings, preview)


def check_grid(fixed: Any, axes: Any) -> None:
    """Refuse fixed fields that are not an object, and axes that are not lists of values, the way a
    bad job field is refused (an API caller, a ComfyUI node or a TOML file may pass anything)."""
    problems = []
    if not isinstance(fixed, Mapping):
        problems.append(Problem("job", _short(fixed), "the fixed fields of a sweep must be a JSON object of "
                                "job fields", {"prompt": "..."}))
    if not isinstance(axes, Mapping):
        problems.append(Problem("axes", _short(axes), "must be an object {field: [values, ...]}", {"seed": [1, 2]}))
    else:
        for name, values in axes.items():
            if not isinstance(values, (list, tuple)) or not values:
                problems.append(Problem(str(name), _short(values), "a sweep axis must be a non-empty list of values",
                                        [values] if not isinstance(values, (list, tuple)) else None))
    if problems:
        raise JobValidationError(problems)


def _short(v: Any) -> Any:
    text = repr(v)
    return v if len(text) <= 80 else text[:77] + "..."


def enqueue_sweep_planned(r: redis.Redis, planned: Sequence[Planned], fixed: Mapping[str, Any],
                          axes: Mapping[str, list[Any]], settings: Settings, preview: bool) -> EnqueueResult:
    """Enqueue an already planned sweep (the CLI plans first to print an estimate or dry-run)."""
    record = {"axes": axes, "fixed": fixed, "preview": int(preview)}
    return enqueue_planned(r, planned, settings, sweep_id=new_sweep_id(), sweep_record=record)
