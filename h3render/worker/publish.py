"""At worker start: publish the engine info of every installed model, so clients can validate.

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
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import redis

log = logging.getLogger("h3render.worker")

PROBE_TIMEOUT_S = 120.0  # for all models of one child; opening reads headers only


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
                    publish_engine_info(r, name, doc["info"])
                    outcome[name] = "published"
                except redis.RedisError as e:
                    outcome[name] = f"skipped: could not publish: {e}"
            else:
                outcome[name] = f"skipped: {doc.get('error', 'unknown error')}"
        pending = rest
    for name, what in outcome.items():
        (log.info if what == "published" else log.warning)("model %s: %s", name, what)
    return outcome


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
