"""RemoteTensor: a torch.Tensor subclass whose data lives in a lease's worker.

Each RemoteTensor is a wrapper (no local storage) carrying its shape, strides, storage offset and
dtype, a shared :class:`_Storage` (the worker handle; freed when the last tensor using it goes)
and a view chain (view ops to replay on the handle's tensor, empty for most tensors).

``__torch_dispatch__`` sees every ATen op below autograd and autocast:

* view ops (torch_ops.VIEW_OPS) and detach: output metadata from meta tensors, no message;
* every other allow-listed op: output metadata from meta tensors (so shape and dtype errors raise
  at the call, as local PyTorch does), looked up in a cache keyed by op and input metadata after
  the first time; the op is queued with client-minted output handles and sent without waiting;
* ``.item()``, ``.cpu()``, ``.tolist()``, printing: synchronization points (the tensor's bytes);
* ops whose output shape depends on data (nonzero, masked_select, unique) ask the worker for it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from gpuctl.datapath import torch_ops
from gpuctl.torch import _backend

aten = torch.ops.aten
_DEVICE = torch.device("privateuseone", 0)  # shown as gpuctl:0 once _backend.setup ran
_META = torch.device("meta")
_CPU = torch.device("cpu")
_DT_NAMES = {getattr(torch, n): n for n in torch_ops.TORCH_DTYPES}
_MF_NAMES = {getattr(torch, n): n for n in torch_ops.MEMORY_FORMATS}
_CACHE: dict[Any, Any] = {}
#: Output metadata cached per (op, input metadata); cleared when it grows past this many entries.
MAX_CACHED_SIGNATURES = 1 << 16
_MISSING = object()
_state = threading.local()


class _Link:
    """The process's attachment (set by gpuctl.torch.attach)."""

    conn: Any = None


link = _Link()


def conn() -> Any:
    c = link.conn
    if c is None:
        from gpuctl.remote._connection import AttachError

        raise AttachError("gpuctl.torch is not attached: call gpuctl.torch.device() or gpuctl.torch.attach(...)")
    return c


class WorkerLost(RuntimeError):
    """The connection to the lease's worker broke (worker ended, lease expired or revoked, network
    failure); raised by tensor operations. The message names the lease and endpoint."""


class _Storage:
    """One worker handle, shared by the tensors viewing it; frees it when the last one goes."""

    __slots__ = ("h", "conn", "__weakref__")

    def __init__(self, h: int, c: Any):
        self.h = h
        self.conn = c

    def __del__(self) -> None:
        try:
            if self.conn.lost is None:
                self.conn.free_later(self.h)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class RemoteTensor(torch.Tensor):
    """A tensor on the leased slice (device ``gpuctl:0``). Use it as any torch.Tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    __slots__ = ("_st", "_chain", "_enc", "_key")

    @staticmethod
    def __new__(cls, size: Any, stride: Any, offset: int, dtype: torch.dtype, st: _Storage, chain: tuple = ()):
        r = torch.Tensor._make_wrapper_subclass(cls, size, strides=stride, storage_offset=offset, dtype=dtype,
                                                device=_DEVICE, requires_grad=False)
        r._st = st
        r._chain = chain
        r._key = (tuple(size), tuple(stride), offset, dtype, _backend.NAME)
        r._enc = {"h": st.h} if not chain else {"hv": [st.h, [list(s) for s in chain]]}
        return r

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        try:
            return dispatch(func, args, kwargs or {})
        except ConnectionError as e:
            if type(e).__name__ == "AttachError":
                raise
            raise WorkerLost(str(e)) from None

    # -- host side -------------------------------------------------------------------------------
    def __repr__(self, *, tensor_contents: Any = None) -> str:
        local = fetch(self)
        s = repr(local)
        extra = f", device='{self.device}'"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return s[:-1] + extra + ")"

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def tolist(self) -> Any:
        return fetch(self).tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(f"can't convert {_backend.NAME} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")

    def __deepcopy__(self, memo: dict) -> "RemoteTensor":
        """A remote copy (copy.deepcopy of a model on the device): values cloned on the worker,
        requires_grad, parameter-ness and .grad kept."""
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_(True)
        if getattr(self, "_is_param", False):
            new._is_param = True
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        return new

    def __reduce_ex__(self, proto: Any) -> Any:
        """Pickling (torch.save) stores the tensor's values as a CPU tensor."""
        return fetch(self).__reduce_ex__(proto)


