"""Terminal input screening (gpuctl.console.terminal_input): malformed mouse reports never become
keys; a pixel mouse report with a cell size of 0 never divides by zero."""

from __future__ import annotations

import time

import pytest
from textual import constants, events
from textual._xterm_parser import XTermParser

from gpuctl.console.terminal_input import GuardedXTermParser, screen_mouse_reports


def typed(parser, *reads: str) -> str:
    """The characters that would be typed into an Input from `reads` (printable key events), with
    the parser's escape timeout passed after each read (as the driver's tick does)."""
    out = []
    for data in reads:
        evs = list(parser.feed(data))
        time.sleep(constants.ESCAPE_DELAY + 0.02)
        evs += list(parser.tick())
        out += [e.character for e in evs if isinstance(e, events.Key) and e.is_printable]
    return "".join(out)


def mice(parser, *reads: str) -> list[events.MouseEvent]:
    return [e for data in reads for e in parser.feed(data) if isinstance(e, events.MouseEvent)]


@pytest.mark.parametrize("data, parsed, held, dropped", [
    ("abc", "abc", "", []),
    ("\x1b[<0;12;5M", "\x1b[<0;12;5M", "", []),
    ("a\x1b[<0;12", "a", "\x1b[<0;12", []),
    ("\x1b[<0;12;5Xb", "b", "", ["\x1b[<0;12;5X"]),
    ("\x1b[<0;12;5 b", " b", "", ["\x1b[<0;12;5"]),
    ("\x1b[<0;1\x1b[<0;2;3M", "\x1b[<0;2;3M", "", ["\x1b[<0;1"]),
    ("x\x1b[", "x", "\x1b[", []),
    ("\x1b[A", "\x1b[A", "", []),
])
def test_screen_mouse_reports_passes_holds_and_drops(data, parsed, held, dropped):
    assert screen_mouse_reports(data) == (parsed, held, dropped)


def test_a_report_cut_across_two_reads_is_joined():
    assert screen_mouse_reports(";5M!", "\x1b[<0;12") == ("\x1b[<0;12;5M!", "", [])


def test_textual_alone_types_a_malformed_mouse_report():
    """The reference: what reached the `/` filter before (Textual's parser, no screening)."""
    assert typed(XTermParser(), "\x1b[<0;12;5X", "q") == "[<0;12;5Xq"


@pytest.mark.parametrize("garbage", ["\x1b[<0;12;5X", "\x1b[<35;1", "\x1b[<0;;M", "\x1b[<" + "9" * 30 + "M",
                                     "\x1b[<0;12;5X\x1b[<1"])
def test_malformed_mouse_reports_type_nothing(garbage):
    guarded = GuardedXTermParser()
    assert typed(guarded, garbage, "q") == "q"
    assert guarded.dropped_count >= 1


def test_a_valid_report_split_across_reads_still_clicks():
    parser = GuardedXTermParser()
    (down,) = mice(parser, "\x1b[<0;12", ";5M")
    assert isinstance(down, events.MouseDown) and (down.x, down.y) == (11, 4)


def test_pixel_mouse_with_a_cell_size_of_0_is_dropped_not_divided():
    in_band = "\x1b[48;24;80;0;0t"  # in-band resize: 24 rows, 80 columns, 0x0 pixels
    plain = XTermParser()
    with pytest.raises(ZeroDivisionError):
        list(plain.feed(in_band + "\x1b[<0;100;50M"))
    guarded = GuardedXTermParser()
    resized = [e for e in guarded.feed(in_band) if isinstance(e, events.Resize)]
    assert resized and guarded.mouse_pixels
    assert mice(guarded, "\x1b[<0;100;50M") == []
    assert guarded.dropped_count == 1
    assert typed(guarded, "ok") == "ok"  # still parsing


async def test_a_panic_makes_the_console_exit_non_zero_with_the_message():
    """What Textual's driver does when its input thread dies (app.panic with the traceback): the
    app's return code is 1, so `gpuctl` exits FAILURE, and the reason is kept for the message."""
    import rich.traceback

    from gpuctl.fleet.simulated import SimulatedFleetSource
    from tests.support.console import make_app

    src = SimulatedFleetSource(nodes=1, gpus_per_node=1, seed=0)
    try:
        app = make_app(src)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            try:
                1 / 0
            except ZeroDivisionError:
                app.panic(rich.traceback.Traceback())
        assert app.return_code == 1
        assert app.crash_message == "ZeroDivisionError: division by zero"
    finally:
        src.close()


def test_the_linux_terminal_driver_is_the_guarded_one():
    from gpuctl.console.terminal_input import GuardedLinuxDriver
    from gpuctl.fleet.simulated import SimulatedFleetSource
    from tests.support.console import make_app

    src = SimulatedFleetSource(nodes=1, gpus_per_node=1, seed=0)
    try:
        assert make_app(src).get_driver_class() is GuardedLinuxDriver
    finally:
        src.close()


def _events(parts, gap_s: float = 0.25):
    """(kind, what) of the events a GuardedXTermParser makes of `parts`, each a read arriving
    `gap_s` after the last (longer than Textual's escape delay: its parser has given up waiting)."""
    import time

    from textual import events

    from gpuctl.console.terminal_input import GuardedXTermParser

    parser = GuardedXTermParser()
    out = []
    for part in parts:
        out += list(parser.feed(part))
        time.sleep(gap_s)
        out += list(parser.tick())
    return [("cpr", (e.x, e.y)) if isinstance(e, events.CursorPosition) else ("key", e.key) for e in out]


@pytest.mark.parametrize("parts", [["\x1b[12;", "5R"], ["\x1b[1", "2;5R"], ["\x1b[", "12;5R"], ["\x1b[12;5R"]])
def test_a_cursor_position_answer_split_across_reads_is_never_typed(parts):
    """gpuctl.console.frame_ack's answer cut between two reads further apart than the escape delay:
    Textual's parser alone typed "[12;" and then "5R" (into the `/` filter); held, it is one answer."""
    assert _events(parts) == [("cpr", (4, 11))]


def test_keys_around_a_split_answer_and_a_split_key_sequence_keep_their_order():
    assert _events(["a\x1b[12", ";5Rb"]) == [("key", "a"), ("cpr", (4, 11)), ("key", "b")]
    assert _events(["\x1b[1;5", "A"]) == [("key", "ctrl+up")]  # held, then fed whole: not lost
