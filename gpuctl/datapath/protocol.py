"""Wire format of the remote-attach data path: frames, limits, value codec, handshake.

A frame is a fixed 20-byte header (``HEADER``, little endian), then ``meta_len`` bytes of
metadata, then ``payload_len`` bytes of raw array data::

    magic b"GCDP" | version u8 | frame type u8 | flags u16 | meta_len u32 | payload_len u64

Metadata is UTF-8 JSON (an object) on every frame type except the two of the hot path, GET and
ARRAY (protocol 2), whose metadata is fixed binary (``GET_META``, ``ARRAY_META``): a scalar
``float(x)`` costs one small frame each way and no JSON.

Nothing is unpickled or evaluated: metadata is JSON decoded into dicts/lists/str/numbers, and the
values inside op arguments go through :func:`decode_value`, which accepts only a fixed set of
tagged forms (handle, slice, Ellipsis, dtype, complex) and bounds depth and length. Every length
and count is bounded by :class:`Limits`; a frame over a limit raises :class:`ProtocolError` and
the connection is closed (after an ERROR frame when the socket still works).

Raw array bytes travel without copies: senders pass memoryviews to ``socket.sendmsg`` (plain TCP)
and receivers ``recv_into`` preallocated arrays. docs/DATAPATH.md is the full description.
"""

from __future__ import annotations

import enum
import json
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as _np

#: Protocol version spoken by this code; the handshake refuses any other. 2: GET/ARRAY frames
#: with binary metadata (version 1 had only JSON metadata).
PROTOCOL_VERSION = 2

MAGIC = b"GCDP"
HEADER = struct.Struct("<4sBBHIQ")
HEADER_SIZE = HEADER.size  # 20 bytes

#: dtypes that may cross the wire or be named in an op (names as numpy spells them). Their order
#: is the dtype code of ARRAY frames (0 = bool ... 13 = complex128): never reorder.
WIRE_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float16", "float32", "float64", "complex64", "complex128")
ALLOWED_DTYPES = frozenset(WIRE_DTYPES)
DTYPE_CODES = {name: i for i, name in enumerate(WIRE_DTYPES)}
#: The same codes keyed by (native byte order) numpy dtype objects: a dict hit, no name lookup.
NP_DTYPE_CODES = {_np.dtype(name): i for i, name in enumerate(WIRE_DTYPES)}

#: GET metadata: the handle (u64). A whole GET frame is ``GET_FRAME`` (header + handle, 28 bytes).
GET_META = struct.Struct("<Q")
GET_FRAME = struct.Struct("<4sBBHIQQ")
#: ARRAY metadata: seq u64 (ops of the connection so far), dtype code u8, ndim u8, then ndim
#: dims as u64 (``DIMS[ndim]``); the payload is the array's bytes in C order.
ARRAY_META = struct.Struct("<QBB")
MAX_NDIM = 32
DIMS = tuple(struct.Struct("<" + "Q" * n) for n in range(MAX_NDIM + 1))
#: A whole ARRAY frame head (header then metadata) for each ndim, packed in one call.
ARRAY_HEADS = tuple(struct.Struct("<4sBBHIQQBB" + "Q" * n) for n in range(MAX_NDIM + 1))


class FrameType(enum.IntEnum):
    """Frame types. Client -> worker: HELLO, BATCH, GET, BYE. Worker -> client: WELCOME, REPLY,
    ARRAY, ERROR. GET (binary meta: a handle) is a SYNC point that fetches one array; the worker
    answers ARRAY (binary meta: shape and dtype; payload: the bytes) or, when an op failed since
    the last synchronization, REPLY with the error."""

    HELLO = 1
    WELCOME = 2
    BATCH = 3
    REPLY = 4
    ERROR = 5
    BYE = 6
    GET = 7
    ARRAY = 8


_FRAME_TYPES = {int(t): t for t in FrameType}


#: Flag on a BATCH: the client waits for one REPLY (a synchronization point).
FLAG_SYNC = 0x1


@dataclass(frozen=True)
class Limits:
    """Bounds on everything a peer can make the other side allocate or loop over.

    max_meta_bytes: metadata JSON per frame (bytes). max_payload_bytes: raw data per frame (bytes).
    max_ops: operations per BATCH. max_buffers: raw buffers per BATCH. max_ndim: array rank.
    max_elements: elements of one array. max_handles: live handles per connection. max_depth:
    nesting of argument values. max_seq: elements of one argument list/tuple. max_token_bytes:
    length of a lease token.
    """

    max_meta_bytes: int = 8 << 20
    max_payload_bytes: int = 4 << 30
    max_ops: int = 1 << 16
    max_buffers: int = 1 << 12
    max_ndim: int = 32
    max_elements: int = 1 << 36
    max_handles: int = 1 << 20
    max_depth: int = 8
    max_seq: int = 1 << 12
    max_token_bytes: int = 256

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


