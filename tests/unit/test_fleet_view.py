"""The fleet table's view built off the UI thread (gpuctl.widgets.fleet_view): filtered, laid out
and diffed against the previous view exactly as the fleet screen's own diff would."""

from __future__ import annotations

from operator import is_not

import pytest

from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.widgets.fleet_rows import LAYOUTS, filter_rows, fleet_rows, layout_cells
from gpuctl.widgets.fleet_view import FleetViewSpec, build_fleet_view
from gpuctl.widgets.palette import build_palette

LAYOUT = LAYOUTS[0]


@pytest.fixture()
def fleet():
    src = SimulatedFleetSource(nodes=3, gpus_per_node=4, seed=3)
    palette = build_palette({}, src.departments)
    history: dict = {}

    def rows():
        snap = src.snapshot()
        for n in snap.nodes:
            for g in n.gpus:
                history.setdefault(g.uuid, []).append(g.sample.sm_util_pct if g.sample else None)
        return snap, fleet_rows(snap, {k: tuple(v) for k, v in history.items()}, palette)

    try:
        yield rows, palette
    finally:
        src.close()


def spec(filter_text: str = "", layout=LAYOUT) -> FleetViewSpec:
    return FleetViewSpec(filter_text, layout, tuple(f"K-{k}" for k in layout.keys))


def test_first_view_has_no_base_and_every_row_whole(fleet):
    rows_of, palette = fleet
    snap, rows = rows_of()
    v = build_fleet_view(rows, spec(), palette, snap, None)
    assert v.base_seq is None and v.snapshot is snap
    assert v.keys == [r.key for r in rows] and len(v.keys) == 12
    assert set(v.changed_rows) == set(v.keys)
    r = rows[5]
    assert v.cells[r.key] == layout_cells(filter_rows(rows, "", palette)[5], LAYOUT)
    assert list(v.changed_rows[r.key]) == [f"K-{k}" for k in LAYOUT.keys]
    assert tuple(v.changed_rows[r.key].values()) == v.cells[r.key]
    assert v.rows_by_key[r.key].key == r.key


def test_next_view_holds_exactly_the_rows_whose_cells_changed(fleet):
    rows_of, palette = fleet
    snap1, rows1 = rows_of()
    v1 = build_fleet_view(rows1, spec(), palette, snap1, None)
    snap2, rows2 = rows_of()
    v2 = build_fleet_view(rows2, spec(), palette, snap2, v1)
    assert v2.seq > v1.seq and v2.base_seq == v1.seq
    want = {k for k in v2.keys if any(map(is_not, v2.cells[k], v1.cells[k]))}
    assert set(v2.changed_rows) == want and want  # the sparkline moves every poll
    # the same rows again: nothing changed
    v3 = build_fleet_view(rows2, spec(), palette, snap2, v2)
    assert v3.base_seq == v2.seq and v3.changed_rows == {}
    assert v1.changed_rows.keys() == set(v1.keys)  # views are never changed afterwards


def test_filter_applies_and_bold_first_node_cell(fleet):
    rows_of, palette = fleet
    snap, rows = rows_of()
    node = rows[4].node
    v = build_fleet_view(rows, spec(node), palette, snap, None)
    assert [r.key for r in filter_rows(rows, node, palette)] == v.keys
    assert len(v.keys) == 4 and all(v.rows_by_key[k].node == node for k in v.keys)
    assert "bold" in str(v.cells[v.keys[0]][0].spans or v.cells[v.keys[0]][0].style)


def test_another_spec_palette_or_row_set_drops_the_base(fleet):
    rows_of, palette = fleet
    snap, rows = rows_of()
    v1 = build_fleet_view(rows, spec(), palette, snap, None)
    assert build_fleet_view(rows, spec("node"), palette, snap, v1).base_seq is None
    assert build_fleet_view(rows, spec(layout=LAYOUTS[-1]), palette, snap, v1).base_seq is None
    other = build_palette({"error": "#ff0000"}, [])
    assert build_fleet_view(rows, spec(), other, snap, v1).base_seq is None
    assert build_fleet_view(rows[:-1], spec(), palette, snap, v1).base_seq is None
    assert build_fleet_view(rows, spec(), palette, snap, v1).base_seq == v1.seq


def test_column_keys_must_match_the_layout(fleet):
    rows_of, palette = fleet
    snap, rows = rows_of()
    bad = FleetViewSpec("", LAYOUT, ("a", "b"))
    with pytest.raises(ValueError, match=rf"2 column keys for the {len(LAYOUT.columns)} columns of layout 'full'"):
        build_fleet_view(rows, bad, palette, snap, None)
