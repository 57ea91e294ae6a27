"""Console memory benchmark: the console's RSS over a long run on a 32-node fleet (issue 15 item 5).

    python bench/console_memory.py                     # 32 real simulated gpuctld x 8 GPUs, 10 minutes
    python bench/console_memory.py --minutes 2 --tracemalloc 15 --json

What runs: `gpuctl demo --nodes N`'s fleet (N real `gpuctld --backend simulated` processes started by
gpuctl.fleet.demo.start_demo_fleet, local transport) polled by the real console (gpuctl.app.build_app on a
gpuctl.fleet.client.FleetClient) headless at --size, refresh every --refresh-s (default 1 s), for
--minutes after the first snapshot is on screen; `--source simulated` uses the in-process
SimulatedFleetSource instead (no daemons, no transport: the console's own share).

Printed: RSS (VmRSS of /proc/self/status, MiB) at start (first snapshot shown), at half time
(5 minutes) and at the end (10 minutes), plus one sample every --sample-s; the growth from half
time to the end is the steady-state figure (the target: flat, i.e. within a few MiB, no trend).
--tracemalloc N: also trace Python allocations and print the N source lines whose allocations grew
most between half time and the end (tracemalloc costs CPU and memory of its own: RSS figures of such
a run are not comparable with one without it).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def rss_mib() -> float:
    """Resident set size of this process in MiB (VmRSS of /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def run(args: argparse.Namespace) -> dict:
    """Run the console for args.minutes; return the RSS samples and (optionally) tracemalloc's top growth."""
    from gpuctl.app import build_app
    from gpuctl.themes import REPO_THEMES_DIR

    fleet = None
    if args.source == "daemons":
        from gpuctl.fleet.client import FleetClient
        from gpuctl.config import load_config
        from gpuctl.fleet.demo import start_demo_fleet

        t0 = time.monotonic()
        fleet = start_demo_fleet(args.nodes, args.gpus, seed=1)
        print(f"started {args.nodes} gpuctld in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        source = FleetClient(load_config(fleet.config_path))
    else:
        from gpuctl.fleet.simulated import SimulatedFleetSource

        source = SimulatedFleetSource(nodes=args.nodes, gpus_per_node=args.gpus, history_warmup_samples=0)
    window_s = args.minutes * 60.0
    samples: list[tuple[float, float]] = []
    state: dict = {"t0": None, "snaps": [], "polls": 0}
    app = build_app(source, refresh_s=args.refresh_s, theme_dirs=[REPO_THEMES_DIR])

    def sample() -> None:
        elapsed = time.monotonic() - state["t0"]
        samples.append((round(elapsed, 1), round(rss_mib(), 1)))
        print(f"  t={elapsed:7.1f} s  RSS {samples[-1][1]:7.1f} MiB  polls {state['polls']}", file=sys.stderr)

    def census() -> None:
        if args.objects:
            gc.collect()
            state.setdefault("census", []).append(
                collections.Counter(type(o).__qualname__ for o in gc.get_objects()))

    def half() -> None:
        sample()
        census()
        if args.tracemalloc:
            state["snaps"].append(tracemalloc.take_snapshot())

    def end() -> None:
        sample()
        census()
        if args.tracemalloc:
            state["snaps"].append(tracemalloc.take_snapshot())
        app.exit()

    real = type(app).on_snapshot_arrived

    def counted(self, message):
        real(self, message)
        state["polls"] += 1
        if state["t0"] is None:
            state["t0"] = time.monotonic()
            if args.tracemalloc:
                tracemalloc.start(8)
            sample()
            self.set_interval(args.sample_s, sample)
            self.set_timer(window_s / 2.0, half)
            self.set_timer(window_s, end)

    type(app).on_snapshot_arrived = counted
    try:
        app.run(headless=True, size=tuple(args.size))
    finally:
        source.close()
        if fleet is not None:
            fleet.stop()
    if len(samples) < 3:
        raise RuntimeError("the console exited before the window ended")
    start_rss = samples[0][1]
    half_rss = min(samples, key=lambda s: abs(s[0] - window_s / 2.0))[1]
    end_rss = samples[-1][1]
    out = {
        "source": args.source, "nodes": args.nodes, "gpus_per_node": args.gpus, "minutes": args.minutes,
        "refresh_s": args.refresh_s, "polls": state["polls"],
        "rss_mib_start": start_rss, "rss_mib_half": half_rss, "rss_mib_end": end_rss,
        "growth_mib_second_half": round(end_rss - half_rss, 1), "samples": samples,
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "tracemalloc": args.tracemalloc > 0,
    }
    if args.tracemalloc and len(state["snaps"]) == 2:
        diff = state["snaps"][1].compare_to(state["snaps"][0], "traceback")
        top = []
        for stat in diff[: args.tracemalloc]:
            frames = [f"{fr.filename.replace(str(ROOT) + '/', '')}:{fr.lineno}" for fr in stat.traceback][:4]
            top.append({"size_diff_kib": round(stat.size_diff / 1024, 1), "count_diff": stat.count_diff,
                        "where": frames})
        out["top_growth"] = top
    if args.objects and len(state.get("census", [])) == 2:
        a, b = state["census"]
        grown = sorted(((b[k] - a.get(k, 0), k) for k in b), reverse=True)[: args.objects]
        out["objects_grown"] = [{"type": k, "count_diff": d, "count": b[k]} for d, k in grown if d > 0]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--minutes", type=float, default=10.0, help="window after the first snapshot (default 10)")
    p.add_argument("--refresh-s", type=float, default=1.0)
    p.add_argument("--sample-s", type=float, default=30.0, help="seconds between RSS samples (default 30)")
    p.add_argument("--source", choices=("daemons", "simulated"), default="daemons")
    p.add_argument("--size", type=int, nargs=2, default=(200, 60), metavar=("W", "H"))
    p.add_argument("--tracemalloc", type=int, default=0, metavar="N", help="print the N lines that grew most")
    p.add_argument("--objects", type=int, default=0, metavar="N",
                   help="print the N object types (gc census) that grew most from half time to the end")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.nodes < 1 or args.gpus < 1:
        p.error("--minutes, --nodes and --gpus must be > 0")
    res = run(args)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"console on {res['nodes']} x {res['gpus_per_node']} GPUs ({res['source']}), {res['minutes']:g} min, "
              f"{res['polls']} polls: RSS start {res['rss_mib_start']} MiB, half {res['rss_mib_half']} MiB, "
              f"end {res['rss_mib_end']} MiB (second half {res['growth_mib_second_half']:+} MiB)")
        for o in res.get("objects_grown", []):
            print(f"  {o['count_diff']:+7d} {o['type']} (now {o['count']})")
        for t in res.get("top_growth", []):
            print(f"  {t['size_diff_kib']:+9.1f} KiB {t['count_diff']:+7d}  {' <- '.join(t['where'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
