"""Multi-node native jobs: `gpuctl run --native --gpus N [--per-node K] [--nodes A,B] -- CMD`.

A job holds N whole GPUs of one department on one or more nodes and runs CMD once per node, with
the environment ``torchrun`` (torch.distributed) reads for a static rendezvous. gpuctl's part is
the allocation, the launch and the clean-up; the distributed engine is the program's.

- Placement (:func:`place`): the same number of GPUs on every node (torchrun starts
  NPROC_PER_NODE ranks on each); the fewest nodes first; then, on each node, the idle whole GPUs
  of the department whose slowest pairwise link is fastest (gpuctl.model.GPU_LINKS: NVLink before
  PCIe, from the node's NVML topology; a node that reports no links, e.g. simulated, gets its
  lowest GPU indices). Nodes tie-break in fleet-config order; the first chosen node is rank 0.
  Only whole GPUs (a slice of fraction 1 that is not a MIG device) are placed: fractional slices
  are refused for multi-GPU jobs (:data:`WHOLE_GPUS_ONLY`).
- Leases (:func:`acquire_all`): one native lease per node holding that node's GPUs (explicit
  ``slice_ids``: gpuctl.daemon.leases allows several whole GPUs in one native lease),
  all-or-nothing: when a node refuses, the leases already granted are released before the error.
- Launch (:class:`Job`): CMD on every node (gpuctl.fleet.native_run.start_native: a local child,
  or an SSH exec channel) with the lease's env (CUDA_VISIBLE_DEVICES = that node's GPU UUIDs,
  comma-separated) and :func:`rendezvous_env`; every line of output is prefixed ``[node] ``; each
  lease is heartbeated every ttl/3; signals are forwarded to every node; when a node's part ends
  its lease is released; when one fails (non-zero status, lost connection, lease revoked or
  ended) the others get SIGTERM (SIGKILL after the grace) and the first failure's status is the
  job's; every lease is released on every path (:meth:`Job.close`).
"""

from __future__ import annotations

import itertools
import math
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

from gpuctl.fleet.client import NodeError
from gpuctl.model import GPU_LINKS

#: The refusal of a fractional amount (or --slices) for a multi-GPU job.
WHOLE_GPUS_ONLY = ("a multi-GPU job takes whole GPUs (one native lease per node, torchrun ranks per GPU): "
                   "give --gpus a whole number; fractional slices are for single-GPU runs (--gpus <= 1)")
#: Most GPU combinations tried exactly on one node; above it the choice is greedy.
MAX_COMBINATIONS = 20000
#: Rank of a link the node does not report (after every GPU_LINKS name).
_UNKNOWN_LINK_RANK = len(GPU_LINKS)
#: Seconds between two looks at the nodes' programs.
POLL_S = 0.05


