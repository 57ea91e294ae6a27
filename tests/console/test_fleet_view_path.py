"""The fleet screen's fast path: each poll's view built in the poll worker (filtered, laid out,
diffed: gpuctl.widgets.fleet_view) is written as whole changed rows, and the table then holds
exactly what the screen's own full diff would show, across polls, filters, a covered screen
and a layout change."""

from __future__ import annotations

from tests.support.console import SIZE, WIDE, make_app, poll, settle, table
from gpuctl.screens import fleet as fleet_screen
from gpuctl.screens.node_detail import NodeDetailScreen
from gpuctl.widgets.fleet_rows import filter_rows, fleet_rows, layout_cells
from gpuctl.widgets.header import HeaderTotals, totals_parts


def expected_rows(app) -> dict[str, list[str]]:
    """What the table must hold: rows rebuilt from scratch (no view, no diff) for the screen's
    filter and layout."""
    screen = app.screen
    rows = filter_rows(fleet_rows(app.snapshot, app.sm_history, app.palette), screen.filter_text, app.palette)
    return {r.key: [str(c) for c in layout_cells(r, screen.table_layout)] for r in rows}


def shown_rows(app) -> dict[str, list[str]]:
    t = table(app)
    return {row.key.value: [str(c) for c in t.get_row(row.key)] for row in t.ordered_rows}


