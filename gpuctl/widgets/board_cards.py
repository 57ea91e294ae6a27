"""The cards of one board column, drawn line by line: one widget per column, not one per slice.

A card is one slice in two lines: where and how big ("node-01 GPU 3 ½", "#k" when the GPU is
split), then its live SM utilization and its state: "free", "🔒 alice@ws12" (leased, with the
lease's owner), "🔒 → training (drain)" (a drain-mode move waiting for the lease to end),
"moving → training…" (a move the console sent and has not seen done yet) or the GPU's error. A bar
on the left edge carries the state's color ($slice-idle, $slice-busy, $warning, $error).

:class:`CardList` is a Textual ScrollView (the Line API): every card is CARD_PITCH rows tall (two
lines and a blank row), so the card under a row is ``(row + scroll_y) // CARD_PITCH`` and drawing
costs only the rows in view, however many slices a department owns (1024 GPUs: ~1700 cards). Mouse
presses are hit-tested to a card (press, drag, shift-click); the keyboard moves a cursor (the
focused card) that the board screen reads as its focused slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.color import Color, ColorParseError
from textual.geometry import Offset, Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpuctl import format as fmt
from gpuctl.widgets.board_model import SliceView
from gpuctl.widgets.drag import Draggable

#: The lock shown on leased cards.
LOCK = "🔒"
#: Text rows of a card.
CARD_HEIGHT = 2
#: Rows from one card's top to the next (CARD_HEIGHT and one blank row).
CARD_PITCH = 3
#: The bar drawn on a card's left edge (in the color of its state).
BAR = "▌"

#: Roles of the parts of a card's text, drawn with CardColors: "" (foreground), "bold", "muted",
#: "accent", "warning", "error", "busy" ($slice-busy), "idle" ($slice-idle).
Part = tuple[str, str]


def card_parts(view: SliceView, *, selected: bool = False, moving_to: str | None = None) -> tuple[list[Part], list[Part]]:
    """The card's two lines as (text, role) parts (see the module doc); a "✔ " mark before the
    label when selected, and the slice's number on its GPU ("#2") after it when the GPU is split."""
    top: list[Part] = []
    if selected:
        top.append(("✔ ", "accent"))
    top.append((view.label(), "bold"))
    if view.fraction < 1:
        top.append((f" #{view.slice_id.rpartition('/')[2]}", "muted"))
    if view.outside_processes:
        top.append((f" ⚠{view.outside_processes} outside", "warning"))
    sm = "SM " + fmt.percent(view.sm_util_pct).rjust(4)
    bottom: list[Part] = [(sm, "muted" if view.sm_util_pct is None else ""), (" ", "")]
    if view.gpu_error:
        bottom.append((f"error: {view.gpu_error}", "error"))
    elif moving_to is not None:
        bottom.append((f"moving → {moving_to}…", "warning"))
    elif view.pending_to is not None:
        bottom.append((f"{LOCK} → {view.pending_to} (drain)", "warning"))
    elif view.leased:
        bottom.append((f"{LOCK} {view.lease_owner or view.lease_id}", "busy"))
    else:
        bottom.append(("free", "idle"))
    return top, bottom


def card_text(view: SliceView, *, selected: bool = False, moving_to: str | None = None) -> str:
    """The card's two lines as plain text, e.g. "node-01 GPU 3 ½ #1\\nSM  43% free"."""
    top, bottom = card_parts(view, selected=selected, moving_to=moving_to)
    return "".join(t for t, _ in top) + "\n" + "".join(t for t, _ in bottom)


def state_role(view: SliceView, moving_to: str | None = None) -> str:
    """The role of the card's bar: "error" (GPU error), "warning" (a move in flight or a drain
    waiting), "busy" (leased) or "idle"."""
    if view.gpu_error:
        return "error"
    if moving_to is not None or view.pending_to is not None:
        return "warning"
    return "busy" if view.leased else "idle"


def _color(value: str | None, default: Color) -> Color:
    try:
        return Color.parse(value) if value else default
    except (ColorParseError, ValueError):
        return default


