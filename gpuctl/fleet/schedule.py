"""The schedule and audit services: one path for `gpuctl schedule`/`gpuctl audit` and the console.

Headless (never imports textual); every function blocks on the network (call it from a worker
thread in the console). ``fleet`` is a gpuctl.fleet.client.FleetClient (or anything with
``departments``, ``snapshot`` and ``fan_out``).

- :func:`prepare` + :func:`install`: plan concrete slice moves for a :class:`ScheduleRequest` on a
  fleet snapshot (as reassign does; slices already scheduled to leave the same department are not
  planned twice; entries already installed under the request id count toward the amount) and
  install each node's part in its gpuctld.
- :func:`entries`, :func:`cancel`: every node's entries; cancel one entry id on every node.
- :func:`audit_records`: every node's audit records merged (oldest first), filtered.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from gpuctl.exit_codes import ExitCode
from gpuctl.fleet.reassign import Move, ReassignError, ReassignRequest, new_request_id, plan

#: The slice owner used to hide slices already scheduled to leave (never a department name).
_SCHEDULED = "\x00scheduled"


class ScheduleError(Exception):
    """A schedule request that cannot be planned or installed; ``exit_code``: gpuctl's exit status.
    Nothing was installed."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class ScheduleRequest:
    """What to schedule: at ``at_s`` (Unix s) move from ``src`` to ``dst`` exactly one of count /
    gpus / slice_ids, optionally on one node; leased: refuse | drain | revoke (with ``grace_s``);
    ``relative``: the time was given relative to now (a re-run with the same request id keeps the
    first run's time)."""

    at_s: float
    src: str
    dst: str
    count: int | None = None
    gpus: float | None = None
    slice_ids: list[str] | None = None
    node: str | None = None
    leased: str = "refuse"
    grace_s: float = 0.0
    request_id: str | None = None
    relative: bool = False
    dry_run: bool = False


@dataclass
class SchedulePlan:
    """The planned moves (per node), those already installed, and the time they run at."""

    request: ScheduleRequest
    request_id: str
    at_s: float
    moves: list[Move] = field(default_factory=list)
    already: list[Move] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def by_node(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for m in self.moves:
            out.setdefault(m.node, []).append(m.slice_id)
        return out

    @property
    def gpu_equivalents(self) -> float:
        return sum(m.fraction for m in self.moves)


@dataclass
class ScheduleResult:
    """Per node: ``{"slice_ids", "status": installed|replayed|failed, "entry_id"?, "code"?, "error"?}``."""

    plan: SchedulePlan
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, Any] = field(default_factory=dict)

    @property
    def entry_id(self) -> str | None:
        return next((v["entry_id"] for v in self.nodes.values() if v.get("entry_id")), None)

    @property
    def exit_code(self) -> ExitCode:
        """OK, PARTIAL (some nodes failed), UNREACHABLE (every node unreachable), CONFLICT."""
        if not self.failed:
            return ExitCode.OK
        if len(self.failed) < len(self.plan.by_node):
            return ExitCode.PARTIAL
        return ExitCode.UNREACHABLE if all(not e.reachable for e in self.failed.values()) else ExitCode.CONFLICT

    def to_json(self) -> dict[str, Any]:
        p, req = self.plan, self.plan.request
        doc = {"request_id": p.request_id, "at_s": p.at_s, "from": req.src, "to": req.dst, "leased": req.leased,
               "grace_s": req.grace_s, "dry_run": req.dry_run, "planned": [m.to_json() for m in p.moves],
               "already": [m.to_json() for m in p.already], "nodes": self.nodes}
        if self.entry_id:
            doc["entry_id"] = self.entry_id
        return doc


def _fraction(snap: Any, node: str, sid: str) -> float:
    n = snap.node(node)
    for s in (n.slices() if n else []):
        if s.id == sid:
            return s.fraction
    return 0.0


