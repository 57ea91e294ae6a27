"""The `:` bar, help, the read-only badge, node detail and leases screens, polling."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from gpuctl import model

from tests.support.console import SIZE, WIDE, cell, make_app, poll, settle, styles_of, table, type_text
from gpuctl.fleet.simulated import FleetSourceError, SimulatedFleetSource
from gpuctl.screens.fleet import FleetScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen
from gpuctl.screens.node_detail import NodeDetailScreen

from gpuctl import format as fmt


# -- command bar, help, badge -------------------------------------------------------------------


async def test_command_bar_node_opens_detail_with_history(source):
    from gpuctl.widgets.metric_plot import MetricPlot

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("colon")
        await type_text(pilot, "node node-03")
        await pilot.press("enter")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, NodeDetailScreen)
        assert screen.node_name == "node-03"
        node = app.snapshot.node("node-03")
        gpu_list = screen.query_one("#gpu-list")
        assert gpu_list.option_count == 8
        assert str(gpu_list.get_option_at_index(0).prompt) == f"GPU 0 {fmt_state(node.gpus[0])}"
        first = node.gpus[0].uuid
        assert screen.selected_uuid == first
        # only the selected GPU's history is fetched: 120 warm-up samples + the snapshot's one
        assert list(screen._history) == [first]
        assert len(screen._history[first].samples) == 121
        _, ring = source.history("node-03", first)
        plot = screen.query_one("#plot-sm", MetricPlot)
        assert plot.runs == [([(s.timestamp_s - ring[-1].timestamp_s) / 60.0 for s in ring],
                              [s.sm_util_pct for s in ring])]
        assert plot.ylim == (0.0, 100.0)
        assert plot.title == f"SM util (%) {ring[-1].sm_util_pct:.0f} (max {max(s.sm_util_pct for s in ring):.0f})"
        mem = screen.query_one("#plot-memory", MetricPlot)
        assert mem.ylim == (0.0, ring[-1].memory_total_bytes / fmt.GIB)
        assert mem.runs[0][1][-1] == ring[-1].memory_used_bytes / fmt.GIB
        # the plot renders with axes in minutes
        rendered = str(plot.render())
        assert "-10m" in rendered and "now" in rendered and "SM util (%)" in rendered


def fmt_state(gpu) -> str:
    from gpuctl.widgets.fleet_rows import gpu_state

    return gpu_state(gpu)


async def test_node_detail_gpu_selector_keys_and_incremental_history(source):
    from gpuctl.widgets.metric_plot import MetricPlot

    calls = []
    real = source.history

    def history(node, uuid, since=0):
        calls.append((node, uuid, since))
        return real(node, uuid, since)

    source.history = history  # type: ignore[method-assign]
    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        app.open_node("node-02")
        await settle(app, pilot)
        screen = app.screen
        gpus = app.snapshot.node("node-02").gpus
        assert calls == [("node-02", gpus[0].uuid, 0)]
        await pilot.press("right_square_bracket")
        await settle(app, pilot)
        assert screen.selected_uuid == gpus[1].uuid
        assert calls[-1] == ("node-02", gpus[1].uuid, 0)
        await pilot.press("7")
        await settle(app, pilot)
        assert screen.selected_uuid == gpus[7].uuid
        await pilot.press("left_square_bracket")
        await settle(app, pilot)
        assert screen.selected_uuid == gpus[6].uuid
        await pilot.press("9")  # no GPU 9: a flash, selection unchanged
        await pilot.pause()
        assert screen.selected_uuid == gpus[6].uuid
        assert app.flash_log[-1] == "node-02 has no GPU 9"
        # back to GPU 1 after a poll: only the samples after its cursor are fetched
        cursor = screen._history[gpus[1].uuid].cursor
        await poll(app, pilot)
        await pilot.press("1")
        await settle(app, pilot)
        assert calls[-1] == ("node-02", gpus[1].uuid, cursor)
        assert len(screen._history[gpus[1].uuid].samples) == 122
        # the arrow keys in the GPU list select too
        screen.query_one("#gpu-list").focus()
        await pilot.press("down")
        await settle(app, pilot)
        assert screen.selected_uuid == gpus[2].uuid
        assert screen.query_one("#plot-sm", MetricPlot).runs
        app.export_screenshot()  # renders at 80x24 without error


async def test_enter_on_a_gpu_row_opens_that_gpu(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        table(app).focus()
        table(app).move_cursor(row=12)  # node-02, GPU 4
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, NodeDetailScreen)
        assert app.screen.selected_uuid == app.snapshot.node("node-02").gpus[4].uuid


async def test_node_detail_na_gaps_stay_gaps(source, monkeypatch):
    from gpuctl.widgets.metric_plot import MetricPlot, metric_runs

    real = source.history

    def with_gaps(node, uuid, since=0):
        cursor, samples = real(node, uuid, since)
        for s in samples[50:60]:
            s.power_w = None  # NVML NotSupported for a while
        return cursor, samples

    monkeypatch.setattr(source, "history", with_gaps)
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.open_node("node-02")
        await settle(app, pilot)
        runs = app.screen.query_one("#plot-power", MetricPlot).runs
        assert [len(xs) for xs, _ in runs] == [50, 61]
        assert all(y is not None and y > 0 for _, ys in runs for y in ys)
        sm_runs = app.screen.query_one("#plot-sm", MetricPlot).runs
        assert [len(xs) for xs, _ in sm_runs] == [121]


def test_metric_runs_split_on_na_and_time_gaps():
    from gpuctl.widgets.metric_plot import metric_runs

    def s(t, sm, error=None):
        return model.GpuSample(uuid="GPU-a", timestamp_s=t, sm_util_pct=sm, error=error)

    samples = [s(0, 10.0), s(1, 20.0), s(2, None), s(3, 30.0), s(30, 40.0), s(31, 0.0), s(32, 5.0, error="lost")]
    runs = metric_runs(samples, "sm", max_gap_s=5.0)
    newest = 32
    assert runs == [
        ([(0 - newest) / 60, (1 - newest) / 60], [10.0, 20.0]),
        ([(3 - newest) / 60], [30.0]),
        ([(30 - newest) / 60, (31 - newest) / 60], [40.0, 0.0]),  # a real 0 is kept
    ]
    assert metric_runs([], "sm") == []
    with pytest.raises(ValueError, match="unknown metric 'fan'"):
        metric_runs(samples, "fan")


async def test_node_detail_history_error_keeps_what_it_had(source, monkeypatch):
    from gpuctl.widgets.metric_plot import MetricPlot

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.open_node("node-01")
        await settle(app, pilot)
        screen = app.screen
        uuid = screen.selected_uuid
        held = list(screen._history[uuid].samples)
        cursor = screen._history[uuid].cursor

        def broken(node, gpu, since=0):
            raise FleetSourceError(f"{node}: unreachable (ssh: timed out after 5.0 s)")

        monkeypatch.setattr(source, "history", broken)
        screen._fetch()
        await settle(app, pilot)
        assert screen._errors[uuid] == "history unavailable: node-01: unreachable (ssh: timed out after 5.0 s)"
        assert list(screen._history[uuid].samples) == held and screen._history[uuid].cursor == cursor
        plot = screen.query_one("#plot-sm", MetricPlot)
        assert plot.note.endswith("· history unavailable: node-01: unreachable (ssh: timed out after 5.0 s)")
        assert len(plot.runs[0][0]) == len(held)


async def test_node_detail_lists_slices_leases_and_usage(source):
    from gpuctl.screens.node_detail import slices_text

    _with_usage(source, {"lease-0002": {"memory_in_use_bytes": 12 * fmt.GIB, "ops_per_s": 56.0}})
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        node = app.snapshot.node("node-02")
        gpu = next(g for g in node.gpus if any(s.leased for s in g.slices))
        app.open_node("node-02")
        await settle(app, pilot)
        app.screen.select_gpu(gpu.uuid)
        await settle(app, pilot)
        text = str(app.screen.query_one("#gpu-slices").render())
        assert text == str(slices_text(node, gpu, app.palette))
        leased = next(s for s in gpu.slices if s.leased)
        assert f"leased lease-0002 alice@ws12 expires {fmt.utc_time(node.leases[0].expires_s)}" in text
        assert "in use 12.0 GiB · 56 op/s" in text
        assert f"#{leased.id.rsplit('/', 1)[1]} {fmt.fraction_glyph(leased.fraction)} {leased.department}" in text


async def test_command_bar_unknown_command_flashes_and_changes_nothing(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("colon")
        await type_text(pilot, "frobnicate")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        assert "unknown command: 'frobnicate'" in app.flash_log[-1]
        assert app.run_command("node nosuch") is False
        assert "unknown node 'nosuch'" in app.flash_log[-1]
        assert isinstance(app.screen, FleetScreen)
        assert app.run_command("node") is False
        assert app.flash_log[-1] == "usage: :node NAME"


async def test_command_bar_escape_cancels(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("colon")
        await type_text(pilot, "leases")
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        assert list(app.flash_log) == []


async def test_depts_without_board_flashes(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        if app.is_screen_installed("board"):  # gpuctl/screens/board.py exists: take it away
            app.uninstall_screen("board")
        assert app.run_command("depts") is False
        assert app.flash_log[-1] == "board not available"
        assert isinstance(app.screen, FleetScreen)


async def test_depts_pushes_installed_board(source):
    from gpuctl.screens.base import GpuctlScreen

    class FakeBoard(GpuctlScreen):
        VIEW = "departments"

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        if app.is_screen_installed("board"):
            app.uninstall_screen("board")
        app.install_screen(FakeBoard(), "board")
        assert app.run_command(":depts") is True
        await pilot.pause()
        assert isinstance(app.screen, FakeBoard)
        assert app.run_command("nodes") is True
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)


async def test_leases_screen_lists_leases(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.run_command("leases")
        await pilot.pause()
        assert isinstance(app.screen, LeasesScreen)
        t = app.screen.query_one("#leases-table", DataTable)
        leases = [lease for n in app.snapshot.nodes for lease in n.leases]
        assert len(leases) == 2
        assert {k.value for k in t.rows} == {lease.id for lease in leases}
        assert str(t.get_cell(leases[0].id, "owner")).strip() == "alice@ws12"
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)


async def test_quit_command_exits(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        exits = []
        app.exit = lambda *a, **k: exits.append(a)  # type: ignore[method-assign]
        assert app.run_command(":quit") is True
        assert app.run_command("q") is True
        assert len(exits) == 2


async def test_help_lists_keys_and_commands(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        rows = dict(app.screen.help_rows())
        assert rows["/"].startswith("filter the GPUs") and rows["q"] == "quit"
        assert rows[":"].startswith("command bar") and rows["?"] == "this help"
        assert rows["r"] == "refresh now" and rows["esc"] == "clear the filter"
        assert rows["enter"] == "open the node of the GPU under the cursor"
        assert rows["ctrl+p"].startswith("command palette")
        for command in (":nodes", ":depts", ":leases", ":node NAME", ":q  :quit"):
            assert command in rows
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)


@pytest.mark.parametrize("readonly", [True, False])
async def test_readonly_badge(source, readonly):
    app = make_app(source, readonly=readonly)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        badge = app.screen.query_one("#header-badge")
        assert badge.display is readonly
        assert str(badge.render()) == "READ-ONLY"


async def test_header_totals(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        text = str(app.screen.query_one("#header-totals").render())
        assert text.startswith("· nodes 4/4 up · 32 GPUs · SM ")
        assert str(app.screen.query_one("#header-title").render()) == "gpuctl ▸ fleet"
        utils = [g.sample.sm_util_pct for n in app.snapshot.nodes for g in n.gpus]
        assert f"SM {sum(utils) / len(utils):.0f}%" in text
        research = model.gpu_equivalents([s for n in app.snapshot.nodes for s in n.slices() if s.department == "research"])
        assert f"research {research:g}" in text


async def test_poll_failure_flashes_once_and_keeps_last_snapshot(source, monkeypatch):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        good = app.snapshot

        def broken():
            raise OSError("ssh agent gone")

        monkeypatch.setattr(source, "snapshot", broken)
        await poll(app, pilot)
        await poll(app, pilot)
        assert app.snapshot is good
        assert table(app).row_count == 32
        failures = [m for m in app.flash_log if m.startswith("fleet poll failed")]
        assert failures == ["fleet poll failed: OSError: ssh agent gone"]


async def test_polls_are_chained_by_a_one_shot_timer(source):
    import threading
    import time

    running, overlaps, calls = [], [], []
    lock = threading.Lock()
    real = source.snapshot

    def slow():
        with lock:
            running.append(1)
            overlaps.append(len(running))
        time.sleep(0.08)  # a poll slower than refresh_s must not let the next one start early
        calls.append(time.monotonic())
        with lock:
            running.pop()
        return real()

    source.snapshot = slow  # type: ignore[method-assign]
    app = make_app(source, refresh_s=0.02)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.6)
    assert len(calls) >= 3
    assert max(overlaps) == 1


async def test_scale_128_nodes_updates_in_place():
    src = SimulatedFleetSource(nodes=128, gpus_per_node=8, history_warmup_samples=0)
    app = make_app(src)
    async with app.run_test(size=(200, 60)) as pilot:
        await settle(app, pilot)
        assert table(app).row_count == 1024
        last = app.snapshot.nodes[-1]
        assert last.name == "node-128"
        await poll(app, pilot)
        gpu = app.snapshot.nodes[-1].gpus[-1]
        assert cell(app, gpu.uuid, "power") == fmt.power(gpu.sample.power_w)
        assert cell(app, gpu.uuid, "node") == "node-128"


async def test_unchanged_cells_are_not_rewritten():
    """Diff-only updates: a poll with the same figures writes no cell and keeps the same objects."""
    src = SimulatedFleetSource(frozen=True)
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        t = table(app)
        uuid = app.snapshot.nodes[0].gpus[1].uuid
        before = {col: t.get_cell(uuid, col) for col in ("node", "gpu", "sm", "memory", "power", "slices", "state")}
        real = t._update_count
        await poll(app, pilot)
        after = {col: t.get_cell(uuid, col) for col in before}
        assert all(after[c] is before[c] for c in before), [c for c in before if after[c] is not before[c]]
        # only the sparklines moved (one more point each): one bulk write of the history column
        history = [str(t.get_cell(g.uuid, "history")) for n in app.snapshot.nodes for g in n.gpus]
        assert all(h.strip() and len(h.strip()) == 2 for h in history)
        assert t._update_count == real + 1


@pytest.mark.parametrize(
    "width, layout, columns",
    [  # with the simulated fleet's names ("H100 80GB HBM3": a 14-cell name column)
        (200, "full", ["node", "gpu", "sm", "memory", "temperature", "power", "history", "slices", "usage",
                       "lease", "state", "name"]),
        (170, "wide", ["node", "gpu", "sm", "memory", "temperature", "power", "slices", "usage",
                       "lease", "state", "name"]),
        (160, "wide-lease", ["node", "gpu", "sm", "memory", "temperature", "slices", "usage", "lease", "state",
                             "name"]),
        (120, "compact", ["node", "gpu", "sm", "memory", "temperature", "slices", "state", "name"]),
        (100, "narrow-named", ["node", "gpu", "sm", "memory", "slices", "state", "name"]),
        (80, "narrow", ["node", "gpu", "sm", "memory", "slices", "state"]),
        (70, "tiny", ["node", "gpu", "sm", "slices", "state"]),
        (60, "minimal", ["node", "gpu", "sm", "slices"]),
    ],
)
def test_layout_for_width_drops_columns_by_priority(width, layout, columns):
    from gpuctl.widgets.fleet_rows import layout_for

    chosen = layout_for(width - 1, 14)  # the table leaves one cell to its scrollbar
    assert chosen.name == layout
    assert list(chosen.keys) == columns
    assert chosen.width <= width - 1 or layout == "minimal"


async def test_80x24_shows_departments_in_color_and_resize_switches_layout(source):
    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        t = table(app)
        assert app.screen.table_layout.name == "narrow"
        assert [str(c.label) for c in t.ordered_columns] == ["node", "#", "SM util", "memory", "slices (● leased)", "state"]
        assert sum(c.get_render_width(t) for c in t.ordered_columns) <= 79
        node = app.snapshot.nodes[0]
        for gpu in node.gpus:
            text = t.get_cell(gpu.uuid, "slices")
            first = gpu.slices[0].department
            assert str(text).startswith(first)
            assert app.palette.department(first) in styles_of(text)
        # the slices column is on screen: the first GPU's rendered line holds its whole slices text
        line = "".join(seg.text for seg in t.render_line(1))
        assert len(line) == t.size.width <= 80
        assert str(t.get_cell(node.gpus[0].uuid, "slices")) in line
        assert "slices (● leased)" in "".join(seg.text for seg in t.render_line(0))
        cursor = node.gpus[5].uuid
        t.move_cursor(row=5)
        await pilot.resize_terminal(200, 60)
        await pilot.pause()
        assert app.screen.table_layout.name == "full"
        assert t.row_count == 32
        assert str(t.get_cell(cursor, "power")) == fmt.power(app.snapshot.nodes[0].gpus[5].sample.power_w)
        assert app.screen.cursor_key() == cursor
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.screen.table_layout.name == "narrow"
        assert app.screen.cursor_key() == cursor
        mem = node.gpus[0].sample
        assert cell(app, node.gpus[0].uuid, "memory") == fmt.memory_label(mem.memory_used_bytes, mem.memory_total_bytes)


def _with_usage(source, usage_by_lease):
    """Make source.snapshot() report Slice.usage for leased slices (as gpuctld does)."""
    real = source.snapshot

    def snapshot():
        snap = real()
        for n in snap.nodes:
            for s in n.slices():
                if s.lease_id is not None:
                    s.usage = usage_by_lease.get(s.lease_id)
        return snap

    source.snapshot = snapshot  # type: ignore[method-assign]


async def test_lease_usage_shown_for_leased_slices(source):
    _with_usage(source, {
        "lease-0001": {"memory_in_use_bytes": 3 * fmt.GIB, "ops_per_s": 1234.0, "bytes_in": 0, "bytes_out": 0},
        "lease-0002": {"memory_in_use_bytes": None, "ops_per_s": 12.0},
    })
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        n1, n2 = app.snapshot.nodes[0], app.snapshot.nodes[1]
        g1 = next(g for g in n1.gpus if any(s.leased for s in g.slices))
        assert cell(app, g1.uuid, "usage") == "3.0 GiB 1.2k op/s"
        assert cell(app, g1.uuid, "lease") == "alice@ws12"
        g2 = next(g for g in n2.gpus if any(s.leased for s in g.slices))
        assert cell(app, g2.uuid, "usage") == "N/A 12 op/s"  # memory not reported: N/A, never 0
        idle = next(g for g in n1.gpus if not any(s.leased for s in g.slices))
        assert cell(app, idle.uuid, "usage") == ""


async def test_lease_without_usage_shows_nothing(source):
    _with_usage(source, {})
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        g = next(g for g in app.snapshot.nodes[0].gpus if any(s.leased for s in g.slices))
        assert cell(app, g.uuid, "usage") == ""
        assert cell(app, g.uuid, "state") == "leased"


def test_lease_usage_sums_and_ignores_bad_figures():
    from gpuctl.widgets.fleet_rows import lease_usage

    def sl(k, lease, usage):
        return model.Slice(id=f"GPU-a/{k}", gpu_uuid="GPU-a", fraction=0.25, memory_quota_bytes=1, compute_share=0.25,
                           department="research", lease_id=lease, usage=usage)

    slices = [
        sl(0, "l1", {"memory_in_use_bytes": 100, "ops_per_s": 2.5}),
        sl(1, "l1", {"memory_in_use_bytes": 50, "ops_per_s": float("nan")}),
        sl(2, "l2", {"memory_in_use_bytes": True, "ops_per_s": -1}),
        sl(3, None, {"memory_in_use_bytes": 10**12, "ops_per_s": 10**9}),  # idle: not counted
    ]
    assert lease_usage(slices) == (150, 2.5)
    assert lease_usage(slices[2:]) == (None, None)
    assert lease_usage([]) == (None, None)


async def test_fleet_table_fast_cells_render_like_datatable():
    """FleetTable's own rendering of one-line Text cells gives DataTable's segments."""
    from rich.segment import Segment
    from rich.style import Style
    from rich.text import Text
    from textual.app import App

    from gpuctl.widgets.fleet_table import FleetTable

    cells = [
        Text("node-01", style="bold", no_wrap=True, end=""),
        Text("", end=""),
        Text.assemble(("██▍  ", "#ff0000"), (" 93%", ""), no_wrap=True, end=""),
        Text("a cell much longer than its column", style="#00ff00 on #000000", no_wrap=True, end=""),
        Text("N/A 71°C ½ ●", no_wrap=True, end=""),
        Text("ellipsis cropped text", overflow="ellipsis", no_wrap=True, end=""),
    ]

    class TableApp(App[None]):
        def compose(self):
            t = FleetTable(zebra_stripes=True, cursor_type="row")
            for i in range(len(cells)):
                t.add_column(str(i), width=10, key=str(i))
            t.add_row(*cells, key="r0")
            t.add_row(*cells, key="r1")
            yield t

    app = TableApp()
    async with app.run_test(size=(100, 10)) as pilot:
        await pilot.pause()
        t = app.query_one(FleetTable)
        compared = 0
        for row in (0, 1):
            for col in range(len(cells)):
                for cursor in (False, True):
                    for base in (Style(), Style(color="#eeeeee", bgcolor="#123456")):
                        w = t.ordered_columns[col].get_render_width(t)
                        ours = [list(Segment.simplify(line)) for line in t._render_cell(row, col, base, w, cursor)]
                        theirs = [list(Segment.simplify(line)) for line in DataTable._render_cell(t, row, col, base, w, cursor)]
                        assert ours == theirs, (row, col, cursor, base)
                        compared += 1
        assert compared == 48
        # a whole line: the cached path gives the same strip as a fresh render after a change
        strip = t.render_line(1)
        t.update_cell("r0", "0", Text("node-99", end=""))
        await pilot.pause()
        assert "node-99" in "".join(seg.text for seg in t.render_line(1))
        assert strip is not None


async def test_fleet_table_waits_while_covered_and_catches_up(source):
    """Under an opaque screen (leases, board, node detail) the table is not updated; it shows the
    latest snapshot as soon as it is on top again."""
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        fleet = app.screen
        t = table(app)
        uuid = app.snapshot.nodes[0].gpus[0].uuid
        app.run_command("leases")
        await pilot.pause()
        count = t._update_count
        await poll(app, pilot)
        assert t._update_count == count  # nothing written while covered
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is fleet
        assert t._update_count > count
        assert str(t.get_cell(uuid, "power")) == fmt.power(app.snapshot.nodes[0].gpus[0].sample.power_w)


async def test_gc_thresholds_raised_while_running_and_restored(source):
    import gc

    from gpuctl.app import CONSOLE_GC_THRESHOLD

    before = gc.get_threshold()
    assert before != CONSOLE_GC_THRESHOLD
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert gc.get_threshold() == CONSOLE_GC_THRESHOLD
    assert gc.get_threshold() == before