def _new(meta: tuple, st: _Storage, chain: tuple = ()) -> RemoteTensor:
    size, stride, offset, dtype = meta
    return RemoteTensor(size, stride, offset, dtype, st, chain)


def _fresh(meta: tuple) -> tuple[RemoteTensor, int]:
    c = conn()
    h = c.mint()
    return _new(meta, _Storage(h, c)), h


# -- argument encoding ------------------------------------------------------------------------------
def _enc(v: Any, name: str) -> Any:
    t = type(v)
    if t is RemoteTensor:
        if v._st.conn is not link.conn:
            raise _stale(name)
        return v._enc
    if v is None or t is int or t is float or t is bool or t is str:
        return v
    if t is list or t is tuple:
        return [_enc(x, name) for x in v]
    if isinstance(v, RemoteTensor):
        if v._st.conn is not link.conn:
            raise _stale(name)
        return v._enc
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and v.device.type == "cpu":
            return {"st": [v.item(), _DT_NAMES[v.dtype]]}
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{_DEVICE} and {v.device}! ({name})")
    if t is torch.dtype:
        if v not in _DT_NAMES:
            raise NotImplementedError(f"gpuctl.torch: dtype {v} is not supported ({name})")
        return {"dt": _DT_NAMES[v]}
    if t is torch.device:
        if v.type == _backend.NAME:
            return {"dev": "lease"}
        if v.type == "cpu":
            return {"dev": "cpu"}
        raise RuntimeError(f"gpuctl.torch: device {v} cannot be used with {_DEVICE} tensors ({name})")
    if t is torch.memory_format:
        return {"mf": _MF_NAMES[v]}
    if t is torch.layout:
        if v is not torch.strided:
            raise NotImplementedError(f"gpuctl.torch: layout {v} is not supported ({name})")
        return {"ly": "strided"}
    if t is complex:
        return {"c": [v.real, v.imag]}
    if isinstance(v, float):
        return float(v)
    if isinstance(v, int):
        return int(v)
    raise NotImplementedError(f"gpuctl.torch: an argument of type {t.__name__} is not supported ({name})")


def _stale(name: str) -> RuntimeError:
    return RuntimeError(f"gpuctl.torch: a tensor of an earlier attachment was used in {name}; tensors do not "
                        "survive detach() or a new attach() (copy them to the CPU first)")


# -- metadata ---------------------------------------------------------------------------------------
def _sig(v: Any) -> Any:
    """The part of an argument that decides the op's output metadata (cache key)."""
    t = type(v)
    if t is RemoteTensor:
        return v._key
    if t is list or t is tuple:
        return tuple([_sig(x) for x in v])
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device.type)
    return v


def _to_meta(v: Any, flat: list) -> Any:
    if isinstance(v, torch.Tensor):
        size, stride, offset = v.shape, v.stride(), v.storage_offset()
        extent = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if v.numel() else 0
        base = torch.empty(offset + extent, dtype=v.dtype, device=_META)
        m = base.as_strided(size, stride, offset)
        flat.append(m)
        return m
    if type(v) is list or type(v) is tuple:
        return type(v)(_to_meta(x, flat) for x in v)
    if type(v) is torch.device and v.type == _backend.NAME:
        return _META
    return v


def _spec_of(out: Any, flat_in: list) -> Any:
    """The output description cached per signature: ("a", i) alias of tensor argument i, ("n",
    (size, stride, offset, dtype)) a new tensor, None, ("list"/"tuple", [...]), ("v", value)."""
    if isinstance(out, torch.Tensor):
        for i, m in enumerate(flat_in):
            if m is out:
                return ("a", i, tuple(out.shape))
        return ("n", (tuple(out.shape), out.stride(), out.storage_offset(), out.dtype))
    if out is None:
        return None
    if isinstance(out, (list, tuple)):
        return ("list" if isinstance(out, list) else "tuple", [_spec_of(o, flat_in) for o in out])
    return ("v", None)


class _DataDependent(Exception):
    pass


