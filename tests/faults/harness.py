"""Helpers for the fault tests: real workers as subprocesses, waits, and what a fault may leave.

Every fault test starts real processes (`h3render worker`, its render processes,
redis-server) against the suite's private Redis (tests/redis_fixture.py) and a
temporary H3RENDER_HOME, does something hostile to them, and records the outcome
with the `fault_table` fixture (tests/faults/conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rq.job import Job
from rq.serializers import JSONSerializer

from h3render.worker.health import Readings

REPO = Path(__file__).resolve().parents[2]
CLI = "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"
# The built-in tiny model: 64x64, 17 frames; a step takes a few ms.
SMALL = {"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64, "frames": 17,
         "steps": 3}
# Names a render leaves behind when it is killed mid-write; none may be in a final folder.
TEMP_MARKERS = (".tmp", ".partial", ".staging")


def write_readings(path: Path, r: Readings) -> None:
    """The sensor readings the worker's gate sees (H3RENDER_TEST_READINGS), atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(r.model_dump_json())
    os.replace(tmp, path)


def worker_environment(settings, readings: Path) -> dict:
    """Environment of worker processes: the settings' Redis and home, 1 s gate polls, 1 s
    retry intervals, the test triggers on and a readings file (normal). "_readings" names
    that file for the test and is dropped before a process starts (clean_env)."""
    write_readings(readings, Readings(platform="test"))
    e = dict(os.environ)
    e.update(
        PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""),
        H3RENDER_HOME=str(settings.home),
        H3RENDER_REDIS_URL=settings.redis_url,
        H3RENDER_GATE_POLL_S="1",
        H3RENDER_RETRY_INTERVALS_S="[1, 1, 1]",
        H3RENDER_ENABLE_TEST_TRIGGERS="1",
        H3RENDER_TEST_READINGS=str(readings),
    )
    e["_readings"] = str(readings)
    return e


def clean_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith("_")}


def start_worker(env: dict, *args: str) -> subprocess.Popen:
    """`h3render worker ARGS` in its own session (the worker, its scheduler and its
    render processes share one process group the test can kill whole)."""
    return subprocess.Popen([sys.executable, "-c", CLI, "worker", *args], env=clean_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def run_cli(env: dict, *args: str, timeout: float = 120, input: str | None = None):
    """`h3render ARGS` to completion: CompletedProcess with text stdout/stderr."""
    return subprocess.run([sys.executable, "-c", CLI, *args], env=clean_env(env),
                          capture_output=True, text=True, timeout=timeout, input=input)


def stop(p: subprocess.Popen, timeout: float = 20) -> str:
    """SIGTERM the worker (warm shutdown), SIGKILL its group if it hangs; its output."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(p.pid)
            p.wait()
    return p.stdout.read() if p.stdout else ""


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(pred, timeout: float, what: str, every: float = 0.05):
    """pred()'s first truthy value, polled every `every` s; AssertionError after `timeout`."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def fetch(r, job_id: str) -> Job:
    return Job.fetch(job_id, connection=r, serializer=JSONSerializer)


def h3meta(r, job_id: str) -> dict:
    return fetch(r, job_id).meta.get("h3r") or {}


def temp_files(root: Path) -> list[Path]:
    """Every file or folder under `root` whose name marks it as unfinished."""
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*") if any(m in p.name for m in TEMP_MARKERS))


def pids_with_cmdline(fragment: str) -> list[int]:
    """Live processes whose command line contains `fragment` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fragment in cmd:
            out.append(int(d.name))
    return out
