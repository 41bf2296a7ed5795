"""What never changes per job of a sweep, read once and kept as SWEEP_FACTS_KEY.

A job's estimate, its place in the sweep's grid (its value of each axis of the record,
and whether it is a preview) and its queue are fixed at enqueue: retry puts the same job
back. Reading them from every job's payload costs a pipelined read of the whole sweep,
so the sweep views do it once and keep the result beside the sweep:

    {"version": 2, "jobs": n, "queue": "h3render", "axes": ["seed", "steps", "pass"],
     "estimate": [12.5, ...], "values": [[1, 20, "full"], ...], "prompts": ["...", ...]}

Columns are aligned with the sweep's job list (SWEEP_JOBS_KEY, whose length must still be
n); a job that had expired when they were built has null in both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import redis
from rq.job import Job

from h3render.keys import SWEEP_FACTS_KEY
from h3render.queue.status import JobRead, decode_payload, make_row, parse_meta

VERSION = 2
PASS_AXIS = "pass"  # preview / full: an axis of sweeps with a preview pass (the dashboard's grid)
MAX_PROMPTS = 20


@dataclass
class Facts:
    queue: str | None
    ids: list[str]  # the sweep's job list the columns are aligned with
    axes: list[str]  # the record's axes, then PASS_AXIS
    estimate: list[float | None]  # seconds estimated at enqueue; None: expired when built
    values: list[list[Any] | None]  # per job, its value of each of `axes`
    prompts: list[str]  # distinct prompts in run order, at most MAX_PROMPTS

    @cached_property
    def estimates(self) -> dict[str, float]:
        return {j: e for j, e in zip(self.ids, self.estimate) if e is not None}

    @cached_property
    def params(self) -> dict[str, dict[str, Any]]:
        """job id -> {axis: value} for every job known when built."""
        return {j: dict(zip(self.axes, v)) for j, v in zip(self.ids, self.values) if v is not None}

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "jobs": len(self.ids), "queue": self.queue, "axes": self.axes,
                           "estimate": self.estimate, "values": self.values, "prompts": self.prompts})


def parse(raw: bytes | None, ids: list[str]) -> Facts | None:
    """Stored facts for this job list, or None when there are none or they are for another."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("version") != VERSION or doc.get("jobs") != len(ids):
            return None
        est, values = doc["estimate"], doc["values"]
        if len(est) != len(ids) or len(values) != len(ids):
            return None
        return Facts(doc.get("queue"), ids, list(doc["axes"]), est, values, list(doc.get("prompts") or []))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def payload_reads(r: redis.Redis, ids: list[str]) -> list[JobRead]:
    """Just what the facts need of every job (payload, meta, queue), in one pipeline."""
    pipe = r.pipeline(transaction=False)
    for j in ids:
        pipe.hmget(Job.key_for(j), "data", "meta", "origin")
    out = []
    for job_id, (data, meta, origin) in zip(ids, pipe.execute()):
        if data is None and meta is None:
            continue  # expired
        m = parse_meta(meta)
        row = make_row(job_id, None, m)
        origin = origin.decode(errors="replace") if origin else None
        out.append(JobRead(row, m, row.state, None, origin, decode_payload(data)))
    return out


def build(ids: list[str], record_axes: list[str], reads: list[JobRead]) -> Facts:
    """Facts from reads that hold payloads (read_jobs(payload=True) or payload_reads)."""
    axes = [a for a in record_axes if a != PASS_AXIS] + [PASS_AXIS]
    by_id = {j.row.id: j for j in reads}
    estimate: list[float | None] = []
    values: list[list[Any] | None] = []
    prompts: dict[str, None] = {}
    for job_id in ids:
        j = by_id.get(job_id)
        if j is None:
            estimate.append(None)
            values.append(None)
            continue
        p = j.payload or {}
        estimate.append(j.row.estimate_s or 0.0)
        values.append([_hashable(p.get(a)) for a in axes[:-1]] + ["preview" if j.row.preview else "full"])
        if isinstance(p.get("prompt"), str) and len(prompts) < MAX_PROMPTS:
            prompts.setdefault(p["prompt"], None)
    queue = next((j.origin for j in reads if j.origin), None)
    return Facts(queue, ids, axes, estimate, values, list(prompts))


def load(r: redis.Redis, sweep_id: str, ids: list[str], record_axes: list[str], raw: bytes | None,
         reads: list[JobRead] | None = None) -> Facts:
    """The stored facts when they are for this job list; else built (from `reads` when given)
    and stored."""
    facts = parse(raw, ids)
    if facts is not None:
        return facts
    facts = build(ids, record_axes, reads if reads is not None else payload_reads(r, ids))
    r.set(SWEEP_FACTS_KEY.format(id=sweep_id), facts.to_json())
    return facts


def _hashable(v: Any) -> Any:
    """An axis value as the grid can key on it (a list or dict by its JSON text)."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v
