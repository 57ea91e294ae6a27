"""Usage accounting arithmetic on hand-made minutes: ownership change mid-minute, daemon gap, clock
step back, rollups (hour = sum of its minutes), retention, and the choice of table per period."""

from __future__ import annotations

import sqlite3

import pytest

from gpuctl.daemon.usage import SliceHold, UsageRecorder, roll_up
from gpuctl.daemon.usage_db import MINUTE_RETENTION_S, UsageDb
from gpuctl.model import GpuSample

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, an hour boundary


class Clock:
    def __init__(self, t: float):
        self.t = float(t)

    def __call__(self) -> float:
        return self.t


def sample(uuid: str, t: float, sm: float | None, *, mem: int | None = 1000, procs: int | None = 0) -> GpuSample:
    return GpuSample(uuid=uuid, timestamp_s=t, sm_util_pct=sm, memory_used_bytes=mem,
                     memory_total_bytes=4000, process_count=procs)


def rows(db: UsageDb, table: str) -> list[tuple]:
    return db._db.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()


def run(rec: UsageRecorder, samples: list[GpuSample], start: float, end: float, step: float = 1.0) -> None:
    t = start
    while t < end:
        t = min(end, t + step)
        rec.observe([GpuSample(**{**s.__dict__, "timestamp_s": t}) for s in samples], at_s=t)


@pytest.fixture
def db(tmp_path):
    d = UsageDb(tmp_path / "usage.sqlite3")
    yield d
    d.close()


def test_ownership_change_mid_minute_splits_it(db):
    rec = UsageRecorder(db, clock=Clock(T0))
    rec.set_ownership({"G0/0": SliceHold("G0", 1.0, "research", False)}, at_s=T0)
    run(rec, [sample("G0", T0, 50.0)], T0, T0 + 30)
    rec.set_ownership({"G0/0": SliceHold("G0", 1.0, "training", True)}, at_s=T0 + 30)
    run(rec, [sample("G0", T0, 50.0)], T0 + 30, T0 + 61)
    got = {(r[0], r[3]): r[4:] for r in rows(db, "slice_minute")}
    # minute T0: research owned 30 s (idle 0: SM 50 %), training 30 s leased; used = 50 % of owned
    assert got[(T0, "research")] == pytest.approx((30.0, 0.0, 15.0, 30.0, 0.0, 0.0))
    assert got[(T0, "training")] == pytest.approx((30.0, 30.0, 15.0, 30.0, 0.0, 0.0))
    assert (T0 + 60, "training") not in got  # the current minute is not written yet
    gpu = rows(db, "gpu_minute")
    assert gpu == [(T0, "G0", pytest.approx(60.0), pytest.approx(3000.0), pytest.approx(60.0),
                    pytest.approx(60000.0), pytest.approx(60.0), 4000)]
    assert db.meta("recorded_through_s") == T0 + 60


def test_fractions_idle_and_outside_use(db):
    rec = UsageRecorder(db, clock=Clock(T0))
    rec.set_ownership({"G0/0": SliceHold("G0", 0.5, "research", False),
                       "G0/1": SliceHold("G0", 0.5, "inference", False),
                       "G1/0": SliceHold("G1", 1.0, "unassigned", False)}, at_s=T0)
    run(rec, [sample("G0", T0, 2.0, procs=0), sample("G1", T0, None, procs=3)], T0, T0 + 60)
    got = {r[1]: r[4:] for r in rows(db, "slice_minute")}
    # half slices: 30 GPU-s owned each, SM 2 % < 5 %: idle; G1: SM unknown, not idle, 3 outside processes
    assert got["G0/0"] == pytest.approx((30.0, 0.0, 0.6, 30.0, 30.0, 0.0))
    assert got["G0/1"] == pytest.approx((30.0, 0.0, 0.6, 30.0, 30.0, 0.0))
    assert got["G1/0"] == pytest.approx((60.0, 0.0, 0.0, 0.0, 0.0, 60.0))


