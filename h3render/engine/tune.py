"""Thread-count tuning: measure DiT step time over thread counts, keep the fastest.

More threads can be slower once they fight over memory bandwidth (on an M3 Max,
8 threads beat 12), so `h3render tune --model NAME --quant Q` times one DiT
forward (a sampler step is one, or two with guidance) at each thread count and
stores the fastest for this machine, model and quant level under
``$H3RENDER_HOME/tune/<machine>.json``::

    {"machine": "...", "entries": {"<model>/<quant>": {"threads": 6,
        "seconds": {"1": 0.91, "2": 0.48, ...}, "latent": [16, 3, 30, 52],
        "measured_at": "2025-...Z"}}}

The worker calls :func:`best_threads` and uses it unless the job says otherwise.
Policy (:func:`pick_best`) and storage are pure or thin; only :func:`measure`
runs the engine.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from h3render import paths

# A count within this fraction of the fastest counts as tied; ties go to fewer
# threads (they leave cores to the rest of the machine and draw less power).
TIE_FRACTION = 0.02


@dataclass(frozen=True)
class Measurement:
    threads: int
    seconds: list[float]  # one per repeat

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """A file-name-safe key for this machine: host, CPU model and core count."""
    raw = f"{platform.node() or 'host'}-{_cpu_model()}-{os.cpu_count() or 1}cpu"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_")[:120]


def default_thread_counts(n_cpu: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the CPU count, plus the CPU count and 3/4 of it."""
    n = max(1, n_cpu or os.cpu_count() or 1)
    counts = {n, max(1, (3 * n) // 4)}
    t = 1
    while t < n:
        counts.add(t)
        t *= 2
    return sorted(counts)


def pick_best(measurements: list[Measurement], tie: float = TIE_FRACTION) -> int:
    """The thread count with the lowest median time; within `tie` of it, the fewest threads."""
    if not measurements:
        raise ValueError("no measurements to pick from")
    fastest = min(m.median for m in measurements)
    return min(m.threads for m in measurements if m.median <= fastest * (1.0 + tie))


def tune_file(machine: str | None = None) -> Path:
    return paths.tune_dir() / f"{machine or machine_key()}.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def store(model: str, quant: str, measurements: list[Measurement], latent: tuple[int, ...],
          machine: str | None = None) -> int:
    """Record the measurements and the best count for (machine, model, quant); returns it."""
    best = pick_best(measurements)
    machine = machine or machine_key()
    path = tune_file(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path)
    data["machine"] = machine
    entries = data.setdefault("entries", {})
    entries[f"{model}/{quant}"] = {
        "threads": best,
        "seconds": {str(m.threads): round(m.median, 6) for m in measurements},
        "latent": list(latent),
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return best


def best_threads(model: str, quant: str, machine: str | None = None) -> int | None:
    """The stored best thread count for this machine, model and quant level, or None."""
    entry = _read(tune_file(machine)).get("entries", {}).get(f"{model}/{quant}")
    if not isinstance(entry, dict):
        return None
    threads = entry.get("threads")
    return threads if isinstance(threads, int) and threads > 0 else None


def measure(model_dir: Path, quant: str, thread_counts: list[int], width: int, height: int,
            frames: int, repeats: int = 3, on_result=None) -> tuple[list[Measurement], tuple[int, ...]]:
    """Time one DiT forward at each thread count (one warm-up, then `repeats`).

    Inputs are fixed pseudo-random latents and context, so every count does the
    same work. on_result(Measurement) is called after each count.
    """
    from h3render.engine.binding import Engine

    results = []
    latent: tuple[int, ...] = ()
    for threads in thread_counts:
        with Engine(model_dir, threads) as engine:
            info = engine.info()
            latent = engine.latent_shape(width, height, frames)
            rng = np.random.default_rng(0)
            x = rng.standard_normal(latent).astype(np.float32)
            ctx = rng.standard_normal((info["text_len"], info["text_dim"])).astype(np.float32)
            engine.dit_forward(quant, x, 500.0, ctx)  # warm-up: page in weights
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                engine.dit_forward(quant, x, 500.0, ctx)
                times.append(time.perf_counter() - t0)
        m = Measurement(threads, times)
        results.append(m)
        if on_result:
            on_result(m)
    return results, latent
