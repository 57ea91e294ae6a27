"""Rows of the fleet table: one per GPU (key = GPU UUID), one per unreachable node.

Builds Rich Text cells from a FleetSnapshot, the console's per-GPU SM utilization history and a
Palette. Pure functions of their inputs (no widgets), so the fleet screen can diff a new row
against the last one cell by cell and tests can check cells without a terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.text import Text

from gpuctl import model
from gpuctl.widgets import format as fmt
from gpuctl.widgets.palette import Palette

#: (column key, header label, width in cells), in display order. Widths are fixed: cells never
#: resize the table (see STYLE.md, "Live tables").
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("node", "node", 8),
    ("gpu", "#", 2),
    ("sm", "SM util", 15),
    ("memory", "memory", 22),
    ("temperature", "temp", 5),
    ("power", "power", 6),
    ("history", "SM recent", 16),
    ("slices", "slices (● leased)", 28),
    ("lease", "lease", 12),
    ("state", "state", 11),
    ("name", "GPU", 16),
)
COLUMN_KEYS = tuple(key for key, _, _ in COLUMNS)
_WIDTH = {key: width for key, _, width in COLUMNS}
SM_BAR_CELLS = 10
MEMORY_BAR_CELLS = 8
#: Columns that carry an error message across them (word-wrapped column to column).
_MESSAGE_COLUMNS = ("memory", "temperature", "power", "history")
#: Prefix dropped from GPU names in the table ("NVIDIA H100 80GB HBM3" -> "H100 80GB HBM3").
_NAME_PREFIX = "NVIDIA "


@dataclass(frozen=True)
class FleetRow:
    """One row of the fleet table: key (GPU UUID, or "node:<name>" for an unreachable node),
    node name, cells in COLUMN_KEYS order, and the lower-case text the `/` filter searches (node,
    GPU name, state, departments, lease owners, UUID)."""

    key: str
    node: str
    cells: tuple[Text, ...]
    search_text: str


def gpu_state(gpu: model.GpuStatus) -> str:
    """"error" (the GPU did not answer), "no sample" (none yet), "draining" (a reassignment waits
    for a lease), "busy" (a slice is leased) or "idle"."""
    if gpu.sample is not None and gpu.sample.error:
        return "error"
    if gpu.sample is None:
        return "no sample"
    if any(s.pending for s in gpu.slices):
        return "draining"
    if any(s.leased for s in gpu.slices):
        return "busy"
    return "idle"


def _wrap_into(message: str, widths: Sequence[int]) -> list[str]:
    """Word-wrap `message` greedily into consecutive cells of `widths`. A word too long for an
    empty cell leaves that cell blank and moves on (split only in the last cell); the last cell
    gets the rest (cropped by the table)."""
    words = message.split()
    out: list[str] = []
    for i, width in enumerate(widths):
        last = i == len(widths) - 1
        line = ""
        while words:
            candidate = f"{line} {words[0]}" if line else words[0]
            if len(candidate) <= width or (last and not line):
                line = candidate
                words.pop(0)
            else:
                break
        out.append(line)
    if words and out:
        out[-1] = " ".join([out[-1], *words]).strip()
    return out


def _bar_cell(pct: float | None, label: str, cells: int, palette: Palette) -> Text:
    color = palette.util(pct)
    text = Text(no_wrap=True, end="")
    if pct is None:
        text.append("·" * cells, style=palette.muted)
    else:
        text.append(fmt.bar(pct / 100.0, cells), style=color)
    text.append(" ")
    text.append(label, style=palette.muted if label.startswith(fmt.NA) else "")
    return text


def _plain(value: str, palette: Palette, style: str = "") -> Text:
    return Text(value, style=palette.muted if value == fmt.NA else style, no_wrap=True, end="")


def slices_cell(slices: Sequence[model.Slice], palette: Palette) -> Text:
    """Departments owning the GPU's slices in their colors, e.g. "research ½● · training ¼×2";
    ● (slice-busy color) after a department that has a leased slice here."""
    text = Text(no_wrap=True, end="")
    shares = fmt.department_shares((s.department, s.fraction) for s in slices)
    leased = {s.department for s in slices if s.leased}
    for i, (dept, label) in enumerate(shares):
        if i:
            text.append(" · ", style=palette.muted)
        text.append(f"{dept} {label}", style=palette.department(dept))
        if dept in leased:
            text.append("●", style=palette.get("slice-busy"))
    return text


def gpu_row(
    node: model.NodeStatus,
    gpu: model.GpuStatus,
    sm_history: Sequence[float | None],
    palette: Palette,
    *,
    first_of_node: bool = False,
) -> FleetRow:
    """The row of one GPU; `sm_history` is the SM utilization (%) the console saw, oldest first."""
    s = gpu.sample
    state = gpu_state(gpu)
    node_cell = Text(node.name, style="bold" if first_of_node else palette.muted, no_wrap=True, end="")
    name = gpu.identity.name.removeprefix(_NAME_PREFIX)
    cells: dict[str, Text] = {
        "node": node_cell,
        "gpu": Text(str(gpu.identity.index), no_wrap=True, end=""),
        "slices": slices_cell(gpu.slices, palette),
        "name": Text(name, no_wrap=True, end=""),
    }
    leases = [lease for lease in node.leases if any(sid in lease.slice_ids for sid in (x.id for x in gpu.slices))]
    owners = sorted({lease.owner for lease in leases})
    lease_text = owners[0] + (f" +{len(owners) - 1}" if len(owners) > 1 else "") if owners else ""
    cells["lease"] = Text(lease_text, style=palette.get("slice-busy"), no_wrap=True, end="")
    state_style = {"error": palette.error, "busy": palette.get("slice-busy"), "draining": palette.warning}
    cells["state"] = Text(state, style=state_style.get(state, palette.get("slice-idle")), no_wrap=True, end="")
    if s is not None and s.error:
        cells["sm"] = Text("error", style=f"bold {palette.error}", no_wrap=True, end="")
        widths = [_WIDTH[c] for c in _MESSAGE_COLUMNS]
        for col, part in zip(_MESSAGE_COLUMNS, _wrap_into(s.error, widths)):
            cells[col] = Text(part, style=palette.error, no_wrap=True, end="")
    else:
        sm = s.sm_util_pct if s is not None else None
        cells["sm"] = _bar_cell(sm, fmt.percent(sm).rjust(4), SM_BAR_CELLS, palette)
        used = s.memory_used_bytes if s is not None else None
        total = (s.memory_total_bytes if s is not None else None) or gpu.identity.memory_total_bytes
        mem_pct = used / total * 100.0 if used is not None and total else None
        cells["memory"] = _bar_cell(mem_pct, fmt.memory_label(used, total), MEMORY_BAR_CELLS, palette)
        cells["temperature"] = _plain(fmt.temperature(s.temperature_c if s else None), palette)
        cells["power"] = _plain(fmt.power(s.power_w if s else None), palette)
        cells["history"] = Text(
            fmt.sparkline(sm_history, _WIDTH["history"]),
            style=palette.get("gpu-sparkline"),
            no_wrap=True,
            end="",
        )
    search = " ".join(
        [node.name, gpu.identity.name, state, gpu.identity.uuid, *(x.department for x in gpu.slices), *owners]
    ).lower()
    return FleetRow(
        key=gpu.identity.uuid,
        node=node.name,
        cells=tuple(cells.get(k, Text("", end="")) for k in COLUMN_KEYS),
        search_text=search,
    )


def unreachable_row(node: model.NodeStatus, palette: Palette) -> FleetRow:
    """The one row of a node that did not answer: "unreachable" and the reason, in the error
    color, the reason word-wrapped across the columns from memory to slices."""
    reason = node.error or "no answer"
    label = "unreachable" if node.error_code in (None, "unreachable") else "node error"
    cells: dict[str, Text] = {
        "node": Text(node.name, style="bold", no_wrap=True, end=""),
        "gpu": Text("—", style=palette.muted, no_wrap=True, end=""),
        "sm": Text(label, style=f"bold {palette.error}", no_wrap=True, end=""),
        "state": Text(label, style=palette.error, no_wrap=True, end=""),
    }
    cols = (*_MESSAGE_COLUMNS, "slices")
    for col, part in zip(cols, _wrap_into(reason, [_WIDTH[c] for c in cols])):
        cells[col] = Text(part, style=palette.error, no_wrap=True, end="")
    return FleetRow(
        key=f"node:{node.name}",
        node=node.name,
        cells=tuple(cells.get(k, Text("", end="")) for k in COLUMN_KEYS),
        search_text=f"{node.name} {label} {reason}".lower(),
    )


def fleet_rows(
    snapshot: model.FleetSnapshot,
    sm_history: Mapping[str, Sequence[float | None]],
    palette: Palette,
) -> list[FleetRow]:
    """All rows of `snapshot` in node order then GPU index order (no filter; see filter_rows).
    Pure and thread-safe given immutable inputs: the app builds them in its poll worker."""
    rows: list[FleetRow] = []
    for node in snapshot.nodes:
        if not node.reachable:
            rows.append(unreachable_row(node, palette))
            continue
        for gpu in sorted(node.gpus, key=lambda g: g.identity.index):
            rows.append(gpu_row(node, gpu, sm_history.get(gpu.uuid, ()), palette, first_of_node=False))
    return rows


def filter_rows(rows: Sequence[FleetRow], filter_text: str, palette: Palette) -> list[FleetRow]:
    """The rows whose search text contains `filter_text` (case-insensitive; empty keeps all), with
    the node name in bold on the first shown row of each node and muted on the others."""
    needle = filter_text.strip().lower()
    out: list[FleetRow] = []
    node_col = COLUMN_KEYS.index("node")
    last_node = None
    for row in rows:
        if needle and needle not in row.search_text:
            continue
        first = row.node != last_node
        last_node = row.node
        if first or row.key.startswith("node:"):
            cells = list(row.cells)
            cells[node_col] = Text(row.node, style="bold", no_wrap=True, end="")
            row = FleetRow(key=row.key, node=row.node, cells=tuple(cells), search_text=row.search_text)
        out.append(row)
    return out
