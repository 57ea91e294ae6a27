"""Department board tests: the board model, the simulated source's reassign, and the board screen
driven with Textual's Pilot (mouse drags and keyboard) against a SimulatedFleetSource and against
a real gpuctld reached by gpuctl.fleet.client.FleetClient over its Unix socket."""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest
from daemon_proc import start_daemon

from gpuctl import model
from gpuctl.app import GpuctlApp
from tests.support.console import make_app
from gpuctl.fleet.client import FleetClient
from gpuctl.fleet.source import LiveFleetSource
from gpuctl.config import DepartmentConfig, FleetConfig, NodeConfig
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.fleet.reassign import ReassignError, ReassignRequest
from gpuctl.screens.board import BoardScreen
from gpuctl.screens.move_dialog import DepartmentPickerScreen, MoveConfirmScreen
from gpuctl.screens.too_small import TooSmallScreen
from gpuctl import format as fmt
from gpuctl.widgets.board_model import (
    SliceView,
    UtilWindow,
    column_names,
    column_totals,
    group_by_source,
    move_summary,
    slice_views,
)
from gpuctl.widgets.drag import DROP_TARGET_CLASS, DragGhost

SIZE = (120, 40)


# -- helpers ------------------------------------------------------------------------------------


async def settle(app: GpuctlApp, pilot) -> None:
    """Wait for running workers (poll, reassign) and the messages they posted, twice (a reassign
    worker's completion starts a poll)."""
    for _ in range(2):
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()


async def wait_armed(app: GpuctlApp, pilot, timeout_s: float = 3.0) -> None:
    """Wait until the move dialog on top accepts a confirmation (MoveConfirmScreen.armed)."""
    for _ in range(int(timeout_s / 0.05)):
        if getattr(app.screen, "armed", False):
            return
        await pilot.pause(0.05)
    raise AssertionError(f"the dialog never armed: {app.screen!r}")


async def open_board(app: GpuctlApp, pilot) -> BoardScreen:
    await settle(app, pilot)
    assert app.run_command("depts")
    await settle(app, pilot)
    screen = app.screen
    assert isinstance(screen, BoardScreen)
    return screen


def owners(source) -> dict[str, str]:
    """Slice id -> department, straight from the source's next snapshot."""
    return {s.id: s.department for n in source.snapshot().nodes for s in n.slices()}


def find(source, *, department: str | None = None, leased: bool | None = None) -> list[model.Slice]:
    out = []
    for n in source.snapshot().nodes:
        for s in n.slices():
            if department is not None and s.department != department:
                continue
            if leased is not None and s.leased != leased:
                continue
            out.append(s)
    return out


async def press_card(pilot, board: BoardScreen, slice_id: str, **kw) -> None:
    """A mouse press on the card of `slice_id` (scrolled into view first)."""
    cards, offset = board.card_target(slice_id)
    await pilot.mouse_down(cards, offset=offset, **kw)


async def drag(pilot, board: BoardScreen, slice_id: str, column) -> None:
    await press_card(pilot, board, slice_id)
    await pilot.hover(column)
    await pilot.mouse_up(column)
    await pilot.pause()


@pytest.fixture
def source():
    src = SimulatedFleetSource(nodes=2, gpus_per_node=4, seed=1, frozen=True)
    try:
        yield src
    finally:
        src.close()


# -- board model (no textual) -------------------------------------------------------------------


def _view(sid: str, dept: str, fraction: float = 0.5, *, node: str = "node-01", gpu: int = 0,
          lease: str | None = None, owner: str | None = None) -> SliceView:
    return SliceView(slice_id=sid, node=node, gpu_index=gpu, gpu_uuid=f"GPU-{node}-{gpu}", fraction=fraction,
                     memory_quota_bytes=int(fraction * 80 * fmt.GIB), department=dept, lease_id=lease,
                     lease_owner=owner)


def test_move_summary_names_slices_amount_and_departments():
    views = [_view("a/0", "research", 0.5, node="sim-01", gpu=3), _view("b/0", "research", 1.0, node="sim-02", gpu=0)]
    assert move_summary(views, "training") == (
        "Move 2 slices (1.5 GPU) from research to training: sim-01 GPU 3 ½, sim-02 GPU 0 1")
    mixed = [_view("a/0", "research", 0.25, gpu=1), _view("c/0", "inference", 0.125, gpu=2, lease="l1", owner="bo@h"),
             _view("d/0", "training", 1.0)]
    assert move_summary(mixed, "training") == (
        "Move 2 slices (0.375 GPU) from research, inference to training: node-01 GPU 1 ¼, node-01 GPU 2 ⅛ 🔒 bo@h")
    with pytest.raises(ValueError, match="already owned by training"):
        move_summary([_view("d/0", "training")], "training")


def test_group_by_source_one_group_per_department_leaving_out_the_destination():
    views = [_view("a/0", "research"), _view("b/0", "inference"), _view("c/0", "research"), _view("d/0", "training")]
    assert group_by_source(views, "training") == {"research": ["a/0", "c/0"], "inference": ["b/0"]}


def test_column_names_config_order_then_unknown_then_unassigned():
    depts = [model.Department("zeta"), model.Department("alpha")]
    views = [_view("a/0", "omega"), _view("b/0", "beta"), _view("c/0", model.UNASSIGNED)]
    assert column_names(depts, views) == ["zeta", "alpha", "beta", "omega", "unassigned"]


