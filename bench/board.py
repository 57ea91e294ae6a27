"""Department board scale benchmark: opening the board and its per-snapshot update, small vs large.

    python bench/board.py                       # 4x8 (baseline) and 128x8, 30 updates each
    python bench/board.py --updates 60 --size 200x60 --json

What runs: gpuctl's console (gpuctl.app.GpuctlApp) headless at --size (default 120x40) on an
in-process SimulatedFleetSource(nodes, gpus_per_node, history_warmup_samples=0). Each fleet runs
in its own child process (this script with --child), the baseline (--baseline-nodes x
--gpus-per-node, default 4x8) and the large fleet (--nodes x --gpus-per-node, default 128x8) in
the same run, so the ratios compare like with like.

What is measured (wall time, time.perf_counter, on the UI thread):
  open_ms     from `app.run_command("depts")` (the `:depts` command) to the end of the first
              compositor update (Screen._on_timer_update) after the board has drawn the fleet's
              snapshot: the screen composed, its columns mounted, the snapshot diffed in and the
              first frame painted. Repeated --opens times, each on a new BoardScreen (the board
              is popped, uninstalled and a fresh one installed; the first open also parses the
              board's stylesheet): median and max reported.
  first_open_ms  the first of those opens.
  apply_ms    per snapshot: GpuctlApp.on_snapshot_arrived (the app's `snapshot` var set, the
              header and the board's show_snapshot diff), with the board on screen.
  paint_ms    per snapshot: the compositor updates that follow it until the next snapshot.
  update_ms   apply_ms + paint_ms: the UI thread's whole cost of one snapshot on the board.
The poll itself (source.snapshot(), the fleet-table rows) runs in a thread worker and is not
counted. After the opens the app polls every --refresh-s (default 0.5 s), --updates snapshots.
  board_ms    per snapshot: BoardScreen.show_snapshot alone (part of apply_ms; the rest of apply
              is the header and any screen below the board that still re-renders).
  *_cpu_ms    the same, as UI-thread CPU time (time.thread_time): without waits for the GIL
              held by the poll worker.

--isolate is a what-if, not the console as shipped: two costs that are not the board's show up in
every update while the board is on screen (the fleet screen below it re-renders its table, because
Textual counts the screen just below the top one as visible; the header's totals are updated with a
layout pass, which repaints the whole screen); --isolate monkeypatches both away in the child.

Targets (issue 3 scale follow-up): open < 500 ms and update p95 < 50 ms at 128x8.
"""

from __future__ import annotations

import argparse
import json
import os
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

OPEN_TARGET_MS = 500.0
UPDATE_TARGET_MS = 50.0


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size: expected WIDTHxHEIGHT like 120x40, got {text!r}") from None
    if w < 60 or h < 15:
        raise argparse.ArgumentTypeError(f"--size: at least 60x15 (below that the console shows 'too small'), got {text!r}")
    return w, h


# -- child: the console on one fleet ---------------------------------------------------------------


