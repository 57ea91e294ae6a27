"""`gpuctl audit`: the audit logs of every node, merged, newest last.

Each node keeps its own log (gpuctl.daemon.audit); this verb reads them all (``GET /v1/audit``),
filters by time, department and node, and prints one table or, with ``--json``, ``{"records",
"problems", "unreachable"}``. A corrupt or truncated line of a node's log is reported on stderr
(and under ``problems``) with its node, file and line number, never dropped silently.

Exit codes: OK; USAGE (bad --since, unknown --node or --dept); UNREACHABLE (a node could not be
read: the others are still shown).
"""

from __future__ import annotations

import argparse
import time

from gpuctl.daemon.audit import MAX_RECORDS_PER_ANSWER
from gpuctl.exit_codes import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuctl audit`` options."""
    parser.add_argument("--since", metavar="DURATION|TIME",
                        help="only records since: a duration back from now (2h, 1d) or a time (ISO 8601, 'today 08:00')")
    parser.add_argument("--dept", metavar="DEPT", help="only changes that moved slices or leases of this department")
    parser.add_argument("--node", metavar="NAME", help="only this node's log")
    parser.add_argument("--limit", metavar="N", type=_limit,
                        help=f"only each node's newest N records (1 to {MAX_RECORDS_PER_ANSWER}; default: all the node sends, "
                             f"at most {MAX_RECORDS_PER_ANSWER})")


def _limit(text: str) -> int:
    """``--limit``'s value: a whole number from 1 to MAX_RECORDS_PER_ANSWER (argparse says the error)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_RECORDS_PER_ANSWER}, got {text!r}") from None
    if not 1 <= n <= MAX_RECORDS_PER_ANSWER:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_RECORDS_PER_ANSWER}, got {text!r}")
    return n


def run(args: argparse.Namespace) -> int:
    """Run ``gpuctl audit``; returns an ExitCode (errors are raised: gpuctl.cli.main says them and maps them to exit codes)."""
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from gpuctl.cli.context import check_node, load_config, open_fleet
    from gpuctl.cli.errors import UsageError
    from gpuctl.cli.output import emit_json, err, print_table
    from gpuctl.fleet.schedule import audit_records, what_text, who_text
    from gpuctl.timeparse import TimeError, parse_since, show_local

    cfg = load_config(args)
    check_node(cfg, args.node)
    if args.dept and args.dept != "unassigned" and args.dept not in {d.name for d in cfg.departments}:
        known = ", ".join(sorted(d.name for d in cfg.departments))
        raise UsageError(f"--dept: unknown department {args.dept!r} (known: {known}, unassigned)")
    since_s = None
    if args.since:
        try:
            since_s = parse_since(args.since, time.time())
        except TimeError as e:
            raise UsageError(f"--since: {e}") from None
    fleet = open_fleet(args, cfg)
    try:
        view = audit_records(fleet, since_s, args.dept, args.node, args.limit)
    finally:
        fleet.close()
    records, problems = view.records, view.problems
    for node in view.truncated:
        err(f"node {node}: only its newest records were sent; use --since" + ("" if args.limit else " or --limit"))
    if args.json:
        emit_json({"records": records, "problems": problems, "problems_omitted": view.problems_omitted,
                    "unreachable": {n: str(e) for n, e in view.errors.items()}})
    else:
        from rich.table import Table

        t = Table(title="audit (local time, newest last)", title_justify="left")
        for col in ("time", "node", "who", "action", "request", "what", "outcome"):
            t.add_column(col, no_wrap=col in ("time", "node"))
        for r in records:
            t.add_row(show_local(r.get("time_s") or 0), r["node_name"], who_text(r.get("who")),
                      str(r.get("action") or r.get("event")), str(r.get("request_id") or ""), what_text(r),
                      str(r.get("outcome") or ""))
        print_table(t)
    for p in problems:
        err(f"node {p['node']}: {p['file']} line {p['line']}: unreadable audit record ({p['error']}): "
             f"{p['text'][:80]!r}")
    for node, n in view.problems_omitted.items():
        err(f"node {node}: {n} more unreadable audit line(s) not listed")
    for node, why in view.errors.items():
        err(f"node {node}: its audit log is not shown: {why}")
    return ExitCode.UNREACHABLE if view.errors else ExitCode.OK
