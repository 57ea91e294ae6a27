"""The fleet screen (`:nodes`, the default): one table row per GPU, grouped by node.

Rows are keyed by GPU UUID ("node:<name>" for an unreachable node). Each poll is diffed against
the rows on screen inside app.batch_update(): when the set and order of rows is the same only the
cells that changed are written (cells are interned by gpuctl.widgets.fleet_rows, so a changed
cell is a different object: the diff is by identity) and the table (a FleetTable: it re-renders
only changed cells) is refreshed once; when the set differs (filter, node up/down) the table is
rebuilt, keeping the cursor on the same GPU. Column widths are fixed per layout (never
update_width=True); the layout (gpuctl.widgets.fleet_rows.layout_for) is the widest that fits the
terminal with a GPU-name column as wide as the longest compact name in the snapshot, and a
resize or a snapshot that changes it rebuilds the columns.
`/` filters rows by node, department, GPU name, state, lease owner or UUID (case-insensitive
substring); Escape clears the filter. Enter on a row opens the node's detail.
"""

from __future__ import annotations

from itertools import compress
from operator import is_not

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static
from textual.widgets.data_table import ColumnKey
from rich.text import Text

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.widgets.fleet_rows import (
    NAME_DEFAULT_WIDTH,
    FleetRow,
    Layout,
    filter_rows,
    layout_cells,
    layout_for,
    name_width,
)
from gpuctl.widgets.fleet_table import FleetTable
from gpuctl.widgets.fleet_view import FleetViewSpec

#: Cells of the terminal width the table cannot use (its vertical scrollbar).
SCROLLBAR_CELLS = 1


def set_cells(table: DataTable, changes: list[tuple[str, list[tuple[str, Text]]]]) -> None:
    """Write changed cells, grouped by row: [(row key, [(column key, value), ...]), ...], into
    `table`, never resizing columns, then refresh the table once.

    DataTable.update_cell refreshes the widget on every call; measured at 1024 GPUs that was
    ~10k calls and ~0.5 s of UI-thread time per 3 polls. The values are stored in the table's
    cell store directly and the table refreshed once (what update_cell does, minus the per-call
    refresh and width checks); if that store is not there (another Textual version) update_cell
    is used for each.
    """
    if not changes:
        return
    data = getattr(table, "_data", None)
    if not isinstance(data, dict) or not hasattr(table, "_update_count"):
        for row_key, cells in changes:
            for col_key, value in cells:
                table.update_cell(row_key, col_key, value)
        return
    column_keys = {key.value: key for key in table.columns}
    for row_key, cells in changes:
        row = data[row_key]
        for col_key, value in cells:
            row[column_keys.get(col_key) or ColumnKey(col_key)] = value
    _cells_changed(table)


def _cells_changed(table: DataTable) -> None:
    """After cell values were written into the table's store: its update counter moved on and
    one refresh (FleetTable.cells_changed keeps the row order it computed)."""
    if isinstance(table, FleetTable):
        table.cells_changed()
    else:
        table._update_count += 1
        table.refresh()


