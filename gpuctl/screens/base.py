"""Bases of gpuctl's screens: GpuctlScreen (fleet, node detail, leases, the board) and GpuctlModal
(help, the board's dialogs).

GpuctlScreen composes the FleetHeader, the subclass's body (`compose_body`), a `:` CommandBar and
the Footer, and calls `show_snapshot(snapshot)` when the
app's snapshot or palette changes *while the screen is the top of the stack*. A screen below the
top one (the fleet table under the board, the board under a dialog) does not redraw; it is marked
stale and redraws from the latest snapshot when it is shown again (ScreenResume).

GpuctlModal dims the screen below it (app.tcss: `ModalScreen { background: $background 60%; }`)
and renders that dimmed backdrop once per terminal size: Textual's translucent-screen renderable
re-renders and re-tints the whole screen below every time the modal repaints (about 6 times while
a dialog opens: ~25 ms each at 120x40 here, the bulk of the 0.3-2 s it took to open the board's
`m` dialog on a loaded machine). The screen below does not change meanwhile (see above).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.renderables.background_screen import BackgroundScreen
from textual.screen import ModalScreen, Screen, ScreenResultType
from textual.strip import Strip
from textual.visual import RichVisual, Visual
from textual.widget import Widget
from textual.widgets import Footer

from gpuctl import model
from gpuctl.widgets.command_bar import CommandBar
from gpuctl.widgets.header import FleetHeader


class GpuctlScreen(Screen[None]):
    """Base screen; subclasses set VIEW (the header's view name) and implement compose_body and
    show_snapshot. Inside show_snapshot, `self.app.palette` holds the theme's resolved colors.
    A subclass with a `node_name` attribute (node detail) gets it in the header's title."""

    VIEW = "?"

    def __init__(self, *, name: str | None = None, id: str | None = None):
        super().__init__(name=name, id=id)
        self._stale = True
        self._command_bar = CommandBar()

    def header_title(self) -> str:
        """"fleet", "departments", "node sim-02": what the header names after "gpuctl ▸"."""
        node = getattr(self, "node_name", None)
        return f"{self.VIEW} {node}" if node else self.VIEW

    def compose(self) -> ComposeResult:
        yield FleetHeader(self.header_title())
        yield from self.compose_body()
        if self._stack_exists():
            yield self._command_bar
        yield Footer()

    def _stack_exists(self) -> bool:
        try:
            return bool(self.app.screen_stack)
        except Exception:  # noqa: BLE001 - the app's first mode screen, composed before its stack
            return False

    def compose_body(self) -> ComposeResult:
        """The screen's own widgets (between header and footer)."""
        return iter(())

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._data_changed, init=False)
        self.watch(self.app, "palette", self._palette_changed, init=False)
        if self._command_bar.parent is None:
            # The bar holds an Input: on the app's mode screen, composed before the screen stack
            # exists, it is mounted once the screen is on the stack (an Input mounted earlier
            # stops the app with ScreenStackError on Python >= 3.12).
            self.call_after_refresh(self._mount_command_bar)
        self._data_changed()

    # -- snapshots --------------------------------------------------------------------------------

    @property
    def is_top(self) -> bool:
        """Is this screen the top of the app's screen stack (the one that renders snapshots)?"""
        try:
            return self.app.screen is self
        except Exception:  # noqa: BLE001 - no stack (shutting down)
            return False

    def on_screen_resume(self) -> None:
        if self._stale:
            self._data_changed()

    def _palette_changed(self, _value: object = None) -> None:
        self.palette_changed()
        self._data_changed()

    def _data_changed(self, _value: object = None) -> None:
        if not self.is_top:
            self._stale = True
            return
        self._stale = False
        app = self.app
        snapshot = getattr(app, "snapshot", None)
        palette = getattr(app, "palette", None)
        if palette is not None:
            try:
                header = self.query_one(FleetHeader)
            except NoMatches:
                header = None
            if header is not None:
                departments = list(getattr(getattr(app, "source", None), "departments", None) or [])
                header.show_totals(snapshot, departments, palette)
        if snapshot is not None:
            self.show_snapshot(snapshot)

    def palette_changed(self) -> None:
        """The theme changed: drop anything rendered with the old colors (default: nothing)."""

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        """Render `snapshot` (called on the UI thread; must not block)."""

    # -- focus and the command bar ----------------------------------------------------------------

    def focus_now(self, widget: Widget) -> None:
        """Give `widget` the focus now. Widget.focus() defers the move to the app's next idle, so
        keys already queued (typed right after the key that asked for the focus) would still go
        to the old widget and the app's bindings; with this they go to `widget`."""
        self.set_focus(widget)

    def _mount_command_bar(self) -> None:
        if self._command_bar.parent is None:
            footers = self.query(Footer)
            self.mount(self._command_bar, before=footers.first() if footers else None)

    @property
    def command_bar(self) -> CommandBar:
        """The screen's `:` bar."""
        return self._command_bar

    def open_command_bar(self, suggestions: list[str] | None = None) -> bool:
        """Open the `:` bar with its Input focused now. False (nothing opened) while the bar is
        not composed yet (the first frames after the screen was pushed): the caller retries
        (GpuctlApp holds the keys typed meanwhile)."""
        try:
            self._command_bar.open(suggestions)
        except NoMatches:
            return False
        return True


class _CachedBackdrop(Visual):
    """The modal's translucent background (the screen below, tinted) rendered once per size."""

    def __init__(self, modal: GpuctlModal, renderable: object):
        self._modal = modal
        self._renderable = renderable

    def render_strips(self, width, height, style, options) -> list[Strip]:  # noqa: ANN001
        key = (width, height, self._modal.app.theme)
        cached = self._modal._backdrop
        if cached is not None and cached[0] == key:
            return cached[1]
        strips = RichVisual(self._modal, self._renderable).render_strips(width, height, style, options)
        self._modal._backdrop = (key, strips)
        return strips

    def get_optimal_width(self, rules, container_width: int) -> int:  # noqa: ANN001
        return container_width

    def get_height(self, rules, width: int) -> int:  # noqa: ANN001
        return self._modal.size.height


class GpuctlModal(ModalScreen[ScreenResultType]):
    """A modal screen over a dimmed, once-rendered copy of the screen below (see module doc)."""

    def __init__(self, name: str | None = None, id: str | None = None, classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self._backdrop: tuple[tuple[int, int | None, str], list[Strip]] | None = None

    def render(self):  # noqa: ANN201 - a Visual or whatever Screen.render gives
        background = super().render()
        if isinstance(background, BackgroundScreen):
            return _CachedBackdrop(self, background)
        return background
