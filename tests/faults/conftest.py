"""The fault table: what each fault test tried, what held and what was lost.

A fault test calls `fault_table(area, case, tried=..., held=..., lost=..., bound=...)`
once per case (a case is one kind of fault; `tried` counts its trials, `held` those
where every promise held, `lost` the acknowledged jobs or files lost). The rows are
printed as one table at the end of the run and, when H3RENDER_FAULTS_REPORT names a
file, appended to it as JSON lines (`make faults` and docs/RELIABILITY.md read it).

Fixtures here: fault_table, worker_env (the environment of a worker process for this
test's Redis and home), tmpfs (a size-limited filesystem, for full-disk cases).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from faults.harness import worker_environment
from faults.table import FaultRow, format_table  # noqa: F401 - format_table re-exported

REPORT_ENV = "H3RENDER_FAULTS_REPORT"


_ROWS: list[FaultRow] = []


@pytest.fixture
def fault_table():
    """record(area, case, *, tried, held, lost, bound, note="") -> FaultRow."""

    def record(area: str, case: str, *, tried: int, held: int, lost: int, bound: str,
               note: str = "") -> FaultRow:
        row = FaultRow(area, case, int(tried), int(held), int(lost), bound, note)
        _ROWS.append(row)
        path = os.environ.get(REPORT_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(row)) + "\n")
        return row

    return record


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    terminalreporter.section("fault table")
    for line in format_table(_ROWS):
        terminalreporter.write_line(line)


@pytest.fixture
def worker_env(h3_settings, tmp_path):
    """The environment of worker processes for this test's Redis and home (harness.worker_environment)."""
    return worker_environment(h3_settings, tmp_path / "readings.json")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size_bytes) -> Path of a fresh tmpfs of that size (unmounted after the test).

    Needs root and mount(8), as on CI; skips with the reason otherwise."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("full-disk cases mount a tmpfs: needs root and mount(8)")
        d = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size)}", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


SLOW_FIXTURES = ("worker_env", "tmpfs", "redis_conn", "redis_server")


def pytest_collection_modifyitems(config, items):
    """Fault cases that start real processes or servers are slow (`make test-fast` leaves them
    to the whole suite); the pure checks of records and of the table stay fast."""
    for item in items:
        if "/faults/" in str(item.fspath) and any(f in getattr(item, "fixturenames", ()) for f in SLOW_FIXTURES):
            item.add_marker(pytest.mark.slow)
