"""Rows and column layouts of the fleet table: one row per GPU (key = GPU UUID), one per
unreachable node.

Builds Rich Text cells from a FleetSnapshot, the console's per-GPU SM utilization history and a
Palette. Pure functions of their inputs (no widgets), so the fleet screen can diff a new row
against the last one cell by cell and tests can check cells without a terminal.

Cells are interned: two cells with the same text and styles are the same Text object (a bounded
memo, see :func:`styled`), so the fleet screen finds changed cells by identity (`is not`) and the
table re-renders only those. Cells are shared: never mutate one.

Layouts: the table has fixed column widths per layout (never resized by its cells); the fleet
screen picks the widest layout that fits the terminal (:func:`layout_for`), its GPU-name column
as wide as the longest compact name in the fleet (:func:`name_width`; "H100 80GB HBM3": 14).
Narrower layouts drop columns by priority (:func:`build_layouts`: the sparkline and power first,
then lease owner, lease use, temperature, the memory bar, and only then the GPU name, state and
memory) and use compact forms of the SM and memory cells; node, GPU index, SM utilization and
the owning departments (in their colors) are in every layout. From 120 columns on, every GPU
name (compact, up to NAME_MAX_WIDTH cells) is shown whole.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from rich.cells import cell_len
from rich.text import Text

from gpuctl import model
from gpuctl import format as fmt
from gpuctl.widgets.palette import Palette

SM_BAR_CELLS = 10
SM_BAR_CELLS_COMPACT = 5
MEMORY_BAR_CELLS = 8
#: Cell padding DataTable puts on each side of a cell (cells).
CELL_PADDING = 1


@dataclass(frozen=True)
class Column:
    """One column of a layout: key (the DataTable column key, the same in every layout), header
    label, width in cells (fixed), and `cell`: which of a row's cells it shows (a compact form of
    the same figure in narrow layouts, e.g. "sm_compact" under the key "sm")."""

    key: str
    label: str
    width: int
    cell: str


@dataclass(frozen=True)
class Layout:
    """A set of columns for one range of terminal widths; `width` is what the table needs
    (column widths plus DataTable's padding of CELL_PADDING on each side of every cell)."""

    name: str
    columns: tuple[Column, ...]

    @property
    def width(self) -> int:
        return sum(c.width + 2 * CELL_PADDING for c in self.columns)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.columns)

    @cached_property
    def cells_of(self) -> operator.itemgetter:
        """cells mapping -> tuple of this layout's cells (C-speed: the fleet screen calls it
        for every row of every poll)."""
        return operator.itemgetter(*(c.cell for c in self.columns))


_NODE = Column("node", "node", 8, "node")
_GPU = Column("gpu", "#", 2, "gpu")
_SM = Column("sm", "SM util", 15, "sm")
_SM_COMPACT = Column("sm", "SM util", 11, "sm_compact")
_MEMORY = Column("memory", "memory", 22, "memory")
_MEMORY_COMPACT = Column("memory", "memory", 13, "memory_compact")
_TEMPERATURE = Column("temperature", "temp", 5, "temperature")
_POWER = Column("power", "power", 6, "power")
_HISTORY = Column("history", "SM recent", 16, "history")
_SLICES = Column("slices", "slices (● leased)", 28, "slices")
_SLICES_NARROW = Column("slices", "slices (● leased)", 24, "slices")
_USAGE = Column("usage", "lease use", 17, "usage")
_LEASE = Column("lease", "lease", 12, "lease")
_STATE = Column("state", "state", 9, "state")
#: Width of the GPU-name column: the longest compact name shown (gpuctl.format.compact_gpu_name),
#: at least the header's, at most NAME_MAX_WIDTH (a longer name is cut there).
NAME_MIN_WIDTH = 3
NAME_MAX_WIDTH = 32
#: The name column's width before any GPU is known, and in LAYOUTS.
NAME_DEFAULT_WIDTH = 24  # "RTX 6000 Ada Generation" (23) whole


def _name(width: int) -> Column:
    return Column("name", "GPU", width, "name")


