"""One client connection to a data-path worker: its handle table, op execution and replies.

Handles are minted by the client (per connection, never shared): two connections, and a fortiori
two leases (separate worker processes), cannot name each other's arrays. A BATCH runs its ops in
order; an op that fails records the first error since the last synchronization ("op #17
matmul(h3, h9): shapes (3,4) and (5,6) not aligned") and poisons its output handles, and the
batch goes on. A BATCH flagged SYNC gets one REPLY: the answers of its query ops (get, meta, mem,
stats, sync) and that first error, which the client raises. A BATCH whose metadata fields are
refused (FrameRefused) is answered ERROR and skipped, and the connection goes on; other protocol
errors (ProtocolError: the stream itself is broken) end the connection; op errors never do. A GET frame (protocol 2) is the hot path of ``.get()`` and
``float(x)``: one handle in binary metadata, answered by one ARRAY frame (binary shape and dtype,
then the bytes) in one send, or by a REPLY carrying the error when an op failed since the last
synchronization (the same error a SYNC BATCH would get).
"""

from __future__ import annotations

import math
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

from gpuctl.datapath import fastpath
from gpuctl.datapath import ops as ops_mod
from gpuctl.datapath.accounting import LeaseAccounting, QuotaExceeded
from gpuctl.datapath.protocol import (
    ALLOWED_DTYPES,
    ARRAY_HEADS,
    ARRAY_META,
    FLAG_SYNC,
    GET_META,
    HEADER_SIZE,
    MAGIC,
    NP_DTYPE_CODES,
    PROTOCOL_VERSION,
    ConnectionLost,
    DType,
    FrameReader,
    FrameRefused,
    FrameType,
    Handle,
    Header,
    Limits,
    ProtocolError,
    decode_value,
    describe_value,
    encode_meta,
    pack_header,
    send_parts,
)

ARRAY = int(FrameType.ARRAY)
#: ARRAY frames up to this many bytes go out as one buffer (header, metadata and data copied
#: together: one send); larger ones are sent without copying.
SMALL_SEND_BYTES = 1 << 12

#: Op names answered in the REPLY of a SYNC batch.
QUERIES = frozenset({"get", "meta", "mem", "stats", "sync"})

#: Exception classes whose names travel to the client as they are; others become "RemoteError".
_PLAIN_ERRORS = ("ValueError", "TypeError", "IndexError", "ZeroDivisionError", "NotImplementedError",
                 "FloatingPointError", "OverflowError", "AxisError", "LinAlgError")


