"""An in-process simulated fleet for tests, SVG snapshots and benchmarks, run by the daemon's own code.

Each simulated node is the daemon's parts in this process: a
:class:`gpuctl.backends.simulated.SimulatedBackend`, the telemetry
:class:`gpuctl.daemon.telemetry.Sampler`, the :class:`gpuctl.daemon.state.NodeStateManager` (state kept
in memory, not on disk) and the :class:`gpuctl.daemon.api.ControlApi` route table. The console's
calls go through a :class:`gpuctl.fleet.client.FleetClient` whose transport hands each HTTP request
to ``ControlApi.handle`` (no socket): so snapshots, history and reassignment (assign, drain,
revoke, request-id replay) follow exactly the rules of a real gpuctld and of `gpuctl reassign`.
What the source adds is only the simulation: deterministic seeded slices and leases, when samples
are taken (one round per snapshot, none when frozen) and which nodes are unreachable.
"""

from __future__ import annotations

import os
import random
import threading
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

import httpx

from gpuctl import model
from gpuctl.backends.simulated import SimulatedBackend
from gpuctl.fleet.source import FleetSource  # noqa: F401 - the protocol this source implements

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

#: How many sampling rounds the simulated daemon's history ring keeps at least (10 minutes at 1 s).
HISTORY_LEN = 600

# How each GPU is split, cycling over the fleet's GPUs (number of equal slices).
_SPLIT_PATTERN = (1, 2, 1, 4, 1, 1, 2, 1)


class FleetSourceError(Exception):
    """A history request the source cannot answer: unknown node or GPU, unreachable node, or a
    closed source. The message names the node (and GPU UUID where one was given)."""


class _MemoryStore:
    """The state store of an in-process node: saving keeps nothing on disk (the manager holds the
    state in memory; there is no restart to survive)."""

    def __init__(self, node: str):
        self.path = f"(memory of simulated node {node})"

    def save(self, state: Any) -> None:
        """Nothing to write."""


class _StampedBackend:
    """The node's backend as its Sampler sees it: each round is stamped with the source's clock
    (`stamp_s`, frozen or real time) and, for the GPU named by `power_na_uuid`, power is N/A (a
    board whose NVML power reading is NotSupported)."""

    def __init__(self, backend: SimulatedBackend, power_na_uuid: str | None):
        self.backend = backend
        self.name = backend.name
        self.power_na_uuid = power_na_uuid
        self.stamp_s = 0.0

    def sample(self) -> list[model.GpuSample]:
        samples = self.backend.sample()
        for s in samples:
            s.timestamp_s = self.stamp_s
            if s.uuid == self.power_na_uuid:
                s.power_w = None
        return samples


class _Unreachable(Exception):
    """The transport of an unreachable simulated node: every request fails like an SSH timeout."""

    code = "unreachable"


class _ApiTransport(httpx.BaseTransport):
    """An httpx transport that answers each request with ``ControlApi.handle`` in this process:
    the route handling layer of gpuctld, without its socket server."""

    def __init__(self, api: Any):
        self.api = api

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        from gpuctl.daemon.api import ApiRequest, Peer

        parsed = urllib.parse.urlsplit(request.url.raw_path.decode("ascii"))
        status, body = self.api.handle(ApiRequest(
            method=request.method, path=parsed.path, query=urllib.parse.parse_qs(parsed.query),
            body=request.read(), peer=Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())))
        return httpx.Response(status, json=body)