def build_layouts(name_width: int) -> tuple[Layout, ...]:
    """The layouts, widest first, with a GPU-name column `name_width` cells wide. Narrower layouts
    drop columns in this order (the first dropped first): SM recent (sparkline), power, lease
    owner (with SM's compact form), lease use, temperature, then memory's compact form and the
    narrow slices column, then the GPU name, state, memory. Node, GPU index, SM utilization and
    the owning departments are in every layout."""
    name = _name(name_width)
    return (
        Layout("full", (_NODE, _GPU, _SM, _MEMORY, _TEMPERATURE, _POWER, _HISTORY, _SLICES, _USAGE, _LEASE, _STATE,
                        name)),
        Layout("wide", (_NODE, _GPU, _SM, _MEMORY, _TEMPERATURE, _POWER, _SLICES, _USAGE, _LEASE, _STATE, name)),
        Layout("wide-lease", (_NODE, _GPU, _SM, _MEMORY, _TEMPERATURE, _SLICES, _USAGE, _LEASE, _STATE, name)),
        Layout("medium", (_NODE, _GPU, _SM_COMPACT, _MEMORY, _TEMPERATURE, _SLICES, _USAGE, _STATE, name)),
        Layout("compact", (_NODE, _GPU, _SM_COMPACT, _MEMORY, _TEMPERATURE, _SLICES, _STATE, name)),
        Layout("named", (_NODE, _GPU, _SM_COMPACT, _MEMORY, _SLICES, _STATE, name)),
        Layout("narrow-named", (_NODE, _GPU, _SM_COMPACT, _MEMORY_COMPACT, _SLICES_NARROW, _STATE, name)),
        Layout("narrow", (_NODE, _GPU, _SM_COMPACT, _MEMORY_COMPACT, _SLICES_NARROW, _STATE)),
        Layout("tiny", (_NODE, _GPU, _SM_COMPACT, _SLICES_NARROW, _STATE)),
        Layout("minimal", (_NODE, _GPU, _SM_COMPACT, _SLICES_NARROW)),
    )


#: Widest first, with the default name width; the fleet screen uses layout_for.
LAYOUTS: tuple[Layout, ...] = build_layouts(NAME_DEFAULT_WIDTH)
#: The full layout's columns (every column key), in display order.
COLUMNS: tuple[Column, ...] = LAYOUTS[0].columns
COLUMN_KEYS = tuple(c.key for c in COLUMNS)

#: Every cell name a row carries (FleetRow.cells has all of them).
CELL_NAMES = tuple(dict.fromkeys(c.cell for layout in LAYOUTS for c in layout.columns))

#: Columns a GPU error message is word-wrapped across (those of them the layout shows).
_GPU_MESSAGE_COLUMNS = ("memory", "temperature", "power", "history")
#: ... and an unreachable node's reason.
_NODE_MESSAGE_COLUMNS = ("memory", "temperature", "power", "history", "slices", "usage")

_layouts_lock = threading.Lock()
_layouts_by_name_width: dict[int, tuple[Layout, ...]] = {NAME_DEFAULT_WIDTH: LAYOUTS}


def layouts_for_names(name_width: int) -> tuple[Layout, ...]:
    """build_layouts(name_width), the same objects for the same width (the fleet screen compares
    layouts by identity)."""
    name_width = max(NAME_MIN_WIDTH, min(NAME_MAX_WIDTH, name_width))
    with _layouts_lock:
        found = _layouts_by_name_width.get(name_width)
        if found is None:
            found = _layouts_by_name_width[name_width] = build_layouts(name_width)
        return found


def name_width(snapshot: model.FleetSnapshot) -> int:
    """Cells the longest compact GPU name of `snapshot` needs (terminal cells: a CJK character or an
    emoji takes 2; NAME_MIN_WIDTH..NAME_MAX_WIDTH;
    NAME_DEFAULT_WIDTH when it has no GPU, e.g. every node down)."""
    widths = [cell_len(fmt.compact_gpu_name(g.identity.name)) for n in snapshot.nodes for g in n.gpus]
    if not widths:
        return NAME_DEFAULT_WIDTH
    return max(NAME_MIN_WIDTH, min(NAME_MAX_WIDTH, max(widths)))


