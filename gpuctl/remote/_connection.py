"""The client side of the data path: one connection to a lease's worker, its op queue and flushes.

Ops that return arrays are queued with handles minted here and sent without waiting; the queue is
sent as one BATCH frame at each synchronization point (``.get()``, scalar conversion, a shape the
client could not infer, ``synchronize()``, ``memGetInfo()``), or earlier when it grows past
``MAX_QUEUED_OPS`` ops or ``FLUSH_PAYLOAD_BYTES`` of uploads (then without waiting for an answer).

``GPUCTL_ATTACH`` format: ``tcp://HOST:PORT?lease=ID&token=HEX``,
``tls://HOST:PORT?lease=ID&token=HEX[&ca=PEM_PATH][&server_name=NAME]``, or through the node's
SSH connection ``ssh://[USER@]NODE[:SSHPORT]/HOST:PORT?lease=ID&token=HEX[&known_hosts=PATH]
[&identity=PATH]`` (HOST:PORT is the worker's endpoint as the node sees it; see
gpuctl.remote._ssh).
"""

from __future__ import annotations

import math
import os
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuctl.remote._errors import OutOfMemoryError
from gpuctl.datapath.protocol import (
    FLAG_SYNC,
    GET_FRAME,
    ConnectionLost,
    MAGIC,
    PROTOCOL_VERSION,
    FrameReader,
    FrameType,
    Limits,
    ProtocolError,
    encode_meta,
    hello_meta,
    pack_header,
    parse_array_meta,
    send_frame,
    send_parts,
    tune_socket,
)

MAX_QUEUED_OPS = 4096
#: Queued ops are sent (without waiting) in batches that grow 1, 2, 4, ... up to this after each
#: synchronization, so the worker starts at once and then client and worker run in parallel.
MAX_BATCH_OPS = 64
_REPLY_LIMITS = Limits(max_payload_bytes=1 << 40)
FLUSH_PAYLOAD_BYTES = 1 << 20
#: Handles per queued free op (the worker takes at most Limits.max_seq arguments per op).
FREES_PER_OP = 4096
#: Uploads smaller than this are copied when queued (so later writes to the NumPy array do not
#: change what is sent); larger ones are sent at once.
COPY_UPLOAD_BELOW_BYTES = 1 << 16


class RemoteError(RuntimeError):
    """An op failed on the worker for a reason with no closer Python type. The message names the
    op: ``op #17 matmul(h3, h9): ...``."""


class UnknownOpError(RemoteError):
    """The worker does not allow that op (it is not in the data path's allow-list)."""


class AttachError(ConnectionError):
    """Could not attach: bad GPUCTL_ATTACH, connection refused, token refused, lease expired, or
    protocol version mismatch. The message says which, with the endpoint."""


class WorkerLostError(ConnectionError):
    """The connection to the lease's worker broke (worker ended, lease expired or revoked, or the
    network failed). Queued ops are lost; every later op raises this too."""


@dataclass(frozen=True)
class AttachSpec:
    """Where and how to attach: host, port (the worker's endpoint), lease id, token (raw bytes),
    TLS settings, and for the ssh:// form the node's SSH host, port, user, known_hosts file and
    identity file (the worker's endpoint is then as the node sees it)."""

    host: str
    port: int
    lease_id: str
    token: bytes
    tls: bool = False
    cafile: str | None = None
    server_name: str | None = None
    ssh_host: str | None = None
    ssh_port: int = 22
    ssh_user: str | None = None
    known_hosts: str | None = None
    identity: str | None = None


