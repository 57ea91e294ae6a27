"""Node detail (`:node NAME`, or Enter on a fleet row): one GPU at a time, with plots of SM
utilization, memory, power and temperature over the last 10 minutes, its slices and their leases.

Left, the node's GPUs (an OptionList: up/down or a click selects one; `[` and `]` step through
them from anywhere, digit keys pick a GPU by index). Right, the selected GPU: a title line, four
MetricPlots (gpuctl.widgets.metric_plot: axes, units, N/A gaps left as gaps) and the list of its
slices with their departments, leases and the lease usage the daemon reports.

The plots come from the daemon's history ring (FleetSource.history), fetched for the selected GPU
only in a thread worker (group "history"), incrementally with the cursor the daemon gave, every
`history_interval_s` after the last fetch finished; a GPU's samples are kept while the screen is
open, so going back to a GPU fetches only what is new. Only the last 10 minutes (by sample
timestamps) are kept. The title, slices and leases come from the app's fleet snapshot.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.screens.workers import run_in_daemon_thread
from gpuctl import format as fmt
from gpuctl.widgets.fleet_rows import gpu_state, slices_cell
from gpuctl.widgets.metric_plot import METRICS, WINDOW_S, MetricPlot, metric_runs, metric_value
from gpuctl.widgets.palette import Palette

__all__ = ["NodeDetailScreen", "HistoryFetched", "METRICS", "WINDOW_S", "metric_label", "slices_text"]


def metric_label(metric: str, samples: list[model.GpuSample]) -> str:
    """"93 (max 99)" over `samples` (oldest first): the newest figure and the 10-minute maximum,
    in the metric's unit (the plot's title names it: %, GiB, W, °C); "N/A" where the newest
    sample has none, never 0."""
    values = [v for s in samples if (v := metric_value(s, metric)) is not None]
    last = metric_value(samples[-1], metric) if samples else None
    peak = max(values) if values else None
    form = "{:.1f}" if metric == "memory" else "{:.0f}"
    now = fmt.NA if last is None else form.format(last)
    top = fmt.NA if peak is None else form.format(peak)
    return f"{now} (max {top})"


@dataclass
class _GpuHistory:
    """What the screen holds of one GPU's history: the daemon's cursor and the samples."""

    cursor: int = 0
    samples: deque[model.GpuSample] = field(default_factory=lambda: deque(maxlen=4096))


class HistoryFetched(Message):
    """A history fetch of GPU `uuid` of `node` finished: the cursor it started from (`since`),
    the daemon's new cursor and samples, or `error` (then cursor/samples are unset)."""

    def __init__(
        self,
        node: str,
        uuid: str,
        since: int,
        cursor: int = 0,
        samples: list[model.GpuSample] | None = None,
        error: str | None = None,
    ):
        super().__init__()
        self.node = node
        self.uuid = uuid
        self.since = since
        self.cursor = cursor
        self.samples = samples or []
        self.error = error


def slices_text(node: model.NodeStatus, gpu: model.GpuStatus, palette: Palette) -> Text:
    """"slices: research ½● · training ½" then, per slice, "#0 ½ research  40.0 GiB  busy
    lease-0001 alice@ws12 expires 00:05:00 UTC · in use 3.1 GiB · 1.2k op/s" (absolute UTC
    times: no clock-relative text; usage only where the daemon reports it, N/A for a missing
    figure); then one "outside gpuctl: pid 4242 bob 1.0 GiB" line per process of the GPU that
    belongs to no lease."""
    text = Text(end="")
    text.append("slices: ", style=palette.muted)
    text.append_text(slices_cell(gpu.slices, palette))
    leases = {lease.id: lease for lease in node.leases}
    for s in gpu.slices:
        _, k = model.split_slice_id(s.id)
        text.append(f"\n#{k} {fmt.fraction_glyph(s.fraction)} ", style="")
        text.append(f"{s.department:<11}", style=palette.department(s.department))
        text.append(f" {fmt.human_bytes(s.memory_quota_bytes):>9}  ", style=palette.muted)
        if s.lease_id:
            lease = leases.get(s.lease_id)
            text.append("leased ", style=palette.get("slice-busy"))
            if lease is not None:
                text.append(f"{lease.id} {lease.owner} expires {fmt.utc_time(lease.expires_s)}")
            else:
                text.append(f"{s.lease_id} (lease not listed)", style=palette.warning)
            if s.usage:
                memory = s.usage.get("memory_in_use_bytes")
                ops = s.usage.get("ops_per_s")
                text.append(
                    f" · in use {fmt.human_bytes(memory if isinstance(memory, int) else None)}"
                    f" · {fmt.ops_rate(ops if isinstance(ops, (int, float)) else None)}",
                    style=palette.get("slice-busy"),
                )
        else:
            text.append("free", style=palette.get("slice-idle"))
        if s.pending:
            text.append(f"  → {s.pending.get('to', '?')} when the lease ends", style=palette.warning)
    for p in gpu.outside_processes or ():
        text.append(f"\noutside gpuctl: pid {p.get('pid')} {p.get('user') or '(user unknown)'} "
                    f"{fmt.human_bytes(p.get('memory_used_bytes'))}", style=palette.warning)
    return text


