"""How fast a 400-day `gpuctl report` of 1024 GPUs answers, and how big a node's usage database gets.

One node's database is filled with 400 days of simulated past (gpuctl.daemon.usage_history: 7 days
of minute rows, hourly rows before that, as retention leaves them) for 8 GPUs, twice: whole GPUs
(8 slices) and the worst case, every GPU in eighths (64 slices). Then:

- node query: GET /v1/usage's work (UsageDb.slice_usage) for 400 days, by period and --every day;
- baseline in the same run: the same 7 days read from the minute rows vs from the hourly rows
  (what the rollups buy: ~60x fewer rows);
- fleet: 1024 GPUs = 128 such nodes. Nodes answer in parallel on their own CPUs, so the fleet's
  time is one node's query plus the merge; the merge of 128 answers (build_report) is timed, and
  so is the worst case of 128 node queries run one after another on this one CPU.

    python bench/report_scale.py [--days 400] [--nodes 128]

Prints figures and ratios; results go to bench/RESULTS.md by hand with the machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuctl.daemon.usage import SliceHold, roll_up  # noqa: E402
from gpuctl.daemon.usage_db import UsageDb  # noqa: E402
from gpuctl.daemon.usage_history import fill_simulated_past  # noqa: E402
from gpuctl.fleet.usage_report import FleetUsage, build_report  # noqa: E402

DEPTS = ("research", "training", "inference", "unassigned")


def node_db(path: Path, parts: int, days: int, now: float) -> tuple[UsageDb, float]:
    holds = {f"GPU-{g:02d}/{k}": SliceHold(f"GPU-{g:02d}", 1.0 / parts, DEPTS[(g + k) % len(DEPTS)], False)
             for g in range(8) for k in range(parts)}
    db = UsageDb(path)
    t = time.perf_counter()
    fill_simulated_past(db, holds, {f"GPU-{g:02d}": 80 * 2**30 for g in range(8)}, 0, now - days * 86400, now)
    roll_up(db, now)
    db._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db, time.perf_counter() - t


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=400)
    ap.add_argument("--nodes", type=int, default=128)
    args = ap.parse_args()
    now = float(int(time.time()) // 60 * 60)
    since, until = -(-int(now - args.days * 86400) // 3600) * 3600, int(now)  # hours retention still holds
    print(f"machine: {os.uname().nodename}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        for parts in (1, 8):
            db, fill_s = node_db(Path(tmp) / f"u{parts}.sqlite3", parts, args.days, now)
            size = os.path.getsize(db.path)
            rows_h = db._db.execute("SELECT COUNT(*) FROM slice_hour").fetchone()[0]
            rows_m = db._db.execute("SELECT COUNT(*) FROM slice_minute").fetchone()[0]
            print(f"\n8 GPUs x {parts} slice(s): filled {args.days} d in {fill_s:.1f} s; {rows_h} hourly + {rows_m} "
                  f"minute slice rows; database {size / 2**20:.1f} MiB")
            q = best(lambda: db.slice_usage(since, until))
            qd = best(lambda: db.slice_usage(since, until, 86400))
            print(f"node query, {args.days} d: {q * 1000:.0f} ms one period, {qd * 1000:.0f} ms --every day")
            wk = int(now - 7 * 86400) // 3600 * 3600
            hi = int(now) // 3600 * 3600
            from_hours = best(lambda: db.slice_usage(wk, hi))
            saved = db.plan
            db.plan = lambda s, u: [("minute", s, u)]  # baseline: the minute rows only
            from_minutes = best(lambda: db.slice_usage(wk, hi))
            db.plan = saved
            print(f"baseline, 7 d: minute rows {from_minutes * 1000:.1f} ms vs hourly rows {from_hours * 1000:.1f} ms "
                  f"= {from_minutes / from_hours:.1f}x")
            answer = {"gpus": [{"uuid": f"GPU-{g:02d}", "index": g} for g in range(8)],
                      "rows": db.slice_usage(since, until), "refusals": []}
            usage = FleetUsage(since, until, None, answers={f"n{i:03d}": answer for i in range(args.nodes)})
            merge = best(lambda: build_report(usage, "department"))
            rep = build_report(usage, "department")
            print(f"fleet of {args.nodes * 8} GPUs: merge of {args.nodes} answers {merge * 1000:.0f} ms; "
                  f"one node's query + merge = {(q + merge):.2f} s (nodes answer in parallel); "
                  f"all {args.nodes} queries on this one CPU: {(q * args.nodes):.1f} s")
            assert abs(rep["total"]["owned_gpu_h"] - rep["fleet_gpu_hours"]) / rep["fleet_gpu_hours"] < 1e-9
            db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
