"""The console's schedule and audit screens (gpuctl.screens.schedule, gpuctl.screens.audit) driven
with Pilot against a real gpuctld (local socket) through the same services as the CLI."""

from __future__ import annotations

import pytest
from textual.app import App
from textual.widgets import DataTable, Input, Static

from daemon_proc import start_daemon, uds_client
from fleet_fixtures import local_node, write_fleet_config

from gpuctl.fleet.client import FleetClient
from gpuctl.config import load_config
from gpuctl.fleet.schedule import FleetSchedule
from gpuctl.screens.audit import AuditScreen
from gpuctl.screens.schedule import ScheduleScreen


class Host(App):
    """A bare app holding one screen (the screens never import gpuctl's app)."""

    def __init__(self, screen):
        super().__init__()
        self._first = screen

    def on_mount(self) -> None:
        self.push_screen(self._first)


@pytest.fixture
def node(tmp_path):
    d = start_daemon(tmp_path, gpus=2, seed=71, name="n1")
    cfg = tmp_path / "fleet.toml"
    write_fleet_config(cfg, {"n1": local_node(d.socket_path)}, {"research": 10})
    fleet = FleetClient(load_config(cfg))
    try:
        yield d, FleetSchedule(fleet)
    finally:
        fleet.close()
        d.stop()


async def _settle(app, pilot):
    for _ in range(3):
        await app.workers.wait_for_complete()
        await pilot.pause()


def _entries(d):
    with uds_client(d.socket_path) as c:
        return c.get("/v1/schedule").json()["entries"]


async def test_schedule_screen_adds_lists_and_cancels(node):
    d, source = node
    screen = ScheduleScreen(source)
    app = Host(screen)
    async with app.run_test(size=(160, 30)) as pilot:
        await _settle(app, pilot)
        assert screen.query_one(DataTable).row_count == 0
        await pilot.press("a")
        for field, text in (("at", "+2h"), ("from", "unassigned"), ("to", "research"), ("amount", "1")):
            screen.query_one(f"#form-{field}", Input).value = text
        screen.query_one("#form-amount", Input).focus()
        await pilot.press("enter")
        await _settle(app, pilot)
        (e,) = _entries(d)
        assert (e["from"], e["to"], e["status"], len(e["slice_ids"])) == ("unassigned", "research", "planned", 1)
        table = screen.query_one(DataTable)
        assert table.row_count == 1
        assert table.get_row_at(0)[0] == e["id"] and table.get_row_at(0)[6] == "planned"
        assert f"as {e['id']}" in str(screen.query_one("#schedule-status", Static).render())
        table.focus()
        await pilot.press("c")
        await _settle(app, pilot)
        assert _entries(d)[0]["status"] == "cancelled"
        assert screen.query_one(DataTable).get_row_at(0)[6] == "cancelled"


async def test_schedule_form_errors_are_shown_and_nothing_is_installed(node):
    d, source = node
    screen = ScheduleScreen(source)
    app = Host(screen)
    async with app.run_test(size=(160, 30)) as pilot:
        await _settle(app, pilot)
        for field, text in (("at", "yesterday"), ("from", "unassigned"), ("to", "research"), ("amount", "1")):
            screen.query_one(f"#form-{field}", Input).value = text
        screen.query_one("#form-at", Input).focus()
        await pilot.press("enter")
        await _settle(app, pilot)
        assert "not scheduled: time: 'yesterday' is not a time" in str(screen.query_one("#schedule-status", Static).render())
        screen.query_one("#form-at", Input).value = "+1h"
        screen.query_one("#form-to", Input).value = "marketing"
        await pilot.press("enter")
        await _settle(app, pilot)
        assert "unknown department 'marketing'" in str(screen.query_one("#schedule-status", Static).render())
    assert _entries(d) == []


async def test_audit_screen_lists_records_and_filters(node):
    d, source = node
    source.add("+1h", "unassigned", "research", "1", __import__("time").time())
    screen = AuditScreen(source.audit)
    app = Host(screen)
    async with app.run_test(size=(160, 30)) as pilot:
        await _settle(app, pilot)
        table = screen.query_one(DataTable)
        total = table.row_count
        assert total >= 3  # slices created at start-up, schedule add begin and end
        await pilot.press("slash")
        for ch in "schedule add":
            await pilot.press("space" if ch == " " else ch)
        await pilot.pause()
        assert table.row_count == 2
        assert all(table.get_row_at(i)[3] == "schedule add" for i in range(2))
        assert "2 of" in str(screen.query_one("#audit-status", Static).render())


async def test_colon_schedule_and_audit_in_the_console_open_these_screens(node):
    """`:schedule` and `:audit` typed in gpuctl's own console (its `:` bar), over the same
    FleetClient the console polls (a LiveFleetSource)."""
    import time

    from gpuctl.fleet.source import LiveFleetSource
    from gpuctl.screens.fleet import FleetScreen
    from tests.support.console import make_app

    d, schedule = node
    schedule.add("+2h", "unassigned", "research", "1", time.time())
    app = make_app(LiveFleetSource(schedule.fleet))
    async with app.run_test(size=(160, 40)) as pilot:
        await _settle(app, pilot)
        await pilot.press("colon", *"schedule", "enter")
        await _settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, ScheduleScreen)
        table = screen.query_one(DataTable)
        assert table.row_count == 1
        assert [str(c) for c in table.get_row_at(0)][3:5] == ["unassigned", "research"]
        # `r` is the screen's reload there (not the app's refresh): a second entry shows up
        schedule.add("+5h", "unassigned", "research", "1", time.time())
        await pilot.press("r")
        await _settle(app, pilot)
        assert table.row_count == 2
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("colon", *"audit", "enter")
        await _settle(app, pilot)
        assert isinstance(app.screen, AuditScreen)
        audit = app.screen.query_one(DataTable)
        actions = [str(audit.get_row_at(i)[3]) for i in range(audit.row_count)]
        assert "schedule add" in actions
        assert not app.run_command("schedules")  # a near miss is an unknown command
        assert ":schedule" in app.flash_log[-1]


async def test_board_shows_per_department_what_is_scheduled_in_the_next_24h(node):
    """Entries due within 24 h show on the board as "24h: +N −M GPU" in the columns of the
    departments they move slices to and from; an entry further away does not."""
    import time

    from gpuctl.fleet.source import LiveFleetSource
    from gpuctl.screens.board import BoardScreen
    from gpuctl.widgets.board_model import scheduled_flows
    from tests.support.console import make_app

    d, schedule = node
    now = time.time()
    schedule.add("+2h", "unassigned", "research", "1", now)
    schedule.add("+3d", "unassigned", "research", "1", now)  # beyond 24 h: not counted
    entries, _ = schedule.entries()
    assert len(entries) == 2
    assert scheduled_flows(entries, now) == {"research": (1.0, 0.0), "unassigned": (0.0, 1.0)}
    app = make_app(LiveFleetSource(schedule.fleet))
    async with app.run_test(size=(160, 40)) as pilot:
        await _settle(app, pilot)
        app.run_command("depts")
        await _settle(app, pilot)
        board = app.screen
        assert isinstance(board, BoardScreen)
        assert len(board.schedule_entries) == 2
        research = str(board.column("research").query_one(".column-totals").render())
        unassigned = str(board.column("unassigned").query_one(".column-totals").render())
        assert research.splitlines()[-1] == "24h: +1 −0 GPU"
        assert unassigned.splitlines()[-1] == "24h: +0 −1 GPU"
