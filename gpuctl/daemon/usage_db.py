"""The node's usage accounting database: SQLite in the state directory (``usage.sqlite3``).

Tables (every figure in GPU-seconds: seconds x the slice's fraction of its GPU):

- ``slice_minute`` / ``slice_hour``: one row per (period start ``ts`` [Unix s, UTC], slice id,
  department). ``owned_gpu_s``: time the department owned the slice (UNASSIGNED included, so the
  owned column of a node adds up to its GPU count x seconds recorded); ``leased_gpu_s``: of it,
  held by a lease; ``used_gpu_s``: owned time weighted by the GPU's SM utilization (NVML's SM
  utilization is per GPU, so every slice of a GPU gets its GPU's figure); ``sm_known_gpu_s``: owned
  time while SM utilization was known (the divisor of the mean); ``idle_gpu_s``: owned, not leased,
  SM utilization < :data:`IDLE_SM_PCT`; ``outside_gpu_s``: owned, not leased, while the GPU ran
  compute processes (use outside gpuctl; only counted where the process list was known).
  A change of owner inside a minute gives that minute two rows, split at the change.
- ``gpu_minute`` / ``gpu_hour``: one row per (period start, GPU UUID): ``sampled_s`` (seconds
  recorded), ``sm_pct_s`` (SM % x seconds), ``sm_known_s``, ``memory_used_byte_s`` (bytes x
  seconds), ``memory_known_s``, ``memory_total_bytes``.
- ``refusal``: lease requests refused for lack of idle slices (``ts``, department, GPU-equivalents
  asked, NULL when the request counted slices); kept :data:`HOUR_RETENTION_S`.
- ``meta``: ``recorded_through_s`` (high-water mark of recorded time: time before it is never
  recorded twice, also across a clock step back) and ``rolled_through_s`` (hours before it are in
  the hourly tables).

Durability: WAL journal with ``synchronous=FULL``. Minutes are written once a minute in one
transaction, so FULL costs one fsync per minute and a committed minute survives a power cut as
well as a kill -9 (NORMAL would be corruption-safe too, but could lose the last minutes on power
loss). An hour's rollup (delete + insert of its hourly rows + the ``rolled_through_s`` mark) is one
transaction: a daemon killed during a rollup leaves either the whole hour or nothing, and the next
rollup redoes it.

Retention: minute rows :data:`MINUTE_RETENTION_S` (7 d), hourly rows :data:`HOUR_RETENTION_S`
(400 d); deleted pages are reused, so the file stops growing once both windows are full.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: File name of the database in the state directory.
DB_NAME = "usage.sqlite3"
#: Minute rows are kept this long, seconds (7 days).
MINUTE_RETENTION_S = 7 * 86400
#: Hourly rows (and lease refusals) are kept this long, seconds (400 days).
HOUR_RETENTION_S = 400 * 86400
#: Owned, not leased, and SM utilization below this percentage counts as idle.
IDLE_SM_PCT = 5.0

#: The figures of a slice row, in column order.
SLICE_FIGURES = ("owned_gpu_s", "leased_gpu_s", "used_gpu_s", "sm_known_gpu_s", "idle_gpu_s", "outside_gpu_s")
#: The figures of a GPU row that add up (memory_total_bytes is kept as the last value).
GPU_FIGURES = ("sampled_s", "sm_pct_s", "sm_known_s", "memory_used_byte_s", "memory_known_s")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS slice_minute(
    ts INTEGER NOT NULL, slice_id TEXT NOT NULL, gpu_uuid TEXT NOT NULL, department TEXT NOT NULL,
    owned_gpu_s REAL NOT NULL, leased_gpu_s REAL NOT NULL, used_gpu_s REAL NOT NULL,
    sm_known_gpu_s REAL NOT NULL, idle_gpu_s REAL NOT NULL, outside_gpu_s REAL NOT NULL,
    PRIMARY KEY (ts, slice_id, department)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS slice_hour(
    ts INTEGER NOT NULL, slice_id TEXT NOT NULL, gpu_uuid TEXT NOT NULL, department TEXT NOT NULL,
    owned_gpu_s REAL NOT NULL, leased_gpu_s REAL NOT NULL, used_gpu_s REAL NOT NULL,
    sm_known_gpu_s REAL NOT NULL, idle_gpu_s REAL NOT NULL, outside_gpu_s REAL NOT NULL,
    PRIMARY KEY (ts, slice_id, department)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gpu_minute(
    ts INTEGER NOT NULL, gpu_uuid TEXT NOT NULL, sampled_s REAL NOT NULL, sm_pct_s REAL NOT NULL,
    sm_known_s REAL NOT NULL, memory_used_byte_s REAL NOT NULL, memory_known_s REAL NOT NULL,
    memory_total_bytes INTEGER, PRIMARY KEY (ts, gpu_uuid)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gpu_hour(
    ts INTEGER NOT NULL, gpu_uuid TEXT NOT NULL, sampled_s REAL NOT NULL, sm_pct_s REAL NOT NULL,
    sm_known_s REAL NOT NULL, memory_used_byte_s REAL NOT NULL, memory_known_s REAL NOT NULL,
    memory_total_bytes INTEGER, PRIMARY KEY (ts, gpu_uuid)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS refusal(
    ts REAL NOT NULL, department TEXT NOT NULL, gpu_equivalents REAL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS refusal_ts ON refusal(ts);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value REAL NOT NULL);
"""


