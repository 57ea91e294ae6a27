"""The board's modal dialogs: confirm a move (with drain / revoke for leased slices) and pick a
department.

:class:`MoveConfirmScreen` dismisses with the leased mode of gpuctl.fleet.reassign ("refuse" for a plain
move of idle slices, "drain" or "revoke" when a leased slice is among them) or None (cancel).
:class:`DepartmentPickerScreen` dismisses with a department name or None.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from gpuctl.screens.base import GpuctlModal
from gpuctl.screens.confirm import CONFIRM_ARM_S, ArmedModal

__all__ = ["CONFIRM_ARM_S", "DepartmentPickerScreen", "MoveConfirmScreen"]

DIALOG_CSS = """
MoveConfirmScreen, DepartmentPickerScreen { align: center middle; }
MoveConfirmScreen > #dialog, DepartmentPickerScreen > #dialog {
    width: 72; max-width: 100%; height: auto; max-height: 100%;
    padding: 1 2; background: $surface; border: round $accent;
    border-title-color: $accent; border-title-style: bold;
}
#dialog > .dialog-text { height: auto; margin: 0 0 1 0; }
#dialog > .dialog-lease { height: auto; margin: 0 0 1 0; color: $warning; }
#dialog > #dialog-buttons { height: auto; align-horizontal: right; }
#dialog Button { margin: 0 0 0 1; min-width: 10; }
#dialog OptionList { height: auto; max-height: 12; }
"""

# The board shows through, dimmed: app.tcss gives every ModalScreen `$background 60%`, and
# GpuctlModal renders that backdrop once (not on every repaint of the dialog).


class MoveConfirmScreen(ArmedModal):
    """"Move 2 slices (1.5 GPU) from research to training: ..." with Move / Cancel, or, when
    `leased_owners` is not empty, Drain / Revoke / Cancel and a line naming the leases' owners.

    Keys: y or Enter = Move (free slices only), d = Drain, r = Revoke, n or Escape = Cancel.
    Move, Drain and Revoke are refused (the key is dropped) until a whole frame of the dialog has
    been on the terminal for CONFIRM_ARM_S (:attr:`armed`); cancelling always works.
    """

    DEFAULT_CSS = DIALOG_CSS
    BINDINGS = [
        Binding("escape,n", "choose('cancel')", "Cancel"),
        Binding("y", "choose('refuse')", "Move", show=False),
        Binding("d", "choose('drain')", "Drain", show=False),
        Binding("r", "choose('revoke')", "Revoke", show=False),
    ]

    def __init__(self, summary: str, leased_owners: list[str] | None = None):
        super().__init__(classes="board-dialog")
        self.summary = summary
        self.leased_owners = list(leased_owners or [])

    @property
    def leased(self) -> bool:
        return bool(self.leased_owners)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = "Move slices"
            yield Static(self.summary, classes="dialog-text", markup=False)
            if self.leased:
                owners = ", ".join(self.leased_owners)
                yield Static(
                    f"Leased by {owners}. Drain: move each leased slice when its lease ends. "
                    f"Revoke: end the lease now (its owner sees an error), then move.",
                    classes="dialog-lease",
                    markup=False,
                )
            with Horizontal(id="dialog-buttons"):
                if self.leased:
                    yield Button("Drain (d)", id="drain", variant="primary")
                    yield Button("Revoke (r)", id="revoke", variant="error")
                else:
                    yield Button("Move (y)", id="refuse", variant="primary")
                yield Button("Cancel (n)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#dialog-buttons Button", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_choose(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        """Dismiss with `choice` ("refuse", "drain", "revoke"), or None for "cancel"; a choice
        that does not fit (Move with leased slices, Drain/Revoke without) is ignored."""
        if choice == "cancel":
            self.dismiss(None)
        elif not self.armed:
            self.dropped_unseen()  # typed before the dialog could be seen: never a move
        elif choice == "refuse" and not self.leased:
            self.dismiss("refuse")
        elif choice in ("drain", "revoke") and self.leased:
            self.dismiss(choice)


class DepartmentPickerScreen(GpuctlModal[str | None]):
    """A list of departments to move `what` ("2 slices (1.5 GPU)") to; Enter picks, Escape
    cancels."""

    DEFAULT_CSS = DIALOG_CSS
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, what: str, departments: list[str]):
        super().__init__(classes="board-dialog")
        self.what = what
        self.departments = list(departments)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = "Move to department"
            yield Static(f"Move {self.what} to:", classes="dialog-text", markup=False)
            yield OptionList(*[Option(name, id=name) for name in self.departments], markup=False)

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        if self.departments:
            options.highlighted = 0
        options.focus()

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
