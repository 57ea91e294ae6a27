"""When a frame has really reached the terminal (a mixin of gpuctl.app.GpuctlApp): the move
confirmation arms only once the terminal has drawn it (issue 9 item 3).

Textual writes a frame by queueing it for its output thread (App._display -> driver.write); the
terminal draws it later: after the output thread, the pty and, over SSH, the network have carried
it. The console writes ~22 KB per full frame at 120x40, and the picker closing plus the move
dialog opening took ~110 KB (4 whole frames of the dialog; 2 since gpuctl.screens.base.ScreenFooter);
on a terminal that takes ~100 KB/s (a loaded machine, a slow SSH link) the dialog reached the
screen ~1 s after the app had "drawn" it (0.5 s now), the screen looked frozen meanwhile, and an
Enter typed at the old picture confirmed the move (reproduced in tmux behind a slow pty:
tests/integration/test_tmux_console.py, tests/support/slow_tty.py).

So, for a screen that asks (its `frame_written(full)` returns True: gpuctl.screens.confirm.ArmedModal
until acknowledged), the app writes a cursor-position query (DSR, ``ESC [ 6 n``) right after the
frame. A terminal answers queries in the order of its input stream, after drawing everything
written before the query: its answer (Textual's CursorPosition event) calls the screen's
`frame_acknowledged()`. Keys typed before the answer come before it in the input stream, so a
blind key is always handled while the dialog is still unacknowledged (and is dropped).

Which query an answer belongs to: each query first moves the cursor to a position of its own
(saved and restored around it: ``ESC 7``, ``ESC [ row ; col H``, ``ESC [ 6 n``, ``ESC 8``), and
the answer reports that position. Only an answer naming a position still awaited counts (and
acknowledges that query and every older one: the terminal answers in order); any other is
ignored: an answer to a query that timed out (arriving while a newer dialog waits), a second
answer, a malformed or out-of-range one, and a key that looks like an answer: Shift/Ctrl+F3 send
``ESC [ 1 ; <modifier> R``, which Textual parses as a cursor position (row 1), so no query uses
row 1. Positions cycle over rows 2..height x every column. A terminal resized between query and
answer reports a clamped position: the timeout then arms the dialog.

Without a terminal (headless: Pilot, tests) the frame counts as drawn at once. A terminal that
never answers DSR: after ACK_TIMEOUT_S the frame counts as drawn (every xterm-compatible
terminal, tmux, screen and the Linux console answer). A frame Textual drops
(composed inside app.batch_update / Widget.batch: App._display writes nothing) is never reported.
tests/console/test_textual_pins.py pins the Textual internals used (App._display, LayoutUpdate).
"""

from __future__ import annotations

from collections import deque

from textual import events
from textual._compositor import LayoutUpdate

#: Cursor-position query (DSR 6); the terminal answers "ESC [ row ; col R".
CURSOR_POSITION_QUERY = "\x1b[6n"
#: Seconds to wait for the terminal's answer before a frame counts as drawn anyway.
ACK_TIMEOUT_S = 3.0


def query_position(number: int, width: int, height: int) -> tuple[int, int]:
    """The 1-based (row, col) where query `number` puts the cursor before asking: rows 2..height
    (row 1 is what Shift/Ctrl+F3 look like), every column, cycling; (1, 1) on a terminal of one
    row. width, height: the terminal's size in cells."""
    width, height = max(1, width), max(1, height)
    if height < 2:
        return 1, 1
    spot = number % ((height - 1) * width)
    return 2 + spot // width, 1 + spot % width


def query_text(row: int, col: int) -> str:
    """What is written after the frame: save the cursor, move it to (row, col) (1-based), ask for
    its position, restore it."""
    return f"\x1b7\x1b[{row};{col}H{CURSOR_POSITION_QUERY}\x1b8"


class FrameAckMixin:
    """App._display reports frames to the screen; terminal answers acknowledge them (see the
    module doc). State: `_frame_acks` (queries awaiting an answer, oldest first: [screen, x, y],
    x and y 0-based as Textual's CursorPosition) and `_frame_ack_count` (queries written)."""

    _frame_acks: deque
    _frame_ack_count: int = 0

    def _display(self, screen, renderable) -> None:  # noqa: ANN001 - Textual's (Screen, RenderableType | None)
        dropped = renderable is None or bool(self._batch_count)
        super()._display(screen, renderable)  # type: ignore[misc]
        if dropped:
            return
        written = getattr(screen, "frame_written", None)
        if not callable(written) or not written(isinstance(renderable, LayoutUpdate)):
            return
        if not self._writes_to_a_terminal():
            screen.frame_acknowledged()
            return
        size = self.size
        row, col = query_position(self._frame_ack_count, size.width, size.height)
        self._frame_ack_count += 1
        entry = (screen, col - 1, row - 1)
        acks = self._frame_acks
        acks.append(entry)
        self._driver.write(query_text(row, col))  # after the frame, in the same output queue

        def timed_out() -> None:
            if entry in acks:
                acks.remove(entry)
                screen.frame_acknowledged()

        self.set_timer(ACK_TIMEOUT_S, timed_out)

    def _writes_to_a_terminal(self) -> bool:
        """Is there a terminal that draws the frames (not headless, driver running)?"""
        return bool(self._running and not self._closed and not self.is_headless and self._driver is not None)

    def on_cursor_position(self, event: events.CursorPosition) -> None:
        """The terminal answered a query: it has drawn every frame written before it. An answer
        naming no awaited position is ignored (see the module doc)."""
        acks = self._frame_acks
        found = next((i for i, (_, x, y) in enumerate(acks) if (x, y) == (event.x, event.y)), None)
        if found is None:
            return
        for _ in range(found + 1):
            acks.popleft()[0].frame_acknowledged()