def run_fleet(nodes: int, gpus_per_node: int, opens: int, updates: int, size: tuple[int, int],
              refresh_s: float = 0.5, isolate: bool = False) -> dict:
    """Open the board `opens` times, then take `updates` snapshots with it on screen; return the
    figures of the module doc (ms)."""
    import gpuctl.app as app_module
    from textual.screen import Screen

    from gpuctl.fleet.simulated import SimulatedFleetSource
    from gpuctl.screens.board import BoardScreen
    from gpuctl.themes import REPO_THEMES_DIR

    state: dict = {"phase": "start", "open_t0": 0.0, "opens": [], "ticks": [], "shown_before": 0}
    real_on_timer_update = Screen._on_timer_update

    def timed_on_timer_update(screen):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return real_on_timer_update(screen)
        finally:
            t1 = time.perf_counter()
            app = screen.app
            if state["phase"] == "opening":
                board = app.screen
                if isinstance(board, BoardScreen) and board.snapshots_shown > state["shown_before"]:
                    state["opens"].append((t1 - state["open_t0"]) * 1000.0)
                    state["phase"] = "opened"
                    app.call_later(app._bench_next)
            elif state["phase"] == "updating" and state["ticks"]:
                state["ticks"][-1]["paint_ms"] += (t1 - t0) * 1000.0
                state["ticks"][-1]["paint_cpu_ms"] += (time.thread_time() - c0) * 1000.0
                state["ticks"][-1]["paints"] += 1

    Screen._on_timer_update = timed_on_timer_update

    if isolate:
        # What-if (see --isolate): the fleet screen below the board skips its re-render, and the
        # header's totals update without a layout pass.
        from textual.widgets import Static

        from gpuctl.screens.fleet import FleetScreen

        real_fleet_show = FleetScreen.show_snapshot

        def fleet_show(screen, snapshot):
            if screen.app.screen is screen:
                real_fleet_show(screen, snapshot)

        FleetScreen.show_snapshot = fleet_show
        real_update = Static.update

        def static_update(widget, content="", *, layout=True):
            return real_update(widget, content, layout=layout and widget.id != "header-totals")

        Static.update = static_update

    real_show = BoardScreen.show_snapshot

    def timed_show(board, snapshot):
        t0 = time.perf_counter()
        try:
            return real_show(board, snapshot)
        finally:
            if state["phase"] == "updating" and state["ticks"]:
                state["ticks"][-1]["board_ms"] += (time.perf_counter() - t0) * 1000.0

    BoardScreen.show_snapshot = timed_show

    class BenchApp(app_module.GpuctlApp):
        # CSS_PATH is resolved against the defining class's module: point it back at gpuctl's
        CSS_PATH = str(Path(app_module.__file__).parent / "app.tcss")

        def on_snapshot_arrived(self, message):
            if state["phase"] != "updating":
                super().on_snapshot_arrived(message)
                if state["phase"] == "start":
                    state["phase"] = "idle"
                    self.call_after_refresh(self._bench_next)
                return
            if len(state["ticks"]) >= updates + 1:
                self.exit()
                return
            tick = {"apply_ms": 0.0, "paint_ms": 0.0, "apply_cpu_ms": 0.0, "paint_cpu_ms": 0.0, "paints": 0,
                    "board_ms": 0.0}
            state["ticks"].append(tick)
            t0, c0 = time.perf_counter(), time.thread_time()
            super().on_snapshot_arrived(message)
            tick["apply_ms"] = (time.perf_counter() - t0) * 1000.0
            tick["apply_cpu_ms"] = (time.thread_time() - c0) * 1000.0

        def _bench_next(self):
            """Next step: another open (pop the board, push it again) or start the updates."""
            if len(state["opens"]) < opens:
                if isinstance(self.screen, BoardScreen):
                    self.pop_screen()
                self.call_after_refresh(self._bench_open)
            else:
                state["phase"] = "updating"
                self.refresh_s = refresh_s
                self.poll()

        def _bench_open(self):
            # A fresh board each time (an installed screen keeps its widgets between pushes).
            if self.is_screen_installed("board"):
                self.uninstall_screen("board")
            self.install_screen(BoardScreen(), "board")
            state["shown_before"] = 0
            state["phase"] = "opening"
            state["open_t0"] = time.perf_counter()
            self.run_command("depts")

    source = SimulatedFleetSource(nodes=nodes, gpus_per_node=gpus_per_node, history_warmup_samples=0)
    app = BenchApp(source, refresh_s=3600.0, theme_dirs=[REPO_THEMES_DIR])
    t_start = time.perf_counter()
    app.run(headless=True, size=size)
    source.close()
    ticks = state["ticks"][1:]  # the first update after the opens is the first with a fresh poll timer
    if len(state["opens"]) < opens or not ticks:
        raise RuntimeError(f"board benchmark ended early: {len(state['opens'])} opens, {len(ticks)} updates")
    snapshot = app.snapshot
    slices = sum(len(n.slices()) for n in snapshot.nodes) if snapshot is not None else 0
    apply = [t["apply_ms"] for t in ticks]
    paint = [t["paint_ms"] for t in ticks]
    update = [a + p for a, p in zip(apply, paint)]
    update_cpu = [t["apply_cpu_ms"] + t["paint_cpu_ms"] for t in ticks]
    board = [t["board_ms"] for t in ticks]
    return {
        "config": f"{nodes}x{gpus_per_node}",
        "isolate": isolate,
        "gpus": nodes * gpus_per_node,
        "slices": slices,
        "size": f"{size[0]}x{size[1]}",
        "wall_s": round(time.perf_counter() - t_start, 2),
        "first_open_ms": round(state["opens"][0], 1),
        "open_ms_median": round(statistics.median(state["opens"]), 1),
        "open_ms_max": round(max(state["opens"]), 1),
        "opens": len(state["opens"]),
        "updates": len(update),
        "apply_ms_median": round(statistics.median(apply), 2),
        "apply_ms_p95": round(percentile(apply, 0.95), 2),
        "paint_ms_median": round(statistics.median(paint), 2),
        "paint_ms_p95": round(percentile(paint, 0.95), 2),
        "update_ms_median": round(statistics.median(update), 2),
        "update_ms_p95": round(percentile(update, 0.95), 2),
        "update_ms_max": round(max(update), 2),
        "update_cpu_ms_median": round(statistics.median(update_cpu), 2),
        "update_cpu_ms_p95": round(percentile(update_cpu, 0.95), 2),
        "paints_per_update_median": statistics.median(t["paints"] for t in ticks),
        "board_ms_median": round(statistics.median(board), 2),
        "board_ms_p95": round(percentile(board, 0.95), 2),
    }


