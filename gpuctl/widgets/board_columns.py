"""A column of the department board: one department's totals and its slice cards; a drop target.

The department's name is the column's border title; the two lines below it are its totals
(gpuctl.widgets.board_model.ColumnTotals.text); under them the cards (a
gpuctl.widgets.board_cards.CardList, `column.body`).

Colors: a department whose configured color is a theme variable "$dept-N" / "dept-N" gets the CSS
class "dept-N"; one with another color (a hex code "#0072b2" or a color name, as the fleet config
allows) is drawn in that color (inline border and title color); the others get "dept-<position
mod 8>" in fleet-config order, and "unassigned" gets "dept-unassigned", so their border and title
use the theme's department variables (Okabe-Ito by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.app import ComposeResult
from textual.color import Color, ColorParseError
from textual.containers import Vertical
from textual.widgets import Static

from gpuctl.themes import DEPARTMENT_COLORS
from gpuctl.widgets.board_cards import CardList, CardMarks
from gpuctl.widgets.board_model import ColumnTotals
from gpuctl.widgets.drag import DropTarget


def color_class(department: str, index: int, color: str | None = None) -> str:
    """The CSS class giving a column its theme color: a configured "$dept-N" / "dept-N" color
    wins, then "dept-<index mod 8>"; "unassigned" (index < 0) is "dept-unassigned". (A configured
    color that is not a department variable is :func:`own_color`'s.)"""
    if color:
        name = color.removeprefix("$")
        if name.startswith("dept-") and (name[5:].isdigit() or name == "dept-unassigned"):
            return name
    if index < 0:
        return "dept-unassigned"
    return f"dept-{index % DEPARTMENT_COLORS}"


def own_color(color: str | None, variables: dict[str, str] | None = None) -> Color | None:
    """The color a department configured for itself, when it is not a department class (see
    color_class): a hex code ("#0072b2") or color name ("dodgerblue") parsed by Textual, or a theme
    variable ("$primary") looked up in `variables` (theme variable -> color). None when there is
    none, it is a "dept-N" class, or it cannot be understood (the default color is used then)."""
    if not color:
        return None
    name = color.removeprefix("$")
    if name.startswith("dept-") and (name[5:].isdigit() or name == "dept-unassigned"):
        return None
    if color.startswith("$"):
        value = (variables or {}).get(name)
        if value is None:
            return None
        color = value
    try:
        return Color.parse(color)
    except (ColorParseError, ValueError):
        return None


class DepartmentColumn(DropTarget, Vertical):
    """The column of `department`; `css_color` is its color class (color_class) and `color` its
    own color (own_color) when it has one, which then wins over the class. `marks`: the board's
    shared CardMarks. The board screen sets the cards (`self.body.set_cards`) and totals."""

    def __init__(self, department: str, css_color: str, marks: CardMarks | None = None, color: Color | None = None):
        super().__init__(classes=css_color)
        self.department = department
        self.color = color
        self.border_title = department
        self.body = CardList(department, marks, classes="column-body")
        self._totals_text: str | None = None
        self._subtitle: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("", classes="column-totals", markup=False)
        yield self.body

    def on_mount(self) -> None:
        if self._totals_text is not None:
            self.query_one(".column-totals", Static).update(self._totals_text)
        self._apply_color()

    def set_totals(self, totals: ColumnTotals) -> None:
        """Show `totals` under the title (re-renders only on a change)."""
        text = totals.text()
        if text == self._totals_text:
            return
        self._totals_text = text
        subtitle = f"{totals.slices} slice{'s' if totals.slices != 1 else ''}"
        if subtitle != self._subtitle:  # a border change repaints the whole column
            self._subtitle = subtitle
            self.border_subtitle = subtitle
        try:
            self.query_one(".column-totals", Static).update(text, layout=False)  # fixed size: no layout pass
        except Exception:  # noqa: BLE001 - not composed yet: on_mount shows it
            pass

    def _apply_color(self) -> None:
        """Draw the border and title in the department's own color, except while highlighted as
        a drop target (the stylesheet's -drop-target rule shows then)."""
        if self.color is None or self.has_class("-drop-target"):
            for rule in ("border_top", "border_right", "border_bottom", "border_left", "border_title_color"):
                self.styles.clear_rule(rule)
        else:
            self.styles.border = ("round", self.color)
            self.styles.border_title_color = self.color

    def set_color(self, color: Color | None) -> None:
        """Use `color` as the department's own color (None: the class's theme color)."""
        self.color = color
        self._apply_color()

    def drop_highlight(self, on: bool) -> None:
        self._apply_color()

    def drop_accepts(self, payload: Any) -> bool:
        """A drag of slices (a sequence of SliceView) is accepted when one of them belongs to
        another department."""
        views: Sequence[Any] = getattr(payload, "views", ())
        return any(getattr(v, "department", None) != self.department for v in views)
