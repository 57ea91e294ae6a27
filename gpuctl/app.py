"""The gpuctl console: a Textual app over a FleetSource.

`build_app(source, readonly=..., theme=...)` is the one factory the CLI and the tests use.

Data flow: a thread worker (group "poll") calls source.snapshot() (blocking, network) and posts
SnapshotArrived; the UI thread stores it in the `snapshot` var, appends each GPU's SM utilization
to `sm_history` (the last SPARK_POINTS values the console saw) and schedules the next poll as a
one-shot timer `refresh_s` after this one finished, so polls never pile up. Screens re-render
from `snapshot`; nothing on the UI thread does I/O.

Screens: fleet (default, `:nodes`), node detail (`:node NAME`, Enter), leases (`:leases`), help
(`?`), the department board (`:depts`) when a screen named "board" is installed: the app installs
gpuctl.screens.board.BoardScreen() under that name when that module exists, and a caller may
install one with app.install_screen(screen, "board"). Below MIN_SIZE a "terminal too small"
notice covers the screens.
"""

from __future__ import annotations

import gc
import importlib
import sys
import threading
from collections import deque
from pathlib import Path

from textual import events, work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.reactive import var
from textual.timer import Timer

from gpuctl import model
from gpuctl.fleet_source import FleetSource
from gpuctl.screens.fleet import FleetScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen
from gpuctl.screens.node_detail import NodeDetailScreen
from gpuctl.screens.too_small import MIN_SIZE, TooSmallScreen
from gpuctl.themes import (
    DEFAULT_THEME,
    FALLBACK_THEME,
    GPUCTL_VARIABLES,
    UnknownThemeError,
    load_themes,
)
from gpuctl.widgets.command_bar import CommandBar
from gpuctl.widgets.fleet_rows import FleetRow, fleet_rows
from gpuctl.widgets.palette import Palette, build_palette

#: SM utilization values kept per GPU for the fleet table's sparkline (one per poll).
SPARK_POINTS = 60

#: Python GC thresholds while the console runs (gc.set_threshold): the default young
#: generations, full collections 10x rarer. Each poll of a large fleet allocates ~100k objects
#: that live one poll (freed by reference counting, not by the collector); with Python's default
#: (700, 10, 10) they set off full collections of the whole heap (~70 ms at 1024 GPUs, ~36 ms of
#: collections a second) inside refresh ticks; a larger young generation (50000) made each young
#: collection a 20-40 ms pause instead (bench/console.py, bench/RESULTS.md). The previous
#: thresholds are restored on exit.
CONSOLE_GC_THRESHOLD = (700, 10, 100)


class SnapshotArrived(Message):
    """A poll finished: the fleet snapshot, the SM utilization history (GPU UUID -> values, oldest
    first) and the fleet-table rows built from them with `palette` (off the UI thread)."""

    def __init__(
        self,
        snapshot: model.FleetSnapshot,
        sm_history: dict[str, tuple[float | None, ...]],
        rows: list[FleetRow],
        palette: Palette | None,
    ):
        super().__init__()
        self.snapshot = snapshot
        self.sm_history = sm_history
        self.rows = rows
        self.palette = palette


class PollFailed(Message):
    """A poll raised (the source itself failed, not one node): `error` says why."""

    def __init__(self, error: str):
        super().__init__()
        self.error = error


