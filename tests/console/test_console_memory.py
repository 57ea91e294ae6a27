"""Issue 15 item 5: the console's memory is flat in steady state.

The growth found (bench/console_memory.py --objects, 32 gpuctld): DataTable's own render caches
are keyed on its update counter, which every poll bumps, so each poll added entries (the header
row's 12 cells, a row, a line, row renderables) that could never be hit again, kept until the LRU
caches filled (10,000 cells: ~15 minutes at 1 s). FleetTable now empties them when the counter
moves on. Then the interned cells (fleet_rows) and their segments (fleet_table) grew by each new
figure's cell until their 50,000 / 20,000 bounds: both keep two generations (a poll's) now.
Here: a real console on a 16 x 8 simulated fleet polled 150 times.
"""

from __future__ import annotations

import gc

from gpuctl.app import build_app
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.themes import REPO_THEMES_DIR
from gpuctl.widgets import fleet_rows, fleet_table
from gpuctl.widgets.fleet_table import FleetTable


def _census(*names: str) -> dict[str, int]:
    gc.collect()
    counts = dict.fromkeys(names, 0)
    for o in gc.get_objects():
        n = type(o).__qualname__
        if n in counts:
            counts[n] += 1
    return counts


async def test_fleet_table_render_caches_do_not_grow_with_polls():
    src = SimulatedFleetSource(nodes=16, gpus_per_node=8, seed=3, history_warmup_samples=0)
    app = build_app(src, refresh_s=0.01, theme_dirs=[REPO_THEMES_DIR])
    polls = [0]
    real = type(app).on_snapshot_arrived

    def counted(self, message):
        real(self, message)
        polls[0] += 1

    type(app).on_snapshot_arrived = counted
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            sizes, census, memo = [], [], []
            for mark in (50, 150):
                while polls[0] < mark:
                    await pilot.pause(0.02)
                await pilot.pause(0.05)  # one paint after the poll
                table = app.screen.query_one(FleetTable)
                sizes.append((len(table._cell_render_cache), len(table._row_render_cache),
                              len(table._line_cache), len(table._row_renderable_cache)))
                census.append(_census("Strip", "RowRenderables", "Text"))
                memo.append((len(fleet_rows._memo) + len(fleet_rows._previous),
                             len(fleet_table._base_segments) + len(fleet_table._base_previous)))
            assert table.row_count == 128
            # only the current update count's renders are kept: the header row's cells, one row, one line
            assert sizes[0] == sizes[1], sizes
            assert sizes[1][0] <= 2 * len(table.columns) and max(sizes[1][1:]) <= 2, sizes
            # the objects those caches held stop piling up (before the fix: +1 Strip and
            # +1 RowRenderables per poll)
            assert census[1]["RowRenderables"] <= census[0]["RowRenderables"] + 5, census
            assert census[1]["Strip"] <= census[0]["Strip"] + 20, census
            # interned cells: about two polls' worth, not one more per new figure (before: +~60 a poll)
            cells_per_poll = len(table.columns) * table.row_count
            assert memo[1][0] <= 2 * cells_per_poll and memo[1][1] <= 2 * cells_per_poll, (memo, cells_per_poll)
            assert census[1]["Text"] <= census[0]["Text"] + 300, census
    finally:
        type(app).on_snapshot_arrived = real
        src.close()
