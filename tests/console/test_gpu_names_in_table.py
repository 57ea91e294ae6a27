"""GPU names in the fleet table at 80-200 columns (issue 9 item 11): from 120 columns each GPU's
name is shown whole (compact: gpuctl.format.compact_gpu_name) in a column as wide as the longest
name present; narrower terminals drop columns in the documented order (fleet_rows.build_layouts)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from gpuctl import format as fmt
from tests.support.console import make_app, screen_lines, settle

#: Real NVML names, one per GPU in turn (the longest compact one: 25 cells, the MIG device).
MIXED = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA GeForce RTX 4090",
         "Tesla T4", "NVIDIA H200", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA L4")


def _renamed(source, monkeypatch, names):
    real = source.snapshot

    def snapshot():
        snap = real()
        cycle = itertools.cycle(names)
        for node in snap.nodes:
            for gpu in node.gpus:
                gpu.identity = dataclasses.replace(gpu.identity, name=next(cycle))
        return snap

    monkeypatch.setattr(source, "snapshot", snapshot)


def _table_columns(app) -> list[str]:
    return [c.key.value for c in app.screen.table.ordered_columns]


@pytest.mark.parametrize(
    "width, columns",
    [
        (80, ["node", "gpu", "sm", "memory", "slices", "state"]),
        (100, ["node", "gpu", "sm", "memory", "slices", "state"]),  # a 25-cell name does not fit
        (120, ["node", "gpu", "sm", "memory", "slices", "state", "name"]),
        (160, ["node", "gpu", "sm", "memory", "temperature", "slices", "usage", "state", "name"]),
        (200, ["node", "gpu", "sm", "memory", "temperature", "power", "history", "slices", "usage", "lease",
               "state", "name"]),
    ],
)
async def test_every_gpu_name_is_whole_from_120_columns(source, monkeypatch, width, columns):
    _renamed(source, monkeypatch, MIXED)
    app = make_app(source)
    async with app.run_test(size=(width, 40)) as pilot:
        await settle(app, pilot)
        assert _table_columns(app) == columns
        screen = app.screen
        assert screen.name_width == len("A100-SXM4-40GB MIG 1g.5gb")
        lines = screen_lines(app)
        table_width = sum(c.get_render_width(screen.table) for c in screen.table.ordered_columns)
        assert table_width <= width - 1  # never wider than the terminal (its scrollbar's cell kept)
        shown = {fmt.compact_gpu_name(n) for n in MIXED}
        if "name" in columns:
            rows = [line for line in lines if line.startswith(" sim-")]
            for gpu_row, name in zip(rows, itertools.cycle(MIXED)):
                assert gpu_row.rstrip().endswith(fmt.compact_gpu_name(name)), gpu_row
            assert all(any(n in line for line in lines) for n in shown)
            assert not any("NVIDIA" in line for line in lines)  # the brand word is not repeated
        else:
            assert not any(n in line for n in ("H100 80GB HBM3", "A100-SXM4") for line in lines)


async def test_at_100_columns_short_names_stay_and_the_column_follows_the_fleet(source, monkeypatch):
    """The simulated fleet's "NVIDIA H100 80GB HBM3" (14 cells) fits at 100 columns; a fleet with a
    longer name appearing rebuilds the columns without the names at 100, and at 120 keeps them."""
    app = make_app(source)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        assert _table_columns(app) == ["node", "gpu", "sm", "memory", "slices", "state", "name"]
        assert any(line.rstrip().endswith("H100 80GB HBM3") for line in screen_lines(app))
        _renamed(source, monkeypatch, MIXED)
        app.poll()
        await settle(app, pilot)
        assert app.screen.name_width == 25
        assert "name" not in _table_columns(app)
        await pilot.resize_terminal(120, 30)
        await pilot.pause()
        assert _table_columns(app)[-1] == "name"
        assert any(line.rstrip().endswith("A100-SXM4-40GB MIG 1g.5gb") for line in screen_lines(app))


async def test_node_detail_keeps_the_full_nvml_name(source, monkeypatch):
    _renamed(source, monkeypatch, MIXED)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        node = app.snapshot.nodes[0].name
        assert app.run_command(f"node {node}")
        await settle(app, pilot)
        assert any("NVIDIA H100 80GB HBM3" in line for line in screen_lines(app))


#: Names a broken or hostile node's daemon may report (gpuctl.format.compact_gpu_name).
HOSTILE = ("NVIDIA H100\x1b[2J\x1b]0;pwned\x07", "[red]x[/]", "NVIDIA 加速器🚀加速器🚀", "", None,
           "NVIDIA " + "Z" * 200, "NVIDIA A100\r\nL4")


@pytest.mark.parametrize("width", [80, 120, 200])
async def test_hostile_gpu_names_never_reach_the_terminal_as_escapes_or_markup(source, monkeypatch, width):
    from rich.cells import cell_len

    _renamed(source, monkeypatch, HOSTILE)
    app = make_app(source)
    async with app.run_test(size=(width, 40)) as pilot:
        await settle(app, pilot)
        strips = app.screen._compositor.render_strips()
        text = "".join(seg.text for strip in strips for seg in strip)
        assert not any(ch in text for ch in "\x1b\x07\r\n\u202e")
        assert all(cell_len(strip.text) == width for strip in strips)  # no line wider than the terminal
        lines = screen_lines(app)
        assert cell_len(fmt.compact_gpu_name(HOSTILE[2])) == 16  # CJK and emoji: 2 cells each
        if width >= 120:
            assert app.screen.name_width == 32  # the 200-character name: cut at the column's most
            assert any(line.rstrip().endswith("[red]x[/]") for line in lines)  # shown as text, not markup
            assert any(line.rstrip().endswith("N/A") for line in lines)
            assert any("H100?[2J?]0;pwned?" in line for line in lines)