# -- parent ----------------------------------------------------------------------------------------


def _child(args: list[str], timeout_s: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=str(ROOT))
    if proc.returncode != 0:
        raise SystemExit(f"bench child {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(a: float, b: float) -> str:
    return "n/a" if not b else f"{a / b:.1f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--baseline-nodes", type=int, default=4)
    p.add_argument("--opens", type=int, default=5, help="board opens per fleet (default 5)")
    p.add_argument("--updates", type=int, default=30, help="snapshots measured per fleet (default 30)")
    p.add_argument("--size", type=_size, default=(120, 40), help="terminal size WxH (default 120x40)")
    p.add_argument("--refresh-s", type=float, default=0.5, help="poll interval while measuring updates (default 0.5)")
    p.add_argument("--isolate", action="store_true",
                   help="what-if: the fleet screen below the board does not re-render and the header "
                        "updates without a layout pass (monkeypatched in the benchmark only)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not a.refresh_s > 0:
        p.error(f"--refresh-s must be > 0, got {a.refresh_s}")
    for name in ("nodes", "gpus_per_node", "baseline_nodes", "opens", "updates"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")

    if a.child:
        out = run_fleet(int(a.child[0]), int(a.child[1]), a.opens, a.updates, a.size, a.refresh_s, a.isolate)
        print(json.dumps(out))
        return 0

    size = f"{a.size[0]}x{a.size[1]}"
    common = ["--opens", str(a.opens), "--updates", str(a.updates), "--size", size, "--refresh-s", str(a.refresh_s)]
    if a.isolate:
        common.append("--isolate")
    load_before = os.getloadavg()
    results: dict = {"command": " ".join(["python", "bench/board.py", *(argv if argv is not None else sys.argv[1:])])}
    results["baseline"] = _child([str(a.baseline_nodes), str(a.gpus_per_node), *common], 600)
    results["fleet"] = _child([str(a.nodes), str(a.gpus_per_node), *common], 900)
    results["loadavg_1m"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    results["cpus"] = os.cpu_count()
    f, b = results["fleet"], results["baseline"]
    results["targets_met"] = {
        "open_lt_500ms": f["open_ms_max"] < OPEN_TARGET_MS,
        "update_p95_lt_50ms": f["update_ms_p95"] < UPDATE_TARGET_MS,
    }
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"board benchmark{' (--isolate what-if)' if a.isolate else ''}, terminal {size}, {results['cpus']} CPUs, load average (1 min) "
          f"{results['loadavg_1m'][0]} before / {results['loadavg_1m'][1]} after")
    print(f"{'':9} {'GPUs':>5} {'slices':>6} {'open 1st':>9} {'open med':>9} {'open max':>9} "
          f"{'upd med':>8} {'upd p95':>8} {'CPU med':>8} {'CPU p95':>8} {'apply med':>10} {'board med':>10} "
          f"{'board p95':>10} {'paint med':>10} {'paints':>6}")
    for label, r in (("baseline", b), ("fleet", f)):
        print(f"{label:9} {r['gpus']:>5} {r['slices']:>6} {r['first_open_ms']:>9.1f} {r['open_ms_median']:>9.1f} "
              f"{r['open_ms_max']:>9.1f} {r['update_ms_median']:>8.2f} {r['update_ms_p95']:>8.2f} "
              f"{r['update_cpu_ms_median']:>8.2f} {r['update_cpu_ms_p95']:>8.2f} "
              f"{r['apply_ms_median']:>10.2f} {r['board_ms_median']:>10.2f} {r['board_ms_p95']:>10.2f} "
              f"{r['paint_ms_median']:>10.2f} {r['paints_per_update_median']:>6}")
    print(f"(ms; {a.opens} opens and {f['updates']} snapshot updates per fleet, polls every {a.refresh_s:g} s; "
          f"update = apply + paint on the UI thread (wall), CPU = its thread CPU time; board = "
          f"BoardScreen.show_snapshot alone)")
    print(f"ratios {f['config']} / {b['config']}: open median {_ratio(f['open_ms_median'], b['open_ms_median'])}, "
          f"update median {_ratio(f['update_ms_median'], b['update_ms_median'])}, "
          f"update p95 {_ratio(f['update_ms_p95'], b['update_ms_p95'])}, "
          f"board median {_ratio(f['board_ms_median'], b['board_ms_median'])}")
    met = results["targets_met"]
    print(f"targets: open max {f['open_ms_max']:.0f} ms < {OPEN_TARGET_MS:.0f} ms: {'met' if met['open_lt_500ms'] else 'MISSED'}; "
          f"update p95 {f['update_ms_p95']:.1f} ms < {UPDATE_TARGET_MS:.0f} ms: "
          f"{'met' if met['update_p95_lt_50ms'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
