"""The reassignment service: move slice ownership from one department to another across the fleet.

One path for the CLI (`gpuctl reassign`) and the console (drag and drop, `m`): a
`ReassignRequest` is planned against a fleet snapshot (`plan`), then executed node by node
(`execute`) with the generation each node's snapshot had and one request id, so a run that failed
half-way says exactly what moved, what did not and whose outcome is unknown (no answer: the node
may have applied it), and running it again with the same request id completes it without moving
anything twice. Each POST /v1/assign carries a deadline (the node's timeout_s from the send), past
which the node refuses to apply it, so a node frozen or slow past the point where this client gave
up never applies it afterwards. A re-run with an explicit request id by count or GPU-equivalents
refuses (UNREACHABLE) while a node in its scope cannot be asked whether it recorded that id.
"""

from __future__ import annotations

import math
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from gpuctl.fleet.client import FleetClient, NodeClient, NodeError
from gpuctl.exit_codes import ExitCode
from gpuctl.model import LEASED_MODES, MAX_REQUEST_ID_CHARS
from gpuctl.model import UNASSIGNED, FleetSnapshot, GpuStatus, Slice

#: Tolerance when summing fractions of slices (fractions are exact binary floats; this is slack).
_EPS = 1e-9
#: ``--from any``: take idle slices of whichever departments matter least (see :func:`candidates`).
ANY = "any"


class ReassignError(Exception):
    """The request itself is invalid (unknown department, both count and gpus, ...). Nothing moved."""


@dataclass
class ReassignRequest:
    """What to move.

    src, dst: department names (UNASSIGNED allowed as src or dst). Exactly one of: count (number
    of slices), gpus (GPU-equivalents, e.g. 1.5), slice_ids (explicit slices, from the console).
    node: only slices of this node. leased: "refuse" (default: leased slices are not candidates),
    "drain" (leased slices move when their lease ends) or "revoke" (end their leases, then move).
    request_id: idempotency key (generated when None). dry_run: plan only. src may be
    :data:`ANY`: idle slices of the unassigned pool first, then of the lowest-priority departments
    (priorities: department -> priority, lower = more important; filled in by :func:`prepare`).
    """

    src: str
    dst: str
    count: int | None = None
    gpus: float | None = None
    slice_ids: list[str] | None = None
    node: str | None = None
    leased: str = "refuse"
    request_id: str | None = None
    dry_run: bool = False
    priorities: dict[str, int] | None = None

    def validate(self, known_departments: list[str]) -> None:
        """Raise ReassignError naming the bad field."""
        known = set(known_departments) | {UNASSIGNED}
        for fld, name in (("--from", self.src), ("--to", self.dst)):
            if name not in known and not (fld == "--from" and name == ANY):
                raise ReassignError(f"{fld}: unknown department {name!r} (known: {', '.join(sorted(known))})")
        if self.src == ANY and self.slice_ids is not None:
            raise ReassignError("--from any takes --count or --gpus, not --slice (a slice names its owner)")
        if self.src == self.dst:
            raise ReassignError(f"--from and --to are both {self.src!r}: nothing would move")
        given = [x is not None for x in (self.count, self.gpus, self.slice_ids)]
        if sum(given) != 1:
            raise ReassignError("give exactly one of --count, --gpus or --slice")
        if self.count is not None and self.count < 1:
            raise ReassignError(f"--count: must be a positive integer, got {self.count}")
        if self.gpus is not None and not (math.isfinite(self.gpus) and self.gpus > _EPS):
            raise ReassignError(f"--gpus: must be a positive number of GPU-equivalents (finite), got {self.gpus}")
        rid = self.request_id
        if rid is not None:
            # the daemon's rule for every string: refuse here, before any node is asked
            if not rid.strip() or len(rid) > MAX_REQUEST_ID_CHARS or not rid.isprintable() or rid != rid.strip():
                raise ReassignError(f"--request-id: must be 1..{MAX_REQUEST_ID_CHARS} printable characters with "
                                    f"no spaces at either end, got {rid[:80]!r}")
        if self.leased not in LEASED_MODES:
            raise ReassignError(f"leased mode {self.leased!r}: choose refuse, drain or revoke")


