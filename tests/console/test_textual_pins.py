"""What gpuctl takes from Textual beyond its public API, pinned: when an upgrade changes it, this
fails with a message naming the gpuctl code that relies on it (gpuctl/app.py GpuctlApp.call_later:
key ordering; gpuctl/console/frame_ack.py: when a dialog's frame reached the terminal), instead of keys quietly acting out of order or a
confirmation arming unseen."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult
from textual.screen import ModalScreen
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


class _Frames(App):
    """Records what App._display is handed: (the screen, the update's type, inside a batch?)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[object, str, bool]] = []

    def compose(self) -> ComposeResult:
        yield Input(id="a")

    def _display(self, screen, renderable) -> None:  # noqa: ANN001
        if renderable is not None:
            self.frames.append((screen, type(renderable).__name__, bool(self._batch_count)))
        super()._display(screen, renderable)


async def test_frames_pass_through_app_display_and_those_of_a_batch_are_composed_inside_it():
    """gpuctl.console.frame_ack.FrameAckMixin._display reports each frame written to the terminal to the screen
    (ArmedModal.frame_written: the move confirmation asks the terminal about its first whole frame, a LayoutUpdate)
    and treats a frame handed over inside a batch as dropped (Textual writes nothing then)."""
    from textual._compositor import LayoutUpdate  # noqa: F401 - frame_ack's full-frame type

    app = _Frames()
    async with app.run_test(size=(40, 10)) as pilot:
        await pilot.pause()
        assert any(s is app.screen and kind == "LayoutUpdate" and not batch for s, kind, batch in app.frames), (
            "Textual no longer hands the top screen's frames to App._display as LayoutUpdate: "
            f"FrameAckMixin._display (gpuctl/console/frame_ack.py) cannot tell when a dialog was drawn; frames: {app.frames}")
        app.frames.clear()
        pushed = ModalScreen()
        async with app.screen.batch():  # a screen pushed inside a batch: its first frame is dropped
            app.push_screen(pushed)
            await asyncio.sleep(0.3)
        assert [(kind, batch) for s, kind, batch in app.frames if s is pushed][:1] == [("LayoutUpdate", True)], (
            "Textual no longer composes a frame of a screen pushed inside a batch (dropped by "
            f"App._display): FrameAckMixin._display's `dropped` rule needs a look; frames: {app.frames}")