def layout_for(width: int, names: int = NAME_DEFAULT_WIDTH) -> Layout:
    """The widest layout (layouts_for_names(names): a GPU-name column `names` cells wide) whose
    width fits in `width` cells (the last one when none)."""
    layouts = layouts_for_names(names)
    for layout in layouts:
        if layout.width <= width:
            return layout
    return layouts[-1]


# -- interned cells ---------------------------------------------------------------------------

#: Bound on one generation of the memo of interned cells (cleared when reached: only costs
#: re-building them).
MEMO_LIMIT = 50_000
# Two generations: cells made or used since the last new_cell_generation(), and those of the one
# before (found there, a cell moves to the current one). Cells unused for a whole generation are
# forgotten, so the memo holds about two polls' worth of cells: with one flat memo, every new
# figure (memory, W, °C, SM %) added a cell until MEMO_LIMIT, ~15 minutes of steady growth at a
# 1 s refresh on 32 nodes (issue 15 item 5).
_memo: dict[tuple, Text] = {}
_previous: dict[tuple, Text] = {}
_memo_lock = threading.Lock()


def new_cell_generation() -> None:
    """Start a new generation of interned cells (fleet_rows does, once per call: once per poll)."""
    global _memo, _previous
    with _memo_lock:
        _previous, _memo = _memo, {}


def styled(*parts: tuple[str, str], ellipsis: bool = False) -> Text:
    """A one-line cell made of (text, style) parts, interned: the same parts give the same Text
    object (callers must not mutate it). ellipsis: a cell too long for its column ends in "…"
    (else it is cropped). Thread-safe."""
    key = ("ellipsis", parts) if ellipsis else parts
    cell = _memo.get(key)
    if cell is not None:
        return cell
    cell = _previous.get(key)
    if cell is None:
        cell = Text(no_wrap=True, end="", overflow="ellipsis" if ellipsis else None)
        for text, style in parts:
            cell.append(text, style=style or None)
    with _memo_lock:
        if len(_memo) >= MEMO_LIMIT:
            _memo.clear()
        return _memo.setdefault(key, cell)


#: The empty cell.
BLANK = styled()


def _all_cells(cells: dict[str, Text]) -> dict[str, Text]:
    """`cells` with BLANK for every cell name it lacks."""
    for name in CELL_NAMES:
        cells.setdefault(name, BLANK)
    return cells


@dataclass(frozen=True)
class FleetRow:
    """One row of the fleet table: key (GPU UUID, or "node:<name>" for an unreachable node),
    node name, cells by cell name (every Column.cell of every layout), and the lower-case text
    the `/` filter searches (node, GPU name, state, departments, lease owners, UUID).

    message: an error (GPU lost, node unreachable) written whole in one cell, the widest of the
    layout's `message_columns` (the others blank), in `message_style`; None otherwise.
    """

    key: str
    node: str
    cells: Mapping[str, Text]
    search_text: str
    message: str | None = None
    message_columns: tuple[str, ...] = ()
    message_style: str = ""
    _wrapped: dict = field(default_factory=dict, compare=False, repr=False)


def layout_cells(row: FleetRow, layout: Layout) -> tuple[Text, ...]:
    """The cells of `row` for the columns of `layout`, in order (interned Texts)."""
    cells = row.cells
    if row.message is None:
        return layout.cells_of(cells)
    wrapped = row._wrapped.get(layout.name)
    if wrapped is None:
        # the whole message in one cell (the widest of its columns here, cut with "…" when it is
        # longer), the other message columns blank: never split across columns
        cols = [c for c in layout.columns if c.key in row.message_columns]
        target = max(cols, key=lambda c: c.width).key if cols else None
        wrapped = tuple(
            styled((row.message, row.message_style), ellipsis=True) if c.key == target
            else BLANK if c.key in row.message_columns else cells.get(c.cell, BLANK)
            for c in layout.columns
        )
        row._wrapped[layout.name] = wrapped
    return wrapped


