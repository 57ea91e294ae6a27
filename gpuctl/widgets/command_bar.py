"""The k9s-style `:` command bar: a one-line prompt docked at the bottom of a gpuctl screen.

A widget, not a screen: the screen it opens on stays visible and keeps its layout (the bar takes
the footer's line while it is open; the footer comes back when it closes). GpuctlScreen mounts one per screen and opens it with
:meth:`CommandBar.open`, which moves the focus to the bar's Input *synchronously*
(Screen.set_focus, not Widget.focus, which defers the move to the app's next idle): keys typed
right after `:` (a fast typist, a paste, tmux send-keys) are routed by the app to the Input and
never reach the app's or the screen's key bindings.

Enter posts :class:`CommandBar.Submitted` with the typed command (without a leading ":"),
Escape posts :class:`CommandBar.Cancelled`; either way the bar closes and the focus goes back to
the widget that had it. The app parses and runs the command (GpuctlApp.run_command).
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widget import Widget
from textual.widgets import Footer, Input, Label

#: The commands the bar offers as completions (the app's run_command is the authority).
COMMANDS = ("nodes", "depts", "leases", "schedule", "audit", "report", "history", "node ", "theme ", "help",
            "quit", "q")


class CommandBar(Horizontal):
    """`:` prompt and an Input; hidden until :meth:`open`."""

    DEFAULT_CSS = """
    CommandBar { height: 1; dock: bottom; background: $panel; display: none; }
    CommandBar.-open { display: block; }
    CommandBar > #command-prompt { width: 2; padding: 0 0 0 1; color: $accent; text-style: bold; }
    CommandBar > Input { border: none; height: 1; padding: 0; width: 1fr; background: $panel; }
    CommandBar > Input:focus { border: none; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]

    class Submitted(Message):
        """Enter in the bar: `text` is the command, stripped, without a leading ":" ("" when
        nothing was typed)."""

        def __init__(self, bar: CommandBar, text: str):
            super().__init__()
            self.bar = bar
            self.text = text

    class Cancelled(Message):
        """Escape in the bar: nothing is run."""

        def __init__(self, bar: CommandBar):
            super().__init__()
            self.bar = bar

    def __init__(self, *, id: str | None = "command-bar"):
        super().__init__(id=id)
        self._return_focus: Widget | None = None

    def compose(self) -> ComposeResult:
        yield Label(":", id="command-prompt")
        inp = Input(placeholder="nodes | depts | leases | node NAME | theme NAME | q", id="command-input")
        inp.cursor_blink = False
        yield inp

    @property
    def input(self) -> Input:
        """The bar's Input (NoMatches until the bar is composed)."""
        return self.query_one("#command-input", Input)

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def open(self, suggestions: list[str] | None = None) -> Input:
        """Show the bar empty, with COMMANDS and `suggestions` ("node NAME", ...) as completions,
        and give its Input the focus now (keys already queued after `:` land in it). Returns
        the Input. Raises NoMatches when the bar is not composed yet."""
        inp = self.input
        screen = self.screen
        if not self.is_open:
            focused = screen.focused
            self._return_focus = focused if focused is not inp else None
        inp.suggester = SuggestFromList(list(COMMANDS) + list(suggestions or []), case_sensitive=False)
        inp.value = ""
        self._set_open(True)
        screen.set_focus(inp)  # synchronous: the app routes the very next key to the Input
        return inp

    def close(self) -> None:
        """Hide the bar and give the focus back to the widget that had it before :meth:`open`."""
        if not self.is_open:
            return
        back, self._return_focus = self._return_focus, None
        screen = self.screen
        if back is not None and back.is_attached and back.screen is screen:
            screen.set_focus(back)
        else:
            screen.set_focus(None)
        self._set_open(False)

    def _set_open(self, open_: bool) -> None:
        """Show the bar in place of the screen's footer (both are docked at the bottom)."""
        self.set_class(open_, "-open")
        for footer in self.screen.query(Footer):
            footer.display = not open_

    def take(self) -> str:
        """Close the bar and return what was typed (stripped, without a leading ":")."""
        text = self.input.value.strip().removeprefix(":").strip()
        self.close()
        return text

    def submit(self) -> None:
        """Close the bar and post Submitted with what was typed (Enter)."""
        if self.is_open:
            self.post_message(self.Submitted(self, self.take()))

    @on(Input.Submitted, "#command-input")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_descendant_blur(self, _event: object) -> None:
        """The focus went elsewhere (a click outside the bar): hide the bar, run nothing."""
        if self.is_open and self.screen.focused is not self.input:
            self._return_focus = None
            self._set_open(False)

    def action_cancel(self) -> None:
        self.close()
        self.post_message(self.Cancelled(self))
