"""Charts of health samples: memory, pressure, heat and power over time. Pure functions.

Two kinds of samples feed them:
  * the worker's published gate records ("h3render:health:<host>" and its history):
    {"time", "open", "reasons", "readings": {"memory": {...}, "thermal": {...}, "power": {...}}}
  * the render task's own samples in meta.json "health":
    {"time", "available", "pressure_level", "psi_some", "thermal_state", "on_battery"}
Both are normalised to one flat sample by `flat_sample`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from markupsafe import Markup

from h3render.dashboards.plots import Band, Chart, Marker, Series, line_chart

GIB = 1024**3
THERMAL_STATES = {"nominal": 0, "fair": 1, "serious": 2, "critical": 3}
PHASES = ("admission", "load", "encode", "denoise", "decode", "write")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _thermal_state(v: Any) -> float | None:
    if isinstance(v, str):
        return THERMAL_STATES.get(v.lower())
    return _num(v)


def flat_sample(s: Mapping[str, Any]) -> dict[str, float | None]:
    """One sample from either record kind: times in s, memory in GiB, temps in °C."""
    rd = s.get("readings") if isinstance(s.get("readings"), dict) else None
    if rd is not None:
        mem, th, pw = rd.get("memory") or {}, rd.get("thermal") or {}, rd.get("power") or {}
        zones = [z.get("temp_c") for z in th.get("zones") or [] if isinstance(z, dict)]
        temps = [t for t in zones if isinstance(t, (int, float))]
        avail, total = _num(mem.get("available_bytes")), _num(mem.get("total_bytes"))
        return {
            "time": _num(s.get("time")),
            "available_gib": avail / GIB if avail is not None else None,
            "total_gib": total / GIB if total is not None else None,
            "swap_used_gib": (_num(mem.get("swap_used_bytes")) or 0) / GIB if mem.get("swap_used_bytes") is not None else None,
            "psi_some": _num(mem.get("psi_some_avg10")),
            "psi_full": _num(mem.get("psi_full_avg10")),
            "pressure_level": _num(mem.get("pressure_level")),
            "max_temp_c": max(temps) if temps else None,
            "thermal_state": _thermal_state(th.get("state")),
            "battery_percent": _num(pw.get("battery_percent")),
            "on_battery": (1.0 if pw.get("on_battery") else 0.0) if pw.get("on_battery") is not None else None,
            "open": (1.0 if s.get("open") else 0.0) if "open" in s else None,
        }
    avail = _num(s.get("available"))
    return {
        "time": _num(s.get("time")),
        "available_gib": avail / GIB if avail is not None else None,
        "total_gib": None, "swap_used_gib": None,
        "psi_some": _num(s.get("psi_some")), "psi_full": None,
        "pressure_level": _num(s.get("pressure_level")),
        "max_temp_c": None,
        "thermal_state": _thermal_state(s.get("thermal_state")),
        "battery_percent": None,
        "on_battery": (1.0 if s.get("on_battery") else 0.0) if s.get("on_battery") is not None else None,
        "open": None,
    }


def _series(samples: list[dict], key: str, name: str, step: bool = False) -> Series:
    return Series(name, [(s["time"], s[key]) for s in samples if s["time"] is not None], step=step)


def _has(samples: list[dict], key: str) -> bool:
    return any(s.get(key) is not None for s in samples)


def closed_bands(records: Iterable[Mapping[str, Any]], x1: float) -> list[Band]:
    """Intervals where the gate was held, from consecutive records (reason as label)."""
    bands: list[Band] = []
    start = None
    why = ""
    for rec in records:
        t = _num(rec.get("time"))
        if t is None or "open" not in rec:
            continue
        if not rec["open"] and start is None:
            start = t
            reasons = rec.get("reasons") or []
            why = "; ".join(str(r.get("message") or r.get("code")) for r in reasons if isinstance(r, dict))
        elif rec["open"] and start is not None:
            bands.append(Band(start, t, "gate held: " + (why or "?")))
            start = None
    if start is not None:
        bands.append(Band(start, x1, "gate held: " + (why or "?")))
    return bands


def health_charts(records: list[Mapping[str, Any]], x0: float, x1: float,
                  extra_memory: list[Series] | None = None, bands: list[Band] | None = None,
                  markers: list[Marker] | None = None, x_label: str = "seconds") -> list[Markup]:
    """Memory, pressure, heat and power charts over [x0, x1]; empty quantities say "no samples"."""
    samples = sorted((flat_sample(r) for r in records), key=lambda s: s["time"] or 0.0)
    samples = [s for s in samples if s["time"] is not None]
    bands = list(bands or []) + closed_bands(records, x1)
    markers = markers or []
    mem = [_series(samples, "available_gib", "available")]
    if _has(samples, "swap_used_gib"):
        mem.append(_series(samples, "swap_used_gib", "swap used"))
    mem += extra_memory or []
    pressure = []
    if _has(samples, "psi_some") or not _has(samples, "pressure_level"):
        pressure.append(_series(samples, "psi_some", "PSI some avg10 %"))
    if _has(samples, "psi_full"):
        pressure.append(_series(samples, "psi_full", "PSI full avg10 %"))
    if _has(samples, "pressure_level"):
        pressure.append(_series(samples, "pressure_level", "macOS pressure level", step=True))
    heat = [_series(samples, "max_temp_c", "hottest zone °C")]
    if _has(samples, "thermal_state"):
        heat.append(_series(samples, "thermal_state", "thermal state (0-3)", step=True))
    power = [_series(samples, "battery_percent", "battery %")]
    if _has(samples, "on_battery"):
        power.append(_series(samples, "on_battery", "on battery (1 = yes)", step=True))
    charts = [
        Chart("memory", "GiB", mem, bands, markers),
        Chart("memory pressure", "", pressure, bands, markers),
        Chart("thermal", "", heat, bands, markers),
        Chart("power", "", power, bands, markers),
    ]
    return [line_chart(c, x0, x1, x_label) for c in charts]


def phase_markers(started_at: float | None, timings: Mapping[str, Any]) -> list[Marker]:
    """A marker where each phase ended, from the start time and the per-phase seconds."""
    if started_at is None:
        return []
    out, t = [], started_at
    for ph in PHASES:
        v = _num(timings.get(ph))
        if v is not None:
            t += v
            out.append(Marker(t, f"{ph} ended"))
    return out
