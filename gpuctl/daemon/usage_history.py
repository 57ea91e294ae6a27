"""A deterministic simulated past for the usage database (``gpuctld --backend simulated --history 30d``).

Every slice keeps its current owner through the past (the past is what the present ownership would
have looked like). Each day, a slice of a department is leased with a probability that depends on
the department (a stable hash of its name: some departments leave their slices idle, others use
them), from a morning hour for some hours; while leased its load is 40-95 % with a little noise.
A GPU's SM utilization is the sum of its leased slices' fraction x load (at most 100 %), plus up
to 2 % background; memory used is 60 % of the leased fraction of its memory.

Minute rows are written for the last :data:`~gpuctl.daemon.usage_db.MINUTE_RETENTION_S` of the
past and hourly rows before that (as retention would have left them); the rollup thread turns the
newer minutes into hours as it would have. Deterministic for (seed, slice ids, department names,
start, end); NumPy does the arithmetic, so a year of 64 slices takes seconds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from gpuctl.daemon.usage import SliceHold
from gpuctl.daemon.usage_db import IDLE_SM_PCT, MINUTE_RETENTION_S, UsageDb
from gpuctl.model import UNASSIGNED


def _stable(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "little")


def department_activity(department: str) -> float:
    """Probability (0..0.9) that a slice of `department` is leased on a given day in the simulated past."""
    if department == UNASSIGNED:
        return 0.0
    return 0.05 + 0.85 * (_stable("activity", department) % 1000) / 1000


def _arrays(holds: Mapping[str, SliceHold], memory_total: Mapping[str, int | None], seed: int,
            minutes: np.ndarray) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Per slice (leased bool[], gpu_sm float[]) and per GPU (sm float[], memory_used float[])."""
    hour = (minutes // 3600) % 24
    day = minutes // 86400
    day0 = int(day[0]) if len(day) else 0
    ndays = int(day[-1]) - day0 + 1 if len(day) else 0
    di = (day - day0).astype(np.int64)
    by_gpu: dict[str, list[str]] = {}
    for sid, h in sorted(holds.items()):
        by_gpu.setdefault(h.gpu_uuid, []).append(sid)
    slices: dict[str, tuple] = {}
    gpus: dict[str, tuple] = {}
    for uuid, sids in sorted(by_gpu.items()):
        load = np.zeros(len(minutes))
        leased_frac = np.zeros(len(minutes))
        for sid in sids:
            h = holds[sid]
            rng = np.random.default_rng(_stable(seed, sid, day0))
            active = rng.random(ndays) < department_activity(h.department)
            start = rng.integers(6, 12, ndays)
            length = rng.integers(2, 11, ndays)
            level = rng.uniform(0.40, 0.95, ndays)
            leased = active[di] & (hour >= start[di]) & (hour < start[di] + length[di])
            noise = rng.normal(0.0, 0.04, len(minutes))
            load += np.where(leased, h.fraction * np.clip(level[di] + noise, 0.0, 1.0), 0.0)
            leased_frac += np.where(leased, h.fraction, 0.0)
            slices[sid] = (leased,)
        rng = np.random.default_rng(_stable(seed, uuid, "background", day0))
        sm = np.clip(100.0 * load + rng.uniform(0.0, 2.0, len(minutes)), 0.0, 100.0)
        total = memory_total.get(uuid) or 0
        gpus[uuid] = (sm, 0.6 * leased_frac * total)
    for sid in slices:
        slices[sid] = (slices[sid][0], gpus[holds[sid].gpu_uuid][0])
    return slices, gpus


def fill_simulated_past(db: UsageDb, holds: Mapping[str, SliceHold], memory_total: Mapping[str, int | None],
                        seed: int, start_s: float, end_s: float) -> int:
    """Write the simulated usage of [start_s, end_s) (start rounded down to the hour) into `db` and
    return the number of rows written. Only time before the database's earliest row is filled, so
    a node that already recorded usage keeps its own figures; nothing is written when that leaves
    no time."""
    start = int(start_s) // 3600 * 3600
    earliest = db.earliest_ts()
    end = float(end_s) if earliest is None else min(float(end_s), float(earliest))
    if end <= start or not holds:
        return 0
    last_min = int(end) // 60 * 60
    minutes = np.arange(start, last_min + (60 if end > last_min else 0), 60, dtype=np.int64)
    dt = np.full(len(minutes), 60.0)
    if end > last_min:
        dt[-1] = end - last_min
    slices, gpus = _arrays(holds, memory_total, seed, minutes)
    minute_from = max(start, (int(end) - MINUTE_RETENTION_S) // 3600 * 3600)
    cut = int(np.searchsorted(minutes, minute_from))
    written = 0
    for hourly, lo, hi in ((True, 0, cut), (False, cut, len(minutes))):
        if hi <= lo:
            continue
        ts = minutes[lo:hi]
        w = dt[lo:hi]
        key = (ts // 3600 * 3600) if hourly else ts
        uniq, inv = np.unique(key, return_inverse=True)

        def total(x: np.ndarray) -> np.ndarray:
            return np.bincount(inv, weights=x, minlength=len(uniq))

        s_rows, g_rows = [], []
        for sid, (leased, sm) in slices.items():
            h = holds[sid]
            owned = w[:] * h.fraction
            lsd = np.where(leased[lo:hi], owned, 0.0)
            used = owned * sm[lo:hi] / 100.0
            idle = np.where(~leased[lo:hi] & (sm[lo:hi] < IDLE_SM_PCT), owned, 0.0)
            cols = [total(owned), total(lsd), total(used), total(owned), total(idle)]
            s_rows += [(int(t), sid, h.gpu_uuid, h.department, *(float(c[i]) for c in cols), 0.0)
                       for i, t in enumerate(uniq)]
        for uuid, (sm, mem) in gpus.items():
            cols = [total(w), total(sm[lo:hi] * w), total(w), total(mem[lo:hi] * w), total(w)]
            g_rows += [(int(t), uuid, *(float(c[i]) for c in cols), memory_total.get(uuid))
                       for i, t in enumerate(uniq)]
        db.write_minutes(s_rows, g_rows, end if not hourly else float(minute_from), hourly=hourly)
        written += len(s_rows) + len(g_rows)
    if cut > 0:
        db.set_rolled_through(float(minute_from))
    written += _refusals(db, holds, slices, minutes)
    return written


def _refusals(db: UsageDb, holds: Mapping[str, SliceHold], slices: dict[str, tuple], minutes: np.ndarray) -> int:
    """A lease refusal of a department on each day when all its slices were leased at once (at the
    first such minute, asking one GPU): the "short" side of ``gpuctl report --suggest``."""
    depts: dict[str, list[str]] = {}
    for sid, h in holds.items():
        if h.department != UNASSIGNED:
            depts.setdefault(h.department, []).append(sid)
    n = 0
    for dept, sids in sorted(depts.items()):
        full = np.logical_and.reduce([slices[sid][0] for sid in sids])
        days = minutes[full] // 86400
        first = np.unique(days, return_index=True)[1]
        for ts in minutes[full][first]:
            db.add_refusal(float(ts), dept, 1.0, f"simulated: every slice of {dept} was leased")
            n += 1
    return n