def test_gap_is_not_recorded(db):
    rec = UsageRecorder(db, clock=Clock(T0), max_gap_s=10.0)
    rec.set_ownership({"G0/0": SliceHold("G0", 1.0, "research", False)}, at_s=T0)
    run(rec, [sample("G0", T0, 100.0)], T0, T0 + 90)
    # daemon stopped from T0+90 to T0+600 (the next observation comes 510 s later)
    # first observation after the gap at T0+601: [T0+90, T0+601) is not attributed
    run(rec, [sample("G0", T0, 100.0)], T0 + 600, T0 + 660)
    rec.flush(at_s=T0 + 660)
    got = {r[0]: r[4] for r in rows(db, "slice_minute")}
    assert got == {T0: pytest.approx(60.0), T0 + 60: pytest.approx(30.0), T0 + 600: pytest.approx(59.0)}


def test_clock_step_back_never_records_a_minute_twice(db):
    clock = Clock(T0)
    rec = UsageRecorder(db, clock=clock)
    rec.set_ownership({"G0/0": SliceHold("G0", 1.0, "research", False)}, at_s=T0)
    run(rec, [sample("G0", T0, 10.0)], T0, T0 + 120)
    # the clock steps back 100 s; then runs on to T0 + 180
    run(rec, [sample("G0", T0, 10.0)], T0 + 20, T0 + 180)
    rec.flush(at_s=T0 + 180)
    got = {r[0]: r[4] for r in rows(db, "slice_minute")}
    assert got == {T0: pytest.approx(60.0), T0 + 60: pytest.approx(60.0), T0 + 120: pytest.approx(60.0)}
    assert db.meta("recorded_through_s") == T0 + 180


def test_restart_reads_the_high_water_mark(tmp_path):
    path = tmp_path / "u.sqlite3"
    db = UsageDb(path)
    rec = UsageRecorder(db)
    rec.set_ownership({"G0/0": SliceHold("G0", 1.0, "a", False)}, at_s=T0)
    run(rec, [sample("G0", T0, 10.0)], T0, T0 + 30)
    rec.flush(at_s=T0 + 30)  # clean stop in the middle of a minute
    db.close()
    db = UsageDb(path)
    rec = UsageRecorder(db)  # restart in the same minute: its part adds to the minute
    rec.set_ownership({"G0/0": SliceHold("G0", 1.0, "a", False)}, at_s=T0 + 20)  # clock behind the mark
    run(rec, [sample("G0", T0, 10.0)], T0 + 20, T0 + 60)
    assert [(r[0], r[4]) for r in rows(db, "slice_minute")] == [(T0, pytest.approx(60.0))]
    db.close()


def _fill(db: UsageDb, hours: int) -> None:
    rec = UsageRecorder(db)
    rec.set_ownership({"G0/0": SliceHold("G0", 0.5, "a", False), "G0/1": SliceHold("G0", 0.5, "b", True)}, at_s=T0)
    run(rec, [sample("G0", T0, 40.0)], T0, T0 + 1800, step=5)
    rec.set_ownership({"G0/0": SliceHold("G0", 0.5, "b", False), "G0/1": SliceHold("G0", 0.5, "b", True)},
                      at_s=T0 + 1800)
    run(rec, [sample("G0", T0, 40.0)], T0 + 1800, T0 + hours * 3600, step=5)