@dataclass(frozen=True)
class CardColors:
    """The colors cards are drawn with, resolved from the theme (gpuctl.widgets.palette.Palette:
    theme variables as "#rrggbb"): text roles, the card background ($surface) and the backgrounds
    of selected ($accent 25 %), cursor ($primary 35 %) and selected-and-cursor ($accent 45 %) cards,
    each blended onto $surface."""

    roles: dict[str, Style]
    card: Color
    selected: Color
    cursor: Color
    selected_cursor: Color
    muted: Color

    @classmethod
    def from_variables(cls, colors: dict[str, str] | object) -> "CardColors":
        """Build from a mapping of theme variable -> color (Palette.colors)."""
        get = colors.get  # type: ignore[union-attr]
        fg = _color(get("foreground"), Color(224, 224, 224))
        surface = _color(get("surface"), Color(30, 30, 30))
        muted = _color(get("foreground-muted"), fg.with_alpha(0.6))
        if muted.a < 1:
            muted = surface + muted
        accent = _color(get("accent"), Color(255, 176, 0))
        primary = _color(get("primary"), Color(86, 180, 233))
        hues = {
            "": fg, "bold": fg, "muted": muted, "accent": accent,
            "warning": _color(get("warning"), Color(240, 228, 66)),
            "error": _color(get("error"), Color(213, 94, 0)),
            "busy": _color(get("slice-busy"), Color(230, 159, 0)),
            "idle": _color(get("slice-idle"), Color(0, 158, 115)),
        }
        roles = {name: Style(color=c.rich_color, bold=name == "bold") for name, c in hues.items()}
        return cls(
            roles=roles,
            card=surface,
            selected=surface.blend(accent, 0.25),
            cursor=surface.blend(primary, 0.35),
            selected_cursor=surface.blend(accent, 0.45),
            muted=muted,
        )


def card_strips(view: SliceView, width: int, colors: CardColors, *, selected: bool = False,
                moving_to: str | None = None, cursor: bool = False, dimmed: bool = False) -> tuple[Strip, Strip]:
    """The card's two rows, `width` cells each: the state bar, a space, the text (cut at the
    width), a space. `cursor`: the focused card; `dimmed`: the card is being dragged (all text
    muted)."""
    if cursor:
        bg = colors.selected_cursor if selected else colors.cursor
    else:
        bg = colors.selected if selected else colors.card
    background = Style(bgcolor=bg.rich_color)
    bar_role = "muted" if dimmed else state_role(view, moving_to)
    bar = Segment(BAR, colors.roles[bar_role] + background)
    pad = Segment(" ", background)
    inner = max(0, width - 3)
    rows = []
    for parts in card_parts(view, selected=selected, moving_to=moving_to):
        segments = [Segment(text, colors.roles["muted" if dimmed else role] + background) for text, role in parts]
        text = Strip(segments).adjust_cell_length(inner, background)
        line = Strip([bar, pad, *text, pad])
        rows.append(line.crop(0, width) if width < 3 else line)
    return rows[0], rows[1]


@dataclass
class CardMarks:
    """Board-wide marks the card lists read when drawing (shared with the board screen, which
    owns them): selected slice ids, moves in flight (slice id -> destination department) and the
    slices of the drag in progress."""

    selected: set[str] = field(default_factory=set)
    moving: dict[str, str] = field(default_factory=dict)
    dragging: set[str] = field(default_factory=set)


