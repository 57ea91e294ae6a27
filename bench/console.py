"""Console scale benchmark: the fleet screen's refresh against a large simulated fleet.

    python bench/console.py                  # 128 nodes x 8 GPUs for 60 s, baselines 4x8 and idle
    python bench/console.py --seconds 20 --baseline-seconds 10 --json

What runs: gpuctl's console (gpuctl.app.build_app) headless at --size (default 200x60) on an
in-process SimulatedFleetSource(nodes, gpus_per_node, history_warmup_samples=0), polling every
--refresh-s seconds (default 1 s), for --seconds of wall time after the first snapshot is on
screen. Each configuration runs in its own child process (this script with --child), so its CPU
figures are its own.

What is measured (all on the UI thread unless said otherwise):
  apply_ms   time from the SnapshotArrived message being handled (GpuctlApp.on_snapshot_arrived
             entered) to it returning: the app's `snapshot` var set, the fleet screen's diff and
             cell updates and the header totals done (time.perf_counter).
  paint_ms   the screen's compositor updates (Screen._on_timer_update: layout, render of the dirty
             widgets, the frame written to the headless driver) between one snapshot and the next.
  tick_ms    apply_ms + paint_ms of one poll: the UI thread's whole cost of one refresh.
  *_cpu_ms   the same as the UI thread's CPU time (time.thread_time): what a loaded machine's
             other processes cannot inflate.
  ui_cpu_pct the UI thread's CPU time (time.thread_time) over the window / wall, in % of one core.
  cpu_pct    the process's CPU time (resource.getrusage, user + system, all threads) / wall.
  source_cpu_pct  CPU time spent inside the simulated source's snapshot() (poll worker thread,
             time.thread_time): the stand-in for the network, not the console's cost.
  console_cpu_pct cpu_pct - source_cpu_pct.
  gc_ms_per_s Python garbage collection time (any thread), ms per second of the window.
  rows_ms    fleet_rows() in the poll worker (off the UI thread), per poll.
The first poll (which builds the table) is reported apart as first_apply_ms and left out of the
distributions. Baselines measured in the same run: the same console on a --baseline-nodes x
--gpus-per-node fleet (default 4x8), and an idle Textual app (one Static) for the CPU floor.
Ratios printed are large / baseline.

Targets (issue 3, item 7): tick < 50 ms, CPU < 25 % of one core at 1 s refresh.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "bench") not in sys.path:  # bench/_stats.py, also when loaded by file path
    sys.path.insert(0, str(ROOT / "bench"))

from _stats import percentile  # noqa: E402

TICK_TARGET_MS = 50.0
CPU_TARGET_PCT = 25.0


def _cpu_s() -> float:
    """User + system CPU seconds of this process, all threads (resource.getrusage)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size: expected WIDTHxHEIGHT like 200x60, got {text!r}") from None
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f"--size: width and height must be >= 1, got {text!r}")
    return w, h


# -- child: the console on a simulated fleet ---------------------------------------------------