def parse_attach(value: str, source: str = "GPUCTL_ATTACH") -> AttachSpec:
    """Parse ``tcp://HOST:PORT?lease=ID&token=HEX``, ``tls://...&ca=PATH&server_name=NAME`` or
    ``ssh://[USER@]NODE[:SSHPORT]/HOST:PORT?lease=ID&token=HEX[&known_hosts=PATH][&identity=PATH]``.

    Raises AttachError naming `source` and the part that is wrong (the token is never echoed).
    """
    u = urllib.parse.urlsplit(value.strip())
    if u.scheme not in ("tcp", "tls", "ssh"):
        raise AttachError(f"{source}: scheme must be tcp://, tls:// or ssh://, got {u.scheme or '(none)'!r}")
    try:
        host, port = u.hostname, u.port
    except ValueError:
        host, port = None, None
    ssh: dict[str, Any] = {}
    if u.scheme == "ssh":
        if not host:
            raise AttachError(f"{source}: expected [USER@]NODE[:SSHPORT] after ssh://")
        whost, _, wport = u.path.lstrip("/").rpartition(":")
        if not whost or not wport.isdigit() or not 0 < int(wport) < 65536:
            raise AttachError(f"{source}: expected /HOST:PORT of the worker (as the node sees it) after "
                              f"ssh://{u.netloc}, got {u.path!r}")
        ssh = {"ssh_host": host, "ssh_port": port or 22, "ssh_user": u.username}
        host, port = whost.strip("[]"), int(wport)
    if not host or not port:
        raise AttachError(f"{source}: expected HOST:PORT after {u.scheme}://")
    q = urllib.parse.parse_qs(u.query)
    lease = q.get("lease", [""])[0]
    token_hex = q.get("token", [""])[0]
    if not lease:
        raise AttachError(f"{source}: missing lease=ID")
    try:
        token = bytes.fromhex(token_hex)
    except ValueError:
        raise AttachError(f"{source}: token= must be hexadecimal") from None
    if not token:
        raise AttachError(f"{source}: missing token=HEX")
    if ssh:
        ssh.update(known_hosts=q.get("known_hosts", [None])[0], identity=q.get("identity", [None])[0])
    return AttachSpec(host, port, lease, token, u.scheme == "tls", q.get("ca", [None])[0],
                      q.get("server_name", [None])[0], **ssh)


