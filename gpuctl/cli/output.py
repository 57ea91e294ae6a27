"""What the CLI writes: JSON and tables on stdout (data only), messages and questions on stderr.

Figures are formatted by gpuctl.format (the console uses the same functions), so "N/A", byte
sizes and slice fractions read the same in a table and on a screen.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpuctl.format import fraction_label  # noqa: F401 - verb modules take it from here
from gpuctl.format import human_bytes as fmt_bytes  # noqa: F401 - verb modules take it from here
from gpuctl.format import na  # noqa: F401 - verb modules take it from here


def err(msg: str) -> None:
    """One diagnostic line on stderr, prefixed ``gpuctl: `` (flushed: it may precede a long step)."""
    print(f"gpuctl: {msg}", file=sys.stderr, flush=True)


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


def console(*, stderr: bool = False):
    """A rich Console for tables (stdout, or stderr for what precedes a question)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def interactive(args: Any) -> bool:
    """True when a question can be asked: stdin and stderr are a terminal and --json is off."""
    return sys.stdin.isatty() and sys.stderr.isatty() and not getattr(args, "json", False)


def confirm(question: str) -> bool:
    """Ask `question` on stderr, read one line of stdin; True only for y/yes. Callers check
    :func:`interactive` first: nothing prompts without a terminal."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")