def counting_replace_rows(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = fleet_screen.replace_rows

    def spy(t, rows):
        calls.append(len(rows))
        return real(t, rows)

    monkeypatch.setattr(fleet_screen, "replace_rows", spy)
    return calls


async def test_polls_take_the_fast_path_and_show_what_a_full_diff_shows(source, monkeypatch):
    calls = counting_replace_rows(monkeypatch)
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        await poll(app, pilot)  # the first view (no base: the screen's own diff)
        for _ in range(3):
            await poll(app, pilot)
            view = app.fleet_view_for(app.snapshot)
            assert view is not None and view.base_seq is not None
            assert app.screen._view_seq == view.seq
            assert shown_rows(app) == expected_rows(app)
            assert list(shown_rows(app)) == view.keys
        # every row's sparkline moves each poll: each fast write carried all 32 rows
        assert calls[-3:] == [32, 32, 32]
        header = app.screen.query_one(HeaderTotals)
        departments = list(app.source.departments)
        assert header._parts == totals_parts(app.snapshot, departments, app.palette)


async def test_filter_change_then_polls_stay_exact(source, monkeypatch):
    calls = counting_replace_rows(monkeypatch)
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await poll(app, pilot)
        app.screen.set_filter("node-02")
        await pilot.pause()
        assert set(shown_rows(app)) == set(expected_rows(app)) and len(shown_rows(app)) == 8
        before = len(calls)
        await poll(app, pilot)  # the worker's first view for the new filter: no base
        assert shown_rows(app) == expected_rows(app)
        await poll(app, pilot)  # then the fast path again
        assert shown_rows(app) == expected_rows(app)
        assert len(calls) == before + 1 and 0 < calls[-1] <= 8  # rows of node-02 whose cells moved
        app.screen.set_filter("")
        await pilot.pause()
        await poll(app, pilot)
        assert shown_rows(app) == expected_rows(app) and len(shown_rows(app)) == 32


async def test_covered_screen_catches_up_by_its_own_diff(source, monkeypatch):
    calls = counting_replace_rows(monkeypatch)
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        await poll(app, pilot)
        await poll(app, pilot)
        fleet = app.screen
        node = app.snapshot.nodes[0].name
        assert app.open_node(node)
        await settle(app, pilot)
        assert isinstance(app.screen, NodeDetailScreen)
        n = len(calls)
        await poll(app, pilot)
        await poll(app, pilot)
        assert len(calls) == n  # the covered table is not written
        await pilot.press("escape")
        await settle(app, pilot)
        assert app.screen is fleet
        assert shown_rows(app) == expected_rows(app)
        assert len(calls) == n  # caught up by the full diff (its view's base is not on screen)
        await poll(app, pilot)
        assert shown_rows(app) == expected_rows(app)
        assert len(calls) == n + 1


async def test_layout_change_rebuilds_and_later_polls_are_exact(source):
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        await poll(app, pilot)
        await poll(app, pilot)
        wide_layout = app.screen.table_layout
        await pilot.resize_terminal(*SIZE)
        await settle(app, pilot)
        assert app.screen.table_layout is not wide_layout
        assert shown_rows(app) == expected_rows(app)
        for _ in range(2):
            await poll(app, pilot)
            assert shown_rows(app) == expected_rows(app)
        assert app.fleet_view_spec.layout is app.screen.table_layout


async def test_fleet_table_lines_equal_datatable_lines_with_and_without_crop():
    """FleetTable's assembled body lines (its no-crop shortcut included) give DataTable's own
    line: same segments (simplified), for the cursor row and others, whole and scrolled."""
    from rich.segment import Segment
    from rich.style import Style
    from rich.text import Text
    from textual.app import App
    from textual.widgets import DataTable

    from gpuctl.widgets.fleet_table import FleetTable

    class TableApp(App[None]):
        def compose(self):
            t = FleetTable(zebra_stripes=True, cursor_type="row")
            for i, w in enumerate((8, 3, 12, 20)):
                t.add_column(str(i), width=w, key=str(i))
            for r in range(4):
                t.add_row(Text(f"node-{r:02d}", style="bold"), Text(str(r)),
                          Text.assemble(("██▍", "#ff0000"), (f" {r}3%", "")),
                          Text("a cell much longer than its column", style="#00ff00 on #000000"), key=f"r{r}")
            yield t

    app = TableApp()
    async with app.run_test(size=(80, 10)) as pilot:
        await pilot.pause()
        t = app.query_one(FleetTable)
        t.move_cursor(row=2)
        await pilot.pause()
        compared = 0
        for base in (Style(), Style(color="#eeeeee", bgcolor="#123456")):
            for y in (1, 2, 3, 4):  # body lines (line 0 is the header)
                for x1, x2 in ((0, 80), (0, 30), (5, 40)):
                    t._forget_renders()
                    ours = list(Segment.simplify(t._render_line(y, x1, x2, base)))
                    theirs = list(Segment.simplify(DataTable._render_line(t, y, x1, x2, base)))
                    assert ours == theirs, (base, y, x1, x2)
                    assert t._render_line(y, x1, x2, base) is t._render_line(y, x1, x2, base)  # kept
                    compared += 1
        assert compared == 24


def test_header_totals_remembered_per_snapshot_and_never_shared(source):
    """totals_parts remembers its last answer (the poll worker computes it for the UI thread):
    the same snapshot, departments and palette give equal parts in a new list; another snapshot,
    another department list or another palette are computed afresh."""
    from gpuctl.widgets.palette import build_palette

    palette = build_palette({}, source.departments)
    depts = list(source.departments)
    s1 = source.snapshot()
    a = totals_parts(s1, depts, palette)
    b = totals_parts(s1, depts, palette)
    assert a == b and a is not b
    b.clear()
    assert totals_parts(s1, depts, palette) == a
    s2 = source.snapshot()
    s2.nodes[0].reachable = False
    down = totals_parts(s2, depts, palette)
    assert down[0].text == f"nodes {len(s2.nodes) - 1}/{len(s2.nodes)} up"
    fewer = totals_parts(s2, depts[:1], palette)
    assert len(fewer) <= len(down)
    from gpuctl.widgets import header

    other = build_palette({}, source.departments)
    assert totals_parts(s2, depts, other) == down and header._LAST_PARTS[2] is other


def test_replace_rows_without_the_cell_store_goes_cell_by_cell():
    """Another Textual version without DataTable._data: every cell through update_cell, column
    keys given by value; an empty change writes nothing."""
    from textual.widgets.data_table import ColumnKey

    class Stub:
        def __init__(self):
            self.calls = []

        def update_cell(self, row_key, col_key, value):
            self.calls.append((row_key, col_key, value))

    stub = Stub()
    fleet_screen.replace_rows(stub, {})
    assert stub.calls == []
    fleet_screen.replace_rows(stub, {"gpu-1": {ColumnKey("sm"): "a", ColumnKey("power"): "b"}, "gpu-2": {"sm": "c"}})
    assert stub.calls == [("gpu-1", "sm", "a"), ("gpu-1", "power", "b"), ("gpu-2", "sm", "c")]