class Connection:
    """One attached lease. Thread-safe (one lock around the queue and the socket); arrays
    hold it, and their garbage collection queues ``free`` ops (sent with the next batch)."""

    def __init__(self, spec: AttachSpec, timeout_s: float = 30.0, ssh: Any = None,
                 hello: dict[str, Any] | None = None):
        """Connect and handshake. `ssh`: an open paramiko Transport or SSHClient to the node; the
        data path then runs in a direct-tcpip channel over it (spec.host:port as the node sees
        it). A spec from an ssh:// URL opens its own SSH connection. `hello`: extra HELLO fields
        (gpuctl.torch: ``{"client": "gpuctl.torch", "executor": "torch"}``). Raises AttachError."""
        self.spec = spec
        self.endpoint = f"{spec.host}:{spec.port}"
        self.lease_id = spec.lease_id
        self._lock = threading.RLock()
        self._ops: list[list] = []
        self._bufs: list[list] = []
        self._payload: list[memoryview] = []
        self._payload_bytes = 0
        self._pending_free: list[int] = []
        #: Bytes of arrays this connection made (not views) that are still alive, by handle: the
        #: client's own count for OutOfMemoryError at the allocating call (see :meth:`account`).
        self._owned: dict[int, int] = {}
        self.live_bytes = 0
        self._next_handle = 1
        self.ops_sent = 0
        self.syncs = 0
        self._flush_at = 1
        self.lost: str | None = None
        if ssh is not None or spec.ssh_host:
            if spec.tls:
                raise AttachError("attach: tls:// and an SSH connection cannot be combined (SSH already encrypts)")
            sock = _ssh_socket(spec, ssh, timeout_s)
            self.endpoint = f"{spec.host}:{spec.port} via ssh"
        else:
            try:
                sock = socket.create_connection((spec.host, spec.port), timeout=timeout_s)
            except OSError as e:
                raise AttachError(f"cannot connect to the worker of lease {spec.lease_id} at {self.endpoint}: {e}") from None
            tune_socket(sock)
        if spec.tls:
            ctx = ssl.create_default_context(cafile=spec.cafile)
            try:
                sock = ctx.wrap_socket(sock, server_hostname=spec.server_name or spec.host)
            except (ssl.SSLError, OSError) as e:
                sock.close()
                raise AttachError(f"TLS handshake with {self.endpoint} failed: {e}") from None
        self.sock = sock
        self._reader = FrameReader(sock)
        try:
            send_frame(sock, FrameType.HELLO, {**hello_meta(spec.lease_id), **(hello or {})},
                       [memoryview(spec.token)])
            hdr = self._reader.header(Limits(max_meta_bytes=1 << 16, max_payload_bytes=0))
            meta = self._reader.meta(hdr)
        except (ProtocolError, OSError) as e:
            sock.close()
            raise AttachError(f"handshake with the worker of lease {spec.lease_id} at {self.endpoint} failed: {e}") from None
        if hdr.ftype == FrameType.ERROR:
            sock.close()
            raise AttachError(f"worker at {self.endpoint} refused lease {spec.lease_id}: {meta.get('message')}")
        if hdr.ftype != FrameType.WELCOME:
            sock.close()
            raise AttachError(f"worker at {self.endpoint} answered {hdr.ftype.name} to HELLO")
        sock.settimeout(None)
        self.welcome = meta
        self.executor: str = meta.get("executor", "?")
        self.quota_bytes: int = int(meta.get("quota_bytes", 0))

    # -- queue ---------------------------------------------------------------------------------
    def mint(self) -> int:
        """A new handle number (unique on this connection)."""
        with self._lock:
            h = self._next_handle
            self._next_handle += 1
            return h

    def enqueue(self, name: str, outs: list[int], args: list, kwargs: dict | None = None) -> None:
        """Queue one op (args already encoded). Sends a non-waiting batch when the queue is long."""
        with self._lock:
            self._check()
            if self._pending_free:
                self._take_frees()
            self._ops.append([name, outs, args, kwargs] if kwargs else [name, outs, args])
            if len(self._ops) >= self._flush_at:
                self._send_batch(sync=False)
                self._flush_at = min(self._flush_at * 2, MAX_BATCH_OPS)

    def upload(self, arr: np.ndarray, extra: tuple = ()) -> int:
        """Queue an upload of host array `arr` (C order); returns its new handle. Small arrays are
        copied now, large ones are sent now (zero-copy), so later writes to `arr` do not leak in.
        `extra`: more arguments of the upload op (a torch connection's dtype and shape)."""
        arr = np.asarray(arr)
        if arr.dtype.kind == "O" or str(arr.dtype) not in _WIRE_DTYPES:
            raise TypeError(f"cannot send an array of dtype {arr.dtype} (allowed: {', '.join(sorted(_WIRE_DTYPES))})")
        small = arr.nbytes < COPY_UPLOAD_BELOW_BYTES
        arr = np.array(arr, order="C", copy=True) if small else np.ascontiguousarray(arr)
        with self._lock:
            self._check()
            if self._pending_free:
                self._take_frees()
            h = self.mint()
            self.account(h, arr.nbytes, f"upload of {arr.dtype} {arr.shape}")
            k = len(self._bufs)
            self._bufs.append([str(arr.dtype), list(arr.shape)])
            if arr.nbytes:
                self._payload.append(memoryview(arr).cast("B"))
            self._payload_bytes += arr.nbytes
            self._ops.append(["upload", [h], [k, *extra]])
            if not small or self._payload_bytes >= FLUSH_PAYLOAD_BYTES or len(self._ops) >= MAX_QUEUED_OPS:
                self._send_batch(sync=False)
            return h

    def free_later(self, h: int) -> None:
        """Called from ndarray.__del__: never takes the lock; the free goes with the next batch."""
        self._pending_free.append(h)

    def _take_frees(self) -> None:
        frees, self._pending_free[:] = list(self._pending_free), []
        owned = self._owned
        for h in frees:
            self.live_bytes -= owned.pop(h, 0)
        for i in range(0, len(frees), FREES_PER_OP):  # an op's arguments are bounded (Limits.max_seq)
            self._ops.append(["free", [], [{"h": h} for h in frees[i:i + FREES_PER_OP]]])

    def account(self, h: int, nbytes: int, what: str) -> None:
        """Count `nbytes` of a new array (handle `h`) made by this connection, and raise
        OutOfMemoryError at the allocating call, as CuPy does, when it cannot fit in the slice.

        The client's count (live arrays it made, views not counted) is a lower bound of the lease's
        use; when it says the new array does not fit, the worker is asked (one ``mem`` round trip,
        which also counts the lease's other connections) and OutOfMemoryError is raised only when
        the worker's figure agrees. The worker's own check stays the authority for anything this
        count cannot see (temporaries, views copied by reshape)."""
        quota = self.quota_bytes
        if quota and self.live_bytes + nbytes > quota:
            with self._lock:
                if self._pending_free:
                    self._take_frees()
                if self.live_bytes + nbytes > quota:
                    if nbytes > quota:
                        raise OutOfMemoryError(f"{what}: slice memory quota exceeded: needs {nbytes} bytes, more "
                                               f"than the quota of {quota} bytes")
                    mem = self.sync("mem")
                    in_use = int(mem["total_bytes"]) - int(mem["free_bytes"])
                    if in_use + nbytes > quota:
                        raise OutOfMemoryError(f"{what}: slice memory quota exceeded: needs {nbytes} bytes, "
                                               f"{in_use} of {quota} bytes in use")
                    self.live_bytes = min(self.live_bytes, in_use)
        self._owned[h] = nbytes
        self.live_bytes += nbytes

    def _check(self) -> None:
        if self.lost is not None:
            raise WorkerLostError(self.lost)

    def _lose(self, e: BaseException) -> WorkerLostError:
        self.lost = (f"lost the connection to the worker of lease {self.lease_id} at {self.endpoint} "
                     f"(worker ended, lease expired or revoked, or network failure): {e}")
        try:
            self.sock.close()
        except OSError:
            pass
        return WorkerLostError(self.lost)

    def _send_batch(self, sync: bool, query: list | None = None, tail: bytes | None = None) -> None:
        """Send the queue as one BATCH (with `query` appended; SYNC when `sync`), then `tail` (a
        whole frame, e.g. a GET) in the same sendmsg."""
        if query is not None:
            self._ops.append(query)
        meta = {"ops": self._ops}
        if self._bufs:
            meta["bufs"] = self._bufs
        meta_b = encode_meta(meta)
        parts = [memoryview(pack_header(FrameType.BATCH, len(meta_b), self._payload_bytes, FLAG_SYNC if sync else 0)),
                 memoryview(meta_b), *self._payload]
        if tail is not None:
            parts.append(memoryview(tail))
        self.ops_sent += len(self._ops)
        self._ops, self._bufs, self._payload, self._payload_bytes = [], [], [], 0
        try:
            send_parts(self.sock, parts)
        except ProtocolError as e:
            raise self._lose(e) from None

    # -- synchronization -----------------------------------------------------------------------
    def flush(self) -> None:
        """Send queued ops without waiting for an answer (not a synchronization point)."""
        with self._lock:
            self._check()
            if self._pending_free:
                self._take_frees()
            if self._ops:
                self._send_batch(sync=False)

    def get(self, h: int, out: np.ndarray | None = None) -> np.ndarray:
        """Fetch array `h` to the host: the hot path of ``.get()`` and ``float(x)`` (a
        synchronization point). Queued ops go first (one non-SYNC BATCH) and a GET frame follows
        in the same sendmsg; the worker answers one ARRAY frame, received with usually one
        recv_into (into `out` when it has the right shape/dtype and is C-contiguous). Raises the
        first error of a queued op (naming it) or WorkerLostError."""
        with self._lock:
            if self.lost is not None:
                raise WorkerLostError(self.lost)
            if self._pending_free:
                self._take_frees()
            frame = GET_FRAME.pack(MAGIC, PROTOCOL_VERSION, FrameType.GET, 0, 8, 0, h)
            try:
                if self._ops:
                    self._send_batch(sync=False, tail=frame)
                else:
                    self.sock.sendall(frame)
            except ProtocolError as e:
                raise self._lose(e) from None
            except OSError as e:
                raise self._lose(ConnectionLost(f"send: connection broken ({e})")) from None
            self.ops_sent += 1
            self.syncs += 1
            self._flush_at = 1
            return self._read_reply("get", out)

    def sync(self, name: str = "sync", args: list | None = None, out: np.ndarray | None = None) -> Any:
        """Send the queue plus one query op (get, meta, mem, stats, sync) flagged SYNC, wait for
        the REPLY and return the query's answer: for ``get``, a NumPy array (received into `out`
        when it has the right shape/dtype, else into a new one). Raises the first error of a queued
        op (OutOfMemoryError, ValueError, ... naming the op) or WorkerLostError."""
        with self._lock:
            self._check()
            if self._pending_free:
                self._take_frees()
            self._send_batch(sync=True, query=[name, [], args or []])
            self.syncs += 1
            self._flush_at = 1
            return self._read_reply(name, out)

    def _read_reply(self, name: str, out: np.ndarray | None) -> Any:
        """Receive the answer to a synchronization point (called with the lock held): an ARRAY
        frame (the array) or a REPLY (the last query's result, or its error raised)."""
        reader = self._reader
        try:
            hdr = reader.header(_REPLY_LIMITS)
            ftype = hdr.ftype
            if ftype is FrameType.ARRAY:
                _, dtype, shape = parse_array_meta(reader.take(hdr.meta_len), hdr.payload_len, _REPLY_LIMITS)
                if out is None or out.shape != shape or out.dtype.name != dtype or not out.flags.c_contiguous:
                    out = np.empty(shape, dtype)
                if hdr.payload_len:
                    reader.read_into(memoryview(out).cast("B"), "reply payload")
                return out
            if ftype is FrameType.ERROR:
                meta = reader.meta(hdr)
                raise self._lose(f"worker closed the connection: {meta.get('message')}")
            if ftype is not FrameType.REPLY:
                raise ProtocolError(f"expected REPLY, got {hdr.ftype.name}")
            meta = reader.meta(hdr)
            results, err = meta.get("results"), meta.get("error")
            if not isinstance(results, (list, type(None))) or not isinstance(err, (dict, type(None))):
                raise ProtocolError("REPLY: results must be a list and error an object or null", "bad_meta")
            result = (results or [None])[-1]
            value: Any = result
            if name == "get" and result is not None:
                shape, dtype = _reply_array(result, hdr.payload_len)
            elif hdr.payload_len:
                raise ProtocolError(f"REPLY: {hdr.payload_len} payload bytes with no array to receive", "bad_meta")
            if name == "get" and result is not None and hdr.payload_len:
                if out is None or out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
                    out = np.empty(shape, dtype)
                if out.nbytes != hdr.payload_len:
                    raise ProtocolError(f"REPLY: shape {shape} of {dtype} is not header.payload_len "
                                        f"{hdr.payload_len} bytes", "bad_meta")
                reader.read_into(memoryview(out).cast("B"), "reply payload")
                value = out
            elif name == "get" and result is not None:
                value = np.empty(shape, dtype)
        except WorkerLostError:
            raise
        except (ProtocolError, OSError) as e:
            raise self._lose(e) from None
        if err:
            raise make_error(err)
        return value

    def close(self) -> None:
        """Say BYE and close (handles of this connection are freed by the worker)."""
        with self._lock:
            if self.lost is None:
                try:
                    self.flush()
                    send_frame(self.sock, FrameType.BYE, b"")
                except (ProtocolError, WorkerLostError, OSError):
                    pass
                self.lost = f"connection to lease {self.lease_id} was closed by this client"
            try:
                self.sock.close()
            except OSError:
                pass


