"""A sweep's counts, pages of rows and what changed, from its index instead of every job.

    st = sweep_state(r, sweep_id)        counts per state, remaining time, each job's state
    rows = page_rows(r, st, ids)         rows of just these jobs (one pipeline)
    ids = pick(st, limit=50)             the jobs worth a look first: live, failed, ...
    ids = changed_since(r, sweep_id, t)  jobs whose state changed after t

The index (h3render.queue.jobstate: SWEEP_STATES_KEY, SWEEP_CHANGED_KEY) gives every
job's state in one HGETALL. It can be wrong where a writer bypassed it (rq moving a job
on its own, an older writer), so each read checks it against rq in one script call:
the registries (finished, failed, canceled, scheduled, deferred) each job is in. Jobs
whose index state rq's registries contradict, and the few live ones (running or
abandoned: their progress and liveness change without a state change), are re-read
and the index is corrected (a compare-and-set). A sweep enqueued before the index
existed has its index built once from one pipelined read.

What never changes per job (its estimate, its grid coordinates, the queue) is read
once and kept as SWEEP_FACTS_KEY, so remaining time and the grid's layout need no read
of the jobs either. Reads may write the two derived keys; no job's state is changed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis
from rq.job import Job
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

from h3render.keys import SWEEP_CHANGED_KEY, SWEEP_FACTS_KEY, SWEEP_JOBS_KEY, SWEEP_KEY, SWEEP_STATES_KEY
from h3render.queue import jobstate
from h3render.queue.errors import NotFoundError
from h3render.queue.job import JobPhase
from h3render.queue.status import JobRead, decode_payload, parse_meta, parse_record, read_jobs

PASS_AXIS = "pass"  # preview / full, an axis of sweeps with a preview pass (the dashboard's grid)
FACTS_VERSION = 1
CLOCK_SLACK_S = 10.0  # next_since stays this far behind now: writers on other machines' clocks
TERMINAL = frozenset(p.value for p in JobPhase if p.terminal)
LIVE = frozenset(p.value for p in JobPhase if not p.terminal and p != JobPhase.queued)
# Order of `pick`: what a person looks at first.
PICK_ORDER = {JobPhase.abandoned.value: 0, **{s: 1 for s in LIVE if s != JobPhase.abandoned.value},
              JobPhase.failed.value: 2, JobPhase.canceled.value: 3, JobPhase.queued.value: 4,
              JobPhase.finished.value: 5}

# One character per job id in ARGV: the rq registry it is in (KEYS: finished, failed,
# canceled, scheduled, deferred), '.' for none, 'M' for more than one.
_REGISTRIES = """
local out = {}
local codes = 'FXCWW'
for i = 1, #ARGV do
  local c, n = '.', 0
  for k = 1, 5 do
    if redis.call('ZSCORE', KEYS[k], ARGV[i]) then
      n = n + 1
      c = string.sub(codes, k, k)
    end
  end
  if n > 1 then c = 'M' end
  out[i] = c