def gpu_state(gpu: model.GpuStatus) -> str:
    """"missing" (the backend no longer reports it), "error" (the GPU did not answer), "no sample" (none yet), "draining" (a reassignment waits
    for a lease), "leased" (a slice is leased) or "free" (none is; words of ownership,
    never of load: SM utilization says that)."""
    if gpu.missing:
        return "missing"
    if gpu.sample is not None and gpu.sample.error:
        return "error"
    if gpu.sample is None:
        return "no sample"
    if any(s.pending for s in gpu.slices):
        return "draining"
    if any(s.leased for s in gpu.slices):
        return "leased"
    return "free"


def wrap_into(message: str, widths: Sequence[int]) -> list[str]:
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


_wrap_into = wrap_into  # the name the tests knew


def _bar_cell(pct: float | None, label: str, cells: int, palette: Palette) -> Text:
    if pct is None:
        bar = ("·" * cells, palette.muted)
    else:
        bar = (fmt.bar(pct / 100.0, cells), palette.util(pct))
    return styled(bar, (" ", ""), (label, palette.muted if label.startswith(fmt.NA) else ""))


def _plain(value: str, palette: Palette, style: str = "") -> Text:
    return styled((value, palette.muted if value == fmt.NA else style))


def slices_cell(slices: Sequence[model.Slice], palette: Palette) -> Text:
    """Departments owning the GPU's slices in their colors, e.g. "research ½● · training ¼×2";
    ● (slice-busy color) after a department that has a leased slice here. Interned (shared)."""
    parts: list[tuple[str, str]] = []
    shares = fmt.department_shares((s.department, s.fraction) for s in slices)
    leased = {s.department for s in slices if s.leased}
    for i, (dept, label) in enumerate(shares):
        if i:
            parts.append((" · ", palette.muted))
        parts.append((f"{dept} {label}", palette.department(dept)))
        if dept in leased:
            parts.append(("●", palette.get("slice-busy")))
    return styled(*parts, ellipsis=True)


def lease_usage(slices: Sequence[model.Slice]) -> tuple[int | None, float | None]:
    """(memory in use in bytes, ops/s) of the leases on `slices`: the sums over the leased slices
    whose Slice.usage reports that figure (the daemon's lease worker stats); None for a figure no
    leased slice reports (never a made-up zero)."""
    memory: int | None = None
    ops: float | None = None
    for s in slices:
        if not s.leased or not s.usage:
            continue
        m = s.usage.get("memory_in_use_bytes")
        if isinstance(m, int) and not isinstance(m, bool) and m >= 0:
            memory = (memory or 0) + m
        o = s.usage.get("ops_per_s")
        if isinstance(o, (int, float)) and not isinstance(o, bool) and o >= 0 and o == o:
            ops = (ops or 0.0) + float(o)
    return memory, ops


