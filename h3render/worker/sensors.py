"""Thin OS readers: capture what the machine says, hand it to the pure parsers.

`read_readings(settings)` returns a health.Readings for this machine:
    macOS: sysctl (LC_ALL=C), vm_stat, pmset -g therm|batt, pmset -g, psutil,
           ProcessInfo.thermalState through the Objective-C runtime (ctypes);
    Linux: /proc/pressure/memory, psutil memory and swap, /sys/class/thermal zones,
           thermal_throttle counters, psutil battery and hwmon temperatures;
    both:  free and total bytes of the filesystem under renders/ (shutil.disk_usage).
A probe that fails adds a line to Readings.errors and never raises.

Never runs `memory_pressure -l/-p` (they allocate memory to simulate pressure)
and never needs root (powermetrics is not used).

Test hook: when H3RENDER_ENABLE_TEST_TRIGGERS=1 and H3RENDER_TEST_READINGS names a
JSON file, the readings come from that file (re-read on every call), so tests can
drive a real worker process through closed and open gates. A file that gives no
disk reading gets the real filesystem's, so a test on a small tmpfs is real.

psutil's results are read from their named tuples' fields (`psutil_temperatures`,
`psutil_battery`), never through repr() and a regex: a sensor label holding a
parenthesis or a quote (hwmon drivers name them freely) would not survive the round
trip. The repr parsers in h3render.worker.probes stay for what only exists as text:
the recorded psutil outputs under tests/fixtures/probe-samples, which pin what each
psutil version printed on real machines; a test checks that both readings agree.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

from h3render.settings import Settings
from h3render.worker import probes as P
from h3render.worker.health import DiskReading, Readings, linux_readings, macos_readings

T = TypeVar("T")
TEST_READINGS_ENV = "H3RENDER_TEST_READINGS"
TRIGGERS_ENV = "H3RENDER_ENABLE_TEST_TRIGGERS"


def _run(cmd: list[str], timeout: float = 10.0) -> str:
    """stdout+stderr of a command in the C locale (decimal points, English labels)."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return res.stdout + res.stderr


def _try(errors: list[str], what: str, fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except (P.ProbeError, OSError, subprocess.SubprocessError, ValueError, AttributeError) as e:
        errors.append(f"{what}: {e}")
        return None


def _psutil_vm() -> P.VirtualMemory:
    import psutil

    vm = psutil.virtual_memory()
    return P.VirtualMemory(total=vm.total, available=vm.available, percent=vm.percent)


def _opt_float(v) -> float | None:
    return None if v is None else float(v)


def psutil_temperatures(data: dict) -> dict[str, list[P.PsutilTemp]]:
    """psutil.sensors_temperatures() (sensor -> [shwtemp]) as probe models, field by field."""
    src = "psutil.sensors_temperatures"
    out: dict[str, list[P.PsutilTemp]] = {}
    for sensor, readings in data.items():
        out[sensor] = []
        for t in readings:
            if t.current is None:
                raise P.ProbeError(src, f"{sensor}: reading {t.label!r} has no current value")
            out[sensor].append(P.PsutilTemp(label=t.label or "", current=float(t.current),
                                            high=_opt_float(t.high),
                                            critical=_opt_float(t.critical)))
    return out


def psutil_battery(b) -> P.PsutilBattery:
    """psutil.sensors_battery()'s sbattery as a probe model; the negative secsleft
    sentinels (POWER_TIME_UNKNOWN, POWER_TIME_UNLIMITED) become None."""
    secs = None if b.secsleft is None else int(b.secsleft)
    return P.PsutilBattery(percent=float(b.percent),
                           secsleft=secs if secs is not None and secs >= 0 else None,
                           power_plugged=b.power_plugged)


# ---------------------------------------------------------------- macOS


def macos_thermal_state() -> P.ThermalState:
    """NSProcessInfo.processInfo.thermalState via objc_msgSend (no root, no Swift).

    objc_msgSend is called through a function pointer of the exact prototype
    (id, SEL) -> NSInteger, as arm64 requires."""
    objc = ctypes.cdll.LoadLibrary(ctypes.util.find_library("objc") or "/usr/lib/libobjc.A.dylib")
    ctypes.cdll.LoadLibrary("/System/Library/Frameworks/Foundation.framework/Foundation")
    objc.objc_getClass.restype = ctypes.c_void_p
    objc.objc_getClass.argtypes = [ctypes.c_char_p]
    objc.sel_registerName.restype = ctypes.c_void_p
    objc.sel_registerName.argtypes = [ctypes.c_char_p]
    addr = ctypes.cast(objc.objc_msgSend, ctypes.c_void_p).value
    send_id = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(addr)
    send_long = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)(addr)
    cls = objc.objc_getClass(b"NSProcessInfo")
    if not cls:
        raise P.ProbeUnavailable("ProcessInfo.thermalState", "NSProcessInfo class not found")
    info = send_id(cls, objc.sel_registerName(b"processInfo"))
    return P.parse_thermal_state(str(send_long(info, objc.sel_registerName(b"thermalState"))))


