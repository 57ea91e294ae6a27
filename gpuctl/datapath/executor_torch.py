"""The torch executor of a lease worker: runs allow-listed ATen operators for ``gpuctl.torch``.

A connection whose HELLO says ``"executor": "torch"`` is served by a :class:`TorchSession` (same
frames, handshake, limits and accounting as the array sessions; docs/DATAPATH.md "PyTorch").
Ops are ``[name, outs, args, kwargs]`` with name ``"aten.<op>.<overload>"`` from
:mod:`gpuctl.datapath.torch_ops`; ``outs`` holds one client-minted handle per tensor the op
returns (flattened in order; 0 = do not keep, e.g. the mutated input of an in-place op). Argument
values are JSON scalars and lists or these tagged objects, nothing else:

``{"h": N}`` tensor handle; ``{"hv": [N, [[view, [args]], ...]]}`` a view of handle N (view ops
from ``torch_ops.VIEW_OPS`` replayed in order); ``{"st": [value, dtype]}`` a 0-dim CPU tensor;
``{"dt": "bfloat16"}`` dtype; ``{"dev": "lease"|"cpu"}`` device; ``{"mf": "channels_last"}``
memory format; ``{"ly": "strided"}`` layout; ``{"c": [re, im]}`` complex.

Special ops: ``upload [h] [k, dtype, [dims]]`` (buffer k's bytes as a tensor of that dtype and
shape), ``free`` (handles), ``t.seed [seed]`` (the worker's torch.manual_seed), and the queries
``t.meta`` (shape, stride, storage offset, dtype of a handle), ``value`` (the result of the last op
that returned a number), ``mem``, ``stats``, ``sync``. A GET of a handle answers its bytes (C
order) as a uint8 ARRAY; the client knows the dtype and shape.

Device and memory: CUDA (the lease's GPU) when the worker runs the cupy executor, CPU torch on
simulated nodes. The slice's quota is enforced twice: the lease's accounting of live handles
(every storage counted once; factory ops, and on CPU every op's new outputs sized on meta
tensors, are checked before they allocate) and, on a GPU, the caching allocator's cap
``torch.cuda.set_per_process_memory_fraction(quota / total)``. Past it the
op fails with OutOfMemoryError (raised on the client as ``torch.OutOfMemoryError``), its outputs
are poisoned, and the connection goes on.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from gpuctl.datapath import torch_ops
from gpuctl.datapath.accounting import QuotaExceeded
from gpuctl.datapath.protocol import (
    ARRAY_HEADS,
    DEFAULT_LIMITS,
    MAGIC,
    PROTOCOL_VERSION,
    ConnectionLost,
    FrameType,
    GET_META,
    HEADER_SIZE,
    Header,
    ProtocolError,
    send_parts,
)
from gpuctl.datapath.session import Poisoned, Session

_ARRAY = int(FrameType.ARRAY)
_UINT8_CODE = 5  # protocol.WIRE_DTYPES index of uint8
_QUERIES = frozenset({"t.meta", "value", "mem", "stats", "sync", "get"})
#: Factory ops whose output size the worker checks against the quota before allocating: name ->
#: position of the size argument.
_FACTORY_SIZE_ARG = {"empty": 0, "empty_strided": 0, "full": 0, "zeros": 0, "ones": 0, "new_empty": 1,
                     "new_empty_strided": 1, "new_zeros": 1, "new_ones": 1, "new_full": 1}


def _torch() -> Any:
    import torch

    return torch


def _meta_sig(v: Any) -> Any:
    if hasattr(v, "untyped_storage"):
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device.type)
    if type(v) is list or type(v) is tuple:
        return tuple([_meta_sig(x) for x in v])
    if type(v) is dict:
        return tuple((k, _meta_sig(x)) for k, x in v.items())
    return v


def _to_meta(v: Any, inputs: list, torch: Any) -> Any:
    """`v` with its tensors replaced by meta tensors of the same shape, strides and dtype (0-dim CPU
    tensors stay: they are scalars) and the CPU device by meta; inputs collects the meta tensors."""
    if hasattr(v, "untyped_storage"):
        size, stride, offset = tuple(v.shape), v.stride(), v.storage_offset()
        extent = 1 + sum((d - 1) * st for d, st in zip(size, stride)) if v.numel() else 0
        m = torch.empty(offset + extent, dtype=v.dtype, device="meta").as_strided(size, stride, offset)
        inputs.append(m)
        return m
    if type(v) is list or type(v) is tuple:
        return type(v)(_to_meta(x, inputs, torch) for x in v)
    if isinstance(v, torch.device):
        return torch.device("meta")
    return v


def _tensors_of(v: Any, T: type) -> list:
    if isinstance(v, T):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors_of(x, T)]
    return []


class TorchExecutor:
    """Runs ATen ops with torch on `device` ("cuda" on GPU nodes, "cpu" on simulated ones).

    quota_bytes: the slice's memory quota (bytes); on CUDA the caching allocator is capped at it
    (set_per_process_memory_fraction). Raises ImportError when torch is not installed.
    """

    name = "torch"

    def __init__(self, quota_bytes: int, compute_share: float = 1.0, device: str = "cpu"):
        torch = _torch()
        self.torch = torch
        self.xp = torch
        self.quota_bytes = int(quota_bytes)
        self.compute_share = float(compute_share)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # the worker sees only its slice's GPU (CUDA_VISIBLE_DEVICES = its UUID): device 0
            self.device = torch.device("cuda", 0)
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.quota_bytes / total), self.device)
            torch.backends.cudnn.benchmark = True  # training's usual setting: repeated shapes, fastest kernels
        self._ops: dict[str, Any] = {}
        self.dtypes = {n: getattr(torch, n) for n in torch_ops.TORCH_DTYPES}
        self.memory_formats = {n: getattr(torch, n) for n in torch_ops.MEMORY_FORMATS}
        self.oom_types: tuple[type, ...] = (MemoryError, QuotaExceeded,
                                            getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))

    def op(self, name: str) -> Any:
        """The OpOverload for wire name "aten.<op>.<overload>". Raises KeyError("unknown op ...")
        for a name not on the allow-list or not an overload of this torch."""
        fn = self._ops.get(name)
        if fn is not None:
            return fn
        parts = torch_ops.split_name(name) if type(name) is str else None
        if parts is None or parts[0] not in torch_ops.ATEN_OPS:
            raise KeyError(f"unknown op {str(name)[:80]!r}: not in gpuctl.torch's allow-list")
        try:
            packet = getattr(self.torch.ops.aten, parts[0])
            fn = getattr(packet, parts[1])
        except (AttributeError, RuntimeError):
            raise KeyError(f"unknown op {name!r}: no such overload in torch {self.torch.__version__}") from None
        self._ops[name] = fn
        return fn

    @staticmethod
    def root(t: Any) -> tuple[Any, int]:
        """The storage under tensor `t` and its size in bytes (views share their base's storage)."""
        s = t.untyped_storage()
        return s, s.nbytes()

    def upload(self, dtype: str, shape: tuple[int, ...], fill: Callable[[memoryview], None]) -> Any:
        """A new uint8 tensor on the device holding the buffer's bytes (`fill` receives into host
        memory; CUDA then copies it over)."""
        n = math.prod(shape) * np.dtype(dtype).itemsize
        host = self.torch.empty(n, dtype=self.torch.uint8, pin_memory=self.device.type == "cuda")
        if n:
            fill(memoryview(host.numpy()).cast("B"))
        return host if self.device.type == "cpu" else host.to(self.device)

    def host_bytes(self, t: Any) -> memoryview:
        """The bytes of tensor `t` in C order (a synchronization point on CUDA)."""
        t = t.detach().contiguous().reshape(-1)
        if t.device.type != "cpu":
            t = t.cpu()
        return memoryview(t.view(self.torch.uint8).numpy()).cast("B")

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def is_oom(self, e: BaseException) -> bool:
        return isinstance(e, self.oom_types)

    def seed(self, seed: Any) -> None:
        if type(seed) is not int or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.torch.manual_seed(seed)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "device": str(self.device), "torch": self.torch.__version__}