def usage_cell(slices: Sequence[model.Slice], palette: Palette) -> Text:
    """"3.1 GiB 1.2k op/s" for a GPU with leased slices whose usage the daemon reports (a missing
    figure is N/A); empty when no leased slice here reports usage."""
    if not any(s.leased and s.usage for s in slices):
        return BLANK
    memory, ops = lease_usage(slices)
    busy = palette.get("slice-busy")
    return styled(
        (fmt.human_bytes(memory), busy if memory is not None else palette.muted),
        (" ", ""),
        (fmt.ops_rate(ops), busy if ops is not None else palette.muted),
    )


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
    slice_ids = {x.id for x in gpu.slices}
    leases = [lease for lease in node.leases if any(sid in slice_ids for sid in lease.slice_ids)]
    owners = sorted({lease.owner for lease in leases})
    lease_text = owners[0] + (f" +{len(owners) - 1}" if len(owners) > 1 else "") if owners else ""
    state_style = {"error": palette.error, "missing": palette.warning, "leased": palette.get("slice-busy"),
                   "draining": palette.warning}
    cells: dict[str, Text] = {
        "node": styled((node.name, "bold" if first_of_node else palette.muted)),
        "gpu": styled(("—", palette.muted) if gpu.missing else (str(gpu.identity.index), "")),
        "slices": slices_cell(gpu.slices, palette),
        "usage": usage_cell(gpu.slices, palette),
        "name": styled((fmt.compact_gpu_name(gpu.identity.name), "")),
        "lease": styled((lease_text, palette.get("slice-busy"))),
        "state": styled((state, state_style.get(state, palette.get("slice-idle")))),
    }
    message = None
    if s is not None and s.error:
        error_cell = styled(("missing" if gpu.missing else "error", f"bold {palette.error}"))
        cells["sm"] = cells["sm_compact"] = error_cell
        message = s.error
    else:
        sm = s.sm_util_pct if s is not None else None
        label = fmt.percent(sm).rjust(4)
        cells["sm"] = _bar_cell(sm, label, SM_BAR_CELLS, palette)
        cells["sm_compact"] = _bar_cell(sm, label, SM_BAR_CELLS_COMPACT, palette)
        used = s.memory_used_bytes if s is not None else None
        total = (s.memory_total_bytes if s is not None else None) or gpu.identity.memory_total_bytes
        mem_pct = used / total * 100.0 if used is not None and total else None
        mem_label = fmt.memory_label(used, total)
        cells["memory"] = _bar_cell(mem_pct, mem_label, MEMORY_BAR_CELLS, palette)
        cells["memory_compact"] = _plain(mem_label, palette, palette.util(mem_pct) if mem_pct is not None else "")
        cells["temperature"] = _plain(fmt.temperature(s.temperature_c if s else None), palette)
        cells["power"] = _plain(fmt.power(s.power_w if s else None), palette)
        cells["history"] = Text(
            fmt.sparkline(sm_history, _HISTORY.width), style=palette.get("gpu-sparkline"), no_wrap=True, end=""
        )
    search = " ".join(
        [node.name, fmt.safe_gpu_name(gpu.identity.name), state, gpu.identity.uuid,
         *(x.department for x in gpu.slices), *owners]
    ).lower()
    return FleetRow(
        key=gpu.identity.uuid,
        node=node.name,
        cells=_all_cells(cells),
        search_text=search,
        message=message,
        message_columns=_GPU_MESSAGE_COLUMNS if message else (),
        message_style=palette.error,
    )


def unreachable_row(node: model.NodeStatus, palette: Palette) -> FleetRow:
    """The one row of a node that did not answer: "unreachable" (or "node error" when the daemon
    answered with an error, e.g. NVML did not start) and the reason, in the error color, the
    reason word-wrapped across the columns from memory to lease use; state "down" (or "error")."""
    reason = node.error or "no answer"
    label = "unreachable" if node.error_code in (None, "unreachable") else "node error"
    sm = styled((label, f"bold {palette.error}"))
    cells: dict[str, Text] = {
        "node": styled((node.name, "bold")),
        "gpu": styled(("—", palette.muted)),
        "sm": sm,
        "sm_compact": sm,
        "state": styled(("down" if label == "unreachable" else "error", palette.error)),
    }
    return FleetRow(
        key=f"node:{node.name}",
        node=node.name,
        cells=_all_cells(cells),
        search_text=f"{node.name} {label} {reason}".lower(),
        message=reason,
        message_columns=_NODE_MESSAGE_COLUMNS,
        message_style=palette.error,
    )


def fleet_rows(
    snapshot: model.FleetSnapshot,
    sm_history: Mapping[str, Sequence[float | None]],
    palette: Palette,
) -> list[FleetRow]:
    """All rows of `snapshot` in node order then GPU index order (no filter; see filter_rows).
    Pure and thread-safe given immutable inputs: the app builds them in its poll worker."""
    new_cell_generation()
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
    last_node = None
    for row in rows:
        if needle and needle not in row.search_text:
            continue
        first = row.node != last_node
        last_node = row.node
        if first and not row.key.startswith("node:"):
            cells = dict(row.cells)
            cells["node"] = styled((row.node, "bold"))
            row = FleetRow(
                key=row.key,
                node=row.node,
                cells=cells,
                search_text=row.search_text,
                message=row.message,
                message_columns=row.message_columns,
                message_style=row.message_style,
            )
        out.append(row)
    return out
