"""The gpuctl console: a Textual app over a FleetSource.

`build_app(source, readonly=..., theme=...)` is the one factory the CLI and the tests use.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from textual import events, work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.reactive import var
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Input

from gpuctl import model
from gpuctl.fleet.source import FleetSource
from gpuctl.screens.base import GpuctlScreen
from gpuctl.screens.fleet import FleetScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen
from gpuctl.screens.node_detail import NodeDetailScreen
from gpuctl.screens.too_small import MIN_SIZE, TooSmallScreen
from gpuctl.screens.workers import run_in_daemon_thread  # noqa: F401 - also gpuctl.app's name for it
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

#: The actions of the app's own keys (GpuctlApp.BINDINGS, all priority bindings).
KEY_ACTIONS = ("quit", "command_bar", "filter", "help", "refresh", "leases", "depts")

#: While a just-pushed screen's `:` bar is not composed yet, retry opening it every BAR_RETRY_S
#: seconds, at most BAR_RETRIES times, holding the keys typed meanwhile.
BAR_RETRY_S = 0.01
BAR_RETRIES = 200
#: Longest time keys are held back waiting for the work of an earlier key (App._hold_keys).
HOLD_MAX_S = 3.0

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

    # -- polling -------------------------------------------------------------------------------

    def poll(self) -> None:
        """Start a poll now (a pending timer is cancelled; a running poll is replaced)."""
        if self._poll_timer is not None:
            self._poll_timer.stop()
            self._poll_timer = None
        self._poll_worker()

    @work(exclusive=True, exit_on_error=False, group="poll")
    async def _poll_worker(self) -> None:
        message = await run_in_daemon_thread(self._poll_once, name="gpuctl-poll")
        self.post_message(message)

    def _poll_once(self) -> SnapshotArrived | PollFailed:
        """One poll (on the poll's daemon thread): the snapshot, the SM history and the fleet
        rows, or why the source failed."""
        try:
            snapshot = self.source.snapshot()
        except Exception as e:  # noqa: BLE001 - any failure of the source is shown, never raised
            return PollFailed(f"{type(e).__name__}: {e}")
        history = self._record_history(snapshot)
        palette = self.palette
        rows = fleet_rows(snapshot, history, palette) if palette is not None else []
        return SnapshotArrived(snapshot, history, rows, palette)

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

    def show_screen(self, name: str) -> None:
        """Make the installed screen `name` ("leases", "board") the top of the stack: nothing when
        it already is (shown, or pushed and still mounting); pop down to it when it is lower in
        the stack; else pop to the fleet screen and push it by name."""
        screen = self.get_screen(name)
        if self.screen is screen:
            return
        if screen in self.screen_stack:
            while self.screen is not screen and len(self.screen_stack) > 1:
                if isinstance(self.screen, TooSmallScreen):
                    return
                self.pop_screen()
            return
        self._to_base()
        self.push_screen(name)

    def open_node(self, name: str, gpu_uuid: str | None = None) -> bool:
        """Show the detail of node `name` (with GPU `gpu_uuid` selected when given): nothing when
        it is already the top screen, replacing the top screen when that is another node's detail,
        else pushed. Flashes and returns False when the fleet has no such node."""
        snapshot = self.snapshot
        if snapshot is not None and snapshot.node(name) is None:
            known = ", ".join(n.name for n in snapshot.nodes[:8])
            more = " …" if len(snapshot.nodes) > 8 else ""
            self.flash(f"unknown node {name!r} (nodes: {known}{more})", severity="error")
            return False
        top = self.screen
        if isinstance(top, NodeDetailScreen):
            if top.node_name != name:
                self.switch_screen(NodeDetailScreen(name))
        else:
            self.push_screen(NodeDetailScreen(name))
        detail = self.screen_stack[-1]
        if gpu_uuid is not None and isinstance(detail, NodeDetailScreen) and detail.node_name == name:
            if detail.is_mounted:
                detail.select_gpu(gpu_uuid)
            else:
                detail.selected_uuid = gpu_uuid
        return True

    def action_back(self) -> None:
        if len(self.screen_stack) > 1:
            self.pop_screen()

    def action_command_bar(self) -> None:
        """`:`: open the command bar of the top gpuctl screen (closing help first), its Input
        focused at once so the keys typed right after `:` go into it."""
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        screen = self.screen
        if isinstance(screen, GpuctlScreen):
            names = [f"node {n.name}" for n in self.snapshot.nodes] if self.snapshot else []
            if not screen.open_command_bar(names):
                # The screen was pushed a moment ago and its bar is not composed yet: hold the
                # keys typed from now on and hand them to the bar once it opens.
                self._bar_pending = (screen, names, 0)
                self._hold_keys()
                self.set_timer(BAR_RETRY_S, self._open_pending_bar)

    # -- keys in the order typed -------------------------------------------------------------------

    def _hold_keys(self) -> None:
        """Keep the keys read from now on (in order) until _release_keys: the work of the key
        before them finishes on another widget's queue first. Released after HOLD_MAX_S at the
        latest (a widget that went away never finishes)."""
        self._holding = True
        self._hold_serial += 1
        serial = self._hold_serial

        async def expire() -> None:
            if self._holding and self._hold_serial == serial:
                await self._release_keys()

        self.set_timer(HOLD_MAX_S, expire)

    async def _release_keys(self) -> None:
        """Handle the held keys in the order they came (stopping if one of them holds again)."""
        self._holding = False
        while self._held_keys and not self._holding:
            await App.on_event(self, self._held_keys.popleft())

    async def on_event(self, event: events.Event) -> None:
        if self._holding and isinstance(event, events.Key):
            self._held_keys.append(event)
            return
        await super().on_event(event)

    async def _open_pending_bar(self) -> None:
        """Retry opening the bar held by action_command_bar; once it is open (or the screen is
        gone, or BAR_RETRIES ran out) the held keys are handled in the order they came."""
        if self._bar_pending is None:
            return
        screen, names, tries = self._bar_pending
        if screen is self.screen and not screen.open_command_bar(names) and tries < BAR_RETRIES:
            self._bar_pending = (screen, names, tries + 1)
            self.set_timer(BAR_RETRY_S, self._open_pending_bar)
            return
        self._bar_pending = None
        await self._release_keys()

    def action_filter(self) -> None:
        """`/`: the top screen's filter (its action_filter), with the focus moved at once."""
        action = getattr(self.screen, "action_filter", None)
        if callable(action):
            with self._immediate_focus():
                action()

    @contextmanager
    def _immediate_focus(self) -> Iterator[None]:
        """Inside: Widget.focus() moves the focus now instead of on the app's next idle."""
        self._focus_now = True
        try:
            yield
        finally:
            self._focus_now = False

    def call_later(self, callback, *args, **kwargs) -> bool:  # noqa: ANN001
        # Widget.focus() defers its move with app.call_later(set_focus, widget); under
        # _immediate_focus it runs now (any other callback, or another Textual, is deferred).
        if self._focus_now and getattr(callback, "__qualname__", "") == "Widget.focus.<locals>.set_focus":
            callback(*args, **kwargs)
            return True
        return super().call_later(callback, *args, **kwargs)

    def _focused_command_bar(self) -> CommandBar | None:
        focused = self.focused
        bar = focused.parent if isinstance(focused, Input) else None
        return bar if isinstance(bar, CommandBar) and bar.is_open else None

    def action_command_bar_key(self, key: str) -> None:
        """Enter ("submit": the command runs now) or Escape ("cancel") in the `:` bar, handled
        as the key is read, so that the keys typed after it act after it."""
        bar = self._focused_command_bar()
        if bar is None:
            return
        if key == "submit":
            # The characters typed before Enter may still wait on the Input's queue: read the
            # command behind them, and hold the keys typed after Enter until it has run.
            self._hold_keys()
            bar.input.call_later(self._submit_bar, bar)
        else:
            bar.action_cancel()

    def _submit_bar(self, bar: CommandBar) -> None:
        """(On the Input's queue, after the characters typed before Enter.)"""
        text = bar.take()
        self.call_later(self._run_submitted, text)

    async def _run_submitted(self, text: str) -> None:
        try:
            if text:
                self.run_command(text)
        finally:
            await self._release_keys()

    def on_command_bar_submitted(self, message: CommandBar.Submitted) -> None:
        if message.text:
            self.run_command(message.text)

    def _help_screen_classes(self) -> list[type]:
        """The screen classes whose keys the help lists, in order: fleet, the board when
        installed, node detail, leases."""
        classes: list[type] = [FleetScreen]
        if self.is_screen_installed("board"):
            classes.append(type(self.get_screen("board")))
        return classes + [NodeDetailScreen, LeasesScreen]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen, screen_classes=self._help_screen_classes()))

    def action_refresh(self) -> None:
        self.poll()

    def action_leases(self) -> None:
        self.run_command("leases")

    def action_depts(self) -> None:
        self.run_command("depts")

    def run_command(self, text: str) -> bool:
        """Run a `:` command: nodes, depts (board), leases, report, history, schedule, audit,
        node NAME, theme NAME, help, q/quit.
        Returns False (and flashes a message naming it) for an unknown or malformed command."""
        words = text.strip().removeprefix(":").split()
        if not words:
            return False
        verb, args = words[0].lower(), words[1:]
        if verb in ("q", "quit", "q!"):
            self.exit()
        elif verb in ("nodes", "no", "fleet"):
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
            self.show_screen("board")
        elif verb in ("leases", "lease"):
            self.show_screen("leases")
        elif verb in ("report", "usage"):
            self.show_screen("report")
        elif verb == "history":
            from gpuctl.screens.usage_history import screen_for_command

            screen = screen_for_command(self.screen, self.snapshot, args)
            if isinstance(screen, str):
                self.flash(screen, severity="error")
                return False
            self.push_screen(screen)
        elif verb in ("schedule", "sched"):
            return self._open_schedule_screen("schedule")
        elif verb == "audit":
            return self._open_schedule_screen("audit")
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
            self.flash(f"unknown command: {text.strip()!r} (try :nodes :depts :leases :schedule :audit "
                       f":node NAME :q)", severity="error")
            return False
        return True

    def schedule_service(self) -> Any | None:
        """The fleet's schedule and audit service (gpuctl.fleet.schedule.FleetSchedule over the
        source's FleetClient, the CLI's services), or None when the source has no client (then
        `:schedule` and `:audit` say so)."""
        client = getattr(self.source, "client", None)
        if client is None:
            return None
        from gpuctl.fleet.schedule import FleetSchedule

        return FleetSchedule(client)

    def _open_schedule_screen(self, which: str) -> bool:
        """`:schedule` / `:audit`: push the screen over the fleet screen (a second `:schedule`
        while it is on top does nothing)."""
        from gpuctl.screens.audit import AuditScreen
        from gpuctl.screens.schedule import ScheduleScreen

        kind = ScheduleScreen if which == "schedule" else AuditScreen
        if isinstance(self.screen, kind):
            return True
        service = self.schedule_service()
        if service is None:
            self.flash(f":{which}: this fleet source keeps no schedule (no node connections)", severity="warning")
            return False
        self._to_base()
        if which == "schedule":
            self.push_screen(ScheduleScreen(service, readonly=self.readonly))
        else:
            self.push_screen(AuditScreen(service.audit))
        return True

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
