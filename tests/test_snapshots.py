"""SVG snapshots of the console (pytest-textual-snapshot) on a frozen, seeded simulated fleet.

Update with `python -m pytest tests/test_snapshots.py --snapshot-update` and commit
tests/__snapshots__/. Deterministic: the source is frozen (same data, timestamps at
FROZEN_TIME_S), the app polls once (refresh_s is an hour), no clock text, no blinking cursor.
"""

from __future__ import annotations

import pytest

from gpuctl.app import build_app
from gpuctl.fleet_source import SimulatedFleetSource
from gpuctl.themes import REPO_THEMES_DIR

THEMES = ["gpuctl-dark", "gpuctl-light", "high-contrast"]
SIZE = (120, 40)


def frozen_app(theme: str):
    source = SimulatedFleetSource(nodes=4, gpus_per_node=8, seed=0, frozen=True, unreachable=True)
    return build_app(source, theme=theme, refresh_s=3600.0, theme_dirs=[REPO_THEMES_DIR])


async def _settle(pilot) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def _open_node(pilot) -> None:
    await _settle(pilot)
    pilot.app.open_node("node-02")
    await _settle(pilot)
    await _settle(pilot)


@pytest.mark.parametrize("theme", THEMES)
def test_fleet_screen(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_settle)


@pytest.mark.parametrize("theme", THEMES)
def test_node_detail(snap_compare, theme):
    assert snap_compare(frozen_app(theme), terminal_size=SIZE, run_before=_open_node)


def test_fleet_screen_80x24(snap_compare):
    assert snap_compare(frozen_app("gpuctl-dark"), terminal_size=(80, 24), run_before=_settle)


def test_too_small(snap_compare):
    assert snap_compare(frozen_app("gpuctl-dark"), terminal_size=(40, 12), run_before=_settle)