def test_rollup_hour_is_the_sum_of_its_minutes_and_report_reads_it(db):
    _fill(db, 3)
    assert db.pending_hours() == [T0, T0 + 3600, T0 + 7200]
    assert roll_up(db, T0 + 3 * 3600) == 3
    assert db.pending_hours() == []
    hour = {(r[0], r[1], r[3]): r[4:] for r in rows(db, "slice_hour")}
    # hour 0: slice 0 owned by a for 30 min then b: 900 GPU-s each; slice 1 b, leased all hour
    assert hour[(T0, "G0/0", "a")] == pytest.approx((900.0, 0.0, 360.0, 900.0, 0.0, 0.0))
    assert hour[(T0, "G0/0", "b")] == pytest.approx((900.0, 0.0, 360.0, 900.0, 0.0, 0.0))
    assert hour[(T0, "G0/1", "b")] == pytest.approx((1800.0, 1800.0, 720.0, 1800.0, 0.0, 0.0))
    minute_sum = db._db.execute("SELECT SUM(owned_gpu_s), SUM(used_gpu_s) FROM slice_minute").fetchone()
    hour_sum = db._db.execute("SELECT SUM(owned_gpu_s), SUM(used_gpu_s) FROM slice_hour").fetchone()
    assert hour_sum == pytest.approx(minute_sum) and hour_sum[0] == pytest.approx(3 * 3600)
    # a period of whole rolled-up hours reads the hourly table; its edges read minutes
    assert db.plan(T0 + 600, T0 + 3 * 3600) == [("minute", T0 + 600, T0 + 3600), ("hour", T0 + 3600, T0 + 3 * 3600)]
    by = {(r["department"]): r["owned_gpu_s"] for r in db.slice_usage(T0 + 600, T0 + 3 * 3600)}
    assert by == {"a": pytest.approx(600.0), "b": pytest.approx(3 * 3600 - 600 - 600.0)}
    # a rollup run again gives the same hours (idempotent)
    db.rollup_hour(T0)
    assert {(r[0], r[1], r[3]): r[4:] for r in rows(db, "slice_hour")} == hour


def test_every_day_buckets_and_gpu_history(db):
    _fill(db, 2)
    roll_up(db, T0 + 7200)
    got = db.slice_usage(T0, T0 + 7200, bucket_s=86400)
    assert {r["bucket_s"] for r in got} == {T0}
    hist = db.gpu_history("G0", T0, T0 + 7200, 3600)
    assert [(h["ts"], h["sm_util_pct"], h["memory_used_bytes"]) for h in hist] == [
        (T0, pytest.approx(40.0), pytest.approx(1000.0)), (T0 + 3600, pytest.approx(40.0), pytest.approx(1000.0))]


def test_retention_keeps_minutes_until_rolled_up(db):
    _fill(db, 2)
    now = T0 + MINUTE_RETENTION_S + 7200
    m, h = db.expire(now)  # nothing is rolled up yet: minutes stay
    assert (m, h) == (0, 0)
    roll_up(db, now)
    assert rows(db, "slice_minute") == [] and len(rows(db, "slice_hour")) == 5  # 3 rows in hour 0, 2 in hour 1


def test_not_a_database_is_an_error(tmp_path):
    p = tmp_path / "usage.sqlite3"
    p.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(sqlite3.DatabaseError):
        UsageDb(p)


_CHILD = r"""
import sys, itertools
from gpuctl.daemon.usage import SliceHold, UsageRecorder, roll_up
from gpuctl.daemon.usage_db import UsageDb
from gpuctl.model import GpuSample
db = UsageDb(sys.argv[1])
t = db.meta("recorded_through_s") or float(sys.argv[2])
rec = UsageRecorder(db, max_gap_s=1e9)
holds = {f"G{g}/{k}": SliceHold(f"G{g}", 0.25, "abc"[(g + k) % 3], k == 0) for g in range(8) for k in range(4)}
rec.set_ownership(holds, at_s=t)
print("ready", flush=True)
for i in itertools.count():
    t += 30.0  # 30 simulated seconds per step: an hour every 120 steps
    rec.observe([GpuSample(uuid=f"G{g}", timestamp_s=t, sm_util_pct=float((i + g) % 100), memory_used_bytes=g,
                           process_count=0) for g in range(8)], at_s=t)
    if i % 40 == 0:
        roll_up(db, t)
"""


def _consistent(path) -> tuple[int, float]:
    db = UsageDb(path)
    try:
        assert db.integrity_ok()
        rolled = db.meta("rolled_through_s") or 0.0
        through = db.meta("recorded_through_s") or 0.0
        q = "SELECT ts / 3600 * 3600, SUM(owned_gpu_s), SUM(used_gpu_s), SUM(leased_gpu_s) FROM {} WHERE ts < ? GROUP BY 1"
        minutes = db._db.execute(q.format("slice_minute"), (rolled,)).fetchall()
        hours = db._db.execute(q.format("slice_hour"), (rolled,)).fetchall()
        assert hours == [(h, pytest.approx(o), pytest.approx(u), pytest.approx(l)) for h, o, u, l in minutes]
        # every written minute is whole: 8 GPUs x 60 s, never a part (the current minute is lost, not torn)
        whole = db._db.execute("SELECT ts, SUM(owned_gpu_s) FROM slice_minute GROUP BY ts").fetchall()
        assert all(v == pytest.approx(480.0) for _, v in whole[1:]), whole[:3]
        assert not whole or whole[-1][0] + 60 <= through + 1e-6
        return len(hours), through
    finally:
        db.close()