def run_fleet(nodes: int, gpus_per_node: int, seconds: float, refresh_s: float, size: tuple[int, int]) -> dict:
    """Run the console headless on a nodes x gpus_per_node fleet for `seconds` after the first
    snapshot; return the figures described in the module doc (times in ms, CPU in % of one core)."""
    import gpuctl.app as app_module
    import gpuctl.console.polling as polling_module
    from textual.screen import Screen

    from gpuctl.fleet.simulated import SimulatedFleetSource
    from gpuctl.themes import REPO_THEMES_DIR

    class TimedSource(SimulatedFleetSource):
        source_cpu_s = 0.0

        def snapshot(self):
            t0 = time.thread_time()
            try:
                return super().snapshot()
            finally:
                TimedSource.source_cpu_s += time.thread_time() - t0

    rows_ms: list[float] = []
    real_fleet_rows = polling_module.fleet_rows

    def timed_fleet_rows(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real_fleet_rows(*args, **kwargs)
        finally:
            rows_ms.append((time.perf_counter() - t0) * 1000.0)

    polling_module.fleet_rows = timed_fleet_rows

    ticks: list[dict] = []  # {"apply_ms", "paint_ms"} per snapshot
    state: dict = {"window": None, "paint_ms": 0.0}
    real_on_timer_update = Screen._on_timer_update

    def timed_on_timer_update(screen):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return real_on_timer_update(screen)
        finally:
            if ticks:
                ticks[-1]["paint_ms"] += (time.perf_counter() - t0) * 1000.0
                ticks[-1]["paint_cpu_ms"] += (time.thread_time() - c0) * 1000.0
                ticks[-1]["paints"] += 1

    Screen._on_timer_update = timed_on_timer_update

    # Time the app's own SnapshotArrived handler. (Not by overriding it in a subclass: Textual
    # calls the handler of every class in the MRO, so an override calling super() would apply
    # each snapshot twice.) This process is the benchmark's own child: patching the class is fine.
    real_on_snapshot_arrived = polling_module.PollingMixin.on_snapshot_arrived

    def timed_on_snapshot_arrived(app, message):
        t0, c0 = time.perf_counter(), time.thread_time()
        real_on_snapshot_arrived(app, message)
        ticks.append({"apply_ms": (time.perf_counter() - t0) * 1000.0, "paint_ms": 0.0,
                      "apply_cpu_ms": (time.thread_time() - c0) * 1000.0, "paint_cpu_ms": 0.0, "paints": 0})
        if state["window"] is None:
            # window starts after the first snapshot (table built); it ends at exit
            state["window"] = (time.perf_counter(), _cpu_s(), time.thread_time(), TimedSource.source_cpu_s)
            gc_state["total_s"], gc_state["count"] = 0.0, 0
            app.set_timer(seconds, lambda: bench_stop(app))

    polling_module.PollingMixin.on_snapshot_arrived = timed_on_snapshot_arrived

    def bench_stop(app):
        w0, c0, t0, s0 = state["window"]
        state["result"] = (
            time.perf_counter() - w0,
            _cpu_s() - c0,
            time.thread_time() - t0,
            TimedSource.source_cpu_s - s0,
            len(ticks),
        )
        app.exit()

    gc_state = {"t0": 0.0, "total_s": 0.0, "count": 0}

    def gc_callback(phase, info):
        if phase == "start":
            gc_state["t0"] = time.perf_counter()
        else:
            gc_state["total_s"] += time.perf_counter() - gc_state["t0"]
            gc_state["count"] += 1

    gc.callbacks.append(gc_callback)
    source = TimedSource(nodes=nodes, gpus_per_node=gpus_per_node, history_warmup_samples=0)
    app = app_module.build_app(source, refresh_s=refresh_s, theme_dirs=[REPO_THEMES_DIR])
    app.run(headless=True, size=size)
    source.close()
    if "result" not in state:
        raise RuntimeError("console exited before the benchmark window ended")
    wall_s, cpu_s, ui_cpu_s, source_cpu_s, n_ticks = state["result"]
    window = ticks[1:n_ticks]  # the first snapshot builds the table: reported apart
    apply = [t["apply_ms"] for t in window]
    paint = [t["paint_ms"] for t in window]
    tick = [t["apply_ms"] + t["paint_ms"] for t in window]
    tick_cpu = [t["apply_cpu_ms"] + t["paint_cpu_ms"] for t in window]
    return {
        "config": f"{nodes}x{gpus_per_node}",
        "gpus": nodes * gpus_per_node,
        "size": f"{size[0]}x{size[1]}",
        "refresh_s": refresh_s,
        "wall_s": round(wall_s, 2),
        "polls": len(window),
        "first_apply_ms": round(ticks[0]["apply_ms"], 2),
        "first_paint_ms": round(ticks[0]["paint_ms"], 2),
        "apply_ms_median": round(statistics.median(apply), 2) if apply else None,
        "apply_ms_p95": round(percentile(apply, 0.95), 2),
        "paint_ms_median": round(statistics.median(paint), 2) if paint else None,
        "paint_ms_p95": round(percentile(paint, 0.95), 2),
        "tick_ms_median": round(statistics.median(tick), 2) if tick else None,
        "tick_ms_p95": round(percentile(tick, 0.95), 2),
        "tick_ms_max": round(max(tick), 2) if tick else None,
        "apply_cpu_ms_median": round(statistics.median([t["apply_cpu_ms"] for t in window]), 2) if window else None,
        "paint_cpu_ms_median": round(statistics.median([t["paint_cpu_ms"] for t in window]), 2) if window else None,
        "tick_cpu_ms_median": round(statistics.median(tick_cpu), 2) if tick_cpu else None,
        "tick_cpu_ms_p95": round(percentile(tick_cpu, 0.95), 2),
        "paints_per_poll_median": statistics.median([t["paints"] for t in window]) if window else None,
        "rows_ms_median": round(statistics.median(rows_ms[1:]), 2) if len(rows_ms) > 1 else None,
        "cpu_pct": round(cpu_s / wall_s * 100.0, 1),
        "ui_cpu_pct": round(ui_cpu_s / wall_s * 100.0, 1),
        "source_cpu_pct": round(source_cpu_s / wall_s * 100.0, 1),
        "console_cpu_pct": round((cpu_s - source_cpu_s) / wall_s * 100.0, 1),
        "apply_ms_each": [round(x, 1) for x in apply],
        "paint_ms_each": [round(x, 1) for x in paint],
        "gc_ms_per_s": round(gc_state["total_s"] * 1000.0 / wall_s, 2),
        "gc_collections": gc_state["count"],
    }


def run_idle(seconds: float, size: tuple[int, int]) -> dict:
    """An idle Textual app (one Static) headless for `seconds`: its process CPU % (the floor)."""
    from textual.app import App
    from textual.widgets import Static

    state: dict = {}

    class IdleApp(App[None]):
        def compose(self):
            yield Static("idle")

        def on_mount(self):
            state["start"] = (time.perf_counter(), _cpu_s())
            self.set_timer(seconds, self.exit)

    IdleApp().run(headless=True, size=size)
    w0, c0 = state["start"]
    wall = time.perf_counter() - w0
    return {"config": "idle Textual app", "wall_s": round(wall, 2), "cpu_pct": round((_cpu_s() - c0) / wall * 100.0, 1)}


# -- parent: run the children, print the table ---------------------------------------------------


def _child(args: list[str], timeout_s: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=str(ROOT))
    if proc.returncode != 0:
        raise SystemExit(f"bench child {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.1f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="measured window of the large fleet (default 60)")
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--refresh-s", type=float, default=1.0)
    p.add_argument("--size", type=_size, default=(200, 60), help="terminal size WxH (default 200x60)")
    p.add_argument("--baseline-nodes", type=int, default=4)
    p.add_argument("--baseline-seconds", type=float, default=20.0, help="window of each baseline (default 20)")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for name in ("seconds", "refresh_s", "baseline_seconds"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name)}")
    for name in ("nodes", "gpus_per_node", "baseline_nodes"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")

    if a.child:
        kind = a.child[0]
        if kind == "fleet":
            nodes, gpus, seconds = int(a.child[1]), int(a.child[2]), float(a.child[3])
            out = run_fleet(nodes, gpus, seconds, a.refresh_s, a.size)
        else:
            out = run_idle(float(a.child[1]), a.size)
        print(json.dumps(out))
        return 0

    size = f"{a.size[0]}x{a.size[1]}"
    common = ["--refresh-s", str(a.refresh_s), "--size", size]
    load_before = os.getloadavg()
    results: dict = {"command": " ".join(["python", "bench/console.py", *(argv if argv is not None else sys.argv[1:])])}
    results["fleet"] = _child(["fleet", str(a.nodes), str(a.gpus_per_node), str(a.seconds), *common], a.seconds + 300)
    if not a.no_baseline:
        results["baseline"] = _child(
            ["fleet", str(a.baseline_nodes), str(a.gpus_per_node), str(a.baseline_seconds), *common],
            a.baseline_seconds + 120,
        )
        results["idle"] = _child(["idle", str(a.baseline_seconds), *common], a.baseline_seconds + 120)
    results["loadavg_1m"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    results["cpus"] = os.cpu_count()
    f = results["fleet"]
    results["targets_met"] = {
        "tick_p95_lt_50ms": f["tick_ms_p95"] < TICK_TARGET_MS,
        "cpu_lt_25pct": f["cpu_pct"] < CPU_TARGET_PCT,
    }
    if a.json:
        print(json.dumps(results, indent=2))
        return 0

    rows = [("fleet", f)]
    if "baseline" in results:
        rows.append(("baseline", results["baseline"]))
    print(f"console refresh benchmark, terminal {size}, refresh {a.refresh_s:g} s, {results['cpus']} CPUs, "
          f"load average (1 min) {results['loadavg_1m'][0]} before / {results['loadavg_1m'][1]} after")
    hdr = f"{'':10} {'GPUs':>5} {'polls':>5} {'tick med':>9} {'tick p95':>9} {'tick CPU med':>13} {'p95':>6} " \
          f"{'apply med':>10} {'paint med':>10} {'rows med':>9} {'CPU %':>6} {'UI CPU %':>9} {'console %':>9}"
    print(hdr)
    for label, r in rows:
        print(f"{label:10} {r['gpus']:>5} {r['polls']:>5} {r['tick_ms_median']:>9.1f} {r['tick_ms_p95']:>9.1f} "
              f"{r['tick_cpu_ms_median']:>13.1f} {r['tick_cpu_ms_p95']:>6.1f} "
              f"{r['apply_ms_median']:>10.1f} {r['paint_ms_median']:>10.1f} {r['rows_ms_median'] or 0:>9.1f} "
              f"{r['cpu_pct']:>6.1f} {r['ui_cpu_pct']:>9.1f} {r['console_cpu_pct']:>9.1f}")
    print(f"(times in ms; tick = wall time on the UI thread, tick CPU = its thread CPU time; first poll building the table: {f['first_apply_ms']:.0f} ms apply + {f['first_paint_ms']:.0f} ms paint; "
          f"simulated source {f['source_cpu_pct']:.1f} % CPU of the fleet run)")
    if "baseline" in results:
        b, idle = results["baseline"], results["idle"]
        print(f"idle Textual app: {idle['cpu_pct']:.1f} % CPU")
        print(f"ratios {a.nodes}x{a.gpus_per_node} / {b['config']}: tick median {_ratio(f['tick_ms_median'], b['tick_ms_median'])}, "
              f"tick p95 {_ratio(f['tick_ms_p95'], b['tick_ms_p95'])}, CPU {_ratio(f['cpu_pct'], b['cpu_pct'])}, "
              f"UI-thread CPU {_ratio(f['ui_cpu_pct'], b['ui_cpu_pct'])}; "
              f"CPU / idle app {_ratio(f['cpu_pct'], idle['cpu_pct'])}")
    met = results["targets_met"]
    print(f"targets: tick p95 {f['tick_ms_p95']:.1f} ms < {TICK_TARGET_MS:.0f} ms: {'met' if met['tick_p95_lt_50ms'] else 'MISSED'}; "
          f"CPU {f['cpu_pct']:.1f} % < {CPU_TARGET_PCT:.0f} %: {'met' if met['cpu_lt_25pct'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
