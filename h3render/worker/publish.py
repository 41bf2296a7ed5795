"""What a worker publishes about its machine: every installed model's engine info at start,
and the machine's memory while it runs, so clients can validate jobs before queuing them.

Clients validate a job against `h3render:engine:<model>` (h3render.queue.engine_info).
Before this, a model's info appeared only after its first render on a worker; now the
worker opens each installed model briefly when it starts (metadata only: the CPU
engine loads components lazily, h3.c's h3_load_dir maps no weights) and publishes
Engine.info().

The models are opened in a child process (`python -m h3render.worker.publish DIR...`),
like renders are: a model file that crashed the engine would otherwise take the
worker down with it. The child prints one JSON line per model, {"dir", "info"} or
{"dir", "error"}. A bad model directory is logged and skipped; if the child dies,
the model it was opening is reported as having crashed it and a new child takes the
rest. Nothing here is fatal to the worker.

`publish_machine` writes h3render:machine:<host> (h3render.keys.MACHINE_KEY) as JSON
{host, worker, total_bytes, usable_bytes, time} and adds the host to
h3render:machines. total_bytes is the machine's memory (a cgroup limit caps it);
usable_bytes is the most a job can be admitted with there: total minus the
admission headroom, so a job whose estimate exceeds it can never run on that
machine. The key lives MACHINE_TTL_POLLS gate polls (at least MACHINE_TTL_MIN_S)
and the worker refreshes it at every gate check and heartbeat, so a machine
whose worker is gone drops out of `live_machines` by itself.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import redis

log = logging.getLogger("h3render.worker")

PROBE_TIMEOUT_S = 120.0  # for all models of one child; opening reads headers only
MACHINE_TTL_POLLS = 3
MACHINE_TTL_MIN_S = 60


def installed_models() -> list[tuple[str, Path]]:
    """(name, dir) of every model installed in the models dir (built-ins not converted yet are not)."""
    from h3render.engine.models import list_models

    return [(m.name, Path(m.path)) for m in list_models() if m.installed]


def _probe(dirs: list[Path], timeout_s: float) -> tuple[dict[str, dict], int | None]:
    """Run one child over dirs; ({dir: {"info"|"error": ...}}, its return code or None on timeout)."""
    cmd = [sys.executable, "-m", "h3render.worker.publish", *map(str, dirs)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        out, code = res.stdout, res.returncode
        if code != 0 and res.stderr.strip():
            log.debug("model probe stderr: %s", res.stderr.strip()[-2000:])
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        code = None
    found: dict[str, dict] = {}
    for line in out.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "dir" in doc:
            found[doc["dir"]] = doc
    return found, code


def publish_installed(r: redis.Redis, models: list[tuple[str, Path]] | None = None,
                      timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    """Publish Engine.info() of each installed model; {name: "published" or why it was skipped}."""
    from h3render.queue.engine_info import publish_engine_info

    models = installed_models() if models is None else models
    outcome: dict[str, str] = {}
    pending = list(models)
    while pending:
        found, code = _probe([d for _, d in pending], timeout_s)
        rest = []
        for i, (name, d) in enumerate(pending):
            doc = found.get(str(d))
            if doc is None:
                if code != 0 and not any(str(dd) in found for _, dd in pending[i + 1:]):
                    # the first model without a report is the one the child died on
                    why = "timed out" if code is None else f"exited with status {code}"
                    outcome[name] = f"skipped: the engine process {why} while opening it"
                    rest = pending[i + 1:]
                    break
                outcome[name] = "skipped: the probe reported nothing for it"
                continue
            if "info" in doc:
                try:
                    publish_engine_info(r, name, doc["info"], d)  # with its options and vocabulary
                    outcome[name] = "published"
                except redis.RedisError as e:
                    outcome[name] = f"skipped: could not publish: {e}"
            else:
                outcome[name] = f"skipped: {doc.get('error', 'unknown error')}"
        pending = rest
    for name, what in outcome.items():
        (log.info if what == "published" else log.warning)("model %s: %s", name, what)
    return outcome


def machine_ttl_s(settings) -> int:
    return max(MACHINE_TTL_MIN_S, int(MACHINE_TTL_POLLS * settings.gate_poll_s + 0.999))


def publish_machine(conn: redis.Redis, host: str, worker_name: str, settings, readings=None) -> dict:
    """Publish this machine's total and usable memory (see the module doc); `readings`
    are the sensors' latest (read now when not given). Returns the document."""
    from h3render.keys import MACHINE_KEY, MACHINES_KEY

    if readings is None:
        from h3render.worker.sensors import read_readings

        readings = read_readings(settings)
    total = readings.memory.total_bytes
    usable = int(total * (1.0 - settings.admission_headroom_fraction)) if total else None
    doc = {"host": host, "worker": worker_name, "total_bytes": total, "usable_bytes": usable,
           "time": time.time()}
    with conn.pipeline(transaction=True) as pipe:
        pipe.set(MACHINE_KEY.format(host=host), json.dumps(doc), ex=machine_ttl_s(settings))
        pipe.sadd(MACHINES_KEY, host)
        pipe.execute()
    return doc


def live_machines(conn: redis.Redis) -> list[dict]:
    """The machines whose worker published within its TTL, sorted by host. Read only:
    a host whose key expired is skipped (it stays in the set, which stays small)."""
    from h3render.keys import MACHINE_KEY, MACHINES_KEY

    hosts = sorted(h.decode() if isinstance(h, bytes) else str(h) for h in conn.smembers(MACHINES_KEY))
    if not hosts:
        return []
    out = []
    for raw in conn.mget([MACHINE_KEY.format(host=h) for h in hosts]):
        if raw is None:
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("host"):
            out.append(doc)
    return out


def main(argv: list[str]) -> int:
    """Child: open each model dir with 1 thread, print {"dir", "info"} or {"dir", "error"} per line."""
    from h3render.engine.binding import Engine

    for arg in argv:
        try:
            with Engine(arg, threads=1) as engine:
                doc = {"dir": arg, "info": engine.info()}
        except Exception as e:  # noqa: BLE001 - reported to the parent, which logs and skips
            doc = {"dir": arg, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
