"""Navigation, command bar, modals, header, hidden screens, quitting."""

from __future__ import annotations

import subprocess
import sys

import pytest
from textual.widgets import DataTable

from gpuctl import model

from tests.support.console import (
    SIZE, WIDE, cell, make_app, poll, post_keys, screen_lines, settle, stack_names, table, type_text,
)

from gpuctl.screens.fleet import FleetScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen

from gpuctl.screens.too_small import TooSmallScreen

from gpuctl import format as fmt


# -- navigation, command bar, modals, header, hidden screens, quitting -------------------------


async def test_a_second_navigation_key_while_its_screen_is_shown_or_pushed_does_nothing(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("l", "l")  # was DuplicateIds: LeasesScreen(id='leases')
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "LeasesScreen"]
        post_keys(app, "l", "l", "l")  # all queued before the first push has mounted
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "LeasesScreen"]
        leases = app.screen
        post_keys(app, "d", "d", "l", "d")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "BoardScreen"]
        board = app.screen
        assert app.run_command("depts") and app.run_command(":depts")
        assert app.run_command("leases") and app.run_command("leases")  # same tick: pushed once
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "LeasesScreen"]
        assert app.screen is leases  # the installed screen, pushed by name again
        assert app.run_command("depts")
        await settle(app, pilot)
        assert app.screen is board
        assert app.run_command("nodes") and app.run_command("nodes")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen"]
        assert app.return_code is None


async def test_node_command_twice_is_one_screen_and_another_node_replaces_it(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.run_command("depts")
        await settle(app, pilot)
        assert app.run_command("node node-02") and app.run_command("node node-02")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "BoardScreen", "NodeDetailScreen"]
        assert app.screen.node_name == "node-02"
        assert app.run_command("node node-03")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "BoardScreen", "NodeDetailScreen"]
        assert app.screen.node_name == "node-03"
        await pilot.press("d")  # the board is below: back down to it
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "BoardScreen"]


async def test_navigation_keys_do_nothing_while_a_dialog_is_open(source):
    from gpuctl.screens.move_dialog import DepartmentPickerScreen

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.run_command("depts")
        await settle(app, pilot)
        await pilot.press("m")
        await settle(app, pilot)
        assert isinstance(app.screen, DepartmentPickerScreen)
        await pilot.press("l", "colon", "question_mark")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "BoardScreen", "DepartmentPickerScreen"]


async def test_keys_typed_right_after_colon_go_into_the_command_bar(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        # `:theme gpuctl-light` typed fast: its `l`s and `d`... must not open leases / the board
        post_keys(app, "colon", *"theme", "space", *"gpuctl", "minus", *"light", "enter")
        await settle(app, pilot)
        assert app.theme == "gpuctl-light"
        assert stack_names(app) == ["FleetScreen"]
        post_keys(app, "colon", *"node", "space", *"node", "minus", "0", "2", "enter")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "NodeDetailScreen"]
        assert app.screen.node_name == "node-02"
        # `:` right after a key that pushes a screen, before that screen (and its bar) is composed:
        # the keys are held until its bar opens
        post_keys(app, "l", "colon", *"node", "space", *"node", "minus", "0", "3", "enter")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "LeasesScreen", "NodeDetailScreen"]
        assert app.screen.node_name == "node-03"
        # Enter / Escape in the bar act before the keys typed after them
        post_keys(app, "colon", *"nodes", "enter", "l", "colon", *"depts", "escape", "d")
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "BoardScreen"]
        assert list(app.flash_log) == []


