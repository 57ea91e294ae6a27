"""Terminal sizes (the too-small notice) and app construction."""

from __future__ import annotations

import pytest

from gpuctl.app import build_app
from tests.support.console import SIZE, make_app, poll, settle
from gpuctl.fleet.simulated import SimulatedFleetSource

from gpuctl.screens.too_small import TooSmallScreen
from gpuctl.themes import REPO_THEMES_DIR


# -- sizes (case tui-01) ------------------------------------------------------------------------


@pytest.mark.parametrize("screen_name", ["fleet", "node"])
async def test_every_size_renders_without_traceback(screen_name):
    src = SimulatedFleetSource(unreachable=True)
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        if screen_name == "node":
            app.open_node("node-01")
            await settle(app, pilot)
        base = type(app.screen)
        for w, h in [(149, 24), (80, 24), (40, 12), (1, 1), (59, 40), (120, 14), (60, 15)]:
            await pilot.resize_terminal(w, h)
            await pilot.pause()
            app.export_screenshot()  # renders the whole screen; raises on a rendering error
            small = w < 60 or h < 15
            assert isinstance(app.screen, TooSmallScreen) is small, (w, h)
            if small:
                assert f"terminal too small: {w}x{h}" in str(app.screen.query_one("#too-small-text").render())
            else:
                assert type(app.screen) is base
            if small:  # keys that would push a screen over the notice do nothing
                await pilot.press("colon")
                await pilot.press("question_mark")
                await pilot.pause()
                assert isinstance(app.screen, TooSmallScreen)
        await poll(app, pilot)
        assert app.return_code is None


# -- app construction ---------------------------------------------------------------------------


def test_unknown_theme_lists_known(source):
    with pytest.raises(ValueError) as err:
        build_app(source, theme="no-such-theme", theme_dirs=[REPO_THEMES_DIR])
    msg = str(err.value)
    assert msg.startswith("unknown theme 'no-such-theme'; known themes: gpuctl-dark, gpuctl-light, high-contrast")
    assert "textual-dark" in msg


def test_bad_refresh_interval(source):
    with pytest.raises(ValueError, match="refresh_s must be > 0 seconds, got 0"):
        build_app(source, refresh_s=0)
