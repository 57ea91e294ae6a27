"""Node detail (`:node NAME`, or Enter on a fleet row): per GPU, 10-minute plots of SM
utilization, memory, power and temperature, its slices and their leases.

The plots come from the daemon's history ring (FleetSource.history), fetched in a thread worker
(group "history"), incrementally with the cursor the daemon gave, every `history_interval_s`
after the last fetch finished. Only the last 10 minutes (by sample timestamps) are kept. The
latest values, slices and leases come from the app's fleet snapshot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Sparkline, Static

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.widgets import format as fmt
from gpuctl.widgets.fleet_rows import gpu_state, slices_cell
from gpuctl.widgets.palette import Palette

#: How far back the plots reach, seconds.
WINDOW_S = 600.0

#: (metric key, label): the four plots of each GPU.
METRICS = (
    ("sm", "SM util"),
    ("memory", "memory"),
    ("power", "power"),
    ("temperature", "temp"),
)


def metric_value(sample: model.GpuSample, metric: str) -> float | None:
    """The plotted figure of `metric` in `sample`: SM util %, memory used GiB, power W, temp °C."""
    if metric == "sm":
        return sample.sm_util_pct
    if metric == "memory":
        return None if sample.memory_used_bytes is None else sample.memory_used_bytes / fmt.GIB
    if metric == "power":
        return sample.power_w
    return sample.temperature_c


def metric_label(metric: str, label: str, samples: Sequence[model.GpuSample]) -> str:
    """"SM util  now 93% · max 99%" (or "N/A") over `samples` (oldest first)."""
    values = [v for s in samples if (v := metric_value(s, metric)) is not None]
    last = metric_value(samples[-1], metric) if samples else None
    if metric == "sm":
        now, peak = fmt.percent(last), fmt.percent(max(values)) if values else fmt.NA
    elif metric == "memory":
        total = samples[-1].memory_total_bytes if samples else None
        used = samples[-1].memory_used_bytes if samples else None
        now = fmt.memory_label(used, total)
        peak = f"{max(values):.1f} GiB" if values else fmt.NA
    elif metric == "power":
        now, peak = fmt.power(last), fmt.power(max(values)) if values else fmt.NA
    else:
        now, peak = fmt.temperature(last), fmt.temperature(max(values)) if values else fmt.NA
    return f"{label}  now {now} · 10-min max {peak}"


@dataclass
class _GpuHistory:
    cursor: int = 0
    samples: deque[model.GpuSample] = field(default_factory=lambda: deque(maxlen=4096))


class HistoryFetched(Message):
    """A history fetch finished: new samples per GPU UUID, cursors, and errors by UUID."""

    def __init__(self, node: str, samples: dict[str, tuple[int, list[model.GpuSample]]], errors: dict[str, str]):
        super().__init__()
        self.node = node
        self.samples = samples
        self.errors = errors


class GpuPanel(Vertical):
    """One GPU: title line, a 2x2 grid of labelled sparklines, slices and leases."""

    def __init__(self, uuid: str):
        super().__init__(classes="gpu-panel")
        self.uuid = uuid
        self._pending: tuple | None = None
        self._ready = False  # set in on_mount (is_mounted is still False there)

    def on_mount(self) -> None:
        self._ready = True
        if self._pending is not None:
            self.show(*self._pending)

    def compose(self) -> ComposeResult:
        yield Static("", classes="gpu-title")
        with Grid(classes="gpu-plots"):
            for key, _label in METRICS:
                with Vertical(classes=f"plot plot-{key}"):
                    yield Label("", classes="plot-label")
                    yield Sparkline([], classes="plot-line")
        yield Static("", classes="gpu-slices")

    def show(
        self,
        node: model.NodeStatus,
        gpu: model.GpuStatus,
        history: Sequence[model.GpuSample],
        error: str | None,
        palette: Palette,
    ) -> None:
        """Render `gpu` of `node` with `history` (oldest first) or the history `error`; before the
        panel is mounted the arguments are kept and rendered on mount."""
        if not self._ready:
            self._pending = (node, gpu, history, error, palette)
            return
        self._pending = None
        ident = gpu.identity
        state = gpu_state(gpu)
        title = Text(no_wrap=True, overflow="ellipsis", end="")
        title.append(f"GPU {ident.index}", style="bold")
        title.append(f"  {ident.name}  {ident.uuid}", style="")
        if ident.pci_bus_id:
            title.append(f"  bus {ident.pci_bus_id}", style=palette.muted)
        title.append(f"  {state}", style=palette.error if state == "error" else palette.get("slice-busy") if state == "busy" else palette.get("slice-idle"))
        if gpu.sample is not None and gpu.sample.error:
            title.append(f"  {gpu.sample.error}", style=palette.error)
        self.query_one(".gpu-title", Static).update(title)
        for key, label in METRICS:
            box = self.query_one(f".plot-{key}")
            text = metric_label(key, label, history) if history else f"{label}  {error or 'no history yet'}"
            box.query_one(".plot-label", Label).update(text)
            data = [v for s in history if (v := metric_value(s, key)) is not None]
            line = box.query_one(".plot-line", Sparkline)
            if list(line.data or []) != data:
                line.data = data  # reactive: assign a new list, never mutate
        self.query_one(".gpu-slices", Static).update(slices_text(node, gpu, palette))


def slices_text(node: model.NodeStatus, gpu: model.GpuStatus, palette: Palette) -> Text:
    """"slices: research ½● · training ½" then one line per slice: "#0 ½ research busy lease-0001
    alice@ws12 expires 00:05:00 UTC" (absolute UTC times: no clock-relative text)."""
    text = Text(end="")
    text.append("slices: ", style=palette.muted)
    text.append_text(slices_cell(gpu.slices, palette))
    leases = {lease.id: lease for lease in node.leases}
    for s in gpu.slices:
        _, k = model.split_slice_id(s.id)
        text.append(f"\n  #{k} {fmt.fraction_glyph(s.fraction)} ", style="")
        text.append(f"{s.department:<12}", style=palette.department(s.department))
        text.append(f" {fmt.human_bytes(s.memory_quota_bytes):>9}  ", style=palette.muted)
        if s.lease_id:
            lease = leases.get(s.lease_id)
            text.append("busy ", style=palette.get("slice-busy"))
            if lease is not None:
                text.append(f"{lease.id} {lease.owner} expires {fmt.utc_time(lease.expires_s)}")
            else:
                text.append(f"{s.lease_id} (lease not listed)", style=palette.warning)
        else:
            text.append("idle", style=palette.get("slice-idle"))
        if s.pending:
            text.append(f"  → {s.pending.get('to', '?')} when the lease ends", style=palette.warning)
    return text


