"""gpuctld's leases: grant, heartbeat, release, expiry, and the data-path worker of each lease.

:class:`LeaseManager` owns the leases of one node while the daemon runs. The durable record of a
lease (its slices, owner, ttl, endpoint) lives in the node state (``NodeStateManager.add_lease``
/ ``remove_lease``, written to disk before the API answers); what is live only in memory is the
worker process of each lease, the heartbeat (``heartbeat_s``, ``expires_s``: heartbeats are not
written to the state file, so they never bump the generation that admins' changes quote) and a
sha256 of the token (the token itself is shown once, in the grant's answer, and never stored).

Rules:

- A lease holds idle slices of one department on one GPU (slice choice: :mod:`gpuctl.leasing`);
  a native lease given explicit ``slice_ids`` may hold several whole GPUs (a multi-GPU job's part
  on this node, gpuctl.fleet.job): CUDA_VISIBLE_DEVICES lists their UUIDs.
  Its worker (``gpuctl.datapath.launcher.start_worker``) sees only that GPU, pinned by UUID
  (CUDA_VISIBLE_DEVICES = the GPU's UUID, CUDA_DEVICE_ORDER=PCI_BUS_ID; never the NVML index),
  with memory quota = sum of the slices' ``memory_quota_bytes`` and compute share = sum of their
  ``compute_share`` (at most 1). A fractional lease uses its GPU's MPS daemon (gpuctl.daemon.mps).
- A native lease (``attach = "native"``) has no worker: its client runs the program on the node
  with the grant's ``env`` and records the pids (gpuctl.daemon.native); a revoke, an expiry or
  shutdown ends those processes (SIGTERM, then SIGKILL after ``native_grace_s``).
- The worker is started first, then the lease is written (with its endpoint); if the write is
  refused the worker is stopped. A refused grant changes nothing.
- A worker never outlives its lease: it is stopped on release, expiry (the monitor thread checks
  every ``check_interval_s``), revoke (a reassignment with ``leased=revoke`` ends the lease in
  the state; the wrapped /v1/assign then stops the worker before answering), and daemon shutdown.
  The worker also exits by itself at its deadline and when the daemon's control pipe closes
  (daemon killed). A worker that dies on its own ends its lease (slices idle again).
- Restart: a lease found in the state at start-up has no worker any more (its worker exited when
  the old daemon's pipe closed), so it is ended (:meth:`LeaseManager.restore`): its slices are
  idle and drained moves waiting on it are applied. Its client gets a connection error.
- Request ids of grants are remembered in memory (the last 1000): a grant retried with the same
  request id is refused with ``request_id_reused`` naming the lease (its token cannot be shown
  twice); that lease, never heartbeated, ends at its ttl.

Per-slice accounting (:meth:`LeaseManager.usage_by_slice`): the worker's stats.json
(``memory_in_use_bytes``, ``ops_per_s``, ``bytes_in``, ``bytes_out``, see
``gpuctl.datapath.accounting``) split over the lease's slices in proportion to their fractions
(a one-slice lease gets the worker's figures as they are); None while the worker has not written
stats yet (never a made-up zero).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import secrets
import shutil
import signal
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable

from gpuctl.daemon.api import ApiRequest, ControlApi
from gpuctl.daemon.errors import (  # noqa: F401 - re-exported
    ApiError,
    InsufficientSlices,
    LeaseEnded,
    LeaseRevoked,
    MpsUnavailable,
    WorkerStartFailed,
)
from gpuctl.daemon.fields import get_field, no_unknown_fields, request_id_field
from gpuctl.daemon.host_memory import HostMemoryCap
from gpuctl.daemon.state import (
    GpuMissing,
    InvalidRequest,
    NodeStateManager,
    RequestIdReused,
    SliceLeased,
    SliceNotLeasable,
    StateError,
    StateWriteError,
    UnknownLease,
    UnknownSlice,
    WrongOwner,
)
from gpuctl.leasing import best_pick, describe_amount, describe_idle, validate_amount
from gpuctl.model import UNASSIGNED, GpuIdentity, Lease, Slice

log = logging.getLogger("gpuctld.leases")

#: Shortest and longest lease ttl accepted, seconds.
MIN_TTL_S = 1.0
MAX_TTL_S = 86400.0
#: ttl of a grant that does not say, seconds.
DEFAULT_TTL_S = 60.0
#: Longest owner string accepted ("user@host"), characters.
MAX_OWNER_CHARS = 200
#: How many grant request ids are remembered.
MAX_REMEMBERED_REQUESTS = 1000
#: Lease ids are generated as "lease-<12 hex>"; ids in paths must match this.
LEASE_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
#: Executors a worker may use.
EXECUTORS = ("numpy", "cupy")
#: The four per-slice usage figures, from the worker's stats.
USAGE_KEYS = ("memory_in_use_bytes", "ops_per_s", "bytes_in", "bytes_out")


@dataclass
class GrantRequest:
    """A validated POST /v1/leases body. Exactly one of slices / slice_ids / gpus is set."""

    request_id: str
    department: str
    owner: str
    ttl_s: float
    slices: int | None = None
    slice_ids: list[str] | None = None
    gpus: float | None = None
    attach: str = "remote"


#: How a lease attaches: "remote" (a data-path worker) or "native" (the client runs its program on
#: the node, pinned to the slice; see gpuctl.daemon.native).
ATTACH_KINDS = ("remote", "native")
#: Why a lease ended when a reassignment with leased=revoke took its slices.
REVOKED = "revoked: a reassignment took its slices (gpuctl reassign --revoke)"
#: How many ended leases' reasons are remembered (for the message of a late heartbeat).
MAX_REMEMBERED_ENDINGS = 1000


def parse_grant(data: dict[str, Any]) -> GrantRequest:
    """Validate a POST /v1/leases body; raises ApiError 400 naming the field.

    Fields: request_id (str), department (str), owner (str, "user@host"), ttl_s (seconds,
    MIN_TTL_S..MAX_TTL_S, default DEFAULT_TTL_S), and exactly one of slices (int 1..8), slice_ids
    (list of slice ids of one GPU) and gpus (GPU-equivalents, 0 < X <= 1); attach ("remote",
    the default, or "native").
    """
    no_unknown_fields(data, {"request_id", "department", "owner", "ttl_s", "slices", "slice_ids", "gpus", "attach"})
    rid = request_id_field(data)
    dept = get_field(data, "department", str, "department")
    if dept.casefold() == UNASSIGNED.casefold():
        raise ApiError(400, "invalid_field", "unassigned slices belong to no department and cannot be leased: "
                       "reassign them to a department first", "department")
    owner = get_field(data, "owner", str, "owner")
    if len(owner) > MAX_OWNER_CHARS:
        raise ApiError(400, "invalid_field", f"owner is longer than {MAX_OWNER_CHARS} characters", "owner")
    ttl = data.get("ttl_s", DEFAULT_TTL_S)
    if not _is_number(ttl) or not MIN_TTL_S <= ttl <= MAX_TTL_S:
        raise ApiError(400, "invalid_field",
                       f"ttl_s must be a number of seconds {MIN_TTL_S:g}..{MAX_TTL_S:g}, got {ttl!r}", "ttl_s")
    given = [k for k in ("slices", "slice_ids", "gpus") if k in data]
    if len(given) != 1:
        raise ApiError(400, "missing_field" if not given else "invalid_field",
                       "give exactly one of slices (a count), slice_ids (a list) and gpus (GPU-equivalents)"
                       + (f"; got {', '.join(given)}" if given else ""), given[1] if len(given) > 1 else "slices")
    attach = data.get("attach", "remote")
    if attach not in ATTACH_KINDS:
        raise ApiError(400, "invalid_field", f"attach must be one of {', '.join(ATTACH_KINDS)}, got {attach!r}",
                       "attach")
    req = GrantRequest(request_id=rid, department=dept, owner=owner, ttl_s=float(ttl), attach=attach)
    if "slice_ids" in data:
        ids = get_field(data, "slice_ids", list, "slice_ids")
        if not ids:
            raise ApiError(400, "invalid_field", "slice_ids must name at least one slice", "slice_ids")
        for i, sid in enumerate(ids):
            if not isinstance(sid, str) or not sid:
                raise ApiError(400, "invalid_field", f"slice_ids[{i}] must be a slice id string", f"slice_ids[{i}]")
        if len(set(ids)) != len(ids):
            raise ApiError(400, "invalid_field", "slice_ids names a slice twice", "slice_ids")
        req.slice_ids = list(ids)
        return req
    try:
        if "slices" in data:
            n = get_field(data, "slices", int, "slices")
            validate_amount(n, None)
            req.slices = n
        else:
            x = data["gpus"]
            if not _is_number(x):
                raise ValueError(f"gpus must be a number of GPU-equivalents, got {x!r}")
            validate_amount(None, float(x))
            req.gpus = float(x)
    except ValueError as e:
        raise ApiError(400, "invalid_field", str(e), "slices" if "slices" in data else "gpus") from None
    return req


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class LiveLease:
    """A lease with a running worker. lease: the lease with live heartbeat_s/expires_s (Unix s).
    handle: the worker (``gpuctl.datapath.launcher.WorkerHandle``). token_sha256: hex sha256 of
    the token. request_id: the grant's request id. gpu_index: NVML index of its GPU (shown, never
    used to pin). gpu_uuid: its GPU's UUID. attach: "remote" | "native" (handle is then a
    gpuctl.daemon.native.NativeHandle). mps: True while it uses its GPU's MPS daemon. warnings:
    what the grant answered as warnings (e.g. time-sliced for want of MPS)."""

    lease: Lease
    handle: Any
    token_sha256: str
    request_id: str
    gpu_index: int
    gpu_uuid: str = ""
    attach: str = "remote"
    mps: bool = False
    warnings: list[str] | None = None
    fractional: bool = False


def format_host(host: str) -> str:
    """A host for "host:port": IPv6 addresses in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class LeaseManager:
    """The leases of one node and their workers (thread-safe; one lock around changes).

    state: the node's state manager. gpus: the backend's GPUs (UUID -> index; slices of other
    GPUs are never leased). executor: "numpy" | "cupy". bind: address the workers listen on.
    advertise: the host put in endpoints and attach strings. worker_user: run workers as this
    user (only when gpuctld is root; None: as gpuctld's own user). hostname: for messages.
    start_worker: the launcher (``gpuctl.datapath.launcher.start_worker`` by default).
    check_interval_s: how often the monitor thread looks for expired leases and dead workers.
    clock: Unix time, seconds. mps: the node's MPS manager (gpuctl.daemon.mps.MpsManager; None:
    no MPS). simulated: the backend is simulated (native leases get the MPS variables all the
    same, computed, so tests and the demo show them). native_grace_s: seconds between SIGTERM and
    SIGKILL when a native lease's processes are ended. device_uuid: slice id -> MIG device UUID
    for slices that are MIG devices (native programs are pinned to it instead of the GPU's).
    gpu_processes: GPU UUID -> the latest sample's process list (GpuSample.processes); with it,
    the monitor keeps one CUDA process per fractional native lease (:meth:`one_client_each`).
    """

    def __init__(
        self,
        state: NodeStateManager,
        gpus: list[GpuIdentity],
        *,
        executor: str,
        bind: str = "127.0.0.1",
        advertise: str | None = None,
        worker_user: str | None = None,
        hostname: str = "this node",
        start_worker: Callable[..., Any] | None = None,
        check_interval_s: float = 0.2,
        quota_cap: HostMemoryCap | None = None,
        clock: Callable[[], float] = time.time,
        mps: Any = None,
        simulated: bool = False,
        native_grace_s: float = 5.0,
        device_uuid: dict[str, str] | None = None,
        gpu_processes: Callable[[], dict[str, list[dict[str, Any]] | None]] | None = None,
    ):
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
        self.state = state
        self.gpu_index = {g.uuid: g.index for g in gpus}
        self.executor = executor
        self.bind = bind
        self.advertise = advertise or bind
        self.worker_user = worker_user
        self.hostname = hostname
        #: Cap of NumPy-executor lease quotas (host memory); None: slices' quotas as they are.
        self.quota_cap = quota_cap if executor == "numpy" else None
        if start_worker is None:
            from gpuctl.datapath.launcher import start_worker as _start

            start_worker = _start
        self._start_worker = start_worker
        self.check_interval_s = check_interval_s
        self.clock = clock
        self._lock = threading.RLock()
        self._live: dict[str, LiveLease] = {}
        self._requests: OrderedDict[str, str] = OrderedDict()
        self._unfinished: set[str] = set()  # leases whose worker stopped but whose state write failed
        self.mps = mps
        self.simulated = simulated
        self.native_grace_s = native_grace_s
        self.device_uuid = dict(device_uuid or {})
        self.gpu_processes = gpu_processes
        self._ended_extra: set[tuple[str, int]] = set()
        self._endings: OrderedDict[str, str] = OrderedDict()  # lease id -> why it ended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def restore(self) -> list[str]:
        """End every lease found in the state (start-up: no worker of a former daemon survives).

        Returns the ids ended. Raises StateWriteError when the state cannot be written.
        """
        ended = []
        for lease in self.state.snapshot().leases.values():
            applied = self.state.remove_lease(lease.id)
            log.warning("lease %s (%s, %s, slices %s) ended at start-up: its worker did not survive the "
                        "daemon's restart; the slices are idle%s", lease.id, lease.owner, lease.department,
                        ", ".join(lease.slice_ids),
                        f"; drained moves applied to {', '.join(applied)}" if applied else "")
            ended.append(lease.id)
        return ended

    def start(self) -> None:
        """Start the monitor thread (expiry, dead workers, revoked leases)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._monitor, name="gpuctld-leases", daemon=True)
            self._thread.start()

    def close(self) -> list[str]:
        """Stop the monitor, stop every worker and end their leases (daemon shutdown). Returns the
        ids ended; never raises (a failed state write is logged: restart ends the lease)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        ended = []
        for lid in list(self._live):
            try:
                self.end(lid, "daemon stopped")
                ended.append(lid)
            except StateError as e:
                log.error("lease %s: %s", lid, e.message)
        return ended

    def install(self, api: ControlApi) -> None:
        """Register the lease routes on `api` like its own, and two hooks: GET /v1/status gets
        each slice's usage and the leases' live expiry (:meth:`add_to_status`), and after POST
        /v1/assign the workers of leases a revoke ended are stopped (:meth:`sync`)."""
        api.status_hooks.append(self.add_to_status)
        api.assign_hooks.append(self.sync)
        api.add_route("POST", "/v1/leases", self.api_grant)
        api.add_route("GET", "/v1/leases", self.api_list)
        api.add_route("GET", "/v1/leases/", self.api_get, prefix=True)
        api.add_route("POST", "/v1/leases/", self.api_heartbeat, prefix=True)
        api.add_route("DELETE", "/v1/leases/", self.api_release, prefix=True)

    # ------------------------------------------------------------------ operations

    def grant(self, req: GrantRequest, caller_uid: int | None = None) -> dict[str, Any]:
        """Grant a lease: choose idle slices, start the worker (remote attach), write the lease, answer.

        caller_uid: uid of the API peer (the user of a native lease's program; None: unknown,
        gpuctld's own uid is assumed). Returns ``{"lease": Lease.to_json(), "generation", "token":
        hex, "endpoint": "host:port" (None for native), "attach": "tcp://host:port?lease=ID&token=HEX"
        (None for native), "attach_kind": "remote" | "native", "gpu_index": NVML index of its (first)
        GPU, "gpu_uuid", "gpu_uuids" / "gpu_indices" (every GPU of the lease: several only for a native
        lease of whole GPUs given by slice_ids), "device_uuid" (the MIG device UUID for a MIG slice,
        the GPUs' UUIDs joined by "," for a multi-GPU lease, else the GPU's), "mps": bool
        (an MPS daemon caps it), "warnings": [str], "env": {name: value} (native: what the program
        gets, see gpuctl.daemon.native.native_env), "data_address" (native: the node's data-path
        advertise address, where a distributed job's rendezvous is reached)}``.
        Raises RequestIdReused, InsufficientSlices, UnknownSlice, WrongOwner, SliceLeased,
        GpuMissing, InvalidRequest (slice_ids on several GPUs), MpsUnavailable, WorkerStartFailed,
        StateWriteError; nothing changes when it raises.
        """
        with self._lock:
            prior = self._requests.get(req.request_id)
            if prior is not None:
                raise RequestIdReused(
                    f"request id {req.request_id!r} already granted lease {prior}; its token was shown only in "
                    f"that answer: release {prior} and ask again with a new request id", field="request_id")
            snap = self.state.snapshot()
            chosen = (self._explicit(snap.slices, req) if req.slice_ids is not None
                      else self._choose(list(snap.slices.values()), req))
            gpu_uuid = chosen[0].gpu_uuid
            gpu_index = self.gpu_index[gpu_uuid]
            gpu_uuids = list(dict.fromkeys(s.gpu_uuid for s in chosen))  # several: a native multi-GPU lease
            device_uuid = self.device_uuid.get(chosen[0].id, gpu_uuid) if len(chosen) == 1 else ",".join(gpu_uuids)
            quota = sum(s.memory_quota_bytes for s in chosen)
            # the cap bounds host memory a NumPy worker may hold; a native program holds none of it here
            quota, quota_note = (self.quota_cap.apply(quota) if self.quota_cap and req.attach != "native"
                                 else (quota, None))
            share = min(1.0, sum(s.compute_share for s in chosen))
            fractional = sum(s.fraction for s in chosen) < 1.0 - 1e-9 and device_uuid == gpu_uuid
            now = self.clock()
            lease_id = f"lease-{secrets.token_hex(6)}"
            token = secrets.token_bytes(32)
            expires = now + req.ttl_s
            warnings: list[str] = []
            mps_daemon = None
            if fractional and self.mps is not None:
                uid = caller_uid if req.attach == "native" and caller_uid is not None else self._worker_uid()
                from gpuctl.daemon.mps import MpsError

                try:
                    mps_daemon = self.mps.acquire(gpu_uuid, lease_id, uid)
                except MpsError as e:
                    raise MpsUnavailable(f"{e}; nothing was leased", field="gpus" if req.gpus is not None
                                         else "slices") from None
                if mps_daemon is None and self.mps.mode == "auto" and getattr(self.mps, "last_error", None):
                    warnings.append(f"time-sliced, without MPS caps: {self.mps.last_error}")
            try:
                handle, endpoint = self._start_attach(req, lease_id, token, quota, share, gpu_uuid, gpu_index,
                                                      expires, mps_daemon)
            except BaseException:
                if mps_daemon is not None:
                    self.mps.release(gpu_uuid, lease_id)
                raise
            # the ttl counts from now, when the lease is in place: a worker that took seconds to
            # start (a loaded node) must not leave a lease that has expired before it is answered
            now = self.clock()
            expires = now + req.ttl_s
            try:
                handle.extend(expires)
            except ProcessLookupError:
                self._stop_worker(handle, lease_id, "worker exited at start")
                if mps_daemon is not None:
                    self.mps.release(gpu_uuid, lease_id)
                raise WorkerStartFailed(
                    f"the data-path worker for a lease on GPU {gpu_index} ({gpu_uuid}) of {self.hostname} exited "
                    f"right after it started; nothing was leased") from None
            lease = Lease(id=lease_id, department=req.department, slice_ids=[s.id for s in chosen],
                          owner=req.owner, ttl_s=req.ttl_s, created_s=now, heartbeat_s=now,
                          expires_s=expires, endpoint=endpoint)
            try:
                generation = self.state.add_lease(lease)
            except BaseException:
                self._stop_worker(handle, lease_id, "grant refused")
                if mps_daemon is not None:
                    self.mps.release(gpu_uuid, lease_id)
                raise
            self._live[lease_id] = LiveLease(lease=replace(lease, slice_ids=list(lease.slice_ids)), handle=handle,
                                             token_sha256=hashlib.sha256(token).hexdigest(),
                                             request_id=req.request_id, gpu_index=gpu_index, gpu_uuid=gpu_uuid,
                                             attach=req.attach, mps=mps_daemon is not None, warnings=warnings,
                                             fractional=fractional)
            self._requests[req.request_id] = lease_id
            while len(self._requests) > MAX_REMEMBERED_REQUESTS:
                self._requests.popitem(last=False)
            log.info("lease %s granted to %s (%s attach): %s slices %s on GPU %d %s (quota %d bytes, compute share "
                     "%g%s), %s, ttl %g s", lease_id, req.owner, req.attach, req.department, ", ".join(lease.slice_ids),
                     gpu_index, gpu_uuid, quota, share, ", MPS" if mps_daemon is not None else "",
                     f"worker pid {handle.pid} at {endpoint}" if endpoint else "no worker", req.ttl_s)
            for w in warnings:
                log.warning("lease %s: %s", lease_id, w)
            answer = {"lease": lease.to_json(), "generation": generation, "token": token.hex(),
                      "endpoint": endpoint, "attach": f"tcp://{endpoint}?lease={lease_id}&token={token.hex()}"
                      if endpoint else None, "attach_kind": req.attach, "gpu_index": gpu_index,
                      "gpu_uuid": gpu_uuid, "device_uuid": device_uuid, "mps": mps_daemon is not None,
                      "gpu_uuids": gpu_uuids, "gpu_indices": [self.gpu_index[u] for u in gpu_uuids],
                      "warnings": warnings, "memory_quota_bytes": quota, "compute_share": share,
                      "quota_bytes": quota, "gpu_equivalents": round(sum(s.fraction for s in chosen), 9)}
            if quota_note is not None:
                answer["quota_cap"] = quota_note
            if req.attach == "native":
                from gpuctl.daemon.native import native_env

                answer["data_address"] = self.advertise  # where a distributed job's rendezvous is reached

                pipe = log_dir = None
                if mps_daemon is not None:
                    pipe, log_dir = str(mps_daemon.pipe_dir), str(mps_daemon.log_dir)
                elif self.simulated and self.mps is not None and self.mps.mode == "off":
                    # no GPU here: the directories a daemon would have, computed, so the demo shows them
                    pipe, log_dir = (str(p) for p in self.mps.dirs(gpu_uuid))
                answer["env"] = native_env(device_uuid=device_uuid, quota_bytes=quota, compute_share=share,
                                           fractional=fractional, pipe_dir=pipe, log_dir=log_dir)
            return answer

    def _worker_uid(self) -> int:
        if self.worker_user is not None:
            import pwd

            try:
                return pwd.getpwnam(self.worker_user).pw_uid
            except KeyError:
                pass
        return os.geteuid()

    def _start_attach(self, req: GrantRequest, lease_id: str, token: bytes, quota: int, share: float,
                      gpu_uuid: str, gpu_index: int, expires: float, mps_daemon: Any) -> tuple[Any, str | None]:
        """(handle, endpoint): a data-path worker for remote attach, a NativeHandle for native."""
        if req.attach == "native":
            from gpuctl.daemon.native import NativeHandle

            return NativeHandle(lease_id=lease_id, grace_s=self.native_grace_s), None
        from gpuctl.datapath.launcher import READY_TIMEOUT_S

        extra: dict[str, Any] = {}
        if mps_daemon is not None:
            extra["mps_pipe_dir"] = str(mps_daemon.pipe_dir)
        try:
            # the worker's first deadline leaves room for its own start (the launcher waits up to
            # READY_TIMEOUT_S); grant() then moves it to the lease's expiry
            handle = self._start_worker(
                lease_id=lease_id, token=token, quota_bytes=quota, compute_share=share,
                executor=self.executor, gpu_uuid=gpu_uuid, bind=self.bind, port=0,
                expires_at_s=expires + READY_TIMEOUT_S, run_as_user=self.worker_user, **extra)
        except Exception as e:  # noqa: BLE001 - any launcher failure refuses the grant, cleanly
            raise WorkerStartFailed(
                f"the data-path worker for a lease on GPU {gpu_index} ({gpu_uuid}) of {self.hostname} did not "
                f"start: {type(e).__name__}: {e}; nothing was leased") from e
        port = handle.endpoint.rsplit(":", 1)[-1]
        return handle, f"{format_host(self.advertise)}:{port}"

    def _choose(self, slices: list[Slice], req: GrantRequest) -> tuple[Slice, ...]:
        pick = best_pick(slices, req.department, self.gpu_index, count=req.slices, gpus=req.gpus)
        if pick is None:
            raise InsufficientSlices(
                f"node {self.hostname}: no GPU has free slices of department {req.department!r} covering "
                f"{describe_amount(req.slices, req.gpus)} (a lease holds slices of one GPU); free slices of "
                f"{req.department}: {describe_idle(slices, req.department, self.gpu_index)}",
                field="slices" if req.slices is not None else "gpus")
        return pick.slices

    def _explicit(self, slices: dict[str, Slice], req: GrantRequest) -> tuple[Slice, ...]:
        chosen = []
        for i, sid in enumerate(req.slice_ids or []):
            where = f"slice_ids[{i}]"
            s = slices.get(sid)
            if s is None:
                raise UnknownSlice(f"{where}: no slice {sid!r} on node {self.hostname}", field=where)
            if s.department != req.department:
                raise WrongOwner(f"{where}: slice {sid} is owned by {s.department!r}, not {req.department!r}",
                                 field=where)
            if s.lease_id is not None:
                raise SliceLeased(f"{where}: slice {sid} is already leased (lease {s.lease_id})", field=where)
            if s.not_leasable_reason:
                raise SliceNotLeasable(f"{where}: {s.not_leasable_reason}", field=where)
            if s.gpu_uuid not in self.gpu_index:
                raise GpuMissing(f"{where}: GPU {s.gpu_uuid} of slice {sid} is not reported by the backend",
                                 field=where)
            chosen.append(s)
        gpus = sorted({s.gpu_uuid for s in chosen})
        if len(gpus) > 1:
            whole = all(s.fraction >= 1 - 1e-9 and not s.mig for s in chosen) and len(gpus) == len(chosen)
            if req.attach != "native" or not whole:
                raise InvalidRequest(f"slice_ids are on {len(gpus)} GPUs ({', '.join(gpus)}); a lease holds slices "
                                     f"of one GPU (only a native lease may hold several whole GPUs, one slice "
                                     f"each)", field="slice_ids")
        return tuple(chosen)

    def heartbeat(self, lease_id: str) -> dict[str, Any]:
        """Extend a lease by its ttl from now; returns ``{"lease_id", "heartbeat_s", "expires_s"}``.

        Raises UnknownLease (no such lease: it was released, expired or revoked), LeaseEnded (it
        expired, or its worker died, just now: it is ended by this call).
        """
        with self._lock:
            live = self._live.get(lease_id)
            if live is None:
                self._raise_ended(lease_id)
            now = self.clock()
            if now > live.lease.expires_s:
                self.end(lease_id, "expired")
                raise LeaseEnded(f"lease {lease_id} expired at {live.lease.expires_s:.3f} (no heartbeat within "
                                 f"its ttl of {live.lease.ttl_s:g} s); its slices are idle again", field="lease_id")
            expires = now + live.lease.ttl_s
            try:
                if not live.handle.alive():
                    raise ProcessLookupError
                live.handle.extend(expires)
            except ProcessLookupError:
                self.end(lease_id, "worker exited")
                raise LeaseEnded(f"lease {lease_id}: its data-path worker (pid {live.handle.pid}) has exited; "
                                 f"the lease is ended and its slices are idle", field="lease_id") from None
            live.lease.heartbeat_s = now
            live.lease.expires_s = expires
            return {"lease_id": lease_id, "heartbeat_s": now, "expires_s": expires}

    def _raise_ended(self, lease_id: str) -> None:
        """Raise LeaseRevoked when `lease_id` was revoked (the reason says by what), else
        UnknownLease (with the reason when this daemon remembers why it ended)."""
        why = self._endings.get(lease_id)
        if why is not None and why.startswith("revoked"):
            raise LeaseRevoked(f"lease {lease_id} on node {self.hostname} was {why}", field="lease_id")
        raise UnknownLease(f"no lease {lease_id!r} on node {self.hostname} ("
                           + (f"it ended: {why}" if why else "released, expired or revoked") + ")", field="lease_id")

    def _remember_ending(self, lease_id: str, reason: str) -> None:
        self._endings[lease_id] = reason
        while len(self._endings) > MAX_REMEMBERED_ENDINGS:
            self._endings.popitem(last=False)

    def _detach(self, live: LiveLease, reason: str) -> None:
        """Stop what a lease runs (worker, or native processes unless its client released it) and
        give back its GPU's MPS daemon."""
        lid = live.lease.id
        if live.attach == "native" and reason == "released":
            live.handle.gone.set()  # its client ends its own program; a release says the program has ended
        elif live.attach == "native":
            self._stop_native(live.handle, lid, reason)
        else:
            self._stop_worker(live.handle, lid, reason)
        if live.mps and self.mps is not None:
            if live.attach == "native" and not live.handle.gone.is_set():
                # quit the GPU's MPS daemon only once the lease's processes are gone (off the lock)
                def release_later(handle: Any = live.handle, gpu: str = live.gpu_uuid) -> None:
                    handle.gone.wait(self.native_grace_s + 5)
                    self.mps.release(gpu, lid)

                threading.Thread(target=release_later, daemon=True, name=f"gpuctld-mps-{lid}").start()
            else:
                self.mps.release(live.gpu_uuid, lid)
        self._remember_ending(lid, reason)

    def _stop_native(self, handle: Any, lease_id: str, reason: str) -> None:
        """SIGTERM a native lease's processes (SIGKILL after the grace); at daemon shutdown, wait."""
        n = handle.stop(wait=reason == "daemon stopped")
        log.info("lease %s: %d native process(es) signalled (%s)", lease_id, n, reason)

    def end(self, lease_id: str, reason: str) -> dict[str, Any]:
        """End a lease: stop its worker (first), then free its slices (drained moves applied).

        reason: words for the log ("released", "expired", "revoked", ...). Returns ``{"released":
        id, "slice_ids", "drained": [slice ids moved], "generation"}``. Raises UnknownLease,
        StateWriteError (the worker is stopped; the monitor retries the write).
        """
        with self._lock:
            live = self._live.pop(lease_id, None)
            if live is not None:
                self._detach(live, reason)
            snap_lease = self.state.snapshot().leases.get(lease_id)
            if snap_lease is None:
                self._unfinished.discard(lease_id)
                if live is None:
                    self._raise_ended(lease_id)
                return {"released": lease_id, "slice_ids": live.lease.slice_ids, "drained": [],
                        "generation": self.state.generation}
            try:
                drained = self.state.remove_lease(lease_id)
            except StateWriteError:
                self._unfinished.add(lease_id)
                raise
            self._unfinished.discard(lease_id)
            log.info("lease %s ended (%s): slices %s idle%s", lease_id, reason, ", ".join(snap_lease.slice_ids),
                     f"; drained moves applied to {', '.join(drained)}" if drained else "")
            return {"released": lease_id, "slice_ids": snap_lease.slice_ids, "drained": drained,
                    "generation": self.state.generation}

    def _stop_worker(self, handle: Any, lease_id: str, reason: str) -> None:
        died = not handle.alive()
        try:
            rc = handle.stop()
        except Exception as e:  # noqa: BLE001 - a worker that will not stop is killed by stop(); log the rest
            log.error("lease %s: stopping worker pid %s failed: %s", lease_id, handle.pid, e)
            rc = None
        if died and reason not in ("expired",):
            log.warning("lease %s: worker pid %s had exited by itself (status %s)%s", lease_id, handle.pid, rc,
                        _stderr_tail(handle))
        else:
            log.info("lease %s: worker pid %s stopped (%s, status %s)", lease_id, handle.pid, reason, rc)
        run_dir = getattr(handle, "run_dir", None)
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)

    def sync(self) -> list[str]:
        """Stop the workers of leases the state no longer holds (ended by a revoke). Returns their ids."""
        with self._lock:
            held = set(self.state.snapshot().leases)
            gone = [lid for lid in self._live if lid not in held]
            for lid in gone:
                live = self._live.pop(lid)
                self._detach(live, REVOKED)
                log.info("lease %s ended (revoked by a reassignment)", lid)
            return gone

    def check(self) -> list[tuple[str, str]]:
        """One monitor round: end leases past their expiry or whose worker died; retry state
        writes that failed. Returns [(lease id, reason)] ended."""
        ended = []
        now = self.clock()
        for lid, live in list(self._live.items()):
            if now > live.lease.expires_s:
                reason = "expired"
            elif not live.handle.alive():
                reason = "worker exited"
            else:
                continue
            try:
                self.end(lid, reason)
                ended.append((lid, reason))
            except UnknownLease:
                pass
            except StateError as e:
                log.error("lease %s (%s): %s", lid, reason, e.message)
        for lid in list(self._unfinished):
            try:
                self.end(lid, "retry")
            except StateError as e:
                log.error("lease %s: %s", lid, e.message)
        return ended

    def one_client_each(self) -> list[tuple[str, int]]:
        """Keep one CUDA process per fractional native lease (tests/cases/mps mps-01).

        The MPS memory cap is per client process, and a program's children inherit it: two CUDA
        processes of one lease would together hold twice the slice's quota. So when the GPU's
        process list shows more than one process of such a lease (its recorded pids and their
        descendants), every one but the earliest started gets SIGTERM, and the lease's warnings
        (GET /v1/leases) and the log say which and why. Returns [(lease id, pid)] ended this round.
        """
        if self.gpu_processes is None:
            return []
        from gpuctl.daemon.native import proc_start_time
        from gpuctl.daemon.outside import owner_map

        capped = {lid: live for lid, live in list(self._live.items()) if live.attach == "native" and live.fractional}
        if not capped:
            return []
        owners = owner_map({lid: live.handle.pids() for lid, live in capped.items()})
        per_lease: dict[str, list[int]] = {}
        for procs in (self.gpu_processes() or {}).values():
            for p in procs or ():
                lid = owners.get(p.get("pid"))
                if lid is not None and p["pid"] not in per_lease.setdefault(lid, []):
                    per_lease[lid].append(p["pid"])
        ended = []
        for lid, pids in per_lease.items():
            if len(pids) < 2:
                continue
            keep, *extra = sorted(pids, key=lambda pid: (proc_start_time(pid) or 0, pid))
            for pid in extra:
                if (lid, pid) in self._ended_extra:
                    continue
                self._ended_extra.add((lid, pid))
                msg = (f"process {pid} was ended: it was a second CUDA process of fractional lease {lid} (process "
                       f"{keep} is the first); the MPS memory cap holds per process, so two would together use "
                       f"twice the slice's quota: run one CUDA process per fractional lease")
                log.warning("lease %s: %s", lid, msg)
                live = capped[lid]
                live.warnings = [*(live.warnings or []), msg]
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError as e:
                    log.info("lease %s: SIGTERM to %d: %s", lid, pid, e)
                ended.append((lid, pid))
        return ended

    def _monitor(self) -> None:
        last_sync = 0.0
        while not self._stop.wait(self.check_interval_s):
            try:
                self.check()
                if time.monotonic() - last_sync >= 1.0:
                    self.sync()
                    self.one_client_each()
                    last_sync = time.monotonic()
            except Exception:  # noqa: BLE001 - the monitor must keep running
                log.exception("lease monitor round failed")

    # ------------------------------------------------------------------ reading

    def live_leases(self) -> dict[str, Lease]:
        """Copies of the live leases (with live heartbeat_s / expires_s), by id."""
        return {lid: replace(live.lease, slice_ids=list(live.lease.slice_ids))
                for lid, live in list(self._live.items())}

    def usage_by_slice(self, slices: dict[str, Slice] | None = None) -> dict[str, dict[str, Any] | None]:
        """Per leased slice: ``{"memory_in_use_bytes", "ops_per_s", "bytes_in", "bytes_out"}`` from
        its lease's worker stats, split by slice fraction (None before the first stats). Reads the
        workers' stats files without taking the lock (a grant may hold it for a second)."""
        if slices is None:
            slices = self.state.snapshot().slices
        out: dict[str, dict[str, Any] | None] = {}
        for live in list(self._live.values()):
            ids = [sid for sid in live.lease.slice_ids if sid in slices]
            stats = live.handle.stats() if hasattr(live.handle, "stats") else None
            if not ids:
                continue
            if not stats:
                out.update({sid: None for sid in ids})
                continue
            out.update(split_usage(stats, [slices[sid] for sid in ids]))
        return out

    # ------------------------------------------------------------------ API handlers

    def api_grant(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """POST /v1/leases: validate, then :meth:`grant`; 201 with lease, token, endpoint, attach."""
        req = parse_grant(request.json_object())
        request.note = f"request_id={req.request_id}"
        answer = self.grant(req, caller_uid=request.peer.uid)
        request.note += f" lease={answer['lease']['id']}"
        return 201, answer

    def api_list(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/leases: every lease of the node with live expiry, worker pid and usage."""
        snap = self.state.snapshot()
        return 200, {"generation": snap.generation,
                     "leases": [self._lease_json(lease, snap.slices) for lease in snap.leases.values()]}

    def api_get(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/leases/{id}: one lease (404 unknown_lease)."""
        lease_id = self._lease_id(request.path, allow_action=False)[0]
        snap = self.state.snapshot()
        lease = snap.leases.get(lease_id)
        if lease is None:
            raise UnknownLease(f"no lease {lease_id!r} on node {self.hostname}", field="lease_id")
        return 200, {"lease": self._lease_json(lease, snap.slices)}

    def api_heartbeat(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """POST /v1/leases/{id}/heartbeat (body empty or {}): :meth:`heartbeat`; POST
        /v1/leases/{id}/processes: :meth:`api_processes`."""
        lease_id, action = self._lease_id(request.path, allow_action=True)
        if action == "processes":
            return self.api_processes(request, lease_id)
        if action != "heartbeat":
            raise ApiError(404, "unknown_path", f"no such path: {request.path} (POST /v1/leases/ID/heartbeat "
                           f"or /v1/leases/ID/processes)")
        if request.body.strip():
            no_unknown_fields(request.json_object(), set())
        request.note = f"lease={lease_id}"
        return 200, self.heartbeat(lease_id)

    def api_processes(self, request: ApiRequest, lease_id: str) -> tuple[int, dict[str, Any]]:
        """POST /v1/leases/{id}/processes ``{"pids": [int, ...]}``: record a native lease's
        processes (live, of the caller's uid). 200 ``{"lease_id", "pids": every pid recorded}``;
        400 invalid_field (not a native lease, bad pid), 403 (another uid's process), 404
        (no such process, unknown lease), 410 lease_revoked."""
        from gpuctl.daemon.native import ProcessRefused

        data = request.json_object()
        no_unknown_fields(data, {"pids"})
        pids = get_field(data, "pids", list, "pids")
        request.note = f"lease={lease_id} pids={pids[:8]}"
        with self._lock:
            live = self._live.get(lease_id)
            if live is None:
                self._raise_ended(lease_id)
            assert live is not None
            if live.attach != "native":
                raise ApiError(400, "invalid_field", f"lease {lease_id} is a remote-attach lease: only native "
                               f"leases record processes", "pids")
            try:
                recorded = live.handle.register(pids, request.peer.uid)
            except ProcessRefused as e:
                raise ApiError(e.status, "invalid_field" if e.status == 400 else
                               ("forbidden" if e.status == 403 else "unknown_process"), e.message, e.field) from None
        return 200, {"lease_id": lease_id, "pids": recorded}

    def lease_pids(self) -> dict[str, list[int]]:
        """Lease id -> the pids it runs on this node now: a remote lease's worker, a native
        lease's recorded processes (without descendants: see gpuctl.daemon.native)."""
        out: dict[str, list[int]] = {}
        for lid, live in list(self._live.items()):
            if live.attach == "native":
                out[lid] = live.handle.pids()
            elif getattr(live.handle, "pid", None):
                out[lid] = [live.handle.pid]
        return out

    def api_release(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """DELETE /v1/leases/{id}: :meth:`end` ("released")."""
        lease_id = self._lease_id(request.path, allow_action=False)[0]
        request.note = f"lease={lease_id}"
        return 200, self.end(lease_id, "released")

    def add_to_status(self, body: dict[str, Any]) -> None:
        """Add to a GET /v1/status answer each slice's ``usage``, the leases' live expiry, and each
        GPU's processes split into ``lease_processes`` and ``outside_processes`` (gpuctl.daemon.outside)."""
        usage = self.usage_by_slice()
        from gpuctl.daemon.outside import owner_map, split_processes

        gpus = body.get("gpus", [])
        busy = any((g.get("sample") or {}).get("processes") for g in gpus)
        owners = owner_map(self.lease_pids()) if busy else {}
        for g in gpus:
            for s in g.get("slices", []):
                s["usage"] = usage.get(s["id"])
            g["lease_processes"], g["outside_processes"] = split_processes(
                (g.get("sample") or {}).get("processes"), owners)
        live = self.live_leases()
        for lj in body.get("leases", []):
            cur = live.get(lj.get("id"))
            if cur is not None:
                lj["heartbeat_s"], lj["expires_s"] = cur.heartbeat_s, cur.expires_s

    def _lease_id(self, path: str, *, allow_action: bool) -> tuple[str, str]:
        rest = path[len("/v1/leases/"):]
        lease_id, _, action = rest.partition("/")
        lease_id = urllib.parse.unquote(lease_id)
        if not LEASE_ID_RE.match(lease_id):
            raise ApiError(400, "invalid_field", f"lease id {lease_id[:120]!r} is not a lease id", "lease_id")
        if action and not allow_action:
            raise ApiError(404, "unknown_path", f"no such path: {path}")
        return lease_id, action

    def _lease_json(self, lease: Lease, slices: dict[str, Slice]) -> dict[str, Any]:
        live = self._live.get(lease.id)
        d = lease.to_json()
        d["worker_pid"] = live.handle.pid if live else None
        d["worker_alive"] = bool(live and live.handle.alive())
        d["gpu_index"] = live.gpu_index if live else None
        d["gpu_uuid"] = live.gpu_uuid if live else None
        d["attach_kind"] = live.attach if live else None
        d["mps"] = bool(live and live.mps)
        d["warnings"] = list(live.warnings or []) if live else []
        d["pids"] = live.handle.pids() if live and live.attach == "native" else None
        held = [slices[sid] for sid in lease.slice_ids if sid in slices]
        d["memory_quota_bytes"] = sum(s.memory_quota_bytes for s in held)  # what the lease has (not the card)
        d["compute_share"] = min(1.0, sum(s.compute_share for s in held))
        if live:
            d["heartbeat_s"], d["expires_s"] = live.lease.heartbeat_s, live.lease.expires_s
        stats = live.handle.stats() if live and hasattr(live.handle, "stats") else None
        d["usage"] = {k: stats.get(k) for k in USAGE_KEYS} if stats else None
        return d


def split_usage(stats: dict[str, Any], slices: list[Slice]) -> dict[str, dict[str, Any]]:
    """Split one worker's figures over its lease's slices in proportion to their fractions.

    Byte counts stay integers (the remainder goes to the first slice), ops_per_s is rounded to
    0.1. A figure missing from `stats` is None for every slice.
    """
    total = sum(s.fraction for s in slices) or 1.0
    out: dict[str, dict[str, Any]] = {s.id: {} for s in slices}
    for key in USAGE_KEYS:
        value = stats.get(key)
        if not _is_number(value):
            for s in slices:
                out[s.id][key] = None
            continue
        if key == "ops_per_s":
            for s in slices:
                out[s.id][key] = round(value * s.fraction / total, 1)
            continue
        parts = [int(value * s.fraction / total) for s in slices]
        parts[0] += int(value) - sum(parts)
        for s, part in zip(slices, parts):
            out[s.id][key] = part
    return out


def _stderr_tail(handle: Any, nbytes: int = 800) -> str:
    run_dir = getattr(handle, "run_dir", None)
    if not run_dir:
        return ""
    try:
        # O_NOFOLLOW: the run dir belongs to the worker's user; a symlink there must not make a root
        # daemon read (and log) another file
        with open(os.open(f"{run_dir}/stderr.log", os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - nbytes))
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return ""
    return f"; its stderr ends: {text}" if text else ""