DEFAULT_LIMITS = Limits()


class ProtocolError(Exception):
    """A peer broke the protocol (bad magic, version, frame type, lengths over limits, bad JSON,
    truncated frame). The connection is closed; ``code`` is a stable machine-readable reason."""

    def __init__(self, message: str, code: str = "protocol"):
        super().__init__(message)
        self.code = code


class FrameRefused(ProtocolError):
    """A frame whose framing is sound (header within limits, metadata read whole) but whose
    metadata fields are refused (not JSON, not an object, a field of the wrong type or over a
    limit). The receiver skips the rest of the frame, answers ERROR and keeps the connection."""


class ConnectionLost(ProtocolError):
    """The peer closed the connection (or it broke) in the middle of or between frames."""

    def __init__(self, message: str):
        super().__init__(message, code="connection_lost")


@dataclass(slots=True)
class Header:
    """A decoded frame header (see the module docstring for the layout)."""

    version: int
    ftype: FrameType
    flags: int
    meta_len: int
    payload_len: int


def pack_header(ftype: int, meta_len: int, payload_len: int, flags: int = 0) -> bytes:
    """The 20 header bytes of a frame."""
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, int(ftype), flags, meta_len, payload_len)


def parse_header(buf: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Header:
    """Decode and bound-check 20 header bytes.

    Raises ProtocolError (code "bad_magic", "version", "frame_type", "oversized") naming the field.
    """
    if len(buf) != HEADER_SIZE:
        raise ProtocolError(f"header: {len(buf)} bytes, expected {HEADER_SIZE}", "truncated")
    return _parse_header_at(buf, 0, limits)


def _parse_header_at(buf: bytes | bytearray | memoryview, offset: int, limits: Limits) -> Header:
    magic, version, ftype, flags, meta_len, payload_len = HEADER.unpack_from(buf, offset)
    ft = _FRAME_TYPES.get(ftype)
    if ft is not None and magic == MAGIC and version == PROTOCOL_VERSION and meta_len <= limits.max_meta_bytes \
            and payload_len <= limits.max_payload_bytes:
        return Header(version, ft, flags, meta_len, payload_len)
    if magic != MAGIC:
        raise ProtocolError(f"header.magic: {bytes(magic)!r} is not {MAGIC!r}", "bad_magic")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"header.version: protocol {version} not supported (this side speaks {PROTOCOL_VERSION})",
            "version",
        )
    if ft is None:
        raise ProtocolError(f"header.type: unknown frame type {ftype}", "frame_type")
    if meta_len > limits.max_meta_bytes:
        raise ProtocolError(
            f"header.meta_len: {meta_len} bytes exceeds the limit of {limits.max_meta_bytes}", "oversized"
        )
    if payload_len > limits.max_payload_bytes:
        raise ProtocolError(
            f"header.payload_len: {payload_len} bytes exceeds the limit of {limits.max_payload_bytes}",
            "oversized",
        )
    return Header(version, ft, flags, meta_len, payload_len)


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=True)
_DECODER = json.JSONDecoder()


def encode_meta(meta: dict[str, Any]) -> bytes:
    """Metadata as compact UTF-8 JSON."""
    return _ENCODER.encode(meta).encode()