class NodeDetailScreen(GpuctlScreen):
    """Detail of node `node_name`; Escape goes back."""

    VIEW = "node"
    CSS_PATH = "node_detail.tcss"
    BINDINGS = [
        Binding("escape", "app.back", "Back"),
        Binding("backspace", "app.back", "Back", show=False),
    ]

    def __init__(self, node_name: str, *, history_interval_s: float = 2.0):
        super().__init__()
        self.node_name = node_name
        self.history_interval_s = history_interval_s
        self._history: dict[str, _GpuHistory] = {}
        self._errors: dict[str, str] = {}
        self._panels: dict[str, GpuPanel] = {}
        self._fetching = False
        self._stopped = False

    def compose_body(self) -> ComposeResult:
        yield Static("", id="node-summary")
        yield VerticalScroll(id="node-gpus")

    def on_mount(self) -> None:
        self._fetch()

    def on_unmount(self) -> None:
        self._stopped = True

    # -- history -------------------------------------------------------------------------------

    def _gpu_uuids(self) -> list[str]:
        snapshot = self.app.snapshot
        node = snapshot.node(self.node_name) if snapshot is not None else None
        return [g.uuid for g in node.gpus] if node is not None and node.reachable else []

    def _fetch(self) -> None:
        if self._stopped or self._fetching:
            return
        uuids = self._gpu_uuids()
        if not uuids:
            self.set_timer(self.history_interval_s, self._fetch)
            return
        self._fetching = True
        self._fetch_history(uuids, {u: self._history.get(u, _GpuHistory()).cursor for u in uuids})

    @work(thread=True, exclusive=True, exit_on_error=False, group="history")
    def _fetch_history(self, uuids: list[str], cursors: dict[str, int]) -> None:
        source = self.app.source
        samples: dict[str, tuple[int, list[model.GpuSample]]] = {}
        errors: dict[str, str] = {}
        for uuid in uuids:
            try:
                samples[uuid] = source.history(self.node_name, uuid, cursors.get(uuid, 0))
            except Exception as e:  # noqa: BLE001 - any failure of the source is shown, not raised
                errors[uuid] = f"history unavailable: {e}"
        self.post_message(HistoryFetched(self.node_name, samples, errors))

    def on_history_fetched(self, message: HistoryFetched) -> None:
        self._fetching = False
        for uuid, (cursor, new) in message.samples.items():
            hist = self._history.setdefault(uuid, _GpuHistory())
            hist.cursor = cursor
            hist.samples.extend(new)
            if hist.samples:
                newest = hist.samples[-1].timestamp_s
                while hist.samples and hist.samples[0].timestamp_s < newest - WINDOW_S:
                    hist.samples.popleft()
        self._errors = dict(message.errors)
        snapshot = self.app.snapshot
        if snapshot is not None and self.is_current:
            self.show_snapshot(snapshot)
        if not self._stopped:
            self.set_timer(self.history_interval_s, self._fetch)

    # -- rendering -----------------------------------------------------------------------------

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        palette = self.app.palette
        node = snapshot.node(self.node_name)
        summary = self.query_one("#node-summary", Static)
        container = self.query_one("#node-gpus", VerticalScroll)
        if node is None:
            summary.update(Text(f"{self.node_name}: not in the fleet", style=palette.error))
            return
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        line.append(node.name, style="bold")
        if not node.reachable:
            line.append(f"  unreachable: {node.error or 'no answer'}", style=palette.error)
        else:
            line.append(f"  host {node.hostname or '?'} · backend {node.backend or '?'} · ")
            n_leases = len(node.leases)
            line.append(f"generation {node.generation} · {len(node.gpus)} GPUs · {n_leases} lease{'s' * (n_leases != 1)}")
            if node.error:
                line.append(f"  {node.error}", style=palette.error)
        summary.update(line)
        gpus = sorted(node.gpus, key=lambda g: g.identity.index) if node.reachable else []
        uuids = [g.uuid for g in gpus]
        if uuids != list(self._panels):
            container.remove_children()
            self._panels = {u: GpuPanel(u) for u in uuids}
            container.mount_all(self._panels.values())
        self._show_panels(node, gpus)

    def _show_panels(self, node: model.NodeStatus, gpus: list[model.GpuStatus]) -> None:
        palette = self.app.palette
        for gpu in gpus:
            panel = self._panels.get(gpu.uuid)
            if panel is None:
                continue
            hist = self._history.get(gpu.uuid)
            panel.show(node, gpu, list(hist.samples) if hist else [], self._errors.get(gpu.uuid), palette)
