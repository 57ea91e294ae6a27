"""A small drag-and-drop module for Textual (which has none built in).

Shape (the one STYLE.md describes):

- A :class:`Draggable` widget captures the mouse on MouseDown (when :meth:`Draggable.drag_press`
  says the press is on something draggable: a widget drawing many items hit-tests there) and
  starts a drag once the pointer has moved more than :attr:`Draggable.DRAG_THRESHOLD` cells (2)
  away; a release before that is a click (:meth:`Draggable.drag_clicked`). Draggables set ``ALLOW_SELECT = False`` so pressing on
  them never starts a text selection.
- The screen owns the drag: it holds a :class:`DragController` (attribute ``drag_controller``),
  built with a callback that turns the pressed draggable into a payload and a ghost label (the
  screen decides what moves, e.g. the whole selection).
- While dragging, a :class:`DragGhost` on ``layer: overlay`` follows the pointer, and the drop
  target under the pointer (found with ``screen.get_widgets_at(x, y)``, walking up each hit's
  ancestors to the first :class:`DropTarget` that accepts the payload) gets the CSS class
  ``-drop-target`` (and its :meth:`DropTarget.drop_highlight` is called).
- Releasing posts :class:`DragController.Dropped` (payload, target) to the screen, or
  :class:`DragController.Cancelled` when released over no target; Escape (the screen binds it to
  :meth:`DragController.cancel`) cancels and posts Cancelled too.

Coordinates are screen cells (x: column, y: row, origin top-left).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual import events
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static

#: Class added to the drop target under the pointer during a drag.
DROP_TARGET_CLASS = "-drop-target"
#: Class added to the draggable being dragged.
DRAGGING_CLASS = "-dragging"


class DropTarget:
    """Mixin for widgets that accept drops. Override :meth:`drop_accepts` to refuse payloads."""

    def drop_accepts(self, payload: Any) -> bool:
        """Whether a drop of `payload` here would do something (default: always)."""
        return True

    def drop_highlight(self, on: bool) -> None:
        """The pointer of a drag entered (on=True) or left this target; called after the
        ``-drop-target`` class was set or removed (default: nothing more)."""


class DragGhost(Static):
    """The label that follows the pointer during a drag (hidden otherwise)."""

    DEFAULT_CSS = """
    DragGhost {
        layer: overlay;
        position: absolute;
        display: none;
        width: auto;
        max-width: 48;
        height: auto;
        padding: 0 1;
        background: $boost;
        color: $foreground;
        border: round $accent;
    }
    """


#: Callback of the screen: the payload and ghost label for a drag starting on a draggable, or
#: None when that draggable cannot be dragged now.
PayloadFor = Callable[["Draggable"], "tuple[Any, str] | None"]


class DragController:
    """One screen's drag state: which draggable is dragged, its payload, the ghost, the target.

    screen: the owning screen (messages are posted to it). ghost: a DragGhost mounted on that
    screen (on a layer named "overlay" in the screen's ``layers``). payload_for: see
    :data:`PayloadFor`.
    """

    class Dropped(Message):
        """A drag ended over `target` (a DropTarget widget that accepted `payload`)."""

        def __init__(self, payload: Any, target: Widget) -> None:
            super().__init__()
            self.payload = payload
            self.target = target

    class Cancelled(Message):
        """A drag ended with nothing dropped (Escape, or released over no target)."""

        def __init__(self, payload: Any, reason: str) -> None:
            super().__init__()
            self.payload = payload
            self.reason = reason

    def __init__(self, screen: Screen, ghost: DragGhost, payload_for: PayloadFor):
        self.screen = screen
        self.ghost = ghost
        self.payload_for = payload_for
        self.source: Draggable | None = None
        self.payload: Any = None
        self.target: Widget | None = None

    @property
    def active(self) -> bool:
        """True while a drag is in progress."""
        return self.source is not None

    def start(self, source: "Draggable", x: int, y: int) -> bool:
        """Begin dragging `source` with the pointer at (x, y); False when the screen's callback
        says it cannot be dragged (nothing changes then)."""
        if self.active:
            self.cancel("a new drag started")
        got = self.payload_for(source)
        if got is None:
            return False
        self.payload, label = got
        self.source = source
        source.add_class(DRAGGING_CLASS)
        self.ghost.update(label)
        self.ghost.display = True
        self.move(x, y)
        return True

    def target_at(self, x: int, y: int) -> Widget | None:
        """The first DropTarget under (x, y), walking up from each widget there, that accepts the
        current payload; None when there is none (or no drag)."""
        if not self.active:
            return None
        try:
            hits = list(self.screen.get_widgets_at(x, y))
        except Exception:  # noqa: BLE001 - outside the screen / compositor not ready: no target
            return None
        for widget, _region in hits:
            if widget is self.ghost:
                continue
            node: Any = widget
            while node is not None and node is not self.screen:
                if isinstance(node, DropTarget) and node.drop_accepts(self.payload):
                    return node
                node = node.parent
        return None

    def move(self, x: int, y: int) -> None:
        """The pointer is at (x, y): move the ghost next to it and highlight the target."""
        if not self.active:
            return
        width, height = self.screen.size
        gx = max(0, min(x + 2, width - 8))
        gy = max(0, min(y, height - 3))
        self.ghost.styles.offset = (gx, gy)
        self._set_target(self.target_at(x, y))

    def finish(self, x: int, y: int) -> None:
        """The button was released at (x, y): post Dropped on the target there, or Cancelled."""
        if not self.active:
            return
        target = self.target_at(x, y)
        payload = self.payload
        self._end()
        if target is None:
            self.screen.post_message(self.Cancelled(payload, "released over no drop target"))
        else:
            self.screen.post_message(self.Dropped(payload, target))

    def cancel(self, reason: str = "cancelled") -> bool:
        """End the drag without a drop (posts Cancelled); False when no drag was in progress."""
        if not self.active:
            return False
        payload = self.payload
        self._end()
        self.screen.post_message(self.Cancelled(payload, reason))
        return True

    def _set_target(self, target: Widget | None) -> None:
        if target is self.target:
            return
        if self.target is not None:
            self.target.remove_class(DROP_TARGET_CLASS)
            if isinstance(self.target, DropTarget):
                self.target.drop_highlight(False)
        self.target = target
        if target is not None:
            target.add_class(DROP_TARGET_CLASS)
            if isinstance(target, DropTarget):
                target.drop_highlight(True)

    def _end(self) -> None:
        self._set_target(None)
        source = self.source
        self.source = None
        self.payload = None
        self.ghost.display = False
        if source is not None:
            source.remove_class(DRAGGING_CLASS)
            source.release_mouse()
            source._drag_down = None


class Draggable(Widget):
    """A widget that can be dragged (see the module doc). Subclasses override
    :meth:`drag_clicked` for a press and release without a drag."""

    ALLOW_SELECT = False
    #: Cells the pointer must move (in x or y) before a press becomes a drag.
    DRAG_THRESHOLD = 2

    _drag_down: tuple[int, int] | None = None

    def _controller(self) -> DragController | None:
        try:
            return getattr(self.screen, "drag_controller", None)
        except Exception:  # noqa: BLE001 - not mounted on a screen
            return None

    def drag_press(self, event: events.MouseDown) -> bool:
        """A press at (event.x, event.y) of this widget: True when it may start a drag or a click
        (default: always; a widget drawing several items hit-tests here and remembers which)."""
        return True

    def on_mouse_down(self, event: events.MouseDown) -> None:
        if event.button == 3:  # right button: not a drag
            return
        if not self.drag_press(event):
            return
        event.stop()
        self._drag_down = (event.screen_x, event.screen_y)
        self.capture_mouse()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        controller = self._controller()
        if controller is None:
            return
        if controller.active and controller.source is self:
            event.stop()
            controller.move(event.screen_x, event.screen_y)
            return
        if self._drag_down is None:
            return
        event.stop()
        x0, y0 = self._drag_down
        if abs(event.screen_x - x0) > self.DRAG_THRESHOLD or abs(event.screen_y - y0) > self.DRAG_THRESHOLD:
            self._drag_down = None
            if not controller.start(self, event.screen_x, event.screen_y):
                self.release_mouse()

    def on_mouse_up(self, event: events.MouseUp) -> None:
        controller = self._controller()
        if controller is not None and controller.active and controller.source is self:
            event.stop()
            controller.finish(event.screen_x, event.screen_y)
            return
        was_down = self._drag_down is not None
        self._drag_down = None
        self.release_mouse()
        if was_down:
            event.stop()
            self.drag_clicked(event)

    def drag_clicked(self, event: events.MouseUp) -> None:
        """A press and release without a drag (default: nothing)."""