def replace_rows(table: DataTable, rows: dict[str, dict]) -> None:
    """Replace whole rows of `table`: {row key: {column key: value} for every column}, as built
    off the UI thread (gpuctl.widgets.fleet_view), in one ``dict.update`` of the table's cell
    store, then refresh it once; never resizing columns. Without that store (another Textual
    version) each cell goes through set_cells."""
    if not rows:
        return
    data = getattr(table, "_data", None)
    if not isinstance(data, dict) or not hasattr(table, "_update_count"):
        set_cells(table, [(key, [(getattr(c, "value", c), v) for c, v in cells.items()])
                          for key, cells in rows.items()])
        return
    data.update(rows)
    _cells_changed(table)


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
        self.table_layout: Layout | None = None
        #: Cells of the GPU-name column: the longest compact name of the last snapshot shown.
        self.name_width = NAME_DEFAULT_WIDTH
        self._names_of: model.FleetSnapshot | None = None
        self._cursor_after_rebuild: str | None = None  # kept across a layout change
        self._keys: list[str] = []
        self._cells: dict[str, tuple[Text, ...]] = {}
        self._rows: dict[str, FleetRow] = {}
        # the FleetView (seq) whose cells the table holds; None when it holds other cells
        self._view_seq: int | None = None

    def compose_body(self) -> ComposeResult:
        yield FleetTable(
            id="fleet-table", cursor_type="row", zebra_stripes=True, cursor_foreground_priority="renderable"
        )
        yield Static("", id="fleet-empty")
        yield Static("", id="fleet-down", markup=False)
        # the filter Input is mounted after the screen is on the stack (see filter_input)

    @property
    def table(self) -> DataTable:
        return self.query_one("#fleet-table", DataTable)

    def on_mount(self) -> None:
        self.call_after_refresh(self.filter_input)
        self._set_layout(layout_for(self.app.size.width - SCROLLBAR_CELLS, self.name_width))
        self.table.focus()

    def on_resize(self, event: events.Resize) -> None:
        layout = layout_for(event.size.width - SCROLLBAR_CELLS, self.name_width)
        if layout is not self.table_layout:
            self._set_layout(layout)
            snapshot = self.host.snapshot
            if snapshot is not None and self.host.palette is not None:
                self.show_snapshot(snapshot)

    def _set_layout(self, layout: Layout) -> None:
        """Replace the table's columns by `layout`'s (rows are re-added by the next show)."""
        table = self.table
        if table.row_count:
            self._cursor_after_rebuild = self.cursor_key()
        table.clear(columns=True)
        for column in layout.columns:
            table.add_column(column.label, width=column.width, key=column.key)
        self.table_layout = layout
        self._keys = []
        self._cells = {}
        self._view_seq = None

    # -- rendering ------------------------------------------------------------------------------

    def palette_changed(self) -> None:
        self._keys = []  # force a rebuild with the new colors
        self._view_seq = None

    def _view_spec(self, layout: Layout) -> FleetViewSpec:
        """The spec of what this screen shows now, also handed to the poll worker (host
        fleet_view_spec), which builds the next polls' views for it."""
        spec = self.host.fleet_view_spec
        if spec is None or spec.layout is not layout or spec.filter_text != self.filter_text:
            keys = {key.value: key for key in self.table.columns}
            spec = FleetViewSpec(self.filter_text, layout, tuple(keys.get(k) or ColumnKey(k) for k in layout.keys))
            self.host.fleet_view_spec = spec
        return spec

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        app = self.app
        layout = self.table_layout
        if layout is None:
            return
        top = app.screen
        if top is not self and not isinstance(top, ModalScreen):
            # an opaque screen (board, node detail, leases) covers the table, but Textual still
            # counts this screen as visible: catch up when it is shown again (on_screen_resume)
            self._stale = True
            return
        if snapshot is not self._names_of:  # the name column fits the longest name present
            self._names_of = snapshot
            names = name_width(snapshot)
            if names != self.name_width:
                self.name_width = names
                fitted = layout_for(app.size.width - SCROLLBAR_CELLS, names)
                if fitted is not layout:
                    self._set_layout(fitted)
                    layout = fitted
        spec = self._view_spec(layout)
        view = self.host.fleet_view_for(snapshot)
        if view is not None and (view.spec != spec or view.palette is not app.palette):
            view = None
        table = self.table
        with app.batch_update():
            if view is not None and view.keys == self._keys and view.base_seq is not None \
                    and view.base_seq == self._view_seq:
                # built, filtered, laid out and diffed in the poll worker against what the
                # table holds: write the changed rows whole
                replace_rows(table, view.changed_rows)
                rows, self._cells = view.rows, view.cells
            else:
                rows = view.rows if view is not None else filter_rows(app.rows_for(snapshot), self.filter_text,
                                                                      app.palette)
                self._show_rows(table, rows, layout, view.cells if view is not None else None)
            self._view_seq = view.seq if view is not None else None
            self._rows = view.rows_by_key if view is not None else {r.key: r for r in rows}
            empty = self.query_one("#fleet-empty", Static)
            if not rows:
                empty.update(
                    f"no GPU matches the filter {self.filter_text!r} (Escape clears it)"
                    if self.filter_text
                    else "no GPUs in the fleet"
                )
            empty.display = not rows
            self._show_down(snapshot)

    def _show_rows(self, table: DataTable, rows: list[FleetRow], layout: Layout,
                   cells: dict[str, tuple[Text, ...]] | None) -> None:
        """Put `rows` in the table: rebuilt when the set or order of rows changed, else only the
        changed cells written. cells: each row's layout cells when already built (a FleetView's)."""
        keys = [r.key for r in rows]
        if keys != self._keys:
            self._rebuild(table, rows, layout, cells)
            return
        column_keys = layout.keys
        changes = []
        old_cells = self._cells
        new_cells = dict(old_cells)  # a view's cells dict may be the one held: never written in place
        for row in rows:
            new = cells[row.key] if cells is not None else layout_cells(row, layout)
            # cells are interned: a changed cell is another object (C-level loop: this
            # runs for every row of every poll)
            flags = list(map(is_not, new, old_cells[row.key]))
            if any(flags):
                changes.append((row.key, list(compress(zip(column_keys, new), flags))))
                new_cells[row.key] = new
        self._cells = new_cells
        set_cells(table, changes)

    def _show_down(self, snapshot: model.FleetSnapshot) -> None:
        """Under the table, each node that did not answer with its whole reason (its row has the
        reason in one cell, cut to that cell's width)."""
        down = [n for n in snapshot.nodes if not n.reachable]
        line = self.query_one("#fleet-down", Static)
        text = "\n".join(f"{n.name} down: {n.error or 'no answer'}" for n in down[:3])
        if len(down) > 3:
            text += f" (and {len(down) - 3} more nodes down)"
        if str(line.render()) != text:
            line.update(text)
        line.display = bool(down)

    def _rebuild(self, table: DataTable, rows: list[FleetRow], layout: Layout,
                 built: dict[str, tuple[Text, ...]] | None = None) -> None:
        cursor_key = self._cursor_after_rebuild or self.cursor_key()
        self._cursor_after_rebuild = None
        table.clear(columns=False)
        self._cells = {}
        for row in rows:
            cells = built[row.key] if built is not None else layout_cells(row, layout)
            table.add_row(*cells, key=row.key)
            self._cells[row.key] = cells
        self._keys = [r.key for r in rows]
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

    def filter_input(self) -> Input:
        """The `/` filter Input, mounted (above the footer) on first use. Not composed with the
        screen: this is the base screen of the app's "fleet" mode, composed before it is on the
        screen stack, and on Python >= 3.12 (Textual 8.2.8) an Input mounted then asks the app
        for its screen and stops the app with ScreenStackError("No screens on stack")."""
        found = self.query("#filter")
        if found:
            return found.first(Input)
        inp = Input(placeholder="filter: node, department, GPU, state…", id="filter")
        inp.cursor_blink = False
        footers = self.query(Footer)
        self.mount(inp, before=footers.first() if footers else None)
        return inp

    def set_filter(self, text: str) -> None:
        """Show only rows whose search text contains `text` (case-insensitive), and put `text` in
        the filter Input (programmatic use: commands, tests, Escape)."""
        inp = self.filter_input()
        if inp.value != text:
            inp.value = text
        self._apply_filter(text)

    def _apply_filter(self, text: str) -> None:
        """Filter the rows by `text` without touching the Input (it may already hold newer keys)."""
        self.filter_text = text
        self.filter_input().set_class(bool(text), "-active")
        snapshot = self.host.snapshot
        if snapshot is not None:
            self.show_snapshot(snapshot)

    def action_filter(self) -> None:
        inp = self.filter_input()
        inp.add_class("-editing")
        inp.focus()

    def action_clear_filter(self) -> None:
        inp = self.filter_input()
        inp.remove_class("-editing")
        self.set_filter("")
        self.table.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        # Changed events trail fast typing: filter by what the Input holds now, never write an
        # older value back into it (that lost and reordered keys)
        latest = event.input.value
        if latest != self.filter_text:
            self._apply_filter(latest)

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
        """Open the node of row `key`, showing that row's GPU first."""
        row = self._rows.get(key or "")
        if row is not None:
            self.host.open_node(row.node, None if row.key.startswith("node:") else row.key)