def prepare(fleet: Any, req: ScheduleRequest) -> SchedulePlan:
    """Plan `req` on a fresh snapshot. Raises ReassignError (bad department, amount, request id:
    exit USAGE) and ScheduleError (request id used for another schedule: CONFLICT; too few
    slices: NOTHING_TO_DO / CONFLICT / USAGE as reassign)."""
    rreq = ReassignRequest(src=req.src, dst=req.dst, count=req.count, gpus=req.gpus, slice_ids=req.slice_ids,
                           node=req.node, leased=req.leased, request_id=req.request_id, dry_run=req.dry_run)
    rreq.validate([d.name for d in fleet.departments])
    if req.src == "any":
        raise ReassignError("--from any is for reassign now; a schedule names the department giving slices")
    rid = req.request_id or new_request_id()
    rreq.request_id = rid
    snap = fleet.snapshot([req.node] if req.node else None)
    listing = fleet.fan_out(lambda c: c.schedule(), [n.name for n in snap.nodes if n.reachable])
    at_s = req.at_s
    hidden: set[tuple[str, str]] = set()
    already: list[Move] = []
    done_nodes: set[str] = set()
    for node, doc in listing.values.items():
        for e in doc.get("entries", []):
            if e.get("request_id") == rid:
                other_time = not req.relative and abs(float(e.get("at_s", 0)) - at_s) > 1
                if (e.get("from"), e.get("to")) != (req.src, req.dst) or other_time:
                    raise ScheduleError(f"--request-id {rid}: node {node} holds it for {e.get('from')} -> "
                                        f"{e.get('to')} at another time; use a new request id", ExitCode.CONFLICT)
                at_s = float(e["at_s"])  # a re-run of a relative time keeps the first time
                done_nodes.add(node)
                already += [Move(node, sid, -1, _fraction(snap, node, sid)) for sid in e.get("slice_ids", [])]
            elif e.get("status") in ("planned", "waiting") and e.get("from") == req.src:
                hidden.update((node, sid) for sid in e.get("slice_ids", []))
    view = copy.deepcopy(snap)
    for n in view.nodes:
        for g in n.gpus:
            for s in g.slices:
                if (n.name, s.id) in hidden:
                    s.department = _SCHEDULED
    p = plan(view, rreq, already, done_nodes)
    if p.shortfall:
        skipped = "".join(f"; skipped {k}: {why}" for k, why in p.skipped.items())
        raise ScheduleError(f"nothing scheduled: {p.shortfall}{skipped}", p.shortfall_code)
    return SchedulePlan(req, rid, at_s, p.moves, already, p.skipped)


def install(fleet: Any, sp: SchedulePlan) -> ScheduleResult:
    """Install each node's part (POST /v1/schedule, in parallel). Never raises for node failures:
    they are in ``result.failed`` (node -> NodeError) and ``result.nodes``."""
    result = ScheduleResult(sp)
    req, by_node = sp.request, sp.by_node
    if req.dry_run or not by_node:
        return result

    def send(client: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"request_id": sp.request_id, "at_s": sp.at_s, "from": req.src, "to": req.dst,
                                "slice_ids": by_node[client.name], "leased": req.leased}
        if req.grace_s:
            body["grace_s"] = req.grace_s
        return client.schedule_add(body)

    res = fleet.fan_out(send, list(by_node))
    for node, sids in by_node.items():
        if node in res.values:
            answer = res.values[node]
            result.nodes[node] = {"slice_ids": sids, "entry_id": answer["entry"]["id"],
                                  "status": "replayed" if answer.get("replayed") else "installed"}
        else:
            err = res.errors[node]
            result.failed[node] = err
            result.nodes[node] = {"slice_ids": sids, "status": "failed", "code": err.code, "error": str(err)}
    return result