end
return table.concat(out)
"""
REGISTRY_BATCH = 5000
_AGREES = {  # registry code -> index states it agrees with
    ".": {JobPhase.queued.value, jobstate.EXPIRED},
    "W": {JobPhase.queued.value},
    "F": {JobPhase.finished.value, JobPhase.canceled.value},
    "X": {JobPhase.failed.value, JobPhase.canceled.value},
    "C": {JobPhase.canceled.value},
}


@dataclass
class Facts:
    """What never changes per job of a sweep, read once (SWEEP_FACTS_KEY)."""

    queue: str | None
    estimates: dict[str, float]  # job id -> seconds estimated at enqueue
    params: dict[str, dict[str, Any]]  # job id -> its value of each axis of the record (and "pass")
    prompts: list[str]  # distinct prompts, in run order (at most MAX_PROMPTS)

    def to_json(self, n_jobs: int) -> str:
        return json.dumps({"version": FACTS_VERSION, "jobs": n_jobs, "queue": self.queue,
                           "estimates": self.estimates, "params": self.params, "prompts": self.prompts})


MAX_PROMPTS = 20


@dataclass
class SweepState:
    sweep_id: str
    record: dict[str, Any]
    ids: list[str]  # every job id in run order (expired ones too)
    states: dict[str, str]  # job id -> state shown (abandoned included), for every existing job
    live: dict[str, JobRead]  # jobs read this time: the live ones and any the index was wrong about
    facts: Facts
    summary: dict[str, Any]  # jobs, done, states (counts), remaining_s
    last_change: float | None  # newest time in SWEEP_CHANGED_KEY
    now: float
    corrected: int = 0  # index entries this read corrected
    reread: int = 0  # jobs this read had to read

    @property
    def axes(self) -> dict[str, list[Any]]:
        return self.record.get("axes") or {}

    def next_since(self, since: float | None = None) -> float:
        """The `since` of the next poll: the newest change seen, but never closer to now than
        CLOCK_SLACK_S (a writer whose clock lags may still record a change behind us)."""
        base = min(self.last_change if self.last_change is not None else self.now, self.now - CLOCK_SLACK_S)
        return max(base, since) if since is not None else base


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def sweep_state(r: redis.Redis, sweep_id: str, now: float | None = None) -> SweepState:
    """Counts and each job's state of a sweep; NotFoundError for an unknown id."""
    now = time.time() if now is None else now
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(SWEEP_KEY.format(id=sweep_id))
    pipe.lrange(SWEEP_JOBS_KEY.format(id=sweep_id), 0, -1)
    pipe.hgetall(SWEEP_STATES_KEY.format(id=sweep_id))
    pipe.get(SWEEP_FACTS_KEY.format(id=sweep_id))
    pipe.zrevrange(SWEEP_CHANGED_KEY.format(id=sweep_id), 0, 0, withscores=True)
    raw_rec, raw_ids, raw_states, raw_facts, newest = pipe.execute()
    if not raw_rec:
        raise NotFoundError(f"sweep {sweep_id!r} not found")
    record = parse_record(raw_rec)
    ids = [_text(i) for i in raw_ids]
    index = {_text(k): _text(v) for k, v in raw_states.items()}
    facts = _facts(r, sweep_id, ids, record, raw_facts)
    reread: dict[str, JobRead] = {}
    if ids and not index:  # enqueued before the index existed: build it from one read
        reread = {j.row.id: j for j in read_jobs(r, ids, now=now)}
        todo = ids
    else:
        todo = _suspects(r, ids, index, facts.queue)
        if todo:
            reread = {j.row.id: j for j in read_jobs(r, todo, now=now)}
    corrections = {}
    for job_id in todo:
        j = reread.get(job_id)
        new = j.phase if j is not None else jobstate.EXPIRED
        if index.get(job_id) != new:
            corrections[job_id] = (index.get(job_id), new)
            index[job_id] = new
    corrected = jobstate.correct_states(r, sweep_id, corrections, now) if corrections else 0
    if corrected:
        newest = [(b"", now)]
    states = {}
    for job_id in ids:
        s = reread[job_id].row.state if job_id in reread else index.get(job_id, JobPhase.queued.value)
        if s != jobstate.EXPIRED:
            states[job_id] = s
    live = {k: v for k, v in reread.items() if v.row.state in LIVE}
    summary = _summary(states, live, facts)
    last = float(newest[0][1]) if newest else None
    return SweepState(sweep_id, record, ids, states, live, facts, summary, last, now, corrected, len(todo))


def _suspects(r: redis.Redis, ids: list[str], index: dict[str, str], queue: str | None) -> list[str]:
    """Ids the index may be wrong about: live ones, ones without an entry, and ones whose
    index state the registry rq keeps them in contradicts."""
    if queue is None:
        return [j for j in ids if index.get(j) != jobstate.EXPIRED]
    keys = [FinishedJobRegistry(queue, connection=r).key, FailedJobRegistry(queue, connection=r).key,
            CanceledJobRegistry(queue, connection=r).key, ScheduledJobRegistry(queue, connection=r).key,
            DeferredJobRegistry(queue, connection=r).key]
    script = r.register_script(_REGISTRIES)
    codes = "".join(_text(script(keys=keys, args=ids[k:k + REGISTRY_BATCH]))
                    for k in range(0, len(ids), REGISTRY_BATCH))
    started = {_text(m).rpartition(":")[0] for m in r.zrange(StartedJobRegistry(queue, connection=r).key, 0, -1)}
    out = []
    for job_id, code in zip(ids, codes):
        s = index.get(job_id)
        if s is None or s in LIVE or job_id in started or s not in _AGREES.get(code, ()):
            out.append(job_id)
    return out


