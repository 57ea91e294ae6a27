"""Turn a plan (gpuctl.fleet.plan) into schedule entries for the nodes (headless, no I/O).

Each occurrence of a window gives two scheduled moves: at its start, ``gpus`` GPU-equivalents of
slices from the pool to the department; at its end, the same slices back to the pool. Slices are
chosen by simulating ownership forward from the fleet's current pool: ends before starts at the
same instant, simultaneous starts in priority order (lower number first), whole GPUs first, then
the nodes holding the most pool slices. Request ids are derived from the plan name, window and
occurrence start (``plan:<name>:w<i>:<start unix s>:start|end``), so applying the same plan again
finds every entry already installed and changes nothing; entries of an earlier application that
the plan no longer produces are cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuctl.fleet.plan import Occurrence, Plan, occurrences

#: Seconds from now when an occurrence that has already begun is started.
START_LEAD_S = 30.0
_EPS = 1e-9


@dataclass(frozen=True)
class PoolSlice:
    """A slice of the pool: node, slice id, GPU index (for ordering), fraction of a GPU."""

    node: str
    slice_id: str
    gpu_index: int
    fraction: float


@dataclass
class PlannedEntry:
    """One scheduled move of the plan across the fleet: request id, time, from, to, per-node slice
    ids, leased mode, label; ``installed``: already on the nodes (from an earlier application);
    ``short_gpus``: GPU-equivalents of the window the pool could not give at that time."""

    request_id: str
    at_s: float
    src: str
    dst: str
    slices: dict[str, list[str]]
    leased: str
    label: str
    installed: bool = False
    short_gpus: float = 0.0

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.slices.values())

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "at_s": self.at_s, "from": self.src, "to": self.dst,
                "slices": self.slices, "leased": self.leased, "label": self.label, "installed": self.installed,
                "short_gpus": self.short_gpus}


@dataclass
class ApplyPlan:
    """What applying a plan does: entries to add, entries already installed, entries to cancel
    (node -> entry ids), and warnings (shortfalls)."""

    entries: list[PlannedEntry] = field(default_factory=list)
    cancel: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def to_add(self) -> list[PlannedEntry]:
        return [e for e in self.entries if not e.installed and e.count]


def request_id(plan: Plan, occ: Occurrence, edge: str) -> str:
    """``plan:<name>:w<i>:<start unix s>:<edge>``, the same on every application of the plan."""
    return f"plan:{plan.name}:w{occ.window.index}:{int(occ.start_s)}:{edge}"


def plan_entries(plan: Plan, pool: list[PoolSlice], existing: dict[str, dict[str, Any]], now_s: float,
                 to_s: float, priorities: dict[str, int]) -> ApplyPlan:
    """Choose the schedule entries of `plan` between now and `to_s`.

    pool: the pool's slices now (reachable nodes). existing: request id -> ``{"slices": {node:
    [slice ids]}, "status": str, "entry_ids": {node: id}}`` of this plan's entries on the nodes.
    """
    out = ApplyPlan()
    free: dict[str, PoolSlice] = {f"{p.node}\0{p.slice_id}": p for p in pool}
    known = {f"{p.node}\0{p.slice_id}": p for p in pool}
    events: list[tuple[float, int, int, int, Occurrence, str]] = []
    for occ in occurrences(plan, now_s, to_s):
        prio = priorities.get(occ.window.department, 1 << 30)
        rid_start = request_id(plan, occ, "start")
        start_at = occ.start_s if occ.start_s > now_s else now_s + START_LEAD_S
        if rid_start in existing:
            start_at = min(start_at, occ.start_s) if occ.start_s <= now_s else start_at
        events.append((start_at, 1, prio, occ.window.index, occ, "start"))
        events.append((occ.end_s, 0, prio, occ.window.index, occ, "end"))
    events.sort(key=lambda e: e[:4])
    held: dict[str, list[PoolSlice]] = {}
    wanted_rids: set[str] = set()
    for at_s, _, _, _, occ, edge in events:
        w = occ.window
        rid = request_id(plan, occ, edge)
        label = f"{w.label} {edge}"
        if edge == "start":
            start_rid = rid
            if rid in existing:
                taken = []
                for node, sids in existing[rid]["slices"].items():
                    for sid in sids:
                        key = f"{node}\0{sid}"
                        taken.append(free.pop(key, None) or known.get(key) or PoolSlice(node, sid, -1, 0.0))
                held[start_rid] = taken
                out.entries.append(PlannedEntry(rid, at_s, plan.pool, w.department, _by_node(taken), w.on_conflict,
                                                label, installed=True))
                wanted_rids.add(rid)
                continue
            taken, short = _take(free, w.gpus, set(w.nodes))
            held[start_rid] = taken
            if short > _EPS:
                out.warnings.append(f"{w.label}: at its start the pool ({plan.pool}) can give "
                                    f"{w.gpus - short:g} of {w.gpus:g} GPU-equivalents")
            if taken:
                out.entries.append(PlannedEntry(rid, at_s, plan.pool, w.department, _by_node(taken), w.on_conflict,
                                                label, short_gpus=round(short, 6)))
                wanted_rids.add(rid)
        else:
            start_rid = request_id(plan, occ, "start")
            taken = held.pop(start_rid, [])
            for p in taken:
                free[f"{p.node}\0{p.slice_id}"] = p
            if not taken:
                continue
            installed = rid in existing
            slices = existing[rid]["slices"] if installed else _by_node(taken)
            out.entries.append(PlannedEntry(rid, at_s, w.department, plan.pool, slices, w.on_conflict, label,
                                            installed=installed))
            wanted_rids.add(rid)
    for rid, info in existing.items():
        if rid not in wanted_rids and info.get("status") == "planned":
            for node, eid in info.get("entry_ids", {}).items():
                out.cancel.setdefault(node, []).append(eid)
    return out


def _by_node(slices: list[PoolSlice]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in slices:
        out.setdefault(p.node, []).append(p.slice_id)
    return out


def _take(free: dict[str, PoolSlice], gpus: float, nodes: set[str]) -> tuple[list[PoolSlice], float]:
    """Take slices adding up to at most `gpus` from `free` (in place); returns (taken, shortfall)."""
    cands = [p for p in free.values() if not nodes or p.node in nodes]
    per_node: dict[str, int] = {}
    for p in cands:
        per_node[p.node] = per_node.get(p.node, 0) + 1
    cands.sort(key=lambda p: (-p.fraction, -per_node[p.node], p.node, p.gpu_index, p.slice_id))
    taken, left = [], gpus
    for p in cands:
        if p.fraction <= left + _EPS:
            taken.append(p)
            left -= p.fraction
            del free[f"{p.node}\0{p.slice_id}"]
            if left <= _EPS:
                break
    return taken, max(left, 0.0)
