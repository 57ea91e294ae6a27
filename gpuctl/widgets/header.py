"""The one-line header shown on every gpuctl screen: view name, fleet totals, READ-ONLY badge.

"gpuctl ▸ node sim-02 · nodes 4/4 up · 32 GPUs · SM 47% · research 8.5 · training 6 · …"
(at 80 columns the GPU count and SM go first, then department names are shortened to unique
prefixes, the last department first ("research 8.5 · training 6 · inf 8 · una 6.25"), before any
department's total is dropped).

Holds no clock (SVG snapshots stay deterministic). The screen that shows it calls
:meth:`FleetHeader.show_totals` with each snapshot it renders (gpuctl.screens.base.GpuctlScreen
does, for the top screen only); the totals are repainted without a layout pass (the header's
size never changes), and fitted to the header's width by dropping or shortening whole parts,
least important first (:func:`fit_totals`), never cutting in the middle of a figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Static

from gpuctl import model
from gpuctl.widgets.palette import Palette

SEPARATOR = " · "
#: Shown after the last part when parts were dropped for lack of room.
MORE = " · …"


@dataclass(frozen=True)
class TotalsPart:
    """One figure of the header: its text, its Rich style ("" for the default), its rank
    (0 = most important: dropped last) and, for a department's total, a shorter text (its name
    cut to the shortest prefix no other department shares: "res 8.5") used before any
    department's total is dropped."""

    text: str
    style: str
    rank: int
    short: str | None = None


def short_names(names: list[str], least: int = 3) -> dict[str, str]:
    """Each name cut to its shortest prefix of at least `least` characters that no other name
    starts with (the whole name when none is: "train" beside "training"). Shape: name -> prefix."""
    out = {}
    for name in names:
        others = [o for o in names if o != name]
        for n in range(min(least, len(name)), len(name) + 1):
            if not any(o.startswith(name[:n]) for o in others):
                out[name] = name[:n]
                break
        else:
            out[name] = name
    return out


def totals_parts(
    snapshot: model.FleetSnapshot | None, departments: list[model.Department], palette: Palette
) -> list[TotalsPart]:
    """The header's figures in display order: "nodes 3/4 up" (rank 0, error color when a node is
    down), "24 GPUs", "SM 47%" (mean SM utilization over GPUs with a reading, "N/A" when none
    has one), then each department's slices in GPU-equivalents (model.department_totals) in config
    order, departments only the fleet knows after them, unassigned last. Ranks (dropped last
    first): the node count, then the configured departments in config order, the others, then
    unassigned, SM and the GPU count: at 80 columns the department totals stay.

    Unknown is shown as unknown: with N nodes down every capacity figure says so ("24+? GPUs
    (1 node down)", "research 8.5+?"); with every node down "GPUs unknown (4 nodes down)" and
    "research ?" (never a made-up 0). GPUs missing from their node's backend are not counted
    (model.GpuStatus.missing) and get a figure of their own: "1 GPU missing". [] before the first
    snapshot."""
    if snapshot is None:
        return []
    key = (tuple(departments), palette)
    last = _LAST_PARTS
    if last is not None and last[0] is snapshot and last[1] == key and last[2] is palette:
        return list(last[3])
    parts = _totals_parts(snapshot, departments, palette)
    globals()["_LAST_PARTS"] = (snapshot, key, palette, tuple(parts))
    return parts


#: The last totals_parts answer: (snapshot, (departments, palette), palette, parts). The console's
#: poll worker computes each snapshot's parts (a pass over every GPU: ~10 ms at 4096 GPUs) so that
#: the UI thread's call finds them here.
_LAST_PARTS: tuple | None = None


def _totals_parts(
    snapshot: model.FleetSnapshot, departments: list[model.Department], palette: Palette
) -> list[TotalsPart]:
    up = sum(1 for n in snapshot.nodes if n.reachable)
    total = len(snapshot.nodes)
    down = total - up
    utils = [
        g.sample.sm_util_pct
        for n in snapshot.nodes
        for g in n.gpus
        if not g.missing and g.sample is not None and g.sample.sm_util_pct is not None and not g.sample.error
    ]
    gpus = sum(1 for n in snapshot.nodes for g in n.gpus if not g.missing)
    missing = sum(1 for n in snapshot.nodes for g in n.gpus if g.missing)
    nodes_word = f"{down} node{'s' if down != 1 else ''} down"
    if down and not up:
        gpu_text = f"GPUs unknown ({nodes_word})"
    elif down:
        gpu_text = f"{gpus}+? GPUs ({nodes_word})"
    else:
        gpu_text = f"{gpus} GPUs"
    rows = model.department_totals(snapshot, [d.name for d in departments])
    if not rows[-1].slices:  # UNASSIGNED is shown only when it owns slices
        rows.pop()
    n_dept = len(rows)
    parts = [
        TotalsPart(f"nodes {up}/{total} up", "" if up == total else palette.error, 0),
        TotalsPart(gpu_text, palette.warning if down else "", n_dept + 2),
        TotalsPart("SM " + (f"{sum(utils) / len(utils):.0f}%" if utils else "N/A"), "", n_dept + 1),
    ]
    if missing:
        parts.append(TotalsPart(f"{missing} GPU{'s' if missing != 1 else ''} missing", palette.warning, 1))
    short = short_names([row.name for row in rows])
    for i, row in enumerate(rows):
        if down and not up:
            figure = "?"
        else:
            figure = f"{row.gpu_equivalents:g}" + ("+?" if down else "")
        parts.append(TotalsPart(f"{row.name} {figure}", palette.department(row.name), 1 + i,
                                f"{short[row.name]} {figure}"))
    return parts


