"""The one way a job's state is written: its meta["h3r"] and its sweep's index, together.

A sweep keeps two small indexes beside its job list (h3render.keys):
    SWEEP_STATES_KEY   hash  job id -> JobPhase value      (counts without reading jobs)
    SWEEP_CHANGED_KEY  zset  job id -> time of last change (a page polls what changed)
so `status <sweep>` and the sweep page never scan every job. Every writer of a job's
state (enqueue, the render task, the worker, cancel and retry) goes through
`save_h3r` (or `record_state` inside a pipeline it already has), so the indexes move
with the meta in one MULTI/EXEC.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any

from h3render.keys import SWEEP_CHANGED_KEY, SWEEP_STATES_KEY


def _value(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def record_state(pipe, sweep_id: str | None, job_id: str, state: str, now: float | None = None) -> None:
    """Queue the index writes of one state change on `pipe` (no-op outside a sweep)."""
    if not sweep_id or state is None:
        return
    pipe.hset(SWEEP_STATES_KEY.format(id=sweep_id), job_id, _value(state))
    pipe.zadd(SWEEP_CHANGED_KEY.format(id=sweep_id), {job_id: time.time() if now is None else now})


def save_h3r(job, **fields: Any) -> dict:
    """Merge `fields` into job.meta["h3r"], save the meta and, when a state is among the
    fields, the sweep's index, in one transaction. Returns the merged dict."""
    h = dict(job.meta.get("h3r") or {})
    h.update({k: _value(v) for k, v in fields.items()})
    job.meta["h3r"] = h
    with job.connection.pipeline(transaction=True) as pipe:
        pipe.hset(job.key, "meta", job.serializer.dumps(job.meta))
        if "state" in fields:
            record_state(pipe, h.get("sweep_id"), job.id, h["state"])
        pipe.execute()
    return h
