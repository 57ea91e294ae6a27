"""Console tests (Textual Pilot) on an in-process SimulatedFleetSource, plus the source itself."""

from __future__ import annotations

import subprocess
import sys

import pytest
from textual.widgets import DataTable

from gpuctl import model
from gpuctl.app import GpuctlApp, build_app
from tests.support.console import make_app
from gpuctl.fleet.simulated import FROZEN_TIME_S, FleetSourceError, SimulatedFleetSource
from gpuctl.screens.fleet import FleetScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen
from gpuctl.screens.node_detail import NodeDetailScreen
from gpuctl.screens.too_small import TooSmallScreen
from gpuctl.themes import REPO_THEMES_DIR
from gpuctl import format as fmt
from gpuctl.widgets.fleet_rows import _wrap_into

SIZE = (120, 40)
#: Wide enough for the full layout (every column of the fleet table).
WIDE = (200, 60)


async def settle(app: GpuctlApp, pilot) -> None:
    """Wait for running workers (poll, history) and for the messages they posted."""
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def poll(app: GpuctlApp, pilot) -> None:
    app.poll()
    await settle(app, pilot)


def table(app: GpuctlApp) -> DataTable:
    return app.screen.query_one("#fleet-table", DataTable)


def cell(app: GpuctlApp, row_key: str, column: str) -> str:
    return str(table(app).get_cell(row_key, column))


def styles_of(text) -> str:
    """Every style of a Rich Text cell (its own and its spans'), as one string."""
    return " ".join([str(text.style)] + [str(span.style) for span in text.spans])


async def type_text(pilot, text: str) -> None:
    for ch in text:
        await pilot.press({" ": "space", "-": "minus", ":": "colon", "/": "slash"}.get(ch, ch))


@pytest.fixture
def source():
    src = SimulatedFleetSource(nodes=4, gpus_per_node=8, seed=0)
    try:
        yield src
    finally:
        src.close()


# -- fleet screen -------------------------------------------------------------------------------


async def test_fleet_lists_every_gpu_row_keyed_by_uuid(source):
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        assert isinstance(app.screen, FleetScreen)
        t = table(app)
        assert t.row_count == 32
        uuids = {g.uuid for n in app.snapshot.nodes for g in n.gpus}
        assert {k.value for k in t.rows} == uuids
        first = app.snapshot.nodes[0].gpus[3]
        assert cell(app, first.uuid, "node") == "node-01"
        assert cell(app, first.uuid, "gpu") == "3"
        assert cell(app, first.uuid, "name") == "H100 80GB HBM3"


async def test_values_update_after_a_poll(source):
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        before = {k.value: [str(c) for c in table(app).get_row(k)] for k in table(app).rows}
        first_snapshot = app.snapshot
        await poll(app, pilot)
        assert app.snapshot is not first_snapshot
        changed = 0
        for node in app.snapshot.nodes:
            for gpu in node.gpus:
                s = gpu.sample
                assert cell(app, gpu.uuid, "power") == fmt.power(s.power_w)
                assert cell(app, gpu.uuid, "temperature") == fmt.temperature(s.temperature_c)
                assert cell(app, gpu.uuid, "sm").endswith(fmt.percent(s.sm_util_pct))
                assert fmt.memory_label(s.memory_used_bytes, s.memory_total_bytes) in cell(app, gpu.uuid, "memory")
                after = [str(c) for c in table(app).get_row(gpu.uuid)]
                changed += after != before[gpu.uuid]
        # every GPU's sparkline got a second point, so every row changed
        assert changed == 32
        assert len(app.sm_history[app.snapshot.nodes[0].gpus[0].uuid]) == 2


async def test_not_supported_power_shows_na_never_zero(source):
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        gpu = app.snapshot.nodes[0].gpus[-1]
        assert gpu.sample.power_w is None
        assert cell(app, gpu.uuid, "power") == "N/A"
        other = app.snapshot.nodes[0].gpus[0]
        assert cell(app, other.uuid, "power").endswith(" W")