def _slice_upsert(table: str) -> str:
    cols = ", ".join(SLICE_FIGURES)
    adds = ", ".join(f"{c} = {c} + excluded.{c}" for c in SLICE_FIGURES)
    return (f"INSERT INTO {table}(ts, slice_id, gpu_uuid, department, {cols}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            f"ON CONFLICT(ts, slice_id, department) DO UPDATE SET {adds}")


def _gpu_upsert(table: str) -> str:
    cols = ", ".join(GPU_FIGURES)
    adds = ", ".join(f"{c} = {c} + excluded.{c}" for c in GPU_FIGURES)
    return (f"INSERT INTO {table}(ts, gpu_uuid, {cols}, memory_total_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            f"ON CONFLICT(ts, gpu_uuid) DO UPDATE SET {adds}, "
            f"memory_total_bytes = coalesce(excluded.memory_total_bytes, memory_total_bytes)")


SliceRow = tuple  # (ts, slice_id, gpu_uuid, department, *SLICE_FIGURES)
GpuRow = tuple  # (ts, gpu_uuid, *GPU_FIGURES, memory_total_bytes)


class UsageDb:
    """The usage database of one node (see the module docstring); thread-safe (one connection, a lock).

    `path`: the database file (created with its tables when missing). Raises sqlite3.DatabaseError
    when the file is not a usable database (named by the caller).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():  # owner-only, like the state file (SQLite gives -wal/-shm the same mode)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._db.close()

    # ---------------------------------------------------------------- meta

    def meta(self, key: str) -> float | None:
        """A value of the meta table (``recorded_through_s``, ``rolled_through_s``), None when unset."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else float(row[0])

    # ---------------------------------------------------------------- writing

    def write_minutes(self, slice_rows: Iterable[SliceRow], gpu_rows: Iterable[GpuRow],
                      recorded_through_s: float, *, hourly: bool = False) -> None:
        """Add rows to the minute tables (or the hourly ones with `hourly`; figures of an existing
        row are added to) and move ``recorded_through_s`` forward, in one transaction."""
        s_table, g_table = ("slice_hour", "gpu_hour") if hourly else ("slice_minute", "gpu_minute")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(_slice_upsert(s_table), slice_rows)
                self._db.executemany(_gpu_upsert(g_table), gpu_rows)
                self._db.execute(
                    "INSERT INTO meta(key, value) VALUES ('recorded_through_s', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)", (recorded_through_s,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def set_rolled_through(self, value_s: float) -> None:
        """Mark hours before `value_s` as rolled up (used after a simulated past was written)."""
        with self._lock:
            self._db.execute("INSERT INTO meta(key, value) VALUES ('rolled_through_s', ?) "
                             "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)", (value_s,))

    def add_refusal(self, ts_s: float, department: str, gpu_equivalents: float | None, reason: str) -> None:
        """Record a lease request refused for lack of idle slices of `department`."""
        with self._lock:
            self._db.execute("INSERT INTO refusal(ts, department, gpu_equivalents, reason) VALUES (?, ?, ?, ?)",
                             (ts_s, department, gpu_equivalents, reason[:500]))

    # ---------------------------------------------------------------- rollup and retention

    def rollup_hour(self, hour_s: int) -> None:
        """(Re)compute the hourly rows of the hour starting at `hour_s` from its minutes and mark
        hours up to its end rolled up: one transaction (a kill during it leaves the hour as before)."""
        end = hour_s + 3600
        sums = ", ".join(f"SUM({c})" for c in SLICE_FIGURES)
        gsums = ", ".join(f"SUM({c})" for c in GPU_FIGURES)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM slice_hour WHERE ts = ?", (hour_s,))
                self._db.execute("DELETE FROM gpu_hour WHERE ts = ?", (hour_s,))
                self._db.execute(
                    f"INSERT INTO slice_hour SELECT ?, slice_id, MIN(gpu_uuid), department, {sums} FROM slice_minute "
                    f"WHERE ts >= ? AND ts < ? GROUP BY slice_id, department", (hour_s, hour_s, end))
                self._db.execute(
                    f"INSERT INTO gpu_hour SELECT ?, gpu_uuid, {gsums}, MAX(memory_total_bytes) FROM gpu_minute "
                    f"WHERE ts >= ? AND ts < ? GROUP BY gpu_uuid", (hour_s, hour_s, end))
                self._db.execute(
                    "INSERT INTO meta(key, value) VALUES ('rolled_through_s', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)", (end,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def pending_hours(self) -> list[int]:
        """Start times of the complete hours (ending at or before ``recorded_through_s``) not yet
        rolled up, oldest first."""
        recorded = self.meta("recorded_through_s")
        if recorded is None:
            return []
        rolled = self.meta("rolled_through_s")
        if rolled is None:
            with self._lock:
                row = self._db.execute("SELECT MIN(ts) FROM slice_minute").fetchone()
            if row[0] is None:
                return []
            rolled = row[0] // 3600 * 3600
        last_end = int(recorded) // 3600 * 3600
        return list(range(int(rolled), last_end, 3600))

    def expire(self, now_s: float) -> tuple[int, int]:
        """Delete minute rows older than MINUTE_RETENTION_S (only hours already rolled up) and
        hourly rows and refusals older than HOUR_RETENTION_S. Returns (minute rows, hour rows) deleted."""
        rolled = self.meta("rolled_through_s") or 0.0
        minute_cut = min(now_s - MINUTE_RETENTION_S, rolled)
        hour_cut = now_s - HOUR_RETENTION_S
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                m = self._db.execute("DELETE FROM slice_minute WHERE ts < ?", (minute_cut,)).rowcount
                self._db.execute("DELETE FROM gpu_minute WHERE ts < ?", (minute_cut,))
                h = self._db.execute("DELETE FROM slice_hour WHERE ts < ?", (hour_cut,)).rowcount
                self._db.execute("DELETE FROM gpu_hour WHERE ts < ?", (hour_cut,))
                self._db.execute("DELETE FROM refusal WHERE ts < ?", (hour_cut,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return m, h

    # ---------------------------------------------------------------- reading

    def plan(self, since_s: int, until_s: int) -> list[tuple[str, int, int]]:
        """Which table answers which part of [since_s, until_s): ``[(table kind "hour"|"minute",
        from_s, to_s)]``. Whole hours already rolled up come from the hourly tables (like sreport),
        the edges and the hours not yet rolled up from the minutes."""
        rolled = int(self.meta("rolled_through_s") or 0)
        lo = -(-since_s // 3600) * 3600
        hi = min(until_s // 3600 * 3600, rolled // 3600 * 3600)
        if hi <= lo:
            return [("minute", since_s, until_s)]
        parts = [("hour", lo, hi)]
        if since_s < lo:
            parts.insert(0, ("minute", since_s, lo))
        if hi < until_s:
            parts.append(("minute", hi, until_s))
        return parts

    def slice_usage(self, since_s: int, until_s: int, bucket_s: int | None = None,
                    bucket_origin_s: int = 0) -> list[dict[str, Any]]:
        """Usage per (bucket, GPU, department) over [since_s, until_s), figures summed over slices.

        bucket_s: None for one bucket (the whole period, ``bucket_s`` = since_s in the rows), else
        the bucket length in seconds; buckets start at bucket_origin_s + k x bucket_s. Returns
        ``[{"bucket_s", "gpu_uuid", "department", "slices", <SLICE_FIGURES>...}]`` (GPU-seconds).
        """
        key = ("?" if bucket_s is None else
               f"((ts - {int(bucket_origin_s)}) / {int(bucket_s)}) * {int(bucket_s)} + {int(bucket_origin_s)}")
        sums = ", ".join(f"SUM({c})" for c in SLICE_FIGURES)
        out: dict[tuple, dict[str, Any]] = {}
        for kind, lo, hi in self.plan(since_s, until_s):
            args: tuple = ((since_s,) if bucket_s is None else ()) + (lo, hi)
            sql = (f"SELECT {key} AS b, gpu_uuid, department, COUNT(DISTINCT slice_id), {sums} FROM slice_{kind} "
                   f"WHERE ts >= ? AND ts < ? GROUP BY b, gpu_uuid, department")
            with self._lock:
                rows = self._db.execute(sql, args).fetchall()
            for b, gpu, dept, nslices, *figs in rows:
                row = out.setdefault((b, gpu, dept), {"bucket_s": b, "gpu_uuid": gpu, "department": dept,
                                                      "slices": 0, **{c: 0.0 for c in SLICE_FIGURES}})
                row["slices"] = max(row["slices"], nslices)
                for c, v in zip(SLICE_FIGURES, figs):
                    row[c] += v or 0.0
        return sorted(out.values(), key=lambda r: (r["bucket_s"], r["gpu_uuid"], r["department"]))

    def gpu_history(self, gpu_uuid: str | None, since_s: int, until_s: int, step_s: int) -> list[dict[str, Any]]:
        """Mean SM utilization and memory used per `step_s` bucket of [since_s, until_s) for one GPU
        (or all GPUs of the node when `gpu_uuid` is None), from the hourly rows where the step is
        at least an hour and they cover it, else from minutes. Rows ``{"ts", "gpu_uuid",
        "sm_util_pct" (None when unknown), "memory_used_bytes" (None when unknown), "sampled_s"}``."""
        kind = "hour" if step_s >= 3600 and step_s % 3600 == 0 else "minute"
        cond, args = ("AND gpu_uuid = ?", (gpu_uuid,)) if gpu_uuid is not None else ("", ())
        sql = (f"SELECT (ts - ?) / ? * ? + ? AS b, gpu_uuid, SUM(sampled_s), SUM(sm_pct_s), SUM(sm_known_s), "
               f"SUM(memory_used_byte_s), SUM(memory_known_s) FROM gpu_{kind} WHERE ts >= ? AND ts < ? {cond} "
               f"GROUP BY b, gpu_uuid ORDER BY b, gpu_uuid")
        with self._lock:
            rows = self._db.execute(sql, (since_s, step_s, step_s, since_s, since_s, until_s, *args)).fetchall()
        return [{"ts": b, "gpu_uuid": g, "sampled_s": s,
                 "sm_util_pct": (sm / k if k else None), "memory_used_bytes": (mem / mk if mk else None)}
                for b, g, s, sm, k, mem, mk in rows]

    def refusals(self, since_s: float, until_s: float) -> list[dict[str, Any]]:
        """Lease refusals in [since_s, until_s) summed per department:
        ``[{"department", "count", "gpu_equivalents"}]`` (gpu_equivalents: of the refusals that said
        it, None when none did)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT department, COUNT(*), SUM(gpu_equivalents) FROM refusal WHERE ts >= ? AND ts < ? "
                "GROUP BY department ORDER BY department", (since_s, until_s)).fetchall()
        return [{"department": d, "count": n, "gpu_equivalents": g} for d, n, g in rows]

    def earliest_ts(self) -> int | None:
        """Start of the oldest row of either slice table (Unix s), None when both are empty."""
        with self._lock:
            lows = [self._db.execute(f"SELECT MIN(ts) FROM {t}").fetchone()[0] for t in ("slice_minute", "slice_hour")]
        lows = [v for v in lows if v is not None]
        return min(lows) if lows else None

    def integrity_ok(self) -> bool:
        """True when SQLite's integrity check finds nothing wrong."""
        with self._lock:
            return self._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
