"""A column of the department board: one department's totals and its slice cards; a drop target.

The department's name is the column's border title; the two lines below it are its totals
(gpuctl.widgets.board_model.ColumnTotals.text). The column carries the CSS class of its color
("dept-0" .. "dept-7" in fleet-config order, or "dept-unassigned"), so its border and title use
the theme's department variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Static

from gpuctl.themes import DEPARTMENT_COLORS
from gpuctl.widgets.board_model import ColumnTotals
from gpuctl.widgets.drag import DropTarget


def color_class(department: str, index: int, color: str | None = None) -> str:
    """The CSS class giving a column its color: a configured "$dept-N" / "dept-N" color wins, then
    "dept-<index mod 8>"; "unassigned" (index < 0) is "dept-unassigned"."""
    if color:
        name = color.removeprefix("$")
        if name.startswith("dept-") and (name[5:].isdigit() or name == "dept-unassigned"):
            return name
    if index < 0:
        return "dept-unassigned"
    return f"dept-{index % DEPARTMENT_COLORS}"


class DepartmentColumn(DropTarget, Vertical):
    """The column of `department`. Cards live in `.body` in board order; the board screen adds,
    moves and removes them (see BoardScreen.show_snapshot)."""

    def __init__(self, department: str, css_color: str):
        super().__init__(classes=css_color)
        self.department = department
        self.border_title = department
        self.body = VerticalScroll(classes="column-body")
        self.body.can_focus = False
        self._totals_text: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("", classes="column-totals", markup=False)
        yield self.body

    def set_totals(self, totals: ColumnTotals) -> None:
        """Show `totals` under the title (re-renders only on a change)."""
        text = totals.text()
        if text == self._totals_text:
            return
        self._totals_text = text
        self.border_subtitle = f"{totals.slices} slice{'s' if totals.slices != 1 else ''}"
        try:
            self.query_one(".column-totals", Static).update(text)
        except Exception:  # noqa: BLE001 - not composed yet: on_mount shows it
            pass

    class Scrolled(Message):
        """The column's cards scrolled (the board repaints cards that came into view)."""

    def on_mount(self) -> None:
        if self._totals_text is not None:
            self.query_one(".column-totals", Static).update(self._totals_text)
        self.watch(self.body, "scroll_y", self._scrolled, init=False)

    def _scrolled(self, _value: object = None) -> None:
        self.post_message(self.Scrolled())

    def drop_accepts(self, payload: Any) -> bool:
        """A drag of slices (a sequence of SliceView) is accepted when one of them belongs to
        another department."""
        views: Sequence[Any] = getattr(payload, "views", ())
        return any(getattr(v, "department", None) != self.department for v in views)
