"""The health gate's policy, fed by parsed real probe samples.

High memory pressure, thrashing, battery and Low Power Mode come from the recorded
outputs in tests/fixtures/probe-samples/. None of those samples shows heat, so the
heat cases parse text in the exact recorded formats with hot values
substituted (said at each one); "cleared" readings are the real normal samples.
"""

from __future__ import annotations

import pytest

from h3render.settings import Settings
from h3render.worker import probes as P
from h3render.worker.health import (
    Check,
    MemoryReading,
    Readings,
    ThermalReading,
    decide,
    decide_thermal,
    linux_readings,
    macos_readings,
)
from test_probes import SAMPLES, body

GiB = 1024**3


@pytest.fixture(autouse=True)
def _need_samples():
    if not SAMPLES.is_dir():
        pytest.fail(f"probe samples folder {SAMPLES} is absent: the repo ships them in "
                    "tests/fixtures/probe-samples (H3RENDER_PROBE_SAMPLES overrides it)")


@pytest.fixture
def s() -> Settings:
    return Settings(redis_url="redis://unused")


def mac(**over):
    """A normal Mac from real samples: pressure level 1, AC power, nominal, speed 100."""
    parts = dict(
        sysctl=P.parse_sysctl(body("macos-sysctl-pressure-level-normal-01.txt")),
        vm_stat=P.parse_vm_stat(body("macos-vm_stat-applesilicon-16384-01.txt")),
        memory_pressure=P.parse_memory_pressure(body("macos-memory_pressure-01.txt")),
        thermal_state=P.parse_thermal_state(body("macos-processinfo-thermalstate-01.txt")),
        therm=P.parse_pmset_therm(body("macos-pmset-therm-intel-normal-01.txt")),
        batt=P.parse_pmset_batt(body("macos-pmset-batt-ac-charging-01.txt")),
        pm_settings=P.parse_pmset_settings(body("macos-pmset-g-01.txt")),
    )
    parts.update(over)
    return macos_readings(**parts)


def linux(**over):
    """A normal Linux box from real samples: idle PSI, cool zones, plugged in."""
    parts = dict(
        psi_memory=P.parse_psi(body("linux-psi-memory-sandbox-01.txt")),
        virtual_memory=P.VirtualMemory(total=16 * GiB, available=12 * GiB, percent=25.0),
        zones=P.parse_thermal_grep(body("linux-thermal-zone-grep-02.txt")),
        temperatures=P.parse_psutil_temperatures(body("linux-psutil-sensors_temperatures-01.txt")),
        battery=P.parse_psutil_battery(body("linux-psutil-sensors_battery-01.txt"))[1],  # plugged
        zone_pattern=Settings.model_fields["gate_thermal_zone_pattern"].default,
    )
    parts.update(over)
    return linux_readings(**parts)


def codes(d):
    return sorted(r.code for r in d.reasons)


def test_normal_samples_open(s):
    d = decide(mac(), s)
    assert d.open and d.reasons == [] and d.state == "open", d.state
    d = decide(linux(), s)
    assert d.open, d.state
    # zones chosen by type: coretemp and the SEN1 zone are not watched, but
    # 'coretemp' psutil readings are (pattern includes coretemp)
    assert any(z.name.startswith("coretemp") for z in d.readings.thermal.zones)


def test_macos_critical_pressure_holds(s):
    d = decide(mac(sysctl=P.parse_sysctl(body("macos-sysctl-pressure-level-critical-01.txt"))), s)
    assert not d.open and codes(d) == ["macos_pressure"]
    assert "critical (level 4" in d.state


def test_macos_warn_with_full_swap_holds_on_both(s):
    sysctl = P.parse_sysctl(body("macos-sysctl-pressure-warn-01.txt"))
    d = decide(mac(sysctl=sysctl), s)
    assert codes(d) == ["macos_pressure", "swap"], d.state
    assert "swap 13.0 GiB of 14.0 GiB used (93%)" in d.state
    # Swap alone closes the gate even when the level says normal (the "normal with
    # swap 40.0 of 40.9 GB" trap from the samples' README).
    relaxed = s.model_copy(update={"gate_macos_pressure_hold_level": 4})
    assert codes(decide(mac(sysctl=sysctl), relaxed)) == ["swap"]