def read_macos(settings: Settings) -> Readings:
    errors: list[str] = []
    sysctl = _try(errors, "sysctl", lambda: P.parse_sysctl(_run(
        ["sysctl", "kern.memorystatus_vm_pressure_level", "kern.memorystatus_level",
         "vm.swapusage", "hw.memsize"])))
    vm_stat = _try(errors, "vm_stat", lambda: P.parse_vm_stat(_run(["vm_stat"])))
    return macos_readings(
        sysctl=sysctl,
        vm_stat=vm_stat,
        virtual_memory=_try(errors, "psutil", _psutil_vm),
        thermal_state=_try(errors, "thermalState", macos_thermal_state),
        therm=_try(errors, "pmset -g therm",
                   lambda: P.parse_pmset_therm(_run(["pmset", "-g", "therm"]))),
        batt=_try(errors, "pmset -g batt", lambda: P.parse_pmset_batt(_run(["pmset", "-g", "batt"]))),
        pm_settings=_try(errors, "pmset -g",
                         lambda: P.parse_pmset_settings(_run(["pmset", "-g"]))),
        errors=errors,
    )


# ---------------------------------------------------------------- Linux


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _thermal_dump(root: str = "/sys/class/thermal") -> str:
    """The zones' type/temp/mode/trip files as `grep -r .` prints them; unreadable
    attributes (EIO on some ACPI zones) are left out, as grep leaves them out."""
    lines = []
    for zone in sorted(glob.glob(f"{root}/thermal_zone*")):
        for name in ["type", "temp", "mode"] + sorted(
                os.path.basename(p) for p in glob.glob(f"{zone}/trip_point_*")):
            try:
                value = _read_text(f"{zone}/{name}").strip()
            except OSError:
                continue
            lines.append(f"{zone}/{name}:{value}")
    return "\n".join(lines)


def _throttle_count() -> int | None:
    files = glob.glob("/sys/devices/system/cpu/cpu*/thermal_throttle/*_throttle_count")
    if not files:
        return None
    total = 0
    for f in files:
        try:
            total += int(_read_text(f).strip())
        except (OSError, ValueError):
            continue
    return total


def _cgroup_memory() -> tuple[int | None, int | None]:
    """(memory.max, memory.current) of this process's cgroup v2, or (None, None)
    when there is no limit ("max") or no cgroup v2."""
    try:
        rel = [ln.split(":", 2)[2] for ln in _read_text("/proc/self/cgroup").splitlines()
               if ln.startswith("0::")]
        base = "/sys/fs/cgroup" + (rel[0].strip() if rel else "")
        limit = _read_text(f"{base}/memory.max").strip()
        if limit == "max":
            return None, None
        return int(limit), int(_read_text(f"{base}/memory.current").strip())
    except (OSError, ValueError, IndexError):
        return None, None


def read_linux(settings: Settings) -> Readings:
    import psutil

    errors: list[str] = []

    def psi() -> P.Psi:
        try:
            text = _read_text("/proc/pressure/memory")
        except OSError as e:
            raise P.ProbeUnavailable("/proc/pressure/memory", e.strerror or str(e)) from None
        return P.parse_psi(text, "/proc/pressure/memory")

    def zones() -> dict[str, P.ThermalZone]:
        dump = _thermal_dump()
        return P.parse_thermal_grep(dump) if dump else {}

    def temps() -> dict[str, list[P.PsutilTemp]]:
        fn = getattr(psutil, "sensors_temperatures", None)
        return psutil_temperatures(fn() if fn else {})

    def battery() -> P.PsutilBattery | None:
        fn = getattr(psutil, "sensors_battery", None)
        b = fn() if fn else None
        return psutil_battery(b) if b is not None else None

    swap = _try(errors, "psutil swap", psutil.swap_memory)
    cg_max, cg_cur = _cgroup_memory()
    return linux_readings(
        psi_memory=_try(errors, "PSI", psi),
        virtual_memory=_try(errors, "psutil", _psutil_vm),
        swap_total=swap.total if swap else None,
        swap_used=swap.used if swap else None,
        zones=_try(errors, "thermal zones", zones),
        temperatures=_try(errors, "psutil temperatures", temps),
        zone_pattern=settings.gate_thermal_zone_pattern,
        throttle_count=_throttle_count(),
        battery=_try(errors, "psutil battery", battery),
        cgroup_max=cg_max,
        cgroup_current=cg_cur,
        errors=errors,
    )


# ---------------------------------------------------------------- disk


def read_disk(settings: Settings) -> DiskReading:
    """Free and total bytes of the filesystem renders/ is on. Before the first render
    the folder may not exist yet: its nearest existing parent is on the same filesystem
    (unless a mount point is created later, which the next reading sees)."""
    path = Path(settings.renders_dir())
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        du = shutil.disk_usage(path)
    except OSError:
        return DiskReading(path=str(path))
    return DiskReading(path=str(settings.renders_dir()), free_bytes=du.free, total_bytes=du.total)


# ---------------------------------------------------------------- dispatch


def test_readings_path() -> Path | None:
    if os.environ.get(TRIGGERS_ENV) == "1" and os.environ.get(TEST_READINGS_ENV):
        return Path(os.environ[TEST_READINGS_ENV])
    return None


def read_readings(settings: Settings) -> Readings:
    """This machine's readings now (or the test file's, see the module doc)."""
    path = test_readings_path()
    if path is not None:
        doc = json.loads(path.read_text())
        doc["time"] = time.time()
        r = Readings.model_validate(doc)
    elif sys.platform == "darwin":
        r = read_macos(settings)
    elif sys.platform.startswith("linux"):
        r = read_linux(settings)
    else:
        r = Readings(platform=sys.platform, errors=[f"no health probes for {sys.platform}"])
    if r.disk.free_bytes is None:
        r = r.model_copy(update={"disk": read_disk(settings)})
    return r
