"""`gpuctl`: the command line. Bare `gpuctl` opens the console; verbs do the same from scripts.

stdout carries data only (tables, or JSON with `--json`); diagnostics go to stderr; exit codes are
`gpuctl.exit_codes.ExitCode` (README.md has the table), chosen by the one table of
gpuctl.cli.errors.exit_code_for. Nothing prompts without a terminal: a change that needs
confirmation fails with a message naming `--yes`. Verbs live in their own modules, listed in
gpuctl.cli.registry; only the verb being parsed or run is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from gpuctl import __version__
from gpuctl.cli.context import VALUE_FLAGS, add_globals
from gpuctl.cli.errors import UsageError, error_document, exit_code_for, known_exit_code
from gpuctl.cli.output import emit_json, err, json_emitted, last_message, reader_gone, stdout_reader_gone
from gpuctl.cli.registry import VERBS, load
from gpuctl.exit_codes import ExitCode

__all__ = ["main", "build_parser", "UsageError"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D401 - argparse hook
        raise UsageError(f"{self.prog}: {message}")


def verb_of(argv: Sequence[str]) -> str | None:
    """The verb named in `argv`: the first word that is neither a flag nor a global flag's value
    (None when there is none, e.g. bare `gpuctl` or `gpuctl --help`)."""
    skip = False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok == "--":
            return None
        if tok.startswith("--") and "=" not in tok:
            # argparse accepts unambiguous prefixes (--conf FILE): they take a value too
            skip = any(flag.startswith(tok) for flag in VALUE_FLAGS) and len(tok) > 2
            continue
        if tok.startswith("-"):
            continue
        return tok
    return None


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The `gpuctl` argument parser: every verb as a subcommand with its summary; only `verb`'s
    own arguments are added (its module is imported), so the others cost no import."""
    parser = _Parser(prog="gpuctl", description="Elastic GPU fleet: console, CLI and scripted mode.")
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    add_globals(parser, top=True)
    parser.add_argument("--readonly", action="store_true", help="console: no reassignment possible")
    parser.add_argument("--theme", metavar="NAME", help="console theme (gpuctl-dark, gpuctl-light, high-contrast)")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for name, (_, summary) in VERBS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        add_globals(p, top=False)
        if name == verb:
            load(name).add_arguments(p)
    return parser


def _wants_json(argv: Sequence[str]) -> bool:
    """True when `--json` is among the flags (before `--`): also when the rest failed to parse."""
    for tok in argv:
        if tok == "--":
            return False
        if tok == "--json":
            return True
    return False


def _fail(code: int, message: str, as_json: bool) -> int:
    """Say `message` on stderr and, with --json (unless the verb already wrote its document), put
    the error document (gpuctl.cli.errors.error_document) on stdout; return `code`."""
    err(message)
    if as_json and not json_emitted():
        emit_json(error_document(code, message))
    return int(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gpuctl`; returns the exit code (ExitCode). With `--json`, every error is also
    a JSON document on stdout: ``{"error": {"code", "name", "message"}}``."""
    from_process_argv = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    named = verb_of(argv)
    as_json = _wants_json(argv)
    try:
        args = build_parser(named if named in VERBS else None).parse_args(argv)
    except UsageError as exc:
        msg = str(exc)  # "gpuctl: ..." or "gpuctl VERB: ..." (argparse's prog)
        return _fail(ExitCode.USAGE, msg.removeprefix("gpuctl: ").removeprefix("gpuctl "), as_json)
    verb = args.verb or "console"
    args.process_entry = from_process_argv  # this process is the command (see context.open_fleet)
    as_json = bool(getattr(args, "json", False))
    if getattr(args, "verbose", False) and verb not in ("console", "demo"):  # the console owns the terminal
        from gpuctl.verbose import enable_verbose

        enable_verbose()
    try:
        code = int(load(verb).run(args))
        if code != ExitCode.OK and as_json and not json_emitted() and verb not in ("run", "console", "demo"):
            # a verb that failed without raising and without its document: the error document
            doc = error_document(code, "")
            doc["error"]["message"] = last_message() or f"failed ({doc['error']['name'] or code})"
            emit_json(doc)
        return code
    except BaseException as exc:  # noqa: BLE001 - the one place an exception becomes an exit code
        if isinstance(exc, SystemExit):
            raise
        if stdout_reader_gone(exc):  # `gpuctl status | head -1`: ended by SIGPIPE, as coreutils are
            return reader_gone(from_process_argv)
        if known_exit_code(exc) is not None:
            return _fail(exit_code_for(exc), "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc),
                         as_json)
        if os.environ.get("GPUCTL_DEBUG"):
            raise
        return _fail(exit_code_for(exc),
                     f"internal error: {type(exc).__name__}: {exc} (set GPUCTL_DEBUG=1 for a traceback)", as_json)