@dataclass(frozen=True)
class Move:
    """One slice moving: node, slice id, GPU index on that node, fraction, and whether it is leased."""

    node: str
    slice_id: str
    gpu_index: int
    fraction: float
    leased: bool = False
    #: the department it moves from (set for --from any; else the request's --from)
    owner: str = ""

    def to_json(self) -> dict[str, Any]:
        d = {"node": self.node, "slice_id": self.slice_id, "gpu_index": self.gpu_index,
             "fraction": self.fraction, "leased": self.leased}
        if self.owner:
            d["from"] = self.owner
        return d


@dataclass
class Plan:
    """The moves chosen for a request, and why anything asked for could not be planned.

    moves: the slices that will move. already: moves recorded on nodes by an earlier run of the
    same request id (they count toward the amount asked for). shortfall: a sentence when fewer
    slices than asked could be found (then nothing is executed). skipped: per node, why a node's
    slices were not considered (unreachable, GPU errors). unsettled: per node, why it could not be
    asked whether it recorded the request id (it may hold moves of an earlier run).
    """

    request: ReassignRequest
    moves: list[Move] = field(default_factory=list)
    already: list[Move] = field(default_factory=list)
    shortfall: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    unsettled: dict[str, str] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    replay_complete: bool = False
    #: exit code when nothing could be planned: NOTHING_TO_DO (too few idle slices), CONFLICT
    #: (a named slice is leased or owned by another department; before NOTHING_TO_DO for a slice id
    #: that is nowhere), UNREACHABLE (a named slice is not on the nodes that answered while some did not)
    shortfall_code: ExitCode = ExitCode.NOTHING_TO_DO

    @property
    def gpu_equivalents(self) -> float:
        return sum(m.fraction for m in self.moves)


@dataclass
class ReassignResult:
    """What happened: moved (done on the node), pending (drain: moves when the lease ends),
    already (done by an earlier run of this request id), failed (node -> (moves, error): the node
    answered with a refusal, so they did not move), unknown (node -> (moves, error): no answer, so
    they may or may not have moved; a re-run with the same request id settles it)."""

    request_id: str
    plan: Plan
    moved: list[Move] = field(default_factory=list)
    pending: list[Move] = field(default_factory=list)
    failed: dict[str, tuple[list[Move], NodeError]] = field(default_factory=dict)
    unknown: dict[str, tuple[list[Move], NodeError]] = field(default_factory=dict)

    @property
    def exit_code(self) -> ExitCode:
        """OK when all planned moves are done (or nothing was left to do by a replay);
        the plan's shortfall code when nothing could be planned; PARTIAL when some nodes failed or
        did not answer after others moved; UNREACHABLE when no node moved and one did not answer
        (outcome unknown); CONFLICT when every node refused."""
        if not self.plan.moves:
            return ExitCode.OK if self.plan.replay_complete else self.plan.shortfall_code
        if self.failed or self.unknown:
            if self.moved or self.pending:
                return ExitCode.PARTIAL
            if self.unknown or all(not e.reachable for _, e in self.failed.values()):
                return ExitCode.UNREACHABLE
            return ExitCode.CONFLICT
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        req = self.plan.request
        return {
            "request_id": self.request_id,
            "from": req.src,
            "to": req.dst,
            "dry_run": req.dry_run,
            "planned": [m.to_json() for m in self.plan.moves],
            "moved": [m.to_json() for m in self.moved],
            "pending": [m.to_json() for m in self.pending],
            "already": [m.to_json() for m in self.plan.already],
            "failed": [{"node": node, "slice_ids": [m.slice_id for m in moves],
                        "code": err.code, "error": str(err)}
                       for node, (moves, err) in self.failed.items()],
            "unknown": [{"node": node, "slice_ids": [m.slice_id for m in moves],
                         "code": err.code, "error": str(err)}
                        for node, (moves, err) in self.unknown.items()],
            "shortfall": self.plan.shortfall,
            "skipped": self.plan.skipped,
            "unsettled": self.plan.unsettled,
        }


def _gpu_usable(gpu: GpuStatus) -> str | None:
    """Why a GPU's slices must not be treated as idle, or None when they may (nvml-02, nvml-03)."""
    s = gpu.sample
    if s is None:
        return "no telemetry yet"
    if s.error:
        return s.error
    if s.processes_error:
        return s.processes_error
    return None


