"""A sweep's counts, pages of rows and what changed, from its index instead of every job.

    st = sweep_state(r, sweep_id)        counts per state, remaining time, each job's state
    rows = page_rows(r, st, ids)         rows of just these jobs (one pipeline)
    ids = pick(st, limit=50)             the jobs worth a look first: abandoned, running, failed, ...
    ids = changed_since(r, sweep_id, t)  jobs whose state changed after t

The index (h3render.queue.jobstate: SWEEP_STATES_KEY, SWEEP_CHANGED_KEY) gives every
job's state without reading the job. It can be wrong where a writer bypassed it (rq
moving a job on its own, an older writer), so each read checks it against rq, in one
script call that returns the job list, each job's index state and the rq registry it
is in (finished, failed, canceled, scheduled, deferred, started). The jobs whose index
state their registry contradicts, and the few live ones (running or abandoned: their
progress and their worker's liveness change without a state change), are re-read and
the index is corrected (a compare-and-set). A sweep enqueued before the index existed
has it built once from one pipelined read.

What never changes per job (estimate, grid coordinates) comes from h3render.queue.
sweepfacts, so remaining time and the grid need no read of the jobs either. Reads may
write those two derived keys; no job's state is ever changed here.
"""

from __future__ import annotations

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
from h3render.queue import jobstate, sweepfacts
from h3render.queue.errors import NotFoundError
from h3render.queue.job import JobPhase
from h3render.queue.status import JobRead, parse_record, read_jobs
from h3render.queue.sweepfacts import Facts

CLOCK_SLACK_S = 10.0  # next_since stays this far behind now: writers on other machines' clocks
TERMINAL = frozenset(p.value for p in JobPhase if p.terminal)
LIVE = frozenset(p.value for p in JobPhase if not p.terminal and p != JobPhase.queued)
# Order of `pick`: what a person looks at first.
PICK_ORDER = {JobPhase.abandoned.value: 0, **{s: 1 for s in LIVE if s != JobPhase.abandoned.value},
              JobPhase.failed.value: 2, JobPhase.canceled.value: 3, JobPhase.queued.value: 4,
              JobPhase.finished.value: 5}
# The index states the script can name, one letter each ('a' + position; '-' none, '?' other).
VOCABULARY = [p.value for p in JobPhase] + [jobstate.EXPIRED]

# KEYS: the sweep's job list, its states hash. ARGV: rq's key prefixes (job, then the
# finished, failed, canceled, scheduled, deferred and started registries), then VOCABULARY.
# Returns {queue, number of index entries, ids joined by newlines (or false when an id holds
# one), one letter per job for its index state, one for its registry: F X C W W S, '.' none,
# 'M' several, '?' queue unknown}.
_READ = r"""
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
local flat = redis.call('HGETALL', KEYS[2])
local letter = {}
for k = 8, #ARGV do letter[ARGV[k]] = string.char(96 + k - 7) end
local st = {}
for i = 1, #flat, 2 do st[flat[i]] = letter[flat[i + 1]] or '?' end
local q = false
for i = 1, math.min(#ids, 100) do
  q = redis.call('HGET', ARGV[1] .. ids[i], 'origin')
  if q then break end
end
local started = {}
if q then
  for _, m in ipairs(redis.call('ZRANGE', ARGV[7] .. q, 0, -1)) do
    started[string.match(m, '^(.*):[^:]*$') or m] = true
  end
end
-- a registry smaller than the sweep is read whole, a larger one asked per job: min(size, jobs) each
local function member(key)
  local n = redis.call('ZCARD', key)
  if n == 0 then return function(id) return false end end
  if n <= #ids then
    local set = {}
    for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do set[m] = true end
    return function(id) return set[id] end
  end
  return function(id) return redis.call('ZSCORE', key, id) end
end
local tests = {}
if q then for k = 1, 5 do tests[k] = member(ARGV[k + 1] .. q) end end
local codes = 'FXCWW'
local sts, regs, clean = {}, {}, true
for i, id in ipairs(ids) do
  if string.find(id, '\n', 1, true) then clean = false end
  sts[i] = st[id] or '-'
  local c, n = '?', 0
  if q then
    c = '.'
    for k = 1, 5 do
      if tests[k](id) then
        n = n + 1
        c = string.sub(codes, k, k)
      end
    end
    if started[id] then
      n = n + 1
      c = 'S'
    end
    if n > 1 then c = 'M' end
  end
  regs[i] = c
end
local joined = false
if clean then joined = table.concat(ids, '\n') end
return {q or '', #flat / 2, joined, table.concat(sts), table.concat(regs)}
"""
_AGREES = {  # registry letter -> index states it agrees with
    ".": {JobPhase.queued.value, jobstate.EXPIRED},
    "W": {JobPhase.queued.value},
    "F": {JobPhase.finished.value, JobPhase.canceled.value},
    "X": {JobPhase.failed.value, JobPhase.canceled.value},
    "C": {JobPhase.canceled.value},
}


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


