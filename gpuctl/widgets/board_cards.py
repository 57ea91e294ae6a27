"""A card of the department board: one slice, draggable, focusable, selectable.

Two lines: where and how big ("node-01 GPU 3 ½"), then its live SM utilization and its state:
"idle", "🔒 alice@ws12" (leased, with the lease's owner), "→ training (drain)" (a drain-mode move
waiting for the lease to end) or "moving → training…" (a move the console sent and has not seen
done yet). Colors are theme variables ($slice-idle, $slice-busy, $warning, $error).
"""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.content import Content
from textual.message import Message

from gpuctl.widgets import format as fmt
from gpuctl.widgets.board_model import SliceView
from gpuctl.widgets.drag import Draggable

#: The lock shown on leased cards.
LOCK = "🔒"


def card_content(view: SliceView, *, selected: bool = False, moving_to: str | None = None) -> Content:
    """The card's two lines (see the module doc); a "✔ " mark before the label when selected and
    the slice's number on its GPU ("#2") after the label when the GPU is split."""
    mark = ("✔ ", "$accent") if selected else ("", "")
    k = view.slice_id.rpartition("/")[2]
    number = (f" #{k}", "$foreground-muted") if view.fraction < 1 else ""
    top = Content.assemble(mark, (view.label(), "bold"), number)
    sm = "SM " + fmt.percent(view.sm_util_pct).rjust(4)
    parts: list[str | tuple[str, str]] = [(sm, "$foreground-muted" if view.sm_util_pct is None else ""), " "]
    if view.gpu_error:
        parts.append((f"error: {view.gpu_error}", "$error"))
    elif moving_to is not None:
        parts.append((f"moving → {moving_to}…", "$warning"))
    elif view.pending_to is not None:
        parts.append((f"{LOCK} → {view.pending_to} (drain)", "$warning"))
    elif view.leased:
        parts.append((f"{LOCK} {view.lease_owner or view.lease_id}", "$slice-busy"))
    else:
        parts.append(("idle", "$slice-idle"))
    return Content("\n").join([top, Content.assemble(*parts)])


class SliceCard(Draggable, can_focus=True):
    """One slice on the board. `view` is what it shows; `selected` and `moving_to` (the
    destination of a move in flight, else None) are set by the board screen."""

    BINDINGS = [
        Binding("up", "screen.card_nav('up')", "Up", show=False),
        Binding("down", "screen.card_nav('down')", "Down", show=False),
        Binding("left", "screen.card_nav('left')", "Left", show=False),
        Binding("right", "screen.card_nav('right')", "Right", show=False),
    ]

    class Clicked(Message):
        """The card was pressed and released without a drag; `shift` when shift was held."""

        def __init__(self, card: "SliceCard", shift: bool) -> None:
            super().__init__()
            self.card = card
            self.shift = shift

    def __init__(self, view: SliceView, *, selected: bool = False, moving_to: str | None = None):
        super().__init__()
        self.view = view
        self.selected = selected
        self.moving_to = moving_to
        self._shown: tuple | None = None
        self._flags: tuple | None = None
        self._stale = False
        self._content: Content | None = None
        self._render_card(repaint=False)
        self._stale = False

    def render(self) -> Content:
        if self._content is None:  # built lazily: cards out of view cost nothing per tick
            self._content = card_content(self.view, selected=self.selected, moving_to=self.moving_to)
        return self._content

    @property
    def slice_id(self) -> str:
        return self.view.slice_id

    def show(self, view: SliceView | None = None, *, selected: bool | None = None,
             moving_to: str | None | bool = False, repaint: bool = True) -> bool:
        """Update what the card shows (only the arguments given); re-renders only on a change.
        moving_to=False means "unchanged"; None clears it. repaint=False defers the repaint (a
        card scrolled out of view: the board calls :meth:`repaint` when it comes into view).
        Returns True when the card changed and still needs that repaint."""
        if view is not None:
            self.view = view
        if selected is not None:
            self.selected = selected
        if moving_to is not False:
            self.moving_to = moving_to  # type: ignore[assignment]
        return self._render_card(repaint)

    @property
    def stale(self) -> bool:
        """True when the card changed while out of view and has not been repainted."""
        return self._stale

    def repaint(self) -> None:
        """Repaint a stale card (a repaint, never a layout pass: the card's size is fixed)."""
        self._stale = False
        self.refresh()

    def _render_card(self, repaint: bool = True) -> bool:
        key = (self.view, self.selected, self.moving_to)
        if key == self._shown:
            return False
        self._shown = key
        flags = (self.selected, self.view.leased, self.moving_to is not None or self.view.pending_to is not None,
                 self.view.gpu_error is not None)
        if flags != self._flags:
            self._flags = flags
            for on, name in zip(flags, ("-selected", "-leased", "-pending", "-error")):
                self.set_class(on, name)
        self._content = None
        if repaint:
            self.repaint()
            return False
        self._stale = True
        return True

    def drag_clicked(self, event: events.MouseUp) -> None:
        self.post_message(self.Clicked(self, bool(event.shift)))
