"""Split and merge one GPU's slices: the service behind `gpuctl split` / `gpuctl merge` and the
console's split key (headless: no terminal, no textual).

A split replaces a GPU's slices with slices of the given fractions (1, 1/2, 1/4, 1/8 adding up to
1, e.g. ``1/2,1/4,1/4``); a merge replaces them with one whole slice. Both happen only while none
of the GPU's slices is leased (DESIGN.md: "the split of a GPU changes only while none of it is
leased"). The new slices belong to the current owner, who must be one department; a merge may name
`to`, a department that then owns the whole GPU whatever the parts' owners were. Every change is
generation-checked: the plan quotes the node's generation from the snapshot it was made on, and the
node refuses it (``stale_generation``) when another admin changed the node meanwhile. MIG devices
are refused by the node (``mig_read_only``): their layout is nvidia-smi's.

Use :func:`plan_split` / :func:`plan_merge` on a gpuctl.model.FleetSnapshot (no I/O; raise
:class:`SplitError` for what can be known from the snapshot), then :func:`apply` (one POST
/v1/split on the node; raises gpuctl.fleet.client.NodeError for the node's refusal).
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpuctl.format import fraction_label

#: The fractions a slice may have.
SLICE_FRACTIONS = (Fraction(1), Fraction(1, 2), Fraction(1, 4), Fraction(1, 8))


class SplitError(Exception):
    """A split or merge that cannot be done; ``str()`` says why, naming the node, GPU and slices.

    code: a node error code (a row of gpuctl.cli.errors.NODE_CODE_EXIT): "invalid_field" (bad
    fractions), "unknown_gpu" (no such GPU index on the node), "unreachable" (the node did not
    answer), "slice_leased", "mixed_owners", "mig_read_only", "nothing_to_do" (already so)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def parse_fractions(text: str) -> list[float]:
    """``"1/2,1/4,1/4"`` -> [0.5, 0.25, 0.25]. Each part is 1, 1/2, 1/4 or 1/8 (or 0.5, 0.25,
    0.125); they must add up to 1. Raises SplitError("invalid_field") naming the bad part."""
    parts = [p.strip() for p in text.split(",")]
    out: list[Fraction] = []
    for i, p in enumerate(parts):
        try:
            f = Fraction(p)
        except (ValueError, ZeroDivisionError):
            raise SplitError(f"--into: part {i + 1} ({p!r}) is not a fraction like 1/2", "invalid_field") from None
        if f not in SLICE_FRACTIONS:
            raise SplitError(f"--into: part {i + 1} ({p}) must be 1, 1/2, 1/4 or 1/8", "invalid_field")
        out.append(f)
    if sum(out) != 1:
        raise SplitError(f"--into: the parts add up to {sum(out)}, not 1 (the whole GPU)", "invalid_field")
    return [float(f) for f in out]


@dataclass
class SplitPlan:
    """One change of one GPU's slices, planned on a snapshot.

    kind: "split" or "merge". node, gpu_uuid, gpu_index: the GPU. generation: the node's
    generation in the snapshot (quoted to the node). before: the GPU's current slices
    (gpuctl.model.Slice). fractions: the new slices' fractions, in order. department: their owner.
    """

    kind: str
    node: str
    gpu_uuid: str
    gpu_index: int
    generation: int
    before: list[Any]
    fractions: list[float]
    department: str
    mig: bool = False
    request_id: str = field(default_factory=lambda: "s-" + uuidlib.uuid4().hex[:12])

    def describe(self) -> str:
        """One line: ``split GPU 0 of n1 (research: 1) into 1/2 + 1/4 + 1/4 for research``."""
        now = " + ".join(f"{s.department} {fraction_label(s.fraction)}" for s in self.before)
        new = " + ".join(fraction_label(f) for f in self.fractions)
        verb = "merge" if self.kind == "merge" else "split"
        into = "into one whole slice" if self.kind == "merge" else f"into {new}"
        return f"{verb} GPU {self.gpu_index} of {self.node} ({now}) {into} owned by {self.department}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "gpu_uuid": self.gpu_uuid, "gpu_index": self.gpu_index,
                "generation": self.generation, "request_id": self.request_id,
                "before": [{"id": s.id, "fraction": s.fraction, "department": s.department} for s in self.before],
                "fractions": self.fractions, "department": self.department}