async def test_unreachable_node_shows_reason_in_error_color():
    src = SimulatedFleetSource(unreachable=True)
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        assert table(app).row_count == 24 + 1
        key = "node:node-04"
        row = [str(c) for c in table(app).get_row(key)]
        assert row[0] == "node-04"
        assert row[2] == "unreachable"
        reason = app.snapshot.node("node-04").error
        # the reason whole in one cell (the widest of memory .. lease use: slices), the others blank
        cells = dict(zip([c.key.value for c in table(app).columns.values()], row))
        assert cells["slices"] == reason
        assert all(cells[k] == "" for k in ("memory", "temperature", "power", "history", "usage"))
        assert f"node-04 down: {reason}" in [line.strip() for line in screen_lines(app)]
        sm = table(app).get_cell(key, "sm")
        assert app.palette.error in styles_of(sm)


async def test_gpu_error_is_shown_in_its_row(source, monkeypatch):
    real = source.snapshot

    def lost_gpu():
        snap = real()
        snap.nodes[1].gpus[2].sample.error = "lost: node needs reboot"
        return snap

    monkeypatch.setattr(source, "snapshot", lost_gpu)
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        uuid = app.snapshot.nodes[1].gpus[2].uuid
        assert cell(app, uuid, "sm") == "error"
        assert cell(app, uuid, "state") == "error"
        parts = [cell(app, uuid, c) for c in ("memory", "temperature", "power", "history")]
        assert parts == ["lost: node needs reboot", "", "", ""]  # one cell, never split
        assert app.sm_history[uuid] == (None,)


async def test_slices_and_lease_marker(source):
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        node = app.snapshot.nodes[0]
        leased = next(g for g in node.gpus if any(s.leased for s in g.slices))
        text = cell(app, leased.uuid, "slices")
        assert "●" in text
        assert cell(app, leased.uuid, "lease") == "alice@ws12"
        assert cell(app, leased.uuid, "state") == "leased"
        split = next(g for g in node.gpus if len(g.slices) == 2)
        depts = [s.department for s in split.slices]
        expected = f"{depts[0]} ½×2" if depts[0] == depts[1] else f"{depts[0]} ½ · {depts[1]} ½"
        assert cell(app, split.uuid, "slices").replace("●", "") == expected


async def test_slash_filter_narrows_rows_and_escape_clears(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("slash")
        await type_text(pilot, "TRAINING")
        await pilot.pause()
        expected = {
            g.uuid for n in app.snapshot.nodes for g in n.gpus if any(s.department == "training" for s in g.slices)
        }
        assert 0 < len(expected) < 32
        assert {k.value for k in table(app).rows} == expected
        # a poll keeps the filter
        await poll(app, pilot)
        assert {k.value for k in table(app).rows} == expected
        await pilot.press("escape")
        await pilot.pause()
        assert table(app).row_count == 32
        assert app.screen.filter_text == ""


async def test_filter_by_node_and_no_match_message(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        screen = app.screen
        screen.set_filter("node-03")
        await pilot.pause()
        assert table(app).row_count == 8
        screen.set_filter("no-such-thing")
        await pilot.pause()
        assert table(app).row_count == 0
        empty = screen.query_one("#fleet-empty")
        assert empty.display
        assert "no-such-thing" in str(empty.render())


async def test_enter_on_row_opens_node_detail(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        table(app).focus()
        table(app).move_cursor(row=9)
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, NodeDetailScreen)
        assert app.screen.node_name == "node-02"
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)


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
    [
        (200, "full", ["node", "gpu", "sm", "memory", "temperature", "power", "history", "slices", "usage",
                       "lease", "state", "name"]),
        (170, "wide", ["node", "gpu", "sm", "memory", "temperature", "power", "history", "slices", "usage",
                       "lease", "state"]),
        (120, "medium", ["node", "gpu", "sm", "memory", "temperature", "slices", "usage", "state"]),
        (80, "narrow", ["node", "gpu", "sm", "memory", "slices", "state"]),
        (70, "tiny", ["node", "gpu", "sm", "slices", "state"]),
        (60, "minimal", ["node", "gpu", "sm", "slices"]),
    ],
)
def test_layout_for_width_drops_columns_by_priority(width, layout, columns):
    from gpuctl.widgets.fleet_rows import layout_for

    chosen = layout_for(width - 1)  # the table leaves one cell to its scrollbar
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