def _infer(func: Any, args: tuple, kwargs: dict) -> Any:
    flat: list = []
    margs = _to_meta(args, flat)
    mkwargs = {k: _to_meta(v, flat) for k, v in kwargs.items()}
    try:
        out = func(*margs, **mkwargs)
    except NotImplementedError:
        raise _DataDependent() from None
    return _spec_of(out, flat)


def _has_alias(spec: Any) -> bool:
    if spec is None:
        return False
    if spec[0] == "a":
        return True
    if spec[0] in ("list", "tuple"):
        return any(_has_alias(x) for x in spec[1])
    return False


def _flat_tensors(v: Any, acc: list) -> list:
    if isinstance(v, torch.Tensor):
        acc.append(v)
    elif type(v) is list or type(v) is tuple:
        for x in v:
            _flat_tensors(x, acc)
    return acc


def _build(spec: Any, flat_in: list, outs: list) -> Any:
    """The op's Python result from its spec; new tensors get handles appended to `outs` (0 for
    aliases of inputs, which the worker does not keep)."""
    if spec is None:
        return None
    kind = spec[0]
    if kind == "n":
        t, h = _fresh(spec[1])
        outs.append(h)
        return t
    if kind == "a":
        outs.append(0)
        t = flat_in[spec[1]]
        if len(spec) > 2 and tuple(t.shape) != spec[2]:
            raise NotImplementedError(f"gpuctl.torch: an out= tensor of shape {tuple(t.shape)} would be resized to "
                                      f"{spec[2]}; pass an out= tensor of the result's shape")
        return t
    if kind == "v":
        return None
    items = [_build(s, flat_in, outs) for s in spec[1]]
    return items if kind == "list" else tuple(items)


# -- dispatch ---------------------------------------------------------------------------------------
class _OpInfo:
    """What dispatch needs to know about one OpOverload, computed once (looked up by id(func):
    OpOverload's own __hash__ is Python code)."""

    __slots__ = ("func", "name", "special", "refusal", "scalar", "view")

    def __init__(self, func: Any):
        self.func = func  # keeps the id valid
        self.name = name = str(func)
        packet = func._opname
        self.special = _SPECIAL.get(func)
        self.refusal = None
        if packet in torch_ops.METADATA_INPLACE_OPS:
            self.refusal = (f"gpuctl.torch: {name} changes a tensor's shape in place; that is not supported on "
                            f"{_DEVICE} tensors")
        elif packet not in torch_ops.ATEN_OPS:
            self.refusal = f"gpuctl.torch: {name} is not supported on {_DEVICE} tensors (not in the worker's allow-list)"
        rets = func._schema.returns
        self.scalar = len(rets) == 1 and str(rets[0].type) in ("bool", "int", "float", "Scalar")
        self.view = packet in torch_ops.VIEW_OPS


_OPS: dict[int, _OpInfo] = {}


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    info = _OPS.get(id(func))
    if info is None:
        info = _OPS[id(func)] = _OpInfo(func)
    if info.special is not None:
        return info.special(func, args, kwargs)
    return _generic(info, func, args, kwargs)


