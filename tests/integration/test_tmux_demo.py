"""`gpuctl demo` in a real terminal: tmux at 80x24, keys sent with send-keys, screen read with capture-pane."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from tmux import tmux, wait_for

pytestmark = [pytest.mark.tmux,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")]

ROOT = Path(__file__).resolve().parents[2]




def _demo_daemons() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "gpuctl.daemon serve --backend simulated"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "gpuctl-demo-" in line]


@pytest.fixture
def tmux_session():
    name = f"gpuctl-test-{uuid.uuid4().hex[:8]}"
    env_cmd = (f"cd {ROOT} && PYTHONPATH={ROOT} TERM=xterm-256color "
               f"{sys.executable} -m gpuctl.cli demo --seed 3")
    tmux("new-session", "-d", "-s", name, "-x", "80", "-y", "24", env_cmd)
    try:
        yield name
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def test_demo_console_at_80x24_shows_fleet_and_quits_cleanly(tmux_session):
    before = set(_demo_daemons())
    screen = wait_for(tmux_session, lambda s: "sim-01" in s and "%" in s)
    lines = screen.splitlines()
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert "Traceback" not in screen
    assert "q" in lines[-1].lower()  # footer shows keys
    # live: the screen changes by itself within a few seconds (telemetry refresh)
    wait_for(tmux_session, lambda s: s != screen, timeout_s=10)
    # the `/` filter narrows to one node
    # keys at a typist's pace: Textual moves focus to the filter on its next idle, like a human sees it
    tmux("send-keys", "-t", tmux_session, "/")
    time.sleep(0.5)
    tmux("send-keys", "-t", tmux_session, "-l", "sim-02")
    time.sleep(0.5)
    tmux("send-keys", "-t", tmux_session, "Enter")
    filtered = wait_for(tmux_session, lambda s: "sim-02" in s and "sim-01" not in s)
    assert "sim-03" not in filtered and "sim-04" not in filtered
    tmux("send-keys", "-t", tmux_session, "Escape")
    time.sleep(0.5)
    tmux("send-keys", "-t", tmux_session, "q")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (set(_demo_daemons()) - before):
        time.sleep(0.2)
    assert not (set(_demo_daemons()) - before), "demo daemons still running after q"


def test_filter_typed_in_one_burst_keeps_every_key(tmux_session):
    """`/sim-03` written at once (a fast typist, a paste): every key lands in order in the filter."""
    wait_for(tmux_session, lambda s: "sim-01" in s and "%" in s)
    tmux("send-keys", "-t", tmux_session, "-l", "/sim-03")
    screen = wait_for(tmux_session, lambda s: "sim-03" in s and "sim-01" not in s, timeout_s=10)
    assert "sim-02" not in screen and "sim-04" not in screen
    tmux("send-keys", "-t", tmux_session, "Escape")
    time.sleep(0.5)
    tmux("send-keys", "-t", tmux_session, "q")
