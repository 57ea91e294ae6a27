"""The control API's socket server: HTTP/1.1 on a Unix socket, parsed by h11, served by one
asyncio loop on its own thread; route handlers run on a small thread pool.

This module only moves requests and answers between the socket and the route layer
(:class:`gpuctl.daemon.api.ControlApi`, which never touches a socket and can be called
in-process). h11 (the protocol engine under httpx/httpcore) parses request lines, headers and
bodies and writes the answers; the limits around it are gpuctld's, and each one is what a peer
gets when it breaks it:

- a new connection must send its first byte within ``first_byte_timeout_s`` (10 s), and a kept-
  alive one its next request within ``idle_timeout_s`` (300 s): else it is closed quietly;
- a request (request line, headers and body) must arrive whole within ``request_timeout_s``
  (30 s) of its first byte, however slowly its bytes trickle in: else 408 ``request_timeout``;
- the request line and headers together may hold ``max_header_bytes`` (64 KiB): else 431
  ``bad_http``; a request without ``Host`` gets ``Host: gpuctld`` (h11 needs one; a Unix socket
  has no host names); bodies over ``MAX_BODY_BYTES`` (1 MiB) get 413 before a byte of them is read;
- connections are counted per peer from SO_PEERCRED: one process (pid) may hold
  ``max_connections_per_pid`` (32), one user (uid) ``max_connections_per_uid`` (64). A peer at its
  limit that opens one more has its own oldest connection that is not running a request closed
  to make room (so it cannot lock itself out, and cannot take anyone else's room); when all of
  them are running requests, the new one gets 503 ``too_many_connections``. Past
  ``max_connections`` (128) in all, any new connection gets 503 ``too_many_connections``;
- one process runs at most ``handlers_per_pid`` (4) requests at once on the pool;
- an answer must be taken by the peer within ``write_timeout_s`` (30 s): else the connection is
  dropped.

Sockets are read only when a request needs more bytes (``loop.sock_recv``, 64 KiB at a time), so
a connection never holds more than its head budget or its declared body; after peers have sent
``TRIM_AFTER_BYTES`` the freed pages are handed back to the OS (glibc ``malloc_trim``), so the
daemon's RSS returns to its baseline after an abuse (tests/integration/test_control_api_limits.py).

Every answer carries Content-Length; a protocol error is answered in the API's JSON error shape
(code ``bad_http``) and the connection closed. Each request is logged to stderr in one line with
the peer's uid and pid; refusals of connections are logged at most once per
``REFUSAL_LOG_INTERVAL_S`` with a count.
"""

from __future__ import annotations

import asyncio
import ctypes
import grp
import json
import logging
import os
import re
import socket
import stat
import struct
import threading
import time
import urllib.parse
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import h11

from gpuctl import __version__
from gpuctl.daemon.api import MAX_BODY_BYTES, ApiError, ApiRequest, ControlApi, Peer, printable

log = logging.getLogger("gpuctld.api")

#: Seconds a new connection may stay silent before its first byte; then it is closed quietly.
FIRST_BYTE_TIMEOUT_S = 10.0
#: Seconds a kept-alive connection may stay idle between requests; then it is closed quietly.
IDLE_TIMEOUT_S = 300.0
#: Seconds from a request's first byte until it must be whole (line, headers, body); else 408.
REQUEST_TIMEOUT_S = 30.0
#: Seconds a peer has to take an answer off the socket; else the connection is dropped.
WRITE_TIMEOUT_S = 30.0
#: Most bytes of request line and headers together (h11's max_incomplete_event_size); else 431.
MAX_HEADER_BYTES = 64 * 1024
#: Most connections served at once, all peers together; more get 503 ``too_many_connections``.
MAX_CONNECTIONS = 128
#: Most connections of one process (SO_PEERCRED pid) at once.
MAX_CONNECTIONS_PER_PID = 32
#: Most connections of one user (SO_PEERCRED uid) at once.
MAX_CONNECTIONS_PER_UID = 64
#: Most requests of one process running on the handler pool at once.
HANDLERS_PER_PID = 4
#: Threads that run route handlers (state writes, lease workers): the pool all peers share.
HANDLER_THREADS = 16
#: Seconds between two log lines about refused or evicted connections (the rest are counted).
REFUSAL_LOG_INTERVAL_S = 5.0
#: Mode of the socket file: owner and group may connect.
SOCKET_MODE = 0o660

