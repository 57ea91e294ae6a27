"""Confirmation dialogs that cannot be confirmed unseen, and the plain yes/no one.

:class:`ArmedModal`: a GpuctlModal whose confirming keys count only once the dialog has been drawn
and CONFIRM_ARM_S has passed (:attr:`ArmedModal.armed`): a key typed while the dialog was still
being built (a blind Enter) is dropped and counted, never acted on. The board's move dialog and
:class:`ConfirmScreen` (lease release and renew) are ArmedModals.

:class:`ConfirmScreen` dismisses with True (y, Enter on its first button) or False (n, Escape).
"""

from __future__ import annotations

import time

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Static

from gpuctl.screens.base import GpuctlModal

#: A dialog is confirmable only this long (seconds) after it was first drawn.
CONFIRM_ARM_S = 0.3

CONFIRM_CSS = """
ConfirmScreen { align: center middle; }
ConfirmScreen > #dialog {
    width: 72; max-width: 100%; height: auto; max-height: 100%;
    padding: 1 2; background: $surface; border: round $accent;
    border-title-color: $accent; border-title-style: bold;
}
ConfirmScreen #dialog > .dialog-text { height: auto; margin: 0 0 1 0; }
ConfirmScreen #dialog > #dialog-buttons { height: auto; align-horizontal: right; }
ConfirmScreen #dialog Button { margin: 0 0 0 1; min-width: 10; }
"""


class ArmedModal(GpuctlModal):
    """A modal whose confirmations wait until it has been seen (see the module doc). Subclasses
    check :attr:`armed` before acting on a confirming key and call :meth:`dropped_unseen`."""

    def __init__(self, name: str | None = None, id: str | None = None, classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self._drawn_at: float | None = None
        #: Confirming keys dropped because the dialog was not yet seen (tests read it).
        self.unseen_keys_dropped = 0

    def on_mount(self) -> None:
        self.call_after_refresh(self._drawn)

    def _drawn(self) -> None:
        if self._drawn_at is None:
            self._drawn_at = time.monotonic()

    @property
    def armed(self) -> bool:
        """Has the dialog been on the screen for CONFIRM_ARM_S (may it be confirmed)?"""
        return self._drawn_at is not None and time.monotonic() - self._drawn_at >= CONFIRM_ARM_S

    def dropped_unseen(self) -> None:
        self.unseen_keys_dropped += 1


class ConfirmScreen(ArmedModal):
    """`text` with "<yes_label> (y)" / "Cancel (n)"; dismisses True or False."""

    DEFAULT_CSS = CONFIRM_CSS
    BINDINGS = [
        Binding("escape,n", "choose(False)", "Cancel"),
        Binding("y", "choose(True)", "Confirm", show=False),
    ]

    def __init__(self, title: str, text: str, yes_label: str = "Yes"):
        super().__init__()
        self.title_text = title
        self.text = text
        self.yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = self.title_text
            yield Static(self.text, classes="dialog-text", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button(f"{self.yes_label} (y)", id="yes", variant="primary")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:  # ArmedModal.on_mount runs too (Textual calls each class's)
        self.query_one("#yes", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_choose(event.button.id == "yes")

    def action_choose(self, yes: bool) -> None:
        if not yes:
            self.dismiss(False)
        elif not self.armed:
            self.dropped_unseen()
        else:
            self.dismiss(True)
