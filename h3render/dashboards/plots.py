"""Inline SVG charts: small multiples with a shared time axis. Pure functions.

    svg = line_chart("available memory", "GiB", [Series("available", pts)], x0, x1)

Returns markupsafe.Markup; every text that goes into the SVG (titles, series
names, labels) is escaped here, so a chart can never carry markup from data.
Points are (x, y) with x in seconds; None values break the line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

W, H = 640, 150  # viewBox size (px); the chart scales to its container's width
PAD_L, PAD_R, PAD_T, PAD_B = 52, 12, 22, 24
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


@dataclass
class Series:
    name: str
    points: list[tuple[float, float | None]]
    color: str | None = None
    step: bool = False  # draw as steps (states), not lines


@dataclass
class Band:
    """A shaded x-interval (a closed gate, a thermal pause, a phase)."""

    x0: float
    x1: float
    label: str
    color: str = "#fca5a5"


@dataclass
class Marker:
    x: float
    label: str


@dataclass
class Chart:
    title: str
    unit: str
    series: list[Series]
    bands: list[Band] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About n round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2f}".rstrip("0").rstrip(".")


def fmt_duration(s: float) -> str:
    s = max(0.0, s)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def line_chart(chart: Chart, x0: float, x1: float, x_label: str = "seconds") -> Markup:
    """One chart: y from the data (0-based when all values are >= 0), x over [x0, x1]."""
    ys = [y for s in chart.series for _, y in s.points if y is not None and math.isfinite(y)]
    if x1 <= x0:
        x1 = x0 + 1.0
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    out = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="{escape(chart.title)}" '
           f'xmlns="http://www.w3.org/2000/svg">']
    out.append(f'<text class="chart-title" x="{PAD_L}" y="14">{escape(chart.title)}'
               f'{" (" + str(escape(chart.unit)) + ")" if chart.unit else ""}</text>')
    if not ys:
        out.append(f'<text class="chart-empty" x="{PAD_L + pw / 2:.1f}" y="{PAD_T + ph / 2:.1f}" '
                   f'text-anchor="middle">no samples</text></svg>')
        return Markup("".join(out))
    lo, hi = min(ys), max(ys)
    if lo >= 0:
        lo = 0.0
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    hi += (hi - lo) * 0.05

    def X(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * pw

    def Y(y: float) -> float:
        return PAD_T + ph - (y - lo) / (hi - lo) * ph

    for b in chart.bands:
        a, z = max(b.x0, x0), min(b.x1, x1)
        if z > a:
            out.append(f'<rect class="band" x="{X(a):.1f}" y="{PAD_T}" width="{max(X(z) - X(a), 1):.1f}" '
                       f'height="{ph}" fill="{escape(b.color)}" fill-opacity="0.35"><title>{escape(b.label)}'
                       f'</title></rect>')
    for t in nice_ticks(lo, hi):
        out.append(f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{Y(t):.1f}" y2="{Y(t):.1f}"/>')
        out.append(f'<text class="tick" x="{PAD_L - 4}" y="{Y(t) + 3:.1f}" text-anchor="end">{fmt_num(t)}</text>')
    for t in nice_ticks(0.0, x1 - x0, 6):
        if X(x0 + t) < W - PAD_R - 6 * len(x_label) - 12:  # leave room for the axis label
            out.append(f'<text class="tick" x="{X(x0 + t):.1f}" y="{H - 8}" text-anchor="middle">{fmt_num(t)}</text>')
    out.append(f'<text class="tick" x="{W - PAD_R}" y="{H - 8}" text-anchor="end">{escape(x_label)}</text>')
    out.append(f'<line class="axis" x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{PAD_T + ph}"/>')
    out.append(f'<line class="axis" x1="{PAD_L}" x2="{W - PAD_R}" y1="{PAD_T + ph}" y2="{PAD_T + ph}"/>')
    for m in chart.markers:
        if x0 <= m.x <= x1:
            out.append(f'<line class="marker" x1="{X(m.x):.1f}" x2="{X(m.x):.1f}" y1="{PAD_T}" '
                       f'y2="{PAD_T + ph}"><title>{escape(m.label)}</title></line>')
    legend_x = PAD_L + 20 + 7.5 * (len(chart.title) + (len(chart.unit) + 3 if chart.unit else 0))
    for i, s in enumerate(chart.series):
        color = s.color or PALETTE[i % len(PALETTE)]
        path = _path(s, X, Y)
        if path:
            out.append(f'<path class="line" d="{path}" stroke="{escape(color)}" fill="none">'
                       f'<title>{escape(s.name)}</title></path>')
        pts = [(x, y) for x, y in s.points if y is not None and math.isfinite(y)]
        if len(pts) <= 40:  # dots when sparse, so single samples show
            for x, y in pts:
                out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="2.5" fill="{escape(color)}">'
                           f'<title>{escape(s.name)} {fmt_num(y)} at {fmt_num(x - x0)} s</title></circle>')
        if len(chart.series) > 1:
            out.append(f'<text class="legend" x="{legend_x:.0f}" y="14" fill="{escape(color)}">'
                       f'{escape(s.name)}</text>')
            legend_x += 14 + 7 * len(s.name)
    out.append("</svg>")
    return Markup("".join(out))


def _path(s: Series, X, Y) -> str:
    parts: list[str] = []
    pen_up = True
    prev_y = None
    for x, y in s.points:
        if y is None or not math.isfinite(y):
            pen_up = True
            continue
        if pen_up:
            parts.append(f"M{X(x):.1f},{Y(y):.1f}")
        elif s.step and prev_y is not None:
            parts.append(f"H{X(x):.1f}V{Y(y):.1f}")
        else:
            parts.append(f"L{X(x):.1f},{Y(y):.1f}")
        pen_up, prev_y = False, y
    return "".join(parts)


def bar_segments(parts: Sequence[tuple[str, float]]) -> list[dict]:
    """Timing bar: [{name, seconds, pct, left}] with pct of the total (for a stacked bar)."""
    total = sum(max(v, 0.0) for _, v in parts) or 1.0
    out, left = [], 0.0
    for name, v in parts:
        pct = max(v, 0.0) / total * 100
        out.append({"name": name, "seconds": v, "pct": round(pct, 2), "left": round(left, 2),
                    "color": PALETTE[len(out) % len(PALETTE)]})
        left += pct
    return out