def candidates(snapshot: FleetSnapshot, req: ReassignRequest) -> tuple[list[Move], dict[str, str]]:
    """Slices of req.src that may move, best first, and per node why it was skipped.

    Order: whole GPUs first (larger fractions first), then nodes holding the most candidates
    (so the fewest nodes are touched), then GPU index and slice id. Leased slices are
    candidates only in drain/revoke mode, after every idle one. Slices with a pending move,
    GPUs in error and nodes that are unreachable or whose backend failed are never candidates.
    """
    skipped: dict[str, str] = {}
    per_node: dict[str, list[tuple[GpuStatus, Slice]]] = {}
    for node in snapshot.nodes:
        if req.node and node.name != req.node:
            continue
        if not node.reachable or node.error:
            skipped[node.name] = node.error or "unreachable"
            continue
        for gpu in node.gpus:
            why = _gpu_usable(gpu)
            # a slice waiting to drain may still be revoked (the admin chose to end the lease now)
            owned = [s for s in gpu.slices if _gives(req, s.department)
                     and (s.pending is None or (req.leased == "revoke" and s.leased))]
            if why:
                if owned:
                    skipped[f"{node.name} GPU {gpu.identity.index}"] = why
                continue
            for s in owned:
                if s.leased and req.leased == "refuse":
                    continue
                per_node.setdefault(node.name, []).append((gpu, s))
    rank = {name: i for i, name in enumerate(sorted(per_node, key=lambda n: (-len(per_node[n]), n)))}
    moves = [Move(node, s.id, g.identity.index, s.fraction, s.leased, s.department if req.src == ANY else "")
             for node, items in per_node.items() for g, s in items]
    order = _least_important_first(req)
    moves.sort(key=lambda m: (m.leased, order(m.owner), -m.fraction, rank[m.node], m.gpu_index, m.slice_id))
    return moves, skipped


def _gives(req: ReassignRequest, department: str) -> bool:
    """True when a slice owned by `department` may be taken by `req`."""
    if req.src == ANY:
        return department != req.dst
    return department == req.src


def _least_important_first(req: ReassignRequest) -> Any:
    """Sort key of an owner for --from any: unassigned first, then the largest priority number
    (least important) first; unknown departments (not in the config) before known ones."""
    prio = req.priorities or {}

    def key(owner: str) -> tuple[int, int, str]:
        if req.src != ANY or owner == UNASSIGNED:
            return (0, 0, owner)
        return (1, -prio.get(owner, 1 << 30), owner)

    return key


