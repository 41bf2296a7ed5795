"""`h3render models`: list installed and built-in models (a group for more subcommands)."""

from __future__ import annotations

import json

import click
from h3render.cli.console import console as make_console
from h3render.cli.console import table as make_table


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """List models in $H3RENDER_HOME/models (built-ins are converted on first use).

    Kind "gguf": converted for the CPU engine; kind "h3": an H3 snapshot (FL2VA/) for h3.c.
    """
    if ctx.invoked_subcommand is not None:
        return
    from h3render import paths
    from h3render.engine.models import list_models

    entries = list_models()
    if as_json:
        click.echo(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    console = make_console()
    if not entries:
        console.print(f"no models in {paths.models_dir()}; convert one with `h3render convert SRC DST`")
        return
    table = make_table("name", "kind", "status", "usable quant levels", "tokenizer", "size", "path",
                  title=str(paths.models_dir()))
    problems = []
    for e in entries:
        status = "installed" if e.installed else "built-in, converted on first use"
        if e.unusable:
            status += f", {len(e.unusable)} level(s) unusable"
            problems += [f"{e.name} {q}: {why}" for q, why in sorted(e.unusable.items())]
        table.add_row(
            e.name, e.kind, status, ", ".join(e.usable_quants) or "-", "yes" if e.has_tokenizer else "no",
            _size(e.size_bytes) if e.installed else "-", str(e.path),
        )  # fmt: skip
    console.print(table)
    for line in problems:  # each level stands alone: say which files keep the others out
        console.print(f"unusable: {line}", markup=False, highlight=False, soft_wrap=True)


def _register_subcommands() -> None:
    from h3render.cli.models_inspect import inspect

    models.add_command(inspect)


_register_subcommands()
