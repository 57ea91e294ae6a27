"""Where the console gets its data: the FleetSource protocol and an in-process simulated fleet.

Headless (never imports textual). The console (gpuctl/app.py) calls a FleetSource only from
thread workers, because both methods may block on the network (the real source, gpuctl.fleet.client,
talks to each node's daemon over SSH).

:class:`SimulatedFleetSource` builds a whole fleet in-process from
:class:`gpuctl.backends.simulated.SimulatedBackend`: deterministic for a seed, with slices owned by
departments, a couple of leases, one GPU whose power reading is N/A and, when asked, one
unreachable node. Used by the tests, the SVG snapshots, demos and the scale benchmark.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from gpuctl import model
from gpuctl.backends.simulated import SimulatedBackend

#: Departments of the simulated fleet when none are given (name, priority).
DEFAULT_DEPARTMENTS = (
    model.Department("research", priority=10),
    model.Department("training", priority=20),
    model.Department("inference", priority=30),
)

#: Unix time (s) used for every timestamp of a frozen source (2026-01-01T00:00:00Z).
FROZEN_TIME_S = 1_767_225_600.0

#: Owner of the simulated leases.
LEASE_OWNER = "alice@ws12"

#: Lease time-to-live of the simulated leases, seconds.
LEASE_TTL_S = 300.0

#: How many samples per GPU the simulated daemon's history ring keeps (10 minutes at 1 s).
HISTORY_LEN = 600

# How each GPU is split, cycling over the fleet's GPUs (number of equal slices).
_SPLIT_PATTERN = (1, 2, 1, 4, 1, 1, 2, 1)


@runtime_checkable
class FleetSource(Protocol):
    """What the console needs from the fleet.

    departments: the departments of the fleet config, in config order (the console gives them
    colors in this order). snapshot(): the whole fleet now (BLOCKING: network; call it only from
    a thread worker); a node that cannot be reached is a NodeStatus with reachable=False and its
    reason in `error`, never an exception. history(node, uuid, since): the daemon's telemetry
    ring for one GPU, samples with sequence number > `since`, as (cursor, samples) where cursor is
    the sequence number to pass next time (BLOCKING). close(): release connections; idempotent.
    reassign(request): plan and run a gpuctl.fleet.reassign.ReassignRequest, returning a
    ReassignResult (BLOCKING; raises gpuctl.fleet.reassign.ReassignError for an invalid request).
    """

    departments: list[model.Department]

    def snapshot(self) -> model.FleetSnapshot: ...

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[model.GpuSample]]: ...

    def close(self) -> None: ...

    def reassign(self, request: Any) -> Any: ...


class FleetSourceError(Exception):
    """A history request the source cannot answer: unknown node or GPU, unreachable node, or a
    closed source. The message names the node (and GPU UUID where one was given)."""


@dataclasses.dataclass
class _SimNode:
    """One simulated node (internal): its backend, slices, leases and history ring."""

    name: str
    backend: SimulatedBackend
    identities: list[model.GpuIdentity]
    slices: dict[str, list[model.Slice]]  # GPU UUID -> slices
    leases: list[model.Lease]
    rings: dict[str, deque[tuple[int, model.GpuSample]]]  # GPU UUID -> (sequence, sample)
    cursor: int = 0
    latest: list[model.GpuSample] | None = None


class SimulatedFleetSource:
    """An in-process fleet of `nodes` simulated nodes with `gpus_per_node` GPUs each.

    nodes, gpus_per_node: >= 1 (ValueError otherwise). seed: the same seed gives the same UUIDs,
    slices, leases and sample sequence. departments: the fleet's departments (default research,
    training, inference); slices go to them and to "unassigned" at random (seeded), GPUs are split
    into 1, 1/2 or 1/4 slices by a fixed pattern. Two leases owned by "alice@ws12" hold slices on
    the first two nodes (when those have assigned slices). The last GPU of the first node reports
    power as N/A (None), as a board whose NVML power reading is NotSupported would, when
    `power_not_supported` is true.

    unreachable: True makes the last node unreachable; a sequence of node names makes those
    unreachable; their NodeStatus has reachable=False and error naming the reason.
    frozen: every snapshot() returns the same data (timestamps fixed at FROZEN_TIME_S), for SVG
    snapshots; otherwise each snapshot() advances every node's backend by one sample.
    history_warmup_samples: samples put in each GPU's history ring at construction, so the node
    detail has 10-minute plots at once (0 for the scale benchmark: it costs ~1 ms per 100 GPUs
    per sample). Node names are "node-01", "node-02", ... (zero-padded to the node count's width).
    """

    def __init__(
        self,
        nodes: int = 4,
        gpus_per_node: int = 8,
        seed: int = 0,
        departments: Sequence[model.Department] | None = None,
        *,
        frozen: bool = False,
        unreachable: bool | Iterable[str] = False,
        power_not_supported: bool = True,
        history_warmup_samples: int = 120,
        tick_s: float = 1.0,
    ):
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"simulated fleet: nodes must be an integer >= 1, got {nodes!r}")
        if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ValueError(f"simulated fleet: gpus_per_node must be an integer >= 1, got {gpus_per_node!r}")
        if history_warmup_samples < 0:
            raise ValueError(
                f"simulated fleet: history_warmup_samples must be >= 0, got {history_warmup_samples!r}"
            )
        self.departments: list[model.Department] = list(
            DEFAULT_DEPARTMENTS if departments is None else departments
        )
        self.frozen = frozen
        self.tick_s = tick_s
        self._lock = threading.Lock()
        self._closed = False
        self._reassigned: dict[str, list[Any]] = {}  # request id -> moves made (idempotency)
        self._power_not_supported = power_not_supported
        width = max(2, len(str(nodes)))
        names = [f"node-{i + 1:0{width}d}" for i in range(nodes)]
        if unreachable is True:
            self._unreachable = {names[-1]}
        elif unreachable is False:
            self._unreachable = set()
        else:
            self._unreachable = set(unreachable)
            unknown = self._unreachable - set(names)
            if unknown:
                raise ValueError(f"simulated fleet: unreachable names unknown nodes {sorted(unknown)}")
        self._base_time_s = FROZEN_TIME_S if frozen else time.time()
        dept_names = [d.name for d in self.departments]
        self._nodes: list[_SimNode] = []
        gpu_counter = 0
        for i, name in enumerate(names):
            backend = SimulatedBackend(gpus=gpus_per_node, seed=seed * 100_003 + i, tick_s=tick_s)
            identities = backend.gpus()
            rng = random.Random(f"gpuctl-simulated-fleet:{seed}:{i}")
            slices: dict[str, list[model.Slice]] = {}
            for ident in identities:
                parts = _SPLIT_PATTERN[gpu_counter % len(_SPLIT_PATTERN)]
                gpu_counter += 1
                total = ident.memory_total_bytes or 0
                choices = dept_names + [model.UNASSIGNED]
                slices[ident.uuid] = [
                    model.Slice(
                        id=model.slice_id(ident.uuid, k),
                        gpu_uuid=ident.uuid,
                        fraction=1.0 / parts,
                        memory_quota_bytes=total // parts,
                        compute_share=1.0 / parts,
                        department=rng.choice(choices),
                    )
                    for k in range(parts)
                ]
            node = _SimNode(
                name=name,
                backend=backend,
                identities=identities,
                slices=slices,
                leases=[],
                rings={ident.uuid: deque(maxlen=HISTORY_LEN) for ident in identities},
            )
            self._nodes.append(node)
        self._make_leases()
        for node in self._nodes:
            if node.name in self._unreachable:
                continue
            for k in range(history_warmup_samples):
                stamp = self._base_time_s - (history_warmup_samples - 1 - k) * tick_s
                self._advance(node, stamp)
        if frozen:
            for node in self._nodes:
                if node.name not in self._unreachable and node.latest is None:
                    self._advance(node, self._base_time_s)

    # -- construction helpers ------------------------------------------------------------------

    def _make_leases(self) -> None:
        """Lease 1: the first assigned slice of node 1; lease 2: up to two assigned slices of one
        department on node 2 (deterministic: slice order)."""
        for n, node in enumerate(self._nodes[:2]):
            assigned = [s for ss in node.slices.values() for s in ss if s.department != model.UNASSIGNED]
            if not assigned:
                continue
            dept = assigned[0].department
            held = [s for s in assigned if s.department == dept][: 1 if n == 0 else 2]
            lease = model.Lease(
                id=f"lease-{n + 1:04d}",
                department=dept,
                slice_ids=[s.id for s in held],
                owner=LEASE_OWNER,
                ttl_s=LEASE_TTL_S,
                created_s=self._base_time_s - 600.0,
                heartbeat_s=self._base_time_s,
                expires_s=self._base_time_s + LEASE_TTL_S,
                endpoint=f"{node.name}:7{n + 1:03d}",
            )
            for s in held:
                s.lease_id = lease.id
            node.leases.append(lease)

    def _advance(self, node: _SimNode, stamp_s: float) -> None:
        """Take one sample of every GPU of `node`, stamped `stamp_s`, into its ring (lock held)."""
        samples = node.backend.sample()
        out = []
        for ident, sample in zip(node.identities, samples):
            sample.timestamp_s = stamp_s
            if self._power_not_supported and node is self._nodes[0] and ident is node.identities[-1]:
                sample.power_w = None
            node.cursor += 1
            node.rings[ident.uuid].append((node.cursor, sample))
            out.append(sample)
        node.latest = out

    # -- FleetSource ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise FleetSourceError("simulated fleet: source is closed")

    def snapshot(self) -> model.FleetSnapshot:
        """The whole fleet now (see class doc); advances the simulation unless frozen.

        Raises FleetSourceError after close(). Returns fresh copies: callers may keep them.
        """
        with self._lock:
            self._check_open()
            now = self._base_time_s if self.frozen else time.time()
            statuses = []
            for i, node in enumerate(self._nodes):
                if node.name in self._unreachable:
                    statuses.append(
                        model.NodeStatus(
                            name=node.name,
                            reachable=False,
                            error=f"ssh: connect to host {node.name} port 22: timed out after 5.0 s",
                            error_code="unreachable",
                            fetched_at_s=now,
                        )
                    )
                    continue
                if not self.frozen or node.latest is None:
                    self._advance(node, now)
                    for lease in node.leases:
                        lease.heartbeat_s = now
                        lease.expires_s = now + lease.ttl_s
                assert node.latest is not None
                gpus = [
                    model.GpuStatus(
                        identity=ident,
                        sample=dataclasses.replace(sample),
                        slices=[dataclasses.replace(s) for s in node.slices[ident.uuid]],
                    )
                    for ident, sample in zip(node.identities, node.latest)
                ]
                statuses.append(
                    model.NodeStatus(
                        name=node.name,
                        reachable=True,
                        generation=1,
                        backend="simulated",
                        hostname=node.name,
                        gpus=gpus,
                        leases=[copy.deepcopy(lease) for lease in node.leases],
                        fetched_at_s=now,
                    )
                )
            return model.FleetSnapshot(nodes=statuses, taken_at_s=now)

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[model.GpuSample]]:
        """The history ring of GPU `uuid` of `node`: (cursor, samples with sequence > since), oldest
        first, at most HISTORY_LEN (10 minutes at 1 s per sample).

        Raises FleetSourceError naming the node when it is unknown or unreachable, naming the UUID
        when the node has no such GPU, and after close().
        """
        with self._lock:
            self._check_open()
            sim = next((n for n in self._nodes if n.name == node), None)
            if sim is None:
                raise FleetSourceError(f"unknown node {node!r}")
            if sim.name in self._unreachable:
                raise FleetSourceError(f"{node}: unreachable (ssh: timed out after 5.0 s)")
            ring = sim.rings.get(uuid)
            if ring is None:
                raise FleetSourceError(f"{node}: no GPU with UUID {uuid!r}")
            return sim.cursor, [dataclasses.replace(s) for seq, s in ring if seq > since]

    def reassign(self, request: Any) -> Any:
        """Run a gpuctl.fleet.reassign.ReassignRequest on the simulated fleet, as the daemons would.

        Plans with gpuctl.fleet.reassign.plan on the current state (no sample is taken), then changes
        the in-memory slices: idle slices move; leased ones (only in drain/revoke mode) get
        ``pending = {"to", "request_id"}`` (drain) or have their whole lease ended, releasing all
        its slices and applying their drained moves, then move (revoke). A request id seen before
        changes nothing and returns a result whose plan lists the earlier moves as `already`.
        Returns a ReassignResult (empty `moved` and a `plan.shortfall` when the slices cannot
        move). Raises ReassignError for an invalid request (unknown department or node, ...),
        FleetSourceError after close(). Blocks only on the source's lock.
        """
        from gpuctl.fleet.reassign import Move, ReassignError, ReassignResult, new_request_id, plan

        request.validate([d.name for d in self.departments])
        with self._lock:
            self._check_open()
            if request.node is not None and all(n.name != request.node for n in self._nodes):
                raise ReassignError(f"--node: unknown node {request.node!r}")
            if request.request_id is None:
                request.request_id = new_request_id()
            rid = request.request_id
            statuses = []
            for node in self._nodes:
                if node.name in self._unreachable:
                    statuses.append(model.NodeStatus(name=node.name, reachable=False, error="unreachable"))
                    continue
                samples = node.latest or [None] * len(node.identities)
                gpus = [model.GpuStatus(identity=ident, sample=sample, slices=node.slices[ident.uuid])
                        for ident, sample in zip(node.identities, samples)]
                statuses.append(model.NodeStatus(name=node.name, reachable=True, generation=1,
                                                 gpus=gpus, leases=node.leases))
            if rid in self._reassigned:
                p = plan(model.FleetSnapshot(nodes=[]), request, already=self._reassigned[rid],
                         exclude_nodes={n.name for n in self._nodes})
                p.replay_complete = True
                return ReassignResult(request_id=rid, plan=p)
            p = plan(model.FleetSnapshot(nodes=statuses), request)
            p.generations = {n.name: 1 for n in self._nodes}
            result = ReassignResult(request_id=rid, plan=p)
            if request.dry_run or not p.moves:
                return result
            by_id = {s.id: (node, s) for node in self._nodes for ss in node.slices.values() for s in ss}
            for m in p.moves:
                node, s = by_id[m.slice_id]
                if s.lease_id is not None and request.leased == "drain":
                    s.pending = {"to": request.dst, "request_id": rid}
                    result.pending.append(m)
                    continue
                if s.lease_id is not None:  # revoke: end the whole lease
                    lease_id = s.lease_id
                    node.leases = [lease for lease in node.leases if lease.id != lease_id]
                    for other in (x for ss in node.slices.values() for x in ss if x.lease_id == lease_id):
                        other.lease_id = None
                        if other.pending is not None:
                            other.department, other.pending = other.pending["to"], None
                s.department = request.dst
                s.pending = None
                result.moved.append(m)
            self._reassigned[rid] = [Move(m.node, m.slice_id, m.gpu_index, m.fraction, m.leased)
                                     for m in result.moved + result.pending]
            return result

    def close(self) -> None:
        """Mark the source closed (later calls raise FleetSourceError); idempotent."""
        with self._lock:
            self._closed = True
