"""The gpuctl console: a Textual app over a FleetSource.

`build_app(source, readonly=..., theme=...)` is the one factory the CLI and the tests use.

The app is this shell (themes, screens installed, size, check_action, terminal driver, crashes)
plus four mixins in gpuctl/console/: polling.py (the poll loop below), keys.py (keys in the order
typed: the `:` bar, `/`, held keys), commands.py (the `:` interpreter and navigation) and
frame_ack.py (when a frame has really reached the terminal: the move confirmation arms then).

Data flow: a thread worker (group "poll") calls source.snapshot() (blocking, network) and posts
SnapshotArrived; the UI thread stores it in the `snapshot` var, appends each GPU's SM utilization
to `sm_history` (the last SPARK_POINTS values the console saw) and schedules the next poll as a
one-shot timer `refresh_s` after this one finished, so polls never pile up. Screens re-render
from `snapshot`; nothing on the UI thread does I/O.

The blocking call runs on a daemon thread of its own (run_in_daemon_thread), not on the event
loop's default executor where Textual's thread workers run: asyncio.run() joins that executor at
exit, so a poll in flight (up to a node's timeout_s + 1 s with a slow node) held `q` up for
seconds. A poll cut short by quitting is abandoned; its thread ends with the process.

Screens: fleet (default, `:nodes`, the base of the stack), node detail (`:node NAME`, Enter),
leases (`:leases`, installed as "leases"), help (`?`), the department board (`:depts`) when a
screen named "board" is installed: the app installs gpuctl.screens.board.BoardScreen() under
that name when that module exists, and a caller may install one with
app.install_screen(screen, "board"). Going to the screen already on top does nothing (a second
`l` while the leases screen is shown or still being pushed, `:node X` on X's detail); going to
an installed screen already in the stack pops back down to it; otherwise the stack is popped to
the fleet screen and the installed screen pushed by name. `:node` on a node detail replaces it
(switch_screen). While one of the board's dialogs is open, the keys that change screens do
nothing (so a dialog is never lost under a new screen). Below MIN_SIZE a "terminal too small"
notice covers the screens.
"""

from __future__ import annotations

import gc
import importlib
import sys
import threading
from collections import deque
from pathlib import Path

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.reactive import var
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Input

from gpuctl import model
from gpuctl.console.commands import CommandsMixin
from gpuctl.console.frame_ack import FrameAckMixin
from gpuctl.console.keys import KeyOrderMixin
from gpuctl.console.polling import SPARK_POINTS, PollFailed, PollingMixin, SnapshotArrived  # noqa: F401 - gpuctl.app's names
from gpuctl.fleet.source import FleetSource
from gpuctl.screens.base import GpuctlScreen
from gpuctl.screens.fleet import FleetScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen
from gpuctl.screens.too_small import MIN_SIZE, TooSmallScreen
from gpuctl.screens.workers import run_in_daemon_thread  # noqa: F401 - also gpuctl.app's name for it
from gpuctl.themes import (
    DEFAULT_THEME,
    FALLBACK_THEME,
    GPUCTL_VARIABLES,
    UnknownThemeError,
    load_themes,
)
from gpuctl.widgets.fleet_rows import FleetRow
from gpuctl.widgets.palette import Palette, build_palette

#: Python GC thresholds while the console runs (gc.set_threshold): the default young
#: generations, full collections 10x rarer. Each poll of a large fleet allocates ~100k objects
#: that live one poll (freed by reference counting, not by the collector); with Python's default
#: (700, 10, 10) they set off full collections of the whole heap (~70 ms at 1024 GPUs, ~36 ms of
#: collections a second) inside refresh ticks; a larger young generation (50000) made each young
#: collection a 20-40 ms pause instead (bench/console.py, bench/RESULTS.md). The previous
#: thresholds are restored on exit.
CONSOLE_GC_THRESHOLD = (700, 10, 100)

#: The actions of the app's own keys (GpuctlApp.BINDINGS, all priority bindings).
KEY_ACTIONS = ("quit", "command_bar", "filter", "help", "refresh", "leases", "depts")

