"""Per-op cost of the data path on a NumPy-executor worker (CPU machines; the worker's and the
client's Python path without a device): seconds per op of ``x += 1``, ``y = x * 2`` and
``c = a @ b`` (64 x 64 float32), N ops then one synchronization, median of --runs runs, with
local NumPy's per-op time in the same run as the baseline.

    python bench/perop.py [--runs 5] [--n 10000]

Used for the before/after of issue 14 item 3 in bench/RESULTS.md (run once with this tree and
once with the tree before on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import gpuctl.remote as cp
from gpuctl.datapath.testing import running_worker


def per_op(xp, sync, kind: str, n: int) -> float:
    x = xp.zeros(1024, dtype=xp.float32)
    a = xp.ones((64, 64), dtype=xp.float32)
    sync()
    t = time.perf_counter()
    if kind == "x += 1":
        for _ in range(n):
            x += 1
    elif kind == "y = x * 2":
        for _ in range(n):
            y = x * 2
        del y
    else:
        for _ in range(n):
            c = a @ a
        del c
    sync()
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=10_000)
    args = ap.parse_args()
    with running_worker(quota_bytes=1 << 30) as (_, url):
        cp.attach(url)
        print(f"{'op':<12} {'remote us/op':>13} {'local us/op':>12} {'runs (remote)':>40}")
        for kind in ("x += 1", "y = x * 2", "c = a @ a"):
            per_op(cp, cp.synchronize, kind, 500)
            rem, loc = [], []
            for _ in range(args.runs):
                rem.append(per_op(cp, cp.synchronize, kind, args.n))
                loc.append(per_op(np, lambda: None, kind, args.n))
            print(f"{kind:<12} {statistics.median(rem) * 1e6:13.2f} {statistics.median(loc) * 1e6:12.2f} "
                  f"{' '.join(f'{r * 1e6:.1f}' for r in rem):>40}")
        cp.detach()


if __name__ == "__main__":
    main()
