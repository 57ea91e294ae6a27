"""Write docs/CUPY-CONFORMANCE.md: which names of CuPy's namespace gpuctl.remote has, has in part
(which arguments are missing), or lacks.

    python3 docs/gen_cupy_conformance.py                 # reference: CuPy when importable, else NumPy
    python3 docs/gen_cupy_conformance.py --reference numpy --out /tmp/table.md

The reference list is ``dir(cupy)`` (and cupy.linalg, cupy.fft, cupy.random, cupy.ndarray) where
CuPy is installed (GPU nodes), else NumPy's (CuPy's namespace follows NumPy's; names NumPy has and
CuPy lacks then show as "no" too). "partly" rows come from :data:`PARTIAL`, kept by hand next to
the code they describe; tests/test_remote_api_conformance.py checks that every "yes"/"partly" name
exists in gpuctl.remote and every "no" name does not.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: name -> what is missing (arguments, behaviour). Names here exist in gpuctl.remote.
PARTIAL: dict[str, str] = {
    "array": "no order=F, no subok",
    "asarray": "no order=F; copy=False refuses host data (it must be uploaded)",
    "empty": "no order=F", "zeros": "no order=F", "ones": "no order=F", "full": "no order=F",
    "where": "all forms; NumPy operands are uploaded",
    "sum": "no out=", "prod": "no out=", "mean": "no out=", "var": "no out=", "std": "no out=",
    "max": "no out=, initial=, where=", "min": "no out=, initial=, where=", "amax": "no out=", "amin": "no out=",
    "argmax": "no out=", "argmin": "no out=", "any": "no out=", "all": "no out=",
    "cumsum": "no out=", "cumprod": "no out=",
    "count_nonzero": "no keepdims=True",
    "pad": "modes constant, edge, reflect, symmetric, wrap; one scalar constant_values",
    "repeat": "", "unique": "no axis=; equal_nan ignored (NaNs equal)",
    "split": "", "diag": "2-D input gives a copy (CuPy: a view)",
    "tril": "at least 2-D input", "triu": "at least 2-D input",
    "trace": "no out=", "diff": "no prepend=/append=",
    "percentile": "methods linear, lower, higher, midpoint, nearest; no out=, overwrite_input=",
    "histogram": "no weights=, density=",
    "searchsorted": "no sorter=", "meshgrid": "1 to 8 arrays; no sparse=True",
    "nonzero": "at most 8 dimensions", "round": "no out=", "around": "no out=",
    "nan_to_num": "copy=False still returns a new array",
    "take": "out-of-range indices raise at the next synchronization (CuPy wraps them); no mode=",
    "load": ".npz gives a dict of arrays; no pickles", "save": "no pickles",
    "sort": "no kind=", "argsort": "no kind=", "transpose": "", "concatenate": "no out=, dtype=",
    "stack": "no out=", "clip": "no out=", "einsum": "no optimize=, out=", "tensordot": "",
    "linspace": "no retstep=, axis=", "eye": "no order=", "arange": "", "broadcast_to": "writable view",
    "get_default_memory_pool": "used_bytes/total_bytes/get_limit/set_limit (≤ quota); no cache to free",
    "ElementwiseKernel": "GPU nodes; no reduce_dims, options; output dtype from out_params or the first input",
    "RawKernel": "GPU nodes", "linalg.norm": "",
    "cuda.Stream": "accepted; ops of a connection run in order on one stream", "cuda.Device": "device 0 only",
    "cuda.runtime.memGetInfo": "the slice's quota and use", "cuda.MemoryPool": "used_bytes, total_bytes, limits", "linalg.qr": "modes reduced, complete, r",
    "linalg.cholesky": "not positive definite raises (numpy.linalg) at the next sync; CuPy gives nan",
    "fft.fft2": "", "random.default_rng": "Generator: random, standard_normal, normal, uniform, integers",
    "random.rand": "", "random.randint": "",
    **{f"ndarray.{n}": "no out=" for n in ("all", "any", "argmax", "argmin", "cumprod", "cumsum", "max", "mean",
                                             "min", "prod", "std", "sum", "var", "round", "trace", "clip")},
    "ndarray.copy": "no order=F", "ndarray.flatten": "no order=", "ndarray.ravel": "no order=",
    "ndarray.reshape": "order C or F", "ndarray.astype": "no order=, casting=",
}


#: CuPy's own names (not in NumPy), listed when the reference is NumPy.
CUPY_ONLY = ["asnumpy", "get_array_module", "RawKernel", "RawModule", "ElementwiseKernel", "ReductionKernel", "fuse",
             "get_default_memory_pool", "get_default_pinned_memory_pool", "is_available", "show_config",
             "cuda.Device", "cuda.Stream", "cuda.Event", "cuda.runtime.memGetInfo", "cuda.runtime.getDeviceCount",
             "cuda.memory.OutOfMemoryError", "cuda.get_device_id", "cuda.get_current_stream", "cuda.MemoryPool",
             "cuda.PinnedMemoryPool", "cuda.Device.synchronize", "cuda.Device.mem_info"]


def reference_names(reference: str) -> tuple[str, dict[str, list[str]]]:
    """(label, {namespace: public names}) of CuPy (when importable and asked) or NumPy."""
    if reference in ("auto", "cupy"):
        try:
            import cupy as ref  # type: ignore[import-not-found]

            label = f"CuPy {ref.__version__}"
        except ImportError:
            if reference == "cupy":
                raise SystemExit("--reference cupy: CuPy is not importable here") from None
            import numpy as ref

            label = f"NumPy {ref.__version__} (CuPy not installed here; CuPy's namespace follows NumPy's)"
    else:
        import numpy as ref

        label = f"NumPy {ref.__version__} (CuPy's namespace follows NumPy's)"

    def public(obj: Any) -> list[str]:
        return sorted(n for n in dir(obj) if not n.startswith("_") and not isinstance(getattr(obj, n, None),
                                                                                        types.ModuleType))

    top = public(ref)
    if ref.__name__ == "numpy":
        top = sorted(set(top) | set(CUPY_ONLY))
    spaces = {"": top, "linalg.": public(ref.linalg), "fft.": public(ref.fft),
              "random.": public(ref.random), "ndarray.": public(ref.ndarray)}
    return label, spaces


def status(name: str) -> tuple[str, str]:
    import gpuctl.remote as cp

    obj: Any = cp
    parts = name.split(".")
    if parts[0] == "ndarray":
        obj, parts = cp.ndarray, parts[1:]
    for p in parts:
        if not hasattr(obj, p):
            return "no", ""
        obj = getattr(obj, p)
    note = PARTIAL.get(name)
    return ("partly", note) if note else ("yes", "")


def render(reference: str) -> str:
    label, spaces = reference_names(reference)
    lines = ["# CuPy conformance of gpuctl.remote", "",
             ("Which names of CuPy's namespace `import gpuctl.remote as cp` has (**yes**), has in part "
              "(**partly**: what is missing), or lacks (**no**: AttributeError). Reference list: "
              f"{label}. Generated by `python3 docs/gen_cupy_conformance.py`; checked by "
              "tests/test_remote_api_conformance.py."), "",
             ("Rules that hold for every name: ops run on the lease's worker in order; shape, axis, dtype "
              "and broadcasting errors raise at the call, errors only the worker can see at the next "
              "synchronization, naming the op; `out=` is accepted by ufuncs only; NumPy operands are "
              "uploaded. See docs/DATAPATH.md."), ""]
    totals = {"yes": 0, "partly": 0, "no": 0}
    body = []
    for prefix, names in spaces.items():
        title = {"": "cupy", "ndarray.": "cupy.ndarray"}.get(prefix, f"cupy.{prefix[:-1]}")
        body += [f"## {title}", "", "| name | status | missing |", "| --- | --- | --- |"]
        for n in names:
            full = prefix + n
            st, note = status(full)
            totals[st] += 1
            body.append(f"| `{full}` | {st} | {note} |")
        body.append("")
    lines.append(f"Totals: {totals['yes']} yes, {totals['partly']} partly, {totals['no']} no "
                 f"(of {sum(totals.values())} reference names).")
    lines.append("")
    return "\n".join(lines + body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", choices=("auto", "cupy", "numpy"), default="auto")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "CUPY-CONFORMANCE.md"))
    args = ap.parse_args()
    text = render(args.reference)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