def decode_meta(buf: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse metadata JSON; it must be an object. Raises ProtocolError("bad_meta") otherwise."""
    try:
        meta = _DECODER.decode(str(buf, "utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ProtocolError(f"meta: not valid JSON ({str(e)[:120]})", "bad_meta") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"meta: expected a JSON object, got {type(meta).__name__}", "bad_meta")
    return meta


# ---------------------------------------------------------------------------------------------
# socket I/O


def recv_exact_into(sock: socket.socket, view: memoryview, what: str = "frame") -> None:
    """Fill `view` entirely from `sock` (recv_into loop, no copies).

    Raises ConnectionLost naming `what` and how many bytes arrived when the peer closes early.
    """
    n = len(view)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        except (ConnectionError, OSError) as e:
            raise ConnectionLost(f"{what}: connection broken after {got} of {n} bytes ({e})") from None
        if k == 0:
            raise ConnectionLost(f"{what}: connection closed after {got} of {n} bytes")
        got += k


def recv_header(sock: socket.socket, limits: Limits = DEFAULT_LIMITS) -> Header:
    """Read and check one frame header. ConnectionLost("...closed after 0 of 20") at a clean EOF."""
    buf = bytearray(HEADER_SIZE)
    recv_exact_into(sock, memoryview(buf), "header")
    return parse_header(buf, limits)


def recv_meta(sock: socket.socket, hdr: Header) -> dict[str, Any]:
    """Read and decode the metadata of a frame whose header was just read."""
    if hdr.meta_len == 0:
        return {}
    buf = bytearray(hdr.meta_len)
    recv_exact_into(sock, memoryview(buf), "meta")
    return decode_meta(buf)


#: Receive buffer of a FrameReader (bytes): a whole small frame arrives in one recv_into.
READ_BUFFER_BYTES = 1 << 16


class FrameReader:
    """Reads the frames of one connection through a fixed receive buffer of `buffer_bytes`.

    One ``recv_into`` usually brings a whole small frame (header, metadata and a small payload);
    bytes past the current frame stay buffered for the next one. Payloads larger than half the
    buffer bypass it (``recv_into`` straight into the destination, no copy). The buffer is
    allocated once; nothing a peer sends makes it grow (longer metadata is read into its own
    buffer, bounded by the header's limits). One reader per connection, used by one thread.
    Raises ConnectionLost when the peer closes or the socket breaks (``socket.timeout`` too).
    """

    def __init__(self, sock: socket.socket, buffer_bytes: int = READ_BUFFER_BYTES):
        self.sock = sock
        self._buf = bytearray(buffer_bytes)
        self._view = memoryview(self._buf)
        self._size = buffer_bytes
        self._pos = 0
        self._end = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed."""
        return self._end - self._pos

    def _fill(self, need: int, what: str) -> None:
        """Have at least `need` (<= buffer size) bytes buffered from the current position."""
        have = self._end - self._pos
        if not have:
            self._pos = self._end = 0
        elif self._pos + need > self._size:
            self._view[:have] = self._view[self._pos:self._end]
            self._pos, self._end = 0, have
        while have < need:
            try:
                k = self.sock.recv_into(self._view[self._end:])
            except (ConnectionError, OSError) as e:
                raise ConnectionLost(f"{what}: connection broken after {have} of {need} bytes ({e})") from None
            if k == 0:
                raise ConnectionLost(f"{what}: connection closed after {have} of {need} bytes")
            self._end += k
            have += k

    def header(self, limits: Limits = DEFAULT_LIMITS) -> Header:
        """Read and check the next frame header (see :func:`parse_header` for its errors)."""
        if self._end - self._pos < HEADER_SIZE:
            self._fill(HEADER_SIZE, "header")
        p = self._pos
        hdr = _parse_header_at(self._buf, p, limits)
        self._pos = p + HEADER_SIZE
        return hdr

    def take(self, n: int, what: str = "meta") -> memoryview:
        """The next `n` (<= buffer size) bytes as a view into the buffer, valid until the next read."""
        if self._end - self._pos < n:
            self._fill(n, what)
        p = self._pos
        self._pos = p + n
        return self._view[p:p + n]

    def meta(self, hdr: Header) -> dict[str, Any]:
        """Read and decode the JSON metadata of the frame whose header was just read."""
        n = hdr.meta_len
        if n == 0:
            return {}
        if n <= self._size:
            return decode_meta(self.take(n))
        buf = bytearray(n)
        self.read_into(memoryview(buf), "meta")
        return decode_meta(buf)

    def read_into(self, view: memoryview, what: str = "payload") -> None:
        """Fill the byte view `view` entirely: buffered bytes first, then from the socket."""
        n = len(view)
        k = min(self._end - self._pos, n)
        if k:
            view[:k] = self._view[self._pos:self._pos + k]
            self._pos += k
        rest = n - k
        if not rest:
            return
        if rest <= self._size >> 1:
            self._fill(rest, what)
            view[k:] = self._view[self._pos:self._pos + rest]
            self._pos += rest
        else:
            recv_exact_into(self.sock, view[k:], what)

    def skip(self, n: int, what: str = "payload") -> None:
        """Read and discard `n` bytes (a payload whose buffer was refused)."""
        k = min(self._end - self._pos, n)
        self._pos += k
        n -= k
        while n:
            k = min(n, self._size)
            self._fill(k, what)
            self._pos += k
            n -= k


def array_meta(seq: int, dtype_code: int, shape: tuple[int, ...]) -> bytes:
    """The binary metadata of an ARRAY frame (``ARRAY_META`` then the dims)."""
    return ARRAY_META.pack(seq, dtype_code, len(shape)) + DIMS[len(shape)].pack(*shape)


def parse_array_meta(buf: bytes | bytearray | memoryview, payload_len: int,
                     limits: Limits = DEFAULT_LIMITS) -> tuple[int, str, tuple[int, ...]]:
    """Decode and check an ARRAY frame's metadata: (seq, dtype name, shape).

    Raises ProtocolError("bad_meta"/"oversized") naming the field when the length, dtype code,
    ndim, a dimension or the element count (each <= limits.max_elements) or the payload length
    (must be size x itemsize) is wrong.
    """
    n = len(buf)
    if n < ARRAY_META.size:
        raise ProtocolError(f"ARRAY meta: {n} bytes, expected at least {ARRAY_META.size}", "bad_meta")
    seq, code, ndim = ARRAY_META.unpack_from(buf, 0)
    if code >= len(WIRE_DTYPES):
        raise ProtocolError(f"ARRAY meta.dtype: unknown dtype code {code}", "bad_meta")
    if ndim > min(limits.max_ndim, MAX_NDIM) or n != ARRAY_META.size + 8 * ndim:
        raise ProtocolError(f"ARRAY meta: {n} bytes do not hold {ndim} dims (ndim limit {limits.max_ndim})",
                            "bad_meta")
    shape = DIMS[ndim].unpack_from(buf, ARRAY_META.size)
    size = 1
    for d in shape:
        if d > limits.max_elements:  # (0, 2**64-1) has no elements but no array can have that shape
            raise ProtocolError(f"ARRAY meta.shape: dimension {d} (limit {limits.max_elements})", "oversized")
        size *= d
    if size > limits.max_elements:
        raise ProtocolError(f"ARRAY meta.shape: {size} elements (limit {limits.max_elements})", "oversized")
    dtype = WIRE_DTYPES[code]
    if size * _ITEMSIZE[dtype] != payload_len:
        raise ProtocolError(f"ARRAY: shape {shape} of {dtype} is not header.payload_len {payload_len} bytes",
                            "bad_meta")
    return seq, dtype, shape


_ITEMSIZE = {"bool": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4,
             "uint64": 8, "float16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}


def drain(sock: socket.socket, nbytes: int, scratch: memoryview | None = None) -> None:
    """Read and discard `nbytes` from `sock` (a payload whose buffer was refused)."""
    scratch = scratch if scratch is not None else memoryview(bytearray(min(nbytes, 1 << 20) or 1))
    left = nbytes
    while left:
        k = min(left, len(scratch))
        recv_exact_into(sock, scratch[:k], "payload")
        left -= k


def send_frame(
    sock: socket.socket,
    ftype: int,
    meta: dict[str, Any] | bytes,
    buffers: Iterable[memoryview] = (),
    flags: int = 0,
) -> int:
    """Send one frame: header, metadata and raw buffers, in one ``sendmsg`` where the socket allows.

    `buffers` are sent as they are (memoryviews of C-contiguous arrays: no copy). Returns the
    number of bytes sent. Raises ConnectionLost when the peer is gone.
    """
    meta_b = meta if isinstance(meta, (bytes, bytearray)) else encode_meta(meta)
    bufs = [b if isinstance(b, memoryview) else memoryview(b) for b in buffers]
    bufs = [b.cast("B") if (b.format != "B" or b.ndim != 1) else b for b in bufs]
    payload_len = sum(len(b) for b in bufs)
    parts = [memoryview(pack_header(ftype, len(meta_b), payload_len, flags)), memoryview(meta_b)]
    parts.extend(b for b in bufs if len(b))
    send_parts(sock, parts)
    return HEADER_SIZE + len(meta_b) + payload_len


def send_parts(sock: socket.socket, parts: list[memoryview]) -> None:
    """Send every part in order. Plain sockets: scatter-gather ``sendmsg`` (handles partial sends);
    TLS sockets (no sendmsg): ``sendall`` per part. Raises ConnectionLost."""
    parts = [p for p in parts if len(p)]
    try:
        if not hasattr(sock, "sendmsg") or _is_tls(sock):
            for p in parts:
                sock.sendall(p)
            return
        i = 0
        while i < len(parts):
            batch = parts[i : i + 64]
            sent = sock.sendmsg(batch)
            while sent:
                head = parts[i]
                if sent >= len(head):
                    sent -= len(head)
                    i += 1
                else:
                    parts[i] = head[sent:]
                    sent = 0
    except (ConnectionError, OSError) as e:
        raise ConnectionLost(f"send: connection broken ({e})") from None


def _is_tls(sock: socket.socket) -> bool:
    return isinstance(sock, ssl.SSLSocket)


def tune_socket(sock: socket.socket, buffer_bytes: int = 4 << 20) -> None:
    """TCP_NODELAY and large socket buffers (both directions) on a TCP socket; no-op otherwise."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# argument values


#: Longest string argument (RawKernel source is the longest legitimate one).
MAX_STRING_CHARS = 1 << 20


class Handle(int):
    """A decoded handle reference ``{"h": N}`` (an int subclass so that it is cheap to look up)."""


def decode_value(v: Any, limits: Limits = DEFAULT_LIMITS, depth: int = 0) -> Any:
    """Decode one op argument from its JSON form, accepting only these forms:

    null/bool/int/float/str as themselves; a JSON list -> tuple (of decoded values);
    ``{"h": N}`` -> :class:`Handle`; ``{"s": [start, stop, step]}`` -> slice of ints/None;
    ``{"e": 1}`` -> Ellipsis; ``{"d": "float32"}`` -> a dtype name from ALLOWED_DTYPES (str
    wrapped as :class:`DType`); ``{"c": [re, im]}`` -> complex.

    Raises ValueError naming what is wrong (depth, length, unknown tag, wrong types).
    """
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, str) and len(v) > MAX_STRING_CHARS:
            raise ValueError(f"string argument of {len(v)} characters (limit {MAX_STRING_CHARS})")
        return v
    if depth >= limits.max_depth:
        raise ValueError(f"argument nested deeper than {limits.max_depth}")
    if isinstance(v, list):
        if len(v) > limits.max_seq:
            raise ValueError(f"argument list of {len(v)} items (limit {limits.max_seq})")
        return tuple(decode_value(x, limits, depth + 1) for x in v)
    if isinstance(v, dict):
        if len(v) != 1:
            raise ValueError(f"tagged value must have exactly one key, got {sorted(v)[:4]}")
        (tag, x), = v.items()
        if tag == "h":
            if type(x) is not int or x < 0:
                raise ValueError(f"handle must be a non-negative integer, got {x!r}")
            return Handle(x)
        if tag == "s":
            if not (isinstance(x, list) and len(x) == 3 and all(e is None or type(e) is int for e in x)):
                raise ValueError(f"slice must be [start, stop, step] of integers or null, got {x!r}")
            return slice(*x)
        if tag == "e":
            return Ellipsis
        if tag == "d":
            if not isinstance(x, str) or x not in ALLOWED_DTYPES:
                raise ValueError(f"dtype {x!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_DTYPES))})")
            return DType(x)
        if tag == "c":
            if not (isinstance(x, list) and len(x) == 2 and all(isinstance(e, (int, float)) for e in x)):
                raise ValueError(f"complex must be [re, im], got {x!r}")
            return complex(x[0], x[1])
        raise ValueError(f"unknown tagged value {tag!r}")
    raise ValueError(f"argument of type {type(v).__name__} is not allowed")


class DType(str):
    """A decoded dtype name (validated against ALLOWED_DTYPES)."""


def describe_value(v: Any) -> str:
    """A short human form of a decoded argument for error messages: handles as ``h3``."""
    if isinstance(v, Handle):
        return f"h{int(v)}"
    if isinstance(v, tuple):
        return "(" + ", ".join(describe_value(x) for x in v[:6]) + (", ..." if len(v) > 6 else "," if len(v) == 1 else "") + ")"
    if isinstance(v, slice):
        return f"{'' if v.start is None else v.start}:{'' if v.stop is None else v.stop}" + (
            f":{v.step}" if v.step is not None else ""
        )
    if v is Ellipsis:
        return "..."
    if isinstance(v, DType):
        return str(v)
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


# ---------------------------------------------------------------------------------------------
# handshake


def hello_meta(lease_id: str, client: str = "gpuctl.remote") -> dict[str, Any]:
    """The HELLO frame's metadata (the token travels as its payload, never in JSON)."""
    return {"protocol": PROTOCOL_VERSION, "lease_id": lease_id, "client": client}


def check_hello(
    meta: dict[str, Any], token: bytes, lease_id: str, expected_token: bytes,
    compare: Callable[[bytes, bytes], bool],
) -> None:
    """Check a HELLO: protocol version, lease id and token (compared with `compare`, which must be
    constant-time: hmac.compare_digest). Raises ProtocolError code "version" or "auth"."""
    if meta.get("protocol") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"hello.protocol: client speaks {meta.get('protocol')!r}, worker speaks {PROTOCOL_VERSION}",
            "version",
        )
    ok_token = compare(bytes(token), expected_token)
    ok_lease = compare(str(meta.get("lease_id", "")).encode(), lease_id.encode())
    if not (ok_token and ok_lease):
        raise ProtocolError("hello: lease token refused (wrong token or lease id)", "auth")
