"""The console in a real terminal: tmux commands, the visible screen, waiting for a screen."""

from __future__ import annotations

import subprocess
import time


def tmux(*args: str) -> str:
    """Run `tmux ARGS` (raises CalledProcessError) and return its stdout."""
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def capture(session: str) -> str:
    """The visible text of `session`'s pane."""
    return tmux("capture-pane", "-p", "-t", session)


def wait_for(session: str, predicate, timeout_s: float = 40.0) -> str:
    """The screen once `predicate(screen)` holds; AssertionError with the last screen after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = capture(session)
        if predicate(screen):
            return screen
        time.sleep(0.3)
    raise AssertionError(f"screen never matched; last screen:\n{screen}")
