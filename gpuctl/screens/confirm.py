"""Confirmation dialogs that cannot be confirmed unseen, and the plain yes/no one.

:class:`ArmedModal`: a GpuctlModal whose confirming keys count only once the terminal has drawn a
whole frame of the dialog and CONFIRM_ARM_S has passed since (:attr:`ArmedModal.armed`): a key
typed while the dialog was not yet on the terminal (a blind Enter) is dropped and counted, never
acted on. "Drawn" is the terminal's word, not a guess: the app reports each frame it writes
(:meth:`ArmedModal.frame_written`) and, for the dialog's first whole frame, asks the terminal to
answer once it has drawn it (:meth:`ArmedModal.frame_acknowledged`; gpuctl.console.frame_ack).
Before, the clock started from a call_after_refresh callback: it ran on the screen's next idle
whether or not a frame was written (also inside a batch, when Textual drops the frame), up to
~0.25 s after the frame on a loaded machine, and long before a slow terminal showed the frame.
The board's move dialog and :class:`ConfirmScreen` (lease release and renew) are ArmedModals.

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

#: A dialog is confirmable only this long (seconds) after its first whole frame reached the terminal.
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
        #: time.monotonic() (s) when the terminal had drawn the first whole frame of the dialog;
        #: None while it had not.
        self.painted_at: float | None = None
        #: Frames of this screen the app wrote to the terminal (whole or changed lines only).
        self.frames_written = 0
        self._ack_pending = False
        #: Confirming keys dropped because the dialog was not yet seen (tests read it).
        self.unseen_keys_dropped = 0

    def frame_written(self, full: bool) -> bool:
        """The app wrote a frame of this screen (the top one) to the terminal; `full`: the whole
        screen (Textual's LayoutUpdate), else changed lines only. True: the app is to report when
        the terminal has drawn it (frame_acknowledged): the first whole frame written once the
        dialog was laid out."""
        self.frames_written += 1
        if self.painted_at is None and not self._ack_pending and full and self._dialog_laid_out():
            self._ack_pending = True
            return True
        return False

    def frame_acknowledged(self) -> None:
        """The terminal has drawn the frame frame_written asked about: the CONFIRM_ARM_S clock
        starts now."""
        self._ack_pending = False
        if self.painted_at is None:
            self.painted_at = time.monotonic()

    def _dialog_laid_out(self) -> bool:
        """Do the dialog's widgets have their places (so a full frame shows them)?"""
        return any(child.region for child in self.children)

    @property
    def armed(self) -> bool:
        """Has the terminal shown a whole frame of the dialog for CONFIRM_ARM_S (may it be
        confirmed)?"""
        return self.painted_at is not None and time.monotonic() - self.painted_at >= CONFIRM_ARM_S

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

    def on_mount(self) -> None:
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
