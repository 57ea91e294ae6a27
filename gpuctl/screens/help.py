"""The help screen (`?`): every key of the app and of the screen below, and the `:` commands."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

#: The `:` commands and what they do (GpuctlApp.run_command is the authority).
COMMAND_HELP = (
    (":nodes", "fleet screen (all GPUs)"),
    (":depts", "department board (drag slices between departments)"),
    (":leases", "all leases of the fleet"),
    (":node NAME", "detail of node NAME"),
    (":theme NAME", "switch theme"),
    (":help", "this screen"),
    (":q  :quit", "quit"),
)


def _key_rows(bindings) -> list[tuple[str, str]]:
    rows = []
    for b in bindings:
        if isinstance(b, tuple):
            b = Binding(*b)
        if not b.description:
            continue
        key = b.key_display or b.key
        rows.append((key, b.description))
    return rows


class HelpScreen(ModalScreen[None]):
    """Keys and commands; Escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 72; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def __init__(self, below: Screen | None = None):
        super().__init__(id="help")
        self._below = below

    def help_rows(self) -> list[tuple[str, str]]:
        """(key or command, what it does): the screen below's keys, the app's keys, then the `:`
        commands; a key bound twice is listed once (the screen's meaning wins)."""
        rows: list[tuple[str, str]] = []
        seen: set[str] = set()
        for bindings in (getattr(self._below, "BINDINGS", []), getattr(self.app, "BINDINGS", [])):
            for key, desc in _key_rows(bindings):
                if key not in seen:
                    seen.add(key)
                    rows.append((key, desc))
        rows.append(("enter", "open the node under the cursor"))
        rows.extend(COMMAND_HELP)
        return rows

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=True, header_style="bold", expand=True, padding=(0, 2, 0, 0))
        table.add_column("key / command", no_wrap=True)
        table.add_column("does")
        for key, desc in self.help_rows():
            table.add_row(key, desc)
        with VerticalScroll():
            yield Static("gpuctl keys", classes="help-title")
            yield Static(table)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