def _reply_array(result: Any, payload_len: int) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a REPLY's ``get`` result, checked before any array is made: the dtype
    one of the wire dtypes (never ``O``: an object array built from received bytes would be
    forged pointers), the shape at most 32 non-negative ints of at most 2^36 elements, and
    size x itemsize equal to the payload. Raises ProtocolError("bad_meta") otherwise."""
    shape = result.get("shape") if isinstance(result, dict) else None
    dtype = result.get("dtype") if isinstance(result, dict) else None
    limit = _REPLY_LIMITS.max_elements
    if dtype not in _WIRE_DTYPES:
        raise ProtocolError(f"REPLY: get result dtype {str(dtype)[:40]!r} is not a wire dtype", "bad_meta")
    if not (isinstance(shape, list) and len(shape) <= _REPLY_LIMITS.max_ndim
            and all(type(d) is int and 0 <= d <= limit for d in shape) and math.prod(shape) <= limit):
        raise ProtocolError(f"REPLY: get result shape {str(shape)[:80]} is not at most "
                            f"{_REPLY_LIMITS.max_ndim} dims of at most {limit} elements", "bad_meta")
    dt = np.dtype(dtype)
    if payload_len and math.prod(shape) * dt.itemsize != payload_len:
        raise ProtocolError(f"REPLY: shape {tuple(shape)} of {dtype} is not header.payload_len {payload_len} bytes",
                            "bad_meta")
    return tuple(shape), dt


def _ssh_socket(spec: AttachSpec, ssh: Any, timeout_s: float) -> Any:
    """The data path's socket through SSH (gpuctl.remote._ssh); AttachError on any failure."""
    from gpuctl.remote import _ssh

    owned = None
    try:
        if ssh is None:
            ssh = owned = _ssh.connect(spec.ssh_host, spec.ssh_port, spec.ssh_user, spec.known_hosts, spec.identity,
                                       timeout_s)
        sock = _ssh.open_channel(ssh, spec.host, spec.port, spec.lease_id, timeout_s)
    except ConnectionError as e:
        if owned is not None:
            owned.close()
        raise AttachError(str(e)) from None
    sock._owned = owned
    sock.settimeout(timeout_s)  # for the handshake; cleared after WELCOME
    return sock


