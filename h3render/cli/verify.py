"""`h3render verify --model DIR`: the engine's DiT beside a float64 reference, per stage.

Exit codes: 0 every stage within tolerance; 1 a stage over tolerance (or the
model could not be run); 2 bad input (no such model, quant level not in it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.cli.console import console as make_console


class BadInput(Exception):
    """A command-line value is unusable; the message names the option."""


def resolve_model(arg: str) -> Path:
    from h3render.engine.exceptions import EngineError
    from h3render.engine.models import resolve_model_arg

    try:
        return resolve_model_arg(arg)
    except EngineError as exc:
        raise BadInput(f"--model: {exc}") from exc


def pick_quants(value: str | None, available: list[str]) -> list[str]:
    """'f32,f16' -> ['f32', 'f16'], each present in the model; None -> all present."""
    if not available:
        raise BadInput("--model: the model directory has no transformer-<quant>.gguf")
    if value is None:
        return list(available)
    quants = list(dict.fromkeys(q.strip().lower() for q in value.split(",") if q.strip()))
    bad = [q for q in quants if q not in available]
    if bad or not quants:
        raise BadInput(
            f"--quant={value!r}: {', '.join(bad) or 'empty'} not in this model; "
            f"available: {', '.join(available)}"
        )
    return quants


def render_table(result) -> Table:
    table = Table(
        "stage", "shape", "rel err", "tolerance", "status",
        title=f"{result.model_dir}  quant {result.quant}  latent {tuple(result.latent_shape)}",
        caption=f"reference weights: {result.reference}",
    )  # fmt: skip
    for s in result.stages:
        status = "[green]ok[/]" if s.ok else "[bold red]FAIL[/]"
        if s.note:
            status += f" {s.note}"
        table.add_row(s.name, "x".join(map(str, s.shape)), f"{s.rel_err:.2e}", f"{s.tolerance:.0e}",
                      status)
    return table


def execute(model: str, quant: str | None, threads: int, seed: int, as_json: bool,
            source: Path | None = None, console: Console | None = None) -> int:
    from h3render.engine.binding import Engine
    from h3render.engine.exceptions import EngineError, InvalidRequestError
    from h3render.engine.reference import ReferenceError
    from h3render.engine.verify import ConfigMismatchError, verify_dit

    out = console or make_console()
    err = make_console(stderr=True)
    results = []
    try:
        model_dir = resolve_model(model)
        with Engine(model_dir, threads) as engine:
            quants = pick_quants(quant, list(engine.info().get("quant_levels") or []))
            for q in quants:
                results.append(verify_dit(model_dir, q, threads=threads, seed=seed, engine=engine,
                                          source=source))
    except (BadInput, InvalidRequestError, ConfigMismatchError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except (EngineError, ReferenceError, OSError) as exc:
        err.print(f"[bold red]verify failed:[/] {exc}", highlight=False, soft_wrap=True)
        return 1

    ok = all(r.ok for r in results)
    if as_json:
        click.echo(json.dumps({
            "ok": ok,
            "results": [
                {**r.model_dump(mode="json"), "ok": r.ok, "first_failure": r.first_failure} for r in results
            ],
        }))  # fmt: skip
    else:
        for r in results:
            out.print(render_table(r))
            if r.ok:
                out.print(f"[green]{r.quant}: all {len(r.stages)} stages within "
                          f"{r.stages[0].tolerance:.0e}[/]", soft_wrap=True)
            else:
                bad = next(s for s in r.stages if not s.ok)
                out.print(f"[bold red]{r.quant}: first stage over tolerance: {bad.name} "
                          f"(rel err {bad.rel_err:.2e} > {bad.tolerance:.0e})[/]",
                          highlight=False, soft_wrap=True)
    return 0 if ok else 1


@click.command()
@click.option("--model", "model", default=DEFAULT_MODEL, show_default=True, metavar="DIR|NAME",
              help="Model directory, or the name of an installed or built-in model.")
@click.option("--quant", default=None, help="Comma-separated quant levels to check (default: every level present).")
@click.option("--threads", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Worker threads; 0 uses every CPU.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="Seed of the probe input.")
@click.option("--source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Diffusers pipeline folder the model was converted from; the reference then "
                   "reads its weights there, so conversion bugs show too.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-stage errors as JSON.")
def verify(model: str, quant: str | None, threads: int, seed: int, source: Path | None,
           as_json: bool) -> None:
    """Run the engine's DiT beside an independent float64 reference and print per-stage errors.

    The reference reads the weights from --source if given, else from the
    model's transformer-f32.gguf (with gguf-py), else from the file under test.
    Exits 1 if any stage is over its tolerance.
    """
    sys.exit(execute(model, quant, threads, seed, as_json, source=source))