def test_kill9_during_writes_and_rollups_never_corrupts(tmp_path):
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "usage.sqlite3"
    rnd = random.Random(7)
    seen_hours = 0
    last_through = 0.0
    for _ in range(4):
        p = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(T0)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[2])})
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(rnd.uniform(0.5, 1.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        hours, through = _consistent(path)
        assert through >= last_through
        seen_hours, last_through = max(seen_hours, hours), through
    assert seen_hours >= 1  # rollups did happen between the kills


@pytest.mark.parametrize("module", [
    "gpuctl.daemon.usage", "gpuctl.daemon.usage_db", "gpuctl.daemon.usage_api", "gpuctl.daemon.usage_history",
    "gpuctl.daemon.metrics", "gpuctl.daemon.observability", "gpuctl.durations", "gpuctl.fleet.usage_report",
    "gpuctl.cli.report", "gpuctl.fleet.demo_history", "gpuctl.fleet.prometheus"])
def test_usage_modules_are_headless(module):
    import subprocess
    import sys

    code = f"import sys, {module}; assert 'textual' not in sys.modules, 'textual imported'"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_stale_samples_make_sm_unknown(db):
    rec = UsageRecorder(db, max_gap_s=10.0)
    rec.set_ownership({"G0/0": SliceHold("G0", 1.0, "a", False)}, at_s=T0)
    old = sample("G0", T0 - 100, 90.0)  # the sampler stopped 100 s ago
    for t in range(1, 61):
        rec.observe([old], at_s=T0 + t)
    (row,) = rows(db, "slice_minute")
    assert row[4:] == pytest.approx((60.0, 0.0, 0.0, 0.0, 0.0, 0.0))  # owned, SM unknown: neither used nor idle


@pytest.mark.parametrize("text, seconds", [("30d", 30 * 86400), ("12h", 43200), ("2w", 14 * 86400),
                                           ("1d12h", 129600), ("90m", 5400), ("1.5h", 5400), ("45s", 45)])
def test_parse_duration(text, seconds):
    from gpuctl.durations import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text, message", [("30", "add a unit"), ("", "not a duration"), ("3x", "not a duration"),
                                           ("d", "not a duration"), ("1d 2h", "not a duration")])
def test_parse_duration_errors(text, message):
    from gpuctl.durations import DurationError, parse_duration

    with pytest.raises(DurationError, match=message):
        parse_duration(text)


def test_parse_time_forms():
    from gpuctl.durations import DurationError, parse_time

    now = T0 + 86400.0
    assert parse_time("now", now) == now
    assert parse_time("1d", now) == T0
    assert parse_time("2026-01-01", now) == T0
    assert parse_time("2026-01-01T01:00+01:00", now) == T0
    with pytest.raises(DurationError, match="not a time: 'tomorrow'"):
        parse_time("tomorrow", now)


