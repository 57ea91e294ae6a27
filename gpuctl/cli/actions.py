"""Small argparse helpers shared by verb modules that have actions of their own (schedule, plan).

Headless, stdlib only.
"""

from __future__ import annotations

import argparse


def inherit_options(parent: argparse.ArgumentParser, child: argparse.ArgumentParser) -> None:
    """Give `child` (an action's parser) every option `parent` (the verb's parser) has so far,
    with defaults suppressed, so ``gpuctl VERB ACTION --json`` and ``gpuctl VERB --json ACTION``
    both work. Flags (no value) stay flags."""
    for act in parent._actions:
        if not act.option_strings or act.dest == "help":
            continue
        if act.nargs == 0:
            child.add_argument(*act.option_strings, dest=act.dest, action="store_true",
                               default=argparse.SUPPRESS, help=act.help)
        else:
            child.add_argument(*act.option_strings, dest=act.dest, metavar=act.metavar,
                               default=argparse.SUPPRESS, help=act.help)


def add_actions(parser: argparse.ArgumentParser, dest: str) -> argparse._SubParsersAction:
    """Sub-actions of a verb (``gpuctl schedule add``), required, of the verb parser's class."""
    return parser.add_subparsers(dest=dest, metavar="ACTION", required=True, parser_class=type(parser))