def plan(snapshot: FleetSnapshot, req: ReassignRequest, already: list[Move] | None = None,
         exclude_nodes: set[str] | None = None) -> Plan:
    """Choose the moves for `req` on `snapshot` (no I/O).

    already: moves an earlier run of the same request id made (they count toward the amount).
    exclude_nodes: nodes that already applied this request id (a node applies a request once).
    """
    p = Plan(request=req, already=list(already or []))
    cands, p.skipped = candidates(snapshot, req)
    if exclude_nodes:
        cands = [m for m in cands if m.node not in exclude_nodes]
    leased_note = ""
    if req.leased == "refuse":
        n_leased = sum(1 for n in snapshot.nodes for s in n.slices()
                       if _gives(req, s.department) and s.leased and (not req.node or n.name == req.node))
        if n_leased:
            leased_note = f" ({n_leased} leased: use --drain or --revoke)"
    if req.slice_ids is not None:
        by_id = {m.slice_id: m for m in cands}
        done_ids = {m.slice_id for m in p.already}
        missing = [sid for sid in req.slice_ids if sid not in by_id and sid not in done_ids]
        if missing:
            owners = {s.id: (n.name, s) for n in snapshot.nodes for s in n.slices()}
            reasons = []
            codes = set()
            for sid in missing:
                if sid not in owners:
                    down = sorted(n.name for n in snapshot.nodes if not n.reachable)
                    if down:  # it may be a slice of a node that did not answer
                        reasons.append(f"{sid}: not found on the nodes that answered (unreachable: "
                                       f"{', '.join(down)})")
                        codes.add(ExitCode.UNREACHABLE)
                    else:
                        reasons.append(f"{sid}: no such slice in the fleet")
                        codes.add(ExitCode.NOTHING_TO_DO)
                    continue
                codes.add(ExitCode.CONFLICT)
                _, s = owners[sid]
                if s.department != req.src:
                    reasons.append(f"{sid}: owned by {s.department}, not {req.src}")
                elif s.pending is not None:
                    reasons.append(f"{sid}: already waiting to move to {s.pending.get('to')} when lease "
                                   f"{s.lease_id} ends (use --revoke to move it now)")
                elif s.leased:
                    reasons.append(f"{sid}: leased by {s.lease_id} (use --drain or --revoke)")
                else:
                    reasons.append(f"{sid}: not movable now (GPU error or pending move)")
            p.shortfall = "; ".join(reasons)
            # a node that did not answer may hold it, else a slice in the way, else nothing matched
            p.shortfall_code = next(c for c in (ExitCode.UNREACHABLE, ExitCode.CONFLICT, ExitCode.NOTHING_TO_DO)
                                    if c in codes)
            return p
        p.moves = [by_id[sid] for sid in req.slice_ids if sid in by_id]
        p.replay_complete = not p.moves
        return p
    if req.count is not None:
        want = req.count - len(p.already)
        if want <= 0:
            p.replay_complete = True
            return p
        if len(cands) < want:
            p.shortfall = (f"only {len(cands)} free slice(s) of {req.src} can move, {want} asked"
                           f"{leased_note}")
            return p
        p.moves = cands[:want]
        return p
    assert req.gpus is not None
    want_g = req.gpus - sum(m.fraction for m in p.already)
    if want_g <= _EPS:
        p.replay_complete = True
        return p
    chosen, left = [], want_g
    for m in cands:
        if m.fraction <= left + _EPS:
            chosen.append(m)
            left -= m.fraction
            if left <= _EPS:
                break
    if left > _EPS:
        have = sum(m.fraction for m in cands)
        p.shortfall = (f"cannot make {want_g:g} GPU-equivalents from the free slices of {req.src} "
                       f"({have:g} available in fractions that do not add up){leased_note}")
        return p
    p.moves = chosen
    return p


def new_request_id() -> str:
    """A fresh request id: "r-" + 12 hex digits."""
    return "r-" + uuidlib.uuid4().hex[:12]


def recorded_moves(fleet: FleetClient, snapshot: FleetSnapshot, req: ReassignRequest,
                   unasked: dict[str, str] | None = None) -> tuple[list[Move], set[str]]:
    """Moves already made under req.request_id on reachable nodes, and the nodes that made them.

    unasked: filled with node -> reason for every node of the snapshot that could not be asked
    (unreachable in the snapshot, or no answer to GET /v1/requests/ID): such a node may hold moves
    of an earlier run. Raises ReassignError when a node recorded that request id for something else (another kind
    of request, or moves between other departments): a request id names one request, and a re-run
    must ask for the same thing.
    """
    request_id = req.request_id or ""
    reachable = [n.name for n in snapshot.nodes if n.reachable]
    res = fleet.fan_out(lambda c: c.request_result(request_id), reachable)
    if unasked is not None:
        for n in snapshot.nodes:
            if not n.reachable:
                unasked[n.name] = n.error or "unreachable"
        for name, err in res.errors.items():
            unasked[name] = str(err)
    moves: list[Move] = []
    nodes: set[str] = set()
    for name, answer in sorted(res.values.items()):
        if not answer:
            continue
        if "moved" not in answer:
            raise ReassignError(f"--request-id {request_id}: node {name} recorded it for another kind of "
                                f"request; use a new request id")
        for m in answer.get("moves") or []:
            if m.get("to") != req.dst or (req.src != ANY and m.get("from") != req.src):
                raise ReassignError(
                    f"--request-id {request_id}: already used on node {name} to move slices "
                    f"{m.get('from')} -> {m.get('to')}, not {req.src} -> {req.dst}; use a new request id")
        nodes.add(name)
        node = snapshot.node(name)
        index = {s.id: (g.identity.index, s.fraction) for g in (node.gpus if node else []) for s in g.slices}
        origin = {m.get("slice_id"): m.get("from", "") for m in answer.get("moves") or []}
        for sid in list(answer.get("moved", [])) + list(answer.get("pending", [])):
            gi, frac = index.get(sid, (-1, 0.0))
            moves.append(Move(name, sid, gi, frac, owner=origin.get(sid, "") if req.src == ANY else ""))
    return moves, nodes


