"""The sweep grid: which swept parameters form rows, columns and pages. Pure functions.

A sweep's axes come from its record ("h3render:sweep:<id>" `axes`); each job's
position comes from its own payload, so drawn seeds ("random") and preview
versions land where they belong. With a preview pass, "pass" (preview / full)
is one more axis.

    layout = choose_layout(axes, rows=["seed"], cols=["steps"], pages=[])
    grid = build_grid(cells, axis_values, layout, page=0)
    grid.rows, grid.cols -> labels;  grid.cell(r, c) -> [items]

Every axis is in exactly one of rows, cols and pages; axes not given go to pages
(if rows and cols are both chosen) or fill rows/cols first. Several axes on one
side combine (rows "seed=1 · steps=2").
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
PASS_AXIS = "pass"


class LayoutError(ValueError):
    """A rows/cols/pages choice naming an unknown axis or one axis twice."""


@dataclass(frozen=True)
class Layout:
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    pages: tuple[str, ...]

    def side_of(self, axis: str) -> str:
        return "rows" if axis in self.rows else "cols" if axis in self.cols else "pages"


def axis_values(axes: Sequence[str], params: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Distinct values of each axis over the jobs' parameters, in order of first appearance."""
    out: dict[str, list[Any]] = {a: [] for a in axes}
    for p in params:
        for a in axes:
            v = p.get(a)
            if v not in out[a]:
                out[a].append(v)
    return out


def choose_layout(axes: Sequence[str], rows: Sequence[str] = (), cols: Sequence[str] = (),
                  pages: Sequence[str] = ()) -> Layout:
    """A complete layout from a partial choice; LayoutError names a bad axis.

    Defaults: the last axis forms the columns, the one before it the rows, the
    rest pages. An axis given twice is refused.
    """
    seen: dict[str, str] = {}
    for side, names in (("rows", rows), ("cols", cols), ("pages", pages)):
        for n in names:
            if n not in axes:
                raise LayoutError(f"{side}={n!r}: not an axis of this sweep; axes: {', '.join(axes) or 'none'}")
            if n in seen:
                raise LayoutError(f"{side}={n!r}: already used for {seen[n]}; each axis goes to one place")
            seen[n] = side
    rows, cols, pages = list(rows), list(cols), list(pages)
    free = [a for a in axes if a not in seen]
    if not cols and free:
        cols.append(free.pop())
    if not rows and free:
        rows.append(free.pop())
    pages.extend(free)
    return Layout(tuple(rows), tuple(cols), tuple(pages))


def _combos(names: Sequence[str], values: Mapping[str, list[Any]]) -> list[tuple[Any, ...]]:
    return list(itertools.product(*(values[n] for n in names)))


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if v is None:
        return "default"
    return str(v)


def label(names: Sequence[str], combo: Sequence[Any], short: bool = False) -> str:
    """"seed=1 · steps=2" (the empty tuple is "all"). short: values only."""
    if not names:
        return "all"
    parts = [fmt_value(v) if short else f"{n}={fmt_value(v)}" for n, v in zip(names, combo)]
    return " · ".join(parts)


@dataclass
class Grid(Generic[T]):
    layout: Layout
    page_keys: list[tuple[Any, ...]]
    page: int
    row_keys: list[tuple[Any, ...]]
    col_keys: list[tuple[Any, ...]]
    cells: dict[tuple[int, int], list[T]] = field(default_factory=dict)
    elsewhere: int = 0  # items on other pages

    @property
    def rows(self) -> list[str]:
        return [label(self.layout.rows, k) for k in self.row_keys]

    @property
    def cols(self) -> list[str]:
        return [label(self.layout.cols, k) for k in self.col_keys]

    @property
    def pages(self) -> list[str]:
        return [label(self.layout.pages, k) for k in self.page_keys]

    def cell(self, r: int, c: int) -> list[T]:
        return self.cells.get((r, c), [])


def build_grid(items: Sequence[tuple[Mapping[str, Any], T]], values: Mapping[str, list[Any]],
               layout: Layout, page: int = 0) -> Grid[T]:
    """Place (params, item) pairs on the chosen page of the layout.

    `values` gives each axis's values (axis_values). A page index past the end
    falls back to the last page. Items keep their input order within a cell.
    """
    page_keys = _combos(layout.pages, values)
    page = min(max(page, 0), len(page_keys) - 1) if page_keys else 0
    row_keys = _combos(layout.rows, values)
    col_keys = _combos(layout.cols, values)
    r_index = {k: i for i, k in enumerate(row_keys)}
    c_index = {k: i for i, k in enumerate(col_keys)}
    grid: Grid[T] = Grid(layout, page_keys, page, row_keys, col_keys)
    want = page_keys[page] if page_keys else ()
    for params, item in items:
        if tuple(params.get(a) for a in layout.pages) != want:
            grid.elsewhere += 1
            continue
        r = r_index[tuple(params.get(a) for a in layout.rows)]
        c = c_index[tuple(params.get(a) for a in layout.cols)]
        grid.cells.setdefault((r, c), []).append(item)
    return grid
