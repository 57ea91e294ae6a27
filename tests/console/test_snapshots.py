"""SVG snapshots of the console (pytest-textual-snapshot) on a frozen, seeded simulated fleet.

Update with `python -m pytest tests/test_snapshots.py --snapshot-update` and commit
tests/__snapshots__/. Deterministic: the source is frozen (same data, timestamps at
FROZEN_TIME_S), the app polls once (refresh_s is an hour), no clock text, no blinking cursor.
"""

from __future__ import annotations

import pytest

from gpuctl.app import build_app
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.themes import REPO_THEMES_DIR

THEMES = ["gpuctl-dark", "gpuctl-light", "high-contrast"]
SIZE = (120, 40)


#: Lease usage the frozen fleet reports for its leased slices (gpuctld's lease workers report
#: these per slice; the simulated source has none).
LEASE_USAGE = {
    "lease-0001": {"memory_in_use_bytes": 3 * 1024**3 + 400 * 1024**2, "ops_per_s": 1234.0, "bytes_in": 0, "bytes_out": 0},
    "lease-0002": {"memory_in_use_bytes": 12 * 1024**3, "ops_per_s": 56.0, "bytes_in": 0, "bytes_out": 0},
}


class UsageSource(SimulatedFleetSource):
    """The frozen simulated fleet, with LEASE_USAGE on its leased slices."""

    def snapshot(self):
        snap = super().snapshot()
        for node in snap.nodes:
            for s in node.slices():
                if s.lease_id is not None:
                    s.usage = LEASE_USAGE.get(s.lease_id)
        return snap


def frozen_app(theme: str):
    source = UsageSource(nodes=4, gpus_per_node=8, seed=0, frozen=True, unreachable=True)
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


def test_fleet_screen_200x60(snap_compare):
    assert snap_compare(frozen_app("gpuctl-dark"), terminal_size=(200, 60), run_before=_settle)


def test_node_detail_80x24(snap_compare):
    assert snap_compare(frozen_app("gpuctl-dark"), terminal_size=(80, 24), run_before=_open_node)


def test_too_small(snap_compare):
    assert snap_compare(frozen_app("gpuctl-dark"), terminal_size=(40, 12), run_before=_settle)
