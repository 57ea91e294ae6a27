"""The daemon's control API: HTTP/1.1 + JSON on a Unix socket (contract: docs/ARCHITECTURE.md).

Two parts:

- :class:`ControlApi` turns an :class:`ApiRequest` (method, path, query, body bytes, peer) into
  ``(status, JSON body)``. It validates every body field and never raises: a bad request gets a
  4xx answer ``{"error": {"code", "message", "field"}}`` naming the field, an unexpected fault a
  500, and the server goes on serving. Routes live in a table (:meth:`ControlApi.add_route`), so
  later parts (leases, remote attach) add their own.
- :func:`serve` binds the Unix socket (mode 0660; a stale socket file is removed only if nobody
  answers on it) and runs a ``socketserver.ThreadingUnixStreamServer`` with a
  ``BaseHTTPRequestHandler`` (keep-alive, Content-Length on every answer, bodies over 1 MiB refused
  with 413). Each request is logged to stderr in one line with the caller's uid and pid from
  SO_PEERCRED.

Requests never call the GPU backend: telemetry comes from the sampler's ring.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import re
import socket
import socketserver
import stat
import struct
import threading
import time
import traceback
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
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
#: Seconds a client may stay silent in the middle of a request before it gets 408 and is closed.
REQUEST_TIMEOUT_S = 30.0
#: Seconds a kept-alive connection may stay idle between requests before it is closed.
IDLE_TIMEOUT_S = 300.0
#: Most connections served at once; more get 503 ``too_many_connections`` and are closed.
MAX_CONNECTIONS = 128
#: Mode of the socket file: owner and group may connect.
SOCKET_MODE = 0o660


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
    ``parse_qs``), body (raw bytes), peer; ``note``: extra words for the request's log line."""

    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""
    peer: Peer = field(default_factory=Peer)
    note: str = ""

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
    _no_unknown(data, {"request_id", "generation", "moves", "leased"})
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


def parse_split(data: dict[str, Any]) -> tuple[str, int, str, int]:
    """Validate a POST /v1/split body; returns (request_id, generation, gpu_uuid, parts)."""
    _no_unknown(data, {"request_id", "generation", "gpu_uuid", "parts"})
    rid = _request_id(data)
    gen = _generation(data)
    gpu_uuid = _get(data, "gpu_uuid", str, "gpu_uuid")
    parts = _get(data, "parts", int, "parts")
    if parts not in ALLOWED_PARTS:
        raise ApiError(400, "invalid_field", f"parts must be one of {', '.join(map(str, ALLOWED_PARTS))}, got {parts}", "parts")
    return rid, gen, gpu_uuid, parts


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
        self.add_route("GET", "/v1/health", self.health)
        self.add_route("GET", "/v1/node", self.node)
        self.add_route("GET", "/v1/status", self.status)
        self.add_route("GET", "/v1/telemetry", self.telemetry)
        self.add_route("GET", "/v1/slices", self.slices)
        self.add_route("POST", "/v1/assign", self.assign)
        self.add_route("POST", "/v1/split", self.split)
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
        rid, gen, moves, leased = parse_assign(request.json_object())
        request.note = f"request_id={rid}"
        try:
            return 200, self.state.assign(rid, gen, moves, leased)
        finally:
            for hook in self.assign_hooks:
                hook()

    def split(self, request: ApiRequest) -> tuple[int, dict[str, Any]]:
        """POST /v1/split: validate the body, then NodeStateManager.split."""
        rid, gen, gpu_uuid, parts = parse_split(request.json_object())
        request.note = f"request_id={rid}"
        return 200, self.state.split(rid, gen, gpu_uuid, parts)


# --------------------------------------------------------------------------------------------
# The server


class SocketInUseError(Exception):
    """The socket path is taken: another daemon answers there, or it is not a socket."""


