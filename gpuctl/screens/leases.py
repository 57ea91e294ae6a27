"""The leases screen (`:leases`): every lease of the fleet, one row per lease (key = lease id).

Times are absolute UTC (no clock-relative text). Enter opens the lease's node.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.widgets import format as fmt

#: (column key, label, width).
LEASE_COLUMNS = (
    ("id", "lease", 12),
    ("node", "node", 9),
    ("department", "department", 12),
    ("owner", "owner", 16),
    ("slices", "slices", 16),
    ("heartbeat", "heartbeat", 12),
    ("expires", "expires", 12),
    ("endpoint", "endpoint", 18),
)


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
    LeasesScreen #leases-table { height: 1fr; background: $surface; }
    LeasesScreen #leases-empty { height: 1; padding: 0 1; color: $text-muted; display: none; }
    """

    def __init__(self) -> None:
        super().__init__(id="leases")
        self._lease_nodes: dict[str, str] = {}

    def compose_body(self) -> ComposeResult:
        table: DataTable = DataTable(id="leases-table", cursor_type="row", zebra_stripes=True)
        for key, label, width in LEASE_COLUMNS:
            table.add_column(label, width=width, key=key)
        yield table
        yield Static("no leases in the fleet", id="leases-empty")

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        rows = lease_rows(snapshot, self.app.palette)
        table = self.query_one("#leases-table", DataTable)
        with self.app.batch_update():
            table.clear(columns=False)
            for lease_id, _node, cells in rows:
                table.add_row(*cells, key=lease_id)
            self._lease_nodes = {lease_id: node for lease_id, node, _ in rows}
            self.query_one("#leases-empty").display = not rows

    @on(DataTable.RowSelected, "#leases-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        node = self._lease_nodes.get(event.row_key.value or "")
        if node:
            self.app.open_node(node)
