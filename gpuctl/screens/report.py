"""The report screen (`:report`): per department, owned vs used GPU-hours over the last 7 or 30
days, as bars (gpuctl.widgets.usage_plots) and as a table with leased and idle owned GPU-hours.

The report comes from the nodes' usage accounting (gpuctl.fleet.usage_report.report_from_source), fetched
in a thread worker (group "report") when the screen is first shown and when the period changes
(`p`); never on the UI thread. A node that did not answer is named under the bars and its
rows are marked incomplete. Never imports the app: it reads ``self.app.source``.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Static

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.widgets.usage_plots import UsageBars, bar_series

#: The periods `p` cycles through: (label, seconds).
PERIODS = (("7 days", 7 * 86400), ("30 days", 30 * 86400))
#: Table columns: (report field, label, width).
COLUMNS = (
    ("department", "department", 14),
    ("owned_gpu_h", "owned GPU-h", 12),
    ("leased_gpu_h", "leased GPU-h", 13),
    ("used_gpu_h", "used GPU-h", 11),
    ("mean_sm_util_pct", "mean SM %", 10),
    ("idle_owned_gpu_h", "idle owned GPU-h", 17),
)


def _gpu_h(v: Any) -> str:
    """GPU-hours as the table shows them (one decimal; "?" when unknown)."""
    return "?" if v is None else f"{v:.1f}"


class ReportLoaded(Message):
    """A report fetch finished: the period index it was for, the report (build_report's shape) or
    the error in words."""

    def __init__(self, period: int, report: dict[str, Any] | None, error: str | None = None):
        super().__init__()
        self.period = period
        self.report = report
        self.error = error


def report_cells(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """The table's rows of a report by department (unknown figures "?"), then the total."""
    def fmt(row: dict[str, Any], key: str) -> str:
        v = row.get(key)
        return v if isinstance(v, str) else ("?" if v is None else f"{v:.1f}")

    out = [tuple(fmt(r, k) + (" *" if k == "department" and r.get("incomplete") else "") for k, _, _ in COLUMNS)
           for r in report.get("rows", [])]
    total = {**report.get("total", {}), "department": "total"}
    out.append(tuple(fmt(total, k) for k, _, _ in COLUMNS))
    return out


class ReportScreen(GpuctlScreen):
    """Owned vs used GPU-hours per department; `p` switches 7/30 days (and reloads), Escape goes back."""

    VIEW = "report"
    BINDINGS = [
        Binding("escape", "app.back", "Back"),
        Binding("p", "next_period", "Period"),
    ]
    DEFAULT_CSS = """
    ReportScreen #report-status { height: auto; padding: 0 1; color: $text-muted; }
    ReportScreen #report-bars { height: 2fr; }
    ReportScreen #report-table { height: 1fr; background: $surface; }
    """

    def __init__(self, *, clock: Any = time.time) -> None:
        super().__init__(id="report")
        self.period = 0
        self.clock = clock
        self.report: dict[str, Any] | None = None
        self.loading = False

    def compose_body(self) -> ComposeResult:
        yield Static("loading the usage report ...", id="report-status")
        yield UsageBars(id="report-bars")
        yield DataTable(id="report-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#report-table", DataTable)
        for key, label, width in COLUMNS:
            table.add_column(label, width=width, key=key)
        self.action_reload()

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        """Usage does not change with each poll: nothing to do (`p` reloads)."""

    def action_next_period(self) -> None:
        self.period = (self.period + 1) % len(PERIODS)
        self.action_reload()

    def action_reload(self) -> None:
        label, seconds = PERIODS[self.period]
        self.loading = True
        self.query_one("#report-status", Static).update(f"loading the last {label} ...")
        now = self.clock()
        self._load(self.period, now - seconds, now)

    @work(thread=True, exclusive=True, exit_on_error=False, group="report")
    def _load(self, period: int, since_s: float, until_s: float) -> None:
        from gpuctl.fleet.usage_report import report_from_source

        try:
            report = report_from_source(self.app.source, since_s, until_s)
        except Exception as e:  # noqa: BLE001 - shown on the screen, the console goes on
            self.post_message(ReportLoaded(period, None, f"{type(e).__name__}: {e}" if not str(e) else str(e)))
            return
        self.post_message(ReportLoaded(period, report))

    @on(ReportLoaded)
    def _loaded(self, message: ReportLoaded) -> None:
        if message.period != self.period:
            return  # an older fetch for another period
        self.loading = False
        status = self.query_one("#report-status", Static)
        if message.report is None:
            status.update(Text(f"no report: {message.error}", style="bold"))
            return
        self.report = rep = message.report
        label = PERIODS[self.period][0]
        words = (f"last {label}: {rep['fleet_gpus']} GPUs, {rep['fleet_gpu_hours']:.0f} GPU-h; "
                 f"owned {_gpu_h(rep['total'].get('owned_gpu_h'))}, used {_gpu_h(rep['total'].get('used_gpu_h'))} "
                 f"GPU-h  "
                 f"[p: period]")
        if rep["unreachable_nodes"]:
            words += (f"\nincomplete (*): no answer from {', '.join(rep['unreachable_nodes'])}")
        status.update(words)
        self.query_one(UsageBars).show(bar_series(rep), title=f"owned vs used GPU-hours, last {label}",
                                       colors=("blue", "green"))
        table = self.query_one("#report-table", DataTable)
        with self.app.batch_update():
            table.clear()
            for i, cells in enumerate(report_cells(rep)):
                table.add_row(*cells, key=str(i))
