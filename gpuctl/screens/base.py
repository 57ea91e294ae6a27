"""GpuctlScreen: the base of every gpuctl screen (fleet, node detail, leases, the board).

Composes the FleetHeader, the subclass's body (`compose_body`) and the Footer, and calls
`show_snapshot(snapshot)` whenever the app's snapshot or palette changes while the screen is
current (a screen in the background catches up when it is shown again, so hidden tables cost
nothing).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from gpuctl import model
from gpuctl.widgets.header import FleetHeader


class GpuctlScreen(Screen[None]):
    """Base screen; subclasses set VIEW (the header's view name) and implement compose_body and
    show_snapshot. Inside show_snapshot, `self.app.palette` holds the theme's resolved colors."""

    VIEW = "?"

    def __init__(self, *, name: str | None = None, id: str | None = None):
        super().__init__(name=name, id=id)
        self._stale = True

    def compose(self) -> ComposeResult:
        yield FleetHeader(self.VIEW)
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        """The screen's own widgets (between header and footer)."""
        return iter(())

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._data_changed, init=False)
        self.watch(self.app, "palette", self._palette_changed, init=False)
        self._data_changed()

    def on_screen_resume(self) -> None:
        if self._stale:
            self._data_changed()

    def _palette_changed(self, _value: object = None) -> None:
        self.palette_changed()
        self._data_changed()

    def _data_changed(self, _value: object = None) -> None:
        if not self.is_current:
            self._stale = True
            return
        self._stale = False
        snapshot = getattr(self.app, "snapshot", None)
        if snapshot is not None:
            self.show_snapshot(snapshot)

    def palette_changed(self) -> None:
        """The theme changed: drop anything rendered with the old colors (default: nothing)."""

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        """Render `snapshot` (called on the UI thread; must not block)."""
