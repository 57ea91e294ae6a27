"""The usage history screen (`:history` on a node detail, or `:history NODE [INDEX]`): one GPU's
mean SM utilization and memory used over the last 24 hours (15-minute steps) or 7 days (hourly,
read from the rollups), from the node's usage accounting; `p` switches, Escape goes back.

Fetched in a thread worker (group "usage-history"), never on the UI thread. Never imports the app.
"""

from __future__ import annotations

import time
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.widgets.usage_plots import HistoryPlot, history_runs

#: (label, window seconds, step seconds) that `p` cycles through.
WINDOWS = (("24 hours", 86400, 900), ("7 days", 7 * 86400, 3600))
GIB = 2**30


class HistoryLoaded(Message):
    """A history fetch finished for window index `window`: the points or the error in words."""

    def __init__(self, window: int, points: list[dict[str, Any]] | None, error: str | None = None):
        super().__init__()
        self.window = window
        self.points = points
        self.error = error


def screen_for_command(top: Any, snapshot: model.FleetSnapshot | None, args: list[str]) -> "UsageHistoryScreen | str":
    """The screen `:history [NODE [INDEX]]` opens, or the error to flash: without arguments the
    node detail's node and GPU (`top` is the current screen); NODE alone: its GPU of the lowest index."""
    if not args:
        node, uuid = getattr(top, "node_name", None), getattr(top, "selected_uuid", None)
        if node is None or uuid is None:
            return "usage: :history NODE [INDEX] (or :history on a node detail)"
        return UsageHistoryScreen(node, uuid)
    if len(args) > 2:
        return "usage: :history NODE [INDEX]"
    node = snapshot.node(args[0]) if snapshot is not None else None
    if node is None or not node.gpus:
        return f"no GPUs known of node {args[0]!r}"
    gpus = sorted(node.gpus, key=lambda g: g.identity.index)
    if len(args) == 2:
        gpu = next((g for g in gpus if str(g.identity.index) == args[1]), None)
        if gpu is None:
            return f"node {args[0]} has no GPU {args[1]!r} (indexes: {', '.join(str(g.identity.index) for g in gpus)})"
    else:
        gpu = gpus[0]
    return UsageHistoryScreen(node.name, gpu.uuid)


class UsageHistoryScreen(GpuctlScreen):
    """SM utilization and memory used of GPU `gpu_uuid` of node `node_name` over 24 h / 7 d."""

    VIEW = "history"
    BINDINGS = [Binding("escape", "app.back", "Back"), Binding("p", "next_window", "Period")]
    DEFAULT_CSS = """
    UsageHistoryScreen #history-status { height: auto; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, node_name: str, gpu_uuid: str, *, clock: Any = time.time):
        super().__init__()
        self.node_name = node_name
        self.gpu_uuid = gpu_uuid
        self.clock = clock
        self.window = 0
        self.points: list[dict[str, Any]] | None = None
        self._until = 0.0

    def compose_body(self) -> ComposeResult:
        yield Static(f"loading the usage history of {self.gpu_uuid} ...", id="history-status")
        yield HistoryPlot(id="history-sm")
        yield HistoryPlot(id="history-memory")

    def on_mount(self) -> None:
        self.focus_now(self.query_one("#history-sm", HistoryPlot))  # keys go to the screen, not the : bar
        self._reload()

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        """History from the rollups does not change with each poll: nothing to do."""

    def action_next_window(self) -> None:
        self.window = (self.window + 1) % len(WINDOWS)
        self._reload()

    def _reload(self) -> None:
        label, seconds, step = WINDOWS[self.window]
        self._until = self.clock() // step * step + step  # the current step included
        self.query_one("#history-status", Static).update(f"loading the last {label} ...")
        self._load(self.window, self._until - seconds, self._until, step)

    @work(thread=True, exclusive=True, exit_on_error=False, group="usage-history")
    def _load(self, window: int, since_s: float, until_s: float, step: int) -> None:
        from gpuctl.fleet.usage_report import gpu_history_from_source

        try:
            points = gpu_history_from_source(self.app.source, self.node_name, self.gpu_uuid, since_s, until_s, step)
        except Exception as e:  # noqa: BLE001 - shown on the screen
            self.post_message(HistoryLoaded(window, None, str(e) or type(e).__name__))
            return
        self.post_message(HistoryLoaded(window, points))

    @on(HistoryLoaded)
    def _loaded(self, message: HistoryLoaded) -> None:
        if message.window != self.window:
            return
        label, seconds, step = WINDOWS[self.window]
        status = self.query_one("#history-status", Static)
        if message.points is None:
            status.update(f"no usage history: {message.error}")
            return
        self.points = message.points
        status.update(f"GPU {self.gpu_uuid} of {self.node_name}, last {label}, mean per "
                      f"{step // 60} min  [p: period]")
        hours = seconds / 3600
        sm = history_runs(message.points, "sm_util_pct", step, self._until)
        mem = history_runs(message.points, "memory_used_bytes", step, self._until, scale=1 / GIB)
        self.query_one("#history-sm", HistoryPlot).show(sm, window_h=hours, title="SM util (%)", ylim=(0.0, 100.0))
        self.query_one("#history-memory", HistoryPlot).show(mem, window_h=hours, title="memory used (GiB)")