def test_simulated_past_is_deterministic_adds_up_and_fills_only_before_recorded_time(tmp_path):
    from gpuctl.daemon.usage_history import fill_simulated_past

    holds = {"G0/0": SliceHold("G0", 0.5, "research", False), "G0/1": SliceHold("G0", 0.5, "training", False),
             "G1/0": SliceHold("G1", 1.0, "unassigned", False)}
    mem = {"G0": 80 * 2**30, "G1": 80 * 2**30}
    end = T0 + 10 * 86400 + 1234.5  # mid-minute: the last minute is a part
    dbs = [UsageDb(tmp_path / f"u{i}.sqlite3") for i in range(3)]
    try:
        for db, seed in zip(dbs, (7, 7, 8)):
            assert fill_simulated_past(db, holds, mem, seed, T0, end) > 0
        a, b, c = (rows(db, "slice_hour") + rows(db, "slice_minute") for db in dbs)
        assert a == b and a != c  # same seed, same past; another seed, another past
        db = dbs[0]
        roll_up(db, end)
        owned = sum(r["owned_gpu_s"] for r in db.slice_usage(T0, int(end) // 60 * 60 + 60))
        assert owned == pytest.approx(2 * (end - T0))  # 2 GPUs the whole time, the last part-minute too
        assert db.meta("recorded_through_s") == end
        leased = sum(r["leased_gpu_s"] for r in db.slice_usage(T0, int(end)))
        assert leased > 0 and all(r["leased_gpu_s"] == 0 for r in db.slice_usage(T0, int(end))
                                  if r["department"] == "unassigned")
        # hours older than the minute retention are hourly rows only; newer ones have minutes
        assert db._db.execute("SELECT MIN(ts) FROM slice_minute").fetchone()[0] >= end - MINUTE_RETENTION_S - 3600
        assert fill_simulated_past(db, holds, mem, 7, T0, end) == 0  # already covered: nothing written twice
    finally:
        for db in dbs:
            db.close()


def test_real_gpuctld_killed_during_its_rollup_comes_back_consistent(tmp_path):
    """gpuctld --history 8d rolls ~170 hours up right after start; kill -9 it in the middle, start it
    again (same state dir): the database is intact, every rolled-up hour equals its minutes, and
    the usage of the period adds up to the GPUs' time less the time it was down."""
    import time

    from daemon_proc import start_daemon

    d = start_daemon(tmp_path, gpus=4, seed=2, name="k", extra_args=["--history", "8d"], wait=False)
    try:
        path = d.state_dir / "usage.sqlite3"
        first = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # kill once the rollup thread has committed an hour or more
            try:
                ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.05)
                row = ro.execute("SELECT value FROM meta WHERE key = 'rolled_through_s'").fetchone()
                ro.close()
            except sqlite3.Error:
                row = None
            if row is not None:
                if first is None:
                    first = row[0]
                elif row[0] > first:
                    break
            time.sleep(0.002)
        killed_at = time.time()
        d.kill9()
        db = UsageDb(d.state_dir / "usage.sqlite3")
        assert db.integrity_ok()
        pending_at_kill = len(db.pending_hours())
        db.close()
        assert pending_at_kill > 0  # killed in the middle of the rollup
        d.start()
        restarted_at = time.time()
        db = UsageDb(d.state_dir / "usage.sqlite3")
        deadline = time.monotonic() + 60
        while db.pending_hours() and time.monotonic() < deadline:  # the restarted daemon finishes the rollup
            time.sleep(0.2)
        try:
            assert db.integrity_ok() and db.pending_hours() == []
            rolled = db.meta("rolled_through_s")
            q = "SELECT ts / 3600 * 3600, SUM(owned_gpu_s), SUM(used_gpu_s) FROM {} WHERE ts >= ? AND ts < ? GROUP BY 1"
            # from the first whole hour whose minutes are all kept (retention cuts minutes, not hours)
            lo = -(-db._db.execute("SELECT MIN(ts) FROM slice_minute").fetchone()[0] // 3600) * 3600
            minutes = db._db.execute(q.format("slice_minute"), (lo, rolled)).fetchall()
            hours = db._db.execute(q.format("slice_hour"), (lo, rolled)).fetchall()
            assert len(hours) >= 7 * 24 - 3 and hours == [(h, pytest.approx(o), pytest.approx(u)) for h, o, u in minutes]
            now = int(time.time()) // 60 * 60
            since = int(killed_at) // 3600 * 3600 - 7 * 86400
            owned = sum(r["owned_gpu_s"] for r in db.slice_usage(since, now))
            down = restarted_at - killed_at
            # 4 GPUs all the time, less the time it was down, the minute lost to the kill and the current one
            assert 4 * (now - since - down - 120) - 1 <= owned <= 4 * (now - since) + 1
        finally:
            db.close()
    finally:
        d.stop()