def test_macos_memorystatus_low_free_holds(s):
    text = body("macos-memorystatus-warn-01.txt")
    d = decide(mac(sysctl=P.parse_sysctl(text), memory_pressure=P.parse_memory_pressure(text)),
               s.model_copy(update={"gate_macos_memorystatus_min": 40}))
    assert codes(d) == ["macos_free", "macos_pressure"]
    assert "system memory free 37% < 40%" in d.state


def test_macos_compressor_holds(s):
    # The real vm_stat: 153447 pages * 16 KiB = 2.3 GiB compressed of 32 GiB (7 %).
    r = mac()
    assert r.memory.compressor_bytes == 153447 * 16384 and r.memory.total_bytes is not None
    assert decide(r, s.model_copy(update={"gate_max_compressor_fraction": 0.05})).reasons[0].code \
        == "compressor"


def test_linux_thrashing_psi_holds_and_normal_clears(s):
    tree = P.parse_psi_tree(body("linux-psi-all-memory-thrashing-01.txt"))
    d = decide(linux(psi_memory=tree["memory"]), s)
    assert codes(d) == ["psi_full"] and "67.60% > 5%" in d.state
    assert decide(linux(psi_memory=P.parse_psi(body("linux-psi-memory-flatcar-01.txt"))), s).open


def test_low_available_memory_holds(s):
    vm = P.parse_psutil_virtual_memory(body("macos-psutil-virtual_memory-01.txt"))  # 2.1 of 8 GiB
    # (memory_pressure=None: that sample is another, 32 GiB, machine)
    d = decide(mac(virtual_memory=vm, memory_pressure=None),
               s.model_copy(update={"gate_min_available_fraction": 0.3}))
    assert codes(d) == ["available"] and "2.1 GiB of 8.0 GiB (26%) < 30%" in d.state
    assert decide(mac(virtual_memory=vm, memory_pressure=None), s).open


@pytest.mark.parametrize("name", [
    "macos-pmset-batt-battery-01.txt", "macos-pmset-batt-battery-02.txt",
    "macos-pmset-batt-battery-low-01.txt", "macos-pmset-batt-battery-noestimate-01.txt"])
def test_battery_holds_unless_allowed(s, name):
    d = decide(mac(batt=P.parse_pmset_batt(body(name))), s)
    assert codes(d) == ["battery"] and d.closed_by(Check.power)
    assert "H3RENDER_ALLOW_BATTERY" in d.state
    assert decide(mac(batt=P.parse_pmset_batt(body(name))),
                  s.model_copy(update={"allow_battery": True})).open


@pytest.mark.parametrize("name", ["macos-pmset-batt-ac-charging-01.txt",
                                  "macos-pmset-batt-ac-notcharging-01.txt",
                                  "macos-pmset-batt-desktop-nobattery-01.txt"])
def test_ac_power_clears(s, name):
    assert decide(mac(batt=P.parse_pmset_batt(body(name))), s).open


def test_linux_battery_log_holds_then_clears(s):
    unplugged, plugged = P.parse_psutil_battery(body("linux-psutil-sensors_battery-01.txt"))
    assert codes(decide(linux(battery=unplugged), s)) == ["battery"]
    assert decide(linux(battery=plugged), s).open


def test_low_power_mode_holds(s):
    lp = P.parse_pmset_settings(body("macos-pmset-custom-lowpower-01.txt"))
    d = decide(mac(pm_settings=lp), s)
    assert codes(d) == ["low_power"]
    assert decide(mac(pm_settings=lp), s.model_copy(update={"allow_low_power": True})).open


