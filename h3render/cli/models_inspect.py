"""`h3render models inspect DIR`: check an H3 snapshot's shards and report bytes per component.

Reads only safetensors headers (h3render.engine.h3.inspect). Exit codes: 0 the
snapshot is complete, 1 it has problems (each names its file), 2 bad usage.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table
from h3render.cli.console import console as make_console


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


@click.command("inspect")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect(model_dir: Path, as_json: bool) -> None:
    """Check an H3 snapshot (FL2VA/, Ref2VA/) without loading it: truncated or missing
    shards, broken indexes, and the bytes of every component."""
    from h3render.engine.h3.inspect import inspect_model_dir

    report = inspect_model_dir(model_dir)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        console = make_console()
        table = Table("component", "files", "tensors", "on disk", "tensor bytes", "dtypes", title=str(model_dir))
        for c in report.components:
            dtypes = ", ".join(f"{k} x{v}" for k, v in c.dtypes.items()) or "-"
            table.add_row(c.path + (" (indexed)" if c.indexed else ""), str(len(c.shards)), str(c.tensors),
                          _size(c.file_bytes), _size(c.tensor_bytes), dtypes)
        if report.components:
            console.print(table)
        for w in report.warnings:
            console.print(f"[yellow]warning[/yellow] {w}", highlight=False)
        for p in report.problems:
            console.print(f"[red]{p.kind}[/red] {p.file}: {p.message}", highlight=False)
        if report.ok:
            console.print(f"[green]ok[/green]: FL2VA DiT {_size(report.dit_bytes())}", highlight=False)
    if not report.ok:
        raise SystemExit(1)
