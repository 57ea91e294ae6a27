"""The worker's hot path for small ops: elementwise ufuncs, matmul/dot and frees whose arguments
are handles and plain numbers (``c = a @ b``, ``y = x * 2``, ``x += 1``, the frees the client
queues as arrays die), run with the checks that depend only on the op's *signature* (op name,
each operand's dtype and shape or scalar type) computed once per signature and cached.

What is cached per signature: the allow-list lookup, the executor function (no getattr per op),
the quota estimate of the result (bytes; it depends only on shapes and dtypes for these ops), and
whether the result's dtype may cross the wire. What is still done per op: the handle lookups,
the quota check against the lease's current use, the op itself, and the result's registration
(handle table, accounting). Anything else (other ops, keyword arguments other than ``out``,
strings, tuples, unknown or poisoned handles) goes to Session's general path, which gives the
same results and error messages; so does any op this path cannot take, before it has done
anything. Profile and figures: bench/datapath.py and bench/RESULTS.md.
"""

from __future__ import annotations

from typing import Any

from gpuctl.datapath import ops as ops_mod
from gpuctl.datapath.protocol import NP_DTYPE_CODES

#: Ops taken by this path: name -> attribute of the executor's array module.
FAST_OPS: dict[str, str] = {name: name for name in (*ops_mod.UNARY_UFUNCS, *ops_mod.BINARY_UFUNCS)}
FAST_OPS.update(matmul="matmul", dot="dot")
#: Of those, the ops that take ``out=`` (as the allow-list says).
OUT_OPS = frozenset(n for n in FAST_OPS if "out" in ops_mod.OPS[n].kwargs)
#: Executors whose array module this path calls directly (others, e.g. a torch executor with its
#: own op table, always take the general path).
FAST_EXECUTORS = frozenset({"numpy", "cupy"})
#: Signatures remembered per session (a program has few; the bound keeps a hostile one small).
MAX_SIGNATURES = 4096

_MISS = object()


class SignatureCache:
    """Per-session cache: (name, operand signature) -> (executor function, estimated result bytes
    or None); name -> function. Bounded by MAX_SIGNATURES (cleared when full)."""

    __slots__ = ("estimates", "funcs")

    def __init__(self) -> None:
        self.estimates: dict[tuple, Any] = {}
        self.funcs: dict[str, Any] = {}


def run(session: Any, name: str, outs: list, raw_args: list, raw_kwargs: Any, seq: int) -> bool:
    """Run op `name` on the hot path when it qualifies; True when done (result stored), False when
    the general path must take it (nothing has been done then). Exceptions of the op itself
    propagate, for the caller to report and poison `outs` as for any op."""
    if len(outs) > 1 or getattr(session.executor, "name", None) not in FAST_EXECUTORS:
        return False
    handles = session.handles
    out_arr = None
    if raw_kwargs:
        if len(raw_kwargs) != 1 or outs or name not in OUT_OPS:
            return False
        o = raw_kwargs.get("out")
        if type(o) is not dict or len(o) != 1:
            return False
        h = o.get("h")
        out_arr = handles.get(h) if type(h) is int else None
        if out_arr is None or not hasattr(out_arr, "dtype"):
            return False
    args = []
    sig: list = [name]
    for v in raw_args:
        t = type(v)
        if t is dict:
            if len(v) != 1:
                return False
            h = v.get("h")
            arr = handles.get(h) if type(h) is int else None
            if arr is None or not hasattr(arr, "dtype"):
                return False  # unknown or poisoned: the general path words the error
            args.append(arr)
            sig.append(arr.dtype)
            sig.append(arr.shape)
        elif t is int or t is float or t is bool:
            args.append(v)
            sig.append(t)
        else:
            return False
    cache: SignatureCache | None = session.__dict__.get("_sig_cache")
    if cache is None:
        cache = session.__dict__["_sig_cache"] = SignatureCache()
    fn = cache.funcs.get(name)
    if fn is None:
        fn = cache.funcs[name] = getattr(session.xp, FAST_OPS[name])
    if out_arr is not None:
        fn(*args, out=out_arr)
        return True
    key = tuple(sig)
    est = cache.estimates.get(key, _MISS)
    if est is _MISS:
        spec = ops_mod.OPS[name]
        try:
            est = spec.estimate(tuple(args), {}) if spec.estimate is not None else None
        except (IndexError, KeyError, AttributeError, TypeError):
            est = None
        if len(cache.estimates) >= MAX_SIGNATURES:
            cache.estimates.clear()
        cache.estimates[key] = est
    if not outs:
        fn(*args)
        return True
    acct = session.acct
    if est:
        acct.check(int(est), name)
    result = fn(*args)
    arr = result if session.executor.is_array(result) else session.executor.asarray(result)
    h = outs[0]
    if arr.dtype not in NP_DTYPE_CODES or h in handles or len(handles) >= session.limits.max_handles:
        session._store(outs, arr, f"op #{seq} {name}")  # the general registration raises the right error
        return True
    if arr.nbytes > acct.quota_bytes:
        session._store(outs, arr, f"op #{seq} {name}")
        return True
    acct.acquire(arr, name)
    handles[h] = arr
    return True


def free(session: Any, raw_args: list) -> bool:
    """Free handles given as ``{"h": N}`` (the client's queued frees); False (nothing done) for
    anything else, which the general path refuses with its message."""
    if getattr(session.executor, "name", None) not in FAST_EXECUTORS:
        return False
    for v in raw_args:
        if type(v) is not dict or len(v) != 1 or type(v.get("h")) is not int:
            return False
    handles, release = session.handles, session.acct.release
    for v in raw_args:
        arr = handles.pop(v["h"], None)
        if arr is not None and hasattr(arr, "dtype"):
            release(arr)
    return True
