"""The `h3render` command: a thin layer that parses, calls the package API, prints.

Each subcommand lives in its own module and is imported only when used, so
`h3render --help` stays fast and a broken optional dependency breaks one
command, not all. Exit codes: 0 ok, 1 failure, 2 bad usage or input.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "run": "h3render.cli.run:run",
    "convert": "h3render.cli.convert:convert",
    "verify": "h3render.cli.verify:verify",
    "models": "h3render.cli.models:models",
    "demo": "h3render.cli.demo:demo",
    "enqueue": "h3render.cli.jobs:enqueue",
    "sweep": "h3render.cli.jobs:sweep",
    "status": "h3render.cli.jobs:status",
    "cancel": "h3render.cli.jobs:cancel",
    "retry": "h3render.cli.jobs:retry",
    "worker": "h3render.cli.worker:worker",
    "health": "h3render.cli.worker:health",
    "redis": "h3render.cli.redis:redis_group",
    "tune": "h3render.cli.tune:tune",
    "dashboard": "h3render.cli.dashboard:dashboard",
    "comfyui": "h3render.cli.comfyui:comfyui",
    "eval-demo": "h3render.cli.eval_demo:eval_demo",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(COMMANDS) | set(super().list_commands(ctx))
        return sorted(n for n in names if self._available(n))

    @staticmethod
    def _available(name: str) -> bool:
        module = COMMANDS.get(name, "").split(":")[0]
        return not module or importlib.util.find_spec(module) is not None

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS and self._available(name):
            module, attr = COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="h3render")
def cli() -> None:
    """Render video with local diffusion models, one job or an overnight sweep."""


def main() -> None:
    """The console script: bad H3RENDER_* settings end in one line per variable and exit 2."""
    import sys

    from pydantic import ValidationError

    from h3render.settings import SettingsError, describe_settings_error

    try:
        cli()
    except SettingsError as e:
        click.echo(f"error: bad settings:\n{e}", err=True)
        sys.exit(2)
    except ValidationError as e:  # a command built Settings() from the environment
        if e.title != "Settings":
            raise
        click.echo(f"error: bad settings:\n{describe_settings_error(e)}", err=True)
        sys.exit(2)
