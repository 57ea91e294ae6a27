"""What the department board shows, computed from fleet snapshots (plain Python, no textual).

The board (gpuctl/screens/board.py) draws one column per department plus "unassigned" and one card
per slice. This module turns a :class:`gpuctl.model.FleetSnapshot` into :class:`SliceView` rows
(one per slice of a reachable node), keeps a per-GPU rolling window of the SM utilization the
console saw (:class:`UtilWindow`), sums a column (:func:`column_totals`) and words a move for the
confirmation dialog (:func:`move_summary`). Every figure comes from the snapshot: fractions and
memory quotas from the slices, SM utilization from each GPU's latest NVML sample
(nvmlDeviceGetUtilizationRates, %), lease owners from the node's leases.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuctl import model
from gpuctl import format as fmt

#: How far back the column's mean SM utilization looks, seconds.
UTIL_WINDOW_S = 60.0


@dataclass(eq=True, unsafe_hash=True, slots=True)
class SliceView:
    """One slice as a board card shows it. Treat it as immutable (make changed copies with
    dataclasses.replace): it is hashed by value, and the board's card lists key their drawn rows
    by it. (Not frozen=True only because a frozen dataclass takes ~4x longer to build, and the
    board builds one per slice per snapshot: 1664 at 1024 GPUs.)

    slice_id: the slice's id ("<gpu-uuid>/<k>"). node: node name. gpu_index, gpu_uuid: the GPU
    holding it (NVML index and UUID). fraction: 1, 0.5, 0.25 or 0.125 of the GPU.
    memory_quota_bytes: its memory quota (bytes; None when unknown). department: owner (or "unassigned").
    lease_id, lease_owner: the lease holding it ("user@host"), None when idle; lease_owner is None
    too when the node did not list that lease. sm_util_pct: the GPU's SM utilization in the
    latest sample (%), None when N/A. gpu_error: the GPU's error ("lost: ...") or None.
    pending_to: the department a drain-mode move will give it to when its lease ends, else None.
    outside_processes: how many GPU processes outside gpuctl (no lease's) run on its GPU (0 when
    none or unknown): the card is marked, since they take memory and SMs from the slices.
    missing: its GPU is missing from the node's backend (model.GpuStatus.missing): counted apart.
    """

    slice_id: str
    node: str
    gpu_index: int
    gpu_uuid: str
    fraction: float
    memory_quota_bytes: int | None
    department: str
    lease_id: str | None = None
    lease_owner: str | None = None
    sm_util_pct: float | None = None
    gpu_error: str | None = None
    pending_to: str | None = None
    outside_processes: int = 0
    missing: bool = False

    @property
    def leased(self) -> bool:
        """True while a lease holds the slice ("leased")."""
        return self.lease_id is not None

    def label(self) -> str:
        """"node-01 GPU 3 ½": where the slice is and how big."""
        return f"{self.node} GPU {self.gpu_index} {fmt.fraction_glyph(self.fraction)}"


def slice_views(snapshot: model.FleetSnapshot | None) -> list[SliceView]:
    """Every slice of every reachable node of `snapshot`, nodes in snapshot (config) order, GPUs by
    NVML index, slices in their GPU's order. Unreachable nodes contribute nothing (their slices
    are unknown now). None gives []."""
    if snapshot is None:
        return []
    out: list[SliceView] = []
    append = out.append
    view = SliceView
    for node in snapshot.nodes:
        if not node.reachable:
            continue
        owners = {lease.id: lease.owner for lease in node.leases}
        name = node.name
        for gpu in sorted(node.gpus, key=lambda g: g.identity.index):
            sample = gpu.sample
            identity = gpu.identity
            index, uuid = identity.index, identity.uuid
            error = sample.error if sample is not None else None
            util = None if sample is None or error else sample.sm_util_pct
            outside = len(gpu.outside_processes or ())
            missing = gpu.missing
            for s in gpu.slices:
                lease = s.lease_id
                pending = s.pending
                # positional, in field order (a third faster than keywords for ~1700 slices)
                append(view(s.id, name, index, uuid, s.fraction, s.memory_quota_bytes, s.department, lease,
                            owners.get(lease) if lease else None, util, error,
                            pending.get("to") if pending else None, outside, missing))
    return out


def unreachable_nodes(snapshot: model.FleetSnapshot | None) -> list[str]:
    """Names of the nodes of `snapshot` that did not answer (their slices are not on the board)."""
    return [] if snapshot is None else [n.name for n in snapshot.nodes if not n.reachable]


def column_names(departments: Iterable[model.Department], views: Iterable[SliceView] = ()) -> list[str]:
    """The board's columns: departments in config order, then any department a slice names that
    the config does not (sorted), then "unassigned" last."""
    names = [d.name for d in departments if d.name != model.UNASSIGNED]
    extra = sorted({v.department for v in views} - set(names) - {model.UNASSIGNED})
    return names + extra + [model.UNASSIGNED]


class UtilWindow:
    """Per-GPU rolling window of the SM utilization samples the console saw.

    window_s: how far back `mean` looks (seconds, default 60). Samples are keyed by the GPU's
    UUID and the sample's own timestamp_s (Unix seconds), so the same sample seen in two
    snapshots (a frozen source, a slow daemon) counts once. N/A readings (None) are not stored.
    """

    def __init__(self, window_s: float = UTIL_WINDOW_S):
        if not window_s > 0:
            raise ValueError(f"UtilWindow: window_s must be > 0 seconds, got {window_s!r}")
        self.window_s = float(window_s)
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._sums: dict[str, float] = {}  # running sum of each ring's values (mean in O(1))
        self._latest_s = 0.0

    def add(self, snapshot: model.FleetSnapshot) -> None:
        """Record the latest sample of every GPU of every reachable node of `snapshot`, and drop
        samples older than window_s before the newest timestamp seen."""
        for node in snapshot.nodes:
            for gpu in node.gpus:
                s = gpu.sample
                if s is None or s.error or s.sm_util_pct is None:
                    continue
                uuid = gpu.identity.uuid
                ring = self._samples.get(uuid)
                if ring is None:
                    ring = self._samples[uuid] = deque()
                    self._sums[uuid] = 0.0
                if ring and ring[-1][0] >= s.timestamp_s:
                    continue
                value = float(s.sm_util_pct)
                ring.append((s.timestamp_s, value))
                self._sums[uuid] += value
                if s.timestamp_s > self._latest_s:
                    self._latest_s = s.timestamp_s
        cutoff = self._latest_s - self.window_s
        for uuid, ring in self._samples.items():
            if ring and ring[0][0] < cutoff:
                while ring and ring[0][0] < cutoff:
                    ring.popleft()
                # re-sum what is left (no drift from adding and subtracting floats)
                self._sums[uuid] = sum(v for _, v in ring)

    def mean(self, gpu_uuid: str) -> float | None:
        """Mean SM utilization (%) of that GPU over the window, None when no reading is in it."""
        ring = self._samples.get(gpu_uuid)
        if not ring:
            return None
        return self._sums[gpu_uuid] / len(ring)

    def count(self, gpu_uuid: str) -> int:
        """How many samples of that GPU are in the window."""
        return len(self._samples.get(gpu_uuid, ()))


@dataclass(frozen=True)
class ColumnTotals:
    """A column's header figures.

    slices: number of slices. gpu_equivalents: sum of their fractions. memory_quota_bytes: sum of
    their memory quotas (bytes). leased / free: slices held by a lease / not. mean_sm_util_pct: mean over
    the slices of their GPU's mean SM utilization in the window (%), None when no slice has one.
    missing: slices on GPUs missing from their backend (in none of the other figures).
    nodes_down: nodes that did not answer (their slices are unknown: the figures are lower
    bounds, or unknown when no node answered). arriving_gpus / leaving_gpus: GPU-equivalents
    scheduled to come to / leave the department in the next 24 h (schedule entries, planned).
    """

    slices: int
    gpu_equivalents: float
    memory_quota_bytes: int
    leased: int
    free: int
    mean_sm_util_pct: float | None
    missing: int = 0
    nodes_down: int = 0
    all_down: bool = False
    arriving_gpus: float = 0.0
    leaving_gpus: float = 0.0

    def text(self) -> str:
        """Three lines: "5.5 GPU · 440.0 GiB", "2 leased · 6 free · SM 43%" (SM: the mean over the
        window, "N/A" when no slice has a reading) and what is special: "24h: +1 −0.5 GPU"
        (scheduled), "1 missing", "1 node down". With nodes down the capacity figures are "≥"
        (at least); with every node down they are "unknown", never 0."""
        sm = "N/A" if self.mean_sm_util_pct is None else f"{self.mean_sm_util_pct:.0f}%"
        down = f"{self.nodes_down} node{'s' if self.nodes_down != 1 else ''} down"
        if self.all_down:
            first, second = f"unknown ({down})", "leased, free, SM: unknown"
        else:
            at_least = "≥" if self.nodes_down else ""
            first = f"{at_least}{self.gpu_equivalents:g} GPU · {at_least}{fmt.human_bytes(self.memory_quota_bytes)}"
            second = f"{self.leased} leased · {self.free} free · SM {sm}"
        notes = []
        if self.arriving_gpus or self.leaving_gpus:
            notes.append(f"24h: +{self.arriving_gpus:g} −{self.leaving_gpus:g} GPU")
        if self.missing:
            notes.append(f"{self.missing} missing")
        if self.nodes_down and not self.all_down:
            notes.append(down)
        return f"{first}\n{second}\n{' · '.join(notes)}"


def column_totals(views: Sequence[SliceView], window: UtilWindow | None = None, *, nodes_down: int = 0,
                  all_down: bool = False, arriving_gpus: float = 0.0, leaving_gpus: float = 0.0) -> ColumnTotals:
    """Totals of one column's slices. SM utilization: each slice's GPU mean over `window` (or the
    latest reading when the window has none / no window is given), averaged over the slices
    that have one. Slices of missing GPUs are only counted in `missing`. nodes_down, all_down,
    arriving_gpus, leaving_gpus: passed through (see ColumnTotals)."""
    util_sum, util_n = 0.0, 0
    means: dict[str, float | None] = {}
    gpus = 0.0
    memory = leased = missing = 0
    for v in views:
        if v.missing:
            missing += 1
            continue
        uuid = v.gpu_uuid
        if uuid in means:
            u = means[uuid]
        else:
            u = window.mean(uuid) if window is not None else None
            means[uuid] = u
        if u is None:
            u = v.sm_util_pct
        if u is not None:
            util_sum += u
            util_n += 1
        gpus += v.fraction
        if v.memory_quota_bytes is not None:  # unknown quota: not counted (never a made-up 0)
            memory += v.memory_quota_bytes
        if v.lease_id is not None:
            leased += 1
    counted = len(views) - missing
    return ColumnTotals(
        slices=len(views),
        gpu_equivalents=gpus,
        memory_quota_bytes=memory,
        leased=leased,
        free=counted - leased,
        mean_sm_util_pct=util_sum / util_n if util_n else None,
        missing=missing,
        nodes_down=nodes_down,
        all_down=all_down,
        arriving_gpus=arriving_gpus,
        leaving_gpus=leaving_gpus,
    )


def scheduled_flows(entries: Iterable[dict], now_s: float, horizon_s: float = 24 * 3600.0,
                    fractions: dict[str, float] | None = None) -> dict[str, tuple[float, float]]:
    """Department -> (GPU-equivalents arriving, leaving) by the planned schedule entries due in
    [now_s, now_s + horizon_s] and the waiting ones (due, waiting for a lease to end) (entries as gpuctl.fleet.schedule.entries lists them: "at_s",
    "from", "to", "slice_ids", "status"). A slice's size comes from `fractions` (slice id ->
    fraction; the board's views), 1 GPU when unknown."""
    flows: dict[str, list[float]] = {}
    fractions = fractions or {}
    for e in entries:
        status, at = e.get("status"), e.get("at_s")
        if status == "waiting":  # due already, waiting for a lease to end: still to come
            pass
        elif status != "planned" or not isinstance(at, (int, float)) or not now_s <= at <= now_s + horizon_s:
            continue
        gpus = sum(fractions.get(sid, 1.0) for sid in e.get("slice_ids") or ())
        flows.setdefault(str(e.get("to")), [0.0, 0.0])[0] += gpus
        flows.setdefault(str(e.get("from")), [0.0, 0.0])[1] += gpus
    return {k: (v[0], v[1]) for k, v in flows.items()}


