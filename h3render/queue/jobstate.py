"""The one way a job's state is written: its meta["h3r"] and its sweep's index, together.

A sweep keeps two small indexes beside its job list (h3render.keys):
    SWEEP_STATES_KEY   hash  job id -> JobPhase value      (counts without reading jobs)
    SWEEP_CHANGED_KEY  zset  job id -> time of last change (a page polls what changed)
so `status <sweep>` and the sweep page never scan every job. Every writer of a job's
state (enqueue, the render task, the worker, cancel and retry) goes through
`save_h3r` (or `record_state` inside a pipeline it already has), so the indexes move
with the meta in one MULTI/EXEC.

Readers keep the index true where a writer could not (rq moving a job on its own, a
sweep enqueued before the index existed): h3render.queue.sweepstatus re-reads the
jobs the index may be wrong about and writes what it read with `correct_states`, a
compare-and-set that never overwrites a state some writer set meanwhile. Besides
JobPhase values the index may hold EXPIRED: the job's record is gone (its TTL ran out).
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any

from h3render.keys import SWEEP_CHANGED_KEY, SWEEP_STATES_KEY

EXPIRED = "expired"

# ARGV: now, then (job id, expected state or "" for absent, new state) triples.
_CAS = """
local n = 0
for i = 2, #ARGV, 3 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if (cur == false and ARGV[i + 1] == '') or cur == ARGV[i + 1] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[i])
    n = n + 1
  end
end
return n
"""
CAS_BATCH = 2000  # triples per script call: each call blocks Redis only briefly


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


def correct_states(r, sweep_id: str, corrections: dict[str, tuple[str | None, str]],
                   now: float | None = None) -> int:
    """Set job -> new state in the sweep's index where it still holds `expected` (None: the
    job has no entry yet), and mark each set one changed now. Returns how many were set."""
    if not corrections:
        return 0
    now = time.time() if now is None else now
    keys = [SWEEP_STATES_KEY.format(id=sweep_id), SWEEP_CHANGED_KEY.format(id=sweep_id)]
    script = r.register_script(_CAS)
    items = list(corrections.items())
    done = 0
    for k in range(0, len(items), CAS_BATCH):
        args: list[Any] = [now]
        for job_id, (expected, new) in items[k:k + CAS_BATCH]:
            args += [job_id, _value(expected) or "", _value(new)]
        done += int(script(keys=keys, args=args))
    return done
