"""Keys typed right after `:` in a real terminal (tmux)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.console import SIZE, make_app, post_keys, settle, stack_names


# -- tmux: keys typed right after `:` in a real terminal ------------------------------------------


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _wait_screen(session: str, predicate, timeout_s: float = 40.0) -> str:
    import time

    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        try:
            screen = _tmux("capture-pane", "-p", "-t", session)
        except subprocess.CalledProcessError:
            screen = ""  # the session ended: its program exited (e.g. after `q`)
        if predicate(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"screen never matched; last screen:\n{screen}")


@pytest.mark.tmux
@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="tmux not installed")
def test_tmux_colon_and_command_in_one_send_keys_opens_the_node():
    import time
    import uuid
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    name = f"gpuctl-bar-{uuid.uuid4().hex[:8]}"
    cmd = f"cd {root} && PYTHONPATH={root} TERM=xterm-256color {sys.executable} -m gpuctl.cli demo --seed 3"
    _tmux("new-session", "-d", "-s", name, "-x", "80", "-y", "24", cmd)
    try:
        _wait_screen(name, lambda s: "sim-01" in s and "%" in s)
        _tmux("send-keys", "-t", name, ":node sim-02", "Enter")  # one write: no pause after ':'
        screen = _wait_screen(name, lambda s: "node sim-02" in s.splitlines()[0])
        assert "leases" not in screen.splitlines()[0] and "Traceback" not in screen
        _tmux("send-keys", "-t", name, ":theme gpuctl-light", "Enter")
        time.sleep(1.0)
        screen = _tmux("capture-pane", "-p", "-t", name)
        assert "node sim-02" in screen.splitlines()[0]  # no `l` / `d` reached the app's bindings
        t0 = time.monotonic()
        _tmux("send-keys", "-t", name, "q")
        _wait_screen(name, lambda s: "gpuctl ▸" not in s, timeout_s=15)
        assert time.monotonic() - t0 < 8.0  # generous: CI machines are shared
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


async def test_keys_typed_right_after_slash_go_into_the_filter(source, monkeypatch):
    from textual.widgets import Input

    typed: list[str] = []
    real = Input._on_key

    async def spy(self, event):
        if self.id == "filter":
            typed.append(event.key)
        return await real(self, event)

    monkeypatch.setattr(Input, "_on_key", spy)
    app = make_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        post_keys(app, "slash", *"node", "minus", "0", "2")  # its `d` must not open the board
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen"]
        assert typed == ["n", "o", "d", "e", "minus", "0", "2"]  # every key reached the filter
        assert app.focused is app.screen.query_one("#filter")
        post_keys(app, "escape")
        await settle(app, pilot)
        post_keys(app, "l")  # keys typed outside an Input act again
        await settle(app, pilot)
        assert stack_names(app) == ["FleetScreen", "LeasesScreen"]
        assert not app.check_action("filter", ())  # `/` on a screen without a filter: not taken
