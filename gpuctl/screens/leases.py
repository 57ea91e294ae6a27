"""The leases screen (`:leases`): every lease of the fleet, one row per lease (key = lease id).

Times are absolute UTC (no clock-relative text). Enter opens the lease's node.

Columns have fixed widths; the widest set that fits the terminal is shown (columns dropped in
LEASE_DROP_ORDER, least useful first) so the table never scrolls sideways for a few cells, and a
resize that changes the set rebuilds the columns. Each cell carries its own padding (" value "
in the cell's style, DataTable cell_padding 0): every row's text starts in the same column, also
in the SVG snapshots (where a run of text that begins with a space was drawn one cell left).
"""

from __future__ import annotations

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl import format as fmt

#: (column key, label, width of the content in cells; each cell adds a space on either side).
LEASE_COLUMNS = (
    ("id", "lease", 12),
    ("node", "node", 9),
    ("department", "department", 12),
    ("owner", "owner", 16),
    ("slices", "slices", 12),
    ("heartbeat", "heartbeat", 12),
    ("expires", "expires", 12),
    ("endpoint", "endpoint", 18),
)
#: Columns left out, in this order, until the rest fits the width.
LEASE_DROP_ORDER = ("heartbeat", "endpoint", "slices", "node")
#: Cells of the terminal width the table cannot use (its vertical scrollbar).
SCROLLBAR_CELLS = 1


def lease_columns(width: int) -> tuple[tuple[str, str, int], ...]:
    """The LEASE_COLUMNS that fit in `width` cells (each takes its width + 2), dropping columns
    in LEASE_DROP_ORDER; the fewest there are when even those do not fit."""
    columns = list(LEASE_COLUMNS)
    for key in LEASE_DROP_ORDER:
        if sum(w + 2 for _, _, w in columns) <= width:
            break
        columns = [c for c in columns if c[0] != key]
    return tuple(columns)


def _padded(text: Text) -> Text:
    """" value " with the padding in the cell's own style."""
    out = Text(" ", style=text.style, end="")
    out.append_text(text)
    out.append(" ", style=text.style)
    return out


def lease_rows(snapshot: model.FleetSnapshot, palette) -> list[tuple[str, str, tuple[Text, ...]]]:
    """(lease id, node, cells) for every lease of every reachable node, in node then lease order.
    slices: count and GPU-equivalents, e.g. "2 (1 GPU)"."""
    out = []
    for node in snapshot.nodes:
        fractions = {s.id: s.fraction for s in node.slices()}
        for lease in node.leases:
            gpus = sum(fractions.get(sid, 0.0) for sid in lease.slice_ids)
            cells = (
                Text(lease.id),
                Text(node.name),
                Text(lease.department, style=palette.department(lease.department)),
                Text(lease.owner, style=palette.get("slice-busy")),
                Text(f"{len(lease.slice_ids)} ({gpus:g} GPU)"),
                Text(fmt.utc_time(lease.heartbeat_s)),
                Text(fmt.utc_time(lease.expires_s)),
                Text(lease.endpoint or "—", style=palette.muted if not lease.endpoint else ""),
            )
            out.append((lease.id, node.name, cells))
    return out


class LeasesScreen(GpuctlScreen):
    """All leases; Escape goes back."""

    VIEW = "leases"
    BINDINGS = [Binding("escape", "app.back", "Back")]
    DEFAULT_CSS = """
    LeasesScreen #leases-table { height: 1fr; background: $surface; overflow-x: hidden;
        scrollbar-size-vertical: 1; }
    LeasesScreen #leases-table.-narrow { overflow-x: auto; }
    LeasesScreen #leases-empty { height: 1; padding: 0 1; color: $text-muted; display: none; }
    """

    def __init__(self) -> None:
        super().__init__(id="leases")
        self._lease_nodes: dict[str, str] = {}
        self.columns: tuple[tuple[str, str, int], ...] = ()

    def compose_body(self) -> ComposeResult:
        yield DataTable(id="leases-table", cursor_type="row", zebra_stripes=True, cell_padding=0)
        yield Static("no leases in the fleet", id="leases-empty")

    def on_mount(self) -> None:
        self._set_columns(self.app.size.width - SCROLLBAR_CELLS)

    def on_resize(self, event: events.Resize) -> None:
        if self._set_columns(event.size.width - SCROLLBAR_CELLS):
            self._data_changed()  # re-add the rows now, or when the screen is shown again

    def _set_columns(self, width: int) -> bool:
        """Use the columns that fit `width`; True when they changed (rows must be re-added)."""
        columns = lease_columns(width)
        if columns == self.columns:
            return False
        table = self.query_one("#leases-table", DataTable)
        table.clear(columns=True)
        for key, label, w in columns:
            table.add_column(Text(f" {label} ", end=""), width=w + 2, key=key)
        table.set_class(sum(w + 2 for _, _, w in columns) > width, "-narrow")
        self.columns = columns
        return True

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        rows = lease_rows(snapshot, self.host.palette)
        table = self.query_one("#leases-table", DataTable)
        shown = [i for i, (key, _, _) in enumerate(LEASE_COLUMNS) if key in {c[0] for c in self.columns}]
        with self.app.batch_update():
            table.clear(columns=False)
            for lease_id, _node, cells in rows:
                table.add_row(*[_padded(cells[i]) for i in shown], key=lease_id)
            self._lease_nodes = {lease_id: node for lease_id, node, _ in rows}
            self.query_one("#leases-empty").display = not rows

    @on(DataTable.RowSelected, "#leases-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        node = self._lease_nodes.get(event.row_key.value or "")
        if node:
            self.host.open_node(node)