def _snap(t: float, util: float | None, uuid: str = "GPU-1") -> model.FleetSnapshot:
    gpu = model.GpuStatus(model.GpuIdentity(uuid=uuid, index=0, name="sim"),
                          model.GpuSample(uuid=uuid, timestamp_s=t, sm_util_pct=util))
    return model.FleetSnapshot(nodes=[model.NodeStatus(name="n", reachable=True, gpus=[gpu])])


def test_util_window_keeps_the_last_minute_counts_each_sample_once_and_skips_na():
    w = UtilWindow(60.0)
    w.add(_snap(1000.0, 10.0))
    w.add(_snap(1000.0, 10.0))  # the same sample again (frozen source, slow node)
    w.add(_snap(1030.0, 30.0))
    w.add(_snap(1031.0, None))  # N/A: not a zero
    assert w.count("GPU-1") == 2
    assert w.mean("GPU-1") == pytest.approx(20.0)
    w.add(_snap(1070.0, 50.0))  # 1000 is now more than 60 s old
    assert w.count("GPU-1") == 2
    assert w.mean("GPU-1") == pytest.approx(40.0)
    assert w.mean("GPU-unknown") is None
    with pytest.raises(ValueError, match="window_s must be > 0"):
        UtilWindow(0)


def test_column_totals_sum_fractions_memory_busy_idle_and_mean_util():
    w = UtilWindow()
    w.add(_snap(1.0, 20.0, "GPU-node-01-0"))
    w.add(_snap(2.0, 40.0, "GPU-node-01-0"))
    views = [_view("a/0", "r", 0.5, gpu=0), _view("a/1", "r", 0.25, gpu=0, lease="l", owner="x@y"),
             dataclasses.replace(_view("b/0", "r", 1.0, gpu=1), sm_util_pct=90.0)]
    t = column_totals(views, w)
    assert (t.slices, t.gpu_equivalents, t.leased, t.free) == (3, 1.75, 1, 2)
    assert t.memory_quota_bytes == int(0.5 * 80 * fmt.GIB) + int(0.25 * 80 * fmt.GIB) + 80 * fmt.GIB
    # GPU 0: window mean 30 % (two slices); GPU 1: no window data, latest reading 90 %.
    assert t.mean_sm_util_pct == pytest.approx((30 + 30 + 90) / 3)
    assert t.text() == "1.75 GPU · 140.0 GiB\n1 leased · 2 free · SM 50%\n"
    empty = column_totals([], w)
    assert empty.text() == "0 GPU · 0 B\n0 leased · 0 free · SM N/A\n"


def test_slice_views_leave_out_unreachable_nodes_and_name_lease_owners():
    src = SimulatedFleetSource(nodes=3, gpus_per_node=2, seed=1, frozen=True, unreachable=True)
    try:
        snap = src.snapshot()
        views = slice_views(snap)
        assert {v.node for v in views} == {"node-01", "node-02"}
        assert len(views) == sum(len(n.slices()) for n in snap.nodes if n.reachable)
        leased = [v for v in views if v.leased]
        assert leased and all(v.lease_owner == "alice@ws12" for v in leased)
    finally:
        src.close()


# -- SimulatedFleetSource.reassign ---------------------------------------------------------------


def test_simulated_reassign_moves_idle_slices_and_replays_idempotently(source):
    idle = find(source, department=model.UNASSIGNED, leased=False)[0]
    req = ReassignRequest(src=model.UNASSIGNED, dst="training", slice_ids=[idle.id], request_id="r-1")
    result = source.reassign(req)
    assert [m.slice_id for m in result.moved] == [idle.id]
    assert int(result.exit_code) == 0
    assert owners(source)[idle.id] == "training"
    again = source.reassign(ReassignRequest(src=model.UNASSIGNED, dst="training", slice_ids=[idle.id], request_id="r-1"))
    assert again.moved == [] and [m.slice_id for m in again.plan.already] == [idle.id]
    assert int(again.exit_code) == 0
    assert owners(source)[idle.id] == "training"


def test_simulated_reassign_refuses_leased_then_drains_or_revokes(source):
    leased = find(source, leased=True)
    one = next(s for s in leased if sum(1 for x in leased if x.lease_id == s.lease_id) == 1)
    before = owners(source)
    refused = source.reassign(ReassignRequest(src=one.department, dst=model.UNASSIGNED, slice_ids=[one.id]))
    assert refused.moved == [] and "leased by" in refused.plan.shortfall
    assert owners(source) == before
    drained = source.reassign(ReassignRequest(src=one.department, dst=model.UNASSIGNED, slice_ids=[one.id],
                                              leased="drain"))
    assert [m.slice_id for m in drained.pending] == [one.id]
    s = next(x for x in find(source) if x.id == one.id)
    assert s.department == one.department and s.pending["to"] == model.UNASSIGNED
    # Lease 2 holds two slices: revoking it for one frees both.
    pair = [s for s in leased if s.lease_id != one.lease_id]
    assert len(pair) == 2
    revoked = source.reassign(ReassignRequest(src=pair[0].department, dst="research", slice_ids=[pair[0].id],
                                              leased="revoke"))
    assert [m.slice_id for m in revoked.moved] == [pair[0].id]
    now = {x.id: x for x in find(source)}
    assert now[pair[0].id].department == "research" and now[pair[0].id].lease_id is None
    assert now[pair[1].id].lease_id is None and now[pair[1].id].department == pair[1].department
    assert all(lease.id != pair[0].lease_id for n in source.snapshot().nodes for lease in n.leases)


