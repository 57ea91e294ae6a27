"""The leases screen (`:leases`): every lease of the fleet, one row per lease (key = lease id).

Times are absolute UTC (no clock-relative text). Enter opens the lease's node; `x` releases the
lease under the cursor and `e` renews it (a heartbeat: expiry = now + its ttl), each after a
confirmation (gpuctl.screens.confirm.ConfirmScreen), through the node's client (the calls of
`gpuctl release` / `gpuctl renew`) in a thread worker; not in read-only mode. Lease ids are never
cut: the id column is as wide as the longest id ("lease-" and 12 hex digits) and is never dropped.

Columns have fixed widths; the widest set that fits the terminal is shown (columns dropped in
LEASE_DROP_ORDER, least useful first) so the table never scrolls sideways for a few cells, and a
resize that changes the set rebuilds the columns. Each cell carries its own padding (" value "
in the cell's style, DataTable cell_padding 0): every row's text starts in the same column, also
in the SVG snapshots (where a run of text that begins with a space was drawn one cell left).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from gpuctl import model
from gpuctl.screens.base import GpuctlScreen
from gpuctl.screens.confirm import ConfirmScreen
from gpuctl import format as fmt

#: (column key, label, width of the content in cells; each cell adds a space on either side).
#: Width of the longest lease id gpuctld makes ("lease-" + 12 hex digits).
LEASE_ID_WIDTH = 18

LEASE_COLUMNS = (
    ("id", "lease", LEASE_ID_WIDTH),
    ("node", "node", 9),
    ("department", "department", 12),
    ("owner", "owner", 16),
    ("slices", "slices", 12),
    ("heartbeat", "heartbeat", 12),
    ("expires", "expires", 12),
    ("endpoint", "endpoint", 18),
)
#: Columns left out, in this order, until the rest fits the width.
LEASE_DROP_ORDER = ("heartbeat", "endpoint", "slices", "node")  # never "id"
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
    BINDINGS = [
        Binding("escape", "app.back", "Back"),
        Binding("x", "release", "Release"),
        Binding("e", "renew", "Renew"),
    ]
    DEFAULT_CSS = """
    LeasesScreen #leases-table { height: 1fr; background: $surface; overflow-x: hidden;
        scrollbar-size-vertical: 1; }
    LeasesScreen #leases-table.-narrow { overflow-x: auto; }
    LeasesScreen #leases-empty { height: 1; padding: 0 1; color: $text-muted; display: none; }
    """

    def __init__(self) -> None:
        super().__init__(id="leases")
        self._lease_nodes: dict[str, str] = {}
        self._owners: dict[str, str] = {}
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
        cursor = self.cursor_lease_id()
        shown = [i for i, (key, _, _) in enumerate(LEASE_COLUMNS) if key in {c[0] for c in self.columns}]
        with self.app.batch_update():
            table.clear(columns=False)
            for lease_id, _node, cells in rows:
                table.add_row(*[_padded(cells[i]) for i in shown], key=lease_id)
            self._lease_nodes = {lease_id: node for lease_id, node, _ in rows}
            self._owners = {lease_id: str(cells[3]) for lease_id, _, cells in rows}
            self.query_one("#leases-empty").display = not rows
            keys = [lease_id for lease_id, _, _ in rows]
            if cursor in keys:
                table.move_cursor(row=keys.index(cursor), animate=False)

    def cursor_lease_id(self) -> str | None:
        """The lease id of the row under the cursor (None: no rows)."""
        table = self.query_one("#leases-table", DataTable)
        if not table.row_count:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - cursor outside the rows
            return None

    # -- release and renew --------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: no release or renew (not in the footer either)."""
        if action in ("release", "renew"):
            return not self.host.readonly
        return True

    def action_release(self) -> None:
        """`x`: release the lease under the cursor, after a confirmation."""
        self._confirm("release")

    def action_renew(self) -> None:
        """`e`: renew (heartbeat) the lease under the cursor, after a confirmation."""
        self._confirm("renew")

    def _confirm(self, what: str) -> None:
        lease_id = self.cursor_lease_id()
        node = self._lease_nodes.get(lease_id or "")
        if lease_id is None or node is None:
            self.host.flash("no lease selected", severity="warning")
            return
        owner = self._owners.get(lease_id, "?")
        if what == "release":
            text = (f"Release lease {lease_id} of {owner} on {node}? Its slices become free; a program "
                    f"still using them loses them.")
        else:
            text = f"Renew lease {lease_id} of {owner} on {node}? Its expiry becomes now + its ttl."

        def answered(yes: bool | None) -> None:
            if yes:
                self._lease_call(what, node, lease_id)

        self.app.push_screen(ConfirmScreen(f"{what.capitalize()} lease", text, what.capitalize()), answered)

    @work(thread=True, exit_on_error=False, group="lease-action")
    def _lease_call(self, what: str, node: str, lease_id: str) -> None:
        """(Thread worker.) The node's DELETE /v1/leases/ID or POST .../heartbeat."""
        client: Any = getattr(self.host.source, "client", None)
        try:
            if client is None:
                raise RuntimeError("this fleet source has no node connections")
            node_client = client.clients[node]
            if what == "release":
                answer = node_client.release_lease(lease_id)
                n = len(answer.get("slice_ids", []))
                message = f"released {lease_id} on {node}: {n} slice{'s' if n != 1 else ''} free"
            else:
                answer = node_client.heartbeat_lease(lease_id)
                message = f"renewed {lease_id} on {node}: expires {fmt.utc_time(answer.get('expires_s'))}"
            severity = "information"
        except Exception as e:  # noqa: BLE001 - every failure is shown
            message, severity = f"{what} {lease_id} on {node} failed: {e}", "error"
        self.app.call_from_thread(self._lease_call_done, message, severity)

    def _lease_call_done(self, message: str, severity: str) -> None:
        self.host.flash(message, severity=severity)
        self.host.poll()

    @on(DataTable.RowSelected, "#leases-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        node = self._lease_nodes.get(event.row_key.value or "")
        if node:
            self.host.open_node(node)