def test_powermode_spelling(s):
    # Some Macs say `powermode 1` instead of `lowpowermode 1` (0 auto, 1 low, 2 high).
    text = body("macos-pmset-g-01.txt").replace("**lowpowermode         0**", " powermode 1")
    assert codes(decide(mac(pm_settings=P.parse_pmset_settings(text)), s)) == ["low_power"]
    text2 = text.replace(" powermode 1", " powermode 2")
    assert decide(mac(pm_settings=P.parse_pmset_settings(text2)), s).open


def test_heat_holds_and_clears(s):
    # Hot values in the recorded formats (no recorded sample is hot):
    # ProcessInfo.thermalState prints one of four words; "serious" holds.
    for word, is_open in [("serious", False), ("critical", False), ("fair", True)]:
        d = decide(mac(thermal_state=P.parse_thermal_state(word + "\n")), s)
        assert d.open is is_open, (word, d.state)
    # Intel pmset -g therm with the CPU limited to 63 %: the Intel sample, number changed.
    hot = body("macos-pmset-therm-intel-normal-01.txt").replace("CPU_Speed_Limit \t= 100",
                                                                "CPU_Speed_Limit \t= 63")
    d = decide(mac(therm=P.parse_pmset_therm(hot)), s)
    assert codes(d) == ["cpu_speed_limit"] and d.closed_by(Check.thermal)
    # A Linux zone at 104 °C against its real 107 °C trip (grep-01's zone0 temp raised).
    zones = body("linux-thermal-zone-grep-01.txt").replace("zone0/temp:25000", "zone0/temp:104000")
    zones += "/sys/class/thermal/thermal_zone0/type:x86_pkg_temp\n"
    d = decide(linux(zones=P.parse_thermal_grep(zones)), s)
    assert codes(d) == ["zone"] and "x86_pkg_temp at 104.0 °C" in d.state
    # Cleared: the same zone at its recorded 25 °C.
    cool = body("linux-thermal-zone-grep-01.txt") + "/sys/class/thermal/thermal_zone0/type:x86_pkg_temp\n"
    assert decide(linux(zones=P.parse_thermal_grep(cool)), s).open


def test_psutil_high_limits_used(s):
    # temperatures-02's acpitz has an implausible critical=31.3; it is not a watched
    # type, so it cannot close the gate, while coretemp (87 high) is watched.
    temps = P.parse_psutil_temperatures(body("linux-psutil-sensors_temperatures-02.txt"))
    r = linux(temperatures=temps, zones={})
    assert {z.name.split("/")[0] for z in r.thermal.zones} == {"coretemp"}
    assert all(z.limit_c == 87.0 for z in r.thermal.zones)
    assert decide(r, s).open


def test_throttle_counter_increase_holds(s):
    before = Readings(thermal=ThermalReading(throttle_count=10))
    after = Readings(thermal=ThermalReading(throttle_count=14))
    d = decide(after, s, previous=before)
    assert codes(d) == ["throttle"] and "4 new events" in d.state
    assert decide(after, s, previous=after).open


def test_decide_thermal_ignores_memory(s):
    r = Readings(memory=MemoryReading(psi_full_avg10=90.0, psi_some_avg10=90.0),
                 thermal=ThermalReading(cpu_speed_limit=50))
    assert codes(decide(r, s)) == ["cpu_speed_limit", "psi_full"]
    assert codes(decide_thermal(r, s)) == ["cpu_speed_limit"]


def test_missing_probes_are_notes_not_holds(s):
    r = linux(psi_memory=None, virtual_memory=None, zones={}, temperatures={}, battery=None,
              errors=["PSI: /proc/pressure/memory: not available on this machine"])
    d = decide(r, s)
    assert d.open and "no memory pressure reading on this machine" in d.notes
    assert any("PSI" in n for n in d.notes)


def test_cgroup_limit_caps_available(s):
    # a container limited to 2 GiB with 1.9 GiB in use, on a host with 12 of 16 GiB free
    r = linux(cgroup_max=2 * GiB, cgroup_current=int(1.9 * GiB))
    assert r.memory.total_bytes == 2 * GiB
    assert r.memory.available_bytes == 2 * GiB - int(1.9 * GiB)
    assert [x.code for x in decide(r, s).reasons] == ["available"]