def group_by_source(views: Iterable[SliceView], dst: str) -> dict[str, list[str]]:
    """Slice ids by their owning department (first-seen order), leaving out slices `dst` already
    owns: one reassignment request per source department."""
    groups: dict[str, list[str]] = {}
    for v in views:
        if v.department != dst:
            groups.setdefault(v.department, []).append(v.slice_id)
    return groups


def move_summary(views: Sequence[SliceView], dst: str) -> str:
    """The confirmation's sentence, e.g. "Move 2 slices (1.5 GPU) from research to training:
    node-01 GPU 3 ½, node-02 GPU 0 1"; leased slices are marked "🔒 owner". Slices `dst` already
    owns are left out. Raises ValueError when nothing would move."""
    moving = [v for v in views if v.department != dst]
    if not moving:
        raise ValueError(f"nothing to move: every selected slice is already owned by {dst}")
    sources = list(dict.fromkeys(v.department for v in moving))
    noun = "slice" if len(moving) == 1 else "slices"
    gpus = sum(v.fraction for v in moving)
    items = []
    for v in moving:
        item = v.label()
        if v.leased:
            item += f" 🔒 {v.lease_owner or v.lease_id}"
        items.append(item)
    return (
        f"Move {len(moving)} {noun} ({gpus:g} GPU) from {', '.join(sources)} to {dst}: "
        + ", ".join(items)
    )
