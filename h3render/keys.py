"""Every Redis key h3render writes, and the one function a job may name: the only copy of each.

Imports nothing, so the queue, the worker and the dashboards can all use it without
an import cycle. Templates take str.format fields: KEY.format(id=..., host=...).

    rq's own keys (rq:job:<id>, rq:queue:<name>, registries) are rq's; these are ours.
"""

RENDER_FUNC = "h3render.worker.render.render_job"

# -- jobs
CANCEL_KEY = "h3render:cancel:{id}"  # set by cancel, polled by the render task (kept a day)
# capped list (JSON: time, queue, id, reason, worker) of queue entries no job can be made of:
# an id rq cannot use, a record that is missing or not a hash (h3render.worker.intake)
REJECTED_KEY = "h3render:rejected"

# -- sweeps
SWEEP_KEY = "h3render:sweep:{id}"  # hash: axes, fixed, created_at, jobs, estimate_s
SWEEP_JOBS_KEY = "h3render:sweep:{id}:jobs"  # list of job ids in run order
SWEEP_STATES_KEY = "h3render:sweep:{id}:states"  # hash: job id -> JobPhase value
SWEEP_CHANGED_KEY = "h3render:sweep:{id}:changed"  # zset: job id -> time of its last state change
SWEEP_FACTS_KEY = "h3render:sweep:{id}:facts"  # JSON: what never changes per job (estimate, grid axes)
SWEEPS_KEY = "h3render:sweeps"  # set of sweep ids

# -- workers and machines
HEALTH_KEY = "h3render:health:{host}"  # the gate's latest decision (JSON)
HEALTH_HISTORY_KEY = "h3render:health:{host}:history"  # capped list of decisions
LOCK_KEY = "h3render:worker-lock:{host}"  # {name, pid, since}: one worker per host
WRITE_PROBE_KEY = "h3render:write-probe:{host}"  # the worker's "does Redis accept writes?" probe
MACHINE_KEY = "h3render:machine:{host}"  # JSON: host, worker, total_bytes, usable_bytes, time
MACHINES_KEY = "h3render:machines"  # set of hosts that ever published a MACHINE_KEY
ENGINE_KEY = "h3render:engine:{model}"  # Engine.info() of a model, published by workers
