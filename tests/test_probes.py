"""Every recorded probe output in tests/fixtures/probe-samples/ through its parser.

The samples are real outputs (see that folder's README.md); the first line of each
file is a `# source:` note, the rest is what the command printed. Each file has
asserted values here, so a new sample without expectations fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from h3render.worker import probes as P

# Recorded command outputs, copied into the repo so a clone anywhere runs every case;
# H3RENDER_PROBE_SAMPLES points at another folder of them (a newer recording).
SAMPLES = Path(os.environ.get("H3RENDER_PROBE_SAMPLES",
                              Path(__file__).resolve().parent / "fixtures" / "probe-samples"))

GiB = 1024**3
MiB = 1024**2


def body(name: str) -> str:
    text = (SAMPLES / name).read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    assert first.startswith("# source:"), f"{name}: first line is not '# source: ...'"
    return rest


def _psi_tree_loaded(r):
    assert set(r) == {"io", "cpu", "memory"}
    assert r["cpu"].some.avg10 == 30.27 and r["cpu"].full is None  # kernel before 5.13
    assert r["memory"].some.total == 15411 and r["memory"].full.avg10 == 0.0


def _psi_tree_thrash(r):
    assert r["memory"].some.avg10 == 67.79 and r["memory"].full.avg10 == 67.60
    assert r["io"].full.avg300 == 7.97


def _temps_01(r):
    assert list(r) == ["acpitz", "nvme", "pch_skylake", "thinkpad", "coretemp"]
    assert r["coretemp"][0] == P.PsutilTemp(label="Package id 0", current=44.0, high=100.0,
                                            critical=100.0)
    assert r["pch_skylake"][0].high is None and len(r["thinkpad"]) == 7


def _temps_02(r):
    assert r["acpitz"][0].critical == 31.3
    core0 = [t.current for t in r["coretemp"] if t.label == "Core 0"]
    assert core0 == [38.0, 35.0, 38.0, 35.0]  # repeated labels kept, cut-off entry dropped


def _temps_docs(r):
    assert [t.current for t in r["coretemp"]] == [52.0, 45.0, 52.0, 45.0, 47.0]
    assert r["asus"][0].critical is None


def _zone_grep_01(r):
    assert r["thermal_zone0"].temp_c == 25.0 and r["thermal_zone0"].limit_c() == 107.0
    assert r["thermal_zone1"].type == "INT3400 Thermal" and r["thermal_zone1"].mode == "disabled"
    assert r["thermal_zone1"].temp_c is None


def _zone_grep_02(r):
    z2 = r["thermal_zone2"]
    assert z2.type == "SEN1" and z2.temp_c == 34.0
    assert z2.limit_c() == 125.0  # the 0 m°C trips are placeholders, not limits
    assert r["thermal_zone3"].limit_c() == 75.0


def _mp_01(r):
    assert r.total_bytes == 32 * GiB and r.page_size == 16384 and r.free_percent == 86
    assert r.compressor_bytes == 153447 * 16384 and r.swapouts == 0


def _mp_02(r):
    assert r.free_percent == 88 and r.pages["swapouts"] == 16 and r.pages["wired down"] == 134298


def _mp_q(r):
    assert (r.total_bytes, r.page_size, r.free_percent, r.pages) == (16 * GiB, 4096, 60, {})


def _memorystatus(r):
    sysctl, mp = r
    assert sysctl.free_percent == 37 and sysctl.pressure_level == 2 and mp.free_percent == 37


def _batt(source, percent, state, minutes, on_battery):
    def check(r):
        assert r.source == source and r.on_battery is on_battery
        (b,) = r.batteries
        assert (b.name, b.percent, b.state, b.remaining_minutes, b.present) == (
            "InternalBattery-0", percent, state, minutes, True)
    return check


def _desktop(r):
    assert r.source == "AC Power" and r.batteries == [] and not r.on_battery


def _custom_lowpower(r):
    assert r.sections["Battery Power"]["lowpowermode"] == "1"
    assert r.sections["AC Power"]["womp"] == "1" and r.sections["Battery Power"]["womp"] == "0"
    assert r.low_power_mode("AC Power") is True and r.low_power_mode("Battery Power") is True


def _pmset_g(r):
    use = r.sections["Currently in use"]
    assert use["lowpowermode"] == "0"  # the ** around this line in the paste are stripped
    assert use["Sleep On Power Button"] == "1" and use["sleep"].startswith("1 (sleep prevented")
    assert r.sections["System-wide power settings"] == {"SleepDisabled": "1"}
    assert r.low_power_mode() is False


def _therm_as(r):
    assert r.cpu_speed_limit is None and len(r.notes) == 3


def _therm(cpus):
    def check(r):
        assert (r.cpu_speed_limit, r.cpu_scheduler_limit, r.cpu_available_cpus) == (100, 100, cpus)
    return check


def _pm_smc(r):
    assert [s.cpu_thermal_level for s in r] == [68, 68, 67, 67]
    assert r[0].cpu_die_temp_c == 50.18 and all(s.prochots == 0 for s in r)


def _pm_thermal(r):
    assert [s.pressure_level for s in r] == ["Nominal", "Nominal"]


def _ncpa(r):
    assert r.total == 16 * GiB and r.percent == 83.9
    assert r.available == round(2.57 * GiB)


def _svmem(r):
    assert (r.total, r.available, r.percent, r.wired) == (8 * GiB, 2204819456, 74.3, 2622050304)


def _hw_as(r):
    assert r.memsize == 24 * GiB and r.int("hw.pagesize") == 16384
    assert r.values["machdep.cpu.brand_string"] == "Apple M4" and r.pressure_level is None


def _hw_memsize(r):
    assert r.memsize == 16 * GiB and r.int("hw.memsize_usable") == 16383606784


def _level(level):
    def check(r):
        assert r.pressure_level == level and r.swap is None
    return check


def _pressure_warn(r):
    assert r.pressure_level == 2 and r.free_percent == 38
    # 57 %-free-style trap: the level says only "warn", but swap is 92.5 % used.
    assert r.swap.total == 14336 * MiB and r.swap.used == int(13262.06 * MiB)
    assert round(r.swap.used_fraction, 3) == 0.925 and r.swap.encrypted


def _swap(total_mib, used_mib):
    def check(r):
        assert r.swap.total == total_mib * MiB and r.swap.used == int(used_mib * MiB)
    return check


def _vm_as(r):
    assert r.page_size == 16384 and r.free_bytes == 130912 * 16384
    assert r.compressor_bytes == 153447 * 16384 and r.pages["translation faults"] == 5220385534


def _vm_intel(r):
    assert r.page_size == 4096 and r.pages["free"] == 6127229 and r.compressor_bytes == 0


def _battery_log(r):
    assert [(round(b.percent, 2), b.secsleft, b.power_plugged) for b in r] == [
        (67.08, 4160, False), (67.12, None, True)]  # POWER_TIME_UNLIMITED -> None


def _battery_docs(r):
    assert r == [P.PsutilBattery(percent=93, secsleft=16628, power_plugged=False)]


def _psi(some10, full10):
    def check(r):
        assert r.some.avg10 == some10
        assert (r.full.avg10 if r.full else None) == full10
    return check


def _unavailable(parser, needle):
    def run(text):
        with pytest.raises(P.ProbeUnavailable) as e:
            parser(text)
        assert needle in str(e.value)
        return None
    return run


def _both(text):
    return P.parse_sysctl(text), P.parse_memory_pressure(text)


# file name -> (parser, check of the parsed value)
EXPECT = {
    "linux-psi-all-cpu-loaded-01.txt": (P.parse_psi_tree, _psi_tree_loaded),
    "linux-psi-all-memory-thrashing-01.txt": (P.parse_psi_tree, _psi_tree_thrash),
    "linux-psi-cpu-flatcar-01.txt": (P.parse_psi, _psi(0.13, None)),
    "linux-psi-cpu-homeassistant-01.txt": (P.parse_psi, _psi(0.05, 0.0)),
    "linux-psi-cpu-sandbox-01.txt": (P.parse_psi, _psi(0.0, 0.0)),
    "linux-psi-error-missing-01.txt": (_unavailable(P.parse_psi, "No such file"), None),
    "linux-psi-io-flatcar-01.txt": (P.parse_psi, _psi(0.0, 0.0)),
    "linux-psi-io-sandbox-01.txt": (P.parse_psi, _psi(0.31, 0.22)),
    "linux-psi-memory-flatcar-01.txt": (P.parse_psi, _psi(0.0, 0.0)),
    "linux-psi-memory-sandbox-01.txt": (P.parse_psi, _psi(0.0, 0.0)),
    "linux-psutil-sensors_battery-01.txt": (P.parse_psutil_battery, _battery_log),
    "linux-psutil-sensors_temperatures-01.txt": (P.parse_psutil_temperatures, _temps_01),
    "linux-psutil-sensors_temperatures-02.txt": (P.parse_psutil_temperatures, _temps_02),
    "linux-psutil-sensors_temperatures-docs-01.txt": (P.parse_psutil_temperatures, _temps_docs),
    "linux-thermal-vm-empty-01.txt": (P.parse_thermal_listing, lambda r: r == [] or None),
    "linux-thermal-zone-grep-01.txt": (P.parse_thermal_grep, _zone_grep_01),
    "linux-thermal-zone-grep-02.txt": (P.parse_thermal_grep, _zone_grep_02),
    "linux-thermal-zone-types-01.txt": (
        P.parse_thermal_types,
        lambda r: _eq(r, {f"thermal_zone{i}": t for i, t in enumerate(
            ["acpitz", "INT3400 Thermal", "SEN1", "pch_cannonlake", "B0D4", "iwlwifi_1",
             "x86_pkg_temp"])})),
    "macos-memory_pressure-01.txt": (P.parse_memory_pressure, _mp_01),
    "macos-memory_pressure-02.txt": (P.parse_memory_pressure, _mp_02),
    "macos-memory_pressure-Q-intel-01.txt": (P.parse_memory_pressure, _mp_q),
    "macos-memorystatus-warn-01.txt": (_both, _memorystatus),
    "macos-pmset-batt-ac-charging-01.txt": (
        P.parse_pmset_batt, _batt("AC Power", 84.0, "charging", 65, False)),
    "macos-pmset-batt-ac-notcharging-01.txt": (
        P.parse_pmset_batt, _batt("AC Power", 88.0, "AC attached", None, False)),
    "macos-pmset-batt-battery-01.txt": (
        P.parse_pmset_batt, _batt("Battery Power", 95.0, "discharging", 186, True)),
    "macos-pmset-batt-battery-02.txt": (
        P.parse_pmset_batt, _batt("Battery Power", 85.0, "discharging", 122, True)),
    "macos-pmset-batt-battery-low-01.txt": (
        P.parse_pmset_batt, _batt("Battery Power", 19.0, "discharging", 131, True)),
    "macos-pmset-batt-battery-noestimate-01.txt": (
        P.parse_pmset_batt, _batt("Battery Power", 90.0, "discharging", None, True)),
    "macos-pmset-batt-desktop-nobattery-01.txt": (P.parse_pmset_batt, _desktop),
    "macos-pmset-custom-lowpower-01.txt": (P.parse_pmset_settings, _custom_lowpower),
    "macos-pmset-g-01.txt": (P.parse_pmset_settings, _pmset_g),
    "macos-pmset-therm-applesilicon-01.txt": (P.parse_pmset_therm, _therm_as),
    "macos-pmset-therm-intel-normal-01.txt": (P.parse_pmset_therm, _therm(12)),
    "macos-pmset-thermlog-normal-01.txt": (P.parse_pmset_therm, _therm(8)),
    "macos-powermetrics-smc-intel-01.txt": (P.parse_powermetrics, _pm_smc),
    "macos-powermetrics-thermal-nominal-01.txt": (P.parse_powermetrics, _pm_thermal),
    "macos-processinfo-thermalstate-01.txt": (
        P.parse_thermal_state, lambda r: _eq(r, P.ThermalState.nominal)),
    "macos-psutil-ncpa-virtual-01.txt": (P.parse_ncpa_virtual, _ncpa),
    "macos-psutil-sensors_temperatures-error-01.txt": (
        _unavailable(P.parse_psutil_temperatures, "AttributeError"), None),
    "macos-psutil-sensors_temperatures-error-02.txt": (
        _unavailable(P.parse_psutil_temperatures, "AttributeError"), None),
    "macos-psutil-virtual_memory-01.txt": (P.parse_psutil_virtual_memory, _svmem),
    "macos-sysctl-hw-applesilicon-01.txt": (P.parse_sysctl, _hw_as),
    "macos-sysctl-hw-memsize-01.txt": (P.parse_sysctl, _hw_memsize),
    "macos-sysctl-pressure-level-critical-01.txt": (P.parse_sysctl, _level(4)),
    "macos-sysctl-pressure-level-normal-01.txt": (P.parse_sysctl, _level(1)),
    "macos-sysctl-pressure-warn-01.txt": (P.parse_sysctl, _pressure_warn),
    "macos-sysctl-swapusage-01.txt": (P.parse_sysctl, _swap(4096, 2743.50)),
    "macos-sysctl-swapusage-comma-locale-01.txt": (P.parse_sysctl, _swap(1024, 379.25)),
    "macos-vm_stat-applesilicon-16384-01.txt": (P.parse_vm_stat, _vm_as),
    "macos-vm_stat-intel-4096-01.txt": (P.parse_vm_stat, _vm_intel),
    "psutil-sensors_battery-docs-01.txt": (P.parse_psutil_battery, _battery_docs),
}


def _eq(got, want):
    assert got == want


def _sample_names() -> list[str]:
    if not SAMPLES.is_dir():
        return []
    return sorted(p.name for p in SAMPLES.iterdir() if p.suffix == ".txt")


@pytest.fixture(autouse=True)
def _need_samples():
    if not SAMPLES.is_dir():
        pytest.fail(f"probe samples folder {SAMPLES} is absent: the repo ships them in "
                    "tests/fixtures/probe-samples (H3RENDER_PROBE_SAMPLES overrides it)")


def test_every_sample_has_expectations():
    names = _sample_names()
    assert names, f"{SAMPLES} holds no .txt samples"
    missing = sorted(set(names) - set(EXPECT))
    assert not missing, f"samples without a parser and asserted values: {missing}"


@pytest.mark.parametrize("name", _sample_names() or ["<no samples>"])
def test_sample(name):
    parser, check = EXPECT[name]
    result = parser(body(name))
    if check is not None:
        check(result)


# ---- Malformed input gives a ProbeError naming the source, never another exception.

MALFORMED = [
    (P.parse_memory_pressure, "memory_pressure", "hello\n"),
    (P.parse_sysctl, "sysctl", "sysctl: unknown oid 'machdep.xcpm.cpu_thermal_level'\n"),
    (lambda t: P.parse_sysctl(t).pressure_level, "sysctl", "kern.memorystatus_vm_pressure_level: 3\n"),
    (P.parse_swapusage, "vm.swapusage", "total = 1024,00X used = 1M free = 1M"),
    (P.parse_vm_stat, "vm_stat", "Pages free: 12.\n"),
    (P.parse_vm_stat, "vm_stat", "Mach Virtual Memory Statistics: (page size of 3000 bytes)\n"),
    (P.parse_pmset_therm, "pmset -g therm", "pmset: command not found\n"),
    (P.parse_pmset_batt, "pmset -g batt", ""),
    (P.parse_pmset_settings, "pmset -g", "nothing here"),
    (P.parse_thermal_state, "thermalState", "warm"),
    (P.parse_psi, "/proc/pressure", "some avg10=abc avg60=0 avg300=0 total=1\n"),
    (P.parse_psi, "/proc/pressure", "cat: /proc/pressure/memory: Operation not supported\n"),
    (P.parse_psi, "/proc/pressure", "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
    (P.parse_psi_tree, "/proc/pressure", "/proc/pressure/io:bogus\n"),
    (P.parse_thermal_grep, "/sys/class/thermal", "/sys/class/thermal/thermal_zone0/temp:hot\n"),
    (P.parse_thermal_types, "thermal_zone", "acpitz\n"),
    (P.parse_thermal_listing, "ls /sys/class/thermal", "not an ls line\n"),
    (P.parse_psutil_battery, "sensors_battery", "sbattery(percent=abc, secsleft=1)"),
    (P.parse_psutil_temperatures, "sensors_temperatures", "{}"),
    (P.parse_psutil_virtual_memory, "virtual_memory", "svmem(total=1, percent=2)"),
    (P.parse_ncpa_virtual, "ncpa", '{"virtual": {"total": [1, "parsecs"]}}'),
    (P.parse_ncpa_virtual, "ncpa", "<html>"),
    (P.parse_powermetrics, "powermetrics", "powermetrics must be invoked as the superuser\n"),
]


@pytest.mark.parametrize("parser,needle,text", MALFORMED)
def test_malformed_is_a_clear_error(parser, needle, text):
    with pytest.raises(P.ProbeError) as e:
        parser(text)
    assert needle in str(e.value), f"message {str(e.value)!r} does not name {needle!r}"


# ---- The live path reads psutil's named tuples field by field (h3render.worker.sensors).
# This machine may have no sensors and no battery, so psutil's own tuple types are filled
# with what real hwmon drivers report (labels with parentheses and quotes included).


def _psutil_tuples():
    import psutil

    mod = getattr(psutil, "_ntuples", None) or psutil._common  # moved in psutil 7.2
    return mod.shwtemp, mod.sbattery


def test_live_readings_take_psutil_fields_not_their_repr(monkeypatch):
    import psutil

    from h3render.settings import Settings
    from h3render.worker import sensors

    shwtemp, sbattery = _psutil_tuples()
    temps = {"k10temp": [shwtemp("CPU (Tctl)", 61.5, None, None),
                         shwtemp("Tccd1", 55.0, 80.0, 95.0)],
             "acpitz": [shwtemp("", 27.8, 105.0, 105.0)],
             "dell_smm": [shwtemp("it's the GPU", 48.0, None, None)]}
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda *a, **k: temps, raising=False)
    monkeypatch.setattr(psutil, "sensors_battery",
                        lambda: sbattery(42.0, psutil.POWER_TIME_UNLIMITED, True), raising=False)
    r = sensors.read_linux(Settings(gate_thermal_zone_pattern=r"k10temp|acpitz|dell_smm"))
    assert not [e for e in r.errors if "psutil" in e], r.errors
    # /sys/class/thermal zones of this machine, if any, are named by their type, not sensor/label
    got = {z.name: (z.temp_c, z.limit_c) for z in r.thermal.zones}
    assert {k: v for k, v in got.items() if k in (
        "k10temp/CPU (Tctl)", "k10temp/Tccd1", "acpitz", "dell_smm/it's the GPU")} == {
        "k10temp/CPU (Tctl)": (61.5, None), "k10temp/Tccd1": (55.0, 80.0),
        "acpitz": (27.8, 105.0), "dell_smm/it's the GPU": (48.0, None)}
    assert r.power.battery_percent == 42.0 and r.power.on_battery is False


@pytest.mark.parametrize("name", ["linux-psutil-sensors_temperatures-01.txt",
                                  "linux-psutil-sensors_temperatures-02.txt",
                                  "linux-psutil-sensors_temperatures-docs-01.txt"])
def test_live_and_recorded_temperature_readings_agree(name):
    """The recorded text, rebuilt as psutil's tuples, reads the same through the live path."""
    from h3render.worker import sensors

    shwtemp, _ = _psutil_tuples()
    recorded = P.parse_psutil_temperatures(body(name))
    as_psutil = {k: [shwtemp(t.label, t.current, t.high, t.critical) for t in v]
                 for k, v in recorded.items()}
    assert sensors.psutil_temperatures(as_psutil) == recorded


def test_live_battery_sentinels_and_recorded_battery_agree():
    import psutil

    from h3render.worker import sensors

    _, sbattery = _psutil_tuples()
    for b in P.parse_psutil_battery(body("linux-psutil-sensors_battery-01.txt")):
        secs = psutil.POWER_TIME_UNKNOWN if b.secsleft is None else b.secsleft
        assert sensors.psutil_battery(sbattery(b.percent, secs, b.power_plugged)) == b
    got = sensors.psutil_battery(sbattery(99.0, psutil.POWER_TIME_UNLIMITED, None))
    assert got == P.PsutilBattery(percent=99.0, secsleft=None, power_plugged=None)
