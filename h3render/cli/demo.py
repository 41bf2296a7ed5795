"""`h3render demo`: render a short clip with the built-in tiny model.

Uses exactly the code path of `h3render run` (h3render.cli.run.execute) and
writes into $H3RENDER_HOME/renders/demo/: video.mp4 and poster.png.
"""

from __future__ import annotations

import sys

import click

DEMO_PROMPT = "a red circle moving left over a blue background"
DEMO_SEED = 42


@click.command()
@click.option("--prompt", default=DEMO_PROMPT, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=DEMO_SEED, show_default=True)
@click.option("--threads", type=click.IntRange(0, 1024), default=0, show_default=True)
def demo(prompt: str, seed: int, threads: int) -> None:
    """Render a short clip with the tiny built-in model and say where it is."""
    from h3render import paths
    from h3render.cli.run import RunParams, execute
    from h3render.engine.models import DEFAULT_MODEL

    out_dir = paths.renders_dir(ensure=True) / "demo"
    params = RunParams(
        model=DEFAULT_MODEL, prompt=prompt, seed=seed, threads=threads,
        output=out_dir / "video.mp4", poster=out_dir / "poster.png",
    )  # fmt: skip
    code = execute(params)
    if code == 0:
        click.echo(f"demo video: {params.output}")
    sys.exit(code)
