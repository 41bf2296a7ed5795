"""`h3render comfyui install COMFYUI_DIR`: make ComfyUI load the h3render nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.group()
def comfyui() -> None:
    """ComfyUI nodes that queue renders on h3render workers."""


@comfyui.command()
@click.argument("comfyui_dir", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite a custom_nodes/h3render folder not written by h3render.")
@click.option("--python", "python", default=None, metavar="PATH",
              help="ComfyUI's Python: check that it can import h3render (exit 1 if not).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def install(comfyui_dir: Path, force: bool, python: str | None, as_json: bool) -> None:
    """Write COMFYUI_DIR/custom_nodes/h3render/, which imports the nodes from installed h3render."""
    from h3render.comfy_bridge.install import InstallError, check_python
    from h3render.comfy_bridge.install import install as do_install

    try:
        res = do_install(comfyui_dir, force=force)
    except InstallError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if python:
        res.python_check = check_python(python, cwd=res.path.parent.parent)
    ok = res.python_check is None or res.python_check.startswith("ok")
    if as_json:
        click.echo(json.dumps({"path": str(res.path), "replaced": res.replaced, "python_check": res.python_check}))
    else:
        click.echo(f"{'rewrote' if res.replaced else 'wrote'} {res.path / '__init__.py'}")
        if res.python_check is not None:
            click.echo(f"{python}: {res.python_check}")
        click.echo("ComfyUI's own Python must have h3render installed: `<ComfyUI's python> -m pip install h3render`.\n"
                   "Set H3RENDER_REDIS_URL (or H3RENDER_HOME) for ComfyUI as for your workers, then restart ComfyUI.")
    if not ok:
        click.echo(f"error: {python} cannot import h3render: {res.python_check}", err=True)
        sys.exit(1)