class Poisoned:
    """Stands in the handle table for the output of a failed op; using it names that failure."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


class PayloadReader:
    """Reads a BATCH's raw buffers from the socket in order, as its upload ops execute (so a free
    queued before an upload counts before the upload's quota check). Buffers no op took are
    drained at the end."""

    def __init__(self, reader: FrameReader, descs: list[tuple[str, tuple[int, ...], int]]):
        self.reader = reader
        self.descs = descs
        self.next = 0

    def skip_to(self, k: int) -> None:
        while self.next < k:
            self.reader.skip(self.descs[self.next][2])
            self.next += 1

    def take(self, k: Any, session: "Session", what: str) -> Any:
        """Buffer `k` as a new executor array (bytes received straight into it). Raises ValueError
        for a bad index, QuotaExceeded when it does not fit (its bytes are drained)."""
        if type(k) is not int or not 0 <= k < len(self.descs):
            raise ValueError(f"upload: buffer index {k!r} out of range (batch has {len(self.descs)})")
        if k < self.next:
            raise ValueError(f"upload: buffer {k} was already consumed")
        self.skip_to(k)
        dtype, shape, nbytes = self.descs[k]
        self.next = k + 1
        filled = []

        def fill(view: memoryview) -> None:
            filled.append(True)
            self.reader.read_into(view, "payload")

        try:
            session.acct.check(nbytes, what)
            return session.executor.upload(dtype, shape, fill)
        except ProtocolError:
            raise
        except BaseException:
            if not filled:
                self.reader.skip(nbytes)
            raise

    def finish(self) -> None:
        self.skip_to(len(self.descs))


class Session:
    """State of one authenticated connection (see the module docstring).

    executor: NumpyExecutor or CupyExecutor. acct: the lease's shared LeaseAccounting. reader:
    the connection's FrameReader (the one the handshake used, so nothing it buffered is lost).
    """

    def __init__(self, sock: socket.socket, executor: Any, acct: LeaseAccounting, limits: Limits,
                 info: dict[str, Any], reader: FrameReader | None = None):
        self.sock = sock
        self.reader = reader if reader is not None else FrameReader(sock)
        self.executor = executor
        self.xp = executor.xp
        self.acct = acct
        self.limits = limits
        self.info = info
        self.handles: dict[int, Any] = {}
        self.seq = 0
        self.error: dict[str, Any] | None = None
        self._rng: Any = None

    # -- used by ops ---------------------------------------------------------------------------
    def seed_rng(self, seed: Any) -> None:
        if seed is not None and (type(seed) is not int or not 0 <= seed < 2**32):
            raise ValueError(f"random seed must be an integer in [0, 2**32), got {seed!r}")
        self._rng = self.executor.new_rng(seed)

    def rng(self) -> Any:
        if self._rng is None:
            self._rng = self.executor.new_rng(None)
        return self._rng

    # -- serving -------------------------------------------------------------------------------
    def serve(self) -> None:
        """Serve BATCH and GET frames until BYE or EOF. Raises ProtocolError on a broken frame."""
        reader, limits = self.reader, self.limits
        GET, BATCH = FrameType.GET, FrameType.BATCH
        while True:
            try:
                hdr = reader.header(limits)
            except ConnectionLost:
                return
            ftype = hdr.ftype
            if ftype is GET:
                self.run_get(hdr)
            elif ftype is BATCH:
                try:
                    try:
                        meta = reader.meta(hdr)
                    except ConnectionLost:
                        raise
                    except ProtocolError as e:  # bad JSON, not an object: read whole all the same
                        raise FrameRefused(str(e), e.code) from None
                    self.run_batch(hdr, meta)
                except FrameRefused as e:
                    self.refuse_frame(hdr, e)
            elif ftype is FrameType.BYE:
                return
            else:
                raise ProtocolError(f"frame type {hdr.ftype.name} not expected after the handshake", "frame_type")

    def refuse_frame(self, hdr: Header, e: FrameRefused) -> None:
        """Answer a refused BATCH (`e`, raised before any of its payload was read) with an
        ERROR frame ``{"code", "message", "seq"}`` after skipping its payload; the connection
        goes on. Raises ConnectionLost when the payload does not arrive."""
        self.reader.skip(hdr.payload_len)
        peer_log(f"frame refused: {e}")
        meta = encode_meta({"code": e.code, "message": str(e), "seq": self.seq})
        send_parts(self.sock, [memoryview(pack_header(FrameType.ERROR, len(meta), 0)), memoryview(meta)])

    def run_get(self, hdr: Header) -> None:
        """Answer a GET frame: one ARRAY frame with the array's bytes, or a REPLY with the first
        error since the last synchronization (also when the handle is unknown or poisoned, or the
        device reports an error). Raises ProtocolError when the frame's lengths are wrong."""
        if hdr.meta_len != 8 or hdr.payload_len:
            raise ProtocolError(f"GET: meta_len must be {GET_META.size} and payload_len 0, got "
                                f"{hdr.meta_len} and {hdr.payload_len}", "bad_meta")
        (h,) = GET_META.unpack(self.reader.take(8))
        self.seq += 1
        arr = self.handles.get(h)
        if self.error is None and arr is not None and type(arr) is not Poisoned:
            code = NP_DTYPE_CODES.get(arr.dtype)
            if code is not None:
                try:
                    chunks = self.executor.download(arr)
                except Exception as e:  # noqa: BLE001 - an asynchronous device error surfaces here
                    self.error = {"type": "RemoteError", "message": f"device error at sync: {e}", "op": self.seq}
                else:
                    self._send_array(arr, code, chunks)
                    return
        queries: list[tuple[str, Any]] = []
        self._run_op(["get", [], [{"h": h}]], None, queries)  # type: ignore[arg-type]
        self.acct.add_io(bytes_in=HEADER_SIZE + GET_META.size, ops=1)
        self._reply(queries)

    def _send_array(self, arr: Any, code: int, chunks: Any) -> None:
        """One ARRAY frame: header and binary metadata packed in one call; a small array goes in
        the same send (one buffer), a large one follows chunk by chunk (zero-copy)."""
        shape = arr.shape
        ndim = len(shape)
        nbytes = arr.nbytes
        meta_len = ARRAY_META.size + 8 * ndim
        head = ARRAY_HEADS[ndim].pack(MAGIC, PROTOCOL_VERSION, ARRAY, 0, meta_len, nbytes, self.seq, code, ndim,
                                      *shape)
        if type(chunks) is list and nbytes <= SMALL_SEND_BYTES:
            try:
                self.sock.sendall(head + chunks[0] if chunks else head)
            except OSError as e:
                raise ConnectionLost(f"send: connection broken ({e})") from None
        else:
            parts: list[memoryview] | None = [memoryview(head)]
            for chunk in chunks:
                if parts is not None:
                    parts.append(chunk)
                    send_parts(self.sock, parts)
                    parts = None
                else:
                    send_parts(self.sock, [chunk])
            if parts is not None:
                send_parts(self.sock, parts)
        self.acct.add_io(bytes_in=HEADER_SIZE + 8, ops=1, bytes_out=HEADER_SIZE + meta_len + nbytes)

    def close(self) -> None:
        """Free every handle of this connection (its memory leaves the lease's accounting)."""
        for arr in list(self.handles.values()):
            if not isinstance(arr, Poisoned):
                self.acct.release(arr)
        self.handles.clear()

    def _buffer_descs(self, bufs: Any, payload_len: int) -> list[tuple[str, tuple[int, ...], int]]:
        if not isinstance(bufs, list) or len(bufs) > self.limits.max_buffers:
            raise FrameRefused(f"meta.bufs: must be a list of at most {self.limits.max_buffers} buffers", "bad_meta")
        descs = []
        total = 0
        for i, b in enumerate(bufs):
            ok = (type(b) is list and len(b) == 2 and type(b[0]) is str and b[0] in ALLOWED_DTYPES
                  and type(b[1]) is list
                  and len(b[1]) <= self.limits.max_ndim
                  and all(type(d) is int and d >= 0 for d in b[1]))
            if not ok:
                raise FrameRefused(f"meta.bufs[{i}]: expected [dtype, [dims...]], got {str(b)[:80]}", "bad_meta")
            n = math.prod(b[1])
            if n > self.limits.max_elements:
                raise FrameRefused(f"meta.bufs[{i}]: {n} elements (limit {self.limits.max_elements})", "oversized")
            nbytes = n * np.dtype(b[0]).itemsize
            total += nbytes
            descs.append((b[0], tuple(b[1]), nbytes))
        if total != payload_len:
            raise FrameRefused(f"meta.bufs: buffers describe {total} bytes but header.payload_len is {payload_len}",
                                "bad_meta")
        return descs

    def run_batch(self, hdr: Header, meta: dict[str, Any]) -> None:
        """Execute one BATCH (reading its payload as uploads need it) and reply if it is SYNC."""
        ops = meta.get("ops", [])
        if not isinstance(ops, list) or len(ops) > self.limits.max_ops:
            raise FrameRefused(f"meta.ops: must be a list of at most {self.limits.max_ops} ops", "bad_meta")
        reader = PayloadReader(self.reader, self._buffer_descs(meta.get("bufs", []), hdr.payload_len))
        queries: list[tuple[str, Any]] = []
        for op in ops:
            self.seq += 1
            self._run_op(op, reader, queries)
        reader.finish()
        self.acct.add_io(bytes_in=HEADER_SIZE + hdr.meta_len + hdr.payload_len, ops=len(ops))
        if hdr.flags & FLAG_SYNC:
            self._reply(queries)

    # -- one op --------------------------------------------------------------------------------
    def _resolve(self, v: Any) -> Any:
        if isinstance(v, Handle):
            arr = self.handles.get(int(v))
            if arr is None:
                raise KeyError(f"unknown handle h{int(v)} (freed, or never created on this connection)")
            if isinstance(arr, Poisoned):
                raise RuntimeError(f"h{int(v)} is not available: {arr.message}")
            return arr
        if isinstance(v, tuple):
            return tuple(self._resolve(x) for x in v)
        if isinstance(v, DType):
            return str(v)
        return v

    def _arg(self, v: Any) -> Any:
        """Decode and resolve one argument: a fast path for handles and plain scalars, the full
        checked decoder (protocol.decode_value) for everything else."""
        t = type(v)
        if t is dict and len(v) == 1:
            h = v.get("h")
            if type(h) is int and h >= 0:
                arr = self.handles.get(h)
                if arr is not None and type(arr) is not Poisoned:
                    return arr
                return self._resolve(Handle(h))  # raises the right message
        elif t is int or t is float or t is bool or v is None:
            return v
        return self._resolve(decode_value(v, self.limits, 1))

    def _run_op(self, op: Any, reader: PayloadReader, queries: list) -> None:
        seq = self.seq
        name: Any = "?"
        outs: list = []
        raw_args: Any = []
        try:
            if type(op) is not list or not 3 <= len(op) <= 4:
                raise TypeError("an op must be [name, outs, args] or [name, outs, args, kwargs]")
            name, outs, raw_args = op[0], op[1], op[2]
            raw_kwargs = op[3] if len(op) == 4 else None
            if type(outs) is not list:
                outs = []
                raise TypeError("outs must be a list of at most 8 non-negative integer handles")
            if outs and (len(outs) > 8 or not all(type(h) is int and h >= 0 for h in outs)):
                outs = []
                raise TypeError("outs must be a list of at most 8 non-negative integer handles")
            if type(name) is not str:
                bad, name = name, "?"
                raise TypeError(f"the op name must be a string, got {type(bad).__name__} {str(bad)[:40]}")
            if type(raw_args) is not list or (raw_kwargs is not None and type(raw_kwargs) is not dict):
                raise TypeError("args must be a list and kwargs an object")
            if len(raw_args) > self.limits.max_seq:
                raise ValueError(f"{len(raw_args)} arguments (limit {self.limits.max_seq})")
            if type(name) is str and name in fastpath.FAST_OPS and fastpath.run(self, name, outs, raw_args, raw_kwargs, seq):
                return
            spec = ops_mod.OPS.get(name) if type(name) is str else None
            if spec is not None:
                arg = self._arg
                rargs = [arg(a) for a in raw_args]
                for i, v in enumerate(rargs):
                    if (type(v) is tuple or isinstance(v, str)) and i not in spec.text and ops_mod.has_text(v):
                        raise TypeError(f"argument {i + 1}: a string is not allowed here")
                if raw_kwargs:
                    if not spec.kwargs.issuperset(raw_kwargs):
                        extra = set(raw_kwargs) - spec.kwargs
                        raise TypeError(f"unexpected keyword argument(s) {', '.join(sorted(map(str, extra)))}")
                    rkwargs = {k: arg(v) for k, v in raw_kwargs.items()}
                    for k, v in rkwargs.items():
                        if k not in spec.text and ops_mod.has_text(v):
                            raise TypeError(f"argument {k}: a string is not allowed here")
                else:
                    rkwargs = {}
                if not outs:
                    spec.fn(self, *rargs, **rkwargs)
                    return
                what = f"op #{seq} {name}"
                if spec.estimate is not None:
                    try:
                        est = spec.estimate(tuple(rargs), rkwargs)
                    except (IndexError, KeyError, AttributeError):
                        est = None
                    if est:
                        self.acct.check(int(est), what)
                self._store(outs, spec.fn(self, *rargs, **rkwargs), what)
                return
            if name == "free" and fastpath.free(self, raw_args):
                return
            what = f"op #{seq} {name}"
            args = decode_value(raw_args, self.limits)
            kwargs = {str(k): decode_value(v, self.limits) for k, v in (raw_kwargs or {}).items()}
            if name == "upload":
                self._store(outs, reader.take(args[0] if args else None, self, what), what)
            elif name == "free":
                for h in args:
                    self._free(h)
            elif name in QUERIES:
                queries.append(self._query(name, args))
            elif name == "rawkernel":
                self.executor.rawkernel(self, *self._resolve(args), **{k: self._resolve(v) for k, v in kwargs.items()})
            else:
                ops_mod.lookup(name)  # raises "unknown op"
        except ProtocolError:
            raise
        except BaseException as e:  # noqa: BLE001 - every op failure is reported to the client
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            try:
                args = decode_value(raw_args, self.limits) if type(raw_args) is list else ()
            except ValueError:
                args = ()
            self._fail(seq, name, args, outs, e, queries if type(name) is str and name in QUERIES else None)

    def _store(self, outs: list, result: Any, what: str) -> None:
        if not outs:
            return
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(outs):
            raise ValueError(f"op gives {len(results)} results for {len(outs)} handles")
        arrays = [self.executor.asarray(r) for r in results]
        for arr in arrays:
            if arr.dtype not in NP_DTYPE_CODES:
                raise TypeError(f"result of dtype {arr.dtype} is not allowed (only the wire dtypes)")
            if arr.nbytes > self.acct.quota_bytes:  # a view (broadcast_to) bigger than the slice
                raise QuotaExceeded(f"slice memory quota exceeded: the result is an array of {arr.nbytes} "
                                    f"bytes, more than the quota of {self.acct.quota_bytes} bytes")
        for h in outs:
            if h in self.handles:
                raise ValueError(f"handle h{h} is already in use on this connection")
        if len(self.handles) + len(outs) > self.limits.max_handles:
            raise ValueError(f"too many live handles (limit {self.limits.max_handles})")
        done = []
        try:
            for h, arr in zip(outs, arrays):
                self.acct.acquire(arr, what)
                done.append(arr)
        except QuotaExceeded:
            for arr in done:
                self.acct.release(arr)
            raise
        for h, arr in zip(outs, arrays):
            self.handles[h] = arr

    def _free(self, h: Any) -> None:
        if not isinstance(h, Handle):
            raise TypeError(f"free takes handles, got {h!r}")
        arr = self.handles.pop(int(h), None)
        if arr is not None and not isinstance(arr, Poisoned):
            self.acct.release(arr)

    def _query(self, name: str, args: tuple) -> tuple[str, Any]:
        if name == "get" or name == "meta":
            if len(args) != 1 or not isinstance(args[0], Handle):
                raise TypeError(f"{name} takes one handle, got "
                                f"({', '.join(describe_value(a) for a in args[:4])})")
            arr = self._resolve(args[0])
            return (name, arr)
        if name == "sync":
            self.executor.synchronize()
            return (name, None)
        if name == "mem":
            snap = self.acct.snapshot()
            return (name, {"free_bytes": max(0, snap["quota_bytes"] - snap["memory_in_use_bytes"]),
                           "total_bytes": snap["quota_bytes"]})
        snap = self.acct.snapshot()
        snap.update(self.info)
        snap["handles"] = len(self.handles)
        return (name, snap)

    def _fail(self, seq: int, name: Any, args: tuple, outs: list, e: BaseException, queries: list | None) -> None:
        if isinstance(e, QuotaExceeded) or isinstance(e, MemoryError) or self.executor.is_oom(e):
            etype = "OutOfMemoryError"
        elif isinstance(e, KeyError) and str(e.args[0] if e.args else "").startswith("unknown op"):
            etype = "UnknownOpError"
        elif type(e).__name__ in _PLAIN_ERRORS:
            etype = "IndexError" if type(e).__name__ == "AxisError" else type(e).__name__
        else:
            etype = "RemoteError"
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        desc = ", ".join(describe_value(a) for a in (args if isinstance(args, tuple) else ()))
        text = f"op #{seq} {name if isinstance(name, str) else '?'}({desc}): {msg}"
        if self.error is None:
            self.error = {"type": etype, "message": text, "op": seq}
        for h in outs:  # checked (at most 8 integers) before anything could fail, else []
            if h not in self.handles:
                self.handles[h] = Poisoned(text)
        if queries is not None:
            queries.append((name, None))

    # -- reply ---------------------------------------------------------------------------------
    def _reply(self, queries: list[tuple[str, Any]]) -> None:
        results: list[Any] = []
        payload_arrays: list[Any] = []
        for name, value in queries:
            if value is None:
                results.append(None)
            elif name in ("get", "meta"):
                entry = {"shape": list(value.shape), "dtype": str(value.dtype)}
                if name == "get":
                    entry["nbytes"] = int(value.nbytes)
                    payload_arrays.append(value)
                results.append(entry)
            else:
                results.append(value)
        if self.error is None:
            try:
                self.executor.synchronize()
            except Exception as e:  # noqa: BLE001 - an asynchronous device error surfaces here
                self.error = {"type": "RemoteError", "message": f"device error at sync: {e}", "op": self.seq}
        error, self.error = self.error, None
        if error is not None:
            payload_arrays = []
            results = [None if isinstance(r, dict) and "nbytes" in r else r for r in results]
        meta = encode_meta({"results": results, "error": error, "seq": self.seq})
        payload_len = sum(int(a.nbytes) for a in payload_arrays)
        parts: list[memoryview] | None = [memoryview(pack_header(FrameType.REPLY, len(meta), payload_len)),
                                          memoryview(meta)]
        for arr in payload_arrays:
            for chunk in self.executor.host_chunks(arr):
                if parts is not None:
                    send_parts(self.sock, parts + [chunk])
                    parts = None
                else:
                    send_parts(self.sock, [chunk])
        if parts is not None:
            send_parts(self.sock, parts)
        self.acct.add_io(bytes_out=HEADER_SIZE + len(meta) + payload_len)


