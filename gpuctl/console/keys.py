"""Keys in the order typed (a mixin of gpuctl.app.GpuctlApp): the `:` bar and the `/` filter take
the keys typed right after `:` / `/`, and the keys typed after Enter act after the command ran.

The app's keys are priority bindings (run as the key is read). When the work of a key finishes on
another widget's queue (the bar's Input reading the characters before Enter, a just-pushed
screen's bar not composed yet) the keys read meanwhile are held (`_hold_keys`) and handled in
order once it is done (`_release_keys`), after HOLD_MAX_S at the latest. Focus moves at once under
`_immediate_focus` (Textual's Widget.focus defers it; tests/console/test_textual_pins.py pins how).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from textual import events
from textual.app import App
from textual.widgets import Input

from gpuctl.screens.base import GpuctlScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.widgets.command_bar import CommandBar

#: While a just-pushed screen's `:` bar is not composed yet, retry opening it every BAR_RETRY_S
#: seconds, at most BAR_RETRIES times, holding the keys typed meanwhile.
BAR_RETRY_S = 0.01
BAR_RETRIES = 200
#: Longest time keys are held back waiting for the work of an earlier key (App._hold_keys).
HOLD_MAX_S = 3.0


class KeyOrderMixin:
    """Key holding, the `:` bar's keys and `/` (see the module doc). Uses the state GpuctlApp.__init__
    sets (_holding, _hold_serial, _held_keys, _bar_pending, _focus_now) and run_command."""

    def action_command_bar(self) -> None:
        """`:`: open the command bar of the top gpuctl screen (closing help first), its Input
        focused at once so the keys typed right after `:` go into it."""
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        screen = self.screen
        if isinstance(screen, GpuctlScreen):
            names = [f"node {n.name}" for n in self.snapshot.nodes] if self.snapshot else []
            if not screen.open_command_bar(names):
                # The screen was pushed a moment ago and its bar is not composed yet: hold the
                # keys typed from now on and hand them to the bar once it opens.
                self._bar_pending = (screen, names, 0)
                self._hold_keys()
                self.set_timer(BAR_RETRY_S, self._open_pending_bar)

    def _hold_keys(self) -> None:
        """Keep the keys read from now on (in order) until _release_keys: the work of the key
        before them finishes on another widget's queue first. Released after HOLD_MAX_S at the
        latest (a widget that went away never finishes)."""
        self._holding = True
        self._hold_serial += 1
        serial = self._hold_serial

        async def expire() -> None:
            if self._holding and self._hold_serial == serial:
                await self._release_keys()

        self.set_timer(HOLD_MAX_S, expire)

    async def _release_keys(self) -> None:
        """Handle the held keys in the order they came (stopping if one of them holds again)."""
        self._holding = False
        while self._held_keys and not self._holding:
            await App.on_event(self, self._held_keys.popleft())

    async def on_event(self, event: events.Event) -> None:
        if self._holding and isinstance(event, events.Key):
            self._held_keys.append(event)
            return
        await super().on_event(event)

    async def _open_pending_bar(self) -> None:
        """Retry opening the bar held by action_command_bar; once it is open (or the screen is
        gone, or BAR_RETRIES ran out) the held keys are handled in the order they came."""
        if self._bar_pending is None:
            return
        screen, names, tries = self._bar_pending
        if screen is self.screen and not screen.open_command_bar(names) and tries < BAR_RETRIES:
            self._bar_pending = (screen, names, tries + 1)
            self.set_timer(BAR_RETRY_S, self._open_pending_bar)
            return
        self._bar_pending = None
        await self._release_keys()

    def action_filter(self) -> None:
        """`/`: the top screen's filter (its action_filter), with the focus moved at once."""
        action = getattr(self.screen, "action_filter", None)
        if callable(action):
            with self._immediate_focus():
                action()

    @contextmanager
    def _immediate_focus(self) -> Iterator[None]:
        """Inside: Widget.focus() moves the focus now instead of on the app's next idle."""
        self._focus_now = True
        try:
            yield
        finally:
            self._focus_now = False

    def call_later(self, callback, *args, **kwargs) -> bool:  # noqa: ANN001
        # Widget.focus() defers its move with app.call_later(set_focus, widget); under
        # _immediate_focus it runs now (any other callback, or another Textual, is deferred).
        if self._focus_now and getattr(callback, "__qualname__", "") == "Widget.focus.<locals>.set_focus":
            callback(*args, **kwargs)
            return True
        return super().call_later(callback, *args, **kwargs)

    def _focused_command_bar(self) -> CommandBar | None:
        focused = self.focused
        bar = focused.parent if isinstance(focused, Input) else None
        return bar if isinstance(bar, CommandBar) and bar.is_open else None

    def action_command_bar_key(self, key: str) -> None:
        """Enter ("submit": the command runs now) or Escape ("cancel") in the `:` bar, handled
        as the key is read, so that the keys typed after it act after it."""
        bar = self._focused_command_bar()
        if bar is None:
            return
        if key == "submit":
            # The characters typed before Enter may still wait on the Input's queue: read the
            # command behind them, and hold the keys typed after Enter until it has run.
            self._hold_keys()
            bar.input.call_later(self._submit_bar, bar)
        else:
            bar.action_cancel()

    def _submit_bar(self, bar: CommandBar) -> None:
        """(On the Input's queue, after the characters typed before Enter.)"""
        text = bar.take()
        self.call_later(self._run_submitted, text)

    async def _run_submitted(self, text: str) -> None:
        try:
            if text:
                self.run_command(text)
        finally:
            await self._release_keys()

    def on_command_bar_submitted(self, message: CommandBar.Submitted) -> None:
        if message.text:
            self.run_command(message.text)
