"""Jinja filters for the dashboard templates: durations, sizes, times, values.

They return plain text; Jinja's autoescape escapes it like any other value.
"""

from __future__ import annotations

import time
from typing import Any

from flask import Flask

from h3render.dashboards.grid import fmt_value
from h3render.dashboards.plots import fmt_duration


def duration(s: Any) -> str:
    return fmt_duration(float(s)) if isinstance(s, (int, float)) else "–"


def size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    n = float(n)
    for unit, k in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= k:
            return f"{n / k:.2f} {unit}" if unit == "GiB" else f"{n / k:.0f} {unit}"
    return f"{n:.0f} B"


def clock(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def ago(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "–"
    return fmt_duration(time.time() - ts) + " ago"


def pct(x: Any) -> str:
    return f"{x * 100:.0f}%" if isinstance(x, (int, float)) else "–"


def register(app: Flask) -> None:
    app.jinja_env.filters.update(duration=duration, size=size, clock=clock, ago=ago, pct=pct,
                                 value=fmt_value)