_WIRE_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()
)


def make_error(err: dict[str, Any]) -> Exception:
    """The client-side exception for a worker's error record {"type", "message", "op"}."""
    etype, msg = err.get("type"), str(err.get("message"))
    cls = {
        "OutOfMemoryError": OutOfMemoryError,
        "ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError,
        "ZeroDivisionError": ZeroDivisionError, "NotImplementedError": NotImplementedError,
        "FloatingPointError": FloatingPointError, "OverflowError": OverflowError,
        "UnknownOpError": UnknownOpError, "LinAlgError": np.linalg.LinAlgError,
    }.get(etype, RemoteError)
    return cls(msg)


# -- the default connection -------------------------------------------------------------------
_default: Connection | None = None
_default_lock = threading.Lock()


def resolve_attach(endpoint: str | None = None, token: str | bytes | None = None, lease_id: str | None = None, *,
                   tls: bool = False, cafile: str | None = None, server_name: str | None = None,
                   api: str = "gpuctl.remote") -> AttachSpec:
    """The AttachSpec that ``attach(...)`` of `api` (gpuctl.remote, gpuctl.torch) means: `endpoint`
    as a ``tcp://`` / ``tls://`` / ``ssh://`` URL, or "HOST:PORT" with `token` (hex str or raw
    bytes) and `lease_id`; None reads ``GPUCTL_ATTACH``. Raises AttachError naming what is wrong
    (unset variable, bad URL, HOST:PORT without its token or lease id)."""
    if endpoint is None:
        value = os.environ.get("GPUCTL_ATTACH")
        if not value:
            raise AttachError(f"GPUCTL_ATTACH is not set: run under `gpuctl run` or call {api}.attach(...)")
        return parse_attach(value)
    if "://" in endpoint:
        return parse_attach(endpoint, "endpoint")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise AttachError(f"endpoint: expected HOST:PORT, got {endpoint!r}")
    if token is None or lease_id is None:
        raise AttachError("attach: token and lease_id are needed with a HOST:PORT endpoint")
    tok = bytes.fromhex(token) if isinstance(token, str) else bytes(token)
    return AttachSpec(host.strip("[]"), int(port), lease_id, tok, tls, cafile, server_name)


