"""Impossible jobs are refused at enqueue: a job no live worker's machine can ever admit.

A real worker publishes its machine's memory (h3render.worker.publish); `h3render enqueue`
compares each job's memory estimate with it. About 30 s on 2 cores (one worker start and
one tiny render).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from faults.harness import SMALL, h3meta, run_cli, start_worker, stop, wait_for, write_readings
from h3render.engine.models import ensure_builtin
from h3render.queue import capacity
from h3render.queue.engine_info import publish_engine_info
from h3render.queue.enqueue import enqueue
from h3render.worker.health import MemoryReading, Readings
from h3render.worker.publish import live_machines, publish_machine
from test_queue_job import INFO

pytestmark = pytest.mark.slow
HUGE = ["--prompt", "a red ball", "--model", "tiny-wan", "--width", "16384", "--height", "16384"]


def test_a_job_no_machine_can_hold_is_refused_at_enqueue(redis_conn, h3_settings, worker_env, fault_table):
    ensure_builtin("tiny-wan")  # installed here: the full estimate, from its GGUF headers
    write_readings(Path(worker_env["_readings"]), Readings(platform="test", memory=MemoryReading(
        total_bytes=16 * 1024**3, available_bytes=12 * 1024**3)))  # what the worker's sensors report
    p = start_worker(worker_env)
    try:
        machines = wait_for(lambda: live_machines(redis_conn), 60, "the worker's machine record")
    finally:
        stop(p)  # its record outlives it by its TTL (at least 60 s); no job runs meanwhile
    out = run_cli(worker_env, "enqueue", *HUGE)
    nearest = re.search(r"nearest valid: '(\d+)x(\d+)'", out.stderr)
    refused = (out.returncode == 2 and "does not fit any machine" in out.stderr
               and "width x height='16384x16384'" in out.stderr and "GiB of memory" in out.stderr
               and "can admit" in out.stderr and nearest is not None and not out.stdout.strip())
    assert refused, (out.returncode, out.stdout, out.stderr)
    w, h = int(nearest[1]), int(nearest[2])
    suggested = run_cli(worker_env, "enqueue", "--prompt", "a red ball", "--model", "tiny-wan",
                        "--width", str(w), "--height", str(h))
    assert suggested.returncode == 0, suggested.stderr  # the suggested size passes the same check
    ok = run_cli(worker_env, "enqueue", *[a for kv in SMALL.items() for a in (f"--{kv[0]}", str(kv[1]))])
    assert ok.returncode == 0, ok.stderr
    assert "would not fit" not in ok.stderr + suggested.stderr
    assert live_machines(redis_conn), "the machine record expired during the test: the check ran without it"
    assert "machine " in out.stderr and "12.8 GiB (16.0 GiB total" in out.stderr  # the worker's, not this one's
    row = fault_table("capacity", "never-fitting job at enqueue (tiny model, 16384x16384, full estimate)",
                      tried=1, held=int(refused), lost=0,
                      bound="exit 2 with the figures and the nearest size that fits; a fitting job accepted",
                      note=f"machine {machines[0]['total_bytes'] / 1024**3:.1f} GiB total; suggested {w}x{h}")
    assert row.ok


def test_a_model_not_installed_here_is_checked_against_a_lower_bound(redis_conn, h3_settings, fault_table):
    publish_engine_info(redis_conn, "tiny-wan", {**INFO, "weight_bytes": {"f16": 600_192, "q8_0": 400_000}})
    publish_machine(redis_conn, "render-box", "w1", h3_settings,
                    Readings(platform="test", memory=MemoryReading(total_bytes=16 * 1024**3)))
    with pytest.raises(capacity.DoesNotFitError) as e:
        enqueue(redis_conn, {"prompt": "x", "model": "tiny-wan", "width": 16384, "height": 16384, "frames": 17},
                h3_settings)
    (p,) = e.value.problems
    fits = enqueue(redis_conn, {"prompt": "x", "model": "tiny-wan"}, h3_settings)
    held = ("needs at least" in p.rule and "machine render-box can admit 12.8 GiB" in p.rule
            and isinstance(p.nearest, str) and any("lower bound only" in w for w in fits.warnings))
    row = fault_table("capacity", "never-fitting job, model not installed on the enqueuing machine", tried=1,
                      held=int(held), lost=0, bound="refused on a lower bound (weights + video + overhead)",
                      note=f"{p.value}: {p.rule[:60]}...; nearest {p.nearest}")
    assert held, (p, fits.warnings)
    assert row.ok


def test_no_worker_published_this_machine_stands_in_as_a_warning(redis_conn, h3_settings, worker_env):
    ensure_builtin("tiny-wan")
    publish_engine_info(redis_conn, "tiny-wan", INFO)
    assert live_machines(redis_conn) == []
    out = run_cli(worker_env, "enqueue", *HUGE)
    assert out.returncode == 0, out.stderr  # queued: the worker that will run it may be bigger
    assert "warning: 16384x16384 would not fit" in out.stderr and "this machine (no worker has published" in out.stderr
    assert re.search(r"try a smaller size such as \d+x\d+", out.stderr), out.stderr
    assert h3meta(redis_conn, out.stdout.split()[0])["warnings"]  # the warning travels with the job
