"""The department board (`:depts`): a column per department plus "unassigned", a card per slice.

Reading it: each column's title is the department; under it its totals (GPU-equivalents, memory
quota, leased/free slices, mean SM utilization of its slices over the last minute); each card is a
slice (node, GPU index, fraction, live SM utilization, free or 🔒 leased with the lease's owner).

Moving slices, by mouse: drag a card onto another column (a drag of a selected card carries the
whole selection; shift-click or space selects); by keyboard: arrows move between cards and
columns, space selects, `m` picks a department from a list. Both ask for confirmation
(MoveConfirmScreen; leased slices offer drain / revoke / cancel) and then post one message,
:class:`BoardScreen.MoveRequested`, whose handler sends one gpuctl.fleet.reassign.ReassignRequest per
source department through the app's FleetSource (``source.reassign``, the same service as
`gpuctl reassign`) in a thread worker. Cards show "moving → dst…" until a snapshot shows the new
owner (then a notification says it is done) or the error is notified. In read-only mode
(``app.readonly``) drops and `m` are refused with a notification. Enter opens the node detail of
the focused card's node.

Scale: a column's cards are one widget (gpuctl.widgets.board_cards.CardList, Textual's Line API)
that draws only the rows in view, so opening the board mounts a handful of widgets whatever the
fleet's size, and a snapshot costs a diff of the slices plus the repaint of the cards in view
(bench/board.py measures both). The focused slice is the cursor of the focused column.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import HorizontalScroll
from textual.geometry import Offset
from textual.message import Message
from textual.widgets import Input, Static

from gpuctl import model
from gpuctl.fleet.reassign import ReassignRequest, new_request_id
from gpuctl.screens.base import GpuctlScreen
from gpuctl.screens.move_dialog import DepartmentPickerScreen, MoveConfirmScreen
from gpuctl.widgets.board_cards import CARD_PITCH, CardList, CardMarks, card_text
from gpuctl.widgets.board_columns import DepartmentColumn, color_class, own_color
from gpuctl.widgets.board_model import (
    SliceView,
    UtilWindow,
    column_names,
    column_totals,
    group_by_source,
    move_summary,
    scheduled_flows,
    slice_views,
    unreachable_nodes,
)
from gpuctl.widgets.drag import DragController, DragGhost, Draggable

__all__ = ["BoardDrag", "BoardScreen", "CARD_PITCH", "COLUMN_MIN_WIDTH", "amount"]

#: Narrowest column (cells, borders included); below it the board scrolls horizontally.
COLUMN_MIN_WIDTH = 30
#: Seconds between two reads of the fleet's schedule (the "24h: +1 −0.5 GPU" line of each column).
SCHEDULE_REFRESH_S = 60.0


@dataclass(frozen=True)
class BoardDrag:
    """What a drag on the board carries: the slices being moved (board order)."""

    views: tuple[SliceView, ...]


def amount(views: Sequence[SliceView]) -> str:
    """"node-01 GPU 3 ½" for one slice, "2 slices (1.5 GPU)" for more."""
    if len(views) == 1:
        return views[0].label()
    return f"{len(views)} slices ({sum(v.fraction for v in views):g} GPU)"


class BoardScreen(GpuctlScreen):
    """The department board (see the module doc). Uses the app's `source` (FleetSource with
    `departments` and `reassign`), `snapshot`, `readonly`, `flash`, `poll` and `open_node` when
    present."""

    VIEW = "departments"
    CSS_PATH = "board.tcss"
    BINDINGS = [
        Binding("space", "toggle_select", "Select"),
        Binding("m", "move", "Move to…"),
        # read-only: `m` is left out of the footer (check_action) and only says why it does nothing
        Binding("m", "move_readonly", show=False),
        Binding("enter", "open_node", "Node detail"),
        Binding("escape", "escape", "Back / cancel"),
    ]

    class MoveRequested(Message):
        """Move `slice_ids` to department `dst`. sources: (slice id, owning department) pairs as
        the board saw them; leased: "refuse", "drain" or "revoke" (gpuctl.fleet.reassign)."""

        def __init__(self, slice_ids: tuple[str, ...], sources: tuple[tuple[str, str], ...], dst: str,
                     leased: str = "refuse") -> None:
            super().__init__()
            self.slice_ids = slice_ids
            self.sources = sources
            self.dst = dst
            self.leased = leased

    def __init__(self, *, name: str | None = None, id: str | None = None):
        super().__init__(name=name, id=id)
        self.util_window = UtilWindow()
        self.drag_controller: DragController | None = None
        self._columns: dict[str, DepartmentColumn] = {}
        self._views: dict[str, SliceView] = {}
        self._by_column: dict[str, list[str]] = {}
        self._column_order: list[str] = []
        self._marks = CardMarks()
        self._selected = self._marks.selected
        self._moving = self._marks.moving  # slice id -> destination, until a snapshot shows it
        self._unreachable: list[str] = []
        self._ghost = DragGhost("", markup=False)
        self._window_seen: model.FleetSnapshot | None = None
        #: The schedule entries last read (gpuctl.fleet.schedule.entries), [] before / without any.
        self.schedule_entries: list[dict[str, Any]] = []
        self._nodes_down = (0, False)
        #: Snapshots drawn (show_snapshot calls that reached the columns).
        self.snapshots_shown = 0

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: `m Move to…` is not offered (hidden from the footer); its key only flashes
        why. Otherwise the read-only twin is the hidden one."""
        readonly = bool(getattr(self.app, "readonly", False))
        if action == "move":
            return not readonly
        if action == "move_readonly":
            return readonly
        return True

    def action_move_readonly(self) -> None:
        self._flash("read-only mode: moving slices is disabled", severity="warning")

    # -- composition and data ------------------------------------------------------------------

    def compose_body(self) -> ComposeResult:
        yield Static("", id="board-status", markup=False)
        yield HorizontalScroll(id="board-columns")
        yield self._ghost

    async def on_mount(self) -> None:
        self.drag_controller = DragController(self, self._ghost, self._payload_for)
        self.watch(self.app, "snapshot", self._record_utilization, init=True)
        await self._ensure_columns(column_names(self._departments()))
        self.load_schedule()
        self.set_interval(SCHEDULE_REFRESH_S, self.load_schedule, name="board-schedule")
        # GpuctlScreen.on_mount runs after this one (Textual calls each class's handler).

    def load_schedule(self) -> None:
        """Read the fleet's schedule entries in a thread worker (the host's schedule_service,
        the CLI's gpuctl.fleet.schedule.FleetSchedule); nothing when the source has none."""
        service_for = getattr(self.app, "schedule_service", None)
        service = service_for() if callable(service_for) else None
        if service is not None:
            self._read_schedule(service)

    @work(thread=True, exclusive=True, exit_on_error=False, group="board-schedule")
    def _read_schedule(self, service: Any) -> None:
        try:
            entries, _errors = service.entries()
        except Exception:  # noqa: BLE001 - no schedule line then; the schedule screen says why
            return
        self.app.call_from_thread(self._schedule_read, entries)

    def _schedule_read(self, entries: list[dict[str, Any]]) -> None:
        self.schedule_entries = list(entries)
        self._data_changed()

    def _departments(self) -> list[model.Department]:
        return list(self.host.source.departments)

    def _record_utilization(self, snapshot: model.FleetSnapshot | None = None) -> None:
        snapshot = self.host.snapshot
        if snapshot is not None and snapshot is not self._window_seen:
            self._window_seen = snapshot
            self.util_window.add(snapshot)

    def _variables(self) -> dict[str, str]:
        palette = self.host.palette
        return dict(palette.colors) if palette is not None else {}

    def _ensure_columns(self, names: list[str]) -> AwaitComplete:
        """Mount columns missing from `names` (in its order; unassigned stays last); the result
        may be awaited for their mounting to finish."""
        mounts = []
        container = self.query_one("#board-columns", HorizontalScroll)
        colors = {d.name: d.color for d in self._departments()}
        variables = self._variables()
        index = {name: i for i, name in enumerate(n for n in names if n != model.UNASSIGNED)}
        for name in names:
            if name in self._columns:
                continue
            css = color_class(name, -1 if name == model.UNASSIGNED else index[name], colors.get(name))
            column = DepartmentColumn(name, css, self._marks, own_color(colors.get(name), variables))
            self._columns[name] = column
            before = self._columns.get(model.UNASSIGNED) if name != model.UNASSIGNED else None
            if before is not None and before.parent is container:
                mounts.append(container.mount(column, before=before))
            else:
                mounts.append(container.mount(column))
        self._column_order = [n for n in names if n in self._columns] + [
            n for n in self._columns if n not in names
        ]
        self._fit_columns()
        return AwaitComplete(*mounts)

    def palette_changed(self) -> None:
        """A new theme: redraw the cards with its colors and re-resolve configured colors."""
        colors = {d.name: d.color for d in self._departments()}
        variables = self._variables()
        for name, column in self._columns.items():
            column.set_color(own_color(colors.get(name), variables))
            column.body.clear_cache()
            column.body.refresh()

    def _fit_columns(self) -> None:
        """Share the board's width between the columns, none narrower than COLUMN_MIN_WIDTH
        (then the board scrolls horizontally)."""
        if not self._columns:
            return
        try:
            width = self.query_one("#board-columns", HorizontalScroll).size.width or self.size.width
        except Exception:  # noqa: BLE001 - before compose
            return
        n = len(self._columns)
        each, extra = divmod(max(width, 0), n)
        for i, name in enumerate(self._column_order or list(self._columns)):
            column = self._columns.get(name)
            if column is not None:
                column.styles.width = max(COLUMN_MIN_WIDTH, each + (1 if i < extra else 0))

    def on_resize(self) -> None:
        self._fit_columns()

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        """Diff `snapshot` into the board (UI thread; no I/O): each column gets its slices (a
        column repaints only when one of its slices changed, and then only the cards in view)."""
        self._record_utilization(snapshot)
        views = slice_views(snapshot)
        new_views = {v.slice_id: v for v in views}
        by_column: dict[str, list[SliceView]] = {}
        for v in views:
            by_column.setdefault(v.department, []).append(v)
        names = column_names(self._departments(), views)
        if any(n not in self._columns for n in names) or not all(
            c.body.is_mounted for c in self._columns.values()
        ):  # new columns: mount them, then draw this snapshot
            self._ensure_columns(names)
            self.call_after_refresh(self._data_changed)
            return
        focused_id = self.focused_slice_id
        focused_column = self.focused.department if isinstance(self.focused, CardList) else None
        self._cancel_drag_if_changed(new_views)
        for sid in [s for s in self._selected if s not in new_views]:
            self._selected.discard(sid)
        done: dict[str, int] = {}
        for sid, dst in list(self._moving.items()):
            v = new_views.get(sid)
            if v is None:
                del self._moving[sid]
            elif v.department == dst:
                del self._moving[sid]
                done[dst] = done.get(dst, 0) + 1
        down = sum(1 for n in snapshot.nodes if not n.reachable)
        all_down = bool(snapshot.nodes) and down == len(snapshot.nodes)
        flows = scheduled_flows(self.schedule_entries, time.time(),
                                fractions={sid: v.fraction for sid, v in new_views.items()})
        with self.app.batch_update():
            for name, column in self._columns.items():
                mine = by_column.get(name, [])
                column.body.set_cards(mine)
                arriving, leaving = flows.get(name, (0.0, 0.0))
                column.set_totals(column_totals(mine, self.util_window, nodes_down=down, all_down=all_down,
                                                arriving_gpus=arriving, leaving_gpus=leaving))
            self._views = new_views
            self._by_column = {name: [v.slice_id for v in vs] for name, vs in by_column.items()}
            self._unreachable = unreachable_nodes(snapshot)
            self._update_status()
        self.snapshots_shown += 1
        moved = new_views.get(focused_id) if focused_id is not None else None
        if moved is not None and moved.department != focused_column:
            self.focus_slice(moved.slice_id)  # focus follows the moved card
        elif not isinstance(self.focused, (CardList, Input)) and views:
            # a card column gets the focus, but never from an Input (the `:` bar keeps it across polls)
            self.call_after_refresh(self._focus_if_nothing)
        for dst, n in done.items():
            self._flash(f"done: moved {n} slice{'s' if n != 1 else ''} to {dst}")

    def _cancel_drag_if_changed(self, new_views: dict[str, SliceView]) -> None:
        """A drag whose slices changed owner or vanished ends (its payload is no longer true)."""
        controller = self.drag_controller
        if controller is None or not controller.active or not isinstance(controller.payload, BoardDrag):
            return
        for v in controller.payload.views:
            now = new_views.get(v.slice_id)
            if now is None or now.department != v.department:
                controller.cancel("the dragged slice changed")
                self._flash("drag cancelled: the slice changed owner or disappeared", severity="warning")
                return

    def _focus_if_nothing(self) -> None:
        if isinstance(self.focused, (CardList, Input)) or not self.is_current:
            return
        for name in self._column_order:
            column = self._columns.get(name)
            if column is not None and column.body.views:
                column.body.focus()
                return

    def _update_status(self) -> None:
        parts = []
        if self._selected:
            views = [self._views[s] for s in self._selected if s in self._views]
            parts.append(f"selected {amount(views)} (m: move, esc: clear)")
        if self._moving:
            parts.append(f"{len(self._moving)} moving")
        if self._unreachable:
            parts.append(f"unreachable, slices not shown: {', '.join(self._unreachable)}")
        if not parts and not self.host.readonly:  # read-only: no hint at a move it would refuse
            parts.append("drag a card onto a column, or select (space) and press m")
        if not parts:
            parts.append("read-only: slices cannot be moved")
        try:
            self.query_one("#board-status", Static).update(" · ".join(parts), layout=False)  # one row, fixed
        except Exception:  # noqa: BLE001 - before compose
            pass

    def _flash(self, message: str, severity: str = "information") -> None:
        self.host.flash(message, severity=severity)

    def _refresh_slices(self, slice_ids: Sequence[str]) -> None:
        """Repaint the columns showing these slices (their marks changed)."""
        for name in {self._views[s].department for s in slice_ids if s in self._views}:
            column = self._columns.get(name)
            if column is not None:
                column.body.refresh()

    # -- queries (tests, benchmarks) -----------------------------------------------------------

    def column(self, department: str) -> DepartmentColumn | None:
        """The column of a department, or None when the board has none."""
        return self._columns.get(department)

    def column_slice_ids(self, department: str) -> list[str]:
        """The slice ids shown in a department's column, top to bottom."""
        return list(self._by_column.get(department, []))

    def _cards_of(self, slice_id: str) -> CardList | None:
        view = self._views.get(slice_id)
        column = self._columns.get(view.department) if view is not None else None
        return column.body if column is not None else None

    def card_text(self, slice_id: str) -> str:
        """What the card of `slice_id` says now (two lines, plain text); KeyError when the board
        does not show that slice."""
        cards = self._cards_of(slice_id)
        if cards is None:
            raise KeyError(f"board: no card for slice {slice_id!r}")
        return card_text(self._views[slice_id], selected=slice_id in self._selected,
                         moving_to=self._moving.get(slice_id))

    def card_target(self, slice_id: str) -> tuple[CardList, Offset]:
        """Scroll the card of `slice_id` into view and return (its column's CardList, a point on
        the card relative to that widget): what a mouse press on the card needs. KeyError when
        the board does not show that slice."""
        cards = self._cards_of(slice_id)
        offset = cards.card_offset(slice_id) if cards is not None else None
        if cards is None or offset is None:
            raise KeyError(f"board: no card for slice {slice_id!r}")
        return cards, offset

    @property
    def focused_slice_id(self) -> str | None:
        """The slice of the focused card (the cursor of the focused column), None when no column
        has focus or it is empty."""
        focused = self.focused
        return focused.cursor_id if isinstance(focused, CardList) else None

    def focus_slice(self, slice_id: str) -> bool:
        """Focus the card of `slice_id` (its column, cursor on it, scrolled into view); False when
        the board does not show that slice."""
        cards = self._cards_of(slice_id)
        index = cards.index_of(slice_id) if cards is not None else None
        if cards is None or index is None:
            return False
        cards.move_cursor(index)
        self.focus_now(cards)
        return True

    @property
    def moving(self) -> dict[str, str]:
        """Slices the console asked to move and has not yet seen moved: slice id -> destination."""
        return dict(self._moving)

    # -- selection and keyboard ----------------------------------------------------------------

    def selected_views(self) -> list[SliceView]:
        """The selected slices in board order."""
        return [self._views[s] for col in self._column_order for s in self._by_column.get(col, [])
                if s in self._selected]

    def _set_selected(self, sid: str, on: bool) -> None:
        if on:
            self._selected.add(sid)
        else:
            self._selected.discard(sid)
        self._refresh_slices([sid])
        self._update_status()

    def action_toggle_select(self) -> None:
        """Space: select or unselect the focused card."""
        sid = self.focused_slice_id
        if sid is not None:
            self._set_selected(sid, sid not in self._selected)

    @on(CardList.Clicked)
    def _card_clicked(self, event: CardList.Clicked) -> None:
        event.stop()
        if event.shift:
            self._set_selected(event.slice_id, event.slice_id not in self._selected)

    def action_card_nav(self, direction: str) -> None:
        """Arrows: up/down within a column, left/right to the nearest non-empty column (the card
        at the same position, or its last)."""
        cards = self.focused
        if not isinstance(cards, CardList) or not cards.views:
            self._focus_if_nothing()
            return
        if direction in ("up", "down"):
            cards.move_cursor(cards.cursor + (-1 if direction == "up" else 1))
            return
        order = self._column_order
        step = -1 if direction == "left" else 1
        k = order.index(cards.department) + step if cards.department in order else -1
        while 0 <= k < len(order):
            other = self._columns[order[k]].body
            if other.views:
                other.move_cursor(min(cards.cursor, len(other.views) - 1))
                # now, not on the next idle: the next arrow of a fast burst starts from here
                self.focus_now(other)
                return
            k += step

    def action_open_node(self) -> None:
        """Enter: the node detail of the focused card's node."""
        sid = self.focused_slice_id
        if sid is not None and sid in self._views:
            self.host.open_node(self._views[sid].node)

    def action_escape(self) -> None:
        """Escape: cancel a drag; else clear the selection; else go back."""
        if self.drag_controller is not None and self.drag_controller.cancel("Escape pressed"):
            self._flash("drag cancelled")
            return
        if self._selected:
            for sid in list(self._selected):
                self._set_selected(sid, False)
            return
        self.host.action_back()

    def action_move(self) -> None:
        """`m`: move the selection (or the focused card) to a department picked from a list."""
        if self.host.readonly:
            self._flash("read-only mode: moving slices is disabled", severity="warning")
            return
        views = self.selected_views()
        focused = self.focused_slice_id
        if not views and focused is not None and focused in self._views:
            views = [self._views[focused]]
        views = [v for v in views if v.slice_id not in self._moving]
        if not views:
            self._flash("nothing to move: select slices (space) or focus a card", severity="warning")
            return
        owners = {v.department for v in views}
        choices = [n for n in self._column_order if not (len(owners) == 1 and n in owners)]

        def picked(dst: str | None) -> None:
            if dst:
                self.propose_move(views, dst)

        self.app.push_screen(DepartmentPickerScreen(amount(views), choices), picked)

    # -- drag and drop -------------------------------------------------------------------------

    def _payload_for(self, source: Draggable) -> tuple[Any, str] | None:
        sid = getattr(source, "pressed_id", None)
        if not isinstance(source, CardList) or sid is None or sid not in self._views:
            return None
        if sid in self._selected:
            views = self.selected_views()
        else:
            views = [self._views[sid]]
        views = [v for v in views if v.slice_id not in self._moving]
        if not views:
            self._flash("already moving", severity="warning")
            return None
        self._set_dragging({v.slice_id for v in views})
        return BoardDrag(tuple(views)), f"⇄ {amount(views)}"

    def _set_dragging(self, slice_ids: set[str]) -> None:
        before = set(self._marks.dragging)
        self._marks.dragging.clear()
        self._marks.dragging.update(slice_ids)
        self._refresh_slices(list(before | slice_ids))

    @on(DragController.Dropped)
    def _dropped(self, event: DragController.Dropped) -> None:
        event.stop()
        self._set_dragging(set())
        target = event.target
        if isinstance(target, DepartmentColumn) and isinstance(event.payload, BoardDrag):
            self.propose_move(list(event.payload.views), target.department)

    @on(DragController.Cancelled)
    def _drag_cancelled(self, event: DragController.Cancelled) -> None:
        event.stop()
        self._set_dragging(set())

    # -- moving --------------------------------------------------------------------------------

    def propose_move(self, views: Sequence[SliceView], dst: str) -> None:
        """Ask for confirmation to move `views` to `dst`, then post MoveRequested. Refused with a
        notification (no dialog) in read-only mode or when nothing would move."""
        if self.host.readonly:
            self._flash("read-only mode: moving slices is disabled", severity="warning")
            return
        moving = [v for v in views if v.department != dst and v.slice_id not in self._moving]
        if not moving:
            self._flash(f"nothing to move: already owned by {dst}", severity="warning")
            return
        owners = sorted({v.lease_owner or v.lease_id or "?" for v in moving if v.leased})

        def confirmed(mode: str | None) -> None:
            if mode:
                self.post_message(self.MoveRequested(
                    tuple(v.slice_id for v in moving),
                    tuple((v.slice_id, v.department) for v in moving),
                    dst,
                    mode,
                ))

        self.app.push_screen(MoveConfirmScreen(move_summary(moving, dst), owners), confirmed)

    @on(MoveRequested)
    def _move_requested(self, event: MoveRequested) -> None:
        event.stop()
        self.request_move(event.slice_ids, dict(event.sources), event.dst, event.leased)

    def request_move(self, slice_ids: Sequence[str], sources: dict[str, str], dst: str, leased: str) -> None:
        """Mark the slices as moving and send one ReassignRequest per source department in a
        thread worker (refused in read-only mode)."""
        if self.host.readonly:
            self._flash("read-only mode: moving slices is disabled", severity="warning")
            return
        source = self.host.source
        if not hasattr(source, "reassign"):  # a source that only reads
            self._flash("this fleet source cannot reassign slices", severity="error")
            return
        views = [self._views[s] for s in slice_ids if s in self._views]
        views = [dataclasses.replace(v, department=sources.get(v.slice_id, v.department)) for v in views]
        groups = group_by_source(views, dst)
        requests = [ReassignRequest(src=src, dst=dst, slice_ids=sids, leased=leased, request_id=new_request_id())
                    for src, sids in groups.items()]
        for sids in groups.values():
            for sid in sids:
                self._moving[sid] = dst
                self._selected.discard(sid)
            self._refresh_slices(sids)
        self._update_status()
        if requests:
            self._run_requests(source, requests)

    @work(thread=True, exit_on_error=False, group="reassign")
    def _run_requests(self, source: Any, requests: list[ReassignRequest]) -> None:
        outcomes: list[tuple[ReassignRequest, Any, str | None]] = []
        for req in requests:
            try:
                outcomes.append((req, source.reassign(req), None))
            except Exception as e:  # noqa: BLE001 - every failure is shown to the admin
                outcomes.append((req, None, str(e) or type(e).__name__))
        self.app.call_from_thread(self._requests_done, outcomes)

    def _requests_done(self, outcomes: list[tuple[ReassignRequest, Any, str | None]]) -> None:
        """Worker results (UI thread): notify errors and clear their 'moving' marks; successful
        moves stay 'moving' until a snapshot shows them done."""
        for req, result, error in outcomes:
            sids = list(req.slice_ids or [])
            if error is not None:
                self._flash(f"move {req.src} → {req.dst} failed: {error}", severity="error")
                self._clear_moving(sids)
                continue
            plan = result.plan
            if plan.shortfall:
                self._flash(f"move {req.src} → {req.dst} refused: {plan.shortfall}", severity="error")
                self._clear_moving(sids)
            for node, (moves, err) in result.failed.items():
                self._flash(f"move {req.src} → {req.dst} failed on {node}: {err}", severity="error")
                self._clear_moving([m.slice_id for m in moves])
            for node, (moves, err) in result.unknown.items():
                self._flash(f"move {req.src} → {req.dst} on {node}: outcome unknown (no answer): {err}",
                            severity="error")
                self._clear_moving([m.slice_id for m in moves])
            if result.pending:
                n = len(result.pending)
                self._flash(f"{n} leased slice{'s' if n != 1 else ''} will move to {req.dst} when the lease ends")
                self._clear_moving([m.slice_id for m in result.pending])
        self._update_status()
        self.host.poll()

    def _clear_moving(self, slice_ids: Sequence[str]) -> None:
        cleared = [sid for sid in slice_ids if self._moving.pop(sid, None) is not None]
        self._refresh_slices(cleared)