class TorchSession(Session):
    """One ``gpuctl.torch`` connection: the handle table maps handles to torch tensors. Frames,
    batches, uploads, accounting and errors work as in :class:`Session`; op execution, GET and the
    queries are torch's (see the module docstring)."""

    def __init__(self, sock: Any, executor: TorchExecutor, *args: Any, **kwargs: Any):
        super().__init__(sock, executor, *args, **kwargs)
        self.torch = executor.torch
        self.tensor_type = executor.torch.Tensor
        self.last_value: Any = None
        self._size_arg: dict[str, int] = {}
        self._estimates: dict[Any, int] = {}
        self.cpu = executor.device.type == "cpu"

    # -- arguments -----------------------------------------------------------------------------
    def _tensor(self, h: Any) -> Any:
        t = self.handles.get(h) if type(h) is int else None
        if t is None:
            raise KeyError(f"unknown handle h{h!r} (freed, or never created on this connection)")
        if type(t) is Poisoned:
            raise RuntimeError(f"h{h} is not available: {t.message}")
        return t

    def _targ(self, v: Any, depth: int = 0) -> Any:
        t = type(v)
        if t is dict:  # the common case first: a live handle
            h = v.get("h")
            if type(h) is int and len(v) == 1:
                x = self.handles.get(h)
                if x is not None and type(x) is not Poisoned:
                    return x
        elif t is int or t is float or t is bool or v is None:
            return v
        if t is str:
            if len(v) > torch_ops.MAX_STRING_CHARS:
                raise ValueError(f"string argument of {len(v)} characters (limit {torch_ops.MAX_STRING_CHARS})")
            return v
        if depth >= self.limits.max_depth:
            raise ValueError(f"argument nested deeper than {self.limits.max_depth}")
        if t is list:
            if len(v) > self.limits.max_seq:
                raise ValueError(f"argument list of {len(v)} items (limit {self.limits.max_seq})")
            return [self._targ(x, depth + 1) for x in v]
        if t is dict and len(v) == 1:
            (tag, x), = v.items()
            if tag == "h":
                return self._tensor(x)
            if tag == "hv":
                return self._view(x, depth)
            if tag == "dt":
                dt = self.executor.dtypes.get(x) if type(x) is str else None
                if dt is None:
                    raise ValueError(f"dtype {str(x)[:40]!r} is not allowed")
                return dt
            if tag == "dev":
                if x == "lease":
                    return self.executor.device
                if x == "cpu":
                    return self.torch.device("cpu")
                raise ValueError(f"device {str(x)[:40]!r} is not allowed (lease or cpu)")
            if tag == "mf":
                mf = self.executor.memory_formats.get(x) if type(x) is str else None
                if mf is None:
                    raise ValueError(f"memory format {str(x)[:40]!r} is not allowed")
                return mf
            if tag == "ly":
                if x != "strided":
                    raise ValueError(f"layout {str(x)[:40]!r} is not allowed (strided)")
                return self.torch.strided
            if tag == "st":
                if not (type(x) is list and len(x) == 2 and type(x[0]) in (int, float, bool)):
                    raise ValueError(f"scalar tensor must be [value, dtype], got {str(x)[:60]}")
                dt = self.executor.dtypes.get(x[1]) if type(x[1]) is str else None
                if dt is None:
                    raise ValueError(f"dtype {str(x[1])[:40]!r} is not allowed")
                return self.torch.tensor(x[0], dtype=dt)
            if tag == "c":
                if not (type(x) is list and len(x) == 2 and all(type(e) in (int, float) for e in x)):
                    raise ValueError(f"complex must be [re, im], got {str(x)[:60]}")
                return complex(x[0], x[1])
            raise ValueError(f"unknown tagged value {str(tag)[:20]!r}")
        raise ValueError(f"argument of type {t.__name__} is not allowed")

    def _view(self, x: Any, depth: int) -> Any:
        if not (type(x) is list and len(x) == 2 and type(x[1]) is list):
            raise ValueError("view must be [handle, [[op, [args]], ...]]")
        if len(x[1]) > torch_ops.MAX_VIEW_CHAIN:
            raise ValueError(f"view chain of {len(x[1])} steps (limit {torch_ops.MAX_VIEW_CHAIN})")
        t = self._tensor(x[0])
        for step in x[1]:
            if not (type(step) is list and len(step) == 2 and type(step[0]) is str and type(step[1]) is list):
                raise ValueError("view step must be [op, [args]]")
            parts = torch_ops.split_name(step[0])
            if parts is None or parts[0] not in torch_ops.VIEW_OPS:
                raise ValueError(f"{step[0][:60]!r} is not a view op")
            t = self.executor.op(step[0])(t, *[self._targ(a, depth + 2) for a in step[1]])
        return t

    # -- ops -----------------------------------------------------------------------------------
    def _run_op(self, op: Any, reader: Any, queries: list) -> None:
        seq = self.seq
        name: Any = "?"
        outs: Any = []
        try:
            if type(op) is not list or not 3 <= len(op) <= 4:
                raise TypeError("an op must be [name, outs, args] or [name, outs, args, kwargs]")
            name, outs, raw_args = op[0], op[1], op[2]
            raw_kwargs = op[3] if len(op) == 4 else None
            if type(outs) is not list or len(outs) > self.limits.max_seq or \
                    not all(type(h) is int and h >= 0 for h in outs):
                outs = []
                raise TypeError(f"outs must be a list of at most {self.limits.max_seq} non-negative integer handles")
            if type(raw_args) is not list or (raw_kwargs is not None and type(raw_kwargs) is not dict):
                raise TypeError("args must be a list and kwargs an object")
            if len(raw_args) > self.limits.max_seq:
                raise ValueError(f"{len(raw_args)} arguments (limit {self.limits.max_seq})")
            if type(name) is str and name.startswith("aten."):
                fn = self.executor.op(name)
                args = [self._targ(a) for a in raw_args]
                kwargs = {str(k): self._targ(v) for k, v in raw_kwargs.items()} if raw_kwargs else {}
                what = f"op #{seq} {name}"
                self._precheck(name, args, kwargs, what)
                if self.cpu:
                    self._estimate(name, fn, args, kwargs, what)
                self._keep(outs, fn(*args, **kwargs), what)
            elif name == "upload":
                self._upload(outs, raw_args, reader, f"op #{seq} upload")
            elif name == "free":
                for h in raw_args:
                    self._free_handle(h)
            elif name == "t.seed":
                self.executor.seed(raw_args[0] if len(raw_args) == 1 else None)
            elif name in _QUERIES:
                queries.append(self._tquery(name, raw_args))
            else:
                raise KeyError(f"unknown op {str(name)[:80]!r}: not in gpuctl.torch's allow-list")
        except ProtocolError:
            raise
        except BaseException as e:  # noqa: BLE001 - every op failure is reported to the client
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            self._tfail(seq, name, outs, e, queries if name in _QUERIES else None)

    def _precheck(self, name: str, args: list, kwargs: dict, what: str) -> None:
        """Refuse a factory op whose output would not fit in the quota, before it allocates."""
        pos = self._size_arg.get(name)
        if pos is None:
            pos = self._size_arg[name] = _FACTORY_SIZE_ARG.get(name.split(".")[1], -1)
        if pos < 0 or len(args) <= pos or type(args[pos]) is not list:
            return
        size = args[pos]
        if not all(type(d) is int and d >= 0 for d in size) or len(size) > self.limits.max_ndim:
            raise ValueError(f"size must be at most {self.limits.max_ndim} non-negative integers, got {size!r}"[:200])
        n = math.prod(size)
        if n > self.limits.max_elements:
            raise ValueError(f"size {size} has {n} elements (limit {self.limits.max_elements})")
        dtype = kwargs.get("dtype")
        if dtype is None and name.startswith("aten.new_"):
            dtype = args[0].dtype
        itemsize = (dtype or self.torch.get_default_dtype()).itemsize
        self.acct.check(n * itemsize, what)

    def _estimate(self, name: str, fn: Any, args: list, kwargs: dict, what: str) -> None:
        """CPU torch (simulated nodes, no allocator cap): refuse an op whose new outputs would not
        fit in the quota, before it allocates. The outputs' storage sizes come from running the op
        on meta tensors of the inputs' shapes, strides and dtypes, cached per op and signature;
        ops whose output size depends on the data (no meta kernel) and ops the meta kernel refuses
        (the real op raises the error) are not estimated."""
        key = (name, _meta_sig(args), _meta_sig(list(kwargs.items())) if kwargs else None)
        est = self._estimates.get(key)
        if est is None:
            if len(self._estimates) >= 1 << 16:
                self._estimates.clear()
            inputs: list = []
            margs = [_to_meta(a, inputs, self.torch) for a in args]
            mkwargs = {k: _to_meta(v, inputs, self.torch) for k, v in kwargs.items()}
            try:
                out = fn(*margs, **mkwargs)
            except Exception:  # noqa: BLE001 - data-dependent or invalid: the real op decides
                out = None
            storages = [t.untyped_storage() for t in inputs]  # kept alive while ids are compared
            seen = {id(x) for x in storages}
            est = 0
            for t in _tensors_of(out, self.tensor_type):
                st = t.untyped_storage()
                if id(st) not in seen:  # not an input, nor a view of one
                    seen.add(id(st))
                    storages.append(st)
                    est += st.nbytes()
            self._estimates[key] = est
        if est:
            self.acct.check(est, what)

    def _keep(self, outs: list, result: Any, what: str) -> None:
        """Store the op's tensor results (flattened in order) under `outs` (0 = not kept)."""
        tensors: list[Any] = []
        T = self.tensor_type
        if isinstance(result, T):
            tensors.append(result)
        elif isinstance(result, (tuple, list)):
            for r in result:
                if isinstance(r, T):
                    tensors.append(r)
                elif isinstance(r, (tuple, list)):
                    tensors.extend(x for x in r if isinstance(x, T))
        elif result is not None:
            self.last_value = result.item() if hasattr(result, "item") else result
        if not outs:
            return
        if len(tensors) != len(outs):
            raise ValueError(f"op gives {len(tensors)} tensors for {len(outs)} handles")
        for h in outs:
            if h and h in self.handles:
                raise ValueError(f"handle h{h} is already in use on this connection")
        if len(self.handles) + len(outs) > self.limits.max_handles:
            raise ValueError(f"too many live handles (limit {self.limits.max_handles})")
        done = []
        try:
            for h, t in zip(outs, tensors):
                if h:
                    self.acct.acquire(t, what)
                    done.append(t)
        except QuotaExceeded:
            for t in done:
                self.acct.release(t)
            raise
        for h, t in zip(outs, tensors):
            if h:
                self.handles[h] = t

    def _upload(self, outs: list, raw_args: list, reader: Any, what: str) -> None:
        if len(outs) != 1 or len(raw_args) != 3 or type(raw_args[2]) is not list:
            raise TypeError("upload takes [h] [buffer, dtype, [dims]]")
        dtype = self.executor.dtypes.get(raw_args[1]) if type(raw_args[1]) is str else None
        if dtype is None:
            raise ValueError(f"upload: dtype {str(raw_args[1])[:40]!r} is not allowed")
        shape = raw_args[2]
        if len(shape) > self.limits.max_ndim or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"upload: shape must be at most {self.limits.max_ndim} non-negative integers")
        raw = reader.take(raw_args[0], self, what)
        if raw.numel() != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"upload: buffer of {raw.numel()} bytes is not shape {shape} of {raw_args[1]}")
        t = raw.view(dtype).view(shape) if raw.numel() else self.torch.empty(shape, dtype=dtype, device=raw.device)
        self._keep(outs, t, what)

    def _free_handle(self, h: Any) -> None:
        h = h.get("h") if type(h) is dict else h
        if type(h) is not int:
            raise TypeError(f"free takes handles, got {str(h)[:40]}")
        t = self.handles.pop(h, None)
        if t is not None and type(t) is not Poisoned:
            self.acct.release(t)

    def _tquery(self, name: str, raw_args: list) -> tuple[str, Any]:
        if name == "t.meta":
            t = self._targ(raw_args[0]) if len(raw_args) == 1 else None
            if not isinstance(t, self.tensor_type):
                raise TypeError("t.meta takes one tensor")
            return ("t.meta", {"shape": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset(),
                             "dtype": str(t.dtype).removeprefix("torch.")})
        if name == "value":
            v, self.last_value = self.last_value, None
            return ("value", v if v is None or type(v) in (bool, int, float) else str(v))
        if name == "sync":
            self.executor.synchronize()
            return ("sync", None)
        if name == "get":
            raise TypeError("get is a GET frame on a torch connection")
        return self._query(name, ())

    def _tfail(self, seq: int, name: Any, outs: list, e: BaseException, queries: list | None) -> None:
        if self.executor.is_oom(e):
            etype = "OutOfMemoryError"
        elif isinstance(e, KeyError) and str(e.args[0] if e.args else "").startswith("unknown op"):
            etype = "UnknownOpError"
        elif type(e).__name__ in ("ValueError", "TypeError", "IndexError", "NotImplementedError", "RuntimeError",
                                  "ZeroDivisionError", "OverflowError"):
            etype = type(e).__name__
        else:
            etype = "RemoteError"
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        text = f"op #{seq} {str(name)[:80] if isinstance(name, str) else '?'}: {str(msg)[:2000]}"
        if self.error is None:
            self.error = {"type": etype, "message": text, "op": seq}
        for h in outs if type(outs) is list else ():
            if type(h) is int and h and h not in self.handles:
                self.handles[h] = Poisoned(text)
        if queries is not None:
            queries.append((name, None))

    # -- GET -----------------------------------------------------------------------------------
    def run_get(self, hdr: Header) -> None:
        """Answer a GET: the tensor's bytes (C order) as one uint8 ARRAY frame, or a REPLY with the
        first error since the last synchronization (or an unknown/poisoned handle)."""
        if hdr.meta_len != 8 or hdr.payload_len:
            raise ProtocolError(f"GET: meta_len must be {GET_META.size} and payload_len 0, got "
                                f"{hdr.meta_len} and {hdr.payload_len}", "bad_meta")
        (h,) = GET_META.unpack(self.reader.take(8))
        self.seq += 1
        t = self.handles.get(h)
        if self.error is None and t is not None and type(t) is not Poisoned:
            try:
                data = self.executor.host_bytes(t)
            except Exception as e:  # noqa: BLE001 - an asynchronous device error surfaces here
                self._tfail(self.seq, "get", [], e, None)
            else:
                n = len(data)
                head = ARRAY_HEADS[1].pack(MAGIC, PROTOCOL_VERSION, _ARRAY, 0, 18, n, self.seq, _UINT8_CODE, 1, n)
                try:
                    if n <= 4096:
                        self.sock.sendall(head + bytes(data))
                    else:
                        send_parts(self.sock, [memoryview(head), data])
                except OSError as e:
                    raise ConnectionLost(f"send: connection broken ({e})") from None
                self.acct.add_io(bytes_in=HEADER_SIZE + 8, ops=1, bytes_out=len(head) + n)
                return
        elif self.error is None:
            self._tfail(self.seq, "get", [], KeyError(f"unknown handle h{h}") if t is None
                        else RuntimeError(f"h{h} is not available: {t.message}"), None)
        self.acct.add_io(bytes_in=HEADER_SIZE + GET_META.size, ops=1)
        self._reply([])


__all__ = ["TorchExecutor", "TorchSession", "DEFAULT_LIMITS"]