def _peer_of(sock: socket.socket) -> Peer:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        return Peer(pid=pid, uid=uid, gid=gid)
    except (OSError, AttributeError, struct.error):
        return Peer()


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"gpuctld/{__version__}"
    server: "ApiServer"

    def setup(self) -> None:
        super().setup()
        self.peer = _peer_of(self.request)

    def address_string(self) -> str:  # the base class expects an IP address
        return str(self.peer)

    def log_request(self, code: Any = "-", size: Any = "-") -> None:  # we log once, ourselves
        pass

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.peer, printable(format % args))

    def handle_one_request(self) -> None:
        """Read and answer one request (BaseHTTPRequestHandler's, with timeouts): a connection idle
        for ``server.idle_timeout_s`` between requests is closed quietly; a client silent for
        ``server.request_timeout_s`` in the middle of a request gets 408 and is closed."""
        self.requestline = ""
        try:
            self.connection.settimeout(self.server.idle_timeout_s)
            if not self.rfile.peek(1):  # the client closed
                self.close_connection = True
                return
        except OSError:  # TimeoutError included: idle for too long
            self.close_connection = True
            return
        self.connection.settimeout(self.server.request_timeout_s)
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.request_version = "HTTP/1.1"
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})")
                return
            method()
            self.wfile.flush()
        except TimeoutError:
            self.close_connection = True
            try:
                self._send(408, ApiError(408, "request_timeout", f"the client sent nothing for "
                                         f"{self.server.request_timeout_s:g} s in the middle of a request").to_json(),
                           close=True)
            except OSError:
                pass
            self._log(408, 0.0, "timed out")

    def _send(self, status: int, body: dict[str, Any], *, close: bool = False) -> None:
        # backslashreplace: a lone surrogate from the request, echoed in a message, stays valid JSON
        payload = (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if getattr(self, "command", None) != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol-level errors (bad request line, header too long...) as JSON, then close."""
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        text = message or phrase
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.1"  # answer with a status line and headers, whatever was sent
        self._send(code, ApiError(code, "bad_http", f"{phrase}: {text}").to_json(), close=True)
        self._log(code, 0.0, "")

    def _log(self, status: int, elapsed_s: float, note: str) -> None:
        line = printable(getattr(self, "requestline", "") or "-")
        log.info("%s \"%s\" %d %.1fms%s", self.peer, line, status, elapsed_s * 1000, f" {note}" if note else "")

    def _dispatch(self) -> None:
        t0 = time.monotonic()
        parsed = urllib.parse.urlsplit(self.path)
        request = ApiRequest(method=self.command, path=parsed.path,
                             query=urllib.parse.parse_qs(parsed.query), peer=self.peer)
        if self.request_version == "HTTP/0.9":
            self.send_error(400, "HTTP/0.9 requests are not supported; send HTTP/1.1")
            return
        if self.headers.get("Transfer-Encoding"):
            self._send(411, ApiError(411, "length_required", "chunked bodies are not accepted; send Content-Length").to_json(), close=True)
            self._log(411, time.monotonic() - t0, "")
            return
        lengths = set(self.headers.get_all("Content-Length", ["0"]))
        length_raw = ", ".join(sorted(lengths))
        try:
            # one plain decimal: int() would also take "+2", "0_2", "٢"; two values could smuggle a request
            if len(lengths) != 1 or not re.fullmatch(r"[0-9]{1,30}", length_raw):
                raise ValueError
            length = int(length_raw)
        except ValueError:
            self._send(400, ApiError(400, "bad_http", f"Content-Length is not a byte count: {length_raw!r}").to_json(), close=True)
            self._log(400, time.monotonic() - t0, "")
            return
        if length > MAX_BODY_BYTES:
            err = ApiError(413, "body_too_large", f"the request body is {length} bytes; the limit is {MAX_BODY_BYTES} bytes")
            self._send(413, err.to_json(), close=True)
            self._log(413, time.monotonic() - t0, "")
            return
        if length:
            request.body = self.rfile.read(length)
            if len(request.body) < length:  # the client closed (or half-closed) mid-body
                err = ApiError(400, "bad_http", f"the request body ended after {len(request.body)} of {length} "
                               f"bytes (Content-Length)")
                try:
                    self._send(400, err.to_json(), close=True)
                except OSError:
                    self.close_connection = True
                self._log(400, time.monotonic() - t0, "")
                return
        status, body = self.server.api.handle(request)
        self._send(status, body)
        self._log(status, time.monotonic() - t0, request.note)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _dispatch


class ApiServer(socketserver.ThreadingUnixStreamServer):
    """The control API's HTTP server on a Unix socket (see :func:`serve`)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = False
    #: listen() backlog. socketserver's default, 5, makes a burst of connects fail at once with
    #: EAGAIN (a Unix socket's connect with a timeout does not wait for room in the backlog).
    request_queue_size = socket.SOMAXCONN
    #: Limits (seconds, connections); instance attributes may override them.
    request_timeout_s = REQUEST_TIMEOUT_S
    idle_timeout_s = IDLE_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def __init__(self, socket_path: Path, api: ControlApi):
        self.api = api
        self.socket_path = Path(socket_path)
        self._active = 0
        self._active_lock = threading.Lock()
        super().__init__(str(socket_path), _RequestHandler)
        self.socket_inode = os.stat(socket_path).st_ino

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on its own thread, or, past ``max_connections``, answer 503
        ``too_many_connections`` and close it (threads and file descriptors stay bounded)."""
        with self._active_lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
        if full:
            err = ApiError(503, "too_many_connections",
                           f"gpuctld is serving {self.max_connections} connections; try again shortly")
            payload = (json.dumps(err.to_json()) + "\n").encode()
            try:
                request.settimeout(0.1)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload)
            except OSError:
                pass
            log.warning("refused a connection: %d connections are open", self.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._active_lock:
                self._active -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.error("connection error: %s", traceback.format_exc().strip().splitlines()[-1])

    def close(self) -> None:
        """Stop listening and remove the socket file (only if it is still ours)."""
        self.server_close()
        try:
            if os.stat(self.socket_path).st_ino == self.socket_inode:
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass


def prepare_socket_path(path: Path) -> None:
    """Make `path` ready to bind: create its directory; remove a stale socket file that nobody
    answers on. Raises SocketInUseError when another process answers there or the path is not a
    socket (it is then left alone)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUseError(f"{path} exists and is not a socket; remove it or choose another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.warning("removing stale socket file %s (nobody answers on it)", path)
        path.unlink(missing_ok=True)
        return
    except OSError as e:
        raise SocketInUseError(f"cannot probe the socket {path}: {e}") from e
    finally:
        probe.close()
    raise SocketInUseError(
        f"another gpuctld is already answering on {path}; stop it first (systemctl stop gpuctld) "
        f"or choose another --socket"
    )


def serve(api: ControlApi, socket_path: str | os.PathLike, *, group: str | None = None) -> ApiServer:
    """Bind the control API on `socket_path` (mode 0660, group `group` when given) and return the
    server, not yet serving: run ``server.serve_forever()`` in a thread, ``server.shutdown()`` and
    ``server.close()`` to stop. Raises SocketInUseError, OSError, ValueError (unknown group)."""
    path = Path(socket_path)
    prepare_socket_path(path)
    old_umask = os.umask(0o117)  # the socket is created 0660, never wider even for a moment
    try:
        server = ApiServer(path, api)
    finally:
        os.umask(old_umask)
    os.chmod(path, SOCKET_MODE)
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            server.close()
            raise ValueError(f"no group {group!r} on this node for the socket (create it: groupadd {group})") from None
        os.chown(path, -1, gid)
    return server


def serve_in_thread(server: ApiServer, poll_interval_s: float = 0.2) -> threading.Thread:
    """Run ``server.serve_forever`` on a daemon thread and return it; ``server.shutdown()`` takes up
    to `poll_interval_s` seconds to be noticed."""
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval_s},
                         name="gpuctld-api", daemon=True)
    t.start()
    return t
