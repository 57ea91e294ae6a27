"""Data-path benchmark: remote attach through a worker on loopback vs the local array library.

    python bench/datapath.py --executor numpy            # CPU machine: ratios to local NumPy
    python bench/datapath.py --executor cupy --gpu 0     # GPU node: ratios to local CuPy

Every figure is measured in the same run, and each ratio is the median of ``--runs`` (5) runs of
remote and local taken in turn: GEMM (the 160 DeepBench training problems with ``--gemm-set
train``, transposes as DeepBench gives them, fp16/fp32; one warm-up, then N back-to-back products
between two synchronizations, N from a time budget), small ops (``x += 1`` and ``y = x * 2`` on
1024 floats, 10,000 times, then synchronize), scalar round trip (``float(x)`` of a 0-d array) vs a
plain TCP ping-pong on loopback, 256 MiB host-to-device / device-to-host vs a plain Python TCP
stream, and fractional leases (2 x 1/2 and 4 x 1/4 on one GPU running the GEMM loop at once) vs
one full lease. Prints a table (and a summary against issue 14's targets) and writes JSON
(``--out``). Workers are pinned by the GPU's UUID (as gpuctld pins them); fractional leases use an
MPS control daemon started here the way gpuctld's MPS manager starts it (gpuctl.daemon.mps, ``--mps
self``; ``--mps none`` for time-slicing).

Issue 14 targets: every DeepBench training GEMM >= 0.80 of local (>= 0.98 where local takes
>= 1 ms); ``x += 1`` <= 1.2x local; scalar round trip <= 2x the loopback TCP RTT.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from gpuctl.datapath.testing import running_worker  # noqa: E402
from gpuctl.remote._connection import Connection, parse_attach  # noqa: E402

import deepbench  # noqa: E402 - bench/deepbench.py
from _stats import median_of  # noqa: E402

# A tiny TCP peer in a separate process: echo (RTT) or sink/source (stream bandwidth). Its buffers
# are allocated (and touched) before it prints its port, so no timing includes them.
_PEER = r"""
import socket, sys
mode = sys.argv[1]
buf = bytearray(1 << 24); mv = memoryview(buf)
if mode == "source":
    data = memoryview(bytearray(b"\x01") * int(sys.argv[2]))
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
c, _ = srv.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for o in (socket.SO_SNDBUF, socket.SO_RCVBUF): c.setsockopt(socket.SOL_SOCKET, o, 4 << 20)
if mode == "echo":
    while True:
        n = c.recv_into(mv[:1])
        if not n: break
        c.sendall(mv[:1])
elif mode == "sink":
    for _ in range(int(sys.argv[3])):
        total = int(sys.argv[2])
        while total:
            n = c.recv_into(mv[:min(total, len(mv))]); total -= n
        c.sendall(b"k")
elif mode == "source":
    for _ in range(int(sys.argv[3])):
        c.recv(1)
        c.sendall(data)
"""


def _peer(mode: str, *args: str) -> tuple[subprocess.Popen, socket.socket]:
    p = subprocess.Popen([sys.executable, "-c", _PEER, mode, *args], stdout=subprocess.PIPE)
    port = int(p.stdout.readline())
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for o in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        s.setsockopt(socket.SOL_SOCKET, o, 4 << 20)
    return p, s


def tcp_rtt_s(n: int = 2000) -> float:
    """Median round trip of 1 byte over loopback TCP to another process (seconds)."""
    p, s = _peer("echo")
    try:
        b = bytearray(1)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(b"x")
            s.recv_into(b)
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    finally:
        s.close()
        p.wait()


def tcp_stream_bytes_per_s(nbytes: int, repeat: int = 3) -> dict[str, float]:
    """Plain Python TCP stream over loopback to/from another process, both directions (bytes/s,
    best of `repeat`, as the remote transfers are): sendall of a NumPy buffer / recv_into one."""
    data = memoryview(np.ones(nbytes, np.uint8))
    p, s = _peer("sink", str(nbytes), str(repeat))
    ups = []
    for _ in range(repeat):
        t = time.perf_counter()
        s.sendall(data)
        s.recv(1)
        ups.append(nbytes / (time.perf_counter() - t))
    s.close()
    p.wait()
    p, s = _peer("source", str(nbytes), str(repeat))
    buf = np.ones(nbytes, np.uint8)  # touched: no page faults in the timing
    mv = memoryview(buf)
    downs = []
    for _ in range(repeat):
        t = time.perf_counter()
        s.sendall(b"g")
        got = 0
        while got < nbytes:
            got += s.recv_into(mv[got:])
        downs.append(nbytes / (time.perf_counter() - t))
    s.close()
    p.wait()
    return {"send_bytes_per_s": max(ups), "recv_bytes_per_s": max(downs)}


class Local:
    """The local library (numpy or cupy) with a synchronize() that means the same as remote's."""

    def __init__(self, executor: str):
        if executor == "cupy":
            import cupy

            self.xp = cupy
            self.sync = lambda: cupy.cuda.Device().synchronize()
        else:
            self.xp = np
            self.sync = lambda: None


