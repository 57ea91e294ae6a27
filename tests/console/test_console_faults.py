"""Issue 9: filter shown, free/leased words, schedule/audit commands, nodes down, missing GPUs, header."""

from __future__ import annotations

import pytest

from gpuctl import model

from tests.support.console import SIZE, WIDE, cell, make_app, screen_lines, settle, type_text
from gpuctl.fleet.simulated import SimulatedFleetSource
from gpuctl.screens.fleet import FleetScreen


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
    """Issue 9 item 11: at 80 columns every department's total is in the header, the unassigned
    one too (a new admin saw it cut); names are shortened to unique prefixes where needed."""
    from gpuctl.widgets.header import short_names

    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        line = screen_lines(app)[0]
        depts = ["research", "training", "inference", model.UNASSIGNED]
        short = short_names(depts)
        for dept in depts:
            share = model.gpu_equivalents([s for n in app.snapshot.nodes for s in n.slices() if s.department == dept])
            assert f" {dept} {share:g} " in line or f" {short[dept]} {share:g} " in line, line
        assert "research " in line  # the most important name stays whole while there is room


async def test_long_gpu_names_are_shown_whole_and_compact_in_the_full_layout(source, monkeypatch):
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
        # compact in the table (gpuctl.format.compact_gpu_name), whole: the column fits the longest
        assert any(line.rstrip().endswith("RTX 6000 Ada") for line in screen_lines(app))
        assert app.screen.name_width == len("H100 80GB HBM3")


async def test_colon_schedule_on_a_source_without_node_connections_says_so(source):
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert not app.run_command("schedule")
        assert not app.run_command("audit")
        assert list(app.flash_log)[-2:] == [":schedule: this fleet source keeps no schedule (no node connections)",
                                      ":audit: this fleet source keeps no schedule (no node connections)"]
        assert isinstance(app.screen, FleetScreen)