# -- sizes (case tui-01) ------------------------------------------------------------------------


@pytest.mark.parametrize("screen_name", ["fleet", "node"])
async def test_every_size_renders_without_traceback(screen_name):
    src = SimulatedFleetSource(unreachable=True)
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        if screen_name == "node":
            app.open_node("node-01")
            await settle(app, pilot)
        base = type(app.screen)
        for w, h in [(149, 24), (80, 24), (40, 12), (1, 1), (59, 40), (120, 14), (60, 15)]:
            await pilot.resize_terminal(w, h)
            await pilot.pause()
            app.export_screenshot()  # renders the whole screen; raises on a rendering error
            small = w < 60 or h < 15
            assert isinstance(app.screen, TooSmallScreen) is small, (w, h)
            if small:
                assert f"terminal too small: {w}x{h}" in str(app.screen.query_one("#too-small-text").render())
            else:
                assert type(app.screen) is base
            if small:  # keys that would push a screen over the notice do nothing
                await pilot.press("colon")
                await pilot.press("question_mark")
                await pilot.pause()
                assert isinstance(app.screen, TooSmallScreen)
        await poll(app, pilot)
        assert app.return_code is None


# -- app construction ---------------------------------------------------------------------------


def test_unknown_theme_lists_known(source):
    with pytest.raises(ValueError) as err:
        build_app(source, theme="no-such-theme", theme_dirs=[REPO_THEMES_DIR])
    msg = str(err.value)
    assert msg.startswith("unknown theme 'no-such-theme'; known themes: gpuctl-dark, gpuctl-light, high-contrast")
    assert "textual-dark" in msg


def test_bad_refresh_interval(source):
    with pytest.raises(ValueError, match="refresh_s must be > 0 seconds, got 0"):
        build_app(source, refresh_s=0)


# -- the simulated source -----------------------------------------------------------------------


def test_simulated_source_is_deterministic_and_frozen_is_frozen():
    a = SimulatedFleetSource(seed=3, frozen=True, history_warmup_samples=5)
    b = SimulatedFleetSource(seed=3, frozen=True, history_warmup_samples=5)
    s1, s2 = a.snapshot(), a.snapshot()
    assert [n.to_json() for n in s1.nodes] == [n.to_json() for n in s2.nodes]
    assert [n.to_json() for n in s1.nodes] == [n.to_json() for n in b.snapshot().nodes]
    assert s1.taken_at_s == FROZEN_TIME_S
    live = SimulatedFleetSource(seed=3, history_warmup_samples=5)
    x, y = live.snapshot(), live.snapshot()
    assert [g.sample.sm_util_pct for n in x.nodes for g in n.gpus] != [g.sample.sm_util_pct for n in y.nodes for g in n.gpus]


def test_simulated_source_slices_leases_departments():
    src = SimulatedFleetSource()
    snap = src.snapshot()
    slices = [s for n in snap.nodes for s in n.slices()]
    depts = {s.department for s in slices}
    assert depts == {"research", "training", "inference", model.UNASSIGNED}
    assert {s.fraction for s in slices} == {1.0, 0.5, 0.25}
    for n in snap.nodes:
        for g in n.gpus:
            assert sum(s.fraction for s in g.slices) == 1.0
    leases = [lease for n in snap.nodes for lease in n.leases]
    assert [lease.owner for lease in leases] == ["alice@ws12", "alice@ws12"]
    for n in snap.nodes:
        by_id = {s.id: s for s in n.slices()}
        for lease in n.leases:
            for sid in lease.slice_ids:
                assert by_id[sid].lease_id == lease.id
                assert by_id[sid].department == lease.department


