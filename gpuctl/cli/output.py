"""What the CLI writes: JSON and tables on stdout (data only), messages and questions on stderr.

Figures are formatted by gpuctl.format (the console uses the same functions), so "N/A", byte
sizes and slice fractions read the same in a table and on a screen.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import sys
from typing import Any

from gpuctl.format import fraction_label  # noqa: F401 - verb modules take it from here
from gpuctl.format import human_bytes as fmt_bytes  # noqa: F401 - verb modules take it from here
from gpuctl.format import na  # noqa: F401 - verb modules take it from here


#: The last diagnostic said (the message of a `--json` error document when a verb returns a
#: failing exit code without raising).
_last_message: str | None = None


def err(msg: str) -> None:
    """One diagnostic line on stderr, prefixed ``gpuctl: `` (flushed: it may precede a long step)."""
    global _last_message
    _last_message = msg
    print(f"gpuctl: {msg}", file=sys.stderr, flush=True)


def last_message() -> str | None:
    """The last message :func:`err` said in this process, or None."""
    return _last_message


#: Set once a verb wrote its JSON document: an error raised after it adds no second document.
_emitted = False


def emit_json(doc: Any) -> None:
    """`doc` as indented JSON on stdout (the ``--json`` output of every verb)."""
    global _emitted
    _emitted = True
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def json_emitted() -> bool:
    """True once :func:`emit_json` wrote a document in this process."""
    return _emitted


def console(*, stderr: bool = False, **kwargs: Any):
    """A rich Console for tables (stdout, or stderr for what precedes a question); `kwargs` go to
    rich's Console (width, ...). A closed stdout raises BrokenPipeError (see :func:`reader_gone`),
    where rich's own Console would exit 1 in silence."""
    from rich.console import Console

    class _CliConsole(Console):
        def on_broken_pipe(self) -> None:  # rich: "the reader of stdout went away"
            raise BrokenPipeError(errno.EPIPE, "stdout: its reader went away")

    return _CliConsole(stderr=stderr, highlight=False, **kwargs)


def stdout_reader_gone(exc: BaseException) -> bool:
    """True when `exc` is a broken pipe and stdout's reader went away (``gpuctl status | head -1``):
    the write end of a pipe with no reader polls as POLLERR on Linux. A broken pipe to a node or
    a child process is not this (it stays an error with its message)."""
    if not (isinstance(exc, OSError) and exc.errno == errno.EPIPE):
        return False
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def reader_gone(end_process: bool) -> int:
    """stdout's reader went away: say nothing more on stdout and end as coreutils tools do, by
    SIGPIPE (a shell shows 141) when this process is the `gpuctl` command (`end_process`), else
    return 141 (128 + SIGPIPE). stdout is pointed at /dev/null first, so the interpreter's final
    flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    if end_process:
        sys.stderr.flush()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    return 128 + signal.SIGPIPE


def interactive(args: Any) -> bool:
    """True when a question can be asked: stdin and stderr are a terminal and --json is off."""
    return sys.stdin.isatty() and sys.stderr.isatty() and not getattr(args, "json", False)


def confirm(question: str) -> bool:
    """Ask `question` on stderr, read one line of stdin; True only for y/yes. Callers check
    :func:`interactive` first: nothing prompts without a terminal."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


#: Column headers whose cells are identifiers a user copies into other commands (slice, lease,
#: schedule entry and request ids, endpoints, node and department names): never cut or wrapped.
ID_COLUMNS = frozenset({"id", "slice", "lease", "request", "endpoint", "node", "department", "GPU", "gpu", "uuid"})


#: Characters a rich table's lines end with (its right border), in the box styles gpuctl uses.
_RIGHT_EDGES = frozenset("┓┃┩│┘┐┤╮╯║╗╝╣╢╡╕╛┫┨┥┛")


#: Column headers that say what happened (the reason a slice did not move, an outcome): left out
#: only after every other describing column.
LAST_TO_GO = frozenset({"result", "outcome", "status", "note", "what", "state"})