class _InProcessTransport:
    """A gpuctl.transport-shaped transport (http_client, error, close) to one in-process node."""

    def __init__(self, node: str, api: Any | None):
        self.node = node
        self.api = api
        self._client: httpx.Client | None = None

    def http_client(self) -> httpx.Client:
        if self.api is None:
            raise _Unreachable(f"ssh: connect to host {self.node} port 22: timed out after 5.0 s")
        if self._client is None:
            from gpuctl.transport.local import BASE_URL

            self._client = httpx.Client(transport=_ApiTransport(self.api), base_url=BASE_URL)
        return self._client

    def error(self, exc: BaseException) -> BaseException:
        return exc

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


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
    history_warmup_samples: sampling rounds put in each node's history ring at construction, so
    the node detail has 10-minute plots at once (0 for the scale benchmark: it costs ~1 ms per 100
    GPUs per round). Node names are "node-01", "node-02", ... (zero-padded to the node count's width).

    Every node's generation starts at 1; each reassignment that changes a node bumps it, as on a
    daemon. Leases keep the times they were made with (no heartbeat is simulated).
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
        from gpuctl.config import DepartmentConfig, FleetConfig, NodeConfig
        from gpuctl.daemon.api import ControlApi
        from gpuctl.daemon.state import NodeState, NodeStateManager
        from gpuctl.daemon.telemetry import RING_SLACK, Sampler
        from gpuctl.fleet.client import FleetClient

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
        self._apis: dict[str, Any] = {}
        self._backends: dict[str, _StampedBackend] = {}
        gpu_counter = 0
        for i, name in enumerate(names):
            backend = SimulatedBackend(gpus=gpus_per_node, seed=seed * 100_003 + i, tick_s=tick_s)
            identities = backend.gpus()
            rng = random.Random(f"gpuctl-simulated-fleet:{seed}:{i}")
            slices: dict[str, model.Slice] = {}
            for ident in identities:
                parts = _SPLIT_PATTERN[gpu_counter % len(_SPLIT_PATTERN)]
                gpu_counter += 1
                total = ident.memory_total_bytes or 0
                choices = dept_names + [model.UNASSIGNED]
                for k in range(parts):
                    s = model.Slice(id=model.slice_id(ident.uuid, k), gpu_uuid=ident.uuid, fraction=1.0 / parts,
                                    memory_quota_bytes=total // parts, compute_share=1.0 / parts,
                                    department=rng.choice(choices))
                    slices[s.id] = s
            leases = self._first_leases(i, name, list(slices.values()))
            manager = NodeStateManager(_MemoryStore(name), NodeState(generation=1, slices=slices, leases=leases))
            manager.reconcile(identities)
            power_na = identities[-1].uuid if power_not_supported and i == 0 else None
            stamped = _StampedBackend(backend, power_na)
            # the ring keeps HISTORY_LEN rounds: Sampler adds RING_SLACK rounds to history_s / interval_s
            sampler = Sampler(stamped, interval_s=tick_s, history_s=(HISTORY_LEN - RING_SLACK) * tick_s)
            self._backends[name] = stamped
            self._apis[name] = ControlApi(backend_name="simulated", gpus=identities, sampler=sampler,
                                          state=manager, hostname=name)
        for name, api in self._apis.items():
            if name in self._unreachable:
                continue
            for k in range(history_warmup_samples):
                self._sample(name, self._base_time_s - (history_warmup_samples - 1 - k) * tick_s)
            if frozen and not api.sampler.latest():
                self._sample(name, self._base_time_s)
        config = FleetConfig(
            path="(simulated fleet)",
            nodes=tuple(NodeConfig(name=n, host=None, transport="local") for n in names),
            departments=tuple(DepartmentConfig(d.name, d.priority, d.color) for d in self.departments),
            max_parallel=16)
        self._client = FleetClient(config, self._transport)

    # -- construction helpers ------------------------------------------------------------------

    def _first_leases(self, n: int, node: str, slices: list[model.Slice]) -> dict[str, model.Lease]:
        """The leases a node starts with: on node 1 the first assigned slice, on node 2 up to two
        assigned slices of one department (deterministic: slice order); none elsewhere."""
        if n >= 2:
            return {}
        assigned = [s for s in slices if s.department != model.UNASSIGNED]
        if not assigned:
            return {}
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
            endpoint=f"{node}:7{n + 1:03d}",
        )
        for s in held:
            s.lease_id = lease.id
        return {lease.id: lease}

    def _transport(self, node: Any) -> _InProcessTransport:
        """The FleetClient's transport factory: the node's ControlApi, or none when unreachable."""
        return _InProcessTransport(node.name, None if node.name in self._unreachable else self._apis[node.name])

    def _sample(self, node: str, stamp_s: float) -> None:
        """One sampling round of `node`'s daemon, stamped `stamp_s`."""
        self._backends[node].stamp_s = stamp_s
        self._apis[node].sampler.sample_once()

    # -- FleetSource ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise FleetSourceError("simulated fleet: source is closed")

    def snapshot(self) -> model.FleetSnapshot:
        """The whole fleet now (see class doc), as the daemons' GET /v1/status answers it;
        advances the simulation by one sampling round unless frozen.

        Raises FleetSourceError after close(). Returns fresh copies: callers may keep them.
        """
        with self._lock:
            self._check_open()
            now = self._base_time_s if self.frozen else time.time()
            if not self.frozen:
                for name in self._apis:
                    if name not in self._unreachable:
                        self._sample(name, now)
            snap = self._client.snapshot()
        snap.taken_at_s = now
        for n in snap.nodes:
            n.fetched_at_s = now
        return snap

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[model.GpuSample]]:
        """The daemon's history ring of GPU `uuid` of `node` (GET /v1/telemetry): (cursor, samples
        of rounds after cursor `since`), oldest first, at most HISTORY_LEN rounds.

        Raises FleetSourceError naming the node when it is unknown or unreachable, naming the UUID
        when the node has no such GPU (the daemon's 404), and after close().
        """
        from gpuctl.fleet.client import NodeError

        with self._lock:
            self._check_open()
        if node not in self._apis:
            raise FleetSourceError(f"unknown node {node!r}")
        if node in self._unreachable:
            raise FleetSourceError(f"{node}: unreachable (ssh: timed out after 5.0 s)")
        try:
            return self._client.history(node, uuid, since)
        except NodeError as e:
            raise FleetSourceError(f"{node}: {str(e).removeprefix(f'node {node}: ')}") from None

    def reassign(self, request: Any) -> Any:
        """Run a gpuctl.fleet.reassign.ReassignRequest on the simulated fleet: the same service as
        `gpuctl reassign` (gpuctl.fleet.reassign.reassign) against the nodes' own state managers.

        Returns a ReassignResult; raises ReassignError for an invalid request, FleetSourceError
        after close().
        """
        from gpuctl.fleet.reassign import reassign

        with self._lock:
            self._check_open()
        return reassign(self._client, request)

    def fleet_client(self) -> None:
        """None: the in-process daemons keep no usage accounting (FleetSource.fleet_client)."""
        return None

    def close(self) -> None:
        """Mark the source closed (later calls raise FleetSourceError) and close the client; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._client.close()