def test_simulated_source_history_cursor_and_errors():
    src = SimulatedFleetSource(nodes=2, gpus_per_node=2, history_warmup_samples=10, unreachable=["node-02"])
    snap = src.snapshot()
    uuid = snap.nodes[0].gpus[0].uuid
    cursor, samples = src.history("node-01", uuid)
    assert len(samples) == 11
    assert cursor == 11  # the daemon's cursor counts sampling rounds (11 rounds of 2 GPUs)
    src.snapshot()
    cursor2, new = src.history("node-01", uuid, since=cursor)
    assert cursor2 == 12 and len(new) == 1
    with pytest.raises(FleetSourceError, match="unknown node 'node-09'"):
        src.history("node-09", uuid)
    with pytest.raises(FleetSourceError, match="node-02: unreachable"):
        src.history("node-02", uuid)
    with pytest.raises(FleetSourceError, match="node-01: no GPU 'GPU-x' on this node"):  # the daemon's 404
        src.history("node-01", "GPU-x")
    assert not snap.nodes[1].reachable and snap.nodes[1].error_code == "unreachable"
    src.close()
    with pytest.raises(FleetSourceError, match="closed"):
        src.snapshot()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nodes": 0}, "nodes must be an integer >= 1, got 0"),
        ({"gpus_per_node": 0}, "gpus_per_node must be an integer >= 1, got 0"),
        ({"history_warmup_samples": -1}, "history_warmup_samples must be >= 0, got -1"),
        ({"unreachable": ["node-99"]}, r"unreachable names unknown nodes \['node-99'\]"),
    ],
)
def test_simulated_source_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimulatedFleetSource(**kwargs)


def test_fleet_source_and_format_do_not_import_textual():
    code = "import sys, gpuctl.fleet.simulated, gpuctl.format; assert 'textual' not in sys.modules, 'textual'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(REPO_THEMES_DIR.parent))


# -- formatting ---------------------------------------------------------------------------------


