"""Terminal input the console can trust: garbage never types into inputs, a parser failure never
kills the console.

Textual's XTermParser turns an escape sequence it does not understand back into keys: a malformed
or truncated SGR mouse report ("\\x1b[<0;12" cut off, "\\x1b[<0;12;5X") arrived as the text
"<0;12;5X" in the `/` filter and the `:` bar. A terminal reporting pixel mouse coordinates with a
cell size of 0 made its parser divide by zero, which killed the input thread (and the console
exited 0 without a word).

:class:`GuardedXTermParser` screens the raw input first (:func:`screen_mouse_reports`): a complete
SGR mouse report passes; a report cut at the end of a read is held until the next read completes
it; anything else that starts like one is dropped and counted. The start of a cursor-position
answer cut at the end of a read is held for the next read too (CPR_PREFIX_AT_END), so a split
answer is never typed as keys. Pixel mouse reports whose pixel or
cell size is 0 are dropped (the position cannot be known). :class:`GuardedLinuxDriver` is
Textual's LinuxDriver with that parser; an exception while parsing a read drops that read, starts
a fresh parser and tells the app (:class:`TerminalInputDropped`), so the console keeps running.
An exception that still ends the input thread panics the app with the traceback, and the app
exits non-zero (gpuctl.app.GpuctlApp.panic).
"""

from __future__ import annotations

import itertools
import re
import selectors
from codecs import getincrementaldecoder
from collections import deque

from textual._loop import loop_last
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

#: An SGR mouse report ("\x1b[<0;12;5M"): button; column; row; M (press/move) or m (release).
SGR_MOUSE = re.compile(r"\x1b\[<\d{1,5};-?\d{1,5};-?\d{1,5}[Mm]")
#: The start of an SGR mouse report that a later read may still complete (cut at the read's end).
SGR_MOUSE_PREFIX = re.compile(r"\x1b\[<[0-9;-]*")
SGR_START = "\x1b[<"
#: Longest partial report held back waiting for the rest (longer: garbage, dropped).
MAX_HELD = 24
#: The start of a cursor-position answer ("\x1b[12;5R", gpuctl.console.frame_ack) cut at the end
#: of a read: held until the next read (Textual's parser turns a sequence left unfinished for its
#: escape delay into keys: "[12;" typed into the `/` filter, then "5R").
CPR_PREFIX_AT_END = re.compile(r"\x1b\[\d{1,10}(;\d{0,10})?\Z")


def screen_mouse_reports(data: str, held: str = "") -> tuple[str, str, list[str]]:
    """Split `held + data` into (what to parse now, what to hold for the next read, what was
    dropped). A complete SGR mouse report passes; one cut at the very end is held (up to MAX_HELD
    characters); any other text starting with "\\x1b[<" is dropped up to and including its final
    byte (0x40-0x7e) when it has one, else up to where the digits and separators stop. A held
    piece that the next read does not continue is dropped alone (that read's keys stay)."""
    text = held + data
    if SGR_START not in text and not text.endswith("\x1b["):
        return text, "", []
    out: list[str] = []
    dropped: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        j = text.find(SGR_START, i)
        if j < 0:
            if text.endswith("\x1b[") and n - 2 >= i:  # a report split after its "\x1b["
                out.append(text[i:n - 2])
                return "".join(out), "\x1b[", dropped
            out.append(text[i:])
            break
        out.append(text[i:j])
        whole = SGR_MOUSE.match(text, j)
        if whole:
            out.append(whole.group(0))
            i = whole.end()
            continue
        part = SGR_MOUSE_PREFIX.match(text, j)
        end = part.end() if part else j + len(SGR_START)
        if end == n and n - j <= MAX_HELD:  # cut at the end of this read: wait for the rest
            return "".join(out), text[j:], dropped
        from_last_read = held and j == 0 and end >= len(held)
        if end < n and 0x40 <= ord(text[end]) <= 0x7E and not (from_last_read and end == len(held)):
            end += 1  # the malformed report's final byte goes with it (not a key of a later read)
        dropped.append(text[j:end])
        i = end
    return "".join(out), "", dropped


