"""`h3render tune`: find the fastest thread count for a model and quant level on this machine."""

from __future__ import annotations

import json
import sys

import click


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


@click.command()
@click.option("--model", "model", required=True, help="Model name or model directory.")
@click.option("--quant", "quant", required=True, help="Quant level, e.g. f16, q8_0, q6_k, q4_0.")
@click.option("--threads", "threads", default=None, help="Counts to try, e.g. 1,2,4,8 (default: 1, 2, 4, ... CPUs).")
@click.option("--size", default="832x480x33", show_default=True, help="WIDTHxHEIGHTxFRAMES to time a step at.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1, 50), help="Timed runs per count.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(model: str, quant: str, threads: str | None, size: str, repeats: int, as_json: bool) -> None:
    """Time one denoising step over thread counts and store the fastest for this machine."""
    from rich.console import Console

    from h3render.engine import tune as T
    from h3render.engine.exceptions import EngineError
    from h3render.engine.models import resolve_model_arg

    counts = _threads_list(threads) or T.default_thread_counts()
    try:
        width, height, frames = (int(v) for v in size.lower().split("x"))
    except ValueError:
        click.echo(f"--size={size!r}: expected WIDTHxHEIGHTxFRAMES, e.g. 832x480x33", err=True)
        sys.exit(2)
    console = Console(stderr=as_json)
    try:
        model_dir = resolve_model_arg(model)
        results, latent = T.measure(
            model_dir, quant, counts, width, height, frames, repeats,
            on_result=lambda m: console.print(f"threads {m.threads:3d}: {m.median * 1000:9.1f} ms per DiT pass"),
        )
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
                               "seconds": {m.threads: m.median for m in results},
                               "file": str(T.tune_file())}, indent=2))
    else:
        console.print(f"best for {name} {quant} on {T.machine_key()}: [bold]{best}[/bold] threads "
                      f"(stored in {T.tune_file()})")