class NodeDetailScreen(GpuctlScreen):
    """Detail of node `node_name`, one GPU at a time (`gpu_uuid`: the one shown first; default the
    lowest index). Escape goes back."""

    VIEW = "node"
    CSS_PATH = "node_detail.tcss"
    BINDINGS = [
        Binding("escape", "app.back", "Back"),
        Binding("backspace", "app.back", "Back", show=False),
        Binding("left_square_bracket", "step_gpu(-1)", "Prev GPU", key_display="["),
        Binding("right_square_bracket", "step_gpu(1)", "Next GPU", key_display="]"),
        *[Binding(str(i), f"pick_gpu({i})", f"GPU {i}", show=False) for i in range(10)],
    ]

    def __init__(self, node_name: str, *, gpu_uuid: str | None = None, history_interval_s: float = 2.0):
        super().__init__()
        self.node_name = node_name
        self.selected_uuid = gpu_uuid
        self.history_interval_s = history_interval_s
        self._history: dict[str, _GpuHistory] = {}
        self._errors: dict[str, str] = {}
        self._gpu_keys: list[str] = []
        self._timer: Timer | None = None
        self._stopped = False

    def compose_body(self) -> ComposeResult:
        yield Static("", id="node-summary")
        with Horizontal(id="node-body"):
            yield OptionList(id="gpu-list")
            with Vertical(id="gpu-detail"):
                yield Static("", id="gpu-title")
                with Grid(id="gpu-plots"):
                    for metric in METRICS:
                        yield MetricPlot(metric, id=f"plot-{metric.key}", classes="plot")
                with VerticalScroll(id="gpu-slices-box"):
                    yield Static("", id="gpu-slices")

    def on_mount(self) -> None:
        # (GpuctlScreen.on_mount runs too: Textual calls the handler of every class in the MRO)
        self.query_one("#gpu-list", OptionList).focus()
        self._fetch()

    def on_unmount(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.stop()

    # -- selection -------------------------------------------------------------------------------

    def _gpus(self) -> list[model.GpuStatus]:
        snapshot = self.host.snapshot
        node = snapshot.node(self.node_name) if snapshot is not None else None
        if node is None or not node.reachable:
            return []
        return sorted(node.gpus, key=lambda g: g.identity.index)

    def select_gpu(self, uuid: str) -> None:
        """Show GPU `uuid` (ignored when the node has no such GPU) and fetch its history now."""
        if uuid not in {g.uuid for g in self._gpus()} or uuid == self.selected_uuid:
            return
        self.selected_uuid = uuid
        options = self.query_one("#gpu-list", OptionList)
        if uuid in self._gpu_keys and options.highlighted != self._gpu_keys.index(uuid):
            options.highlighted = self._gpu_keys.index(uuid)
        self._render_selected()
        self._fetch(now=True)

    def action_step_gpu(self, step: int) -> None:
        gpus = self._gpus()
        if not gpus:
            return
        uuids = [g.uuid for g in gpus]
        at = uuids.index(self.selected_uuid) if self.selected_uuid in uuids else 0
        self.select_gpu(uuids[(at + step) % len(uuids)])

    def action_pick_gpu(self, index: int) -> None:
        gpu = next((g for g in self._gpus() if g.identity.index == index), None)
        if gpu is None:
            self.host.flash(f"{self.node_name} has no GPU {index}", severity="warning")
            return
        self.select_gpu(gpu.uuid)

    @on(OptionList.OptionHighlighted, "#gpu-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id:
            self.select_gpu(event.option.id)

    # -- history ---------------------------------------------------------------------------------

    def _fetch(self, now: bool = False) -> None:
        """Fetch the selected GPU's new samples in a worker (a running fetch is replaced)."""
        if self._stopped:
            return
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        gpus = self._gpus()
        uuid = self.selected_uuid if self.selected_uuid in {g.uuid for g in gpus} else None
        if uuid is None and gpus:
            uuid = self.selected_uuid = gpus[0].uuid
        if uuid is None:
            self._timer = self.set_timer(self.history_interval_s, self._fetch)
            return
        since = self._history.get(uuid, _GpuHistory()).cursor
        self._fetch_history(uuid, since)

    @work(exclusive=True, exit_on_error=False, group="history")
    async def _fetch_history(self, uuid: str, since: int) -> None:
        # the blocking call runs on a daemon thread (gpuctl.screens.workers.run_in_daemon_thread): quitting the
        # console never waits for a history request to a slow node

        try:
            cursor, samples = await run_in_daemon_thread(
                lambda: self.host.source.history(self.node_name, uuid, since), name="gpuctl-history")
        except Exception as e:  # noqa: BLE001 - any failure of the source is shown, not raised
            self.post_message(HistoryFetched(self.node_name, uuid, since, error=f"history unavailable: {e}"))
            return
        self.post_message(HistoryFetched(self.node_name, uuid, since, cursor, samples))

    def on_history_fetched(self, message: HistoryFetched) -> None:
        message.stop()
        hist = self._history.setdefault(message.uuid, _GpuHistory())
        if message.error is not None:
            self._errors[message.uuid] = message.error  # samples already held are kept
        elif message.since == hist.cursor:  # else an older fetch: its samples are held already
            self._errors.pop(message.uuid, None)
            if message.cursor < message.since:  # the daemon restarted: its ring starts again
                hist.samples.clear()
            hist.cursor = message.cursor
            hist.samples.extend(message.samples)
            if hist.samples:
                newest = hist.samples[-1].timestamp_s
                while hist.samples and hist.samples[0].timestamp_s < newest - WINDOW_S:
                    hist.samples.popleft()
        if message.uuid == self.selected_uuid and self.is_current:
            self._render_selected()
        if not self._stopped:
            if self._timer is not None:
                self._timer.stop()
            self._timer = self.set_timer(self.history_interval_s, self._fetch)

    # -- rendering -------------------------------------------------------------------------------

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        palette = self.host.palette
        node = snapshot.node(self.node_name)
        summary = self.query_one("#node-summary", Static)
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
        self._update_gpu_list(node, palette)
        self._render_selected()

    def _update_gpu_list(self, node: model.NodeStatus, palette: Palette) -> None:
        gpus = sorted(node.gpus, key=lambda g: g.identity.index) if node.reachable else []
        options = self.query_one("#gpu-list", OptionList)
        prompts = []
        for g in gpus:
            state = gpu_state(g)
            style = {"error": palette.error, "leased": palette.get("slice-busy"), "draining": palette.warning}
            prompt = Text(no_wrap=True, end="")
            prompt.append(f"GPU {g.identity.index} ")
            prompt.append(state, style=style.get(state, palette.get("slice-idle")))
            prompts.append(prompt)
        keys = [g.uuid for g in gpus]
        if keys != self._gpu_keys:
            options.clear_options()
            options.add_options([Option(p, id=k) for p, k in zip(prompts, keys)])
            self._gpu_keys = keys
            if self.selected_uuid not in keys and keys:
                self.selected_uuid = keys[0]
            if keys:
                options.highlighted = keys.index(self.selected_uuid)
        else:
            for i, p in enumerate(prompts):
                if str(options.get_option_at_index(i).prompt) != str(p):
                    options.replace_option_prompt_at_index(i, p)

    def _render_selected(self) -> None:
        snapshot = self.host.snapshot
        palette = self.host.palette
        node = snapshot.node(self.node_name) if snapshot is not None else None
        gpu = None
        if node is not None and node.reachable:
            gpu = next((g for g in node.gpus if g.uuid == self.selected_uuid), None)
        title = self.query_one("#gpu-title", Static)
        slices = self.query_one("#gpu-slices", Static)
        if node is None or gpu is None:
            title.update(Text("no GPU to show" if node is None or node.reachable else "node unreachable",
                              style=palette.muted))
            slices.update("")
            for metric in METRICS:
                self.query_one(f"#plot-{metric.key}", MetricPlot).show([], color=palette.muted, note="")
            return
        ident = gpu.identity
        state = gpu_state(gpu)
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        line.append(f"GPU {ident.index}", style="bold")
        line.append(f"  {fmt.safe_gpu_name(ident.name)}  {ident.uuid}")
        if ident.pci_bus_id:
            line.append(f"  bus {ident.pci_bus_id}", style=palette.muted)
        state_style = {"error": palette.error, "leased": palette.get("slice-busy"), "draining": palette.warning}
        line.append(f"  {state}", style=state_style.get(state, palette.get("slice-idle")))
        if gpu.sample is not None and gpu.sample.error:
            line.append(f"  {gpu.sample.error}", style=palette.error)
        title.update(line)
        slices.update(slices_text(node, gpu, palette))
        hist = self._history.get(gpu.uuid)
        samples = list(hist.samples) if hist else []
        error = self._errors.get(gpu.uuid)
        total = (samples[-1].memory_total_bytes if samples else None) or ident.memory_total_bytes
        limits = {"sm": (0.0, 100.0), "memory": (0.0, total / fmt.GIB) if total else None}
        colors = {"sm": palette.get("gpu-util-high"), "memory": palette.get("gpu-util-mid"),
                  "power": palette.get("gpu-sparkline"), "temperature": palette.warning}
        for metric in METRICS:
            if error and not samples:
                note = error
            elif not samples:
                note = "no history yet"
            else:
                note = metric_label(metric.key, samples) + (f" · {error}" if error else "")
            self.query_one(f"#plot-{metric.key}", MetricPlot).show(
                metric_runs(samples, metric.key),
                color=colors[metric.key] or palette.muted,
                ylim=limits.get(metric.key),
                note=note,
            )