def _prefixes(r: redis.Redis) -> list[str]:
    """rq's key prefixes the script appends a job id or a queue name to (from rq's own classes)."""
    regs = (FinishedJobRegistry, FailedJobRegistry, CanceledJobRegistry, ScheduledJobRegistry,
            DeferredJobRegistry, StartedJobRegistry)
    return [Job.redis_job_namespace_prefix] + [cls("", connection=r).key for cls in regs]


def _read_index(r: redis.Redis, sweep_id: str) -> tuple[list[str], dict[str, str], str, int]:
    """(job ids, job id -> index state, registry letters, number of index entries), in one
    script call."""
    script = r.register_script(_READ)
    keys = [SWEEP_JOBS_KEY.format(id=sweep_id), SWEEP_STATES_KEY.format(id=sweep_id)]
    _q, n_index, joined, sts, regs = script(keys=keys, args=_prefixes(r) + VOCABULARY)
    sts, regs = _text(sts), _text(regs)
    if joined is None:  # an id with a newline in it: the list as Redis has it, every job a suspect
        ids = [_text(i) for i in r.lrange(SWEEP_JOBS_KEY.format(id=sweep_id), 0, -1)]
        regs = "?" * len(ids)
    else:
        ids = _text(joined).split("\n") if joined else []
    index: dict[str, str] = {}
    odd = []  # entries outside the vocabulary (a hostile or future value): read as they are
    for job_id, letter in zip(ids, sts):
        k = ord(letter) - 97
        if 0 <= k < len(VOCABULARY):
            index[job_id] = VOCABULARY[k]
        elif letter == "?":
            odd.append(job_id)
    if odd:
        for job_id, v in zip(odd, r.hmget(keys[1], odd)):
            if v is not None:
                index[job_id] = _text(v)
    return ids, index, regs, int(n_index)


def sweep_state(r: redis.Redis, sweep_id: str, now: float | None = None) -> SweepState:
    """Counts and each job's state of a sweep; NotFoundError for an unknown id."""
    now = time.time() if now is None else now
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(SWEEP_KEY.format(id=sweep_id))
    pipe.get(SWEEP_FACTS_KEY.format(id=sweep_id))
    pipe.zrevrange(SWEEP_CHANGED_KEY.format(id=sweep_id), 0, 0, withscores=True)
    raw_rec, raw_facts, newest = pipe.execute()
    if not raw_rec:
        raise NotFoundError(f"sweep {sweep_id!r} not found")
    record = parse_record(raw_rec)
    ids, index, regs, n_index = _read_index(r, sweep_id)
    axes = list(record.get("axes") or {})
    reread: dict[str, JobRead] = {}
    if ids and not n_index:  # enqueued before the index existed: build it (and the facts) from one read
        reread = {j.row.id: j for j in read_jobs(r, ids, payload=True, now=now)}
        facts = sweepfacts.load(r, sweep_id, ids, axes, raw_facts, list(reread.values()))
        todo = ids
    else:
        facts = sweepfacts.load(r, sweep_id, ids, axes, raw_facts)
        todo = [j for j, c in zip(ids, regs) if _suspect(index.get(j), c)]
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
        s = reread[job_id].row.state if job_id in reread else index.get(job_id) or JobPhase.queued.value
        if s != jobstate.EXPIRED:
            states[job_id] = s
    live = {k: v for k, v in reread.items() if v.row.state in LIVE}
    summary = _summary(states, live, facts)
    last = float(newest[0][1]) if newest else None
    return SweepState(sweep_id, record, ids, states, live, facts, summary, last, now, corrected, len(todo))


def _suspect(state: str | None, registry: str) -> bool:
    """Whether the index may be wrong about a job: no (known) entry, a live state (its progress
    and liveness move without a state change), or a state its rq registry contradicts."""
    return state is None or state in LIVE or state not in _AGREES.get(registry, ())


def _summary(states: dict[str, str], live: dict[str, JobRead], facts: Facts) -> dict[str, Any]:
    counts = Counter(states.values())
    estimates = facts.estimates
    remaining = 0.0
    for job_id, s in states.items():
        if s in TERMINAL:
            continue
        eta = live[job_id].row.eta_s if job_id in live else None
        remaining += eta if eta is not None else estimates.get(job_id, 0.0)
    done = sum(counts[s] for s in TERMINAL)
    return {"jobs": len(states), "done": done, "states": dict(counts), "remaining_s": round(remaining, 1)}


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