def dispatch_generic(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run allow-listed op `func` remotely (see the module docstring), bypassing special handlers."""
    info = _OPS.get(id(func))
    if info is None:
        info = _OPS[id(func)] = _OpInfo(func)
    return _generic(info, func, args, kwargs)


def _generic(info: _OpInfo, func: Any, args: tuple, kwargs: dict) -> Any:
    name = info.name
    if info.refusal is not None:
        raise NotImplementedError(info.refusal)
    if info.scalar:  # equal, is_nonzero, allclose: the worker's answer
        c = conn()
        c.enqueue(name, [], _enc(args, name), {k: _enc(v, name) for k, v in kwargs.items()} or None)
        return _sync_call(c, "value", [])
    key = (id(func), _sig(args), tuple((k, _sig(v)) for k, v in kwargs.items()) if kwargs else None)
    spec = _CACHE.get(key, _MISSING)
    if spec is _MISSING:
        if len(_CACHE) >= MAX_CACHED_SIGNATURES:
            _CACHE.clear()
        try:
            spec = _infer(func, args, kwargs)
        except _DataDependent:
            return _data_dependent(func, name, args, kwargs)
        _CACHE[key] = spec
    if spec is not None and spec[0] == "n":  # the common case: one new tensor
        if info.view and not kwargs:
            base = args[0]
            if type(base) is RemoteTensor and len(base._chain) < torch_ops.MAX_VIEW_CHAIN:
                return _new(spec[1], base._st, base._chain + ((name, _enc(list(args[1:]), name)),))
        c = conn()
        result, h = _fresh(spec[1])
        outs = [h]
    else:
        c = conn()
        outs = []
        result = _build(spec, _flat_tensors((args, tuple(kwargs.values())), []) if _has_alias(spec) else [], outs)
        if not any(outs):
            outs = []
    _send(c, name, outs, _enc(args, name), {k: _enc(v, name) for k, v in kwargs.items()} if kwargs else None)
    if spec is not None and spec[0] == "v":
        return _sync_call(c, "value", [])
    return result


def _send(c: Any, name: str, outs: list, args: list, kwargs: dict | None) -> None:
    """Queue one op. Inside a backward pass a lost connection is not raised (an exception thrown
    in autograd's device thread can abort the process): the next synchronization raises it."""
    try:
        c.enqueue(name, outs, args, kwargs)
    except ConnectionError:
        if torch._C._current_graph_task_id() == -1:
            raise


def _data_dependent(func: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """An op whose output shapes depend on the data: run it, then ask the worker for them."""
    rets = func._schema.returns
    if not all(str(r.type) == "Tensor" for r in rets):
        raise NotImplementedError(f"gpuctl.torch: {name} has no meta kernel and is not supported on {_DEVICE}")
    c = conn()
    handles = [c.mint() for _ in rets]
    c.enqueue(name, handles, _enc(args, name), {k: _enc(v, name) for k, v in kwargs.items()} or None)
    outs = []
    for h in handles:
        st = _Storage(h, c)
        m = _sync_call(c, "t.meta", [{"h": h}])
        outs.append(_new((tuple(m["shape"]), tuple(m["stride"]), m["offset"], getattr(torch, m["dtype"])), st))
    return outs[0] if len(outs) == 1 else tuple(outs)


def _translate(e: BaseException) -> BaseException:
    from gpuctl.remote.cuda import memory

    if isinstance(e, memory.OutOfMemoryError):
        return torch.OutOfMemoryError(str(e))
    return e


def _sync_call(c: Any, name: str, args: list) -> Any:
    try:
        return c.sync(name, args)
    except Exception as e:
        t = _translate(e)
        if t is e:
            raise
        raise t from None


def fetch(t: RemoteTensor) -> torch.Tensor:
    """A CPU copy of remote tensor `t` (a synchronization point; raises the first error of an op
    sent since the last one, or WorkerLostError)."""
    c = conn()
    if t._st.conn is not c:
        raise _stale("a copy to the host")
    tmp = None
    h = t._st.h
    if t._chain:
        tmp, h = _fresh((tuple(t.shape), _contiguous_strides(t.shape), 0, t.dtype))
        c.enqueue("aten.clone.default", [h], [t._enc], {"memory_format": {"mf": "contiguous_format"}})
    try:
        raw = c.get(h)
    except Exception as e:
        te = _translate(e)
        if te is e:
            raise
        raise te from None
    del tmp
    nbytes = t.numel() * t.dtype.itemsize
    if raw.nbytes != nbytes:
        raise RuntimeError(f"gpuctl.torch: the worker sent {raw.nbytes} bytes for a tensor of {nbytes} bytes")
    if not nbytes:
        return torch.empty(tuple(t.shape), dtype=t.dtype)
    local = torch.from_numpy(raw).view(t.dtype).reshape(tuple(t.shape))
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return local.contiguous(memory_format=torch.channels_last)  # as local .cpu() keeps it
    return local


def _contiguous_strides(shape: Any) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def upload(src: torch.Tensor) -> RemoteTensor:
    """A remote copy of CPU tensor `src` (sent without waiting)."""
    c = conn()
    src = src.detach().contiguous()
    shape = tuple(src.shape)
    raw = src.reshape(-1).view(torch.uint8).numpy() if src.numel() else np.empty(0, np.uint8)
    h = c.upload(raw, (_DT_NAMES[src.dtype], list(shape)))
    return _new((shape, _contiguous_strides(shape), 0, src.dtype), _Storage(h, c))


# -- special ops ------------------------------------------------------------------------------------
def _detach(func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    return RemoteTensor(x.shape, x.stride(), x.storage_offset(), x.dtype, x._st, x._chain)


def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    dev = kwargs.get("device")
    if isinstance(x, RemoteTensor) and dev is not None and dev.type == "cpu":
        local = fetch(x)
        rest = {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format") and v is not None}
        return aten._to_copy.default(local, **rest) if rest else local
    return dispatch_generic(func, args, kwargs)


def _copy_(func: Any, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    if not isinstance(dst, RemoteTensor):
        dst.copy_(fetch(src))
        return dst
    if not isinstance(src, RemoteTensor):
        if src.device.type == "cpu":
            src = upload(src.to(dst.dtype) if src.dtype not in _DT_NAMES else src)
        else:
            raise RuntimeError(f"gpuctl.torch: cannot copy from a {src.device} tensor")
    return dispatch_generic(func, (dst, src) + tuple(args[2:]), kwargs)


def _local_scalar_dense(func: Any, args: tuple, kwargs: dict) -> Any:
    return fetch(args[0]).item()


def _cpu_indices(func: Any, args: tuple, kwargs: dict) -> Any:
    """Indexing accepts CPU index tensors with device tensors (as CUDA does): they are sent."""
    idx = [upload(i) if isinstance(i, torch.Tensor) and not isinstance(i, RemoteTensor) else i
           for i in args[1]]
    return dispatch_generic(func, (args[0], idx) + tuple(args[2:]), kwargs)


def _sdp_choice(func: Any, args: tuple, kwargs: dict) -> int:
    return 0  # SDPBackend.math: attention decomposes into allow-listed ops


_SPECIAL: dict[Any, Any] = {
    aten.detach.default: _detach,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
}
for _op in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default):
    _SPECIAL[_op] = _cpu_indices
if hasattr(aten, "_fused_sdp_choice"):
    _SPECIAL[aten._fused_sdp_choice.default] = _sdp_choice


# -- factory kernels (PrivateUse1) ----------------------------------------------------------------
def _lost_as_runtime(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConnectionError as e:
            raise WorkerLost(str(e)) from None

    wrapper.__doc__ = fn.__doc__
    return wrapper


def factory_kernel(op: Any) -> Any:
    """A PrivateUse1 kernel for factory `op` whose composite form would resize an out= tensor
    (arange, linspace, randperm, eye): the worker runs the op itself with the lease's device."""
    name = str(op)

    @_lost_as_runtime
    def kernel(*args: Any, **kwargs: Any) -> RemoteTensor:
        m = op(*args, **{**kwargs, "device": _META})
        t, h = _fresh((tuple(m.shape), m.stride(), 0, m.dtype))
        _send(conn(), name, [h], _enc(args, name), {k: _enc(v, name) for k, v in kwargs.items()})
        return t

    return kernel


#: Factory ops given their own PrivateUse1 kernel (see factory_kernel).
RESIZING_FACTORIES = ("arange", "linspace", "logspace", "randperm", "eye")


@_lost_as_runtime
def empty_memory_format(size: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                        pin_memory: Any = None, memory_format: Any = None) -> RemoteTensor:
    dtype = dtype or torch.get_default_dtype()
    m = torch.empty(size, dtype=dtype, device=_META, memory_format=memory_format or torch.contiguous_format)
    t, h = _fresh((tuple(m.shape), m.stride(), 0, dtype))
    kw = {"dtype": {"dt": _DT_NAMES[dtype]}, "device": {"dev": "lease"}}
    if memory_format is not None:
        kw["memory_format"] = {"mf": _MF_NAMES[memory_format]}
    _send(conn(), "aten.empty.memory_format", [h], [list(size)], kw)
    return t


@_lost_as_runtime
def empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                  pin_memory: Any = None) -> RemoteTensor:
    dtype = dtype or torch.get_default_dtype()
    t, h = _fresh((tuple(size), tuple(stride), 0, dtype))
    _send(conn(), "aten.empty_strided.default", [h], [list(size), list(stride)],
                   {"dtype": {"dt": _DT_NAMES[dtype]}, "device": {"dev": "lease"}})
    return t
