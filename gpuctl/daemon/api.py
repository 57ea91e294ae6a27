"""The daemon's control API: HTTP/1.1 + JSON on a Unix socket (contract: docs/ARCHITECTURE.md).

Two parts:

- :class:`ControlApi` turns an :class:`ApiRequest` (method, path, query, body bytes, peer) into
  ``(status, JSON body)``. It validates every body field and never raises: a bad request gets a
  4xx answer ``{"error": {"code", "message", "field"}}`` naming the field, an unexpected fault a
  500, and the server goes on serving. Routes live in a table (:meth:`ControlApi.add_route`), so
  later parts (leases, remote attach) add their own.
- The socket server (gpuctl.daemon.server: h11 on asyncio, with per-peer limits and deadlines)
  reads requests off the Unix socket, fills ApiRequest with the caller's uid and pid from
  SO_PEERCRED, and writes the answers. This module never touches a socket, so the route layer
  can also be called in-process.

Requests never call the GPU backend: telemetry comes from the sampler's ring.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import time
import traceback
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuctl import __version__
from gpuctl.daemon.errors import ApiError, DaemonError
from gpuctl.daemon.fields import (  # noqa: F401 - the field checks every route shares; the limits are also api's names
    MAX_GENERATION,
    MAX_STRING_CHARS,
    generation_field as _generation,
    get_field as _get,
    no_unknown_fields as _no_unknown,
    printable,
    request_id_field as _request_id,
)
from gpuctl.daemon.state import NodeStateManager
from gpuctl.model import LEASED_MODES, MAX_REQUEST_ID_CHARS  # noqa: F401 - MAX_REQUEST_ID_CHARS also api's name
from gpuctl.daemon.telemetry import Sampler
from gpuctl.model import ALLOWED_PARTS, UNASSIGNED, GpuIdentity, GpuSample, GpuStatus

log = logging.getLogger("gpuctld.api")

#: Largest request body accepted, bytes.
MAX_BODY_BYTES = 1024 * 1024


@dataclass
class Peer:
    """The connecting process, from SO_PEERCRED (None fields where the OS did not say)."""

    pid: int | None = None
    uid: int | None = None
    gid: int | None = None

    def __str__(self) -> str:
        return f"uid={'?' if self.uid is None else self.uid} pid={'?' if self.pid is None else self.pid}"


@dataclass
class ApiRequest:
    """One request as the API sees it: method ("GET"), path ("/v1/status"), query (parsed
    ``parse_qs``), body (raw bytes), peer; ``note``: extra words for the request's log line;
    headers: lower-cased name -> value (the audit log reads ``gpuctl-user``)."""

    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""
    peer: Peer = field(default_factory=Peer)
    note: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def json_object(self) -> dict[str, Any]:
        """The body parsed as a JSON object. ApiError 400 ``bad_json`` naming line and column."""
        if not self.body.strip():
            raise ApiError(400, "bad_json", "the request body is empty; a JSON object is required")
        try:
            text = self.body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ApiError(400, "bad_json", f"the request body is not UTF-8 (byte {e.start})") from e
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as e:
            raise ApiError(
                400, "bad_json", f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
            ) from e
        except RecursionError:
            raise ApiError(400, "bad_json", "the request body is nested too deeply") from None
        except ValueError as e:  # an integer literal over Python's digit limit
            raise ApiError(400, "bad_json", f"the request body holds a number that is too long: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "bad_json", f"the request body must be a JSON object, not {type(data).__name__}")
        return data


Handler = Callable[[ApiRequest], tuple[int, dict[str, Any]]]


def _refuse_constant(name: str) -> Any:
    raise ApiError(400, "bad_json", f"the request body is not valid JSON: {name} is not a JSON number")


# --------------------------------------------------------------------------------------------
# Validation


def parse_assign(data: dict[str, Any]) -> tuple[str, int, list[dict[str, str]], str]:
    """Validate a POST /v1/assign body; returns (request_id, generation, moves, leased)."""
    _no_unknown(data, {"request_id", "generation", "moves", "leased", "deadline_unix_s"})
    rid = _request_id(data)
    gen = _generation(data)
    raw_moves = _get(data, "moves", list, "moves")
    if not raw_moves:
        raise ApiError(400, "invalid_field", "moves must name at least one slice", "moves")
    moves = []
    for i, m in enumerate(raw_moves):
        where = f"moves[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, "invalid_field", f"{where} must be an object with slice_id, from, to", where)
        _no_unknown(m, {"slice_id", "from", "to"}, prefix=f"{where}.")
        move = {k: _get(m, k, str, f"{where}.{k}") for k in ("slice_id", "from", "to")}
        for k in ("from", "to"):
            if move[k] != UNASSIGNED and move[k].casefold() == UNASSIGNED:
                raise ApiError(400, "invalid_field", f"{where}.{k}: {move[k]!r} is reserved; "
                               f"write {UNASSIGNED!r} for slices given to no department", f"{where}.{k}")
        if move["from"] == move["to"]:
            raise ApiError(400, "invalid_field",
                           f"{where}.to: slice {move['slice_id']} would move to {move['to']!r}, where it already is",
                           f"{where}.to")
        moves.append(move)
    leased = _get(data, "leased", str, "leased", required=False, default="refuse")
    if leased not in LEASED_MODES:
        raise ApiError(400, "invalid_field", f"leased must be one of {', '.join(LEASED_MODES)}, got {leased!r}", "leased")
    return rid, gen, moves, leased


def parse_deadline(data: dict[str, Any]) -> float | None:
    """The optional ``deadline_unix_s`` of a change request (Unix time, s; a finite number > 0), or None."""
    value = data.get("deadline_unix_s")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ApiError(400, "invalid_field", f"deadline_unix_s must be a positive number of seconds (Unix time), "
                       f"got {printable(repr(value), 60)}", "deadline_unix_s")
    return float(value)


#: The fractions a slice may have (1, 1/2, 1/4, 1/8: exact in binary floating point).
SLICE_FRACTIONS = (1.0, 0.5, 0.25, 0.125)


def parse_split(data: dict[str, Any]) -> tuple[str, int, str, int | list[float], str | None]:
    """Validate a POST /v1/split body; returns (request_id, generation, gpu_uuid, parts or
    fractions, department). Exactly one of ``parts`` (1, 2, 4 or 8 equal slices) and ``fractions``
    (a list of 1, 0.5, 0.25, 0.125 adding up to 1, e.g. [0.5, 0.25, 0.25]: the new slices in
    order); ``department`` (optional): the owner of the new slices, which may differ from the
    current ones (a merge `--to`); without it all current slices must have one owner."""
    _no_unknown(data, {"request_id", "generation", "gpu_uuid", "parts", "fractions", "department"})
    rid = _request_id(data)
    gen = _generation(data)
    gpu_uuid = _get(data, "gpu_uuid", str, "gpu_uuid")
    if ("parts" in data) == ("fractions" in data):
        raise ApiError(400, "invalid_field", "give exactly one of parts (equal slices) and fractions", "parts")
    department = None
    if "department" in data:
        department = _get(data, "department", str, "department")
        if not department or len(department) > 100 or not department.isprintable():
            raise ApiError(400, "invalid_field", "department must be 1..100 printable characters", "department")
    if "fractions" in data:
        fractions = _get(data, "fractions", list, "fractions")
        if not 1 <= len(fractions) <= 8:
            raise ApiError(400, "invalid_field", f"fractions must list 1..8 slices, got {len(fractions)}", "fractions")
        for i, f in enumerate(fractions):
            if isinstance(f, bool) or not isinstance(f, (int, float)) or float(f) not in SLICE_FRACTIONS:
                raise ApiError(400, "invalid_field", f"fractions[{i}] must be one of 1, 0.5, 0.25, 0.125, got "
                               f"{printable(repr(f), 40)}", f"fractions[{i}]")
        if sum(float(f) for f in fractions) != 1.0:
            raise ApiError(400, "invalid_field", f"fractions must add up to 1 (the whole GPU), got "
                           f"{sum(float(f) for f in fractions):g}", "fractions")
        return rid, gen, gpu_uuid, [float(f) for f in fractions], department
    parts = _get(data, "parts", int, "parts")
    if parts not in ALLOWED_PARTS:
        raise ApiError(400, "invalid_field", f"parts must be one of {', '.join(map(str, ALLOWED_PARTS))}, got {parts}", "parts")
    return rid, gen, gpu_uuid, parts, department


# --------------------------------------------------------------------------------------------
# The API


class ControlApi:
    """The control API of one node.

    backend_name: "nvml" | "simulated". gpus: the backend's GPUs at start-up. sampler: the
    telemetry ring. state: the node's state manager (reconciled with `gpus`).
    """

    def __init__(
        self,
        *,
        backend_name: str,
        gpus: list[GpuIdentity],
        sampler: Sampler,
        state: NodeStateManager,
        hostname: str | None = None,
    ):
        self.backend_name = backend_name
        self.gpus = list(gpus)
        self.sampler = sampler
        self.state = state
        self.hostname = hostname or socket.gethostname()
        self.started_monotonic = time.monotonic()
        self.routes: dict[tuple[str, str], Handler] = {}
        self.prefix_routes: list[tuple[str, str, Handler]] = []
        #: Called with each GET /v1/status answer body before it is sent (may add to it).
        self.status_hooks: list[Callable[[dict[str, Any]], None]] = []
        #: Called after each POST /v1/assign, answered or refused (e.g. stop ended leases' workers).
        self.assign_hooks: list[Callable[[], Any]] = []
        #: Called with (request, error) for each request refused with a DaemonError (must not
        #: raise; e.g. usage accounting records lease requests refused for lack of slices).
        self.refusal_hooks: list[Callable[[ApiRequest, DaemonError], None]] = []
        self.add_route("GET", "/v1/health", self.health)
        self.add_route("GET", "/v1/node", self.node)
        self.add_route("GET", "/v1/status", self.status)
        self.add_route("GET", "/v1/telemetry", self.telemetry)
        self.add_route("GET", "/v1/slices", self.slices)
        self.add_route("POST", "/v1/assign", self.assign)
        self.add_route("POST", "/v1/split", self.split)
        self.add_route("POST", "/v1/gpus/forget", self.forget_gpu)
        self.add_route("GET", "/v1/requests/", self.request_answer, prefix=True)

    def add_route(self, method: str, path: str, handler: Handler, *, prefix: bool = False) -> None:
        """Serve `method` `path` with `handler(ApiRequest) -> (status, body)`; with `prefix`, every
        path that starts with `path`. A handler raises a DaemonError to refuse. A route is added
        once: ValueError when `method` `path` is served already (routes are never swapped)."""
        taken = ((method, path) in self.routes if not prefix
                 else any(m == method and p == path for m, p, _ in self.prefix_routes))
        if taken:
            raise ValueError(f"route {method} {path}{'*' if prefix else ''} is already served")
        if prefix:
            self.prefix_routes.append((method, path, handler))
        else:
            self.routes[(method, path)] = handler

    def handle(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """Answer one request; never raises."""
        try:
            handler = self._find(request)
            return handler(request)
        except DaemonError as e:  # ApiError, StateError and its kinds: one family
            for hook in self.refusal_hooks:
                try:
                    hook(request, e)
                except Exception:  # noqa: BLE001 - a hook never changes the answer
                    log.exception("refusal hook failed")
            return e.status, e.to_json()
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the server
            log.error("internal error on %s %s: %s\n%s", request.method, request.path, e, traceback.format_exc())
            return 500, ApiError(500, "internal", f"internal error: {type(e).__name__}: {e}").to_json()

    def _find(self, request: ApiRequest) -> Handler:
        handler = self.routes.get((request.method, request.path))
        if handler:
            return handler
        for method, prefix, h in self.prefix_routes:
            if method == request.method and request.path.startswith(prefix) and len(request.path) > len(prefix):
                return h
        known = {p for _, p in self.routes} | {p for _, p, _ in self.prefix_routes}
        if request.path in known or any(request.path.startswith(p) for _, p, _ in self.prefix_routes):
            raise ApiError(405, "method_not_allowed", f"{request.method} is not allowed on {request.path}")
        raise ApiError(404, "unknown_path", f"no such path: {request.path}")

    # -- reads

    def health(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/health: liveness, version, backend, uptime (s), hostname, pid."""
        return 200, {
            "ok": True,
            "version": __version__,
            "backend": self.backend_name,
            "uptime_s": round(time.monotonic() - self.started_monotonic, 3),
            "hostname": self.hostname,
            "pid": os.getpid(),
        }

    def node(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/node: hostname, backend and the backend's GPU identities."""
        return 200, {"hostname": self.hostname, "backend": self.backend_name,
                     "gpus": [g.to_json() for g in self.gpus]}

    def status(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/status: generation, each GPU with latest sample and slices (missing GPUs last), leases, node error."""
        snap = self.state.snapshot()
        latest = self.sampler.latest()
        gpus = [GpuStatus(g, latest.get(g.uuid), snap.slices_of(g.uuid)).to_json() for g in self.gpus]
        missing = sorted(self.state.missing_gpus)
        for uuid in missing:
            identity = GpuIdentity(uuid=uuid, index=-1, name="(missing)")
            sample = GpuSample(
                uuid=uuid, timestamp_s=time.time(),
                error="missing: the backend did not report this GPU at start-up; its slices and owners are kept",
            )
            gpus.append(GpuStatus(identity, sample, snap.slices_of(uuid)).to_json())
        error = error_code = None
        if self.sampler.last_error is not None:
            error = f"telemetry sampling failed: {self.sampler.last_error}"
            error_code = "sampling_failed"
        body = {
            "hostname": self.hostname,
            "backend": self.backend_name,
            "generation": snap.generation,
            "gpus": gpus,
            "missing_gpus": missing,
            "leases": [lease.to_json() for lease in snap.leases.values()],
            "error": error,
            "error_code": error_code,
        }
        for hook in self.status_hooks:
            hook(body)
        return 200, body

    def telemetry(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/telemetry?since=C&uuid=U: samples of rounds after cursor C (400 since, 404 uuid)."""
        since_raw = request.query.get("since", ["0"])[-1]
        try:
            if not re.fullmatch(r"[0-9]{1,30}", since_raw):  # int() also takes "+1", "1_0", " 1", "٢"
                raise ValueError
            since = int(since_raw)
        except ValueError:
            raise ApiError(400, "invalid_field", f"since must be an integer >= 0, got {since_raw!r}", "since") from None
        uuid = request.query.get("uuid", [None])[-1]
        if uuid is not None and uuid not in {g.uuid for g in self.gpus}:
            raise ApiError(404, "unknown_gpu", f"no GPU {uuid!r} on this node", "uuid")
        cursor, samples = self.sampler.since(since, uuid)
        return 200, {"cursor": cursor, "interval_s": self.sampler.interval_s,
                     "samples": [s.to_json() for s in samples]}

    def slices(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/slices: generation and every slice, from one consistent snapshot."""
        snap = self.state.snapshot()
        return 200, {"generation": snap.generation, "slices": [s.to_json() for s in snap.slices.values()]}

    def request_answer(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """GET /v1/requests/{id}: the recorded answer of a change request (404 unknown_request)."""
        rid = urllib.parse.unquote(request.path[len("/v1/requests/"):])
        answer = self.state.recorded(rid)
        if answer is None:
            raise ApiError(404, "unknown_request", f"no request {rid!r} is recorded on this node "
                           f"(the last 1000 are kept)", "request_id")
        return 200, answer

    # -- changes

    def assign(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """POST /v1/assign: validate the body, then NodeStateManager.assign."""
        data = request.json_object()
        rid, gen, moves, leased = parse_assign(data)
        request.note = f"request_id={rid}"
        try:
            return 200, self.state.assign(rid, gen, moves, leased, parse_deadline(data))
        finally:
            for hook in self.assign_hooks:
                hook()

    def forget_gpu(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """POST /v1/gpus/forget ``{"request_id", "generation", "gpu_uuid"}``: retire a GPU the
        backend no longer reports (NodeStateManager.forget_gpu)."""
        data = request.json_object()
        _no_unknown(data, {"request_id", "generation", "gpu_uuid"})
        rid, gen = _request_id(data), _generation(data)
        gpu_uuid = _get(data, "gpu_uuid", str, "gpu_uuid")
        request.note = f"request_id={rid}"
        return 200, self.state.forget_gpu(rid, gen, gpu_uuid)

    def split(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """POST /v1/split: validate the body, then NodeStateManager.split."""
        rid, gen, gpu_uuid, parts, department = parse_split(request.json_object())
        request.note = f"request_id={rid}"
        if isinstance(parts, list):
            return 200, self.state.split(rid, gen, gpu_uuid, len(parts), fractions=parts, department=department)
        return 200, self.state.split(rid, gen, gpu_uuid, parts, department=department)