class GuardedXTermParser(XTermParser):
    """XTermParser over screened input (see the module doc). `dropped`: the last 20 pieces of
    input dropped as garbage, for the app to report."""

    def __init__(self, debug: bool = False) -> None:
        super().__init__(debug)
        self._held = ""
        #: A cursor-position answer's start cut at the end of the last read (CPR_PREFIX_AT_END):
        #: fed with the next read, whatever that read is (never dropped).
        self._held_answer = ""
        self.dropped: deque[str] = deque(maxlen=20)
        self.dropped_count = 0

    def feed(self, data: str):  # noqa: ANN201 - XTermParser.feed's iterable of messages
        if data:
            data, self._held_answer = self._held_answer + data, ""
            data, self._held, dropped = screen_mouse_reports(data, self._held)
            self.dropped.extend(dropped)
            self.dropped_count += len(dropped)
            cut = CPR_PREFIX_AT_END.search(data)
            if cut:
                data, self._held_answer = data[:cut.start()], data[cut.start():]
            if not data:
                return iter(())
        elif self._held_answer:  # the end of input: what was held goes to the parser
            data, self._held_answer = self._held_answer, ""
            return itertools.chain(super().feed(data), super().feed(""))
        return super().feed(data)

    def parse_mouse_code(self, code: str) -> Message | None:
        if self.mouse_pixels and self.terminal_pixel_size is not None and self.terminal_size is not None:
            if 0 in tuple(self.terminal_pixel_size) or 0 in tuple(self.terminal_size):
                # pixel coordinates with no cell size: the position cannot be known
                self.dropped.append(code)
                self.dropped_count += 1
                return None
        return super().parse_mouse_code(code)


class TerminalInputDropped(Message):
    """Terminal input was dropped: `count` pieces of garbage, or a read whose parsing raised
    (`error`, "ZeroDivisionError: ..."). Posted by GuardedLinuxDriver from its input thread."""

    def __init__(self, count: int, error: str | None = None, sample: str = ""):
        super().__init__()
        self.count = count
        self.error = error
        self.sample = sample


class GuardedLinuxDriver(LinuxDriver):
    """Textual's LinuxDriver reading through GuardedXTermParser (see the module doc). Its input
    loop is LinuxDriver.run_input_thread's (Textual 8.2), with the parser replaced and each
    read's parsing guarded."""

    def run_input_thread(self) -> None:
        """Wait for input and dispatch events (on the driver's input thread)."""
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        fileno = self.fileno
        EVENT_READ = selectors.EVENT_READ
        parser = GuardedXTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")(errors="replace").decode
        import os

        read = os.read

        def report(count: int, error: str | None = None) -> None:
            sample = "".join(parser.dropped)[-40:]
            parser.dropped.clear()
            self._app.post_message(TerminalInputDropped(count, error, sample))

        def guarded(events) -> None:  # noqa: ANN001 - an iterable of messages
            nonlocal parser
            try:
                for event in events:
                    self.process_message(event)
            except Exception as e:  # noqa: BLE001 - one bad read must not end the console's input
                old, parser = parser, GuardedXTermParser(self._debug)
                parser.mouse_pixels = old.mouse_pixels
                parser.terminal_size = old.terminal_size
                parser.terminal_pixel_size = old.terminal_pixel_size
                report(1, f"{type(e).__name__}: {e}")
                return
            if parser.dropped_count:
                count, parser.dropped_count = parser.dropped_count, 0
                report(count)

        def process_selector_events(selector_events, final: bool = False) -> None:  # noqa: ANN001
            for last, (_key, mask) in loop_last(selector_events):
                if mask & EVENT_READ:
                    unicode_data = decode(read(fileno, 1024 * 4), final=final and last)
                    if not unicode_data:
                        break
                    guarded(parser.feed(unicode_data))
            guarded(parser.tick())

        try:
            while not self.exit_event.is_set():
                process_selector_events(selector.select(0.1))
            selector.unregister(self.fileno)
            process_selector_events(selector.select(0.1), final=True)
        finally:
            selector.close()
            try:
                for _event in parser.feed(""):
                    pass
            except (EOFError, ParseError):
                pass
