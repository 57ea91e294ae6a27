"""SVG snapshots of the department board, the leases screen, the help screen and the board's move
dialogs (pytest-textual-snapshot), on the frozen, seeded simulated fleet of tests/test_snapshots.py.

Update with `python -m pytest tests/test_snapshots_board.py --snapshot-update` and commit
tests/__snapshots__/test_snapshots_board/. Deterministic: the source is frozen (same data,
timestamps at FROZEN_TIME_S), the app polls once (refresh_s is an hour), no clock text, no blinking
cursor (the board's cursor is a static highlight; the dialogs' buttons have none).
"""

from __future__ import annotations

import pytest

from gpuctl import model
from gpuctl.app import build_app
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.screens.board import BoardScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen
from gpuctl.screens.move_dialog import DepartmentPickerScreen, MoveConfirmScreen
from gpuctl.themes import REPO_THEMES_DIR

THEMES = ["gpuctl-dark", "gpuctl-light", "high-contrast"]
SIZE = (120, 40)


def frozen_app(theme: str):
    source = SimulatedFleetSource(nodes=4, gpus_per_node=8, seed=0, frozen=True, unreachable=True)
    return build_app(source, theme=theme, refresh_s=3600.0, theme_dirs=[REPO_THEMES_DIR])


async def _settle(pilot) -> None:
    for _ in range(2):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


async def _board(pilot) -> BoardScreen:
    await _settle(pilot)
    assert pilot.app.run_command("depts")
    await _settle(pilot)
    board = pilot.app.screen
    assert isinstance(board, BoardScreen)
    return board


async def _open_board(pilot) -> None:
    await _board(pilot)


async def _open_leases(pilot) -> None:
    await _settle(pilot)
    assert pilot.app.run_command("leases")
    await _settle(pilot)
    assert isinstance(pilot.app.screen, LeasesScreen)


async def _open_help(pilot) -> None:
    await _board(pilot)
    await pilot.press("question_mark")
    await pilot.pause()
    assert isinstance(pilot.app.screen, HelpScreen)


def _first_free(board: BoardScreen, department: str) -> str:
    return next(s for s in board.column_slice_ids(department)
                if "free" in board.card_text(s).splitlines()[1])


async def _move_confirm(pilot) -> None:
    """Keyboard: focus a free unassigned card, m, pick "training": the confirm dialog."""
    board = await _board(pilot)
    assert board.focus_slice(_first_free(board, model.UNASSIGNED))
    await pilot.press("m")
    assert isinstance(pilot.app.screen, DepartmentPickerScreen)
    await pilot.press("down", "enter")  # research, training, ...
    await pilot.pause()
    assert isinstance(pilot.app.screen, MoveConfirmScreen) and "to training" in pilot.app.screen.summary


async def _move_picker(pilot) -> None:
    board = await _board(pilot)
    assert board.focus_slice(_first_free(board, model.UNASSIGNED))
    await pilot.press("m")
    await pilot.pause()
    assert isinstance(pilot.app.screen, DepartmentPickerScreen)


async def _leased_confirm(pilot) -> None:
    """Keyboard: focus a leased card, m, pick the first other department: drain / revoke."""
    board = await _board(pilot)
    leased = next(s for name in board._column_order for s in board.column_slice_ids(name)
                  if "🔒" in board.card_text(s))
    assert board.focus_slice(leased)
    await pilot.press("m", "enter")
    await pilot.pause()
    assert isinstance(pilot.app.screen, MoveConfirmScreen) and pilot.app.screen.leased


@pytest.mark.parametrize("theme", THEMES)
def test_board(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_open_board)


def test_board_80x24(snap_compare):
    assert snap_compare(frozen_app("gpuctl-dark"), terminal_size=(80, 24), run_before=_open_board)


@pytest.mark.parametrize("theme", THEMES)
def test_leases(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_open_leases)


@pytest.mark.parametrize("theme", THEMES)
def test_help(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_open_help)


@pytest.mark.parametrize("theme", THEMES)
def test_move_confirm(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_move_confirm)


@pytest.mark.parametrize("theme", THEMES)
def test_move_picker(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_move_picker)


@pytest.mark.parametrize("theme", THEMES)
def test_drain_revoke_confirm(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_leased_confirm)