class GpuctlApp(FrameAckMixin, PollingMixin, KeyOrderMixin, CommandsMixin, App[None]):
    """The console. source: where the fleet comes from (called only from thread workers).
    readonly: no changing actions, READ-ONLY badge in the header. theme: a registered theme name
    (None: gpuctl-dark; UnknownThemeError listing the known names otherwise). refresh_s: seconds
    between the end of one poll and the start of the next (> 0). theme_dirs: where theme files are
    looked for (default gpuctl.themes.default_theme_dirs()).
    """

    CSS_PATH = "app.tcss"
    TITLE = "gpuctl"
    # The app's keys are priority bindings: each runs as the key is read, in the order typed.
    # A normal binding runs only after its key has bubbled up from the focused widget, while the
    # app goes on routing the keys behind it: `:` then `node x` typed fast sent `node x` to the
    # table and to the bindings (`d` opened the board), and `l` `:` ran `:` first. check_action
    # hands a key back to an Input that has the focus (it is typed there), to help (q, ?) and
    # to the board's dialogs (their d, r, y, n).
    BINDINGS = [
        Binding("q", "quit", "Quit", priority=True),
        Binding("colon", "command_bar", "Command", key_display=":", priority=True),
        Binding("slash", "filter", "Filter", key_display="/", priority=True),
        Binding("question_mark", "help", "Help", key_display="?", priority=True),
        Binding("r", "refresh", "Refresh", priority=True),
        Binding("l", "leases", "Leases", show=False, priority=True),
        Binding("d", "depts", "Departments", show=False, priority=True),
        # Enter and Escape in the `:` bar close it at once, so the keys typed after them act.
        Binding("enter", "command_bar_key('submit')", show=False, priority=True),
        Binding("escape", "command_bar_key('cancel')", show=False, priority=True),
    ]

    # The fleet screen is the base of the "fleet" mode (a mode, not get_default_screen, so that
    # Textual loads the screen's CSS_PATH).
    MODES = {"fleet": FleetScreen}
    DEFAULT_MODE = "fleet"

    snapshot: var[model.FleetSnapshot | None] = var(None, always_update=True)
    palette: var[Palette | None] = var(None, always_update=True)

    def __init__(
        self,
        source: FleetSource,
        *,
        readonly: bool = False,
        theme: str | None = None,
        refresh_s: float = 1.0,
        theme_dirs: list[Path] | None = None,
    ):
        if not refresh_s > 0:
            raise ValueError(f"refresh_s must be > 0 seconds, got {refresh_s!r}")
        super().__init__()
        self.source = source
        self.readonly = readonly
        self.refresh_s = refresh_s
        #: GPU UUID -> the SM utilization (%) of the last SPARK_POINTS polls, oldest first (None: N/A).
        self.sm_history: dict[str, tuple[float | None, ...]] = {}
        self._sm_deques: dict[str, deque[float | None]] = {}  # owned by the poll worker
        self._history_lock = threading.Lock()
        self._rows: tuple[model.FleetSnapshot | None, Palette | None, list[FleetRow]] = (None, None, [])
        self.flash_log: deque[str] = deque(maxlen=50)
        #: Why the console stopped on an error (panic), None while it did not.
        self.crash_message: str | None = None
        self.last_poll_error: str | None = None
        self._poll_timer: Timer | None = None
        self._too_small: TooSmallScreen | None = None
        self._focus_now = False
        self._bar_pending: tuple[GpuctlScreen, list[str], int] | None = None
        #: Keys read while an earlier key's work is not done yet (see _hold_keys).
        self._holding = False
        self._hold_serial = 0
        self._held_keys: deque[events.Key] = deque()
        #: Screens waiting for the terminal to answer that it drew their frame (console/frame_ack.py).
        self._frame_acks: deque = deque()
        loaded = load_themes(theme_dirs)
        self.theme_errors = loaded.errors
        for err in loaded.errors:
            print(f"gpuctl: theme skipped: {err}", file=sys.stderr)
        for t in loaded.themes.values():
            self.register_theme(t)
        default = DEFAULT_THEME if DEFAULT_THEME in self.available_themes else FALLBACK_THEME
        name = theme or default
        if name not in self.available_themes:
            raise UnknownThemeError(name, self.known_themes())
        self._initial_theme = name

    def known_themes(self) -> list[str]:
        """gpuctl's themes first (gpuctl-*, high-contrast, user files), then Textual's built-ins."""
        from textual.theme import BUILTIN_THEMES

        names = list(self.available_themes)
        own = sorted(n for n in names if n not in BUILTIN_THEMES)
        return own + sorted(n for n in names if n in BUILTIN_THEMES)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        """gpuctl's own CSS variables (gpuctl.themes.GPUCTL_VARIABLES) for themes that lack them."""
        return dict(GPUCTL_VARIABLES)

    def on_mount(self) -> None:
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(*CONSOLE_GC_THRESHOLD)
        self.theme = self._initial_theme
        self.palette = build_palette(self.get_css_variables(), self.source.departments)
        if not self.is_screen_installed("leases"):
            self.install_screen(LeasesScreen(), "leases")
        if not self.is_screen_installed("report"):
            from gpuctl.screens.report import ReportScreen

            self.install_screen(ReportScreen(), "report")
        self._install_board()
        for err in self.theme_errors:
            self.flash(f"theme skipped: {err}", severity="error")
        self._check_size()
        self.poll()

    def watch_theme(self, _theme: str) -> None:
        self.palette = build_palette(self.get_css_variables(), self.source.departments)

    def _install_board(self) -> None:
        """Install gpuctl.screens.board.BoardScreen() as "board" when that module exists. A board
        that fails to import or build is reported (stderr and a flash) and `:depts` says the board
        is not available; the rest of the console works on."""
        if self.is_screen_installed("board"):
            return
        try:
            module = importlib.import_module("gpuctl.screens.board")
            factory = getattr(module, "BoardScreen", None)
            if factory is not None:
                self.install_screen(factory(), "board")
        except ModuleNotFoundError as e:
            if e.name != "gpuctl.screens.board":
                self._board_failed(e)
        except Exception as e:  # noqa: BLE001 - a broken board must not take the console down
            self._board_failed(e)

    def _board_failed(self, error: Exception) -> None:
        message = f"board not available: {type(error).__name__}: {error}"
        print(f"gpuctl: {message}", file=sys.stderr)
        self.flash(message, severity="error")

    # -- flash, size ---------------------------------------------------------------------------

    def flash(self, message: str, *, severity: str = "information", timeout_s: float = 4.0) -> None:
        """A notification that clears itself after `timeout_s`; also kept in `flash_log`."""
        self.flash_log.append(message)
        self.notify(message, severity=severity, timeout=timeout_s, markup=False)  # type: ignore[arg-type]

    def on_resize(self, event: events.Resize) -> None:
        self._check_size(event.size.width, event.size.height)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Which of the app's actions a key may run now (False: the key goes on to the focused
        widget and the screen's bindings). In an Input the app's keys are typed; in help, q and
        ? are help's (close it); under a dialog (a modal other than help, the too-small notice
        included) only q quits: no screen is pushed over the notice, so it can always be taken
        away when the terminal grows, and a dialog is never lost under another screen."""
        if action == "command_bar_key":
            return self._focused_command_bar() is not None
        if action not in KEY_ACTIONS and action != "back":
            return True
        if action != "back" and isinstance(self.focused, Input):
            return False
        top = self.screen
        if isinstance(top, HelpScreen):
            return action not in ("quit", "help")
        if isinstance(top, ModalScreen) or self._too_small is not None:
            return action == "quit"
        if action == "filter":
            return callable(getattr(top, "action_filter", None))
        if action == "refresh" and callable(getattr(top, "action_reload", None)):
            return False  # `r` is the screen's own reload (:schedule, :audit)
        return True

    def _check_size(self, w: int | None = None, h: int | None = None) -> None:
        if w is None or h is None:
            w, h = self.size
        small = w < MIN_SIZE[0] or h < MIN_SIZE[1]
        if small and self._too_small is None:
            self._too_small = TooSmallScreen((w, h))
            self.push_screen(self._too_small)
        elif not small and self._too_small is not None:
            screen, self._too_small = self._too_small, None
            if self.screen is screen:
                self.pop_screen()

    async def action_quit(self) -> None:
        self.exit()

    # -- terminal input and crashes ----------------------------------------------------------------

    def get_driver_class(self):  # noqa: ANN201 - Textual's Type[Driver]
        """Textual's driver, except on Linux terminals: GuardedLinuxDriver (garbage input never
        types into inputs; a parser failure drops one read, see gpuctl.console.terminal_input)."""
        driver = super().get_driver_class()
        from textual.drivers.linux_driver import LinuxDriver

        if driver is LinuxDriver:
            from gpuctl.console.terminal_input import GuardedLinuxDriver

            return GuardedLinuxDriver
        return driver

    def on_terminal_input_dropped(self, message) -> None:  # noqa: ANN001 - TerminalInputDropped
        """Input the terminal driver dropped: say so (it never reached an input)."""
        if message.error:
            self.flash(f"terminal input dropped: {message.error}", severity="error")
        else:
            n = message.count
            self.flash(f"terminal input dropped: {n} malformed escape sequence{'s' if n != 1 else ''}"
                       f" {message.sample!r}", severity="warning")

    def panic(self, *renderables) -> None:  # noqa: ANN002 - Rich renderables
        """Textual's panic (the input thread died, ...): the app exits with the message shown
        and a non-zero return code (gpuctl then exits FAILURE), never 0."""
        if self._return_code in (None, 0):
            self._return_code = 1
        if self.crash_message is None:
            self.crash_message = "; ".join(_crash_text(r) for r in renderables) or "an unexpected error"
        super().panic(*renderables)

    def on_unmount(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.stop()
        if getattr(self, "_gc_threshold", None):
            gc.set_threshold(*self._gc_threshold)


def _crash_text(renderable: object) -> str:
    """"ZeroDivisionError: float division by zero" for a Rich Traceback (what Textual's driver
    panics with), the text itself for a string."""
    stacks = getattr(getattr(renderable, "trace", None), "stacks", None)
    if stacks:
        return f"{stacks[-1].exc_type}: {stacks[-1].exc_value}"
    return str(renderable)


def build_app(
    source: FleetSource,
    *,
    readonly: bool = False,
    theme: str | None = None,
    refresh_s: float = 1.0,
    theme_dirs: list[Path] | None = None,
) -> GpuctlApp:
    """The console for `source` (see GpuctlApp). Raises UnknownThemeError (a ValueError, message
    listing the known themes) for an unknown `theme`, ValueError for refresh_s <= 0."""
    return GpuctlApp(source, readonly=readonly, theme=theme, refresh_s=refresh_s, theme_dirs=theme_dirs)
