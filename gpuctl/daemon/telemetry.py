"""The telemetry sampler: a background thread that samples the backend into a history ring.

Requests never call the backend (an NVML sample of one GPU costs ~15 ms): they read
:meth:`Sampler.latest` and :meth:`Sampler.since`, which only take a lock and copy references.

Each sampling round gets the next sequence number (the cursor); every GpuSample of that round is
stored with it. ``since(C)`` returns the samples of rounds with sequence > C and the newest
sequence, which the client passes back next time. Sequence numbers restart at 1 with the process;
a cursor beyond the newest one (a client that talked to an earlier daemon) is answered with the
whole ring.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque

from gpuctl.backends.base import GpuBackend
from gpuctl.model import GpuSample

log = logging.getLogger("gpuctld.telemetry")

#: Extra rounds kept in the ring beyond history_s / interval_s.
RING_SLACK = 16


class Sampler:
    """Samples `backend` every `interval_s` seconds and keeps at least `history_s` seconds of rounds.

    interval_s > 0, history_s > 0 (ValueError otherwise). Thread-safe. A backend exception in one
    round is logged (once per distinct message) and counted; sampling goes on. ``last_error``: the
    message of the last failed round, cleared by the next good one.
    """

    def __init__(self, backend: GpuBackend, interval_s: float = 1.0, history_s: float = 600.0):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        if not history_s > 0:
            raise ValueError(f"history_s must be > 0 seconds, got {history_s!r}")
        self.backend = backend
        self.interval_s = float(interval_s)
        self.history_s = float(history_s)
        self.ring: deque[tuple[int, list[GpuSample]]] = deque(
            maxlen=math.ceil(history_s / interval_s) + RING_SLACK
        )
        self.sequence = 0
        self.failures = 0
        self.last_error: str | None = None
        self._latest: dict[str, GpuSample] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged: set[str] = set()

    def sample_once(self) -> bool:
        """Take one round now (the thread calls this; so may start-up). True when it succeeded."""
        try:
            samples = self.backend.sample()
        except Exception as e:  # noqa: BLE001 - one bad round must not end telemetry
            message = f"{type(e).__name__}: {e}"
            if message not in self._logged:
                self._logged.add(message)
                log.error("telemetry: backend %s failed to sample (%s); will keep trying "
                          "(this message is logged once)", self.backend.name, message)
            with self._lock:
                self.failures += 1
                self.last_error = message
            return False
        with self._lock:
            self.sequence += 1
            self.ring.append((self.sequence, samples))
            for s in samples:
                self._latest[s.uuid] = s
            self.last_error = None
        return True

    def start(self) -> None:
        """Start the sampling thread (first round after one interval; call sample_once for one now)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuctld-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait up to `timeout_s` seconds for it (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.sample_once()
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:  # fell behind (slow backend): skip missed rounds, don't burst
                next_at = now + self.interval_s

    def latest(self) -> dict[str, GpuSample]:
        """The newest sample of each GPU, by UUID (empty before the first round)."""
        with self._lock:
            return dict(self._latest)

    def since(self, cursor: int, uuid: str | None = None) -> tuple[int, list[GpuSample]]:
        """Samples of rounds with sequence > `cursor` (all of one GPU when `uuid` is given), oldest
        first, and the newest sequence number. A cursor beyond the newest gets the whole ring."""
        with self._lock:
            if cursor > self.sequence:
                cursor = 0
            out = [
                s
                for seq, samples in self.ring
                if seq > cursor
                for s in samples
                if uuid is None or s.uuid == uuid
            ]
            return self.sequence, out