def fit_totals(parts: list[TotalsPart], width: int | None, palette: Palette) -> Text:
    """"· " then `parts` joined by " · " in display order, within `width` cells (None: no
    limit): while too wide, the part of the highest rank is dropped and " · …" ends the line
    (the first part, "nodes N/M up", always stays). No styled run begins with a space (the
    rsvg rendering of the SVG snapshots drops a leading space). Before the first snapshot (no
    parts): "waiting for the first fleet snapshot…"."""
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    if not parts:
        text.append("waiting for the first fleet snapshot…", style=palette.muted)
        return text
    kept = list(parts)

    def length(ps: list[TotalsPart]) -> int:
        more = len(MORE) if len(ps) < len(parts) else 0
        return 2 + sum(len(p.text) for p in ps) + len(SEPARATOR) * (len(ps) - 1) + more

    if width is not None:
        while len(kept) > 1 and length(kept) > width:
            extras = [p for p in kept[1:] if p.short is None and p.rank > 1]  # GPU count, SM
            if extras:
                kept.remove(max(extras, key=lambda p: p.rank))
            elif long := [p for p in kept if p.short is not None and p.text != p.short]:
                # every department's total before any is dropped: names shortened, the least
                # important first, only as many as the width needs
                part = max(long, key=lambda p: p.rank)
                kept[kept.index(part)] = TotalsPart(part.short, part.style, part.rank, part.short)
            else:
                kept.remove(max(kept[1:], key=lambda p: p.rank))
    text.append("· ", style=palette.muted)
    for i, part in enumerate(kept):
        if i:
            text.append(" ")
            text.append("· ", style=palette.muted)
        text.append(part.text, style=part.style)
    if len(kept) < len(parts):
        text.append(" ")
        text.append("· …", style=palette.muted)
    return text


def fleet_totals(snapshot: model.FleetSnapshot | None, departments: list[model.Department], palette: Palette) -> Text:
    """Every figure (see totals_parts) on one line, uncut: "· nodes 3/4 up · 24 GPUs · SM 47% ·
    research 8.5 · training 6 · unassigned 2.25"."""
    return fit_totals(totals_parts(snapshot, departments, palette), None, palette)


class HeaderTotals(Widget):
    """The totals line: keeps the parts, fits them to its width when it renders."""

    DEFAULT_CSS = "HeaderTotals { width: 1fr; height: 1; }"

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._parts: list[TotalsPart] = []
        self._palette: Palette | None = None

    def set_parts(self, parts: list[TotalsPart], palette: Palette) -> None:
        """New figures: repaint this one line (no layout pass; the widget's size is fixed)."""
        if parts == self._parts and palette is self._palette:
            return
        self._parts = parts
        self._palette = palette
        self.refresh()

    def render(self) -> Text:
        if self._palette is None:
            return Text("")
        return fit_totals(self._parts, self.size.width or None, self._palette)


class FleetHeader(Horizontal):
    """Title ("gpuctl ▸ <view>"), fleet totals, and the READ-ONLY badge when the app is read-only."""

    DEFAULT_CSS = """
    FleetHeader { height: 1; dock: top; }
    FleetHeader > #header-title { width: auto; padding: 0 0 0 1; }
    FleetHeader > #header-totals { width: 1fr; padding: 0 0 0 1; }
    FleetHeader > #header-badge { width: auto; padding: 0 1; display: none; }
    FleetHeader.-readonly > #header-badge { display: block; }
    """

    def __init__(self, view: str, *, id: str | None = None):
        super().__init__(id=id)
        self.view = view

    def compose(self) -> ComposeResult:
        yield Static(f"gpuctl ▸ {self.view}", id="header-title", markup=False)
        yield HeaderTotals(id="header-totals")
        yield Static("READ-ONLY", id="header-badge")

    def on_mount(self) -> None:
        self.set_class(bool(getattr(self.app, "readonly", False)), "-readonly")

    def show_totals(
        self, snapshot: model.FleetSnapshot | None, departments: list[model.Department], palette: Palette
    ) -> None:
        """Show the totals of `snapshot` (None: waiting for the first one) in `palette`."""
        self.query_one("#header-totals", HeaderTotals).set_parts(
            totals_parts(snapshot, departments, palette), palette)