class GpuctlApp(App[None]):
    """The console. source: where the fleet comes from (called only from thread workers).
    readonly: no changing actions, READ-ONLY badge in the header. theme: a registered theme name
    (None: gpuctl-dark; UnknownThemeError listing the known names otherwise). refresh_s: seconds
    between the end of one poll and the start of the next (> 0). theme_dirs: where theme files are
    looked for (default gpuctl.themes.default_theme_dirs()).
    """

    CSS_PATH = "app.tcss"
    TITLE = "gpuctl"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("colon", "command_bar", "Command", key_display=":"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("r", "refresh", "Refresh"),
        Binding("l", "leases", "Leases", show=False),
        Binding("d", "depts", "Departments", show=False),
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
        self.last_poll_error: str | None = None
        self._poll_timer: Timer | None = None
        self._too_small: TooSmallScreen | None = None
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

    # -- polling -------------------------------------------------------------------------------

    def poll(self) -> None:
        """Start a poll now (a pending timer is cancelled; a running poll is replaced)."""
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = None
        self._poll_worker()

    @work(thread=True, exclusive=True, exit_on_error=False, group="poll")
    def _poll_worker(self) -> None:
        try:
            snapshot = self.source.snapshot()
        except Exception as e:  # noqa: BLE001 - any failure of the source is shown, never raised
            self.post_message(PollFailed(f"{type(e).__name__}: {e}"))
            return
        history = self._record_history(snapshot)
        palette = self.palette
        rows = fleet_rows(snapshot, history, palette) if palette is not None else []
        self.post_message(SnapshotArrived(snapshot, history, rows, palette))

    def _record_history(self, snapshot: model.FleetSnapshot) -> dict[str, tuple[float | None, ...]]:
        """Append each GPU's SM utilization to its deque (N/A and GPU errors as None); forget GPUs
        gone from a fully reachable fleet. Runs in the poll worker; returns immutable copies."""
        with self._history_lock:
            deques = self._sm_deques
            seen = set()
            for node in snapshot.nodes:
                for gpu in node.gpus:
                    seen.add(gpu.uuid)
                    hist = deques.get(gpu.uuid)
                    if hist is None:
                        hist = deques[gpu.uuid] = deque(maxlen=SPARK_POINTS)
                    s = gpu.sample
                    hist.append(None if s is None or s.error else s.sm_util_pct)
            if all(n.reachable for n in snapshot.nodes):
                for uuid in [u for u in deques if u not in seen]:
                    del deques[uuid]
            return {uuid: tuple(d) for uuid, d in deques.items()}

    def rows_for(self, snapshot: model.FleetSnapshot) -> list[FleetRow]:
        """The fleet-table rows (unfiltered) of `snapshot` in the current palette: the ones the poll
        worker built when they match, else built now (after a theme change)."""
        snap, palette, rows = self._rows
        if snap is not snapshot or palette is not self.palette:
            assert self.palette is not None
            rows = fleet_rows(snapshot, self.sm_history, self.palette)
            self._rows = (snapshot, self.palette, rows)
        return rows

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        self.sm_history = message.sm_history
        self._rows = (message.snapshot, message.palette, message.rows)
        if self.last_poll_error is not None:
            self.last_poll_error = None
            self.flash("fleet polling works again")
        self.snapshot = message.snapshot
        self._schedule_poll()

    def on_poll_failed(self, message: PollFailed) -> None:
        if message.error != self.last_poll_error:
            self.flash(f"fleet poll failed: {message.error}", severity="error")
        self.last_poll_error = message.error
        self._schedule_poll()

    def _schedule_poll(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.stop()
        self._poll_timer = self.set_timer(self.refresh_s, self.poll, name="gpuctl-poll")

    # -- flash, size ---------------------------------------------------------------------------

    def flash(self, message: str, *, severity: str = "information", timeout_s: float = 4.0) -> None:
        """A notification that clears itself after `timeout_s`; also kept in `flash_log`."""
        self.flash_log.append(message)
        self.notify(message, severity=severity, timeout=timeout_s, markup=False)  # type: ignore[arg-type]

    def on_resize(self, event: events.Resize) -> None:
        self._check_size(event.size.width, event.size.height)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While the terminal is too small only quitting works (no screen is pushed over the
        notice, so it can always be taken away when the terminal grows)."""
        if self._too_small is not None and action in ("command_bar", "help", "leases", "depts", "back"):
            return False
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

    # -- navigation and commands ---------------------------------------------------------------

    def _to_base(self) -> None:
        while len(self.screen_stack) > 1 and not isinstance(self.screen, TooSmallScreen):
            self.pop_screen()

    def open_node(self, name: str) -> bool:
        """Push the detail of node `name`; flash and return False when the fleet has no such node."""
        snapshot = self.snapshot
        if snapshot is not None and snapshot.node(name) is None:
            known = ", ".join(n.name for n in snapshot.nodes[:8])
            more = " …" if len(snapshot.nodes) > 8 else ""
            self.flash(f"unknown node {name!r} (nodes: {known}{more})", severity="error")
            return False
        self.push_screen(NodeDetailScreen(name))
        return True

    def action_back(self) -> None:
        if len(self.screen_stack) > 1:
            self.pop_screen()

    def action_command_bar(self) -> None:
        names = [f"node {n.name}" for n in self.snapshot.nodes] if self.snapshot else []
        self.push_screen(CommandBar(names), self._command_entered)

    def _command_entered(self, text: str | None) -> None:
        if text:
            self.run_command(text)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def action_refresh(self) -> None:
        self.poll()

    def action_leases(self) -> None:
        self.run_command("leases")

    def action_depts(self) -> None:
        self.run_command("depts")

    def run_command(self, text: str) -> bool:
        """Run a `:` command: nodes, depts (board), leases, node NAME, theme NAME, help, q/quit.
        Returns False (and flashes a message naming it) for an unknown or malformed command."""
        words = text.strip().removeprefix(":").split()
        if not words:
            return False
        verb, args = words[0].lower(), words[1:]
        if verb in ("q", "quit", "q!"):
            self.exit()
        elif verb in ("nodes", "no"):
            self._to_base()
        elif verb == "node":
            if len(args) != 1:
                self.flash("usage: :node NAME", severity="error")
                return False
            return self.open_node(args[0])
        elif verb in ("depts", "dept", "departments", "board"):
            if not self.is_screen_installed("board"):
                self.flash("board not available", severity="warning")
                return False
            self._to_base()
            self.push_screen("board")
        elif verb in ("leases", "lease"):
            self._to_base()
            self.push_screen(LeasesScreen())
        elif verb == "help":
            self.action_help()
        elif verb == "theme":
            if len(args) != 1 or args[0] not in self.available_themes:
                self.flash(
                    f"unknown theme {' '.join(args)!r}; known: {', '.join(self.known_themes())}",
                    severity="error",
                )
                return False
            self.theme = args[0]
        else:
            self.flash(f"unknown command: {text.strip()!r} (try :nodes :depts :leases :node NAME :q)", severity="error")
            return False
        return True

    async def action_quit(self) -> None:
        self.exit()

    def on_unmount(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.stop()
        if getattr(self, "_gc_threshold", None):
            gc.set_threshold(*self._gc_threshold)


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