def test_simulated_reassign_invalid_request_raises_and_changes_nothing(source):
    before = owners(source)
    with pytest.raises(ReassignError, match="--to: unknown department 'nope'"):
        source.reassign(ReassignRequest(src="research", dst="nope", count=1))
    with pytest.raises(ReassignError, match="--node: unknown node 'node-99'"):
        source.reassign(ReassignRequest(src="research", dst="training", count=1, node="node-99"))
    assert owners(source) == before


# -- board screen (simulated fleet) -------------------------------------------------------------


def _expected_column_text(snapshot: model.FleetSnapshot, dept: str) -> str:
    """Column totals computed independently from a frozen snapshot (every sample seen once, so
    the one-minute mean of a GPU is its latest reading)."""
    slices = [(g, s) for n in snapshot.nodes if n.reachable for g in n.gpus for s in g.slices if s.department == dept]
    gpus = sum(s.fraction for _, s in slices)
    mem = sum(s.memory_quota_bytes for _, s in slices)
    busy = sum(1 for _, s in slices if s.lease_id)
    utils = [g.sample.sm_util_pct for g, _ in slices if g.sample.sm_util_pct is not None]
    sm = f"{sum(utils) / len(utils):.0f}%" if utils else "N/A"
    down = sum(1 for n in snapshot.nodes if not n.reachable)
    ge = "≥" if down else ""
    note = f"{down} node{'s' if down != 1 else ''} down" if down else ""
    return (f"{ge}{gpus:g} GPU · {ge}{fmt.human_bytes(mem)}\n{busy} leased · {len(slices) - busy} free · SM {sm}"
            f"\n{note}")