def _plain(cell: Any) -> str:
    return cell.plain if hasattr(cell, "plain") else str(cell)


def _render(table: Any, width: int) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, highlight=False, color_system=None, legacy_windows=False).print(table)
    return buf.getvalue()


def _subset(table: Any, keep: list[int]) -> Any:
    """A copy of a rich Table with only the columns at `keep` (same title, rows, styles)."""
    from rich.table import Table

    t = Table(title=table.title, title_justify=table.title_justify, box=table.box, show_header=table.show_header)
    kept = [table.columns[i] for i in keep]
    for c in kept:
        t.add_column(c.header, justify=c.justify, no_wrap=c.no_wrap, overflow=c.overflow, min_width=c.min_width,
                     max_width=c.max_width, style=c.style)
    for r in range(table.row_count):
        t.add_row(*[c._cells[r] for c in kept], style=table.rows[r].style)
    return t


def print_table(table: Any, *, ids: frozenset[str] | set[str] = ID_COLUMNS, stderr: bool = False,
                width: int | None = None) -> list[str]:
    """Print a rich Table so that no identifier is cut: columns whose header is in `ids` keep
    their whole cells on one line (min_width = the longest cell); the others wrap; when the table
    still does not fit the width (the terminal's, 80 when piped), the rightmost other columns are
    left out one by one (said once on stderr); when even the ids alone do not fit, the lines are
    longer than the width rather than an id cut. Columns in LAST_TO_GO (result, outcome, ...) are
    left out last. Returns the headers left out."""
    con = console(stderr=stderr)
    width = width or con.width
    id_cells: list[str] = []
    for c in table.columns:
        if str(c.header) in ids:
            cells = [_plain(x) for x in c._cells]
            id_cells += [x for x in cells if x]
            c.no_wrap, c.overflow = True, "ignore"
            c.min_width = max([len(str(c.header))] + [len(x) for x in cells])
            c.max_width = None
        else:
            # may wrap, down to its longest header word or 10 characters (a column narrower than
            # that says nothing: it is left out instead)
            longest = max([len(x) for x in str(c.header).split()] + [len(_plain(x)) for x in c._cells] + [1])
            c.no_wrap, c.overflow = False, "fold"
            c.min_width = min(longest, max([len(x) for x in str(c.header).split()] + [10]))

    def intact(t: Any, w: int) -> bool:
        text = _render(t, w)
        body = [x.rstrip() for x in text.splitlines()[1 if t.title else 0:] if x.strip()]
        if any(x[-1] not in _RIGHT_EDGES for x in body):
            return False  # rich cropped the right edge: the table is wider than w
        words = [x for c in t.columns for x in str(c.header).split()]
        return all(x in text for x in id_cells) and all(x in text for x in words)

    # leave out other columns from the right until the rest fits, then take back, from the left,
    # any left out that fits again
    keep = list(range(len(table.columns)))
    others = [i for i in keep if str(table.columns[i].header) not in ids]
    last = [i for i in others if str(table.columns[i].header) in LAST_TO_GO]
    left_out: list[int] = []
    for i in [i for i in reversed(others) if i not in last] + last[::-1]:
        if intact(_subset(table, keep), width):
            break
        keep.remove(i)
        left_out.append(i)
    for i in sorted(left_out):
        trial = sorted(keep + [i])
        if intact(_subset(table, trial), width):
            keep = trial
    dropped = [str(table.columns[i].header) for i in sorted(set(left_out) - set(keep))]
    t = _subset(table, keep) if dropped else table
    if dropped:
        err(f"table {str(table.title or '').split(' (')[0]!r}: column(s) {', '.join(dropped)} left out to "
            f"keep ids whole in {width} columns (widen the terminal, or use --json)")
    w = width
    while not intact(t, w) and w < 1000:
        w += 10
    if w != width:
        con = console(stderr=stderr, width=w)
    con.print(t)
    return dropped
