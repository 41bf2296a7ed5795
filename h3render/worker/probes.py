"""Pure parsers for the outputs the health gate reads, one per source.

Every function takes the text a command printed (or a file held) and returns a
typed, frozen pydantic model. None of them runs anything: the OS readers live in
h3render/worker/sensors.py and hand their captured text to these, so the tests
can feed the real recorded outputs under ../shared/probe-samples/.

Sources (macOS unless marked):
    memory_pressure [-Q]            parse_memory_pressure
    sysctl a.b c.d                  parse_sysctl  (+ parse_swapusage for vm.swapusage)
    vm_stat                         parse_vm_stat
    pmset -g therm | thermlog       parse_pmset_therm
    pmset -g batt                   parse_pmset_batt
    pmset -g | pmset -g custom      parse_pmset_settings
    powermetrics (root only)        parse_powermetrics
    ProcessInfo.thermalState        parse_thermal_state
    /proc/pressure/<res> (Linux)    parse_psi, parse_psi_tree (grep -R form)
    /sys/class/thermal (Linux)      parse_thermal_grep, parse_thermal_types, parse_thermal_listing
    psutil reprs                    parse_psutil_battery, parse_psutil_temperatures,
                                    parse_psutil_virtual_memory, parse_ncpa_virtual

Failures raise ProbeError (malformed text) or its subclass ProbeUnavailable
(the source printed that it does not exist here); both name the source.
"""

from __future__ import annotations

import json
import re
from enum import Enum

from pydantic import BaseModel, ConfigDict

