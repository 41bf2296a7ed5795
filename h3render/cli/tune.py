"""`h3render tune`: find the fastest thread count for a model and quant level on this machine."""

from __future__ import annotations

import json
import sys

import click
from h3render.cli.console import console as make_console


def _threads_list(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        counts = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter(f"--threads={value!r}: expected a comma list of integers, e.g. 1,2,4")
    if not counts or counts[0] < 1:
        raise click.BadParameter(f"--threads={value!r}: every count must be >= 1")
    return counts


def tune_size(model_dir, quant: str | None, size: str | None) -> tuple[str, int, int, int]:
    """(quant, width, height, frames) to time at: the job contract's, so the model's defaults fill
    what is not given (the size a render of this model gets) and every problem is named at once.
    Raises JobValidationError."""
    from h3render.cli.jobs import lenient
    from h3render.cli.run import model_name
    from h3render.engine.binding import Engine
    from h3render.queue import contract
    from h3render.queue.engine_info import with_model_facts

    name = model_name(str(model_dir))
    with Engine(model_dir, threads=1) as engine:
        info = with_model_facts(name, engine.info(), model_dir)
    payload: dict = {"prompt": "tune", "model": name}
    if quant is not None:
        payload["quant"] = quant
    if size is not None:
        payload.update({k: lenient(k, v) for k, v in zip(("width", "height", "frames"), size.lower().split("x"))})
    job = contract.check(payload, lambda _model: info).job
    return str(job.quant), int(job.width), int(job.height), int(job.frames)


@click.command()
@click.option("--model", "model", required=True, help="Model name or model directory.")
@click.option("--quant", "quant", default=None, help="Quant level, e.g. f16, q8_0, q6_k, q4_0 (default: a job's).")
@click.option("--threads", "threads", default=None, help="Counts to try, e.g. 1,2,4,8 (default: 1, 2, 4, ... CPUs).")
@click.option("--size", default=None, help="WIDTHxHEIGHTxFRAMES to time a step at (default: the model's).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1, 50), help="Timed runs per count.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(model: str, quant: str | None, threads: str | None, size: str | None, repeats: int, as_json: bool) -> None:
    """Time one denoising step over thread counts and store the fastest for this machine."""

    from h3render.engine import tune as T
    from h3render.engine.exceptions import EngineError
    from h3render.engine.models import resolve_model_arg
    from h3render.queue.errors import JobValidationError

    counts = _threads_list(threads) or T.default_thread_counts()
    if size is not None and len(size.lower().split("x")) != 3:
        click.echo(f"--size={size!r}: expected WIDTHxHEIGHTxFRAMES, e.g. 64x64x17", err=True)
        sys.exit(2)
    console = make_console(stderr=as_json)
    try:
        model_dir = resolve_model_arg(model)
        quant, width, height, frames = tune_size(model_dir, quant, size)
        results, latent = T.measure(
            model_dir, quant, counts, width, height, frames, repeats,
            on_result=lambda m: console.print(f"threads {m.threads:3d}: {m.median * 1000:9.1f} ms per DiT pass"),
        )
    except JobValidationError as exc:
        click.echo("error: --quant/--size:\n" + "\n".join(f"  {p}" for p in exc.problems), err=True)
        sys.exit(2)
    except EngineError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2 if "not available" in str(exc) or "must be" in str(exc) else 1)
    except Exception as exc:  # noqa: BLE001 - model lookup errors carry their own message
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    name = model_dir.name
    best = T.store(name, quant, results, latent)
    if as_json:
        click.echo(json.dumps({"machine": T.machine_key(), "model": name, "quant": quant, "threads": best,
                               "size": [width, height, frames],
                               "seconds": {m.threads: m.median for m in results},
                               "file": str(T.tune_file())}, indent=2))
    else:
        console.print(f"best for {name} {quant} at {width}x{height}x{frames} on {T.machine_key()}: "
                      f"[bold]{best}[/bold] threads (stored in {T.tune_file()})")
