"""Polling helpers for tests that watch processes and daemons change state."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Call `pred` every `interval_s` until it is true or `timeout_s` has passed; returns whether it
    became true (one last call after the deadline decides)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval_s)
    return bool(pred())


def gone(pid: int) -> bool:
    """True when `pid` has ended (no such process, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True
