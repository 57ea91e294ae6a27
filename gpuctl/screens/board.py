"""The department board (`:depts`): a column per department plus "unassigned", a card per slice.

Reading it: each column's title is the department; under it its totals (GPU-equivalents, memory
quota, busy/idle slices, mean SM utilization of its slices over the last minute); each card is a
slice (node, GPU index, fraction, live SM utilization, idle or 🔒 leased with the lease's owner).

Moving slices, by mouse: drag a card onto another column (a drag of a selected card carries the
whole selection; shift-click or space selects); by keyboard: arrows move between cards and
columns, space selects, `m` picks a department from a list. Both ask for confirmation
(MoveConfirmScreen; leased slices offer drain / revoke / cancel) and then post one message,
:class:`BoardScreen.MoveRequested`, whose handler sends one gpuctl.reassign.ReassignRequest per
source department through the app's FleetSource (``source.reassign``, the same service as
`gpuctl reassign`) in a thread worker. Cards show "moving → dst…" until a snapshot shows the new
owner (then a notification says it is done) or the error is notified. In read-only mode
(``app.readonly``) drops and `m` are refused with a notification.

Updates are diffs: cards are kept by slice id; a new snapshot updates their text, moves the
cards whose department changed, and adds or removes only the slices that appeared or vanished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import HorizontalScroll
from textual.message import Message
from textual.widgets import Static

from gpuctl import model
from gpuctl.reassign import ReassignRequest, new_request_id
from gpuctl.screens.base import GpuctlScreen
from gpuctl.screens.move_dialog import DepartmentPickerScreen, MoveConfirmScreen
from gpuctl.widgets.board_cards import SliceCard
from gpuctl.widgets.board_columns import DepartmentColumn, color_class
from gpuctl.widgets.board_model import (
    SliceView,
    UtilWindow,
    column_names,
    column_totals,
    group_by_source,
    move_summary,
    slice_views,
    unreachable_nodes,
)
from gpuctl.widgets.drag import DragController, DragGhost, Draggable


#: Rows from one card's top to the next (height 2 + margin 1 in board.tcss).
CARD_PITCH = 3

#: Narrowest column (cells, borders included); below it the board scrolls horizontally.
COLUMN_MIN_WIDTH = 30


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
    `departments` and `reassign`), `snapshot`, `readonly`, `flash` and `poll` when present."""

    VIEW = "departments"
    CSS_PATH = "board.tcss"
    BINDINGS = [
        Binding("space", "toggle_select", "Select"),
        Binding("m", "move", "Move to…"),
        Binding("escape", "escape", "Back / cancel"),
    ]

    class MoveRequested(Message):
        """Move `slice_ids` to department `dst`. sources: (slice id, owning department) pairs as
        the board saw them; leased: "refuse", "drain" or "revoke" (gpuctl.reassign)."""

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
        self._cards: dict[str, SliceCard] = {}
        self._views: dict[str, SliceView] = {}
        self._by_column: dict[str, list[str]] = {}
        self._column_order: list[str] = []
        self._selected: set[str] = set()
        self._moving: dict[str, str] = {}  # slice id -> destination, until a snapshot shows it
        self._unreachable: list[str] = []
        self._ghost = DragGhost("", markup=False)
        self._window_seen: model.FleetSnapshot | None = None
        self._stale_cards: set[SliceCard] = set()  # cards changed while out of view

    # -- composition and data ------------------------------------------------------------------

    def compose_body(self) -> ComposeResult:
        yield Static("", id="board-status", markup=False)
        yield HorizontalScroll(id="board-columns")
        yield self._ghost

    async def on_mount(self) -> None:
        self.drag_controller = DragController(self, self._ghost, self._payload_for)
        self.watch(self.app, "snapshot", self._record_utilization, init=True)
        await self._ensure_columns(column_names(self._departments()))
        self.watch(self.query_one("#board-columns", HorizontalScroll), "scroll_x", self._repaint_visible, init=False)
        # GpuctlScreen.on_mount runs after this one (Textual calls each class's handler).

    def _departments(self) -> list[model.Department]:
        source = getattr(self.app, "source", None)
        return list(getattr(source, "departments", None) or [])

    def _record_utilization(self, snapshot: model.FleetSnapshot | None = None) -> None:
        snapshot = getattr(self.app, "snapshot", None)
        if snapshot is not None and snapshot is not self._window_seen:
            self._window_seen = snapshot
            self.util_window.add(snapshot)

    def _ensure_columns(self, names: list[str]) -> AwaitComplete:
        """Mount columns missing from `names` (in its order; unassigned stays last); the result
        may be awaited for their mounting to finish."""
        mounts = []
        container = self.query_one("#board-columns", HorizontalScroll)
        colors = {d.name: d.color for d in self._departments()}
        index = {name: i for i, name in enumerate(n for n in names if n != model.UNASSIGNED)}
        for name in names:
            if name in self._columns:
                continue
            css = color_class(name, -1 if name == model.UNASSIGNED else index[name], colors.get(name))
            column = DepartmentColumn(name, css)
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
        self.call_after_refresh(self._repaint_visible)

    def show_snapshot(self, snapshot: model.FleetSnapshot) -> None:
        """Diff `snapshot` into the board (UI thread; no I/O)."""
        self._record_utilization(snapshot)
        views = slice_views(snapshot)
        new_views = {v.slice_id: v for v in views}
        by_column: dict[str, list[str]] = {}
        for v in views:
            by_column.setdefault(v.department, []).append(v.slice_id)
        names = column_names(self._departments(), views)
        focused = self.focused
        refocus: str | None = None
        done: dict[str, int] = {}
        if any(n not in self._columns for n in names) or not all(
            c.body.is_mounted for c in self._columns.values()
        ):  # new columns: mount them, then draw this snapshot
            self._ensure_columns(names)
            self.call_after_refresh(self._data_changed)
            return
        visible = self._visibility()
        with self.app.batch_update():
            mounts: dict[tuple[str, int], tuple[DepartmentColumn, SliceCard | None, list[SliceCard]]] = {}
            for sid in [s for s in self._cards if s not in new_views]:
                gone = self._cards.pop(sid)
                self._stale_cards.discard(gone)
                self._cancel_drag_of(gone)
                gone.remove()
                self._selected.discard(sid)
                self._moving.pop(sid, None)
            for sid, dst in list(self._moving.items()):
                v = new_views[sid]
                if v.department == dst:
                    del self._moving[sid]
                    done[dst] = done.get(dst, 0) + 1
            for name, sids in by_column.items():
                column = self._columns[name]
                for i, sid in enumerate(sids):
                    view = new_views[sid]
                    card = self._cards.get(sid)
                    if card is not None and self._views[sid].department == view.department:
                        if card.show(view, selected=sid in self._selected, moving_to=self._moving.get(sid),
                                     repaint=visible(column, i)):
                            self._stale_cards.add(card)
                        continue
                    if card is not None:  # owner changed: the card moves to the new column
                        if card is focused:
                            refocus = sid
                        self._stale_cards.discard(card)
                        self._cancel_drag_of(card)
                        card.remove()
                    card = SliceCard(view, selected=sid in self._selected, moving_to=self._moving.get(sid))
                    self._cards[sid] = card
                    before = next((self._cards[s] for s in sids[i + 1:] if s in self._cards
                                   and s in self._views and self._views[s].department == name), None)
                    mounts.setdefault((name, id(before)), (column, before, []))[2].append(card)
            for column, before, cards in mounts.values():  # one mount per run of new cards
                if before is not None:
                    column.body.mount_all(cards, before=before)
                else:
                    column.body.mount_all(cards)
            self._views = new_views
            self._by_column = by_column
            for name, column in self._columns.items():
                column.set_totals(column_totals([new_views[s] for s in by_column.get(name, [])], self.util_window))
            self._unreachable = unreachable_nodes(snapshot)
            self._update_status()
        if refocus is not None:
            card = self._cards[refocus]
            self.call_after_refresh(card.focus)
        elif not isinstance(self.focused, SliceCard) and views:
            first = self._cards[views[0].slice_id]
            self.call_after_refresh(self._focus_if_nothing, first)
        for dst, n in done.items():
            self._flash(f"done: moved {n} slice{'s' if n != 1 else ''} to {dst}")

    def _visibility(self) -> Callable[[DepartmentColumn, int], bool]:
        """A test of whether the card at position `index` of a column is (nearly) in view now:
        the column inside the board's horizontal viewport and the card inside the column's
        vertical viewport (cards are CARD_PITCH rows apart). Cards out of view are repainted when
        they scroll in: repainting 1700 cards per tick would cost ~0.3 s at 1024 GPUs."""
        try:
            scroller = self.query_one("#board-columns", HorizontalScroll)
            left, width = scroller.scroll_x, scroller.size.width
        except Exception:  # noqa: BLE001 - before compose: treat everything as visible
            return lambda column, index: True
        margin = 2
        shown: dict[int, tuple[float, float] | None] = {}

        def rows(column: DepartmentColumn) -> tuple[float, float] | None:
            key = id(column)
            if key not in shown:
                try:
                    cx = column.virtual_region.x
                    off = cx + column.outer_size.width < left or cx > left + width
                except Exception:  # noqa: BLE001 - not laid out yet: visible
                    off = False
                body = column.body
                top = body.scroll_y / CARD_PITCH - margin
                shown[key] = None if off else (top, top + body.size.height / CARD_PITCH + 2 * margin)
            return shown[key]

        def visible(column: DepartmentColumn, index: int) -> bool:
            r = rows(column)
            return r is not None and r[0] <= index <= r[1]

        return visible

    def _repaint_visible(self, _value: object = None) -> None:
        """Repaint the stale cards that are now in view (after a scroll or resize)."""
        if not self._stale_cards:
            return
        visible = self._visibility()
        positions = {sid: (col, i) for col, sids in self._by_column.items() for i, sid in enumerate(sids)}
        for card in list(self._stale_cards):
            col, i = positions.get(card.slice_id, (None, 0))
            column = self._columns.get(col) if col is not None else None
            if column is None or visible(column, i):
                self._stale_cards.discard(card)
                card.repaint()

    def _cancel_drag_of(self, card: SliceCard) -> None:
        """A card going away (its slice vanished or changed owner) ends a drag it started."""
        controller = self.drag_controller
        if controller is not None and controller.source is card:
            controller.cancel("the dragged slice changed")
            self._flash("drag cancelled: the slice changed owner or disappeared", severity="warning")

    @on(DepartmentColumn.Scrolled)
    def _column_scrolled(self, event: DepartmentColumn.Scrolled) -> None:
        event.stop()
        self._repaint_visible()

    def _focus_if_nothing(self, card: SliceCard) -> None:
        if not isinstance(self.focused, SliceCard) and card.is_attached:
            card.focus()

    def _update_status(self) -> None:
        parts = []
        if self._selected:
            views = [self._views[s] for s in self._selected if s in self._views]
            parts.append(f"selected {amount(views)} (m: move, esc: clear)")
        if self._moving:
            parts.append(f"{len(self._moving)} moving")
        if self._unreachable:
            parts.append(f"unreachable, slices not shown: {', '.join(self._unreachable)}")
        if not parts:
            parts.append("drag a card onto a column, or select (space) and press m")
        try:
            self.query_one("#board-status", Static).update(" · ".join(parts))
        except Exception:  # noqa: BLE001 - before compose
            pass

    def _flash(self, message: str, severity: str = "information") -> None:
        flash = getattr(self.app, "flash", None)
        if callable(flash):
            flash(message, severity=severity)
        else:
            self.notify(message, severity=severity, markup=False)  # type: ignore[arg-type]

    def card(self, slice_id: str) -> SliceCard | None:
        """The card of a slice, or None when the board does not show it."""
        return self._cards.get(slice_id)

    def column(self, department: str) -> DepartmentColumn | None:
        """The column of a department, or None when the board has none."""
        return self._columns.get(department)

    def column_slice_ids(self, department: str) -> list[str]:
        """The slice ids shown in a department's column, top to bottom."""
        return list(self._by_column.get(department, []))

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
        card = self._cards.get(sid)
        if card is not None:
            card.show(selected=on)
        self._update_status()

    def action_toggle_select(self) -> None:
        """Space: select or unselect the focused card."""
        card = self.focused
        if isinstance(card, SliceCard):
            self._set_selected(card.slice_id, card.slice_id not in self._selected)

    @on(SliceCard.Clicked)
    def _card_clicked(self, event: SliceCard.Clicked) -> None:
        event.stop()
        if event.shift:
            sid = event.card.slice_id
            self._set_selected(sid, sid not in self._selected)

    def action_card_nav(self, direction: str) -> None:
        """Arrows: up/down within a column, left/right to the nearest non-empty column."""
        card = self.focused
        if not isinstance(card, SliceCard) or card.slice_id not in self._views:
            first = next((self._cards[sids[0]] for c in self._column_order
                          if (sids := self._by_column.get(c))), None)
            if first is not None:
                first.focus()
            return
        col = self._views[card.slice_id].department
        sids = self._by_column.get(col, [])
        i = sids.index(card.slice_id) if card.slice_id in sids else 0
        target: str | None = None
        if direction in ("up", "down"):
            j = i + (-1 if direction == "up" else 1)
            if 0 <= j < len(sids):
                target = sids[j]
        else:
            order = self._column_order
            step = -1 if direction == "left" else 1
            k = order.index(col) + step if col in order else -1
            while 0 <= k < len(order):
                other = self._by_column.get(order[k], [])
                if other:
                    target = other[min(i, len(other) - 1)]
                    break
                k += step
        if target is not None and target in self._cards:
            self._cards[target].focus()

    def action_escape(self) -> None:
        """Escape: cancel a drag; else clear the selection; else go back."""
        if self.drag_controller is not None and self.drag_controller.cancel("Escape pressed"):
            self._flash("drag cancelled")
            return
        if self._selected:
            for sid in list(self._selected):
                self._set_selected(sid, False)
            return
        back = getattr(self.app, "action_back", None)
        if callable(back):
            back()

    def action_move(self) -> None:
        """`m`: move the selection (or the focused card) to a department picked from a list."""
        if getattr(self.app, "readonly", False):
            self._flash("read-only mode: moving slices is disabled", severity="warning")
            return
        views = self.selected_views()
        if not views and isinstance(self.focused, SliceCard) and self.focused.slice_id in self._views:
            views = [self._views[self.focused.slice_id]]
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
        if not isinstance(source, SliceCard) or source.slice_id not in self._views:
            return None
        if source.slice_id in self._selected:
            views = self.selected_views()
        else:
            views = [self._views[source.slice_id]]
        views = [v for v in views if v.slice_id not in self._moving]
        if not views:
            self._flash("already moving", severity="warning")
            return None
        return BoardDrag(tuple(views)), f"⇄ {amount(views)}"

    @on(DragController.Dropped)
    def _dropped(self, event: DragController.Dropped) -> None:
        event.stop()
        target = event.target
        if isinstance(target, DepartmentColumn) and isinstance(event.payload, BoardDrag):
            self.propose_move(list(event.payload.views), target.department)

    @on(DragController.Cancelled)
    def _drag_cancelled(self, event: DragController.Cancelled) -> None:
        event.stop()

    # -- moving --------------------------------------------------------------------------------

    def propose_move(self, views: Sequence[SliceView], dst: str) -> None:
        """Ask for confirmation to move `views` to `dst`, then post MoveRequested. Refused with a
        notification (no dialog) in read-only mode or when nothing would move."""
        if getattr(self.app, "readonly", False):
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
        if getattr(self.app, "readonly", False):
            self._flash("read-only mode: moving slices is disabled", severity="warning")
            return
        source = getattr(self.app, "source", None)
        if source is None or not hasattr(source, "reassign"):
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
                card = self._cards.get(sid)
                if card is not None:
                    card.show(selected=False, moving_to=dst)
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
            if result.pending:
                n = len(result.pending)
                self._flash(f"{n} leased slice{'s' if n != 1 else ''} will move to {req.dst} when the lease ends")
                self._clear_moving([m.slice_id for m in result.pending])
        self._update_status()
        poll = getattr(self.app, "poll", None)
        if callable(poll):
            poll()

    def _clear_moving(self, slice_ids: Sequence[str]) -> None:
        for sid in slice_ids:
            if self._moving.pop(sid, None) is not None:
                card = self._cards.get(sid)
                if card is not None:
                    card.show(moving_to=None)