class CardList(Draggable, ScrollView, can_focus=True):
    """The cards of one department's column (see the module doc). The board screen sets the
    cards with :meth:`set_cards`; `marks` is the board's shared CardMarks. Keys: up/down move the
    cursor (left/right go to the board screen's card_nav), home/end/pageup/pagedown jump."""

    BINDINGS = [
        Binding("up", "screen.card_nav('up')", "Up", show=False),
        Binding("down", "screen.card_nav('down')", "Down", show=False),
        Binding("left", "screen.card_nav('left')", "Left", show=False),
        Binding("right", "screen.card_nav('right')", "Right", show=False),
        Binding("home", "cursor_to(0)", "First", show=False),
        Binding("end", "cursor_to(-1)", "Last", show=False),
        Binding("pageup", "cursor_page(-1)", "Page up", show=False),
        Binding("pagedown", "cursor_page(1)", "Page down", show=False),
    ]

    #: Cached card rows kept at most (then the cache starts afresh): a few screens' worth.
    CACHE_CARDS = 512

    class Clicked(Message):
        """A card was pressed and released without a drag; `shift` when shift was held."""

        def __init__(self, cards: "CardList", slice_id: str, shift: bool) -> None:
            super().__init__()
            self.cards = cards
            self.slice_id = slice_id
            self.shift = shift

        @property
        def control(self) -> "CardList":
            return self.cards

    def __init__(self, department: str, marks: CardMarks | None = None, *, classes: str | None = None):
        super().__init__(classes=classes)
        self.department = department
        self.marks = marks if marks is not None else CardMarks()
        self._views: list[SliceView] = []
        self._index: dict[str, int] = {}
        self.cursor = 0
        #: The slice under the last mouse press (what a drag carries), None when none.
        self.pressed_id: str | None = None
        self._cache: dict[tuple, tuple[Strip, Strip]] = {}
        self._colors: CardColors | None = None
        self._palette: object = None
        self._paint: tuple[int, Style, int] | None = None  # (width, style, scroll_y) during render_lines
        #: Cards drawn (card rows built, not cache hits) since creation: for tests and benchmarks.
        self.cards_drawn = 0

    # -- data ----------------------------------------------------------------------------------

    @property
    def views(self) -> list[SliceView]:
        """The cards' slices, top to bottom."""
        return self._views

    @property
    def slice_ids(self) -> list[str]:
        return [v.slice_id for v in self._views]

    @property
    def cursor_id(self) -> str | None:
        """The slice under the cursor (None when the list is empty)."""
        return self._views[self.cursor].slice_id if 0 <= self.cursor < len(self._views) else None

    def index_of(self, slice_id: str) -> int | None:
        return self._index.get(slice_id)

    def set_cards(self, views: Sequence[SliceView]) -> bool:
        """Show `views` (top to bottom). The cursor stays on its slice when that is still here,
        else keeps its position (clamped). Repaints only when something changed (rows are
        re-drawn only for cards in view). Returns True when something changed."""
        views = list(views)
        old = self._views
        if views == old:
            return False
        keep = self.cursor_id
        cursor = self.cursor
        self._views = views
        if len(views) != len(old) or any(a.slice_id != b.slice_id for a, b in zip(views, old)):
            self._index = {v.slice_id: i for i, v in enumerate(views)}
        if keep is not None and keep in self._index:
            self.cursor = self._index[keep]
        else:
            self.cursor = max(0, min(self.cursor, len(views) - 1))
        height = len(views) * CARD_PITCH - 1 if views else 0
        if self.virtual_size.height != height:
            self.virtual_size = Size(0, height)
            self.refresh()
        elif self.cursor != cursor:
            self.refresh()
        else:  # same cards and cursor: repaint only when a card in view changed
            first, last = self.cards_in_view()
            if views[first:last] != old[first:last]:
                self.refresh()
        return True

    def cards_in_view(self) -> tuple[int, int]:
        """Indices [first, last) of the cards at least partly in view."""
        top = round(self.scroll_y)
        height = self.scrollable_content_region.height
        first = max(0, top // CARD_PITCH)
        last = min(len(self._views), (top + height) // CARD_PITCH + 1)
        return first, last

    def clear_cache(self) -> None:
        """Forget drawn rows and colors (after a theme change)."""
        self._cache.clear()
        self._colors = None

    # -- cursor --------------------------------------------------------------------------------

    def move_cursor(self, index: int, *, scroll: bool = True) -> None:
        """Put the cursor on card `index` (clamped to the cards) and scroll it into view."""
        if not self._views:
            self.cursor = 0
            return
        index = max(0, min(index, len(self._views) - 1))
        if index != self.cursor:
            self.cursor = index
            self.refresh()
        if scroll:
            self.scroll_to_card(index)

    def scroll_to_card(self, index: int) -> None:
        """Scroll card `index` into view at once (no animation)."""
        self.scroll_to_region(Region(0, index * CARD_PITCH, 1, CARD_HEIGHT), animate=False, immediate=True)

    def action_cursor_to(self, index: int) -> None:
        """Cursor to card `index`; -1 is the last card."""
        self.move_cursor(len(self._views) - 1 if index < 0 else index)

    def action_cursor_page(self, direction: int) -> None:
        per_page = max(1, self.scrollable_content_region.height // CARD_PITCH)
        self.move_cursor(self.cursor + direction * per_page)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # -- hit-testing ---------------------------------------------------------------------------

    def card_at(self, y: int) -> int | None:
        """The index of the card at row `y` of the widget (0 = its top row), None over a gap
        between cards or below the last."""
        line = y + round(self.scroll_y)
        index, row = divmod(line, CARD_PITCH)
        if line < 0 or row >= CARD_HEIGHT or index >= len(self._views):
            return None
        return index

    def card_offset(self, slice_id: str) -> Offset | None:
        """Scroll the card of `slice_id` into view and return a point on it, relative to the
        widget's top-left (for a mouse press); None when the slice is not in this list."""
        index = self._index.get(slice_id)
        if index is None:
            return None
        self.scroll_to_card(index)
        return Offset(3, index * CARD_PITCH - round(self.scroll_y))

    def drag_press(self, event: events.MouseDown) -> bool:
        index = self.card_at(event.y)
        self.pressed_id = None if index is None else self._views[index].slice_id
        if index is not None:
            self.move_cursor(index, scroll=False)
        return index is not None

    def drag_clicked(self, event: events.MouseUp) -> None:
        sid = self.pressed_id
        if sid is None:
            return
        self.focus(scroll_visible=False)
        self.post_message(self.Clicked(self, sid, bool(event.shift)))

    # -- drawing -------------------------------------------------------------------------------

    def _card_colors(self) -> CardColors:
        """The colors of the app's palette (gpuctl.widgets.palette, rebuilt on a theme change:
        a new palette drops the drawn rows), or of the app's CSS variables when it has none."""
        palette = getattr(self.app, "palette", None)
        if self._colors is None or palette is not self._palette:
            self._cache.clear()
            self._palette = palette
            variables = getattr(palette, "colors", None)
            if variables is None:
                variables = self.app.get_css_variables()
            self._colors = CardColors.from_variables(variables)
        return self._colors

    def card_rows(self, index: int, width: int | None = None) -> tuple[Strip, Strip]:
        """The two drawn rows of card `index` at `width` cells (default: the list's width)."""
        if width is None:
            width = self.scrollable_content_region.width
        view = self._views[index]
        marks = self.marks
        selected = view.slice_id in marks.selected
        moving_to = marks.moving.get(view.slice_id)
        cursor = index == self.cursor and self.has_focus
        dimmed = view.slice_id in marks.dragging
        colors = self._card_colors()
        key = (view, selected, moving_to, cursor, dimmed, width)
        rows = self._cache.get(key)
        if rows is None:
            if len(self._cache) >= self.CACHE_CARDS:
                self._cache.clear()
            rows = card_strips(view, width, colors, selected=selected, moving_to=moving_to,
                               cursor=cursor, dimmed=dimmed)
            self._cache[key] = rows
            self.cards_drawn += 1
        return rows

    def render_lines(self, crop: Region) -> list[Strip]:
        # Once per paint, not per line: the widget's style (walks the ancestors) and width.
        self._paint = (self.scrollable_content_region.width, self.rich_style, round(self.scroll_y))
        try:
            return super().render_lines(crop)
        finally:
            self._paint = None

    def render_line(self, y: int) -> Strip:
        paint = self._paint or (self.scrollable_content_region.width, self.rich_style, round(self.scroll_y))
        width, style, top = paint
        line = y + top
        index, row = divmod(line, CARD_PITCH)
        if row >= CARD_HEIGHT or index >= len(self._views) or line < 0:
            return Strip.blank(width, style)
        return self.card_rows(index, width)[row]
