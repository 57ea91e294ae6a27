"""The fleet screen (`:nodes`, the default): one table row per GPU, grouped by node.

Rows are keyed by GPU UUID ("node:<name>" for an unreachable node). Each poll is diffed against
the rows on screen inside app.batch_update(): when the set and order of rows is the same only the
cells whose text changed are updated (fixed column widths, never update_width=True); when it
differs (filter, node up/down) the table is rebuilt, keeping the cursor on the same GPU.
`/` filters rows by node, department, GPU name, state, lease owner or UUID (case-insensitive
substring); Escape clears the filter. Enter on a row opens the node's detail.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input, Static
from textual.widgets.data_table import ColumnKey, RowKey
from rich.text import Text

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.widgets.fleet_rows import COLUMN_KEYS, COLUMNS, FleetRow, filter_rows


#: Above this many changed cells in one poll, cells are stored in one pass and the table is
#: refreshed once (see set_cells).
BULK_UPDATE_CELLS = 64


def set_cells(table: DataTable, changes: list[tuple[str, str, Text]]) -> None:
    """Write changed cells (row key, column key, value) into `table`, never resizing columns.

    DataTable.update_cell refreshes the widget on every call; measured here at 1024 GPUs that was
    ~10k calls and ~0.5 s of UI-thread time per 3 polls. Above BULK_UPDATE_CELLS changes the
    values are stored in the table's cell store directly and the table refreshed once (what
    update_cell does, minus the per-call refresh); if that store is not there (another Textual
    version) update_cell is used for each.
    """
    data = getattr(table, "_data", None)
    if len(changes) > BULK_UPDATE_CELLS and isinstance(data, dict) and hasattr(table, "_update_count"):
        for row_key, col_key, value in changes:
            data[RowKey(row_key)][ColumnKey(col_key)] = value
        table._update_count += 1
        table.refresh()
        return
    for row_key, col_key, value in changes:
        table.update_cell(row_key, col_key, value)


class FleetScreen(GpuctlScreen):
    """The fleet table, the `/` filter Input and an empty-state line."""

    VIEW = "fleet"
    CSS_PATH = "fleet.tcss"
    BINDINGS = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("enter", "open_node", "Node detail", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(id="fleet")
        self.filter_text = ""
        self._keys: list[str] = []
        self._cells: dict[str, tuple] = {}
        self._rows: dict[str, FleetRow] = {}

    def compose_body(self) -> ComposeResult:
        table: DataTable = DataTable(
            id="fleet-table", cursor_type="row", zebra_stripes=True, cursor_foreground_priority="renderable"
        )
        for key, label, width in COLUMNS:
            table.add_column(label, width=width, key=key)
        yield table
        yield Static("", id="fleet-empty")
        yield Input(placeholder="filter: node, department, GPU, state…", id="filter")

    @property
    def table(self) -> DataTable:
        return self.query_one("#fleet-table", DataTable)

    def on_mount(self) -> None:
        self.query_one("#filter", Input).cursor_blink = False
        self.table.focus()

    # -- rendering ------------------------------------------------------------------------------

    def palette_changed(self) -> None:
        self._keys = []  # force a rebuild with the new colors

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        app = self.app
        rows = filter_rows(app.rows_for(snapshot), self.filter_text, app.palette)
        keys = [r.key for r in rows]
        table = self.table
        with app.batch_update():
            if keys != self._keys:
                self._rebuild(table, rows)
            else:
                changes = []
                for row in rows:
                    old = self._cells[row.key]
                    if old is row.cells:
                        continue
                    for col, new, prev in zip(COLUMN_KEYS, row.cells, old):
                        if new != prev:
                            changes.append((row.key, col, new))
                    self._cells[row.key] = row.cells
                set_cells(table, changes)
            self._rows = {r.key: r for r in rows}
            empty = self.query_one("#fleet-empty", Static)
            if not rows:
                empty.update(
                    f"no GPU matches the filter {self.filter_text!r} (Escape clears it)"
                    if self.filter_text
                    else "no GPUs in the fleet"
                )
            empty.display = not rows

    def _rebuild(self, table: DataTable, rows: list[FleetRow]) -> None:
        cursor_key = self.cursor_key()
        table.clear(columns=False)
        for row in rows:
            table.add_row(*row.cells, key=row.key)
        self._keys = [r.key for r in rows]
        self._cells = {r.key: r.cells for r in rows}
        if cursor_key in self._cells:
            table.move_cursor(row=self._keys.index(cursor_key), animate=False)

    def cursor_key(self) -> str | None:
        """Row key (GPU UUID or "node:<name>") under the cursor, or None for an empty table."""
        table = self.table
        if not table.row_count:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # cursor outside the rows (table just emptied)
            return None

    # -- filter ----------------------------------------------------------------------------------

    def set_filter(self, text: str) -> None:
        """Show only rows whose search text contains `text` (case-insensitive)."""
        self.filter_text = text
        inp = self.query_one("#filter", Input)
        if inp.value != text:
            inp.value = text
        inp.set_class(bool(text), "-active")
        snapshot = self.app.snapshot
        if snapshot is not None:
            self.show_snapshot(snapshot)

    def action_filter(self) -> None:
        inp = self.query_one("#filter", Input)
        inp.add_class("-editing")
        inp.focus()

    def action_clear_filter(self) -> None:
        inp = self.query_one("#filter", Input)
        inp.remove_class("-editing")
        self.set_filter("")
        self.table.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        if event.value != self.filter_text:
            self.set_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        event.input.remove_class("-editing")
        self.table.focus()

    # -- navigation ------------------------------------------------------------------------------

    @on(DataTable.RowSelected, "#fleet-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self._open(event.row_key.value)

    def action_open_node(self) -> None:
        self._open(self.cursor_key())

    def _open(self, key: str | None) -> None:
        row = self._rows.get(key or "")
        if row is not None:
            self.app.open_node(row.node)
