"""The fleet table's content for one snapshot, built in the poll worker (off the UI thread).

At 4096 GPUs the fleet screen's own work per poll (filter the rows, take each row's cells for the
layout, compare them with the table's by identity, write the changed ones cell by cell) was a
Python loop over 4096 rows on the UI thread, most of the tick (bench/RESULTS.md, console tick).
:func:`build_fleet_view` does that in the poll worker, for the filter and layout the screen last
asked for (:class:`FleetViewSpec`), and diffs against the view it built before: the screen then
writes the rows whose cells changed in one C-level ``dict.update`` (``changed_rows``) when the
table holds exactly the previous view (``base_seq``), and falls back to its own diff otherwise.
Pure (no widgets, no textual import); views are never mutated once built.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from operator import is_not
from typing import Any

from rich.text import Text

from gpuctl.widgets.fleet_rows import FleetRow, Layout, filter_rows, layout_cells
from gpuctl.widgets.palette import Palette

_SEQ = itertools.count(1)


@dataclass(frozen=True)
class FleetViewSpec:
    """What the fleet screen shows: the filter text, the layout, and the table's own column keys
    (one per ``layout.keys``, same order: textual ColumnKey objects; kept opaque here)."""

    filter_text: str
    layout: Layout
    column_keys: tuple[Hashable, ...]


@dataclass(frozen=True, eq=False)
class FleetView:
    """The fleet table's rows for one snapshot under one spec and palette.

    seq: this view's number (process-wide, increasing). base_seq: the view `changed_rows` is
    relative to (None: no base, every row is in changed_rows). rows: the filtered rows in table
    order; keys: their keys; rows_by_key: the same by key; cells: row key -> the layout's cells
    (interned Texts, see gpuctl.widgets.fleet_rows). changed_rows: row key -> {column key: cell}
    for every row whose cells differ from the base's (by identity), complete rows ready to replace
    the table's row mappings. snapshot: the FleetSnapshot it was built from (compared by identity).
    """

    seq: int
    base_seq: int | None
    spec: FleetViewSpec
    palette: Palette
    snapshot: Any
    rows: list[FleetRow]
    keys: list[str]
    rows_by_key: dict[str, FleetRow]
    cells: dict[str, tuple[Text, ...]]
    changed_rows: dict[str, dict[Hashable, Text]]


def build_fleet_view(
    rows: Sequence[FleetRow], spec: FleetViewSpec, palette: Palette, snapshot: Any, base: FleetView | None
) -> FleetView:
    """The view of `rows` (all rows of `snapshot`, unfiltered, built with `palette`) under `spec`,
    diffed against `base` when it has the same spec, palette and row keys (else no base).

    Raises ValueError when spec.column_keys does not have one key per column of spec.layout."""
    layout = spec.layout
    if len(spec.column_keys) != len(layout.columns):
        raise ValueError(f"fleet view: {len(spec.column_keys)} column keys for the "
                         f"{len(layout.columns)} columns of layout {layout.name!r}")
    shown = filter_rows(rows, spec.filter_text, palette)
    keys = [r.key for r in shown]
    if base is not None and (base.spec != spec or base.palette is not palette or base.keys != keys):
        base = None
    old = base.cells if base is not None else {}
    column_keys = spec.column_keys
    cells: dict[str, tuple[Text, ...]] = {}
    changed: dict[str, dict[Hashable, Text]] = {}
    for row in shown:
        new = layout_cells(row, layout)
        key = row.key
        cells[key] = new
        prev = old.get(key)
        if prev is None or any(map(is_not, new, prev)):
            changed[key] = dict(zip(column_keys, new))
    return FleetView(
        seq=next(_SEQ),
        base_seq=base.seq if base is not None else None,
        spec=spec,
        palette=palette,
        snapshot=snapshot,
        rows=shown,
        keys=keys,
        rows_by_key={r.key: r for r in shown},
        cells=cells,
        changed_rows=changed,
    )
