"""What gpuctl's key ordering takes from Textual beyond its public API, pinned: when an upgrade
changes it, this fails with a message naming gpuctl/app.py (GpuctlApp.call_later), instead of keys
quietly acting out of order."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Input

from gpuctl.app import GpuctlApp

FOCUS_QUALNAME = "Widget.focus.<locals>.set_focus"


class _Recorder(App):
    def __init__(self) -> None:
        super().__init__()
        self.deferred: list[str] = []

    def compose(self) -> ComposeResult:
        yield Input(id="a")
        yield Input(id="b")

    def call_later(self, callback, *args, **kwargs) -> bool:  # noqa: ANN001
        self.deferred.append(getattr(callback, "__qualname__", repr(callback)))
        return super().call_later(callback, *args, **kwargs)


async def test_widget_focus_defers_through_call_later_with_the_qualname_gpuctl_matches():
    app = _Recorder()
    async with app.run_test() as pilot:
        await pilot.pause()
        app.deferred.clear()
        app.query_one("#b", Input).focus()
        assert FOCUS_QUALNAME in app.deferred, (
            "Textual's Widget.focus no longer defers its move as app.call_later(set_focus): "
            "GpuctlApp.call_later (gpuctl/app.py) matches that qualname to focus at once under "
            f"_immediate_focus; deferred callbacks seen: {app.deferred}")
        await pilot.pause()
        assert app.focused is app.query_one("#b", Input)


async def test_gpuctl_focuses_at_once_under_immediate_focus():
    from gpuctl.fleet.simulated import SimulatedFleetSource
    from tests.support.console import make_app

    app: GpuctlApp = make_app(SimulatedFleetSource(nodes=1, gpus_per_node=1, frozen=True, history_warmup_samples=1))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.action_filter()  # `/`: the filter Input must hold the focus before the next key is read
        assert isinstance(app.focused, Input), app.focused