def _gpu(snapshot: Any, node: str, gpu_index: int) -> tuple[Any, Any]:
    n = snapshot.node(node) if hasattr(snapshot, "node") else next((x for x in snapshot.nodes if x.name == node), None)
    if n is None:
        raise SplitError(f"no node {node!r} in the fleet", "unknown_node")
    if not n.reachable:
        raise SplitError(f"node {node} is unreachable: {n.error or 'no answer'}", "unreachable")
    for g in n.gpus:
        if g.identity.index == gpu_index:
            return n, g
    known = ", ".join(str(g.identity.index) for g in n.gpus if g.identity.index >= 0) or "none"
    raise SplitError(f"node {node} has no GPU {gpu_index} (GPUs: {known})", "unknown_gpu")


def _check_free(kind: str, node: str, g: Any) -> None:
    leased = [s for s in g.slices if s.leased]
    if leased:
        names = ", ".join(f"{s.id} (lease {s.lease_id})" for s in leased)
        raise SplitError(f"cannot {kind} GPU {g.identity.index} of {node} while slices are leased: {names}; "
                         f"release them first", "slice_leased")


def plan_split(snapshot: Any, node: str, gpu_index: int, fractions: list[float]) -> SplitPlan:
    """Plan splitting GPU `gpu_index` of `node` into `fractions` (see :func:`parse_fractions`).
    Raises SplitError: unknown node/GPU, node unreachable, a slice leased, slices of several owners,
    or the GPU already split so."""
    n, g = _gpu(snapshot, node, gpu_index)
    mig = any(getattr(s, "mig", False) for s in g.slices)
    owners = sorted({s.department for s in g.slices})
    if not mig:
        _check_free("split", node, g)
        if len(owners) > 1:
            raise SplitError(f"cannot split GPU {gpu_index} of {node}: its slices have different owners "
                             f"({', '.join(owners)}); merge it with --to DEPT or reassign them to one department "
                             f"first", "mixed_owners")
        if [s.fraction for s in g.slices] == list(fractions):
            raise SplitError(f"GPU {gpu_index} of {node} is already split into "
                             f"{' + '.join(fraction_label(f) for f in fractions)}: nothing to do", "nothing_to_do")
    return SplitPlan("split", node, g.identity.uuid, gpu_index, n.generation, list(g.slices), list(fractions),
                     owners[0] if owners else "unassigned", mig=mig)


def plan_merge(snapshot: Any, node: str, gpu_index: int, to: str | None = None) -> SplitPlan:
    """Plan merging GPU `gpu_index` of `node` into one whole slice, owned by its one owner or by
    `to`. Raises SplitError: unknown node/GPU, node unreachable, a slice leased, several owners
    without `to`, or the GPU already one slice of that owner."""
    n, g = _gpu(snapshot, node, gpu_index)
    mig = any(getattr(s, "mig", False) for s in g.slices)
    owners = sorted({s.department for s in g.slices})
    dept = to or (owners[0] if owners else "unassigned")
    if not mig:
        _check_free("merge", node, g)
        if len(owners) > 1 and to is None:
            raise SplitError(f"cannot merge GPU {gpu_index} of {node}: its parts have different owners "
                             f"({', '.join(owners)}); name the department that gets the whole GPU with --to DEPT",
                             "mixed_owners")
        if len(g.slices) == 1 and owners == [dept]:
            raise SplitError(f"GPU {gpu_index} of {node} is already one whole slice of {dept}: nothing to do",
                             "nothing_to_do")
    return SplitPlan("merge", node, g.identity.uuid, gpu_index, n.generation, list(g.slices), [1.0], dept,
                     mig=mig)


def apply(fleet: Any, plan: SplitPlan) -> dict[str, Any]:
    """Send `plan` to its node (POST /v1/split with the snapshot's generation); returns the node's
    answer ``{"generation", "slices": [...], "replayed"}``. Raises gpuctl.fleet.client.NodeError
    for a refusal (stale_generation, slice_leased, mixed_owners, mig_read_only, gpu_missing, ...)
    or when the node does not answer."""
    body: dict[str, Any] = {"request_id": plan.request_id, "generation": plan.generation, "gpu_uuid": plan.gpu_uuid}
    if plan.kind == "merge":
        body["parts"] = 1
    else:
        body["fractions"] = plan.fractions
    owners = {s.department for s in plan.before}
    if owners != {plan.department}:
        body["department"] = plan.department
    return fleet.clients[plan.node].request("POST", "/v1/split", json=body)
