"""The console's report screen (`:report`): bars and table from a source's usage report, period
switch, an incomplete report, and a source without usage accounting (Textual Pilot)."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from gpuctl.app import build_app
from gpuctl.fleet.simulated import FROZEN_TIME_S, SimulatedFleetSource
from gpuctl.screens.report import ReportScreen
from gpuctl.themes import REPO_THEMES_DIR
from gpuctl.fleet.usage_report import FleetUsage, build_report
from gpuctl.screens.usage_history import UsageHistoryScreen
from gpuctl.widgets.usage_plots import HistoryPlot, UsageBars, bar_series, history_runs


def _row(dept, owned_h, used_h):
    return {"bucket_s": 0, "gpu_uuid": "G", "department": dept, "owned_gpu_s": owned_h * 3600,
            "leased_gpu_s": used_h * 3600, "used_gpu_s": used_h * 3600, "sm_known_gpu_s": owned_h * 3600,
            "idle_gpu_s": (owned_h - used_h) * 3600, "outside_gpu_s": 0.0}


class UsageSource(SimulatedFleetSource):
    """The simulated fleet plus a canned usage report per period; records what was asked."""

    def __init__(self, *, down: bool = False, **kw):
        super().__init__(**kw)
        self.asked: list[tuple[float, float]] = []
        self.down = down

    def usage_report(self, since_s, until_s, by, every):
        self.asked.append((since_s, until_s))
        days = round((until_s - since_s) / 86400)
        rows = [_row("research", 10 * days, 6 * days), _row("training", 20 * days, 2 * days),
                _row("unassigned", 2 * days, 0)]
        usage = FleetUsage(int(since_s), int(until_s), None,
                           answers={"n1": {"gpus": [{"uuid": "G", "index": 0}], "rows": rows, "refusals": []}},
                           errors={"n2": "node n2: connection refused"} if self.down else {})
        return build_report(usage, by)

    def usage_history(self, node, uuid, since_s, until_s, step_s):
        self.asked.append((since_s, until_s, step_s, node, uuid))
        start = int(since_s) // step_s * step_s
        # every step known except the third (daemon down there): a gap in the plot
        return [{"ts": start + i * step_s, "gpu_uuid": uuid, "sm_util_pct": 50.0 + i % 3, "sampled_s": step_s,
                 "memory_used_bytes": 2 * 2**30} for i in range(int((until_s - since_s) // step_s)) if i != 2]


def make_app(source):
    return build_app(source, theme_dirs=[REPO_THEMES_DIR], refresh_s=3600.0)


async def settle(app, pilot):
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


def status_text(app) -> str:
    return str(app.screen.query_one("#report-status", Static).render())


async def test_report_screen_shows_bars_and_switches_period():
    src = UsageSource(nodes=2, gpus_per_node=2, seed=1, frozen=True)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert app.run_command("report")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, ReportScreen)
        assert len(src.asked) == 1 and src.asked[0][1] - src.asked[0][0] == pytest.approx(7 * 86400)
        bars = screen.query_one(UsageBars)
        assert bars.series == (["research", "training"], [70.0, 140.0], [42.0, 14.0])
        assert "last 7 days" in bars.plot_title
        table = screen.query_one("#report-table", DataTable)
        assert [table.get_row_at(i)[0] for i in range(table.row_count)] == ["research", "training", "unassigned",
                                                                             "total"]
        assert table.get_row_at(3)[1] == "224.0"
        # the summary line says the table's totals, to the table's decimal
        assert f"owned 224.0, used {table.get_row_at(3)[3]} GPU-h" in status_text(app)
        await pilot.press("p")
        await settle(app, pilot)
        assert src.asked[-1][1] - src.asked[-1][0] == pytest.approx(30 * 86400)
        assert bars.series[1] == [300.0, 600.0] and "last 30 days" in bars.plot_title
        rendered = str(bars.render())
        assert "owned" in rendered and "used" in rendered  # the legend of the bars is drawn
        await pilot.press("escape")
        await settle(app, pilot)
        assert not isinstance(app.screen, ReportScreen)


async def test_incomplete_report_names_the_silent_node():
    src = UsageSource(nodes=2, gpus_per_node=2, seed=1, frozen=True, down=True)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        app.run_command("report")
        await settle(app, pilot)
        assert "no answer from n2" in status_text(app)
        table = app.screen.query_one("#report-table", DataTable)
        assert table.get_row_at(0)[0] == "research *"


async def test_source_without_usage_says_so():
    app = make_app(SimulatedFleetSource(nodes=1, gpus_per_node=2, seed=1, frozen=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        app.run_command("report")
        await settle(app, pilot)
        assert "no report: this fleet source keeps no usage accounting" in status_text(app)
        assert app.screen.query_one(UsageBars).series == ([], [], [])


def test_bar_series_leaves_out_unassigned():
    rep = build_report(FleetUsage(0, 3600, None, answers={"n": {"gpus": [], "refusals": [], "rows": [
        _row("unassigned", 1, 0), _row("a", 2, 1)]}}))
    assert bar_series(rep) == (["a"], [2.0], [1.0])


async def test_history_screen_from_node_detail_and_its_errors():
    src = UsageSource(nodes=2, gpus_per_node=2, seed=1, frozen=True)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        node = app.snapshot.nodes[0]
        assert app.run_command(f"node {node.name}")
        await settle(app, pilot)
        uuid = app.screen.selected_uuid
        assert app.run_command("history")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, UsageHistoryScreen) and screen.node_name == node.name and screen.gpu_uuid == uuid
        since, until, step, asked_node, asked_uuid = src.asked[-1]
        assert (until - since, step, asked_node, asked_uuid) == (86400, 900, node.name, uuid)
        sm = screen.query_one("#history-sm", HistoryPlot)
        assert len(sm.runs) == 2 and sm.window_h == 24  # the missing third step splits the line
        assert sm.runs[0][1] == [50.0, 51.0] and sm.ylim == (0.0, 100.0)
        mem = screen.query_one("#history-memory", HistoryPlot)
        assert set(mem.runs[1][1]) == {2.0}
        await pilot.press("p")
        await settle(app, pilot)
        assert src.asked[-1][2] == 3600 and src.asked[-1][1] - src.asked[-1][0] == 7 * 86400
        assert sm.window_h == 24 * 7
        drawn = str(sm.render())
        assert "SM util" in drawn and "now" in drawn and "7d" in drawn  # x axis in days
        await pilot.press("escape")
        await settle(app, pilot)
        assert not isinstance(app.screen, UsageHistoryScreen)
        assert app.run_command(f"history {node.name} 1")
        await settle(app, pilot)
        assert app.screen.gpu_uuid == sorted(node.gpus, key=lambda g: g.identity.index)[1].uuid
        await pilot.press("escape")
        await settle(app, pilot)
        for bad in ("history nosuch", f"history {node.name} 9", "history a b c"):
            assert app.run_command(bad) is False
        assert app.run_command("nodes")
        await settle(app, pilot)
        assert app.run_command("history") is False  # the fleet screen has no node: NODE needed


def test_history_runs_keep_gaps():
    pts = [{"ts": 0, "sm_util_pct": 10.0}, {"ts": 3600, "sm_util_pct": None}, {"ts": 7200, "sm_util_pct": 30.0},
           {"ts": 14400, "sm_util_pct": 40.0}]
    assert history_runs(pts, "sm_util_pct", 3600, 18000) == [([-4.5], [10.0]), ([-2.5], [30.0]), ([-0.5], [40.0])]
