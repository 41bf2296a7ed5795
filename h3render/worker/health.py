"""The health gate: readings of memory, heat, power and disk -> open or closed, with reasons.

Pure policy. `Readings` is a platform-neutral snapshot; `macos_readings` and
`linux_readings` assemble one from what the parsers in h3render.worker.probes
return, and `decide` turns a snapshot plus Settings into a `Decision`. The OS
I/O lives in h3render.worker.sensors, so tests feed recorded real outputs here.

Each check is a separate function that returns a Reason or None. A probe that
could not be read (a VM without thermal zones, a kernel without PSI) never
closes the gate by itself: it is listed in `Decision.notes`.

The disk check holds while less than gate_min_free_bytes is free under renders/:
before a dequeue the worker does not know the next job, so the margin alone
decides; admission of a job then asks for its output estimate on top of it
(h3render.worker.render).
"""

from __future__ import annotations

import re
import time
from enum import Enum
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from h3render.settings import Settings
from h3render.worker.probes import (
    MemoryPressure,
    PmsetSettings,
    PmsetTherm,
    PowerSource,
    Psi,
    PsutilBattery,
    PsutilTemp,
    Sysctl,
    ThermalState,
    ThermalZone,
    VirtualMemory,
    VmStat,
)

_PRESSURE_NAMES = {1: "normal", 2: "warn", 4: "critical"}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryReading(_Model):
    total_bytes: int | None = None
    available_bytes: int | None = None  # psutil available (macOS: inactive + free, optimistic)
    pressure_level: int | None = None  # macOS kern.memorystatus_vm_pressure_level
    free_percent: int | None = None  # macOS kern.memorystatus_level
    swap_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    compressor_bytes: int | None = None  # macOS: physical memory held by the compressor
    psi_some_avg10: float | None = None  # Linux /proc/pressure/memory
    psi_full_avg10: float | None = None


class ZoneReading(_Model):
    name: str  # sensor or zone type, e.g. "x86_pkg_temp", "coretemp/Package id 0"
    temp_c: float
    limit_c: float | None = None


class ThermalReading(_Model):
    state: ThermalState | None = None  # macOS ProcessInfo.thermalState
    cpu_speed_limit: int | None = None  # Intel Mac pmset -g therm
    zones: list[ZoneReading] = []
    throttle_count: int | None = None  # Linux: sum of thermal_throttle counters since boot


class PowerReading(_Model):
    on_battery: bool | None = None
    battery_percent: float | None = None
    low_power_mode: bool | None = None


class DiskReading(_Model):
    path: str | None = None  # the renders folder (or its nearest existing parent) measured
    free_bytes: int | None = None  # free to an unprivileged writer (statvfs f_bavail)
    total_bytes: int | None = None


class Readings(_Model):
    """One snapshot of everything the gate looks at; `errors` lists probes that failed."""

    time: float = Field(default_factory=time.time)
    platform: str = ""
    memory: MemoryReading = MemoryReading()
    thermal: ThermalReading = ThermalReading()
    power: PowerReading = PowerReading()
    disk: DiskReading = DiskReading()
    errors: list[str] = []


class Check(str, Enum):
    memory = "memory"
    thermal = "thermal"
    power = "power"
    redis = "redis"  # the worker's Redis refuses writes or is gone (h3render.worker.outage)
    disk = "disk"


class Reason(_Model):
    check: Check
    code: str  # stable identifier, e.g. "macos_pressure", "psi_full", "battery"
    message: str


class Decision(_Model):
    open: bool
    reasons: list[Reason] = []
    notes: list[str] = []
    time: float = Field(default_factory=time.time)
    readings: Readings | None = None

    @property
    def state(self) -> str:
        """One line for the worker's state and logs."""
        if self.open:
            return "open"
        return "gate closed: " + "; ".join(r.message for r in self.reasons)

    def closed_by(self, check: Check) -> bool:
        return any(r.check == check for r in self.reasons)


# ---------------------------------------------------------------- assembly (pure)