#: Bytes read from peers after which freed memory is handed back to the OS (see _trim_memory).
TRIM_AFTER_BYTES = 8 * 1024 * 1024
#: Seconds between two checks of TRIM_AFTER_BYTES.
TRIM_INTERVAL_S = 2.0

_READ_CHUNK_BYTES = 64 * 1024
#: Bytes of a request's start kept to name it in the log (the log line shows 300 characters).
_LINE_KEEP_BYTES = 2048
_HTTP09 = re.compile(rb"^[A-Za-z]+ \S+\r?$")


class SocketInUseError(Exception):
    """The socket path is taken: another daemon answers there, or it is not a socket."""


def peer_of(sock: Any) -> Peer:
    """The process at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid); a Peer of
    None fields where the OS does not say."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        return Peer(pid=pid, uid=uid, gid=gid)
    except (OSError, AttributeError, struct.error):
        return Peer()


class _Timeout(Exception):
    """The request was not whole within request_timeout_s."""


class _Closed(Exception):
    """The peer closed before sending anything of a new request, or went silent between requests."""


@dataclass(eq=False)
class _Conn:
    """One open connection: its peer, its streams, and whether a request of it is running."""

    peer: Peer
    sock: socket.socket
    opened_monotonic: float = field(default_factory=time.monotonic)
    busy: bool = False
    evicted: bool = False
    task: asyncio.Task | None = None
    line: bytearray = field(default_factory=bytearray)

    def keep_line(self, data: bytes) -> None:
        """Keep the start of the current request (its request line names it in the log)."""
        if b"\n" not in self.line and len(self.line) < _LINE_KEEP_BYTES:
            self.line += data[: _LINE_KEEP_BYTES - len(self.line)]

    def request_line(self) -> str:
        return bytes(self.line).split(b"\n", 1)[0].rstrip(b"\r").decode("iso-8859-1")


#: Methods that change nothing: their answered requests are polls (the console asks every second).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_log_level(request_line: str, status: int) -> int:
    """The log level of one answered request: DEBUG for a read that succeeded (GET/HEAD/OPTIONS,
    status < 400: a poll), INFO for anything else (a change, or any refused or failed request), so
    the log holds changes, not polls (`gpuctld serve --log-level debug` shows the polls). A lease's
    heartbeat (POST /v1/leases/ID/heartbeat, every ttl/3 while `gpuctl run` runs) is a keep-alive,
    not a change: DEBUG too when it succeeds."""
    method, _, rest = request_line.partition(" ")
    path = rest.split(" ", 1)[0].split("?", 1)[0]
    if status >= 400:
        return logging.INFO
    if method in READ_METHODS or (method == "POST" and path.startswith("/v1/leases/") and path.endswith("/heartbeat")):
        return logging.DEBUG
    return logging.INFO


class _Refusals:
    """Counts refused and evicted connections; logs a line at most every REFUSAL_LOG_INTERVAL_S."""

    def __init__(self) -> None:
        self.count = 0
        self.last_log = -1e9
        self.last_reason = ""

    def add(self, reason: str) -> None:
        self.count += 1
        self.last_reason = reason
        now = time.monotonic()
        if now - self.last_log >= REFUSAL_LOG_INTERVAL_S:
            log.warning("%d connection(s) refused or closed to make room since the last such line; last: %s",
                        self.count, reason)
            self.count = 0
            self.last_log = now


class ApiServer:
    """The control API's server on a bound, listening Unix socket (see the module docstring).

    Limits are instance attributes read at use time (tests lower them after :func:`serve`).
    ``serve_forever()`` blocks running the loop; ``shutdown()`` (any thread) stops it and waits;
    ``close()`` closes the socket and removes its file when it is still ours.
    """

    def __init__(self, socket_path: Path, api: ControlApi, sock: socket.socket):
        self.api = api
        self.socket_path = Path(socket_path)
        self.socket_inode = os.stat(socket_path).st_ino
        self._sock = sock
        self.first_byte_timeout_s = FIRST_BYTE_TIMEOUT_S
        self.idle_timeout_s = IDLE_TIMEOUT_S
        self.request_timeout_s = REQUEST_TIMEOUT_S
        self.write_timeout_s = WRITE_TIMEOUT_S
        self.max_header_bytes = MAX_HEADER_BYTES
        self.max_connections = MAX_CONNECTIONS
        self.max_connections_per_pid = MAX_CONNECTIONS_PER_PID
        self.max_connections_per_uid = MAX_CONNECTIONS_PER_UID
        self.handlers_per_pid = HANDLERS_PER_PID
        self._conns: OrderedDict[_Conn, None] = OrderedDict()  # oldest first
        self._handler_slots: dict[int | None, tuple[asyncio.Semaphore, int]] = {}  # pid -> (slots, users)
        self._refusals = _Refusals()
        self._tasks: set[asyncio.Task] = set()
        #: Bytes read from all peers since start.
        self.bytes_received = 0
        self._bytes_at_trim = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running = threading.Event()
        self._finished = threading.Event()
        self._finished.set()

    # -- life cycle ----------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Serve until :meth:`shutdown` (blocks; `poll_interval` is accepted and unused: the loop
        wakes on the stop request itself)."""
        self._finished.clear()
        try:
            asyncio.run(self._main())
        finally:
            self._running.clear()
            self._finished.set()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop serving: stop accepting, cancel open connections, wait for serve_forever to end."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not self._finished.is_set():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop already closed
                pass
            self._finished.wait(timeout_s)

    def close(self) -> None:
        """Close the listening socket and remove the socket file (only if it is still ours)."""
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            if os.stat(self.socket_path).st_ino == self.socket_inode:
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    @property
    def connection_count(self) -> int:
        """Connections open now."""
        return len(self._conns)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._pool = ThreadPoolExecutor(max_workers=HANDLER_THREADS, thread_name_prefix="gpuctld-api")
        self._sock.setblocking(False)
        accepting = self._loop.create_task(self._accept_loop())
        trimming = self._loop.create_task(self._trim_loop())
        self._running.set()
        try:
            await self._stop.wait()
        finally:
            accepting.cancel()
            trimming.cancel()
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.wait([accepting, *tasks], timeout=2.0)
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _trim_loop(self) -> None:
        """After peers sent TRIM_AFTER_BYTES, hand the memory their requests used back to the OS.
        Request bytes are freed as soon as they are answered, but the C allocator keeps the pages
        (fragmented arenas); without this the RSS stays high after an abuse is over."""
        while True:
            await asyncio.sleep(TRIM_INTERVAL_S)
            if self.bytes_received - self._bytes_at_trim >= TRIM_AFTER_BYTES:
                self._bytes_at_trim = self.bytes_received
                _trim_memory()

    # -- admission -----------------------------------------------------------------------------

    def _admit(self, conn: _Conn) -> str | None:
        """Count `conn` in, making room among its own peer's idle connections when the peer is at
        its limit; the refusal message when it cannot be served."""
        if len(self._conns) >= self.max_connections:
            return f"gpuctld is serving {self.max_connections} connections; try again shortly"
        pid, uid = conn.peer.pid, conn.peer.uid
        for key, limit, who in (("pid", self.max_connections_per_pid, f"process {pid}"),
                                ("uid", self.max_connections_per_uid, f"user {uid}")):
            value = getattr(conn.peer, key)
            mine = [c for c in self._conns if getattr(c.peer, key) == value and not c.evicted]
            if len(mine) < limit:
                continue
            idle = next((c for c in mine if not c.busy), None)
            if idle is None:
                return (f"{who} already has {limit} connections to gpuctld, all running requests; "
                        f"try again shortly")
            self._evict(idle, f"{who} opened a new connection past its limit of {limit}")
        self._conns[conn] = None
        return None

    def _evict(self, conn: _Conn, reason: str) -> None:
        conn.evicted = True
        self._conns.pop(conn, None)
        self._refusals.add(f"closed a connection of {conn.peer}: {reason}")
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)  # a read in flight ends now, whatever the task does
        except OSError:
            pass
        if conn.task is not None:
            conn.task.cancel()  # its finally closes the socket

    # -- one connection ------------------------------------------------------------------------

    async def _accept_loop(self) -> None:
        """Accept connections and start a task for each. Sockets are read only when a task
        asks (loop.sock_recv), so a connection holds no more bytes than its request needs."""
        assert self._loop is not None
        while True:
            try:
                sock, _ = await self._loop.sock_accept(self._sock)
            except OSError as e:  # EMFILE and the like: wait a little, go on
                log.warning("accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            task = self._loop.create_task(self._on_connection(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _on_connection(self, sock: socket.socket) -> None:
        conn = _Conn(peer_of(sock), sock)
        conn.task = asyncio.current_task()
        refusal = self._admit(conn)
        if refusal is not None:
            self._refusals.add(f"refused {conn.peer}: {refusal}")
            err = ApiError(503, "too_many_connections", refusal)
            try:
                async with asyncio.timeout(0.1):
                    await self._loop.sock_sendall(sock, _plain_answer(503, err.to_json()))
            except (OSError, asyncio.TimeoutError):
                pass
            sock.close()
            return
        try:
            await self._serve(conn)
        except (OSError, asyncio.CancelledError, asyncio.TimeoutError, _Closed):
            pass
        except Exception:  # noqa: BLE001 - one broken connection must not stop the server
            log.exception("%s: connection error", conn.peer)
        finally:
            self._conns.pop(conn, None)
            sock.close()

    async def _serve(self, conn: _Conn) -> None:
        """Serve requests on `conn` until it closes, breaks a limit, or asks to close. Each
        request gets a fresh h11 connection fed with the bytes the last one left over."""
        pending, eof, first = b"", False, True
        while True:
            if not pending:
                if eof:
                    return
                wait_s = self.first_byte_timeout_s if first else self.idle_timeout_s
                try:
                    async with asyncio.timeout(wait_s):
                        pending = await self._loop.sock_recv(conn.sock, _READ_CHUNK_BYTES)
                except TimeoutError:
                    raise _Closed from None
                if not pending or conn.evicted:
                    raise _Closed
                self.bytes_received += len(pending)
            first = False
            conn.line = bytearray()
            conn.keep_line(pending)
            h = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_header_bytes)
            deadline = time.monotonic() + self.request_timeout_s
            keep_open = await self._one_request(conn, h, pending, eof, deadline)
            if not keep_open or h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                return
            pending, eof = h.trailing_data

    async def _read(self, conn: _Conn, deadline: float) -> bytes:
        """The next bytes of the current request (b"" at end of file); _Timeout past `deadline`."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        try:
            async with asyncio.timeout(remaining):
                data = await self._loop.sock_recv(conn.sock, _READ_CHUNK_BYTES)
        except TimeoutError:
            raise _Timeout from None
        if conn.evicted:
            raise _Closed
        self.bytes_received += len(data)
        conn.keep_line(data)
        return data

    async def _feed_head(self, conn: _Conn, h: h11.Connection, pending: bytes, eof: bool, deadline: float) -> None:
        """Gather the request line and headers (up to max_header_bytes), add ``Host: gpuctld``
        when they have none (a Unix socket has no host names; h11 requires one of HTTP/1.1), and
        hand them to h11 with whatever followed. An HTTP/0.9 request line is refused here."""
        head = bytearray(pending)
        while not eof and len(head) <= self.max_header_bytes and b"\r\n\r\n" not in head and b"\n\n" not in head:
            if b"\n" in conn.line and _HTTP09.match(bytes(conn.line).split(b"\n", 1)[0]):
                break
            data = await self._read(conn, deadline)
            if data:
                head += data
            else:
                eof = True
        first_line, nl, rest = bytes(head).partition(b"\n")
        if nl and _HTTP09.match(first_line):
            raise h11.RemoteProtocolError("HTTP/0.9 requests are not supported; send HTTP/1.1", 400)
        ends = [i for i in (head.find(b"\r\n\r\n"), head.find(b"\n\n")) if i >= 0]
        if (min(ends) if ends else len(head)) > self.max_header_bytes:  # h11 checks only heads still arriving
            raise h11.RemoteProtocolError("request head too large", 431)
        if nl and not re.search(rb"(?im)^host[ \t]*:", rest.split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]):
            head = bytearray(first_line + nl + b"Host: gpuctld\r\n" + rest)
        h.receive_data(bytes(head))
        if eof:
            h.receive_data(b"")

    async def _receive(self, conn: _Conn, h: h11.Connection, deadline: float) -> Any:
        """The next h11 event, reading more bytes as needed until `deadline` (monotonic)."""
        while True:
            event = h.next_event()
            if event is not h11.NEED_DATA:
                return event
            h.receive_data(await self._read(conn, deadline))

    async def _one_request(self, conn: _Conn, h: h11.Connection, pending: bytes, eof: bool,
                           deadline: float) -> bool:
        """Read one request (its first bytes are `pending`), run it, answer it; False when the
        connection must close."""
        t0 = time.monotonic()
        body_read = 0
        length = 0
        event = None
        try:
            await self._feed_head(conn, h, pending, eof, deadline)
            event = await self._receive(conn, h, deadline)
            if isinstance(event, h11.ConnectionClosed):
                return False
            assert isinstance(event, h11.Request), event
            headers = {k.lower(): v for k, v in event.headers}
            if b"transfer-encoding" in headers:
                err = ApiError(411, "length_required", "chunked bodies are not accepted; send Content-Length")
                return await self._answer(conn, h, t0, 411, err.to_json(), close=True)
            length = int(headers.get(b"content-length", b"0"))  # h11 checked: plain digits, one value
            if length > MAX_BODY_BYTES:
                err = ApiError(413, "body_too_large",
                               f"the request body is {length} bytes; the limit is {MAX_BODY_BYTES} bytes")
                return await self._answer(conn, h, t0, 413, err.to_json(), close=True)
            if h.they_are_waiting_for_100_continue:
                await self._write(conn, h.send(h11.InformationalResponse(status_code=100, headers=[])))
            chunks: list[bytes] = []
            while True:
                part = await self._receive(conn, h, deadline)
                if isinstance(part, h11.Data):
                    chunks.append(bytes(part.data))
                    body_read += len(part.data)
                elif isinstance(part, h11.EndOfMessage):
                    break
        except _Timeout:
            err = ApiError(408, "request_timeout", f"the request was not whole within "
                           f"{self.request_timeout_s:g} s of its first byte")
            return await self._answer(conn, h, t0, 408, err.to_json(), close=True, note="timed out")
        except h11.RemoteProtocolError as e:
            if isinstance(event, h11.Request) and body_read < length:
                message = f"the request body ended after {body_read} of {length} bytes (Content-Length)"
                status = 400
            else:
                status = e.error_status_hint
                phrase = _phrase(status)
                if status == 431:
                    message = (f"{phrase}: the request line and headers are larger than "
                               f"{self.max_header_bytes} bytes")
                else:
                    message = f"{phrase}: {e}"
            return await self._answer(conn, h, t0, status, ApiError(status, "bad_http", message).to_json(), close=True)

        target = event.target.decode("ascii", "backslashreplace")
        parsed = urllib.parse.urlsplit(target)
        request = ApiRequest(method=event.method.decode("ascii", "backslashreplace"), path=parsed.path,
                             query=urllib.parse.parse_qs(parsed.query), body=b"".join(chunks), peer=conn.peer,
                             headers={k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()})
        chunks.clear()
        pid = conn.peer.pid
        slots, users = self._handler_slots.get(pid) or (asyncio.Semaphore(self.handlers_per_pid), 0)
        self._handler_slots[pid] = (slots, users + 1)
        conn.busy = True
        try:
            async with slots:
                assert self._loop is not None
                status, body = await self._loop.run_in_executor(self._pool, self.api.handle, request)
        finally:
            conn.busy = False
            slots, users = self._handler_slots[pid]
            if users <= 1:  # nobody else of this process is waiting or running: forget its slots
                del self._handler_slots[pid]
            else:
                self._handler_slots[pid] = (slots, users - 1)
        request.body = b""
        return await self._answer(conn, h, t0, status, body, head=event.method == b"HEAD", note=request.note)

    async def _answer(self, conn: _Conn, h: h11.Connection, t0: float, status: int, body: dict[str, Any], *,
                      close: bool = False, head: bool = False, note: str = "") -> bool:
        """Write one JSON answer (h11 frames it), log the request's line; False when closing."""
        # backslashreplace: a lone surrogate from the request, echoed in a message, stays valid JSON
        payload = (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload))),
                   ("Server", f"gpuctld/{__version__}")]
        if close:
            headers.append(("Connection", "close"))
        conn.busy = True
        try:
            try:
                data = h.send(h11.Response(status_code=status, headers=headers, reason=_phrase(status).encode()))
                if not head:
                    data += h.send(h11.Data(data=payload))
                data += h.send(h11.EndOfMessage())
            except h11.LocalProtocolError:  # h11 will not answer in this state (after a broken request)
                data, close = _plain_answer(status, body, head=head), True
            await self._write(conn, data)
        finally:
            conn.busy = False
            line = printable(conn.request_line() or "-")
            log.log(request_log_level(line, status), "%s \"%s\" %d %.1fms%s", conn.peer, line, status,
                    (time.monotonic() - t0) * 1000, f" {note}" if note else "")
        return not close

    async def _write(self, conn: _Conn, data: bytes) -> None:
        async with asyncio.timeout(self.write_timeout_s):
            await self._loop.sock_sendall(conn.sock, data)


