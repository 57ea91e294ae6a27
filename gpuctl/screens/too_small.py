"""The "terminal too small" notice shown instead of the screens below the minimum size."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.widgets import Static

#: The smallest terminal (columns, rows) the console draws its screens in.
MIN_SIZE = (60, 15)


def too_small_message(width: int, height: int) -> str:
    """"terminal too small: 40x12 (gpuctl needs at least 60x15)"."""
    return f"terminal too small: {width}x{height} (gpuctl needs at least {MIN_SIZE[0]}x{MIN_SIZE[1]})"


class TooSmallScreen(ModalScreen[None]):
    """Covers everything with one line naming the current and the needed size; the app pops it
    when the terminal is large enough again. size: the terminal size (columns, rows) now."""

    DEFAULT_CSS = """
    TooSmallScreen { align: center middle; background: $background; }
    TooSmallScreen > Static { width: 100%; height: auto; text-align: center; color: $warning; }
    """

    def __init__(self, size: tuple[int, int]):
        super().__init__(id="too-small")
        self._initial = size

    def compose(self) -> ComposeResult:
        yield Static(too_small_message(*self._initial), id="too-small-text")

    def on_resize(self, event: events.Resize) -> None:
        self.query_one(Static).update(too_small_message(event.size.width, event.size.height))