def macos_readings(
    *,
    sysctl: Sysctl | None = None,
    memory_pressure: MemoryPressure | None = None,
    vm_stat: VmStat | None = None,
    virtual_memory: VirtualMemory | None = None,
    thermal_state: ThermalState | None = None,
    therm: PmsetTherm | None = None,
    batt: PowerSource | None = None,
    pm_settings: PmsetSettings | None = None,
    errors: list[str] | None = None,
    at: float | None = None,
) -> Readings:
    """A Readings from parsed macOS outputs; any of them may be missing."""
    swap = sysctl.swap if sysctl else None
    free_pct = sysctl.free_percent if sysctl else None
    if free_pct is None and memory_pressure is not None:
        free_pct = memory_pressure.free_percent
    compressor = vm_stat.compressor_bytes if vm_stat else None
    if compressor is None and memory_pressure is not None:
        compressor = memory_pressure.compressor_bytes
    total = (sysctl.memsize if sysctl else None) or (
        memory_pressure.total_bytes if memory_pressure else None) or (
        virtual_memory.total if virtual_memory else None)
    source = batt.source if batt else None
    batteries = batt.batteries if batt else []
    return Readings(
        time=at if at is not None else time.time(),
        platform="darwin",
        memory=MemoryReading(
            total_bytes=total,
            available_bytes=virtual_memory.available if virtual_memory else None,
            pressure_level=sysctl.pressure_level if sysctl else None,
            free_percent=free_pct,
            swap_total_bytes=swap.total if swap else None,
            swap_used_bytes=swap.used if swap else None,
            compressor_bytes=compressor,
        ),
        thermal=ThermalReading(
            state=thermal_state,
            cpu_speed_limit=therm.cpu_speed_limit if therm else None,
        ),
        power=PowerReading(
            on_battery=batt.on_battery if batt else None,
            battery_percent=batteries[0].percent if batteries else None,
            low_power_mode=pm_settings.low_power_mode(source) if pm_settings else None,
        ),
        errors=list(errors or []),
    )


def linux_readings(
    *,
    psi_memory: Psi | None = None,
    virtual_memory: VirtualMemory | None = None,
    swap_total: int | None = None,
    swap_used: int | None = None,
    zones: dict[str, ThermalZone] | None = None,
    temperatures: dict[str, list[PsutilTemp]] | None = None,
    zone_pattern: str = r".",
    throttle_count: int | None = None,
    battery: PsutilBattery | None = None,
    cgroup_max: int | None = None,
    cgroup_current: int | None = None,
    errors: list[str] | None = None,
    at: float | None = None,
) -> Readings:
    """A Readings from parsed Linux outputs. Thermal zones are chosen by type
    (`zone_pattern`, a regex searched case-insensitively), never by number. A
    cgroup v2 memory limit (a container) caps total and available memory."""
    total = virtual_memory.total if virtual_memory else None
    avail = virtual_memory.available if virtual_memory else None
    if cgroup_max is not None and cgroup_current is not None:
        total = min(total, cgroup_max) if total is not None else cgroup_max
        room = max(cgroup_max - cgroup_current, 0)
        avail = min(avail, room) if avail is not None else room
    pat = re.compile(zone_pattern, re.I)
    found: list[ZoneReading] = []
    for z in (zones or {}).values():
        if z.temp_c is not None and z.type and pat.search(z.type) and z.mode != "disabled":
            found.append(ZoneReading(name=z.type, temp_c=z.temp_c, limit_c=z.limit_c()))
    for sensor, temps in (temperatures or {}).items():
        if not pat.search(sensor):
            continue
        for t in temps:
            if t.current <= 0:  # unpopulated slots read 0.0
                continue
            limit = min((v for v in (t.high, t.critical) if v and v > 0), default=None)
            found.append(ZoneReading(name=f"{sensor}/{t.label}" if t.label else sensor,
                                     temp_c=t.current, limit_c=limit))
    return Readings(
        time=at if at is not None else time.time(),
        platform="linux",
        memory=MemoryReading(
            total_bytes=total,
            available_bytes=avail,
            swap_total_bytes=swap_total,
            swap_used_bytes=swap_used,
            psi_some_avg10=psi_memory.some.avg10 if psi_memory else None,
            psi_full_avg10=psi_memory.full.avg10 if psi_memory and psi_memory.full else None,
        ),
        thermal=ThermalReading(zones=found, throttle_count=throttle_count),
        power=PowerReading(
            on_battery=(not battery.power_plugged) if battery and battery.power_plugged
            is not None else None,
            battery_percent=battery.percent if battery else None,
        ),
        errors=list(errors or []),
    )


