"""h3render.queue: the API every front end uses to put renders on Redis and watch them.

    settings         h3render.settings.Settings (H3RENDER_* environment)
    connection       get_redis(settings): H3RENDER_REDIS_URL or the embedded server
    redis_server     the embedded redis-server (AOF, loopback, reused)
    job              RenderJob, JobPhase, RENDER_FUNC
    validation       field rules with nearest valid values; resolve() against engine limits
    engine_info      the limits workers publish in Redis, else the local engine's
    sweep            grids from flags or TOML, ordering, preview versions (pure)
    estimate         per-step time model, fitted to finished jobs (pure + one reader)
    enqueue          enqueue(), enqueue_sweep(): one pipeline, JSON serializer
    durability       what an acknowledged enqueue means on this Redis, checked around the write
    capacity         a job no live worker's machine can ever admit is refused at enqueue
    status           rows, sweep summaries, worker health
    control          cancel(), retry() for jobs and sweeps
Submodules are imported where used; importing h3render.queue itself is free.
"""