class JobError(Exception):
    """A job cannot be placed, leased or started: `message`; `code` is a node error code
    ("insufficient_slices", "unreachable", "invalid_request" or the refusing daemon's)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class NodePart:
    """One node's part of a job: its rank, GPUs (UUIDs and NVML indices, in the order CUDA sees
    them), the whole-GPU slices leased for them, and `link`, the slowest link between the chosen
    GPUs (a gpuctl.model.GPU_LINKS name; None for one GPU or where the node reports no links)."""

    node: str
    rank: int
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    slice_ids: tuple[str, ...]
    link: str | None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "node_rank": self.rank, "gpu_uuids": list(self.gpu_uuids),
                "gpu_indices": list(self.gpu_indices), "slice_ids": list(self.slice_ids), "link": self.link}


@dataclass(frozen=True)
class Placement:
    """Where a job runs: `parts` (rank order), `per_node` GPUs on each, of department `dept`."""

    dept: str
    per_node: int
    parts: tuple[NodePart, ...]

    @property
    def gpus(self) -> int:
        return self.per_node * len(self.parts)

    def to_json(self) -> dict[str, Any]:
        return {"department": self.dept, "gpus": self.gpus, "nnodes": len(self.parts),
                "nproc_per_node": self.per_node, "nodes": [p.to_json() for p in self.parts]}

    def describe(self) -> list[str]:
        """Lines for stderr / --dry-run: one per node."""
        lines = [f"placement: {self.gpus} GPU(s) of {self.dept} on {len(self.parts)} node(s), "
                 f"{self.per_node} per node"]
        for p in self.parts:
            link = f", linked by {p.link}" if p.link else (", links not reported" if len(p.gpu_uuids) > 1 else "")
            lines.append(f"  rank {p.rank} {p.node}: GPU {', '.join(map(str, p.gpu_indices))} "
                         f"({', '.join(p.gpu_uuids)}){link}")
        return lines


# --------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class _Gpu:
    uuid: str
    index: int
    slice_id: str
    links: dict[str, str]


def whole_gpus(node: Any, dept: str) -> list[_Gpu]:
    """The idle whole GPUs of `dept` on one gpuctl.model.NodeStatus (a slice of fraction 1, not
    MIG, leasable, whose GPU the backend reports), in NVML index order."""
    from gpuctl.leasing import FRACTION_EPS, idle_slices

    idents = {g.identity.uuid: g.identity for g in node.gpus if g.identity.index >= 0}
    out = []
    for s in idle_slices(node.slices(), dept, set(idents)):
        if s.fraction >= 1 - FRACTION_EPS and not s.mig:
            ident = idents[s.gpu_uuid]
            out.append(_Gpu(s.gpu_uuid, ident.index, s.id, dict(ident.peer_links or {})))
    return sorted(out, key=lambda g: g.index)


def _link_rank(a: _Gpu, b: _Gpu) -> int:
    link = a.links.get(b.uuid) or b.links.get(a.uuid)
    return GPU_LINKS.index(link) if link in GPU_LINKS else _UNKNOWN_LINK_RANK


def _key(group: tuple[_Gpu, ...]) -> tuple[int, int, tuple[int, ...]]:
    ranks = [_link_rank(a, b) for a, b in itertools.combinations(group, 2)]
    return (max(ranks, default=0), sum(ranks), tuple(g.index for g in group))


def pick_gpus(gpus: list[_Gpu], k: int) -> tuple[tuple[_Gpu, ...], int]:
    """The `k` GPUs of one node whose slowest pairwise link is fastest (then the fastest links in
    sum, then the lowest indices); returns (GPUs in index order, slowest link's rank in GPU_LINKS,
    len(GPU_LINKS) when unknown, 0 for one GPU). Exact up to MAX_COMBINATIONS, else greedy."""
    if k > len(gpus) or k < 1:
        raise ValueError(f"cannot pick {k} of {len(gpus)} GPUs")
    if math.comb(len(gpus), k) <= MAX_COMBINATIONS:
        best = min(itertools.combinations(gpus, k), key=_key)
    else:
        cands = []
        for seed in gpus:
            group = [seed]
            while len(group) < k:
                rest = [g for g in gpus if g not in group]
                group.append(min(rest, key=lambda g: (max(_link_rank(g, h) for h in group), g.index)))
            cands.append(tuple(sorted(group, key=lambda g: g.index)))
        best = min(cands, key=_key)
    return best, _key(best)[0]


def place(snapshot: Any, dept: str, gpus: int, *, per_node: int | None = None,
          nodes: list[str] | None = None) -> Placement:
    """Place a job of `gpus` whole GPUs of `dept` on a gpuctl.model.FleetSnapshot (see the module
    docstring). per_node: GPUs on each node (default: the fewest nodes that can hold the job).
    nodes: exactly these nodes, in this order (the first is rank 0).

    Raises JobError: "invalid_request" (the amount does not divide evenly, or a named node is not
    in the fleet), "insufficient_slices" (no set of nodes has the idle whole GPUs; the message
    lists each node's), "unreachable" (the same, when some nodes could not be asked).
    """
    if gpus < 1:
        raise JobError(f"--gpus must be at least 1, got {gpus}", "invalid_request")
    by_name = {n.name: n for n in snapshot.nodes}
    order = {n.name: i for i, n in enumerate(snapshot.nodes)}
    if nodes:
        unknown = [n for n in nodes if n not in by_name]
        if unknown:
            raise JobError(f"--nodes: unknown node(s) {', '.join(unknown)} (known: {', '.join(by_name)})",
                           "invalid_request")
        if len(set(nodes)) != len(nodes):
            raise JobError(f"--nodes: a node is named twice ({','.join(nodes)})", "invalid_request")
        if gpus % len(nodes):
            raise JobError(f"--gpus {gpus} do not split evenly over the {len(nodes)} nodes of --nodes "
                           f"(torchrun starts the same number of ranks on each node)", "invalid_request")
        if per_node is not None and per_node * len(nodes) != gpus:
            raise JobError(f"--per-node {per_node} x {len(nodes)} node(s) of --nodes is not --gpus {gpus}",
                           "invalid_request")
    if per_node is not None and (per_node < 1 or gpus % per_node):
        raise JobError(f"--gpus {gpus} is not a multiple of --per-node {per_node}", "invalid_request")
    candidates = [by_name[n] for n in nodes] if nodes else list(snapshot.nodes)
    unreachable = [f"{n.name} ({n.error})" for n in candidates if not n.reachable]
    free = {n.name: whole_gpus(n, dept) for n in candidates if n.reachable}
    if nodes:
        counts = [len(nodes)]
    elif per_node is not None:
        counts = [gpus // per_node]
    else:
        counts = [m for m in range(1, len(candidates) + 1) if gpus % m == 0]
    for m in counts:
        k = gpus // m
        fits = []
        for n in candidates:
            if n.name in free and len(free[n.name]) >= k:
                chosen, rank = pick_gpus(free[n.name], k)
                fits.append((rank, order[n.name], n.name, chosen))
        if nodes:
            if len(fits) < m:
                break
            chosen_nodes = sorted(fits, key=lambda f: nodes.index(f[2]))
        else:
            if len(fits) < m:
                continue
            chosen_nodes = sorted(sorted(fits)[:m], key=lambda f: f[1])
        parts = tuple(
            NodePart(node=name, rank=r, gpu_uuids=tuple(g.uuid for g in chosen),
                     gpu_indices=tuple(g.index for g in chosen), slice_ids=tuple(g.slice_id for g in chosen),
                     link=GPU_LINKS[rank] if k > 1 and rank < len(GPU_LINKS) else None)
            for r, (rank, _, name, chosen) in enumerate(chosen_nodes))
        return Placement(dept=dept, per_node=k, parts=parts)
    idle = "; ".join(f"{name}: {', '.join('GPU ' + str(g.index) for g in gs) or 'none'}" for name, gs in free.items())
    shape = (f"{per_node} per node" if per_node else
             f"on {', '.join(nodes)}" if nodes else "the same number on each node")
    msg = (f"no placement of {gpus} whole GPU(s) of {dept!r} ({shape}); idle whole GPUs of {dept}: "
           f"{idle or 'no node reachable'}")
    if unreachable:
        msg += f"; unreachable: {', '.join(unreachable)}"
    raise JobError(msg, "unreachable" if unreachable else "insufficient_slices")


# --------------------------------------------------------------------------- leases


def acquire_all(fleet: Any, placement: Placement, *, ttl_s: float, owner: str,
                err: Callable[[str], None]) -> list[dict[str, Any]]:
    """Grant one native lease per part of `placement` on a gpuctl.fleet.client.FleetClient;
    returns the grant answers in rank order. All or nothing: when a node refuses (NodeError) the
    leases granted so far are released and JobError is raised with that node's words and code."""
    answers: list[dict[str, Any]] = []
    for part in placement.parts:
        try:
            answers.append(fleet.clients[part.node].grant_lease(
                request_id=f"job-req-{uuid.uuid4().hex}", department=placement.dept, owner=owner, ttl_s=ttl_s,
                slice_ids=list(part.slice_ids), attach="native"))
        except BaseException as e:  # a refusal, or Ctrl-C meanwhile: nothing stays held either way
            held = [(p.node, a["lease"]["id"]) for p, a in zip(placement.parts, answers)]
            for node, lid in held:
                _release(fleet, node, lid, err, ttl_s)
            if not isinstance(e, NodeError):
                raise
            raise JobError(f"node {part.node} refused its part (GPU {', '.join(map(str, part.gpu_indices))}): {e}; "
                           f"nothing is held" + (f" (released {', '.join(l for _, l in held)})" if held else ""),
                           e.code) from None
    return answers


def _release(fleet: Any, node: str, lease_id: str, err: Callable[[str], None], ttl_s: float) -> None:
    try:
        fleet.clients[node].release_lease(lease_id)
        err(f"released lease {lease_id} on {node}")
    except NodeError as e:
        if e.code not in ("unknown_lease", "lease_revoked"):
            err(f"could not release lease {lease_id} on {node}: {e} (it ends at its ttl, {ttl_s:g} s)")


# --------------------------------------------------------------------------- rendezvous


FREE_PORT_PY = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def free_port(node: Any, transport: Any) -> int:
    """A TCP port free on `node` now (the OS's pick for port 0): here for a local node, over SSH
    with ``python3 -c`` otherwise. Raises JobError ("unreachable") when the node cannot say."""
    if getattr(node, "transport", "ssh") == "local":
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])
    try:
        r = transport.run(f"python3 -c \"{FREE_PORT_PY}\"", timeout_s=20)
        out = r.stdout.decode(errors="replace") if isinstance(r.stdout, bytes) else str(r.stdout)
        if r.rc == 0 and out.strip().isdigit():
            return int(out.strip())
        why = f"exit status {r.rc}: {(r.stderr or b'')[-200:]!r}"
    except Exception as e:  # noqa: BLE001 - said with the node's name
        why = str(e)
    raise JobError(f"node {node.name}: cannot find a free port for the rendezvous (python3 on the node): {why}",
                   "unreachable")