def attach(endpoint: str | None = None, token: str | bytes | None = None, lease_id: str | None = None, *,
           tls: bool = False, cafile: str | None = None, server_name: str | None = None,
           ssh: Any = None) -> Connection:
    """Attach to a lease's worker and make it the default connection of ``gpuctl.remote``.

    Either `endpoint` as a full ``tcp://...`` / ``tls://...`` / ``ssh://...`` URL (see module
    docstring), or endpoint "host:port" with `token` (hex str or raw bytes) and `lease_id`; with
    no endpoint, ``GPUCTL_ATTACH`` is read. `ssh`: an open paramiko Transport or SSHClient to the
    node: the data path then goes through that SSH connection (a direct-tcpip channel to the
    worker's endpoint as the node sees it; the connection stays the caller's). Raises AttachError
    (bad spec, refused token, unreachable worker, SSH channel refused).
    """
    global _default
    spec = resolve_attach(endpoint, token, lease_id, tls=tls, cafile=cafile, server_name=server_name)
    conn = Connection(spec, ssh=ssh)
    with _default_lock:
        old, _default = _default, conn
    if old is not None:
        old.close()
    return conn


def get_connection() -> Connection:
    """The default connection, attaching from GPUCTL_ATTACH on first use."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Connection(resolve_attach())
    return _default


def detach() -> None:
    """Close the default connection (the worker frees its arrays)."""
    global _default
    with _default_lock:
        old, _default = _default, None
    if old is not None:
        old.close()
