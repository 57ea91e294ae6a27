"""Bases of gpuctl's screens: GpuctlScreen (fleet, node detail, leases, the board) and GpuctlModal
(help, the board's dialogs).

GpuctlScreen composes the FleetHeader, the subclass's body (`compose_body`), a `:` CommandBar and
the Footer, and calls `show_snapshot(snapshot)` when the
app's snapshot or palette changes *while the screen is the top of the stack*. A screen below the
top one (the fleet table under the board, the board under a dialog) does not redraw; it is marked
stale and redraws from the latest snapshot when it is shown again (ScreenResume).

GpuctlModal dims the screen below it (app.tcss: `ModalScreen { background: $background 60%; }`)
the way Textual does, but cheaply. Textual's translucent-screen renderable re-composites the
whole screen below and blends a new style for every segment each time the modal repaints (6
times while the board's `m` dialog opens, 25-45 ms each at 120x40 here: the bulk of the 0.3-2 s
it took on a loaded machine). GpuctlModal keeps the tinted lines, redraws only the lines the
screen below repainted (it refreshes the top screen with those regions), and blends each
distinct style once.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.segment import Segment
from rich.style import Style as RichStyle
from textual import events, on
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.color import Color
from textual.css.query import NoMatches
from textual.renderables.background_screen import BackgroundScreen
from textual.screen import ModalScreen, Screen, ScreenResultType
from textual.strip import Strip
from textual.geometry import Region, Size
from textual.visual import Visual
from textual.widget import Widget
from textual.widgets import Footer

from gpuctl import model
from gpuctl.screens.host import ConsoleHost
from gpuctl.widgets.command_bar import CommandBar
from gpuctl.widgets.header import FleetHeader


class ScreenFooter(Footer):
    """Textual's Footer, except that it is not rebuilt while its screen is covered by a dialog.

    Textual's Footer recomposes (removes and re-mounts its keys, then the screen lays out again)
    each time its screen's bindings change. The board's bindings change as the department picker
    closes (the board gets the focus back for a moment) and the recompose then ran under the
    move confirmation pushed right after: the board's new layout dirtied the whole screen below
    the dialog, and the dialog re-sent two more whole frames (~22 KB each at 120x40) to a terminal
    that had not yet drawn the first. Covered, the footer is only marked stale; it is rebuilt
    when its screen is on top again (GpuctlScreen.on_screen_resume)."""

    stale = False

    async def recompose(self) -> None:
        try:
            covered = self.app.screen is not self.screen
        except Exception:  # noqa: BLE001 - no screen stack (shutting down): let Textual decide
            covered = False
        if covered:
            self.stale = True
            return
        self.stale = False
        await super().recompose()


class GpuctlScreen(Screen[None]):
    """Base screen; subclasses set VIEW (the header's view name) and implement compose_body and
    show_snapshot. Inside show_snapshot, `self.app.palette` holds the theme's resolved colors.
    A subclass with a `node_name` attribute (node detail) gets it in the header's title."""

    VIEW = "?"

    def __init__(self, *, name: str | None = None, id: str | None = None):
        super().__init__(name=name, id=id)
        self._stale = True
        self._command_bar = CommandBar()

    @property
    def host(self) -> ConsoleHost:
        """The app, typed as what a screen may ask of it (gpuctl.screens.host.ConsoleHost)."""
        return self.app  # type: ignore[return-value]

    def header_title(self) -> str:
        """"fleet", "departments", "node sim-02": what the header names after "gpuctl ▸"."""
        node = getattr(self, "node_name", None)
        return f"{self.VIEW} {node}" if node else self.VIEW

    def compose(self) -> ComposeResult:
        yield FleetHeader(self.header_title())
        yield from self.compose_body()
        if self._stack_exists():
            yield self._command_bar
        yield ScreenFooter()

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
        for footer in self.query(ScreenFooter):
            if footer.stale:  # on the footer's own queue: its compose binds to its reactives
                footer.call_later(footer.recompose)
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


class _DimmedBackdrop(Visual):
    """The screen below `modal`, tinted with `color` (what Textual's BackgroundScreen draws),
    kept by the modal and redrawn only where the screen below repainted (GpuctlModal.refresh)."""

    def __init__(self, modal: GpuctlModal, below: Screen, color: Color):
        self._modal = modal
        self._below = below
        self._color = color

    def render_strips(self, width, height, style, options) -> list[Strip]:  # noqa: ANN001
        return self._modal._backdrop_strips(self._below, self._color, Size(width, height or self._modal.size.height))

    def get_optimal_width(self, rules, container_width: int) -> int:  # noqa: ANN001
        return container_width

    def get_height(self, rules, width: int) -> int:  # noqa: ANN001
        return self._modal.size.height


class GpuctlModal(ModalScreen[ScreenResultType]):
    """A modal screen over the dimmed screen below it (see the module doc)."""

    def __init__(self, name: str | None = None, id: str | None = None, classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self._tints: dict[Color, Callable[[RichStyle | None], RichStyle]] = {}
        self._backdrop: tuple[tuple[int, Size, Color], list[Strip]] | None = None
        self._dirty_lines: set[int] = set()
        #: Backdrop lines drawn (tests: a dialog does not redraw the screen below on each repaint).
        self.backdrop_lines_drawn = 0
        self._dismissed = False

    def dismiss(self, result: ScreenResultType | None = None) -> AwaitComplete:
        """Textual's dismiss, once, and only while this dialog is the top screen.

        Textual's runs the result callback and pops whatever screen is on top, each time it is
        called: a key that reaches a dialog while it is being dismissed (Enter Enter in a picker,
        typed as one burst) ran the callback twice and popped the screen below. A second call,
        or a call once another screen is on top, does nothing (returns a completed awaitable)."""
        if self._dismissed or self.app.screen is not self:
            return AwaitComplete()
        self._dismissed = True
        return super().dismiss(result)

    @on(events.ScreenResume)
    def _may_be_dismissed_again(self) -> None:
        """On top again (pushed anew, or a screen above it closed): one dismiss is allowed."""
        self._dismissed = False

    def refresh(self, *regions, **kwargs):  # noqa: ANN001, ANN201 - Widget.refresh's signature
        # A screen below that repaints part of itself (a widget losing the focus to this modal,
        # its footer's keys) refreshes the top screen with those regions: redraw those lines.
        for region in regions:
            self._dirty_lines.update(range(region.y, region.bottom))
        return super().refresh(*regions, **kwargs)

    def _backdrop_strips(self, below: Screen, color: Color, size: Size) -> list[Strip]:
        key = (id(below), size, color)
        cached = self._backdrop
        compositor = below._compositor  # noqa: SLF001 - what Textual's BackgroundScreen draws
        if cached is None or cached[0] != key:
            strips = compositor.render_strips(size)
            lines = range(len(strips))
        else:
            strips = list(cached[1])
            lines = sorted(y for y in self._dirty_lines if 0 <= y < len(strips))
            if not lines:
                return strips
            crop = Region(0, lines[0], size.width, lines[-1] - lines[0] + 1)
            wanted = set(lines)
            chops = compositor._render_chops(crop, wanted.__contains__)  # noqa: SLF001
            for y in lines:
                strips[y] = Strip.join([strip for strip in chops[y].values() if strip is not None])
        self._dirty_lines.clear()
        tint = self._tint_for(color)
        for y in lines:
            strip = strips[y]
            strips[y] = Strip([seg if seg.control else Segment(seg.text, tint(seg.style), None) for seg in strip],
                              strip.cell_length)
        self.backdrop_lines_drawn += len(lines)
        self._backdrop = (key, strips)
        return strips

    def _tint_for(self, color: Color) -> Callable[[RichStyle | None], RichStyle]:
        """style -> the style blended with `color` (BackgroundScreen.process_segments' blend),
        memoized."""
        tint = self._tints.get(color)
        if tint is not None:
            return tint
        memo: dict[RichStyle | None, RichStyle] = {}
        null = RichStyle()

        def tint(style: RichStyle | None) -> RichStyle:
            done = memo.get(style)
            if done is None:
                base = null if style is None else style.clear_meta_and_links()
                fg = (Color.from_rich_color(base.color) + color).rich_color if base.color is not None else None
                bg = (Color.from_rich_color(base.bgcolor) + color).rich_color if base.bgcolor is not None else None
                done = memo[style] = base + RichStyle.from_color(fg, bg)
            return done

        self._tints = {color: tint}
        return tint

    def render(self):  # noqa: ANN201 - a Visual or whatever Screen.render gives
        background = super().render()
        if isinstance(background, BackgroundScreen) and background.color.a > 0:
            return _DimmedBackdrop(self, background.screen, background.color)
        return background