def _trim_memory() -> None:
    """glibc's malloc_trim(0): give free pages of every malloc arena back to the OS (a no-op
    where the C library is not glibc)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def _plain_answer(status: int, body: dict[str, Any], *, head: bool = False) -> bytes:
    """A whole HTTP/1.1 answer with Connection: close, written without h11 (refusals before any
    request was read, and answers h11's state machine no longer allows)."""
    payload = (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")
    head_bytes = (f"HTTP/1.1 {status} {_phrase(status)}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\nConnection: close\r\nServer: gpuctld/{__version__}\r\n\r\n")
    return head_bytes.encode("ascii") + (b"" if head else payload)


# --------------------------------------------------------------------------------------------
# Binding


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
    server, listening but not yet serving: run ``server.serve_forever()`` in a thread (or
    :func:`serve_in_thread`), ``server.shutdown()`` and ``server.close()`` to stop. Raises
    SocketInUseError, OSError, ValueError (unknown group)."""
    path = Path(socket_path)
    prepare_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o117)  # the socket is created 0660, never wider even for a moment
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    # A deep backlog: a Unix socket's connect with a timeout fails at once (EAGAIN) when it is full.
    sock.listen(socket.SOMAXCONN)
    server = ApiServer(path, api, sock)
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
    """Run ``server.serve_forever`` on a daemon thread and return it once the server accepts
    connections (`poll_interval_s` is accepted for callers of the older server, and unused)."""
    t = threading.Thread(target=server.serve_forever, name="gpuctld-api", daemon=True)
    t.start()
    server._running.wait(10.0)
    return t