def test_format_units_and_na():
    assert fmt.human_bytes(None) == "N/A"
    assert fmt.human_bytes(512) == "512 B"
    assert fmt.human_bytes(615 * fmt.MIB) == "615 MiB"
    assert fmt.human_bytes(80 * fmt.GIB) == "80.0 GiB"
    assert fmt.memory_label(41 * fmt.GIB + fmt.GIB // 5, 80 * fmt.GIB) == "41.2/80.0 GiB"
    assert fmt.memory_label(300 * fmt.MIB, 1000 * fmt.MIB) == "300/1000 MiB"
    assert fmt.memory_label(None, 80 * fmt.GIB) == "N/A / 80.0 GiB"
    assert fmt.memory_label(None, None) == "N/A"
    assert fmt.percent(None) == "N/A" and fmt.percent(0.0) == "0%"
    assert fmt.power(None) == "N/A" and fmt.power(0.0) == "0 W"
    assert fmt.temperature(float("nan")) == "N/A"
    assert fmt.sparkline([0, 50, 100, None], 6) == "  ▁▅█ "
    assert fmt.bar(0.5, 4) == "██  "
    assert fmt.bar(0.5, 1) == "▌"
    assert fmt.department_shares([("a", 0.25), ("a", 0.25), ("b", 0.5)]) == [("a", "¼×2"), ("b", "½")]
    assert fmt.department_shares([("a", 0.5), ("a", 0.25)]) == [("a", "¾")]
    assert [fmt.ops_rate(v) for v in (None, 0, 850, 999.6, 1234, 9960, 12345, 999_999, 3.4e6)] == [
        "N/A", "0 op/s", "850 op/s", "1.0k op/s", "1.2k op/s", "10k op/s", "12k op/s", "1.0M op/s", "3.4M op/s"
    ]


def test_wrap_reason_across_columns():
    assert _wrap_into("ssh: connect to host node-04 port 22", [20, 5, 6, 16]) == [
        "ssh: connect to host",
        "",
        "",
        "node-04 port 22",
    ]
    assert _wrap_into("a verylongword", [3, 4]) == ["a", "verylongword"]


def test_bench_console_rejects_bad_arguments():
    """bench/console.py: a bad --size or --seconds is refused with the flag named (exit 2)."""
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "console.py"
    spec = importlib.util.spec_from_file_location("bench_console", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench._size("80x24") == (80, 24)
    with pytest.raises(argparse.ArgumentTypeError, match=r"--size: expected WIDTHxHEIGHT like 200x60, got 'wide'"):
        bench._size("wide")
    with pytest.raises(argparse.ArgumentTypeError, match="--size: width and height must be >= 1, got '0x5'"):
        bench._size("0x5")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--seconds", "0"])
    assert exit_info.value.code == 2
    assert bench.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert bench.percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


# -- navigation, command bar, modals, header, hidden screens, quitting -------------------------


def post_keys(app: GpuctlApp, *keys: str) -> None:
    """Queue key events on the app all at once, as a fast typist or tmux send-keys delivers them
    (Pilot.press waits for idle between keys, which hides focus races)."""
    from textual import events

    chars = {"colon": ":", "space": " ", "minus": "-", "enter": "\r", "slash": "/"}
    for key in keys:
        app.post_message(events.Key(key, chars.get(key, key if len(key) == 1 else None)))


def screen_lines(app: GpuctlApp) -> list[str]:
    """The whole terminal as plain text lines (what a terminal shows, modal backdrops included)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def stack_names(app: GpuctlApp) -> list[str]:
    return [type(s).__name__ for s in app.screen_stack]


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
    from gpuctl.widgets.header import TotalsPart, fit_totals

    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert app.run_command("node node-02")
        await settle(app, pilot)
        header = app.screen.query_one("FleetHeader")
        assert str(header.query_one("#header-title").render()) == "gpuctl ▸ node node-02"
        line = screen_lines(app)[0]
        # the GPU count and SM go first: department totals are kept longest
        assert line.startswith(" gpuctl ▸ node node-02 · nodes 4/4 up · research ")
        assert "GPUs" not in line
        assert line.rstrip().endswith("· …")  # parts dropped whole, never cut in the middle
        totals = line.split(" · ")
        assert all(part.strip() for part in totals)
        research = model.gpu_equivalents([s for n in app.snapshot.nodes for s in n.slices() if s.department == "research"])
        assert f"research {research:g}" in line and "unassigned" not in line
    palette = app.palette
    parts = [TotalsPart("nodes 3/4 up", "red", 0), TotalsPart("8 GPUs", "", 2), TotalsPart("SM 50%", "", 1),
             TotalsPart("a 1", "", 3), TotalsPart("b 2", "", 4)]
    assert str(fit_totals(parts, 200, palette)) == "· nodes 3/4 up · 8 GPUs · SM 50% · a 1 · b 2"
    assert str(fit_totals(parts, 36, palette)) == "· nodes 3/4 up · 8 GPUs · SM 50% · …"
    assert str(fit_totals(parts, 27, palette)) == "· nodes 3/4 up · SM 50% · …"
    assert str(fit_totals(parts, 5, palette)) == "· nodes 3/4 up · …"  # the node count always stays
    assert str(fit_totals([], 80, palette)) == "waiting for the first fleet snapshot…"


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
        assert shown == ["LeasesScreen", "LeasesScreen"]  # the fleet table below: nothing
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


# -- tmux: keys typed right after `:` in a real terminal ------------------------------------------


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _wait_screen(session: str, predicate, timeout_s: float = 40.0) -> str:
    import time

    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        try:
            screen = _tmux("capture-pane", "-p", "-t", session)
        except subprocess.CalledProcessError:
            screen = ""  # the session ended: its program exited (e.g. after `q`)
        if predicate(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"screen never matched; last screen:\n{screen}")


@pytest.mark.tmux
@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="tmux not installed")
def test_tmux_colon_and_command_in_one_send_keys_opens_the_node():
    import time
    import uuid
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    name = f"gpuctl-bar-{uuid.uuid4().hex[:8]}"
    cmd = f"cd {root} && PYTHONPATH={root} TERM=xterm-256color {sys.executable} -m gpuctl.cli demo --seed 3"
    _tmux("new-session", "-d", "-s", name, "-x", "80", "-y", "24", cmd)
    try:
        _wait_screen(name, lambda s: "sim-01" in s and "%" in s)
        _tmux("send-keys", "-t", name, ":node sim-02", "Enter")  # one write: no pause after ':'
        screen = _wait_screen(name, lambda s: "node sim-02" in s.splitlines()[0])
        assert "leases" not in screen.splitlines()[0] and "Traceback" not in screen
        _tmux("send-keys", "-t", name, ":theme gpuctl-light", "Enter")
        time.sleep(1.0)
        screen = _tmux("capture-pane", "-p", "-t", name)
        assert "node sim-02" in screen.splitlines()[0]  # no `l` / `d` reached the app's bindings
        t0 = time.monotonic()
        _tmux("send-keys", "-t", name, "q")
        _wait_screen(name, lambda s: "gpuctl ▸" not in s, timeout_s=15)
        assert time.monotonic() - t0 < 8.0  # generous: CI machines are shared
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


async def test_keys_typed_right_after_slash_go_into_the_filter(source, monkeypatch):
    from textual.widgets import Input

    typed: list[str] = []
    real = Input._on_key

    async def spy(self, event):
        if self.id == "filter":
            typed.append(event.key)
        return await real(self, event)

    monkeypatch.setattr(Input, "_on_key", spy)
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        post_keys(app, "slash", *"node", "minus", "0", "2")  # its `d` must not open the board
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen"]
        assert typed == ["n", "o", "d", "e", "minus", "0", "2"]  # every key reached the filter
        assert app.focused is app.screen.query_one("#filter")
        post_keys(app, "escape")
        await settle(app, pilot)
        post_keys(app, "l")  # keys typed outside an Input act again
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "LeasesScreen"]
        assert not app.check_action("filter", ())  # `/` on a screen without a filter: not taken


# -- issue 9 -----------------------------------------------------------------------------------------


async def test_the_slash_filter_shows_what_is_typed_above_the_footer(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("slash")
        await type_text(pilot, "node-03")
        await pilot.pause()
        lines = screen_lines(app)
        shown = [i for i, line in enumerate(lines) if "node-03" in line and "GPU" not in line.split("node-03")[0]]
        filter_line = app.screen.query_one("#filter").region.y
        assert "node-03" in lines[filter_line]
        assert filter_line < len(lines) - 1  # not under the footer (the last line)
        assert "Filter" in lines[-1] or "Quit" in lines[-1]
        assert shown


async def test_console_words_are_leased_and_free_never_busy_or_idle(source):
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        states = {cell(app, g.uuid, "state") for n in app.snapshot.nodes for g in n.gpus}
        assert states <= {"leased", "free", "draining", "error", "no sample"} and {"leased", "free"} <= states
        app.run_command("depts")
        await settle(app, pilot)
        text = "\n".join(screen_lines(app))
        assert " free" in text and " leased" in text
        assert " idle" not in text and " busy" not in text


async def test_help_lists_schedule_audit_report_and_history_commands(source):
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        text = "\n".join(screen_lines(app))
        for command in (":schedule", ":audit", ":report", ":history"):
            assert command in text, command


async def test_header_with_nodes_down_says_unknown_and_how_many_nodes_each_figure_misses():
    src = SimulatedFleetSource(nodes=4, gpus_per_node=8, seed=0, unreachable=["node-03", "node-04"])
    try:
        app = make_app(src)
        async with app.run_test(size=WIDE) as pilot:
            await settle(app, pilot)
            text = str(app.screen.query_one("#header-totals").render())
            assert text.startswith("· nodes 2/4 up · 16+? GPUs (2 nodes down) · SM ")
            research = model.gpu_equivalents([s for n in app.snapshot.nodes for s in n.slices()
                                               if s.department == "research"])
            assert f"research {research:g}+?" in text
    finally:
        src.close()


async def test_all_nodes_down_header_and_board_show_unknown_never_zero():
    src = SimulatedFleetSource(nodes=2, gpus_per_node=2, seed=0, unreachable=["node-01", "node-02"])
    try:
        app = make_app(src)
        async with app.run_test(size=WIDE) as pilot:
            await settle(app, pilot)
            text = str(app.screen.query_one("#header-totals").render())
            assert "GPUs unknown (2 nodes down)" in text and "research ?" in text
            assert "0 GPU" not in text and "research 0" not in text
            app.run_command("depts")
            await settle(app, pilot)
            screen = "\n".join(screen_lines(app))
            assert "0 GPU · 0 B" not in screen
            assert screen.count("│ unknown (2 nodes down)") == 4  # research, training, inference, unassigned
    finally:
        src.close()


async def test_a_gpu_missing_from_its_backend_is_shown_missing_and_counted_apart(source, monkeypatch):
    real = source.snapshot

    def replaced():
        snap = real()
        gpu = snap.nodes[0].gpus[2]
        gpu.missing = True
        gpu.identity = __import__("dataclasses").replace(gpu.identity, index=-1, name="(missing)")
        gpu.sample.error = "missing: the backend did not report this GPU at start-up; its slices and owners are kept"
        return snap

    monkeypatch.setattr(source, "snapshot", replaced)
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        gpu = app.snapshot.nodes[0].gpus[2]
        assert cell(app, gpu.uuid, "state") == "missing"
        assert cell(app, gpu.uuid, "gpu") == "—"  # never "-1"
        text = str(app.screen.query_one("#header-totals").render())
        assert "· 31 GPUs ·" in text and "1 GPU missing" in text
        totals = {t.name: t for t in model.department_totals(app.snapshot, ["research", "training", "inference"])}
        for s in gpu.slices:
            assert totals[s.department].missing_gpu_equivalents >= s.fraction
        dept = gpu.slices[0].department
        counted = sum(s.fraction for n in app.snapshot.nodes for g in n.gpus if not g.missing
                      for s in g.slices if s.department == dept)
        assert totals[dept].gpu_equivalents == pytest.approx(counted)
        assert f"{dept} {counted:g}" in text
        app.run_command("depts")
        await settle(app, pilot)
        board = app.screen
        missing_here = sum(1 for s in gpu.slices if s.department == dept)
        totals_line = str(board.column(dept).query_one(".column-totals").render())
        assert f"{missing_here} missing" in totals_line


async def test_header_at_80_columns_keeps_every_department_total(source):
    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        line = screen_lines(app)[0]
        for dept in ("research", "training", "inference"):
            share = model.gpu_equivalents([s for n in app.snapshot.nodes for s in n.slices() if s.department == dept])
            assert f"{dept} {share:g}" in line, line


async def test_long_gpu_names_are_shown_whole_in_the_full_layout(source, monkeypatch):
    import dataclasses

    real = source.snapshot

    def renamed():
        snap = real()
        gpu = snap.nodes[0].gpus[0]
        gpu.identity = dataclasses.replace(gpu.identity, name="NVIDIA RTX 6000 Ada Generation")
        return snap

    monkeypatch.setattr(source, "snapshot", renamed)
    app = make_app(source)
    async with app.run_test(size=WIDE) as pilot:
        await settle(app, pilot)
        assert app.screen.table_layout.name == "full"
        assert any(line.rstrip().endswith("RTX 6000 Ada Generation") for line in screen_lines(app))


async def test_colon_schedule_on_a_source_without_node_connections_says_so(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert not app.run_command("schedule")
        assert not app.run_command("audit")
        assert list(app.flash_log)[-2:] == [":schedule: this fleet source keeps no schedule (no node connections)",
                                      ":audit: this fleet source keeps no schedule (no node connections)"]
        assert isinstance(app.screen, FleetScreen)
