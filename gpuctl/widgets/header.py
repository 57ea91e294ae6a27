"""The one-line header shown on every gpuctl screen: view name, fleet totals, READ-ONLY badge.

Holds no clock (SVG snapshots stay deterministic). It watches the app's `snapshot` and `palette`
itself, so any screen (the board too) gets it by composing `FleetHeader()`.
"""

from __future__ import annotations

from collections import defaultdict

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from gpuctl import model
from gpuctl.widgets.palette import Palette


def fleet_totals(snapshot: model.FleetSnapshot | None, departments: list[model.Department], palette: Palette) -> Text:
    """"nodes 3/4 up · 24 GPUs · SM 47% · research 8.5 · training 6 · unassigned 2.25".

    nodes: reachable / configured. GPUs: GPUs of reachable nodes. SM: mean SM utilization over
    GPUs with a reading (N/A ones are left out; "N/A" when none has one). Departments: their
    slices in GPU-equivalents (model.gpu_equivalents), config order, then unassigned.
    """
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    if snapshot is None:
        text.append("waiting for the first fleet snapshot…", style=palette.muted)
        return text
    up = sum(1 for n in snapshot.nodes if n.reachable)
    total = len(snapshot.nodes)
    text.append(f"nodes {up}/{total} up", style="" if up == total else palette.error)
    text.append(" · ", style=palette.muted)
    text.append(f"{snapshot.gpu_count()} GPUs")
    utils = [
        g.sample.sm_util_pct
        for n in snapshot.nodes
        for g in n.gpus
        if g.sample is not None and g.sample.sm_util_pct is not None and not g.sample.error
    ]
    text.append(" · ", style=palette.muted)
    text.append("SM " + (f"{sum(utils) / len(utils):.0f}%" if utils else "N/A"))
    shares: dict[str, list[model.Slice]] = defaultdict(list)
    for n in snapshot.nodes:
        for s in n.slices():
            shares[s.department].append(s)
    names = [d.name for d in departments]
    names += sorted(k for k in shares if k not in names and k != model.UNASSIGNED)
    if model.UNASSIGNED in shares:
        names.append(model.UNASSIGNED)
    for name in names:
        text.append(" · ", style=palette.muted)
        text.append(f"{name} {model.gpu_equivalents(shares.get(name, [])):g}", style=palette.department(name))
    return text


class FleetHeader(Horizontal):
    """Title ("gpuctl ▸ <view>"), fleet totals, and the READ-ONLY badge when the app is read-only."""

    DEFAULT_CSS = """
    FleetHeader { height: 1; dock: top; }
    FleetHeader > #header-title { width: auto; padding: 0 1; }
    FleetHeader > #header-totals { width: 1fr; }
    FleetHeader > #header-badge { width: auto; padding: 0 1; display: none; }
    FleetHeader.-readonly > #header-badge { display: block; }
    """

    def __init__(self, view: str, *, id: str | None = None):
        super().__init__(id=id)
        self.view = view

    def compose(self) -> ComposeResult:
        yield Static(f"gpuctl ▸ {self.view}", id="header-title")
        yield Static("", id="header-totals")
        yield Static("READ-ONLY", id="header-badge")

    def on_mount(self) -> None:
        self.set_class(bool(getattr(self.app, "readonly", False)), "-readonly")
        self.watch(self.app, "snapshot", self._refresh_totals, init=False)
        self.watch(self.app, "palette", self._refresh_totals, init=False)
        self._refresh_totals()

    def _refresh_totals(self, _value: object = None) -> None:
        app = self.app
        snapshot = getattr(app, "snapshot", None)
        palette = getattr(app, "palette", None)
        if palette is None:
            return
        departments = list(getattr(getattr(app, "source", None), "departments", []) or [])
        self.query_one("#header-totals", Static).update(fleet_totals(snapshot, departments, palette))
