"""`h3render eval-demo`: does the demo model follow its prompts, at every quant level?

Renders held-out prompts (h3render.demo_data.heldout_specs) with the CPU engine,
measures each clip with the analytic detector (h3render.engine.eval_demo) and
prints accuracy per attribute and quant level. Writes contact sheets (one row
per prompt) and report.json into --out.

Exit codes: 0 every level meets the thresholds; 1 a level falls short (or the
engine failed); 2 bad input (no such model, unknown quant level, n < 1).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click
from rich.progress import Progress
from rich.table import Table
from h3render.cli.console import console as make_console

# The acceptance thresholds, per attribute.
THRESHOLDS = {"color": 0.90, "direction": 0.85, "shape": 0.70}


@click.command("eval-demo")
@click.option("--model", "model_arg", default="shapes-wan", show_default=True,
              help="Model directory or name (the demo model).")
@click.option("--quant", default=None, help="Comma-separated quant levels; default: all in the model.")
@click.option("-n", "--prompts", "n", type=int, default=120, show_default=True,
              help="Held-out prompts per quant level.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="Seed of the first prompt (prompt i uses seed + i).")
@click.option("--steps", type=click.IntRange(1, 1000), default=None, help="Sampling steps (model default).")
@click.option("--threads", type=click.IntRange(0, 1024), default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("eval-demo"),
              show_default=True, help="Directory for contact-<quant>.png and report.json.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
def eval_demo(model_arg: str, quant: str | None, n: int, seed: int, steps: int | None, threads: int,
              out: Path, as_json: bool) -> None:
    """Render held-out prompts and report colour, direction and shape accuracy."""
    from h3render.cli.verify import BadInput, pick_quants, resolve_model
    from h3render.engine.eval_demo import ATTRIBUTES, evaluate
    from h3render.engine.exceptions import EngineError
    from h3render.engine.models import describe

    console = make_console(stderr=as_json)
    try:
        if n < 1:
            raise BadInput(f"--prompts={n} must be at least 1")
        model_dir = resolve_model(model_arg)
        quants = pick_quants(quant, describe(model_dir).quants)
    except BadInput as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(2)

    try:
        with Progress(console=console, transient=True) as bar:
            tasks = {q: bar.add_task(f"render {q}", total=n) for q in quants}
            reports = evaluate(model_dir, quants, n=n, seed=seed, threads=threads, steps=steps,
                               sheet_dir=out, on_clip=lambda q, i: bar.update(tasks[q], completed=i + 1))
    except EngineError as exc:
        console.print(f"[red]engine error:[/] {exc}")
        sys.exit(1)

    ok = all(r.accuracy[a] >= t for r in reports for a, t in THRESHOLDS.items())
    if as_json:
        click.echo(json.dumps({"model": str(model_dir), "thresholds": THRESHOLDS, "ok": ok,
                               "reports": [asdict(r) for r in reports]}, indent=2))
    else:
        table = Table("quant", "prompts", *ATTRIBUTES, "consistency", "seconds",
                      title=f"{model_dir}: held-out prompts",
                      caption="thresholds: " + ", ".join(f"{a} >= {t:.0%}" for a, t in THRESHOLDS.items()))
        for r in reports:
            cells = [f"[{'green' if r.accuracy[a] >= THRESHOLDS[a] else 'red'}]{r.accuracy[a]:.1%}[/]"
                     for a in ATTRIBUTES]
            table.add_row(r.quant, str(r.n), *cells, f"{r.consistency:.2f}", f"{r.seconds:.0f}")
        console.print(table)
        console.print(f"contact sheets and report.json in {out}")
    sys.exit(0 if ok else 1)