def master_address(node: Any, answer: dict[str, Any]) -> str:
    """The first node's data address: its gpuctld's --datapath-advertise (the grant's
    ``data_address``), else the node's host, else 127.0.0.1 for a local node."""
    addr = answer.get("data_address")
    if addr and addr not in ("0.0.0.0", "::"):
        return str(addr).strip("[]")
    host = getattr(node, "host", None)
    if getattr(node, "transport", "ssh") != "local" and host:
        return str(host)
    return "127.0.0.1"


def rendezvous_env(*, master_addr: str, master_port: int, nnodes: int, node_rank: int,
                   nproc_per_node: int) -> dict[str, str]:
    """The variables of a static torchrun rendezvous, plain and as torchrun's own PET_* defaults
    (so ``torchrun train.py`` needs no flags): MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK,
    NPROC_PER_NODE."""
    plain = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "NNODES": str(nnodes),
             "NODE_RANK": str(node_rank), "NPROC_PER_NODE": str(nproc_per_node)}
    return {**plain, **{f"PET_{k}": v for k, v in plain.items()}}


# --------------------------------------------------------------------------- output


class PrefixedStream:
    """A binary writer that prefixes every line with ``[node] `` and writes whole lines to
    `target` under a lock shared by all nodes (lines of two nodes never interleave). A line
    longer than `max_line` bytes is written in pieces; :meth:`close` writes what is left."""

    def __init__(self, target: BinaryIO, node: str, lock: threading.Lock, max_line: int = 65536):
        self.target, self.prefix, self.lock, self.max_line = target, f"[{node}] ".encode(), lock, max_line
        self._pending = b""

    def write(self, data: bytes) -> int:
        self._pending += data
        lines = self._pending.split(b"\n")
        self._pending = lines.pop()
        while len(self._pending) > self.max_line:
            lines.append(self._pending[:self.max_line])
            self._pending = self._pending[self.max_line:]
        if lines:
            self._emit(b"".join(self.prefix + line + b"\n" for line in lines))
        return len(data)

    def flush(self) -> None:
        """Lines are written as they complete; a partial line waits for its end (or close)."""

    def close(self) -> None:
        if self._pending:
            self._emit(self.prefix + self._pending + b"\n")
            self._pending = b""

    def _emit(self, data: bytes) -> None:
        with self.lock:
            try:
                self.target.write(data)
                self.target.flush()
            except (OSError, ValueError):
                pass


