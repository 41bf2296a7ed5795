"""The fault table itself: rows record, and the table formats every column."""

from faults.table import FaultRow, format_table


def test_fault_table_formats_rows(fault_table):
    row = fault_table("harness", "a row records", tried=3, held=3, lost=0, bound="0 lost")
    assert row.ok
    bad = FaultRow("harness", "a failed case", tried=2, held=1, lost=1, bound="0 lost")
    assert not bad.ok
    lines = format_table([row, bad])
    assert lines[0].startswith("| area | case | tried | held | lost |")
    assert "| harness | a failed case | 2 | 1 | 1 | 0 lost |" in lines[3]