def best_of(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def gemm_key(p: deepbench.Problem, dt: str) -> str:
    m, n, k, at, bt = p
    return f"{m}x{n}x{k}/{'T' if at else 'N'}{'T' if bt else 'N'}/{dt}"


def gemm_operands(xp: Any, p: deepbench.Problem, dt: str) -> tuple[Any, Any]:
    """op(A) (M x K) and op(B) (K x N) as DeepBench lays them out: a transposed operand is the
    transpose (a view) of a stored K x M / N x K array."""
    m, n, k, at, bt = p

    def make(shape: tuple[int, int]) -> Any:
        return xp.ones(shape, dtype=dt) if xp is np else xp.random.rand(*shape).astype(dt)

    a = make((k, m)).T if at else make((m, k))
    b = make((n, k)).T if bt else make((k, n))
    return a, b


def gemm_run(xp: Any, sync: Callable[[], None], a: Any, b: Any, reps: int) -> float:
    """Seconds per product: `reps` back-to-back products between two synchronizations."""
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        c = a @ b
    sync()
    del c
    return (time.perf_counter() - t) / reps


def bench_gemm(local: "Local", cp: Any, problems: list, dtypes: list, runs: int, budget_s: float,
               max_reps: int, min_reps: int) -> dict[str, dict[str, Any]]:
    """For each problem and dtype: `runs` runs of local and remote in turn (reps products each,
    reps = the products that fit in `budget_s` by a timed local warm-up, within [min_reps,
    max_reps]); the ratio is median(local) / median(remote)."""
    out = {}
    for dt in dtypes:
        for p in problems:
            key = gemm_key(p, dt)
            la, lb = gemm_operands(local.xp, p, dt)
            ra, rb = gemm_operands(cp, p, dt)
            gemm_run(local.xp, local.sync, la, lb, 1)  # warm-up: cuBLAS plan, clocks
            per = gemm_run(local.xp, local.sync, la, lb, 2)
            reps = max(min_reps, min(max_reps, int(budget_s / max(per, 1e-9))))
            gemm_run(cp, cp.synchronize, ra, rb, 2)
            loc, rem = [], []
            for _ in range(runs):
                loc.append(gemm_run(local.xp, local.sync, la, lb, reps))
                rem.append(gemm_run(cp, cp.synchronize, ra, rb, reps))
            lm, rm = median_of(loc), median_of(rem)
            out[key] = {"local_s": lm, "remote_s": rm, "ratio_local_over_remote": lm / rm, "reps": reps,
                        "local_runs_s": loc, "remote_runs_s": rem, "target": 0.98 if lm >= 1e-3 else 0.80}
            del la, lb, ra, rb
    return out


def bench_small_ops(xp: Any, sync: Callable[[], None], n: int = 10_000, kind: str = "inplace") -> float:
    """Seconds per op of `n` small ops then one synchronization: ``x += 1`` (inplace) or
    ``y = x * 2`` (an op with an output, freed at the next one) on 1024 float32."""
    x = xp.zeros(1024, dtype=xp.float32)
    x += 1
    sync()
    t = time.perf_counter()
    if kind == "inplace":
        for _ in range(n):
            x.__iadd__(1)
    else:
        for _ in range(n):
            y = x * 2
        del y
    sync()
    return (time.perf_counter() - t) / n


def bench_scalar_rtt(cp: Any, n: int = 2000) -> float:
    """Median seconds of ``float(x)`` on a 0-d float64 array of module `cp` (remote or local),
    after 200 untimed calls."""
    x = cp.ones(())
    for _ in range(200):
        float(x)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        float(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def scalar_rtt_numpy_worker() -> float:
    """The scalar round trip against a NumPy-executor worker in the same run: the protocol's own
    cost on this machine, without the device copy (seconds, median)."""
    import gpuctl.remote as cp

    with running_worker(quota_bytes=1 << 24, executor="numpy") as (_, url):
        conn = Connection(parse_attach(url))
        try:
            h = conn.mint()
            conn.enqueue("ones", [h], [[], {"d": "float64"}])
            for _ in range(200):
                conn.get(h)
            times = []
            for _ in range(2000):
                t = time.perf_counter()
                float(conn.get(h).item())
                times.append(time.perf_counter() - t)
            return statistics.median(times)
        finally:
            conn.close()


def bench_transfer(cp: Any, xp_local: Local | None, nbytes: int) -> dict[str, float]:
    host = np.ones(nbytes // 4, np.float32)
    out = np.zeros_like(host)
    out.fill(0)  # touched: no page faults in the timing
    cp.synchronize()

    def h2d() -> float:
        t = time.perf_counter()
        d = cp.asarray(host)
        cp.synchronize()
        dt = time.perf_counter() - t
        del d
        return dt

    def d2h() -> float:
        t = time.perf_counter()
        d.get(out=out)
        return time.perf_counter() - t

    up = best_of(h2d, 3)
    d = cp.asarray(host)
    down = best_of(d2h, 3)
    return {"h2d_bytes_per_s": nbytes / up, "d2h_bytes_per_s": nbytes / down}


def gpu_uuid_of(index: int) -> str:
    """The UUID of NVML GPU `index` (workers are pinned by UUID, never by index)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        pynvml.nvmlShutdown()
    return uuid.decode() if isinstance(uuid, bytes) else uuid


def bench_fractional(executor: str, gpu: str | None, quota_total: int, n_leases: int, size: int, reps: int,
                     dtype: str, mps: Any = None) -> float:
    """Aggregate products/s of `n_leases` leases of 1/n each running the GEMM loop at once. gpu: its
    UUID. mps: a gpuctl.daemon.mps.MpsManager: fractional leases (n > 1) are its clients, as
    gpuctld makes them."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        extra: dict[str, Any] = {}
        if mps is not None and n_leases > 1 and gpu is not None:
            daemon = mps.acquire(gpu, f"bench-{n_leases}", os.geteuid())
            stack.callback(mps.release, gpu, f"bench-{n_leases}")
            extra["mps_pipe_dir"] = str(daemon.pipe_dir)
        urls = [stack.enter_context(running_worker(quota_bytes=quota_total // n_leases, executor=executor,
                                                   gpu_uuid=gpu, compute_share=1.0 / n_leases, **extra))[1]
                for _ in range(n_leases)]
        conns = [Connection(parse_attach(u)) for u in urls]
        ready = threading.Barrier(n_leases + 1)
        done: list[float] = []

        def run(conn: Connection) -> None:
            h_a = conn.mint()
            conn.enqueue("ones", [h_a], [[size, size], {"d": dtype}])
            for _ in range(3):  # warm-up: clocks up, cuBLAS plan cached
                h = conn.mint()
                conn.enqueue("matmul", [h], [{"h": h_a}, {"h": h_a}])
                conn.free_later(h)
            conn.sync("sync")
            ready.wait()
            t = time.perf_counter()
            for i in range(reps):
                h = conn.mint()
                conn.enqueue("matmul", [h], [{"h": h_a}, {"h": h_a}])
                conn.free_later(h)
            conn.sync("sync")
            done.append(time.perf_counter() - t)

        threads = [threading.Thread(target=run, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        ready.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        for c in conns:
            c.close()
        return n_leases * reps / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--executor", choices=("numpy", "cupy"), default="numpy")
    ap.add_argument("--gpu", type=int, default=0, help="GPU index for --executor cupy")
    ap.add_argument("--runs", type=int, default=5, help="runs of remote and local (in turn) per figure; ratios "
                                                          "are of the medians (default 5)")
    ap.add_argument("--gemm-set", choices=("train", "sample"), default=None,
                    help="train: the 160 DeepBench training GEMMs (default on cupy); sample: 10 of them "
                         "(untransposed, as in earlier runs; default on numpy)")
    ap.add_argument("--gemm-dtypes", default=None, help="comma list (default float16,float32 on cupy, float32 on numpy)")
    ap.add_argument("--gemm-reps", type=int, default=None, help="at most this many products per run (400 on cupy, 3 "
                                                               "on numpy)")
    ap.add_argument("--gemm-min-reps", type=int, default=3, help="at least this many products per run")
    ap.add_argument("--gemm-budget-s", type=float, default=None,
                    help="seconds of local products per run of one GEMM (reps = budget / one product, within "
                         "--gemm-min-reps..--gemm-reps; default 0.03 on cupy, 1 on numpy)")
    ap.add_argument("--gemm-max-gflop", type=float, default=None,
                    help="skip GEMM shapes above this many GFLOP per product (default: none on cupy, 5 on numpy)")
    ap.add_argument("--small-n", type=int, default=10_000, help="small ops per run")
    ap.add_argument("--transfer-mib", type=int, default=256)
    ap.add_argument("--quota-gib", type=float, default=None, help="lease quota (default 100 on cupy, 4 on numpy)")
    ap.add_argument("--fractional-reps", type=int, default=None,
                    help="GEMM products per lease in the fractional figure (1500 on cupy: seconds long, so start "
                         "skew and the tail of the last lease weigh little; 20 on numpy)")
    ap.add_argument("--mps", choices=("self", "none"), default="self",
                    help="fractional leases: self = an MPS daemon started like gpuctld's (default); none = time-sliced")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: gemm,small,rtt,transfer,fractional")
    ap.add_argument("--out", default=None, help="JSON file (default bench/datapath-<executor>.json); the table "
                                                "goes beside it (.txt)")
    args = ap.parse_args()
    gpu = gpu_uuid_of(args.gpu) if args.executor == "cupy" else None
    reps = args.gemm_reps or (400 if args.executor == "cupy" else 3)
    runs = max(1, args.runs)
    gemm_set = args.gemm_set or ("train" if args.executor == "cupy" else "sample")
    gemm_budget = args.gemm_budget_s if args.gemm_budget_s is not None else (0.03 if args.executor == "cupy" else 1.0)
    max_gflop = args.gemm_max_gflop if args.gemm_max_gflop is not None else (None if args.executor == "cupy" else 5.0)
    quota = int((args.quota_gib or (100 if args.executor == "cupy" else 4)) * (1 << 30))
    skip = set(filter(None, args.skip.split(",")))
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), f"datapath-{args.executor}.json")
    table_path = os.path.splitext(out)[0] + ".txt"
    local = Local(args.executor)
    res: dict[str, Any] = {"executor": args.executor, "command": " ".join([sys.executable, *sys.argv]),
                           "host": platform.node(), "python": platform.python_version(), "numpy": np.__version__,
                           "cpus": os.cpu_count(), "started_s": time.time(), "section_s": {}, "errors": {}}
    if args.executor == "cupy":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(args.gpu))
        import cupy

        res["cupy"] = cupy.__version__
        res["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows: list[tuple[str, str, str, str, str]] = []
    header = ("figure", "remote", "baseline", "ratio", "target")

    def save() -> None:
        """JSON and table after every section, so a run cut short keeps what it measured."""
        with open(out, "w") as f:
            json.dump(res, f, indent=2)
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
        with open(table_path, "w") as f:
            for r in [header] + rows:
                f.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")

    def section(name: str, fn: Callable[[], None]) -> None:
        if name in skip:
            return
        t0 = time.perf_counter()
        print(f"-- {name} ...", flush=True)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one broken section must not lose the others
            import traceback

            traceback.print_exc()
            res["errors"][name] = f"{type(e).__name__}: {e}"
        res["section_s"][name] = round(time.perf_counter() - t0, 2)
        print(f"-- {name}: {res['section_s'][name]} s", flush=True)
        for r in rows:
            if r[0] not in printed:
                print("   " + "  ".join(r), flush=True)
                printed.add(r[0])
        save()

    printed: set[str] = set()
    with running_worker(quota_bytes=quota, executor=args.executor, gpu_uuid=gpu, ttl_s=3600) as (_, url):
        import gpuctl.remote as cp

        cp.attach(url)

        def rtt_section() -> None:
            tcp_runs, scalar_runs, local_runs = [], [], []
            for _ in range(runs):
                tcp_runs.append(tcp_rtt_s())
                scalar_runs.append(bench_scalar_rtt(cp))
                local_runs.append(bench_scalar_rtt(local.xp))
            tcp, scalar, loc = median_of(tcp_runs), median_of(scalar_runs), median_of(local_runs)
            res["rtt"] = {"tcp_rtt_s": tcp, "scalar_get_s": scalar, "ratio": scalar / tcp, "target": "<= 2",
                          "tcp_rtt_runs_s": tcp_runs, "scalar_get_runs_s": scalar_runs, "local_scalar_s": loc,
                          "local_scalar_runs_s": local_runs, "runs": runs}
            rows.append(("scalar float(x) round trip", f"{scalar * 1e6:.1f} us", f"TCP RTT {tcp * 1e6:.1f} us",
                         f"{scalar / tcp:.2f}x", "<= 2x"))
            rows.append(("  (local float(x), reference)", f"{loc * 1e6:.1f} us", "", "", ""))
            if args.executor == "cupy":
                npw = median_of([scalar_rtt_numpy_worker() for _ in range(runs)])
                res["rtt"]["numpy_worker_scalar_get_s"] = npw
                rows.append(("  (same, NumPy worker: protocol only)", f"{npw * 1e6:.1f} us",
                             f"TCP RTT {tcp * 1e6:.1f} us", f"{npw / tcp:.2f}x", ""))

        def small_section() -> None:
            res["small_ops"] = {"n": args.small_n, "runs": runs}
            for kind, label, target in (("inplace", "x += 1", 1.2), ("out", "y = x * 2", None)):
                loc_runs, rem_runs = [], []
                for _ in range(runs):
                    loc_runs.append(bench_small_ops(local.xp, local.sync, args.small_n, kind))
                    rem_runs.append(bench_small_ops(cp, cp.synchronize, args.small_n, kind))
                loc, rem = median_of(loc_runs), median_of(rem_runs)
                res["small_ops"][kind] = {"local_s_per_op": loc, "remote_s_per_op": rem, "ratio": rem / loc,
                                          "target": f"<= {target}" if target else "reported",
                                          "local_runs_s": loc_runs, "remote_runs_s": rem_runs}
                rows.append((f"{label} (1024 f32) x{args.small_n}", f"{rem * 1e6:.2f} us/op",
                             f"local {loc * 1e6:.2f} us/op", f"{rem / loc:.2f}x",
                             f"<= {target}x" if target else "(reported)"))

        def transfer_section() -> None:
            nbytes = args.transfer_mib << 20
            tcp = tcp_stream_bytes_per_s(nbytes)
            tr = bench_transfer(cp, local, nbytes)
            res["transfer"] = {"bytes": nbytes, **tcp, **tr,
                               "h2d_ratio": tr["h2d_bytes_per_s"] / tcp["send_bytes_per_s"],
                               "d2h_ratio": tr["d2h_bytes_per_s"] / tcp["recv_bytes_per_s"], "target": ">= 0.8"}
            for k, t in (("h2d", "send"), ("d2h", "recv")):
                rows.append((f"{k.upper()} {args.transfer_mib} MiB", f"{tr[f'{k}_bytes_per_s'] / 1e9:.2f} GB/s",
                             f"TCP {tcp[f'{t}_bytes_per_s'] / 1e9:.2f} GB/s",
                             f"{res['transfer'][f'{k}_ratio']:.2f}", ">= 0.8"))

        def gemm_section() -> None:
            problems = deepbench.training_set() if gemm_set == "train" else deepbench.SAMPLE
            problems = [p for p in problems if max_gflop is None or 2 * p[0] * p[1] * p[2] / 1e9 <= max_gflop]
            dtypes = (args.gemm_dtypes.split(",") if args.gemm_dtypes
                      else ["float16", "float32"] if args.executor == "cupy" else ["float32"])
            g = bench_gemm(local, cp, problems, dtypes, runs, gemm_budget, reps, args.gemm_min_reps)
            met = [k for k, v in g.items() if v["ratio_local_over_remote"] >= v["target"]]
            res["gemm"] = {"set": gemm_set, "runs": runs, "budget_s": gemm_budget, "max_reps": reps,
                           "problems": len(problems), "dtypes": dtypes, "shapes": g,
                           "met": len(met), "total": len(g),
                           "min_ratio": min((v["ratio_local_over_remote"] for v in g.values()), default=None)}
            for k, v in g.items():
                rows.append((f"GEMM {k} ({v['reps']} reps)", f"{v['remote_s'] * 1e3:.3f} ms",
                             f"local {v['local_s'] * 1e3:.3f} ms", f"{v['ratio_local_over_remote']:.3f}",
                             f">= {v['target']:.2f}"))
            small = [v["ratio_local_over_remote"] for v in g.values() if v["target"] < 0.9]
            big = [v["ratio_local_over_remote"] for v in g.values() if v["target"] >= 0.9]
            rows.append((f"GEMM summary: {len(met)} of {len(g)} meet their target",
                         f"< 1 ms: {min(small):.3f}..{max(small):.3f}" if small else "< 1 ms: none",
                         f">= 1 ms: {min(big):.3f}..{max(big):.3f}" if big else ">= 1 ms: none", "", ""))

        section("rtt", rtt_section)
        section("small", small_section)
        section("transfer", transfer_section)
        section("gemm", gemm_section)
        cp.detach()

    def fractional_section() -> None:
        size = 8192 if args.executor == "cupy" else 256
        dtype = "float16" if args.executor == "cupy" else "float32"
        freps = args.fractional_reps or (1500 if args.executor == "cupy" else 20)
        mps = None
        if args.executor == "cupy" and args.mps == "self":
            import tempfile

            from gpuctl.daemon.mps import MpsManager

            mps = MpsManager("required", tempfile.mkdtemp(prefix="gpuctl-bench-mps-"))
        full = bench_fractional(args.executor, gpu, quota, 1, size, freps, dtype)
        res["fractional"] = {"size": size, "dtype": dtype, "products_per_lease": freps, "full_products_per_s": full,
                             "mps": args.mps if args.executor == "cupy" else "none"}
        for n in (2, 4):
            agg = bench_fractional(args.executor, gpu, quota, n, size, freps, dtype, mps)
            res["fractional"][f"{n}x1/{n}"] = {"aggregate_products_per_s": agg, "ratio": agg / full}
            rows.append((f"fractional {n} x 1/{n} ({size}^3 {dtype})", f"{agg:.1f} prod/s", f"full {full:.1f} prod/s",
                         f"{agg / full:.2f}", ">= 0.95"))

    section("fractional", fractional_section)
    res["finished_s"] = time.time()
    save()
    print()
    with open(table_path) as f:
        print(f.read(), end="")
    print(f"wrote {out} and {table_path}")


if __name__ == "__main__":
    main()