def log(msg: str) -> None:
    """One line to the worker's stderr (the daemon keeps it in the worker's log)."""
    print(f"gpuctl-worker: {msg}", file=sys.stderr, flush=True)


#: Lines about single connections (refused, lost, frames refused) written per window at most.
PEER_LOG_LINES = 20
#: The window of PEER_LOG_LINES, seconds.
PEER_LOG_WINDOW_S = 10.0


class PeerLog:
    """Lines about single connections, at most ``lines`` per ``window_s`` seconds (a peer that
    opens connections in a loop cannot grow the worker's log without bound); the lines left out
    are counted, and the count is written with the next line let through. Thread-safe."""

    def __init__(self, lines: int = PEER_LOG_LINES, window_s: float = PEER_LOG_WINDOW_S):
        self.lines = lines
        self.window_s = window_s
        self.window_start = -1e18
        self.written = 0
        self.suppressed = 0
        self._lock = threading.Lock()

    def __call__(self, msg: str) -> bool:
        """Write `msg` (True) or count it as left out (False)."""
        now = time.monotonic()
        with self._lock:
            if now - self.window_start >= self.window_s:
                self.window_start, self.written = now, 0
            if self.written >= self.lines:
                self.suppressed += 1
                return False
            self.written += 1
            left_out, self.suppressed = self.suppressed, 0
        if left_out:
            log(f"({left_out} line(s) about connections left out: more than {self.lines} in {self.window_s:g} s)")
        log(msg[:500])
        return True


#: The worker's one PeerLog.
peer_log = PeerLog()
