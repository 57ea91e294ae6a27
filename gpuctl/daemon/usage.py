"""Usage accounting: turns the node's ownership, leases and telemetry into per-minute rows of
:mod:`gpuctl.daemon.usage_db`, and rolls them up into hours in the background.

:class:`UsageRecorder` is the arithmetic, with an injectable clock and no thread: it holds the
current ownership of each slice (set by :meth:`UsageRecorder.set_ownership`, called by the state
manager after every committed change, so a change of owner splits the minute at the change) and
the newest sample of each GPU (:meth:`UsageRecorder.observe`). Each call first attributes the time
since the previous call to what held until then, cut at minute boundaries; complete minutes are
written to the database in one transaction (the current minute is lost if the daemon is killed).

Time that is not attributed: an interval longer than ``max_gap_s`` (the daemon was stopped, the
machine slept, or the clock stepped forward) and any time before the high-water mark
``recorded_through_s`` (a clock stepped back never records a minute twice).

:class:`UsageService` runs the recorder on the daemon: a thread that observes the sampler every
``tick_s`` and, every ``rollup_every_s``, rolls complete hours up and expires old rows; the usage
routes call :meth:`UsageService.record_now` before they read, so a minute that has ended is
answered from the database whether or not the thread has had its turn yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctl.daemon.usage_db import DB_NAME, GPU_FIGURES, IDLE_SM_PCT, SLICE_FIGURES, UsageDb
from gpuctl.model import GpuSample

log = logging.getLogger("gpuctld.usage")


@dataclass(frozen=True)
class SliceHold:
    """Who holds one slice now: gpu_uuid, fraction of the GPU (0..1], department, leased."""

    gpu_uuid: str
    fraction: float
    department: str
    leased: bool


def holds_of(state: Any) -> dict[str, SliceHold]:
    """The SliceHold of every slice of a gpuctl.daemon.state.NodeState, by slice id."""
    return {sid: SliceHold(s.gpu_uuid, float(s.fraction), s.department, s.lease_id is not None)
            for sid, s in state.slices.items()}


class UsageRecorder:
    """Accumulates usage in memory and writes complete minutes to `db` (see the module docstring).

    clock: Unix time in seconds (time.time by default; tests pass their own). max_gap_s: an
    interval between two calls longer than this is not attributed (a gap). Thread-safe.
    """

    def __init__(self, db: UsageDb, clock: Callable[[], float] = time.time, max_gap_s: float = 10.0):
        self.db = db
        self.clock = clock
        self.max_gap_s = float(max_gap_s)
        self._lock = threading.Lock()
        self._holds: dict[str, SliceHold] = {}
        self._samples: dict[str, GpuSample] = {}
        self._last_s: float | None = None
        self._through_s = db.meta("recorded_through_s") or 0.0
        # (minute ts, slice id, department) -> [gpu_uuid, *SLICE_FIGURES]; (minute ts, gpu) -> [*GPU_FIGURES, total]
        self._slice_acc: dict[tuple[int, str, str], list] = {}
        self._gpu_acc: dict[tuple[int, str], list] = {}

    # ------------------------------------------------------------------ inputs

    def set_ownership(self, holds: dict[str, SliceHold], at_s: float | None = None) -> None:
        """Attribute the time up to `at_s` (default: the clock) to the previous ownership, then
        hold `holds` from there on."""
        with self._lock:
            self._advance(self.clock() if at_s is None else at_s)
            self._holds = dict(holds)

    def observe(self, samples: dict[str, GpuSample] | Iterable[GpuSample], at_s: float | None = None) -> None:
        """Take the newest sample of each GPU (by UUID) and attribute the time up to `at_s` with it
        (NVML's utilization describes the sample period just ended)."""
        items = samples.values() if isinstance(samples, dict) else samples
        with self._lock:
            now = self.clock() if at_s is None else at_s
            # a sample older than max_gap_s (the sampler is stuck) says nothing about now
            self._samples = {s.uuid: s if now - s.timestamp_s <= self.max_gap_s else
                             GpuSample(uuid=s.uuid, timestamp_s=s.timestamp_s, error="stale sample")
                             for s in items}
            self._advance(now)

    def flush(self, at_s: float | None = None) -> None:
        """Attribute up to `at_s` and write every accumulated row, the current minute's part too
        (on a clean stop; a restart in the same minute adds to it)."""
        with self._lock:
            now = self.clock() if at_s is None else at_s
            self._advance(now)
            self._write(None, now)

    # ------------------------------------------------------------------ arithmetic

    def _advance(self, now: float) -> None:
        last = self._last_s
        self._last_s = now
        if last is None or now <= last:
            return
        if now - last > self.max_gap_s:
            log.info("usage: %.0f s not recorded (daemon stopped, machine asleep or clock step)", now - last)
            self._through_s = max(self._through_s, now)
            return
        start = max(last, self._through_s)
        if start >= now:
            return
        t = start
        while t < now:
            minute = int(t // 60) * 60
            end = min(now, minute + 60)
            self._add(minute, end - t)
            t = end
        self._through_s = now
        done = int(now // 60) * 60
        if any(k[0] < done for k in self._gpu_acc) or any(k[0] < done for k in self._slice_acc):
            self._write(done, now)

    def _add(self, minute: int, dt: float) -> None:
        gpu_state: dict[str, tuple[float | None, bool | None]] = {}
        for uuid, s in self._samples.items():
            ok = s.error is None
            sm = s.sm_util_pct if ok else None
            acc = self._gpu_acc.setdefault((minute, uuid), [0.0] * len(GPU_FIGURES) + [None])
            acc[0] += dt
            if sm is not None:
                acc[1] += sm * dt
                acc[2] += dt
            if ok and s.memory_used_bytes is not None:
                acc[3] += s.memory_used_bytes * dt
                acc[4] += dt
            if s.memory_total_bytes is not None:
                acc[5] = s.memory_total_bytes
            busy = None if (not ok or s.process_count is None or s.processes_error) else s.process_count > 0
            gpu_state[uuid] = (sm, busy)
        gpu_leased = {h.gpu_uuid for h in self._holds.values() if h.leased}
        for sid, h in self._holds.items():
            sm, busy = gpu_state.get(h.gpu_uuid, (None, None))
            g = dt * h.fraction
            acc = self._slice_acc.setdefault((minute, sid, h.department), [h.gpu_uuid] + [0.0] * len(SLICE_FIGURES))
            acc[1] += g
            if h.leased:
                acc[2] += g
            if sm is not None:
                acc[3] += g * sm / 100.0
                acc[4] += g
                if not h.leased and sm < IDLE_SM_PCT:
                    acc[5] += g
            if not h.leased and busy and h.gpu_uuid not in gpu_leased:
                acc[6] += g

    def _write(self, before: int | None, through_s: float) -> None:
        """Write accumulated rows of minutes < `before` (all when None) in one transaction."""
        s_keys = [k for k in self._slice_acc if before is None or k[0] < before]
        g_keys = [k for k in self._gpu_acc if before is None or k[0] < before]
        if not s_keys and not g_keys:
            return
        s_rows = [(k[0], k[1], self._slice_acc[k][0], k[2], *self._slice_acc[k][1:]) for k in s_keys]
        g_rows = [(k[0], k[1], *self._gpu_acc[k]) for k in g_keys]
        mark = through_s if before is None else min(through_s, before)
        self.db.write_minutes(s_rows, g_rows, mark)
        for k in s_keys:
            del self._slice_acc[k]
        for k in g_keys:
            del self._gpu_acc[k]


def roll_up(db: UsageDb, now_s: float) -> int:
    """Roll every complete hour not yet rolled up into the hourly tables (one transaction per
    hour), then expire old rows. Returns the number of hours rolled up."""
    hours = db.pending_hours()
    for h in hours:
        db.rollup_hour(h)
    db.expire(now_s)
    return len(hours)


class UsageService:
    """The recorder and the rollup on a running gpuctld.

    state: the NodeStateManager (its ``listeners`` get :meth:`on_commit`); sampler: the telemetry
    Sampler (read with ``latest()``); state_dir: where ``usage.sqlite3`` lives. tick_s: how often
    the sampler is observed (s); rollup_every_s: how often hours are rolled up (s).
    """

    def __init__(self, state: Any, sampler: Any, state_dir: str | Path, *, tick_s: float = 1.0,
                 rollup_every_s: float = 60.0, clock: Callable[[], float] = time.time):
        self.state = state
        self.sampler = sampler
        self.db = UsageDb(Path(state_dir) / DB_NAME)
        self.clock = clock
        self.tick_s = float(tick_s)
        self.rollup_every_s = float(rollup_every_s)
        self.recorder = UsageRecorder(self.db, clock=clock, max_gap_s=max(10.0, 5 * self.tick_s))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def on_commit(self, new_state: Any) -> None:
        """State-manager listener: the ownership after a committed change (splits the minute).
        Never raises (the change is already committed): a failure is logged."""
        try:
            self.recorder.set_ownership(holds_of(new_state))
        except Exception as e:  # noqa: BLE001
            log.error("usage: could not record an ownership change: %s", e)

    def start(self, at_s: float | None = None) -> None:
        """Take the current ownership (recording from `at_s`, default now), subscribe to changes
        and start the two threads."""
        self.state.listeners.append(self.on_commit)  # first: a change from here on is not missed
        self.recorder.set_ownership(holds_of(self.state.snapshot()), at_s=at_s)
        for name, target in (("gpuctld-usage", self._observe_loop), ("gpuctld-rollup", self._rollup_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def record_now(self) -> None:
        """Observe the sampler now, as the observe thread does every ``tick_s``: the minutes that
        ended since its last round are written before this returns. Readers call it first, so a
        minute that ended before their period's end is in the database even when the thread is
        late (a loaded machine): without it a report asked a few seconds after a minute ended could
        miss that minute. Raises what the recorder or the database raises."""
        self.recorder.observe(self.sampler.latest())

    def _observe_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.record_now()
            except Exception as e:  # noqa: BLE001 - accounting must never stop the daemon
                log.error("usage: could not record: %s", e)

    def _rollup_loop(self) -> None:
        while True:
            try:
                n = roll_up(self.db, self.clock())
                if n:
                    log.info("usage: rolled up %d hour(s)", n)
            except Exception as e:  # noqa: BLE001 - retried at the next round
                log.error("usage: rollup failed (retried in %.0f s): %s", self.rollup_every_s, e)
            if self._stop.wait(self.rollup_every_s):
                return

    def stop(self) -> None:
        """Stop the threads, write the current minute's part and close the database."""
        self._stop.set()
        for t in self._threads:
            t.join(10.0)
        try:
            self.state.listeners.remove(self.on_commit)
        except ValueError:
            pass
        try:
            self.recorder.flush()
        except Exception as e:  # noqa: BLE001
            log.error("usage: could not write the last minute: %s", e)
        self.db.close()