def entries(fleet: Any, node: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every node's schedule entries (each with ``"node"``), by time; and node -> NodeError."""
    res = fleet.fan_out(lambda c: c.schedule(), [node] if node else None)
    out = [{"node": name, **e} for name, doc in res.values.items() for e in doc.get("entries", [])]
    out.sort(key=lambda e: (e["at_s"], e["id"], e["node"]))
    return out, dict(res.errors)


def cancel(fleet: Any, entry_id: str) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Cancel `entry_id` on every node: (nodes that cancelled it, node -> refusal NodeError,
    node -> unreachable NodeError). Nodes without the entry are in none of them."""
    res = fleet.fan_out(lambda c: c.schedule_cancel(entry_id))
    cancelled = sorted(n for n, v in res.values.items() if v)
    refused = {n: e for n, e in res.errors.items() if e.reachable}
    unreachable = {n: e for n, e in res.errors.items() if not e.reachable}
    return cancelled, refused, unreachable


@dataclass
class AuditView:
    """Merged audit records (oldest first, each with ``node_name``), unreadable lines (each with
    ``node``), node -> NodeError for nodes not read, nodes that sent only their newest records,
    and node -> unreadable lines a node counted but did not send (past its 100 problems)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, Any] = field(default_factory=dict)
    truncated: list[str] = field(default_factory=list)
    problems_omitted: dict[str, int] = field(default_factory=dict)


def mentions(record: dict[str, Any], dept: str) -> bool:
    """True when a record moved slices from or to `dept`, or granted/ended one of its leases."""
    for key in ("moved", "pending"):
        for m in record.get(key) or []:
            if isinstance(m, dict) and dept in (m.get("from"), m.get("to")):
                return True
    for key in ("leases_added", "leases_ended"):
        for lease in record.get(key) or []:
            if isinstance(lease, dict) and lease.get("department") == dept:
                return True
    return any(isinstance(s, dict) and s.get("to") == dept for s in record.get("slices_created") or [])


def filter_dept(records: list[dict[str, Any]], dept: str) -> list[dict[str, Any]]:
    """Records that mention `dept`, with the begin/end records of the same operation."""
    ops = {(r.get("node_name"), r.get("op")) for r in records if r.get("op") and mentions(r, dept)}
    return [r for r in records if mentions(r, dept) or (r.get("op") and (r.get("node_name"), r.get("op")) in ops)]


def audit_records(fleet: Any, since_s: float | None = None, dept: str | None = None,
                  node: str | None = None, limit: int | None = None) -> AuditView:
    """GET /v1/audit of every node (or one; each node's newest `limit` records when given),
    merged by time, filtered by department (after the limit: a node's newest records)."""
    res = fleet.fan_out(lambda c: c.audit(since_s, limit), [node] if node else None)
    view = AuditView(errors=dict(res.errors))
    for name, doc in res.values.items():
        view.records += [{**r, "node_name": name} for r in doc.get("records", [])]
        view.problems += [{"node": name, **p} for p in doc.get("problems", [])]
        if doc.get("truncated"):
            view.truncated.append(name)
        if doc.get("problems_omitted"):
            view.problems_omitted[name] = int(doc["problems_omitted"])
    view.records.sort(key=lambda r: (r.get("time_s") or 0, r.get("node_name")))
    if dept:
        view.records = filter_dept(view.records, dept)
    return view


def entry_note(e: dict[str, Any]) -> str:
    """Words for an entry's state beyond its status: failure reason, how late, what waits."""
    from gpuctl.timeparse import show_local

    parts = []
    if e.get("reason"):
        parts.append(e["reason"])
    if e.get("late_s"):
        parts.append(f"ran {e['late_s']:.0f} s late")
    if e.get("pending"):
        parts.append(f"{len(e['pending'])} slice(s) wait for their lease to end")
    if e.get("revoke_at_s") and e.get("status") == "waiting":
        parts.append(f"leases revoked at {show_local(e['revoke_at_s'])}")
    if e.get("plan"):
        parts.append(f"plan {e['plan']}" + (f" ({e['label']})" if e.get("label") else ""))
    return "; ".join(parts)