async def test_command_bar_is_one_line_over_the_visible_screen(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        fleet = app.screen
        table_region = table(app).region
        await pilot.press("colon")
        await pilot.pause()
        assert app.screen is fleet  # no screen pushed: the fleet stays on view
        bar = fleet.command_bar
        assert bar is not None and bar.is_open and app.focused is bar.input
        assert bar.region.height == 1 and bar.region.y == SIZE[1] - 1  # in the footer's place
        lines = screen_lines(app)
        assert "node-01" in "\n".join(lines[:-1])
        assert lines[-1].startswith(" :")
        assert table(app).region == table_region  # the screen's layout is unchanged
        await type_text(pilot, "leases")
        assert screen_lines(app)[-1].startswith(" :leases")
        await pilot.press("escape")
        await pilot.pause()
        assert not bar.is_open and app.focused is table(app) and app.screen is fleet
        assert "Quit" in screen_lines(app)[-1]  # the footer is back


async def test_modals_dim_the_screen_behind_and_too_small_covers_it(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert 0 < app.screen.styles.background.a < 1
        lines = screen_lines(app)
        assert "node-01" in "\n".join(lines)  # the fleet shows through, dimmed
        await pilot.press("escape")
        await pilot.resize_terminal(40, 10)
        await pilot.pause()
        assert isinstance(app.screen, TooSmallScreen)
        assert app.screen.styles.background.a == 1
        assert "node-01" not in "\n".join(screen_lines(app))


async def test_a_dialog_dims_the_board_cheaply_and_keeps_it_up_to_date(source, monkeypatch):
    from textual.renderables.background_screen import BackgroundScreen

    from gpuctl.screens.move_dialog import DepartmentPickerScreen

    rich_renders = []
    real = BackgroundScreen.__rich_console__
    monkeypatch.setattr(BackgroundScreen, "__rich_console__",
                        lambda self, console, options: rich_renders.append(1) or real(self, console, options))
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.run_command("depts")
        await settle(app, pilot)
        reparses = []
        real_reparse = app.stylesheet.reparse
        monkeypatch.setattr(app.stylesheet, "reparse", lambda: reparses.append(1) or real_reparse())
        await pilot.press("m")
        await settle(app, pilot)
        picker = app.screen
        assert isinstance(picker, DepartmentPickerScreen)
        assert reparses == []  # no per-dialog CSS: the first open re-styled the whole app
        assert rich_renders == []  # Textual's re-render-and-blend-every-segment path is not used
        drawn = picker.backdrop_lines_drawn
        assert SIZE[1] <= drawn <= 6 * SIZE[1]
        await pilot.press("down", "down")
        await settle(app, pilot)
        assert picker.backdrop_lines_drawn == drawn  # the dialog's own repaints redraw no backdrop
        lines = screen_lines(app)
        assert "research" in lines[2]  # the board shows through (column titles)
        await pilot.resize_terminal(100, 30)
        await settle(app, pilot)
        assert picker.backdrop_lines_drawn >= drawn + 30  # a new size draws it again


async def test_help_lists_each_key_once_and_every_screens_keys(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.run_command("depts")
        await settle(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        sections = help_screen.help_sections()
        titles = [t for t, _ in sections]
        assert titles[:3] == ["keys here (department board)", "keys everywhere", "commands (type : first)"]
        assert set(titles[3:]) == {"on the fleet", "on the node detail", "on the leases"}
        for _title, rows in sections:
            keys = [k for k, _ in rows]
            assert len(keys) == len(set(keys)), keys
        here = dict(sections[0][1])
        assert here["space"].startswith("select / unselect")
        assert here["m"].startswith("move the selection")
        assert here["esc"] == "cancel a drag, else clear the selection, else back"
        assert here["↑ ↓ ← →"] == "move between cards and columns"
        assert here["enter"] == "open the node of the focused card"
        everywhere = dict(sections[1][1])
        for key in (":", "/", "?", "q", "ctrl+p", "l", "d", "r"):
            assert key in everywhere, key
        node = dict(sections[titles.index("on the node detail")][1])
        assert node["esc / backspace"] == "back" and node["0 … 9"] == "show the GPU of that index"
        assert not any(k in node for k in "0123456789")
        # the box: its right edge in one column, top to bottom (by terminal cells)
        box = help_screen.query_one("VerticalScroll").region
        strips = app.screen._compositor.render_strips()

        def at(x: int, y: int) -> str:
            return strips[y].crop(x, x + 1).text

        right = box.right - 1
        assert at(box.x, box.y) == "╭" and at(right, box.y) == "╮"
        assert at(box.x, box.bottom - 1) == "╰" and at(right, box.bottom - 1) == "╯"
        for y in range(box.y + 1, box.bottom - 1):
            assert at(box.x, y) == "│" and at(right, y) == "│", y


async def test_header_names_the_node_and_fits_80_columns_by_dropping_parts(source):
    from gpuctl.widgets.header import TotalsPart, fit_totals, short_names

    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert app.run_command("node node-02")
        await settle(app, pilot)
        header = app.screen.query_one("FleetHeader")
        assert str(header.query_one("#header-title").render()) == "gpuctl ▸ node node-02"
        line = screen_lines(app)[0]
        # the GPU count and SM go first, then department names are shortened (the last first),
        # and only then is a department's total dropped (the last: unassigned)
        assert line.startswith(" gpuctl ▸ node node-02 · nodes 4/4 up · res ")
        assert "GPUs" not in line and "SM " not in line
        assert line.rstrip().endswith("· …")  # parts dropped whole, never cut in the middle
        totals = line.split(" · ")
        assert all(part.strip() for part in totals)
        share = {d: model.gpu_equivalents([s for n in app.snapshot.nodes for s in n.slices() if s.department == d])
                 for d in ("research", "training", "inference")}
        assert f"res {share['research']:g} · tra {share['training']:g} · inf {share['inference']:g} · …" in line
        assert "una" not in line
    palette = app.palette
    parts = [TotalsPart("nodes 3/4 up", "red", 0), TotalsPart("8 GPUs", "", 2), TotalsPart("SM 50%", "", 1),
             TotalsPart("a 1", "", 3), TotalsPart("b 2", "", 4)]
    assert str(fit_totals(parts, 200, palette)) == "· nodes 3/4 up · 8 GPUs · SM 50% · a 1 · b 2"
    assert str(fit_totals(parts, 36, palette)) == "· nodes 3/4 up · 8 GPUs · SM 50% · …"
    assert str(fit_totals(parts, 27, palette)) == "· nodes 3/4 up · SM 50% · …"
    assert str(fit_totals(parts, 5, palette)) == "· nodes 3/4 up · …"  # the node count always stays
    assert str(fit_totals([], 80, palette)) == "waiting for the first fleet snapshot…"
    named = [TotalsPart("nodes 4/4 up", "", 0), TotalsPart("SM 50%", "", 4),
             TotalsPart("research 1", "", 1, "res 1"), TotalsPart("training 2", "", 2, "tra 2"),
             TotalsPart("unassigned 3", "", 3, "una 3")]
    assert str(fit_totals(named, 64, palette)) == "· nodes 4/4 up · SM 50% · research 1 · training 2 · unassigned 3"
    assert str(fit_totals(named, 60, palette)) == "· nodes 4/4 up · research 1 · training 2 · unassigned 3 · …"
    assert str(fit_totals(named, 50, palette)) == "· nodes 4/4 up · research 1 · tra 2 · una 3 · …"
    assert str(fit_totals(named, 42, palette)) == "· nodes 4/4 up · res 1 · tra 2 · una 3 · …"
    assert str(fit_totals(named, 41, palette)) == "· nodes 4/4 up · res 1 · tra 2 · …"
    assert short_names(["research", "res", "training", "train", "inference"]) == {
        "research": "rese", "res": "res", "training": "traini", "train": "train", "inference": "inf"}


async def test_header_totals_repaint_without_a_layout_pass(source, monkeypatch):
    from textual.widget import Widget

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        header = app.screen.query_one("FleetHeader")
        mine = {header, *header.query("*")}
        layouts = []
        real = Widget.refresh

        def spy(self, *regions, **kw):
            if self in mine and kw.get("layout"):
                layouts.append(self)
            return real(self, *regions, **kw)

        monkeypatch.setattr(Widget, "refresh", spy)
        before = after = str(header.query_one("#header-totals").render())
        for _ in range(10):
            await poll(app, pilot)
            after = str(header.query_one("#header-totals").render())
            if after != before:
                break
        assert after != before  # the SM mean moved
        assert layouts == []


async def test_only_the_top_screen_renders_snapshots_and_catches_up_when_shown(source, monkeypatch):
    shown: list[str] = []
    for cls in (FleetScreen, LeasesScreen):
        real = cls.show_snapshot
        monkeypatch.setattr(cls, "show_snapshot",
                            lambda self, snap, _real=real: shown.append(type(self).__name__) or _real(self, snap))
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        assert app.run_command("leases")
        await settle(app, pilot)
        shown.clear()
        await poll(app, pilot)
        await poll(app, pilot)
        # every poll renders the top screen (the app's own refresh timer may add polls on a slow
        # machine); the fleet table below: nothing
        assert len(shown) >= 2 and set(shown) == {"LeasesScreen"}
        await pilot.press("question_mark")
        await pilot.pause()
        shown.clear()
        await poll(app, pilot)
        assert shown == []  # under a modal (its backdrop is rendered once) nothing redraws
        await pilot.press("escape")
        await pilot.pause()
        assert shown == ["LeasesScreen"]  # shown again: redrawn from the latest snapshot
        await pilot.press("escape")
        await settle(app, pilot)
        assert shown == ["LeasesScreen", "FleetScreen"]
        latest = app.snapshot
        gpu = latest.nodes[0].gpus[0]
        assert cell(app, gpu.uuid, "power") == fmt.power(gpu.sample.power_w)


@pytest.mark.parametrize("size", [SIZE, (80, 24), WIDE])
async def test_leases_table_fits_without_a_horizontal_scrollbar_and_rows_align(source, size):
    app = make_app(source)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        assert app.run_command("leases")
        await settle(app, pilot)
        t = app.screen.query_one("#leases-table", DataTable)
        assert not t.show_horizontal_scrollbar
        assert t.virtual_size.width <= t.scrollable_content_region.width
        lines = screen_lines(app)
        head = next(line for line in lines if " department " in line)
        rows = [line for line in lines if "lease-000" in line]
        assert len(rows) == 2
        col = head.index(" department ") + 1
        departments = {lease.id: lease.department for n in app.snapshot.nodes for lease in n.leases}
        for row in rows:
            lease_id = row.split()[0]
            assert row[col:].startswith(departments[lease_id]), (row, col)
        from gpuctl.screens.leases import LEASE_COLUMNS, lease_columns

        keys = [c[0] for c in app.screen.columns]
        assert keys[:1] == ["id"] and "department" in keys and "owner" in keys
        if size[0] >= 130:  # full lease ids (18 cells): every column from 126 cells on
            assert keys == [c[0] for c in LEASE_COLUMNS]
    assert [c[0] for c in lease_columns(70)] == ["id", "department", "owner", "expires"]


QUIT_SCRIPT = r"""
import sys, threading, time
from gpuctl.app import build_app
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.themes import REPO_THEMES_DIR

class StuckSource(SimulatedFleetSource):
    started = threading.Event()
    def snapshot(self):
        StuckSource.started.set()
        time.sleep(30)  # a node that does not answer
        return super().snapshot()

app = build_app(StuckSource(nodes=2, gpus_per_node=2, seed=0), theme_dirs=[REPO_THEMES_DIR])

async def auto(pilot):
    while not StuckSource.started.is_set():
        await pilot.pause(0.05)
    print("q", time.monotonic(), flush=True)
    await pilot.press("q")

app.run(headless=True, size=(80, 24), auto_pilot=auto)
print("returned", time.monotonic(), flush=True)
"""


def test_quit_does_not_wait_for_a_poll_in_flight():
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", QUIT_SCRIPT], cwd=root, capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    wall = time.monotonic() - t0
    stamps = dict(line.split() for line in out.stdout.splitlines() if line.startswith(("q ", "returned ")))
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(stamps["returned"]) - float(stamps["q"]) < 2.0  # was 30 s: asyncio.run joined the poll
    assert wall < 20.0