def _summary(states: dict[str, str], live: dict[str, JobRead], facts: Facts) -> dict[str, Any]:
    counts = Counter(states.values())
    remaining = 0.0
    for job_id, s in states.items():
        if s in TERMINAL:
            continue
        eta = live[job_id].row.eta_s if job_id in live else None
        remaining += eta if eta is not None else facts.estimates.get(job_id, 0.0)
    done = sum(counts[s] for s in TERMINAL)
    return {"jobs": len(states), "done": done, "states": dict(counts), "remaining_s": round(remaining, 1)}


def _facts(r: redis.Redis, sweep_id: str, ids: list[str], record: dict[str, Any], raw: bytes | None) -> Facts:
    if raw:
        try:
            doc = json.loads(raw)
            if doc.get("version") == FACTS_VERSION and doc.get("jobs") == len(ids):
                return Facts(doc.get("queue"), doc["estimates"], doc["params"], doc.get("prompts") or [])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # rebuilt below
    facts = build_facts(r, ids, record)
    r.set(SWEEP_FACTS_KEY.format(id=sweep_id), facts.to_json(len(ids)))
    return facts


def build_facts(r: redis.Redis, ids: list[str], record: dict[str, Any]) -> Facts:
    """One pipelined read of every job's payload and meta: estimates, axis values, queue."""
    axes = list(record.get("axes") or {})
    pipe = r.pipeline(transaction=False)
    for j in ids:
        pipe.hmget(Job.key_for(j), "data", "meta", "origin")
    queue = None
    estimates, params, prompts = {}, {}, {}
    for job_id, (data, meta, origin) in zip(ids, pipe.execute()):
        if data is None and meta is None:
            continue  # expired
        queue = queue or (_text(origin) if origin else None)
        m = parse_meta(meta)
        p = decode_payload(data) or {}
        est = (m.get("estimate") or {}).get("seconds") if isinstance(m.get("estimate"), dict) else None
        estimates[job_id] = float(est) if isinstance(est, (int, float)) and not isinstance(est, bool) else 0.0
        params[job_id] = {a: _hashable(p.get(a)) for a in axes} | {PASS_AXIS: "preview" if m.get("preview") else "full"}
        if isinstance(p.get("prompt"), str) and len(prompts) < MAX_PROMPTS:
            prompts.setdefault(p["prompt"], None)
    return Facts(queue, estimates, params, list(prompts))


def _hashable(v: Any) -> Any:
    """An axis value as the grid can key on it (a list or dict by its JSON text)."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def page_rows(r: redis.Redis, st: SweepState, ids: list[str], payload: bool = False) -> list[JobRead]:
    """The rows of these jobs of the sweep, in order (expired ones skipped)."""
    return read_jobs(r, ids, payload=payload, now=st.now)


def pick(st: SweepState, limit: int | None = 50, page: int | None = None,
         states: list[str] | None = None) -> list[str]:
    """Ids to show: with `page`, that page of `limit` jobs in run order; else the jobs worth a
    look first (abandoned, running, failed, canceled, queued, finished; run order within
    each), at most `limit` (None: all). `states` keeps only jobs in those states."""
    ids = [j for j in st.ids if j in st.states and (not states or st.states[j] in states)]
    if page is not None:
        n = limit or len(ids) or 1
        return ids[page * n:(page + 1) * n]
    order = {j: i for i, j in enumerate(ids)}
    ids.sort(key=lambda j: (PICK_ORDER.get(st.states[j], 6), order[j]))
    return ids if limit is None else ids[:limit]


def changed_since(r: redis.Redis, sweep_id: str, since: float) -> list[str]:
    """Ids of jobs whose state changed after `since` (exclusive), oldest change first."""
    return [_text(j) for j in r.zrangebyscore(SWEEP_CHANGED_KEY.format(id=sweep_id), f"({since!r}", "+inf")]


@dataclass
class SweepPoll:
    """What a polling page needs: counts, the jobs changed since its last poll, the live ones."""

    state: SweepState
    changed: list[JobRead] = field(default_factory=list)
    live: list[JobRead] = field(default_factory=list)
    next_since: float = 0.0


def poll(r: redis.Redis, sweep_id: str, since: float | None) -> SweepPoll:
    """since=None: every job (a full snapshot); else only jobs changed after since."""
    st = sweep_state(r, sweep_id)
    ids = st.ids if since is None else changed_since(r, sweep_id, since)
    changed = page_rows(r, st, ids)
    seen = {j.row.id for j in changed}
    live = [st.live[j] for j in st.ids if j in st.live and j not in seen]
    return SweepPoll(st, changed, live, st.next_since(since))