def prepare(fleet: FleetClient, req: ReassignRequest, snapshot: FleetSnapshot | None = None) -> Plan:
    """Snapshot the fleet (unless given), account for an earlier run of the request id, and plan.

    Raises ReassignError for an invalid request (nothing is contacted then).
    """
    req.validate([d.name for d in fleet.departments])
    if req.node and req.node not in fleet.clients:
        raise ReassignError(f"--node: unknown node {req.node!r}")
    if req.priorities is None:
        req.priorities = {d.name: d.priority for d in fleet.departments}
    given_id = req.request_id is not None
    if req.request_id is None:
        req.request_id = new_request_id()
    snap = snapshot or fleet.snapshot([req.node] if req.node else None)
    unasked: dict[str, str] = {}
    already, done_nodes = recorded_moves(fleet, snap, req, unasked)
    p = plan(snap, req, already, done_nodes)
    p.generations = {n.name: n.generation for n in snap.nodes}
    if given_id and req.slice_ids is None and unasked and not p.replay_complete:
        # a fresh id is on no node; a given one may be on a node we cannot ask, and planning the
        # rest of the count elsewhere could then move more than asked (a named slice cannot move twice)
        p.unsettled = unasked
        p.moves = []
        p.shortfall = (f"request {req.request_id} may already be recorded on {', '.join(sorted(unasked))}, which "
                       f"could not be asked ({'; '.join(unasked[n] for n in sorted(unasked))}); moving the rest "
                       f"elsewhere now could move more than asked: run it again when "
                       f"{'it answers' if len(unasked) == 1 else 'they answer'}")
        p.shortfall_code = ExitCode.UNREACHABLE
    down = sorted(n.name for n in snap.nodes if not n.reachable)
    if p.shortfall and p.shortfall_code == ExitCode.NOTHING_TO_DO and down:
        # too few where we could look: a node we could not reach may hold what is missing
        p.shortfall += f"; not counted: the slices of unreachable node(s) {', '.join(down)}"
        p.shortfall_code = ExitCode.UNREACHABLE
    return p


def execute(fleet: FleetClient, p: Plan) -> ReassignResult:
    """Send the plan's moves, one POST /v1/assign per node, in parallel, quoting each node's
    generation from the snapshot the plan was made on and a deadline. Never raises for node
    failures: a refusal is in `result.failed` with the daemon's reason (stale generation, leased,
    deadline passed); no answer (timeout, connection lost) is in `result.unknown`."""
    req = p.request
    assert req.request_id
    result = ReassignResult(request_id=req.request_id, plan=p)
    if req.dry_run or not p.moves:
        return result
    by_node: dict[str, list[Move]] = {}
    for m in p.moves:
        by_node.setdefault(m.node, []).append(m)
    generations = p.generations
    # each node's deadline: no later than fan_out gives up on it (its timeout_s + 1 s from now)
    now = time.time()
    deadlines = {name: now + fleet.clients[name].node.timeout_s for name in by_node}

    def send(client: NodeClient) -> dict[str, Any]:
        moves = by_node[client.name]
        return client.assign(
            request_id=req.request_id or "", generation=generations.get(client.name, 0),
            moves=[{"slice_id": m.slice_id, "from": m.owner or req.src, "to": req.dst} for m in moves],
            leased=req.leased, deadline_unix_s=deadlines[client.name])

    res = fleet.fan_out(send, list(by_node))
    for name, moves in by_node.items():
        if name in res.values:
            answer = res.values[name]
            pending = set(answer.get("pending", []))
            for m in moves:
                (result.pending if m.slice_id in pending else result.moved).append(m)
        elif res.errors[name].reachable:
            result.failed[name] = (moves, res.errors[name])
        else:  # no answer: the node may have applied it before the answer was lost
            result.unknown[name] = (moves, res.errors[name])
    return result


def reassign(fleet: FleetClient, req: ReassignRequest) -> ReassignResult:
    """prepare + execute in one call (the console's path; the CLI confirms in between)."""
    return execute(fleet, prepare(fleet, req))