# ---------------------------------------------------------------- checks


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


def _macos_pressure(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    lvl = r.memory.pressure_level
    if lvl is not None and lvl >= s.gate_macos_pressure_hold_level:
        name = _PRESSURE_NAMES.get(lvl, str(lvl))
        return Reason(check=Check.memory, code="macos_pressure",
                      message=f"memory pressure {name} (level {lvl}; holding at level >= "
                              f"{s.gate_macos_pressure_hold_level})")
    return None


def _macos_free(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    pct = r.memory.free_percent
    if pct is not None and pct < s.gate_macos_memorystatus_min:
        return Reason(check=Check.memory, code="macos_free",
                      message=f"system memory free {pct}% < {s.gate_macos_memorystatus_min}%")
    return None


def _psi(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    m = r.memory
    if m.psi_full_avg10 is not None and m.psi_full_avg10 > s.gate_psi_full_avg10_max:
        return Reason(check=Check.memory, code="psi_full",
                      message=f"memory PSI full avg10 {m.psi_full_avg10:.2f}% > "
                              f"{s.gate_psi_full_avg10_max:g}% (all tasks stalled on memory)")
    if m.psi_some_avg10 is not None and m.psi_some_avg10 > s.gate_psi_some_avg10_max:
        return Reason(check=Check.memory, code="psi_some",
                      message=f"memory PSI some avg10 {m.psi_some_avg10:.2f}% > "
                              f"{s.gate_psi_some_avg10_max:g}%")
    return None


def _available(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    m = r.memory
    if m.available_bytes is None or not m.total_bytes:
        return None
    frac = m.available_bytes / m.total_bytes
    if frac < s.gate_min_available_fraction:
        return Reason(check=Check.memory, code="available",
                      message=f"available memory {_gib(m.available_bytes)} of "
                              f"{_gib(m.total_bytes)} ({frac:.0%}) < "
                              f"{s.gate_min_available_fraction:.0%}")
    return None


def _swap(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    m = r.memory
    if not m.swap_total_bytes or m.swap_used_bytes is None:
        return None
    if m.swap_used_bytes < s.gate_swap_used_min_bytes:
        return None  # a little swap in use is normal; only a full, large swap is a sign
    frac = m.swap_used_bytes / m.swap_total_bytes
    if frac > s.gate_max_swap_used_fraction:
        return Reason(check=Check.memory, code="swap",
                      message=f"swap {_gib(m.swap_used_bytes)} of {_gib(m.swap_total_bytes)} "
                              f"used ({frac:.0%}) > {s.gate_max_swap_used_fraction:.0%}")
    return None


def _compressor(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    m = r.memory
    if m.compressor_bytes is None or not m.total_bytes:
        return None
    frac = m.compressor_bytes / m.total_bytes
    if frac > s.gate_max_compressor_fraction:
        return Reason(check=Check.memory, code="compressor",
                      message=f"compressed memory {_gib(m.compressor_bytes)} "
                              f"({frac:.0%} of RAM) > {s.gate_max_compressor_fraction:.0%}")
    return None


def _thermal_state(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    st = r.thermal.state
    if st is not None and st.rank >= s.gate_thermal_state_hold:
        hold = list(ThermalState)[s.gate_thermal_state_hold].value
        return Reason(check=Check.thermal, code="thermal_state",
                      message=f"thermal state {st.value} (holding at {hold} or worse)")
    return None


def _speed_limit(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    lim = r.thermal.cpu_speed_limit
    if lim is not None and lim < s.gate_cpu_speed_limit_min:
        return Reason(check=Check.thermal, code="cpu_speed_limit",
                      message=f"CPU_Speed_Limit {lim}% < {s.gate_cpu_speed_limit_min}% "
                              "(the CPU is being throttled for heat)")
    return None


def _zones(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    hot = [z for z in r.thermal.zones
           if z.limit_c is not None and z.temp_c >= z.limit_c - s.gate_thermal_trip_margin_c]
    if hot:
        z = max(hot, key=lambda z: z.temp_c - z.limit_c)
        return Reason(check=Check.thermal, code="zone",
                      message=f"{z.name} at {z.temp_c:.1f} °C, within "
                              f"{s.gate_thermal_trip_margin_c:g} °C of its {z.limit_c:.1f} °C trip"
                              + (f" (+{len(hot) - 1} more)" if len(hot) > 1 else ""))
    return None


def _throttle(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    now, before = r.thermal.throttle_count, prev.thermal.throttle_count if prev else None
    if now is not None and before is not None and now > before:
        return Reason(check=Check.thermal, code="throttle",
                      message=f"CPU thermal throttling: {now - before} new events since the "
                              "last check")
    return None


def _battery(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    if r.power.on_battery and not s.allow_battery:
        pct = r.power.battery_percent
        return Reason(check=Check.power, code="battery",
                      message="on battery power" + (f" ({pct:.0f}%)" if pct is not None else "")
                              + "; set H3RENDER_ALLOW_BATTERY=1 to render anyway")
    return None


def _low_power(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    if r.power.low_power_mode and not s.allow_low_power:
        return Reason(check=Check.power, code="low_power",
                      message="Low Power Mode is on; set H3RENDER_ALLOW_LOW_POWER=1 to render "
                              "anyway")
    return None


def format_bytes(n: int) -> str:
    """1536 -> "1.5 KiB": the unit that keeps the figure between 1 and 1024."""
    v = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{int(v)} bytes" if unit == "bytes" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} GiB"


def _disk(r: Readings, s: Settings, prev: Readings | None) -> Reason | None:
    d = r.disk
    if d.free_bytes is not None and d.free_bytes < s.gate_min_free_bytes:
        return Reason(check=Check.disk, code="disk_free",
                      message=f"disk: {format_bytes(d.free_bytes)} free under {d.path}, below the "
                              f"{format_bytes(s.gate_min_free_bytes)} margin "
                              "(H3RENDER_GATE_MIN_FREE_BYTES)")
    return None


CHECKS: list[Callable[[Readings, Settings, Readings | None], Reason | None]] = [
    _macos_pressure, _macos_free, _psi, _available, _swap, _compressor,
    _thermal_state, _speed_limit, _zones, _throttle,
    _battery, _low_power, _disk,
]
THERMAL_CHECKS = [_thermal_state, _speed_limit, _zones, _throttle]


def decide(readings: Readings, settings: Settings, previous: Readings | None = None,
           checks=None) -> Decision:
    """Open unless some check gives a reason. `previous` is the last snapshot
    (counters such as thermal throttling compare against it)."""
    reasons = [x for c in (checks or CHECKS) if (x := c(readings, settings, previous))]
    notes = list(readings.errors)
    m = readings.memory
    if m.pressure_level is None and m.psi_some_avg10 is None and m.available_bytes is None:
        notes.append("no memory pressure reading on this machine")
    return Decision(open=not reasons, reasons=reasons, notes=notes, time=readings.time,
                    readings=readings)


def decide_thermal(readings: Readings, settings: Settings,
                   previous: Readings | None = None) -> Decision:
    """Only the thermal checks: used between denoising steps to pause a running job."""
    return decide(readings, settings, previous, checks=THERMAL_CHECKS)
