"""`gpuctl status`'s table prints what a node's daemon reports (GPU names, hostname, backend) as
text: never as Rich markup, never a terminal escape (gpuctl.cli.fleet, gpuctl.format.safe_gpu_name)."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from gpuctl.cli import fleet as cli_fleet
from gpuctl.config import parse_config
from gpuctl.fleet.simulated import SimulatedFleetSource


def test_hostile_names_from_a_node_print_as_plain_text(monkeypatch):
    src = SimulatedFleetSource(nodes=1, gpus_per_node=4, seed=0)
    try:
        snap = src.snapshot()
    finally:
        src.close()
    node = snap.nodes[0]
    names = ["[red]x[/]", "NVIDIA H100\x1b[2J\x1b]0;pwned\x07", None, "加速器🚀"]
    for gpu, name in zip(node.gpus, names):
        gpu.identity = dataclasses.replace(gpu.identity, name=name)
    snap.nodes[0] = dataclasses.replace(node, hostname="[bold]host[/]\x1b[5m", backend="sim\r")
    out = io.StringIO()
    from gpuctl.cli import output

    monkeypatch.setattr(output, "console", lambda stderr=False: Console(file=out, width=200, force_terminal=True,
                                                                         color_system="truecolor", highlight=False))
    monkeypatch.setattr(cli_fleet, "console", output.console)
    cfg = parse_config(b'[[node]]\nname = "n1"\nhost = "h"\n', "fleet.toml")
    cli_fleet._print_status(snap, cfg)
    text = out.getvalue()
    visible = "".join(ch for ch in text if ch != "\x1b")  # Rich's own styling escapes aside
    assert "[red]x[/]" in text and "[bold]host[/]?[5m, sim?" in text
    assert "H100?[2J?]0;" in visible and "N/A" in text and "加速器" in text  # the column folds long names
    for bad in ("\x1b[2J", "\x1b]0;", "\x07", "\x1b[5m", "\r"):
        assert bad not in text
