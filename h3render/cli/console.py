"""The console and tables every command prints with: rich on a terminal, plain text elsewhere.

On a terminal, rich sizes tables to the window. When stdout is a pipe or a file
(`make demo`'s log, `h3render status | grep`), rich would assume 80 columns and
wrap each path over several lines; there, lines are never wrapped, tables have no
box, and there are no colours, so every row stays one line a script can read.
"""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console
from rich.table import Table

PIPE_WIDTH = 100_000  # wide enough that no row of ours wraps


def is_terminal() -> bool:
    return sys.stdout.isatty()


def console(**kw) -> Console:
    """A Console for command output (keyword arguments go to rich's Console)."""
    stream = sys.stderr if kw.get("stderr") else sys.stdout
    if not stream.isatty():
        kw.setdefault("width", PIPE_WIDTH)
        kw.setdefault("no_color", True)
        kw.setdefault("highlight", False)
    return Console(**kw)


def table(*columns: str, **kw) -> Table:
    """A Table: boxed on a terminal; plain columns with a header line elsewhere."""
    if not is_terminal():
        kw.setdefault("box", box.SIMPLE_HEAD)
        kw.setdefault("title", None)
    return Table(*columns, **kw)
