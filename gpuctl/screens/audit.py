"""The audit screen (`:audit`): every node's audit records, newest last, with a filter.

It gets a loader in the constructor (``load(since_s) -> gpuctl.fleet.schedule.AuditView``, e.g.
``FleetSchedule.audit``) and never imports the app; loading runs in a thread worker. `/` focuses
the filter: rows whose node, who, action, request id or description contain the text (case
insensitive) stay. Unreadable audit lines are counted in the status line.
"""

from __future__ import annotations

from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

COLUMNS = (("time", "time (local)", 25), ("node", "node", 10), ("who", "who", 28), ("action", "action", 18),
           ("request", "request", 18), ("what", "what", 40), ("outcome", "outcome", 10))


def record_cells(r: dict[str, Any]) -> tuple[str, ...]:
    """The row of one merged audit record."""
    from gpuctl.fleet.schedule import what_text, who_text
    from gpuctl.timeparse import show_local

    return (show_local(r.get("time_s") or 0), str(r.get("node_name", "")), who_text(r.get("who")),
            str(r.get("action") or r.get("event")), str(r.get("request_id") or ""), what_text(r),
            str(r.get("outcome") or ""))


class AuditScreen(Screen[None]):
    """Audit records of the fleet; `/` filter, `r` reload, Escape back."""

    BINDINGS = [
        Binding("slash", "focus_filter", "filter"),
        Binding("r", "reload", "reload"),
        Binding("escape", "leave", "back"),
    ]
    DEFAULT_CSS = """
    AuditScreen #audit-table { height: 1fr; }
    AuditScreen #audit-status { height: 1; color: $text-muted; }
    """

    def __init__(self, load: Callable[[float | None], Any], *, name: str | None = None, id: str | None = None):
        super().__init__(name=name, id=id)
        self.loader = load
        self.records: list[dict[str, Any]] = []
        self.problem_count = 0
        self.node_errors: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        yield Static("audit: who changed what, newest last (/ filter, r reload)", id="audit-title")
        table: DataTable = DataTable(id="audit-table", cursor_type="row", zebra_stripes=True)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table
        yield Input(placeholder="filter: node, user, action, request id, department ...", id="audit-filter")
        yield Static("", id="audit-status")
        yield Footer()

    def on_mount(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        self.query_one("#audit-status", Static).update("loading the audit logs ...")
        self._load()

    @work(thread=True, exclusive=True, exit_on_error=False, group="audit-load")
    def _load(self) -> None:
        try:
            view = self.loader(None)
        except Exception as e:  # noqa: BLE001 - shown, never raised on the UI thread
            self.app.call_from_thread(self.query_one("#audit-status", Static).update, f"could not read: {e}")
            return
        self.app.call_from_thread(self.show_view, view)

    def show_view(self, view: Any) -> None:
        """Keep the records of `view` and show those matching the filter."""
        self.records = list(view.records)
        self.problem_count = len(view.problems)
        self.node_errors = dict(view.errors)
        self._show_rows()

    @on(Input.Changed, "#audit-filter")
    def _filter_changed(self) -> None:
        self._show_rows()

    def _show_rows(self) -> None:
        text = self.query_one("#audit-filter", Input).value.strip().casefold()
        table = self.query_one("#audit-table", DataTable)
        table.clear()
        shown = 0
        for i, r in enumerate(self.records):
            cells = record_cells(r)
            if text and text not in " ".join(cells).casefold():
                continue
            table.add_row(*cells, key=str(i))
            shown += 1
        status = f"{shown} of {len(self.records)} records"
        if self.problem_count:
            status += f"; {self.problem_count} unreadable line(s) (see `gpuctl audit`)"
        down = self.node_errors
        if down:
            status += "; not shown: " + ", ".join(down)
        self.query_one("#audit-status", Static).update(status)

    def action_focus_filter(self) -> None:
        self.set_focus(self.query_one("#audit-filter", Input))

    def action_leave(self) -> None:
        self.app.pop_screen()
