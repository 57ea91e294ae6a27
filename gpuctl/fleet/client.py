"""The fleet client: one persistent connection per node, bounded parallel fan-out, one snapshot.

`NodeClient` speaks the daemon's control API (docs/ARCHITECTURE.md) over a transport
(`gpuctl.transport`: SSH to the node's `gpuctld bridge`, or a local Unix socket). `FleetClient`
fans calls out to every node with a bound on parallelism and a deadline per node: a node that is
down or slow is reported as unreachable with the reason and never delays the others.
The console reads it through gpuctl.fleet.source.LiveFleetSource, which adds the reassignment
service (gpuctl.fleet.reassign) to it.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from gpuctl.config import FleetConfig, NodeConfig
from gpuctl.model import Department, FleetSnapshot, GpuSample, NodeStatus

T = TypeVar("T")


class NodeError(Exception):
    """A call to one node failed.

    node: the node's name. code: "unreachable", "timeout", or the daemon's error code
    ("stale_generation", "slice_leased", "wrong_owner", "unknown_slice", "bad_request", ...).
    status: the HTTP status the daemon answered (None when it never answered).
    detail: the daemon's whole error object, if any.
    """

    def __init__(self, node: str, message: str, *, code: str = "unreachable",
                 status: int | None = None, detail: dict[str, Any] | None = None):
        super().__init__(message)
        self.node = node
        self.code = code
        self.status = status
        self.detail = detail or {}

    @property
    def reachable(self) -> bool:
        """True when the daemon answered (an API error), False when it could not be reached."""
        return self.status is not None


TransportFactory = Callable[[NodeConfig], Any]


def reported_user() -> str:
    """``user@host`` of this gpuctl process, sent to every node in the ``Gpuctl-User`` header (the
    node's audit log records it next to the SSH login user it sees itself)."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}".encode("ascii", "backslashreplace").decode("ascii")


def default_transport_factory(**options: Any) -> TransportFactory:
    """A factory opening `gpuctl.transport.open_transport(node, **options)` for each node.

    options: ssh_config_path, known_hosts_path, accept_new_host_key (see gpuctl.transport).
    """

    def factory(node: NodeConfig) -> Any:
        from gpuctl.transport import open_transport

        return open_transport(node, **options)

    return factory


def preload_transports(config: FleetConfig) -> None:
    """Import the transport modules `config`'s nodes use now (SSH: paramiko and httpx, ~0.1 s),
    rather than in the first node's fan-out thread while the others wait on the import lock.
    Raises nothing: a module that fails to import (paramiko missing or broken) is left to the
    fan-out, where each node using it fails with a NodeError naming it (exit UNREACHABLE), as
    without the preload; the other nodes still answer."""
    kinds = {getattr(n, "transport", "ssh") for n in config.nodes}
    modules = {"ssh": ("gpuctl.transport.conncache", "gpuctl.transport.ssh"), "local": ("gpuctl.transport.local",)}
    for kind in sorted(kinds):
        for module in modules.get(kind, ()):
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - reported per node by the fan-out (see above)
                break


class NodeClient:
    """The control-API client of one node, holding its one persistent transport.

    Thread-safe for one caller at a time per node (FleetClient never runs two calls on one node
    at once). Every method raises NodeError naming the node on any failure.
    """

    def __init__(self, node: NodeConfig, transport_factory: TransportFactory):
        self.node = node
        self._factory = transport_factory
        self._transport: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.node.name

    def _http(self) -> Any:
        if self._transport is None:
            self._transport = self._factory(self.node)
        return self._transport.http_client()

    def _drop_transport(self) -> None:
        t, self._transport = self._transport, None
        if t is not None:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not mask the error
                pass

    def request(self, method: str, path: str, *, json: Any = None,
                params: dict[str, Any] | None = None, ok_404: bool = False) -> Any:
        """One control-API call; returns the decoded JSON answer (None for an allowed 404).

        Raises NodeError: code "unreachable"/"timeout" when no answer came (the transport is
        dropped and re-opened on the next call), the daemon's error code on a 4xx/5xx answer.
        """
        with self._lock:
            try:
                resp = self._http().request(method, path, json=json, params=params,
                                            headers={"Gpuctl-User": reported_user()},
                                            timeout=self.node.timeout_s)
            except Exception as exc:  # noqa: BLE001 - every transport failure becomes a NodeError
                if self._transport is not None and not hasattr(exc, "code"):
                    try:
                        exc = self._transport.error(exc)
                    except Exception:  # noqa: BLE001 - keep the original error
                        pass
                msg = str(exc) or type(exc).__name__
                code = getattr(exc, "code", None) or "unreachable"
                self._drop_transport()
                if self.node.name not in msg:
                    msg = f"node {self.node.name}: {msg}"
                raise NodeError(self.node.name, msg, code=code) from exc
        if ok_404 and resp.status_code == 404:
            return None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code >= 400:
            err = (body or {}).get("error") if isinstance(body, dict) else None
            err = err if isinstance(err, dict) else {}
            message = err.get("message") or f"HTTP {resp.status_code}"
            raise NodeError(self.node.name, f"node {self.node.name}: {message}",
                            code=err.get("code", "error"), status=resp.status_code, detail=err)
        return body

    def status(self) -> NodeStatus:
        """GET /v1/status as a NodeStatus (reachable=True)."""
        data = self.request("GET", "/v1/status")
        st = NodeStatus.from_json(data, name=self.name)
        st.reachable = True
        return st

    def history(self, uuid: str | None = None, since: int = 0) -> tuple[int, list[GpuSample]]:
        """GET /v1/telemetry: (cursor, samples with sequence > since), optionally of one GPU."""
        params: dict[str, Any] = {"since": since}
        if uuid:
            params["uuid"] = uuid
        data = self.request("GET", "/v1/telemetry", params=params)
        return int(data["cursor"]), [GpuSample.from_json(s) for s in data["samples"]]

    def assign(self, *, request_id: str, generation: int, moves: list[dict[str, str]],
               leased: str = "refuse", deadline_unix_s: float | None = None) -> dict[str, Any]:
        """POST /v1/assign; returns the daemon's answer ({"generation", "moved", "pending", "replayed"}).
        deadline_unix_s: Unix time (s) after which the node must not apply it (NodeError code
        deadline_passed then); None for no deadline."""
        body: dict[str, Any] = {"request_id": request_id, "generation": generation, "moves": moves,
                                "leased": leased}
        if deadline_unix_s is not None:
            body["deadline_unix_s"] = deadline_unix_s
        return self.request("POST", "/v1/assign", json=body)

    def split(self, *, request_id: str, generation: int, gpu_uuid: str, parts: int) -> dict[str, Any]:
        """POST /v1/split: split one GPU into `parts` equal slices (none may be leased)."""
        return self.request("POST", "/v1/split", json={
            "request_id": request_id, "generation": generation, "gpu_uuid": gpu_uuid, "parts": parts})

    def request_result(self, request_id: str) -> dict[str, Any] | None:
        """GET /v1/requests/{id}: the answer recorded for that request id, None if never seen."""
        # quoted whole: an id holding "/", "?", "#" or "%" must reach the daemon as it is
        return self.request("GET", f"/v1/requests/{urllib.parse.quote(request_id, safe='')}", ok_404=True)

    # -- leases (docs/ARCHITECTURE.md, "Leases")

    def grant_lease(self, *, request_id: str, department: str, owner: str, ttl_s: float,
                    slices: int | None = None, gpus: float | None = None,
                    slice_ids: list[str] | None = None, attach: str | None = None) -> dict[str, Any]:
        """POST /v1/leases with exactly one of slices / gpus / slice_ids; returns ``{"lease",
        "generation", "token", "endpoint", "attach"}`` (the token is in this answer only).
        NodeError codes: insufficient_slices, wrong_owner, slice_leased, worker_start_failed, ..."""
        body: dict[str, Any] = {"request_id": request_id, "department": department, "owner": owner,
                                "ttl_s": ttl_s}
        if slices is not None:
            body["slices"] = slices
        if gpus is not None:
            body["gpus"] = gpus
        if slice_ids is not None:
            body["slice_ids"] = slice_ids
        if attach is not None:
            body["attach"] = attach  # "native": no worker; the answer's "env" pins a program to the slice
        return self.request("POST", "/v1/leases", json=body)

    def record_processes(self, lease_id: str, pids: list[int]) -> dict[str, Any]:
        """POST /v1/leases/{id}/processes: a native lease's program runs as `pids` on the node;
        returns ``{"lease_id", "pids"}``. NodeError codes: unknown_process, forbidden, invalid_field."""
        return self.request("POST", f"/v1/leases/{lease_id}/processes", json={"pids": pids})

    def transport(self) -> Any:
        """The node's open transport (LocalTransport or SshTransport), opened if need be."""
        with self._lock:
            self._http()
            return self._transport

    def heartbeat_lease(self, lease_id: str) -> dict[str, Any]:
        """POST /v1/leases/{id}/heartbeat: ``{"lease_id", "heartbeat_s", "expires_s"}`` (Unix s).
        NodeError code unknown_lease / lease_ended when the lease is gone."""
        return self.request("POST", f"/v1/leases/{lease_id}/heartbeat", json={})

    def release_lease(self, lease_id: str) -> dict[str, Any]:
        """DELETE /v1/leases/{id}: ``{"released", "slice_ids", "drained", "generation"}``.
        NodeError code unknown_lease when this node has no such lease."""
        return self.request("DELETE", f"/v1/leases/{lease_id}")

    def leases(self) -> list[dict[str, Any]]:
        """GET /v1/leases: the node's leases (Lease JSON plus worker_pid, worker_alive, gpu_index, usage)."""
        return list(self.request("GET", "/v1/leases")["leases"])

    # -- schedule and audit (docs/ARCHITECTURE.md, "Schedule", "Audit log")

    def schedule_add(self, entry: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/schedule: install a scheduled move; ``{"entry", "replayed"}``."""
        return self.request("POST", "/v1/schedule", json=entry)

    def schedule(self) -> dict[str, Any]:
        """GET /v1/schedule: ``{"now_s", "entries"}``."""
        return self.request("GET", "/v1/schedule")

    def schedule_cancel(self, entry_id: str) -> dict[str, Any] | None:
        """DELETE /v1/schedule/{id}: ``{"entry"}``; None when this node has no such entry."""
        return self.request("DELETE", f"/v1/schedule/{urllib.parse.quote(entry_id, safe='')}", ok_404=True)

    def audit(self, since_s: float | None = None, limit: int | None = None) -> dict[str, Any]:
        """GET /v1/audit: ``{"node", "records", "truncated", "problems"}``: the node's newest
        `limit` records (the daemon's maximum when None) since `since_s` (Unix seconds)."""
        params: dict[str, str] = {}
        if since_s is not None:
            params["since_s"] = f"{since_s:.3f}"
        if limit is not None:
            params["limit"] = str(int(limit))
        return self.request("GET", "/v1/audit", params=params or None)

    def close(self) -> None:
        """Close the node's connection now, without waiting for a request in flight (which then
        fails with a NodeError): quitting the console never waits on a hung node."""
        self._drop_transport()


@dataclass
class FanOutResult:
    """Per-node outcome of a fan-out: values by node name, errors (NodeError) by node name."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, NodeError] = field(default_factory=dict)


class FleetClient:
    """Every configured node's NodeClient, with bounded parallel fan-out.

    config: the fleet config (nodes, departments, max_parallel). transport_factory: opens a
    transport per node (default: `gpuctl.transport.open_transport`). Implements the console's
    FleetSource protocol. A node still busy with an earlier call is reported as "slow" rather
    than queued twice.
    """

    #: Seconds a node may run past its own timeout_s (its transport's own timeouts end the call
    #: by then) before the fan-out reports it as a timeout and stops waiting for it.
    DEADLINE_SLACK_S = 1.0

    def __init__(self, config: FleetConfig, transport_factory: TransportFactory | None = None):
        self.config = config
        self._factory = transport_factory or default_transport_factory()
        self.clients = {n.name: NodeClient(n, self._factory) for n in config.nodes}
        # One thread per node at most: a node is never called twice at once (see _busy), and a node
        # given up on at its deadline keeps its thread until its transport times out, while the
        # fan-out starts the next node in its place. Threads are made only when needed.
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, config.max_parallel, len(self.clients)),
                                           thread_name_prefix="gpuctl-node")
        self._busy: dict[str, cf.Future] = {}
        self._busy_lock = threading.Lock()

    @property
    def departments(self) -> list[Department]:
        """Departments of the fleet config, in config order."""
        return [Department(d.name, d.priority, d.color) for d in self.config.departments]

    def fan_out(self, fn: Callable[[NodeClient], T], nodes: list[str] | None = None) -> FanOutResult:
        """Run fn(node_client) on each node (all, or those named), at most max_parallel at once.

        Each node's deadline counts from when its own call starts: its timeout_s plus
        DEADLINE_SLACK_S. A node not done by then gets NodeError(code="timeout", "no answer within
        T s") and the next node starts in its place, so a large fleet's tail is never timed out
        before it was asked. Nodes whose previous call is still running are not called again and get
        NodeError(code="timeout", "still busy with the previous request"). Every other error is the
        node's own (NodeError from fn, or code "error" for anything else fn raised).
        """
        names = nodes if nodes is not None else list(self.clients)
        out = FanOutResult()
        waiting: list[str] = []
        with self._busy_lock:
            for name in names:
                prev = self._busy.get(name)
                if prev is not None and not prev.done():
                    out.errors[name] = NodeError(
                        name, f"node {name}: still busy with the previous request (slow node)",
                        code="timeout")
                    continue
                waiting.append(name)
        waiting.reverse()  # pop() from the end keeps config order
        running: dict[cf.Future, tuple[str, float]] = {}
        limit = max(1, self.config.max_parallel)
        while waiting or running:
            while waiting and len(running) < limit:
                name = waiting.pop()
                fut = self._pool.submit(fn, self.clients[name])
                with self._busy_lock:
                    self._busy[name] = fut
                deadline = time.monotonic() + self.clients[name].node.timeout_s + self.DEADLINE_SLACK_S
                running[fut] = (name, deadline)
            first_deadline = min(d for _, d in running.values())
            done, _ = cf.wait(running, timeout=max(0.0, first_deadline - time.monotonic()),
                              return_when=cf.FIRST_COMPLETED)
            for fut in done:
                name, _ = running.pop(fut)
                exc = fut.exception()
                if exc is None:
                    out.values[name] = fut.result()
                elif isinstance(exc, NodeError):
                    out.errors[name] = exc
                else:
                    out.errors[name] = NodeError(name, f"node {name}: {exc}", code="error")
            now = time.monotonic()
            for fut, (name, deadline) in list(running.items()):
                if now >= deadline and not fut.done():
                    del running[fut]
                    out.errors[name] = NodeError(
                        name, f"node {name}: no answer within {self.clients[name].node.timeout_s:g} s",
                        code="timeout")
        return out

    def snapshot(self, nodes: list[str] | None = None) -> FleetSnapshot:
        """GET /v1/status of every node (or those named), merged in config order.

        Blocking (network): call it from a worker thread in the console. Unreachable and slow
        nodes appear with reachable=False and the reason in `error`.
        """
        res = self.fan_out(lambda c: c.status(), nodes)
        names = nodes if nodes is not None else list(self.clients)
        merged = []
        for name in names:
            if name in res.values:
                merged.append(res.values[name])
            else:
                err = res.errors[name]
                merged.append(NodeStatus(name=name, reachable=False, error=str(err),
                                         error_code=err.code))
        return FleetSnapshot(nodes=merged, taken_at_s=time.time())

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[GpuSample]]:
        """The daemon's telemetry history of one GPU since a cursor (blocking). Raises NodeError."""
        return self.clients[node].history(uuid, since)

    def close(self) -> None:
        """Close every node's connection and the thread pool."""
        for c in self.clients.values():
            c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
