"""The fleet screen (Textual Pilot, simulated fleet): rows, filter, errors, layouts."""

from __future__ import annotations

from tests.support.console import (
    SIZE, WIDE, cell, make_app, poll, screen_lines, settle, styles_of, table, type_text,
)
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.screens.fleet import FleetScreen

from gpuctl.screens.node_detail import NodeDetailScreen

from gpuctl import format as fmt


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