async def test_board_has_a_column_per_department_and_unassigned_with_totals(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        names = [c.department for c in board.query("DepartmentColumn")]
        assert names == ["research", "training", "inference", "unassigned"]
        snap = source.snapshot()
        for name in names:
            column = board.column(name)
            text = str(column.query_one(".column-totals").render())
            assert text == _expected_column_text(snap, name), name
            expected_ids = [s.id for n in snap.nodes for g in sorted(n.gpus, key=lambda g: g.identity.index)
                            for s in g.slices if s.department == name]
            assert board.column_slice_ids(name) == expected_ids
            assert column.body.slice_ids == expected_ids
            assert column.body.virtual_size.height == max(0, 3 * len(expected_ids) - 1)
        leased = find(source, leased=True)[0]
        assert "🔒 alice@ws12" in board.card_text(leased.id)
        # What is drawn: the leased card's second row, in the column's line rendering.
        cards = board.column(leased.department).body
        index = cards.index_of(leased.id)
        drawn = cards.card_rows(index)[1].text
        assert drawn.startswith("▌ SM ") and "🔒 alice@ws12" in drawn
        assert cards.render_line(index * 3 + 1 - round(cards.scroll_y)).text == drawn
        assert cards.render_line(index * 3 + 2 - round(cards.scroll_y)).text.strip() == ""  # the gap


async def test_keyboard_path_moves_the_focused_slice(source):
    app = make_app(source)
    idle = find(source, department=model.UNASSIGNED, leased=False)[0]
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        assert board.focus_slice(idle.id)
        await pilot.press("m")
        assert isinstance(app.screen, DepartmentPickerScreen)
        assert app.screen.departments == ["research", "training", "inference"]
        await pilot.press("down", "enter")  # training
        assert isinstance(app.screen, MoveConfirmScreen)
        assert app.screen.summary.startswith("Move 1 slice (")
        assert "from unassigned to training" in app.screen.summary
        await wait_armed(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert owners(source)[idle.id] == "training"
        assert idle.id in board.column_slice_ids("training")
        assert idle.id not in board.column_slice_ids(model.UNASSIGNED)
        assert board.moving == {}
        assert any(m.startswith("done: moved 1 slice to training") for m in app.flash_log)
        assert board.focused_slice_id == idle.id  # focus follows the moved card
        assert app.focused is board.column("training").body


async def test_arrows_move_between_cards_and_columns(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        research, inference = board.column_slice_ids("research"), board.column_slice_ids("inference")
        board.focus_slice(research[0])
        await pilot.press("down")
        assert board.focused_slice_id == research[1]
        await pilot.press("right")  # training is empty: skipped
        assert board.focused_slice_id == inference[1]
        assert app.focused is board.column("inference").body
        await pilot.press("up", "up")
        assert board.focused_slice_id == inference[0]
        await pilot.press("left")
        assert board.focused_slice_id == research[0]
        await pilot.press("right", "end")
        assert board.focused_slice_id == inference[-1]
        await pilot.press("home")
        assert board.focused_slice_id == inference[0]
        await pilot.press("up")  # at the top: stays
        assert board.focused_slice_id == inference[0]


async def test_enter_opens_the_node_of_the_focused_card(source):
    from gpuctl.screens.node_detail import NodeDetailScreen

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        sid = board.column_slice_ids("inference")[-1]
        node = next(n.name for n in source.snapshot().nodes for s in n.slices() if s.id == sid)
        assert node == "node-02"
        board.focus_slice(sid)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeDetailScreen) and app.screen.node_name == node


async def test_drag_of_a_leased_card_offers_drain_or_revoke(source):
    app = make_app(source)
    leased = find(source, leased=True)
    one = next(s for s in leased if sum(1 for x in leased if x.lease_id == s.lease_id) == 1)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await drag(pilot, board, one.id, board.column("training"))
        dialog = app.screen
        assert isinstance(dialog, MoveConfirmScreen)
        assert [b.id for b in dialog.query("Button")] == ["drain", "revoke", "cancel"]
        assert dialog.leased_owners == ["alice@ws12"]
        await wait_armed(app, pilot)
        await pilot.press("d")
        await settle(app, pilot)
        snap_slice = next(s for s in find(source) if s.id == one.id)
        assert snap_slice.department == one.department
        assert snap_slice.pending["to"] == "training"
        assert "→ training (drain)" in board.card_text(one.id)
        # Revoke the other lease: its slice moves at once.
        other = next(s for s in leased if s.lease_id != one.lease_id)
        await drag(pilot, board, other.id, board.column("research"))
        assert isinstance(app.screen, MoveConfirmScreen)
        await wait_armed(app, pilot)
        await pilot.click("#revoke")
        await settle(app, pilot)
        now = next(s for s in find(source) if s.id == other.id)
        assert now.department == "research" and now.lease_id is None
        assert other.id in board.column_slice_ids("research")


async def test_escape_cancels_a_drag_and_nothing_moves(source):
    app = make_app(source)
    idle = find(source, department="inference", leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        target = board.column("research")
        await press_card(pilot, board, idle.id)
        await pilot.hover(target)
        ghost = board.query_one(DragGhost)
        assert ghost.display and board.drag_controller.active
        assert target.has_class(DROP_TARGET_CLASS)
        assert [v.slice_id for v in board.drag_controller.payload.views] == [idle.id]
        await pilot.press("escape")
        assert not ghost.display and not board.drag_controller.active
        assert not target.has_class(DROP_TARGET_CLASS)
        await pilot.mouse_up(target)
        await settle(app, pilot)
        assert app.screen is board
        assert owners(source) == before
        assert idle.id in board.column_slice_ids("inference")


async def test_a_drag_ends_when_its_slice_changes_owner_meanwhile(source):
    app = make_app(source)
    idle = find(source, department="inference", leased=False)[0]
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await press_card(pilot, board, idle.id)
        await pilot.hover(board.column("research"))
        assert board.drag_controller.active
        # Another admin moves it: the next snapshot shows it in training.
        source.reassign(ReassignRequest(src="inference", dst="training", slice_ids=[idle.id]))
        app.poll()
        await settle(app, pilot)
        assert not board.drag_controller.active and not board.query_one(DragGhost).display
        assert "drag cancelled: the slice changed owner or disappeared" in app.flash_log
        await pilot.mouse_up(board.column("research"))
        await settle(app, pilot)
        assert app.screen is board and owners(source)[idle.id] == "training"


async def test_drop_outside_any_column_moves_nothing(source):
    app = make_app(source)
    idle = find(source, department="inference", leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await press_card(pilot, board, idle.id)
        await pilot.hover("#board-status", offset=(60, 0))
        await pilot.mouse_up("#board-status", offset=(60, 0))
        await settle(app, pilot)
        assert app.screen is board and owners(source) == before


async def test_multi_select_then_drag_moves_both_slices(source):
    app = make_app(source)
    a, b = find(source, department="inference", leased=False)[:2]
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        board.focus_slice(a.id)
        await pilot.press("space")
        cards, offset = board.card_target(b.id)
        await pilot.click(cards, offset=offset, shift=True)
        assert {v.slice_id for v in board.selected_views()} == {a.id, b.id}
        assert board.card_text(b.id).startswith("✔ ")
        await drag(pilot, board, a.id, board.column("training"))
        dialog = app.screen
        assert isinstance(dialog, MoveConfirmScreen)
        assert dialog.summary.startswith(f"Move 2 slices ({a.fraction + b.fraction:g} GPU) from inference to training")
        await wait_armed(app, pilot)
        await pilot.click("#refuse")
        await settle(app, pilot)
        now = owners(source)
        assert now[a.id] == "training" and now[b.id] == "training"
        assert board.selected_views() == []


async def test_selection_from_two_departments_sends_one_request_each(source):
    app = make_app(source)
    a = find(source, department="inference", leased=False)[0]
    b = find(source, department="research", leased=False)[0]
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        for s in (a, b):
            board.focus_slice(s.id)
            await pilot.press("space")
        await pilot.press("m")
        await pilot.press("down", "enter")  # research, training, inference, unassigned -> training
        assert "from research, inference to training" in app.screen.summary
        await wait_armed(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        now = owners(source)
        assert now[a.id] == "training" and now[b.id] == "training"


async def test_readonly_refuses_drops_and_m_without_a_dialog(source):
    app = make_app(source, readonly=True)
    idle = find(source, department="inference", leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        board.focus_slice(idle.id)
        await pilot.press("m")
        assert app.screen is board
        assert app.flash_log[-1] == "read-only mode: moving slices is disabled"
        app.flash_log.clear()
        await drag(pilot, board, idle.id, board.column("training"))
        await settle(app, pilot)
        assert app.screen is board
        assert list(app.flash_log) == ["read-only mode: moving slices is disabled"]
        assert owners(source) == before


async def test_a_refused_move_is_notified_and_the_card_is_no_longer_pending(source):
    app = make_app(source)
    idle = find(source, department="inference", leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        # The board thinks the slice is research's: the plan refuses (owned by inference).
        board.post_message(BoardScreen.MoveRequested((idle.id,), ((idle.id, "research"),), "training"))
        await settle(app, pilot)
        assert owners(source) == before
        assert board.moving == {}
        assert "moving" not in board.card_text(idle.id)
        assert any(m.startswith("move research → training refused: ") and f"{idle.id}: owned by inference, not research" in m
                   for m in app.flash_log)


class _FailingSource:
    """A source whose reassign raises (an invalid request as the service sees it)."""

    def __init__(self, inner: SimulatedFleetSource):
        self.inner = inner
        self.departments = inner.departments

    def snapshot(self):
        return self.inner.snapshot()

    def history(self, node, uuid, since=0):
        return self.inner.history(node, uuid, since)

    def reassign(self, request):
        raise ReassignError("--to: unknown department 'training' (known: research)")

    def close(self):
        self.inner.close()


async def test_a_failing_reassign_is_notified_and_nothing_moves(source):
    app = make_app(_FailingSource(source))
    idle = find(source, department="inference", leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await drag(pilot, board, idle.id, board.column("training"))
        await wait_armed(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert "move inference → training failed: --to: unknown department 'training' (known: research)" in app.flash_log
        assert board.moving == {} and owners(source) == before


async def test_board_at_80x24_scrolls_columns_and_survives_1x1(source):
    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        board = await open_board(app, pilot)
        scroller = board.query_one("#board-columns")
        assert all(c.size.width + 2 >= 30 for c in board.query("DepartmentColumn"))
        unassigned = board.column_slice_ids(model.UNASSIGNED)
        board.focus_slice(board.column_slice_ids("inference")[0])
        await pilot.press("right")
        await pilot.pause()
        assert board.focused_slice_id == unassigned[0]
        assert scroller.scroll_x > 0  # the last column was scrolled into view
        await pilot.resize_terminal(1, 1)
        await pilot.pause()  # (each pause at 1x1 costs Pilot a second: keep to one)
        assert isinstance(app.screen, TooSmallScreen)
        await pilot.resize_terminal(80, 24)
        await settle(app, pilot)
        assert app.screen is board


async def test_only_cards_in_view_are_drawn_and_scrolled_in_cards_show_the_latest_data():
    src = SimulatedFleetSource(nodes=6, gpus_per_node=8, seed=1, frozen=True)
    app = make_app(src)
    try:
        async with app.run_test(size=SIZE) as pilot:
            board = await open_board(app, pilot)
            name = max(("research", "training", "inference", model.UNASSIGNED),
                       key=lambda n: len(board.column_slice_ids(n)))
            sids = board.column_slice_ids(name)
            cards = board.column(name).body
            in_view = cards.scrollable_content_region.height // 3 + 1
            assert len(sids) > in_view + 4  # far out of view
            assert cards.cards_drawn <= in_view + 1  # (+1: the focused card drawn again with its cursor)
            snap = src.snapshot()
            gpu = next(g for n in snap.nodes for g in n.gpus if any(s.id == sids[-1] for s in g.slices))
            gpu.sample.sm_util_pct = 12.0
            drawn = cards.cards_drawn
            board.show_snapshot(snap)
            await pilot.pause()
            assert cards.cards_drawn == drawn  # the changed card is out of view: nothing drawn
            cards.scroll_end(animate=False, immediate=True)
            await pilot.pause()
            assert cards.cards_drawn > drawn
            last = (len(sids) - 1) * 3 - round(cards.scroll_y)
            assert 0 <= last < cards.scrollable_content_region.height
            assert "SM  12%" in cards.render_line(last + 1).text
    finally:
        src.close()


# -- board screen against a real daemon ----------------------------------------------------------


@pytest.fixture
def daemon(tmp_path):
    d = start_daemon(tmp_path, gpus=4, seed=1)
    try:
        yield d
    finally:
        d.stop()


async def test_mouse_drag_moves_the_slice_on_the_daemon(daemon):
    config = FleetConfig(
        path="<test>",
        nodes=(NodeConfig(name="n1", host=None, transport="local", socket=str(daemon.socket_path)),),
        departments=(DepartmentConfig("research"), DepartmentConfig("training")),
    )
    client = LiveFleetSource(FleetClient(config))
    try:
        with daemon.client() as http:
            before = {s["id"]: s["department"] for s in http.get("/v1/slices").json()["slices"]}
        sid = sorted(before)[0]
        assert before[sid] == model.UNASSIGNED
        app = make_app(client)
        async with app.run_test(size=SIZE) as pilot:
            board = await open_board(app, pilot)
            assert sid in board.column_slice_ids(model.UNASSIGNED)
            await drag(pilot, board, sid, board.column("research"))
            assert isinstance(app.screen, MoveConfirmScreen)
            assert "from unassigned to research: n1 GPU" in app.screen.summary
            await wait_armed(app, pilot)
            await pilot.press("y")
            await settle(app, pilot)
            with daemon.client() as http:
                after = {s["id"]: s["department"] for s in http.get("/v1/slices").json()["slices"]}
            assert after[sid] == "research"
            assert {k: v for k, v in after.items() if k != sid} == {k: v for k, v in before.items() if k != sid}
            assert sid in board.column_slice_ids("research")
    finally:
        client.close()


# -- department colors ---------------------------------------------------------------------------


def test_own_color_parses_hex_names_and_theme_variables_and_leaves_dept_classes_to_css():
    from textual.color import Color

    from gpuctl.widgets.board_columns import color_class, own_color

    assert own_color("#0072b2") == Color.parse("#0072b2")
    assert own_color("dodgerblue") == Color.parse("dodgerblue")
    assert own_color("$primary", {"primary": "#ffd700"}) == Color.parse("#ffd700")
    assert own_color("$nope", {"primary": "#ffd700"}) is None  # unknown variable: default color
    assert own_color("not-a-color") is None
    assert own_color(None) is None and own_color("") is None
    assert own_color("$dept-3") is None and own_color("dept-unassigned") is None  # CSS classes
    assert color_class("x", 2, "$dept-5") == "dept-5"
    assert color_class("x", 9, "#0072b2") == "dept-1"  # the class stays, the own color wins over it
    assert color_class(model.UNASSIGNED, -1) == "dept-unassigned"


async def test_a_department_with_a_hex_color_is_drawn_in_it_and_others_keep_the_palette():
    from textual.color import Color

    depts = [model.Department("research", color="#0072b2"), model.Department("training"),
             model.Department("inference", color="$dept-6")]
    src = SimulatedFleetSource(nodes=2, gpus_per_node=4, seed=1, frozen=True, departments=depts)
    app = make_app(src)
    blue = Color.parse("#0072b2")
    try:
        async with app.run_test(size=SIZE) as pilot:
            board = await open_board(app, pilot)
            research, training, inference = (board.column(n) for n in ("research", "training", "inference"))
            assert research.styles.border_top == ("round", blue)
            assert research.styles.border_left == ("round", blue)
            assert research.styles.border_title_color == blue
            variables = app.get_css_variables()
            # No own color: position in the config (training is 2nd: $dept-1); "$dept-6" by class.
            assert training.has_class("dept-1") and training.color is None
            assert training.styles.border_top[1] == Color.parse(variables["dept-1"])
            assert inference.has_class("dept-6") and inference.color is None
            assert inference.styles.border_top[1] == Color.parse(variables["dept-6"])
            # A drag over the hex-colored column highlights it like any other, then restores it.
            idle = next(s for s in board.column_slice_ids("training") + board.column_slice_ids("inference")
                        if "free" in board.card_text(s))
            await press_card(pilot, board, idle)
            await pilot.hover(research)
            assert research.has_class(DROP_TARGET_CLASS)
            assert research.styles.border_top == ("double", Color.parse(variables["accent"]))
            await pilot.press("escape")
            await pilot.pause()
            assert research.styles.border_top == ("round", blue)
            await pilot.mouse_up(research)
    finally:
        src.close()


# -- issue 9: keys typed fast, dialogs seen before they confirm, read-only --------------------------


async def test_a_fast_burst_of_right_arrows_moves_one_column_per_key(source):
    from textual import events

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        order = [n for n in board._column_order if board.column_slice_ids(n)]
        assert len(order) == 3
        board.focus_slice(board.column_slice_ids(order[0])[0])
        await pilot.pause()
        for _ in range(2):  # queued together, as a terminal delivers a burst: no pause between
            app.post_message(events.Key("right", None))
        await pilot.pause(0.3)
        assert board.focused.department == order[2]


async def test_a_blind_confirmation_typed_before_the_dialog_was_drawn_never_moves(source):
    from textual import events

    app = make_app(source)
    idle = find(source, department=model.UNASSIGNED, leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        board.focus_slice(idle.id)
        await pilot.pause()
        board.propose_move([board._views[idle.id]], "training")
        for key in ("enter", "y"):  # typed while the dialog is being built
            app.post_message(events.Key(key, None))
        await settle(app, pilot)
        dialog = app.screen
        assert isinstance(dialog, MoveConfirmScreen)  # still asking
        assert dialog.unseen_keys_dropped >= 1
        assert owners(source) == before and board.moving == {}
        await wait_armed(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert owners(source)[idle.id] == "training"


async def test_the_move_dialog_arms_only_after_a_whole_frame_of_it_reached_the_terminal(source):
    """Issue 9 item 3, the mechanism: Textual drops a frame composed inside a batch update (a
    Footer recompose, Widget.batch) and still runs call_after_refresh callbacks. The dialog used to
    start its arming clock from such a callback, so it armed while none of its frames had reached
    the terminal, and a `y` then moved unseen. Now the clock starts once a whole frame the app wrote
    was drawn (gpuctl.console.frame_ack; headless: at once)."""
    import asyncio

    from textual import events

    from gpuctl.screens.confirm import CONFIRM_ARM_S

    app = make_app(source)
    idle = find(source, department=model.UNASSIGNED, leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        async with board.batch():  # every frame composed meanwhile is dropped by Textual
            board.propose_move([board._views[idle.id]], "training")
            await asyncio.sleep(CONFIRM_ARM_S * 3)
            dialog = app.screen
            assert isinstance(dialog, MoveConfirmScreen)
            assert not dialog.armed  # (armed here before: nothing of it was on the terminal)
            app.post_message(events.Key("y", "y"))
            await asyncio.sleep(0.2)
            assert dialog.unseen_keys_dropped == 1 and app.screen is dialog
            assert dialog.painted_at is None and dialog.frames_written == 0
        assert owners(source) == before and board.moving == {}
        await wait_armed(app, pilot)  # the batch is over: the dialog is drawn, then armed
        assert dialog.painted_at is not None and dialog.frames_written >= 1
        await pilot.press("y")
        await settle(app, pilot)
        assert owners(source)[idle.id] == "training"


def terminal_answer(written: list[str], nth: int = -1):
    """The CursorPosition event a terminal sends for the `nth` query in `written` (the app's
    output): the position the query moved the cursor to (gpuctl.console.frame_ack)."""
    import re

    from textual import events

    row, col = re.findall(r"\x1b\[(\d+);(\d+)H\x1b\[6n", "".join(written))[nth]
    return events.CursorPosition(int(col) - 1, int(row) - 1)


async def test_on_a_terminal_the_move_dialog_waits_for_the_terminal_to_say_it_drew_it(source, monkeypatch):
    """gpuctl.console.frame_ack: after the dialog's first whole frame the app asks the terminal for
    the cursor position (DSR); the terminal answers once it has drawn everything before the query.
    Until the answer (Textual's CursorPosition event) no confirmation counts; a terminal that never
    answers arms the dialog after ACK_TIMEOUT_S."""
    import asyncio

    from textual import events

    from gpuctl.console import frame_ack

    app = make_app(source)
    idle, other = find(source, department=model.UNASSIGNED, leased=False)[:2]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        written: list[str] = []
        monkeypatch.setattr(app, "_writes_to_a_terminal", lambda: True)  # as if a terminal were there
        monkeypatch.setattr(app._driver, "write", written.append)
        board.propose_move([board._views[idle.id]], "training")
        await asyncio.sleep(0.8)  # frames written, no answer yet: the terminal has not drawn it
        dialog = app.screen
        assert isinstance(dialog, MoveConfirmScreen)
        assert "".join(written).count(frame_ack.CURSOR_POSITION_QUERY) == 1  # one query, after the first whole frame
        assert dialog.frames_written >= 1 and dialog.painted_at is None and not dialog.armed
        await pilot.press("y")
        assert dialog.unseen_keys_dropped == 1 and owners(source) == before
        app.post_message(terminal_answer(written))  # the terminal's answer
        await wait_armed(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert owners(source)[idle.id] == "training"
        # a terminal that never answers: armed after ACK_TIMEOUT_S
        monkeypatch.setattr(frame_ack, "ACK_TIMEOUT_S", 0.5)
        board.propose_move([board._views[other.id]], "training")
        await asyncio.sleep(0.3)
        late = app.screen
        assert isinstance(late, MoveConfirmScreen) and late is not dialog and not late.armed
        await wait_armed(app, pilot)
        assert late.painted_at is not None


async def test_the_board_footer_is_not_rebuilt_under_the_move_dialog(source):
    """The picker closing gives the board the focus back for a moment; its Footer used to be
    rebuilt under the move confirmation pushed right after, and the board's new layout made the
    dialog send 4 whole frames instead of 2 (each ~22 KB to the terminal). Covered, the footer is
    only marked stale and is rebuilt when the board is on top again."""
    from textual.widgets._footer import FooterKey

    from gpuctl.screens.base import ScreenFooter

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await pilot.pause()
        full_frames: list[str] = []
        display = app._display

        def counting(screen, renderable):  # noqa: ANN001
            if renderable is not None and isinstance(screen, MoveConfirmScreen):
                full_frames.append(type(renderable).__name__)
            display(screen, renderable)

        app._display = counting
        await pilot.press("m")
        await pilot.pause(0.2)
        await pilot.press("enter")  # the first department
        await pilot.pause(0.6)
        assert isinstance(app.screen, MoveConfirmScreen)
        assert full_frames.count("LayoutUpdate") <= 2, full_frames
        footer = board.query_one(ScreenFooter)
        await pilot.press("escape")
        await pilot.pause(0.3)
        assert app.screen is board and not footer.stale
        keys = {k.description for k in footer.query(FooterKey)}
        assert "Move to…" in keys  # rebuilt once shown, with the board's keys


async def test_readonly_footer_offers_no_move_and_no_drag_hint(source):
    from textual.widgets import Static

    app = make_app(source, readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await pilot.pause()
        shown = {a.binding.action for a in app.active_bindings.values() if a.binding.show and a.enabled}
        assert "move" not in shown
        status = str(board.query_one("#board-status", Static).render())
        assert "drag" not in status and "press m" not in status
        assert status == "read-only: slices cannot be moved"
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await pilot.pause()
        shown = {a.binding.action for a in app.active_bindings.values() if a.binding.show and a.enabled}
        assert "move" in shown


async def test_colon_bar_on_the_board_survives_a_poll_and_runs_the_command(source):
    """In a live console a poll lands while the `:` bar is open: the board used to give the focus
    back to a card column, the bar closed, and the typed letters reached the board (`l`, Enter)."""
    from gpuctl.screens.leases import LeasesScreen

    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await pilot.press("colon")
        await pilot.press("l", "e")
        app.poll()
        await settle(app, pilot)
        assert board.command_bar.is_open and app.focused is board.command_bar.input
        await pilot.press("a", "s", "e", "s", "enter")
        await settle(app, pilot)
        assert isinstance(app.screen, LeasesScreen)


# -- frame_ack against stray, late, repeated and malformed terminal answers ------------------------


#: Longer than CONFIRM_ARM_S (0.3 s): a dialog acknowledged by mistake would be armed by then.
CONFIRM_ARM_S_TEST = 0.5


def parsed(raw: str) -> list:
    """The events Textual's own input parser makes of bytes a terminal (or a key) sends."""
    from textual._xterm_parser import XTermParser

    return list(XTermParser(debug=False).feed(raw))


async def test_stray_answers_and_answer_like_keys_never_arm_the_dialog(source, monkeypatch):
    """Only the answer naming the position of an awaited query arms the dialog (gpuctl.console.
    frame_ack): Shift/Ctrl+F3 (ESC[1;2R, ESC[1;5R: Textual parses them as cursor positions), an
    answer with huge or zero numbers, the same wrong answer twice are ignored, and a `y` typed
    meanwhile is dropped; the real answer then arms it."""
    import asyncio

    app = make_app(source)
    idle = find(source, department=model.UNASSIGNED, leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        written: list[str] = []
        monkeypatch.setattr(app, "_writes_to_a_terminal", lambda: True)
        monkeypatch.setattr(app._driver, "write", written.append)
        board.propose_move([board._views[idle.id]], "training")
        await asyncio.sleep(0.5)
        dialog = app.screen
        assert isinstance(dialog, MoveConfirmScreen)
        real = terminal_answer(written)
        assert real.y >= 1  # never row 1, where the F3 keys land
        strays = [*parsed("\x1b[1;2R"), *parsed("\x1b[1;5R"), *parsed("\x1b[99999999999999999999;3R"),
                  *parsed("\x1b[0;0R"), *parsed(f"\x1b[{real.y + 1};{real.x + 2}R" * 2)]
        assert len(strays) == 6 and all(type(e) is type(real) for e in strays)
        for event in strays:
            app.post_message(event)
        await asyncio.sleep(CONFIRM_ARM_S_TEST)
        assert dialog.painted_at is None and not dialog.armed
        await pilot.press("y")
        assert dialog.unseen_keys_dropped == 1 and owners(source) == before and app.screen is dialog
        (answer,) = parsed(f"\x1b[{real.y + 1};{real.x + 1}R")
        app.post_message(answer)
        await wait_armed(app, pilot)
        app.post_message(answer)  # a second copy of the answer changes nothing
        await pilot.press("y")
        await settle(app, pilot)
        assert owners(source)[idle.id] == "training" and app._frame_acks == deque()


async def test_a_late_answer_for_a_timed_out_dialog_never_arms_the_next_one(source, monkeypatch):
    """Dialog A's query times out (its dialog armed by the fallback) and A is cancelled; dialog B
    asks; A's answer, arriving now, is not B's: B stays unarmed until its own answer."""
    import asyncio

    from gpuctl.console import frame_ack

    app = make_app(source)
    first, second = find(source, department=model.UNASSIGNED, leased=False)[:2]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        written: list[str] = []
        monkeypatch.setattr(app, "_writes_to_a_terminal", lambda: True)
        monkeypatch.setattr(app._driver, "write", written.append)
        monkeypatch.setattr(frame_ack, "ACK_TIMEOUT_S", 0.3)
        board.propose_move([board._views[first.id]], "training")
        await wait_armed(app, pilot)  # no answer: the fallback armed it
        a = app.screen
        late = terminal_answer(written)
        await pilot.press("escape")
        await settle(app, pilot)
        assert app.screen is board and owners(source) == before
        monkeypatch.setattr(frame_ack, "ACK_TIMEOUT_S", 30.0)
        board.propose_move([board._views[second.id]], "training")
        await asyncio.sleep(0.5)
        b = app.screen
        assert isinstance(b, MoveConfirmScreen) and b is not a
        assert terminal_answer(written) != late  # B's query has a position of its own
        app.post_message(late)
        await asyncio.sleep(CONFIRM_ARM_S_TEST)
        assert b.painted_at is None and not b.armed
        await pilot.press("y")
        assert b.unseen_keys_dropped == 1 and owners(source) == before
        app.post_message(terminal_answer(written))
        await wait_armed(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert owners(source)[second.id] == "training"


async def test_terminal_answers_never_type_into_the_command_bar(source, monkeypatch):
    """Answers (expected or stray) reaching the app while the `:` bar is open type nothing and run
    nothing."""
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        await pilot.press("colon", "l")
        for raw in ("\x1b[1;2R", "\x1b[5;7R", "\x1b[99999;99999R"):
            for event in parsed(raw):
                app.post_message(event)
        await settle(app, pilot)
        assert board.command_bar.is_open and board.command_bar.input.value == "l"
        assert app.screen is board


async def test_a_second_enter_in_the_department_picker_is_swallowed_not_sent_to_the_board(source):
    """Found by a new-admin trial in tmux: `m`, then Enter Enter (pick plus a blind Enter). The
    picker was dismissed twice: its callback ran twice (two confirmation dialogs) and the second
    dismiss popped the board itself, leaving the fleet table under the dialog. A modal is dismissed
    once; keys that reach it after that are dropped."""
    from textual import events

    app = make_app(source)
    idle = find(source, department=model.UNASSIGNED, leased=False)[0]
    before = owners(source)
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        assert board.focus_slice(idle.id)
        await pilot.press("m")
        picker = app.screen
        assert isinstance(picker, DepartmentPickerScreen)
        stack_below = list(app.screen_stack[:-1])
        for key in ("down", "enter", "enter", "enter"):  # one burst, as a terminal delivers it
            app.post_message(events.Key(key, None))
        await settle(app, pilot)
        assert isinstance(app.screen, MoveConfirmScreen)
        assert app.screen_stack[:-1] == stack_below  # the board is still under the one dialog
        assert sum(isinstance(s, MoveConfirmScreen) for s in app.screen_stack) == 1
        assert owners(source) == before
        await wait_armed(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert app.screen is board
        assert owners(source)[idle.id] == "training"


async def test_a_modal_dismissed_twice_runs_its_callback_once_and_pops_only_itself(source):
    from gpuctl.screens.confirm import ConfirmScreen

    app = make_app(source)
    results = []
    async with app.run_test(size=SIZE) as pilot:
        board = await open_board(app, pilot)
        dialog = ConfirmScreen("t", "x")
        app.push_screen(dialog, results.append)
        await pilot.pause()
        dialog.dismiss(False)
        dialog.dismiss(True)
        await settle(app, pilot)
        assert results == [False]
        assert app.screen is board