# --------------------------------------------------------------------------- the job


class Job:
    """A placed, leased job: start CMD on every node, watch, forward signals, stop, release.

    fleet: gpuctl.fleet.client.FleetClient; cfg: its FleetConfig (cfg.node(name)); placement and
    answers: from :func:`place` and :func:`acquire_all` (rank order). ttl_s: the leases' ttl
    (heartbeat every ttl/3). grace_s: SIGTERM to SIGKILL when a node's program must end.
    err: one line to gpuctl's stderr. stdout/stderr: where the prefixed output goes (binary).
    """

    def __init__(self, fleet: Any, cfg: Any, placement: Placement, answers: list[dict[str, Any]], *,
                 ttl_s: float, grace_s: float, err: Callable[[str], None], stdout: BinaryIO, stderr: BinaryIO):
        self.fleet, self.cfg, self.placement, self.answers = fleet, cfg, placement, answers
        self.ttl_s, self.grace_s, self.err = ttl_s, grace_s, err
        self.lease_ids = [a["lease"]["id"] for a in answers]
        self.procs: list[Any] = [None] * len(answers)
        self.status: list[int | None] = [None] * len(answers)
        self.released = [False] * len(answers)
        self.failure: tuple[str, int] | None = None  # (node, status) of the first failure
        self.revoked: str | None = None
        self._lock = threading.RLock()
        self._stop_hb = threading.Event()
        self._hb = threading.Thread(target=self._heartbeat, name="gpuctl-job-heartbeat", daemon=True)
        out_lock = threading.Lock()
        self._streams = [(PrefixedStream(stdout, p.node, out_lock), PrefixedStream(stderr, p.node, out_lock))
                         for p in placement.parts]

    def launch(self, command: list[str], cwd: str | None) -> None:
        """Start `command` on every node (rank order) with its lease's env and the rendezvous env,
        and record each pid with its lease. Raises JobError ("unreachable": a node cannot be
        reached or says no free port) or NativeStartError (127/126, naming the node) when a node
        cannot start it; the caller then calls :meth:`close`, which ends the ones started."""
        from gpuctl.fleet.native_run import NativeStartError, record_pid, start_native

        self._hb.start()  # before the first start: a slow launch must not let a lease expire
        first = self.placement.parts[0].node
        first_cfg = self.cfg.node(first)
        port = free_port(first_cfg, self.fleet.clients[first].transport())
        addr = master_address(first_cfg, self.answers[0])
        self.err(f"rendezvous: MASTER_ADDR={addr} MASTER_PORT={port} NNODES={len(self.answers)} "
                 f"NPROC_PER_NODE={self.placement.per_node}")
        for i, (part, answer) in enumerate(zip(self.placement.parts, self.answers)):
            env = dict(answer.get("env") or {})
            env.update(rendezvous_env(master_addr=addr, master_port=port, nnodes=len(self.answers),
                                      node_rank=part.rank, nproc_per_node=self.placement.per_node))
            out, errs = self._streams[i]
            try:
                proc = start_native(self.cfg.node(part.node), self.fleet.clients[part.node].transport(),
                                    {**answer, "env": env}, command, cwd, stdout=out, stderr=errs)
            except NativeStartError as e:
                raise NativeStartError(f"{part.node}: {e}", e.exit_code) from None
            except Exception as e:  # noqa: BLE001 - the node's connection failed
                raise JobError(f"cannot start {command[0]!r} on {part.node}: {e}", "unreachable") from None
            with self._lock:
                self.procs[i] = proc
            record_pid(self.fleet.clients[part.node], self.lease_ids[i], proc, self.err)

    def forward(self, signum: int, only: Callable[[Any], bool] = lambda proc: True) -> None:
        """Send `signum` to every node's program still running (for which `only(proc)` holds)."""
        for proc in list(self.procs):
            if proc is not None and proc.poll() is None and only(proc):
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    def _fail(self, i: int, status: int, why: str) -> None:
        with self._lock:
            if self.failure is not None:
                return
            node = self.placement.parts[i].node
            self.failure = (node, status)
            others = [j for j, p in enumerate(self.procs) if j != i and p is not None and p.poll() is None]
        self.err(f"{node} (rank {self.placement.parts[i].rank}) {why}"
                 + (f": stopping {', '.join(self.placement.parts[j].node for j in others)}" if others else ""))
        from gpuctl.fleet.native_run import wait_or_kill

        for j in others:
            threading.Thread(target=wait_or_kill, args=(self.procs[j], self.grace_s), daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._stop_hb.wait(max(0.2, self.ttl_s / 3)):
            for i, part in enumerate(self.placement.parts):
                if self.released[i] or self.status[i] is not None or self._stop_hb.is_set():
                    continue
                try:
                    self.fleet.clients[part.node].heartbeat_lease(self.lease_ids[i])
                except NodeError as e:
                    if self.released[i] or self.status[i] is not None:
                        continue  # its part ended and was released meanwhile: not a loss
                    if not e.reachable:
                        self.err(f"heartbeat of lease {self.lease_ids[i]} on {part.node} failed, retrying: {e}")
                        continue
                    from gpuctl.exit_codes import ExitCode

                    if e.code == "lease_revoked":
                        self.revoked = self.revoked or str(e)
                    self._fail(i, int(ExitCode.LEASE_REVOKED) if e.code == "lease_revoked" else 1,
                               f"lost its lease: {e}")
                    self.forward(signal.SIGTERM, only=lambda p, mine=self.procs[i]: p is mine)

    def wait(self) -> int:
        """Wait until every node's program has ended; release each lease as its part ends.
        Returns 0 when all ended with 0, else the first failure's status (a program's exit status,
        128 + N for signal N; 7 when a node's connection was lost; 8 when a lease was revoked)."""
        from gpuctl.exit_codes import ExitCode

        try:
            while True:
                running = 0
                for i, proc in enumerate(self.procs):
                    if proc is None or self.status[i] is not None:
                        continue
                    rc = proc.poll()
                    if rc is None:
                        running += 1
                        continue
                    rc = rc if rc >= 0 else 128 - rc
                    self.status[i] = rc
                    revoked = None if getattr(proc, "connection_lost", False) else self._revoked(i)
                    if revoked is not None:  # the node ended it (any status): the job is over
                        self.revoked = self.revoked or revoked
                        self._fail(i, int(ExitCode.LEASE_REVOKED), f"lost its lease: {revoked}")
                    elif getattr(proc, "connection_lost", False):
                        self._fail(i, int(ExitCode.UNREACHABLE), f"lost its SSH connection (its program ends when "
                                                                 f"lease {self.lease_ids[i]} expires)")
                    elif rc != 0:
                        self._fail(i, rc, f"ended with exit status {rc}")
                    self._release_part(i)
                if running == 0:
                    break
                time.sleep(POLL_S)
        finally:
            self._stop_hb.set()
        if self.revoked is not None:
            return int(ExitCode.LEASE_REVOKED)
        return self.failure[1] if self.failure else 0

    def _revoked(self, i: int) -> str | None:
        """The node's words when part i's lease was revoked (asked with a heartbeat: a revoke ends
        the program on the node, maybe with status 0, before the heartbeat thread hears of it)."""
        try:
            self.fleet.clients[self.placement.parts[i].node].heartbeat_lease(self.lease_ids[i])
        except NodeError as e:
            if e.code == "lease_revoked":
                return str(e)  # names the lease, the node and what revoked it
        return None

    def _release_part(self, i: int) -> None:
        with self._lock:
            if self.released[i]:
                return
            self.released[i] = True
        _release(self.fleet, self.placement.parts[i].node, self.lease_ids[i], self.err, self.ttl_s)

    def close(self) -> None:
        """End what still runs (SIGTERM, SIGKILL after the grace), flush the output, release every
        lease not released yet. Never raises; safe to call twice."""
        from gpuctl.fleet.native_run import wait_or_kill

        self._stop_hb.set()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        threads = [threading.Thread(target=wait_or_kill, args=(p, self.grace_s), daemon=True) for p in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.grace_s + 15)
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        for out, errs in self._streams:
            out.close()
            errs.close()
        for i in range(len(self.lease_ids)):
            self._release_part(i)
