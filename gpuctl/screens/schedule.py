"""The schedule screen (`:schedule`): every node's scheduled moves with their state, a form to add
one (time, from, to, amount) and `c` to cancel the selected entry.

It gets its source in the constructor (gpuctl.fleet.schedule.FleetSchedule or anything with
``departments``, ``entries()``, ``add(at, src, dst, amount, now_s)``, ``cancel(entry_id)``) and
never imports the app: every call to the source runs in a thread worker, results come back on the
UI thread. Times are shown in local time. Escape leaves the screen.
"""

from __future__ import annotations

import time
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Input, Static

#: (column key, label, width in cells).
COLUMNS = (("id", "entry", 12), ("at", "at (local)", 25), ("node", "node", 10), ("from", "from", 12),
           ("to", "to", 12), ("slices", "slices", 6), ("status", "status", 9), ("note", "note", 40))


def entry_cells(e: dict[str, Any]) -> tuple[str, ...]:
    """The row of one entry (as gpuctl.fleet.schedule.entries returns them)."""
    from gpuctl.fleet.schedule import entry_note
    from gpuctl.timeparse import show_local

    return (e["id"], show_local(e["at_s"]), e["node"], e["from"], e["to"], str(len(e["slice_ids"])), e["status"],
            entry_note(e))


class ScheduleScreen(Screen[None]):
    """Scheduled moves of the fleet; `a` add (form), `c` cancel the selected entry, `r` reload."""

    BINDINGS = [
        Binding("a", "focus_form", "add"),
        Binding("c", "cancel_entry", "cancel entry"),
        Binding("r", "reload", "reload"),
        Binding("escape", "leave", "back"),
    ]
    DEFAULT_CSS = """
    ScheduleScreen #schedule-table { height: 1fr; }
    ScheduleScreen #schedule-form { height: 3; }
    ScheduleScreen #schedule-form Input { width: 1fr; }
    ScheduleScreen #schedule-status { height: 1; color: $text-muted; }
    """

    def __init__(self, source: Any, *, readonly: bool = False, name: str | None = None, id: str | None = None):
        super().__init__(name=name, id=id)
        self.source = source
        self.readonly = readonly
        self.rows: dict[str, dict[str, Any]] = {}
        self.last_change = ""  # what the last add or cancel said, kept in the status line

    def compose(self) -> ComposeResult:
        yield Static("schedule: scheduled moves per node (a add, c cancel, r reload)", id="schedule-title")
        table: DataTable = DataTable(id="schedule-table", cursor_type="row", zebra_stripes=True)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table
        if not self.readonly:
            with Horizontal(id="schedule-form"):
                yield Input(placeholder="time: +2h, tomorrow 08:00", id="form-at")
                yield Input(placeholder="from", id="form-from")
                yield Input(placeholder="to", id="form-to")
                yield Input(placeholder="amount: 2 or 1.5g", id="form-amount")
                yield Button("add", id="form-add")
        yield Static("", id="schedule-status")
        yield Footer()

    def on_mount(self) -> None:
        self.action_reload()

    # -- loading

    def action_reload(self) -> None:
        self._say("loading the schedule ...")
        self._load()

    @work(thread=True, exclusive=True, exit_on_error=False, group="schedule-load")
    def _load(self) -> None:
        try:
            found, errors = self.source.entries()
        except Exception as e:  # noqa: BLE001 - shown, never raised on the UI thread
            self.app.call_from_thread(self._say, f"could not read the schedule: {e}")
            return
        self.app.call_from_thread(self.show_entries, found, errors)

    def show_entries(self, found: list[dict[str, Any]], errors: dict[str, Any]) -> None:
        """Replace the table's rows (key: node + entry id)."""
        table = self.query_one("#schedule-table", DataTable)
        table.clear()
        self.rows = {}
        for e in found:
            key = f"{e['node']}:{e['id']}"
            self.rows[key] = e
            table.add_row(*entry_cells(e), key=key)
        down = "; ".join(f"{n}: {err}" for n, err in errors.items())
        self._say((f"{self.last_change} | " if self.last_change else "") + f"{len(found)} entries"
                  + (f"; not shown: {down}" if down else ""))

    # -- adding

    def action_focus_form(self) -> None:
        if not self.readonly:
            self.set_focus(self.query_one("#form-at", Input))

    @on(Input.Submitted)
    @on(Button.Pressed, "#form-add")
    def _submit(self, event: Any = None) -> None:
        values = [self.query_one(f"#form-{k}", Input).value for k in ("at", "from", "to", "amount")]
        missing = [k for k, v in zip(("time", "from", "to", "amount"), values) if not v.strip()]
        if missing:
            self._say(f"fill in: {', '.join(missing)}")
            return
        self._say("scheduling ...")
        self._add(*values)

    @work(thread=True, exit_on_error=False, group="schedule-change")
    def _add(self, at: str, src: str, dst: str, amount: str) -> None:
        try:
            result = self.source.add(at, src, dst, amount, time.time())
        except Exception as e:  # noqa: BLE001 - ScheduleError, ReassignError: shown as they are
            self.app.call_from_thread(self._say, f"not scheduled: {e}")
            return
        failed = "; ".join(f"{n}: {err}" for n, err in result.failed.items())
        msg = (f"scheduled {len(result.plan.moves)} slice(s) {src} -> {dst} as {result.entry_id}"
               + (f"; not installed on {failed}" if failed else ""))
        self.app.call_from_thread(self._after_change, msg)

    # -- cancelling

    def action_cancel_entry(self) -> None:
        if self.readonly:
            self._say("read-only: nothing can be cancelled")
            return
        table = self.query_one("#schedule-table", DataTable)
        if table.row_count == 0:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        entry = self.rows.get(key or "")
        if entry is None:
            return
        self._say(f"cancelling {entry['id']} ...")
        self._cancel(entry["id"])

    @work(thread=True, exit_on_error=False, group="schedule-change")
    def _cancel(self, entry_id: str) -> None:
        try:
            cancelled, refused, unreachable = self.source.cancel(entry_id)
        except Exception as e:  # noqa: BLE001
            self.app.call_from_thread(self._say, f"not cancelled: {e}")
            return
        problems = "; ".join(f"{n}: {e}" for n, e in {**refused, **unreachable}.items())
        msg = (f"cancelled {entry_id} on {', '.join(cancelled)}" if cancelled else f"{entry_id} not cancelled") + \
            (f"; {problems}" if problems else "")
        self.app.call_from_thread(self._after_change, msg)

    # -- helpers

    def _after_change(self, message: str) -> None:
        self.last_change = message
        self._say(message)
        self._load()

    def _say(self, message: str) -> None:
        self.query_one("#schedule-status", Static).update(message)

    def action_leave(self) -> None:
        self.app.pop_screen()
