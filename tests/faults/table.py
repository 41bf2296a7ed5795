"""One row of the fault table, and the table as Markdown: shared by the tests and the soak."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FaultRow:
    area: str
    case: str
    tried: int
    held: int
    lost: int
    bound: str  # the promise, as the table states it
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.held == self.tried and self.lost == 0


def format_table(rows: list[FaultRow]) -> list[str]:
    """The fault table as Markdown lines (also printed by tests/faults/soak.py)."""
    lines = ["| area | case | tried | held | lost | must hold | note |",
             "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.area} | {r.case} | {r.tried} | {r.held} | {r.lost} | {r.bound} | {r.note} |")
    return lines
