"""The k9s-style `:` command bar: a one-line Input docked at the bottom over the current screen.

Pushed as a modal screen so it works over any gpuctl screen (the board too); it returns the
typed command (without the leading ":") or None when Escape was pressed. The app parses and runs
it (GpuctlApp.run_command).
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label

#: The commands the bar offers as completions (the app's run_command is the authority).
COMMANDS = ("nodes", "depts", "leases", "node ", "theme ", "help", "quit", "q")


class CommandBar(ModalScreen[str | None]):
    """`:` prompt; Enter returns the text, Escape returns None."""

    DEFAULT_CSS = """
    CommandBar { background: transparent; align: left bottom; }
    CommandBar > #command-row { height: 1; dock: bottom; background: $panel; }
    CommandBar #command-prompt { width: 2; padding: 0 0 0 1; color: $accent; text-style: bold; }
    CommandBar Input { border: none; height: 1; padding: 0; width: 1fr; background: $panel; }
    CommandBar Input:focus { border: none; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, suggestions: list[str] | None = None):
        super().__init__()
        self._suggestions = list(COMMANDS) + list(suggestions or [])

    def compose(self) -> ComposeResult:
        with Horizontal(id="command-row"):
            yield Label(":", id="command-prompt")
            yield Input(
                placeholder="nodes | depts | leases | node NAME | theme NAME | q",
                suggester=SuggestFromList(self._suggestions, case_sensitive=False),
                id="command-input",
            )

    def on_mount(self) -> None:
        inp = self.query_one(Input)
        inp.cursor_blink = False
        inp.focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip().removeprefix(":").strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