def who_text(who: Any) -> str:
    """``ssh_user (reported user@host)`` or ``gpuctld:<job>`` for internal changes."""
    if not isinstance(who, dict):
        return "?"
    if "internal" in who:
        by = who.get("scheduled_by")
        extra = f" for {who_text(by)}" if isinstance(by, dict) else ""
        return f"gpuctld:{who['internal']}{extra}"
    user = who.get("ssh_user") or f"uid {who.get('peer_uid')}"
    rep = who.get("reported")
    return f"{user} ({rep})" if rep else str(user)


def what_text(r: dict[str, Any]) -> str:
    """What a record says happened, in a few words."""
    parts = []
    moved = r.get("moved") or []
    if moved and isinstance(moved[0], dict):
        pairs: dict[tuple[str, str], int] = {}
        for m in moved:
            pairs[(m.get("from"), m.get("to"))] = pairs.get((m.get("from"), m.get("to")), 0) + 1
        parts += [f"{n} slice(s) {a} -> {b}" for (a, b), n in pairs.items()]
    if r.get("moved_slice_ids"):
        parts.append(f"{len(r['moved_slice_ids'])} slice(s) moved")
    for key, word in (("pending", "waiting to drain"), ("leases_added", "lease(s) granted"),
                      ("leases_ended", "lease(s) ended"), ("split", "GPU(s) split"),
                      ("slices_created", "slice(s) created")):
        if r.get(key):
            parts.append(f"{len(r[key])} {word}")
    if r.get("phase") == "begin":
        parts.append("started")
    if r.get("error"):
        parts.append(f"{r['error'].get('code')}: {r['error'].get('message')}")
    if r.get("reason"):
        parts.append(str(r["reason"]))
    if r.get("note"):
        parts.append(str(r["note"]))
    return "; ".join(parts)


def parse_amount(text: str) -> dict[str, Any]:
    """A console form's amount: ``"3"`` -> ``{"count": 3}``, ``"1.5"`` or ``"2g"`` -> ``{"gpus": x}``.
    Raises ScheduleError (USAGE) naming the text."""
    t = text.strip().lower()
    try:
        if t.endswith("g"):
            return {"gpus": float(t[:-1])}
        if "." in t:
            return {"gpus": float(t)}
        return {"count": int(t)}
    except ValueError:
        raise ScheduleError(f"amount {text!r}: a number of slices (3) or GPU-equivalents (1.5 or 2g)",
                            ExitCode.USAGE) from None


class FleetSchedule:
    """The console's schedule and audit source over a FleetClient (every method blocks: call it
    from a worker thread). Same services as the CLI."""

    def __init__(self, fleet: Any):
        self.fleet = fleet

    @property
    def departments(self) -> list[str]:
        return [d.name for d in self.fleet.departments]

    def entries(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every node's entries and node -> error."""
        return entries(self.fleet)

    def add(self, at_text: str, src: str, dst: str, amount: str, now_s: float) -> ScheduleResult:
        """Plan and install a schedule from the form's texts. Raises ScheduleError (bad time or
        amount: USAGE; planning refused) and ReassignError (bad department)."""
        from gpuctl.timeparse import TimeError, parse_time, show_local

        try:
            at_s = parse_time(at_text, now_s)
        except TimeError as e:
            raise ScheduleError(f"time: {e}", ExitCode.USAGE) from None
        if at_s <= now_s:
            raise ScheduleError(f"time: {show_local(at_s)} is in the past", ExitCode.USAGE)
        req = ScheduleRequest(at_s=at_s, src=src.strip(), dst=dst.strip(), relative=at_text.strip().startswith("+"),
                              **parse_amount(amount))
        return install(self.fleet, prepare(self.fleet, req))

    def cancel(self, entry_id: str) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        """Cancel an entry on every node (see :func:`cancel`)."""
        return cancel(self.fleet, entry_id)

    def audit(self, since_s: float | None = None) -> AuditView:
        """Every node's audit records (see :func:`audit_records`)."""
        return audit_records(self.fleet, since_s)
