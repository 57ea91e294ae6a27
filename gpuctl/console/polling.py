"""The console's poll loop (a mixin of gpuctl.app.GpuctlApp).

A thread worker (group "poll") calls source.snapshot() (blocking, network) on a daemon thread of
its own (gpuctl.screens.workers.run_in_daemon_thread: quitting never waits on a slow node) and
posts SnapshotArrived with the SM history, the fleet-table rows and the fleet table's view (the
rows filtered, laid out and diffed for the spec the fleet screen last set in `fleet_view_spec`:
gpuctl.widgets.fleet_view) and the header's totals, all built off the UI thread, or PollFailed;
the UI thread stores them and schedules the next poll as a one-shot timer `refresh_s` after this
one finished, so polls never pile up.
"""

from __future__ import annotations

import gc
from collections import deque

from textual import work
from textual.message import Message

from gpuctl import model
from gpuctl.screens.workers import run_in_daemon_thread
from gpuctl.widgets.fleet_rows import FleetRow, fleet_rows
from gpuctl.widgets.fleet_view import FleetView, FleetViewSpec, build_fleet_view
from gpuctl.widgets.header import totals_parts
from gpuctl.widgets.palette import Palette

#: SM utilization values kept per GPU for the fleet table's sparkline (one per poll).
SPARK_POINTS = 60


class SnapshotArrived(Message):
    """A poll finished: the fleet snapshot, the SM utilization history (GPU UUID -> values, oldest
    first), the fleet-table rows built from them with `palette` and the fleet table's view of
    them (None when the fleet screen set no spec yet), all built off the UI thread."""

    def __init__(
        self,
        snapshot: model.FleetSnapshot,
        sm_history: dict[str, tuple[float | None, ...]],
        rows: list[FleetRow],
        palette: Palette | None,
        fleet_view: FleetView | None = None,
    ):
        super().__init__()
        self.snapshot = snapshot
        self.sm_history = sm_history
        self.rows = rows
        self.palette = palette
        self.fleet_view = fleet_view


class PollFailed(Message):
    """A poll raised (the source itself failed, not one node): `error` says why."""

    def __init__(self, error: str):
        super().__init__()
        self.error = error


class PollingMixin:
    """The poll loop of GpuctlApp (see the module doc). Uses the app's source, palette, refresh_s,
    flash and the state GpuctlApp.__init__ sets (_sm_deques, _history_lock, _rows, _poll_timer,
    last_poll_error)."""

    #: What the fleet screen shows (its filter, layout, column keys): set by the screen on the UI
    #: thread, read by the poll worker, which builds each poll's FleetView for it.
    fleet_view_spec: FleetViewSpec | None = None
    #: The last view delivered to the UI thread (see fleet_view_for).
    _fleet_view: FleetView | None = None
    #: The last view the poll worker built: the base of the next one's diff (poll thread only;
    #: polls run one at a time).
    _fleet_view_built: FleetView | None = None

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
        view = None
        spec = self.fleet_view_spec
        if palette is not None and spec is not None:
            view = build_fleet_view(rows, spec, palette, snapshot, self._fleet_view_built)
            self._fleet_view_built = view
            # the header's figures, remembered by totals_parts for the UI thread's call
            totals_parts(snapshot, list(getattr(self.source, "departments", None) or []), palette)
        # The poll's new objects (rows, cells, view: ~100k at 4096 GPUs) would otherwise be traced
        # by the next young collections, wherever they start: often on the UI thread, inside a
        # tick (1-18 ms each). Collect the young generations here, off the UI thread.
        gc.collect(1)
        return SnapshotArrived(snapshot, history, rows, palette, view)

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

    def fleet_view_for(self, snapshot: model.FleetSnapshot) -> FleetView | None:
        """The fleet table's view the poll worker built for `snapshot` (None when it built none:
        no spec yet, or another snapshot). The caller checks its spec and palette."""
        view = self._fleet_view
        return view if view is not None and view.snapshot is snapshot else None

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        self.sm_history = message.sm_history
        self._rows = (message.snapshot, message.palette, message.rows)
        self._fleet_view = message.fleet_view
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
