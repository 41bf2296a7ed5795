"""`h3render convert SRC DST`: a diffusers-layout Wan pipeline folder -> model directory."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table
from h3render.cli.console import console as make_console


def parse_quants(value: str) -> list[str]:
    """'f32,f16' -> ['f32', 'f16'], each checked against the converter's levels."""
    from h3render.engine.convert import QUANT_LEVELS

    quants = [q.strip().lower() for q in value.split(",") if q.strip()]
    bad = [q for q in quants if q not in QUANT_LEVELS]
    if bad or not quants:
        raise click.BadParameter(
            f"quant={value!r}: {', '.join(bad) or 'empty'} not supported; choose from {', '.join(QUANT_LEVELS)}",
            param_hint="'--quant'",
        )
    return list(dict.fromkeys(quants))


@click.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(file_okay=False, path_type=Path))
@click.option("--quant", "quant", default="f16", show_default=True, help="Comma-separated quant levels, e.g. f32,f16.")
@click.option("--name", default=None, help="Model name stored in model.json (default: SRC's folder name).")
def convert(src: Path, dst: Path, quant: str, name: str | None) -> None:
    """Convert the diffusers pipeline folder SRC into the model directory DST."""
    from h3render.engine.convert import convert_pipeline
    from h3render.engine.exceptions import ConvertError

    quants = parse_quants(quant)
    err = make_console(stderr=True)
    try:
        report = convert_pipeline(src, dst, quants=quants, name=name)
    except ConvertError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except OSError as exc:
        err.print(f"[bold red]convert failed:[/] {exc}", highlight=False)
        sys.exit(1)
    table = Table("file", "bytes", title=str(report.dst))
    for fname, size in sorted(report.files.items()):
        table.add_row(fname, f"{size:,}")
    err.print(table)
    click.echo(str(report.dst))