_UNITS = {"B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class ProbeError(ValueError):
    """The text is not what `source` prints; the message quotes the offending part."""

    def __init__(self, source: str, message: str):
        super().__init__(f"{source}: {message}")
        self.source = source


class ProbeUnavailable(ProbeError):
    """The source reported that it does not exist or is not readable on this machine."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]


def _check_os_error(source: str, text: str) -> None:
    """Raise ProbeUnavailable when `text` is a shell/tool error instead of output."""
    for ln in _lines(text):
        m = re.search(r"(No such file or directory|Operation not supported|Permission denied"
                      r"|unknown oid|AttributeError: .*)$", ln)
        if m and not re.match(r"^\s*(some|full)\s+avg10=", ln):
            raise ProbeUnavailable(source, f"not available on this machine ({ln.strip()!r})")


# ---------------------------------------------------------------- memory_pressure


class MemoryPressure(_Model):
    """`memory_pressure` (or `memory_pressure -Q`): the kernel's free percentage.

    free_percent equals sysctl kern.memorystatus_level. The page statistics are
    present only without -Q.
    """

    total_bytes: int | None = None
    page_size: int | None = None
    free_percent: int
    pages: dict[str, int] = {}

    @property
    def compressor_bytes(self) -> int | None:
        n = self.pages.get("used by compressor")
        return None if n is None or self.page_size is None else n * self.page_size

    @property
    def swapouts(self) -> int | None:
        return self.pages.get("swapouts")


def parse_memory_pressure(text: str) -> MemoryPressure:
    src = "memory_pressure"
    total = page = free = None
    pages: dict[str, int] = {}
    for ln in _lines(text):
        s = ln.strip()
        m = re.match(r"The system has (\d+) \((\d+) pages with a page size of (\d+)\)", s)
        if m:
            total, page = int(m[1]), int(m[3])
            continue
        m = re.match(r"System-wide memory free percentage:\s*(\d+)\s*%", s)
        if m:
            free = int(m[1])
            continue
        m = re.match(r"(Pages [A-Za-z -]+?|Swapins|Swapouts|Pageins|Pageouts):\s*(\d+)$", s)
        if m:
            key = m[1].lower().removeprefix("pages ").strip()
            pages[key] = int(m[2])
    if free is None:
        _check_os_error(src, text)
        raise ProbeError(src, "no 'System-wide memory free percentage: N%' line")
    if not 0 <= free <= 100:
        raise ProbeError(src, f"free percentage {free} is outside 0..100")
    return MemoryPressure(total_bytes=total, page_size=page, free_percent=free, pages=pages)


# ---------------------------------------------------------------- sysctl


class SwapUsage(_Model):
    """vm.swapusage in bytes."""

    total: int
    used: int
    free: int
    encrypted: bool

    @property
    def used_fraction(self) -> float:
        return self.used / self.total if self.total else 0.0


def _size(source: str, token: str) -> int:
    m = re.fullmatch(r"(\d+)(?:[.,](\d+))?([BKMGT])", token)
    if not m:
        raise ProbeError(source, f"size {token!r} is not NUMBER[.,]DECIMALS followed by B/K/M/G/T")
    whole, frac, unit = m[1], m[2] or "0", m[3]
    # Exact integer arithmetic: "1024,00M" and "1024.00M" are the same size. A comma
    # is the decimal separator of some locales (the reader runs sysctl with LC_ALL=C).
    num = int(whole) * 10 ** len(frac) + int(frac)
    return num * _UNITS[unit] // 10 ** len(frac)


def parse_swapusage(text: str) -> SwapUsage:
    """`vm.swapusage: total = 4096.00M  used = 2743.50M  free = 1352.50M  (encrypted)`.

    Accepts the whole sysctl line or only its value.
    """
    src = "vm.swapusage"
    m = re.search(r"total\s*=\s*(\S+)\s+used\s*=\s*(\S+)\s+free\s*=\s*(\S+)(.*)$", text.strip())
    if not m:
        raise ProbeError(src, f"expected 'total = X used = Y free = Z', got {text.strip()[:80]!r}")
    total, used, free = (_size(src, t) for t in (m[1], m[2], m[3]))
    if used > total:
        raise ProbeError(src, f"used {m[2]} is larger than total {m[1]}")
    return SwapUsage(total=total, used=used, free=free, encrypted="encrypted" in m[4])


class Sysctl(_Model):
    """`sysctl name...` output: values by name, plus the tool's error lines."""

    values: dict[str, str]
    errors: list[str] = []

    def int(self, name: str) -> int | None:
        v = self.values.get(name)
        if v is None:
            return None
        try:
            return int(v)
        except ValueError:
            raise ProbeError("sysctl", f"{name} = {v!r} is not an integer") from None

    @property
    def pressure_level(self) -> int | None:
        """kern.memorystatus_vm_pressure_level: 1 normal, 2 warn, 4 critical."""
        lvl = self.int("kern.memorystatus_vm_pressure_level")
        if lvl is not None and lvl not in (0, 1, 2, 4):
            raise ProbeError("sysctl", f"kern.memorystatus_vm_pressure_level = {lvl}; "
                             "known levels are 1 (normal), 2 (warn), 4 (critical)")
        return lvl

    @property
    def free_percent(self) -> int | None:
        """kern.memorystatus_level: what memory_pressure prints as free percentage."""
        return self.int("kern.memorystatus_level")

    @property
    def swap(self) -> SwapUsage | None:
        v = self.values.get("vm.swapusage")
        return None if v is None else parse_swapusage(v)

    @property
    def memsize(self) -> int | None:
        return self.int("hw.memsize")


def parse_sysctl(text: str) -> Sysctl:
    """Lines `name: value` (names always hold a dot). Other lines (a script's
    markers) are ignored; `sysctl: unknown oid ...` lines are kept as errors."""
    values: dict[str, str] = {}
    errors: list[str] = []
    for ln in _lines(text):
        m = re.match(r"^([A-Za-z_][\w]*(?:\.[\w]+)+)\s*[:=]\s?(.*)$", ln.strip())
        if m:
            values[m[1]] = m[2].strip()
        elif ln.strip().startswith("sysctl:"):
            errors.append(ln.strip())
    if not values:
        if errors:
            raise ProbeUnavailable("sysctl", "; ".join(errors))
        raise ProbeError("sysctl", "no 'name: value' lines")
    return Sysctl(values=values, errors=errors)


# ---------------------------------------------------------------- vm_stat


class VmStat(_Model):
    """`vm_stat`: page counters by label (lower case, without 'Pages ')."""

    page_size: int
    pages: dict[str, int]

    def bytes(self, label: str) -> int | None:
        n = self.pages.get(label)
        return None if n is None else n * self.page_size

    @property
    def compressor_bytes(self) -> int | None:
        """Physical memory the compressor holds ("Pages occupied by compressor")."""
        return self.bytes("occupied by compressor")

    @property
    def free_bytes(self) -> int | None:
        return self.bytes("free")


def parse_vm_stat(text: str) -> VmStat:
    """Parse by label, never by column: widths differ between macOS versions."""
    src = "vm_stat"
    page = None
    pages: dict[str, int] = {}
    for ln in _lines(text):
        m = re.search(r"page size of (\d+) bytes", ln)
        if m:
            page = int(m[1])
            continue
        m = re.match(r'^\s*"?([A-Za-z][A-Za-z -]*?)"?:\s+(\d+)\.?\s*$', ln)
        if m:
            pages[m[1].lower().removeprefix("pages ").strip()] = int(m[2])
    if page is None:
        _check_os_error(src, text)
        raise ProbeError(src, "no '(page size of N bytes)' header")
    if page <= 0 or page & (page - 1):
        raise ProbeError(src, f"page size {page} is not a power of two")
    if "free" not in pages:
        raise ProbeError(src, "no 'Pages free' line")
    return VmStat(page_size=page, pages=pages)


# ---------------------------------------------------------------- pmset


class PmsetTherm(_Model):
    """`pmset -g therm` / `pmset -g thermlog`: the last CPU power notification.

    Apple Silicon prints only 'Note: No ... has been recorded' lines, so every
    field is None there; ProcessInfo.thermalState is the source on those Macs.
    """

    cpu_speed_limit: int | None = None
    cpu_scheduler_limit: int | None = None
    cpu_available_cpus: int | None = None
    thermal_warning_level: int | None = None
    performance_warning_level: int | None = None
    notes: list[str] = []


def parse_pmset_therm(text: str) -> PmsetTherm:
    src = "pmset -g therm"
    fields: dict[str, int] = {}
    notes: list[str] = []
    seen = False
    for ln in _lines(text):
        s = ln.strip()
        if not s:
            continue
        if s.startswith("Note:"):
            notes.append(s)
            seen = True
            continue
        m = re.match(r"^(CPU_Speed_Limit|CPU_Scheduler_Limit|CPU_Available_CPUs)\s*=\s*(\d+)$", s)
        if m:
            fields[m[1].lower()] = int(m[2])  # a later notification replaces an earlier one
            seen = True
            continue
        m = re.match(r"^(Thermal|Performance) warning level\s*(?:=|:|is)?\s*(\d+)", s, re.I)
        if m:
            fields[f"{m[1].lower()}_warning_level"] = int(m[2])
            seen = True
            continue
        if re.search(r"CPU Power notify|Thermal (warning|level)|Performance warning", s):
            seen = True
    if not seen:
        _check_os_error(src, text)
        raise ProbeError(src, f"no thermal lines (first line: {_first(text)!r})")
    if "cpu_speed_limit" in fields and not 0 <= fields["cpu_speed_limit"] <= 100:
        raise ProbeError(src, f"CPU_Speed_Limit = {fields['cpu_speed_limit']} is outside 0..100")
    return PmsetTherm(**fields, notes=notes)


class Battery(_Model):
    name: str
    percent: float
    state: str  # "charging", "discharging", "charged", "AC attached", "finishing charge"
    remaining_minutes: int | None = None
    present: bool = True


class PowerSource(_Model):
    """`pmset -g batt`: what the machine draws from, and each battery."""

    source: str  # "AC Power", "Battery Power", "UPS Power"
    batteries: list[Battery] = []

    @property
    def on_battery(self) -> bool:
        return self.source == "Battery Power"


def parse_pmset_batt(text: str) -> PowerSource:
    src = "pmset -g batt"
    source = None
    batteries: list[Battery] = []
    for ln in _lines(text):
        m = re.match(r"^Now drawing from '([^']+)'", ln.strip())
        if m:
            source = m[1]
            continue
        m = re.match(r"^\s*-?(\S+?)(?:\s+\(id=\d+\))?\s+(\d+(?:\.\d+)?)%;\s*([^;]+);\s*(.*)$", ln)
        if m:
            rest = m[4]
            t = re.search(r"(\d+):(\d\d) remaining", rest)
            batteries.append(Battery(
                name=m[1].lstrip("-"),
                percent=float(m[2]),
                state=m[3].strip(),
                remaining_minutes=int(t[1]) * 60 + int(t[2]) if t else None,
                present="present: false" not in rest,
            ))
    if source is None:
        _check_os_error(src, text)
        raise ProbeError(src, f"no \"Now drawing from '...'\" line (first line: {_first(text)!r})")
    return PowerSource(source=source, batteries=batteries)


class PmsetSettings(_Model):
    """`pmset -g` (sections 'System-wide power settings', 'Currently in use') or
    `pmset -g custom` (sections 'Battery Power', 'AC Power'): name -> value."""

    sections: dict[str, dict[str, str]]

    def low_power_mode(self, source: str | None = None) -> bool | None:
        """Whether Low Power Mode is on: `lowpowermode 1`, or `powermode 1`
        (0 automatic, 1 low power, 2 high power). Looks at 'Currently in use',
        else at the section of `source` (as pmset -g batt names it), else at any
        section. None when no section has either setting."""
        order = ["Currently in use"] + ([source] if source else []) + list(self.sections)
        for name in order:
            sec = self.sections.get(name, {})
            for key in ("lowpowermode", "powermode"):
                if key in sec:
                    return sec[key].split()[0] == "1"
        return None


def parse_pmset_settings(text: str) -> PmsetSettings:
    src = "pmset -g"
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for ln in _lines(text):
        if not ln.strip():
            continue
        if not ln[0].isspace() and ln.rstrip().endswith(":"):
            current = sections.setdefault(ln.strip()[:-1], {})
            continue
        # Markdown emphasis (**name value**) around a line is a paste artifact.
        s = ln.strip().strip("*").strip()
        m = re.match(r"^(.+?)\s+(\S+(?:\s+\(.*\))?|/\S+)$", s)
        if m and current is not None:
            current[m[1].strip()] = m[2].strip()
    if not any(sections.values()):
        _check_os_error(src, text)
        raise ProbeError(src, f"no 'Section:' followed by 'name value' lines "
                              f"(first line: {_first(text)!r})")
    return PmsetSettings(sections=sections)


# ---------------------------------------------------------------- thermal state (macOS)


class ThermalState(str, Enum):
    """NSProcessInfoThermalState, in raw-value order."""

    nominal = "nominal"
    fair = "fair"
    serious = "serious"
    critical = "critical"

    @property
    def rank(self) -> int:
        return list(ThermalState).index(self)


def parse_thermal_state(text: str) -> ThermalState:
    """'nominal' | 'fair' | 'serious' | 'critical', or the raw value 0..3."""
    s = text.strip().splitlines()[-1].strip().lower() if text.strip() else ""
    if s.isdigit() and int(s) < 4:
        return list(ThermalState)[int(s)]
    try:
        return ThermalState(s)
    except ValueError:
        raise ProbeError("ProcessInfo.thermalState",
                         f"{s!r} is not one of nominal, fair, serious, critical or 0..3") from None


class PowermetricsSample(_Model):
    cpu_thermal_level: int | None = None
    cpu_die_temp_c: float | None = None
    prochots: int | None = None
    pressure_level: str | None = None  # "Nominal", "Moderate", "Heavy", "Trapping", "Sleeping"


def parse_powermetrics(text: str) -> list[PowermetricsSample]:
    """`powermetrics --samplers smc|thermal` (needs root: never run by the worker;
    kept to read captured logs). One sample per '*** Sampled system activity'."""
    src = "powermetrics"
    chunks = re.split(r"\*\*\* Sampled system activity", text)[1:]
    out = []
    for c in chunks:
        def grab(pat: str, conv):
            m = re.search(pat, c)
            return conv(m[1]) if m else None
        out.append(PowermetricsSample(
            cpu_thermal_level=grab(r"CPU Thermal level:\s*(\d+)", int),
            cpu_die_temp_c=grab(r"CPU die temperature:\s*([\d.]+)", float),
            prochots=grab(r"Number of prochots:\s*(\d+)", int),
            pressure_level=grab(r"Current pressure level:\s*(\w+)", str),
        ))
    if not out:
        _check_os_error(src, text)
        raise ProbeError(src, "no '*** Sampled system activity' sample")
    return out


# ---------------------------------------------------------------- Linux PSI


class PsiLine(_Model):
    avg10: float
    avg60: float
    avg300: float
    total: int  # microseconds stalled since boot


class Psi(_Model):
    """One /proc/pressure/<resource> file. `full` is None for cpu before kernel 5.13."""

    some: PsiLine
    full: PsiLine | None = None


_PSI_RE = re.compile(r"^(some|full)\s+avg10=([\d.]+)\s+avg60=([\d.]+)\s+avg300=([\d.]+)"
                     r"\s+total=(\d+)\s*$")


def _psi_line(src: str, kind_and_rest: str) -> tuple[str, PsiLine]:
    m = _PSI_RE.match(kind_and_rest.strip())
    if not m:
        raise ProbeError(src, f"line {kind_and_rest.strip()[:80]!r} is not "
                              "'some|full avg10=F avg60=F avg300=F total=N'")
    line = PsiLine(avg10=float(m[2]), avg60=float(m[3]), avg300=float(m[4]), total=int(m[5]))
    if any(not 0.0 <= v <= 100.0 for v in (line.avg10, line.avg60, line.avg300)):
        raise ProbeError(src, f"averages in {kind_and_rest.strip()!r} are outside 0..100")
    return m[1], line


def parse_psi(text: str, source: str = "/proc/pressure") -> Psi:
    """The contents of one PSI file."""
    lines = [ln for ln in _lines(text) if ln.strip()]
    _check_os_error(source, text)
    got: dict[str, PsiLine] = {}
    for ln in lines:
        kind, line = _psi_line(source, ln)
        got[kind] = line
    if "some" not in got:
        raise ProbeError(source, "no 'some avg10=...' line" if not lines else
                         f"no 'some' line among {len(lines)} lines")
    return Psi(some=got["some"], full=got.get("full"))


def parse_psi_tree(text: str) -> dict[str, Psi]:
    """`grep -R . /proc/pressure/`: resource name ('cpu', 'io', 'memory') -> Psi."""
    src = "grep -R . /proc/pressure/"
    by_res: dict[str, list[str]] = {}
    for ln in _lines(text):
        if not ln.strip():
            continue
        m = re.match(r"^/proc/pressure/(\w+):(.*)$", ln)
        if not m:
            raise ProbeError(src, f"line {ln[:80]!r} is not '/proc/pressure/<res>:<line>'")
        by_res.setdefault(m[1], []).append(m[2])
    if not by_res:
        raise ProbeError(src, "empty output")
    return {res: parse_psi("\n".join(ls), f"/proc/pressure/{res}") for res, ls in by_res.items()}


# ---------------------------------------------------------------- Linux thermal zones


class Trip(_Model):
    index: int
    temp_c: float | None = None
    type: str | None = None  # "active", "passive", "hot", "critical"
    hyst_c: float | None = None


class ThermalZone(_Model):
    """One /sys/class/thermal/thermal_zoneN. Temperatures in °C (files hold m°C)."""

    name: str
    type: str | None = None
    temp_c: float | None = None
    mode: str | None = None
    trips: list[Trip] = []

    def limit_c(self) -> float | None:
        """Lowest trip at which the kernel starts acting (passive/hot/critical),
        ignoring 0 m°C placeholders; an untyped trip counts. None when no trip."""
        temps = [t.temp_c for t in self.trips
                 if t.temp_c and t.temp_c > 0 and (t.type in (None, "passive", "hot", "critical"))]
        return min(temps) if temps else None


def parse_thermal_grep(text: str) -> dict[str, ThermalZone]:
    """`grep -r . /sys/class/thermal/thermal_zone*`: zone name -> ThermalZone.
    grep's own 'Input/output error' lines (unreadable attributes) are skipped."""
    src = "/sys/class/thermal"
    raw: dict[str, dict[str, str]] = {}
    for ln in _lines(text):
        if not ln.strip() or ln.startswith("grep:"):
            continue
        m = re.match(r"^\S*/(thermal_zone\d+)/([\w/]+):(.*)$", ln)
        if not m:
            raise ProbeError(src, f"line {ln[:80]!r} is not '<path>/thermal_zoneN/<attr>:<value>'")
        raw.setdefault(m[1], {})[m[2]] = m[3].strip()
    if not raw:
        raise ProbeError(src, "no thermal_zoneN attribute lines")
    return {name: _zone(src, name, attrs) for name, attrs in raw.items()}


def _milli(src: str, name: str, key: str, v: str) -> float:
    try:
        return int(v) / 1000.0
    except ValueError:
        raise ProbeError(src, f"{name}/{key} = {v!r} is not an integer in millidegrees") from None


def _zone(src: str, name: str, attrs: dict[str, str]) -> ThermalZone:
    trips: dict[int, dict] = {}
    for key, v in attrs.items():
        m = re.fullmatch(r"trip_point_(\d+)_(temp|type|hyst)", key)
        if not m:
            continue
        t = trips.setdefault(int(m[1]), {"index": int(m[1])})
        if m[2] == "type":
            t["type"] = v
        else:
            t[f"{m[2]}_c"] = _milli(src, name, key, v)
    temp = attrs.get("temp")
    return ThermalZone(
        name=name, type=attrs.get("type"), mode=attrs.get("mode"),
        temp_c=_milli(src, name, "temp", temp) if temp is not None else None,
        trips=[Trip(**trips[i]) for i in sorted(trips)],
    )


def parse_thermal_types(text: str) -> dict[str, str]:
    """`tail .../thermal_zone*/type` (the '==> path <==' form): zone -> type."""
    src = "thermal_zone*/type"
    out: dict[str, str] = {}
    zone = None
    for ln in _lines(text):
        m = re.match(r"^==> .*/(thermal_zone\d+)/type <==$", ln.strip())
        if m:
            zone = m[1]
        elif ln.strip() and zone is not None:
            out[zone] = ln.strip()
            zone = None
    if not out:
        raise ProbeError(src, "no '==> .../thermal_zoneN/type <==' headers followed by a type")
    return out


def parse_thermal_listing(text: str) -> list[str]:
    """`ls -la /sys/class/thermal`: names of thermal_zoneN entries (a VM has none)."""
    names = []
    for ln in _lines(text):
        parts = ln.split()
        if not parts or parts[0] == "total":
            continue
        if not re.match(r"^[dl-][rwxst-]{9}", parts[0]):
            raise ProbeError("ls /sys/class/thermal", f"line {ln[:80]!r} is not an ls -l entry")
        name = parts[-3] if "->" in parts else parts[-1]
        if name.startswith("thermal_zone"):
            names.append(name)
    return sorted(names, key=lambda n: int(n.removeprefix("thermal_zone") or 0))


# ---------------------------------------------------------------- psutil reprs


def _kv(src: str, body: str) -> dict[str, str]:
    out = {}
    for m in re.finditer(r"(\w+)=('(?:[^'\\]|\\.)*'|<[^>]*>|[^,()]+)", body):
        out[m[1]] = m[2].strip()
    if not out:
        raise ProbeError(src, f"no name=value fields in {body[:80]!r}")
    return out


def _num(src: str, key: str, v: str | None) -> float | None:
    if v is None or v == "None":
        return None
    m = re.fullmatch(r"<[\w.]+: (-?\d+)>", v)  # <BatteryTime.POWER_TIME_UNLIMITED: -2>
    try:
        return float(m[1] if m else v)
    except ValueError:
        raise ProbeError(src, f"{key}={v!r} is not a number") from None


class PsutilBattery(_Model):
    """psutil.sensors_battery(); secsleft None when unknown or unlimited (plugged)."""

    percent: float
    secsleft: int | None
    power_plugged: bool | None


def parse_psutil_battery(text: str) -> list[PsutilBattery]:
    """Every `sbattery(...)` repr in `text` (a REPL log may hold several), oldest
    first. An empty list means `None` was printed: no battery (a desktop)."""
    src = "psutil.sensors_battery"
    out = []
    for m in re.finditer(r"sbattery\(([^)]*)\)", text):
        kv = _kv(src, m[1])
        secs = _num(src, "secsleft", kv.get("secsleft"))
        plugged = kv.get("power_plugged")
        out.append(PsutilBattery(
            percent=_num(src, "percent", kv.get("percent")),
            secsleft=int(secs) if secs is not None and secs >= 0 else None,  # -1/-2 sentinels
            power_plugged=None if plugged in (None, "None") else plugged == "True",
        ))
    if not out and not re.search(r"^\s*None\s*$", text, re.M):
        _check_os_error(src, text)
        raise ProbeError(src, "no 'sbattery(...)' repr and no 'None'")
    return out


class PsutilTemp(_Model):
    label: str
    current: float
    high: float | None = None
    critical: float | None = None


def parse_psutil_temperatures(text: str) -> dict[str, list[PsutilTemp]]:
    """psutil.sensors_temperatures() repr: sensor -> readings (labels may repeat on
    multi-socket machines). A cut-off repr yields what was complete. On macOS the
    function does not exist: that AttributeError raises ProbeUnavailable."""
    src = "psutil.sensors_temperatures"
    if re.search(r"AttributeError:.*sensors_temperatures", text):
        raise ProbeUnavailable(src, "not provided by psutil on this platform (AttributeError)")
    out: dict[str, list[PsutilTemp]] = {}
    key = None
    for m in re.finditer(r"'([^']+)'\s*:\s*\[|shwtemp\(([^)]*)\)", text):
        if m[1] is not None:
            key = m[1]
            out.setdefault(key, [])
            continue
        if key is None:
            raise ProbeError(src, "shwtemp(...) before any 'sensor': [")
        kv = _kv(src, m[2])
        cur = _num(src, "current", kv.get("current"))
        if cur is None:
            raise ProbeError(src, f"shwtemp without current in {m[0][:80]!r}")
        out[key].append(PsutilTemp(label=kv.get("label", "''").strip("'"), current=cur,
                                   high=_num(src, "high", kv.get("high")),
                                   critical=_num(src, "critical", kv.get("critical"))))
    if not out:
        raise ProbeError(src, "no \"'sensor': [shwtemp(...)]\" entries")
    return out


class VirtualMemory(_Model):
    """psutil.virtual_memory() in bytes. On macOS `available` is inactive + free,
    which overstates headroom when memory is compressed."""

    total: int
    available: int
    percent: float
    used: int | None = None
    free: int | None = None
    active: int | None = None
    inactive: int | None = None
    wired: int | None = None


def parse_psutil_virtual_memory(text: str) -> VirtualMemory:
    src = "psutil.virtual_memory"
    m = re.search(r"svmem\(([^)]*)\)", text)
    if not m:
        _check_os_error(src, text)
        raise ProbeError(src, "no 'svmem(...)' repr")
    kv = _kv(src, m[1])
    for need in ("total", "available", "percent"):
        if need not in kv:
            raise ProbeError(src, f"svmem has no {need}=")
    vals = {k: _num(src, k, v) for k, v in kv.items() if k in VirtualMemory.model_fields}
    return VirtualMemory(**{k: (v if k == "percent" else int(v)) for k, v in vals.items()
                            if v is not None})


def parse_ncpa_virtual(text: str) -> VirtualMemory:
    """NCPA's /api/memory/virtual JSON ({"virtual": {"total": [16, "GiB"], ...}}),
    a psutil.virtual_memory() rendered with units."""
    src = "ncpa /api/memory/virtual"
    try:
        doc = json.loads(text)["virtual"]
    except (ValueError, KeyError, TypeError) as e:
        raise ProbeError(src, f"not a JSON object with a 'virtual' key ({e})") from None
    units = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
             "kB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
    vals: dict[str, float] = {}
    for k, v in doc.items():
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], (int, float))):
            raise ProbeError(src, f"{k} = {v!r} is not [number, unit]")
        if k == "percent":
            vals[k] = float(v[0])
        elif v[1] in units:
            vals[k] = int(round(v[0] * units[v[1]]))
        else:
            raise ProbeError(src, f"{k} unit {v[1]!r} is not one of {sorted(units)}")
    for need in ("total", "available", "percent"):
        if need not in vals:
            raise ProbeError(src, f"no '{need}' entry")
    return VirtualMemory(**{k: v for k, v in vals.items() if k in VirtualMemory.model_fields})


def _first(text: str) -> str:
    for ln in _lines(text):
        if ln.strip():
            return ln.strip()[:80]
    return ""
