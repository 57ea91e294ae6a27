"""`gpuctl report`: GPU-hours owned, leased and used per department, node or GPU (sreport-like).

``gpuctl report [--since 30d] [--until T] [--by department|node|gpu] [--every day|week]
[--json | --csv] [--suggest]``. Times: a duration ago (30d, 12h), an ISO date or date-time (UTC
unless an offset is given), or ``now``. Exit status: 0; 2 for bad options (the message names the
option); 7 when a node did not answer (the report is printed, its rows marked incomplete).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from typing import Any

from gpuctl.daemon.usage_db import MINUTE_RETENTION_S
from gpuctl.exit_codes import ExitCode

#: Seconds "now" is taken back, so the minute that just ended is written on every node.
WRITE_DELAY_S = 5.0
#: Longest period a report may cover, seconds (the hourly retention).
MAX_PERIOD_S = 400 * 86400


class ReportUsageError(Exception):
    """A bad option of `gpuctl report`; the message names it."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `gpuctl report` (the global ones come from gpuctl.cli)."""
    p.add_argument("--since", default="30d", metavar="T",
                   help="start: a duration ago (30d, 12h, 2w), an ISO date/date-time (UTC), or now (default 30d)")
    p.add_argument("--until", default="now", metavar="T", help="end, same forms (default now)")
    p.add_argument("--by", choices=("department", "node", "gpu"), default="department",
                   help="one row per department (default), node or GPU")
    p.add_argument("--every", choices=("day", "week"), default=None,
                   help="one row per day or week (UTC; weeks start on Monday) and key")
    p.add_argument("--csv", action="store_true", help="CSV on stdout (one header line, then rows, then the total)")
    p.add_argument("--suggest", action="store_true",
                   help="what to move: idle owned capacity next to departments whose leases were refused")


def period(since: str, until: str, now_s: float) -> tuple[float, float]:
    """(since_s, until_s) from the option texts. Raises ReportUsageError naming the option."""
    from gpuctl.durations import DurationError, parse_time

    try:
        s = parse_time(since, now_s)
    except DurationError as e:
        raise ReportUsageError(f"--since: {e}") from None
    try:
        u = parse_time(until, now_s)
    except DurationError as e:
        raise ReportUsageError(f"--until: {e}") from None
    if u > now_s + 60:
        raise ReportUsageError(f"--until {until!r} is in the future; usage is known up to now")
    if u - s < 60:
        raise ReportUsageError(f"--since {since!r} must be at least a minute before --until {until!r}")
    if u - s > MAX_PERIOD_S:
        raise ReportUsageError(f"--since {since!r}: a report covers at most 400 days (hourly rows are kept 400 days)")
    if now_s - s > MINUTE_RETENTION_S - 3600:
        s = s // 3600 * 3600  # minutes are gone there: start at the hour (the report states its period)
    return s, u


def _fmt(v: Any, spec: str = "{:.1f}") -> str:
    return "?" if v is None else spec.format(v)


def _key_columns(by: str) -> list[str]:
    return {"department": ["department"], "node": ["node"], "gpu": ["node", "index", "gpu"]}[by]


def write_csv(report: dict[str, Any], out: Any) -> None:
    """The report as CSV: header, rows, then a ``total`` row (key columns "total"); unknown figures empty."""
    from gpuctl.fleet.usage_report import FIGURES

    cols = (["bucket"] if report["every"] else []) + _key_columns(report["by"]) + list(FIGURES) + ["incomplete"]
    w = csv.writer(out, lineterminator="\n")
    w.writerow(cols)
    for r in report["rows"] + [{**report["total"], **{c: "total" for c in _key_columns(report["by"])}}]:
        w.writerow(["" if r.get(c) is None else (f"{r[c]:.4f}" if isinstance(r[c], float) else r[c]) for c in cols])


def _print_table(report: dict[str, Any], suggestions: list[dict[str, Any]] | None) -> None:
    from rich.table import Table

    from gpuctl.cli.output import console, print_table
    from gpuctl.fleet.usage_report import FIGURES

    heads = {"owned_gpu_h": "owned GPU-h", "leased_gpu_h": "leased GPU-h", "used_gpu_h": "used GPU-h",
             "mean_sm_util_pct": "mean SM %", "idle_owned_gpu_h": "idle owned GPU-h", "outside_gpu_h": "outside GPU-h"}
    t = Table(title=f"usage {report['since']} .. {report['until']} ({report['hours']:.0f} h), "
                    f"{report['fleet_gpus']} GPUs = {report['fleet_gpu_hours']:.0f} GPU-h", title_justify="left")
    keys = (["bucket"] if report["every"] else []) + _key_columns(report["by"])
    for k in keys:
        t.add_column(k, no_wrap=True)
    for f in FIGURES:
        t.add_column(heads[f], justify="right")
    tot = report["total"]
    # a "note" column only where a row is incomplete (a node did not answer for its period)
    notes = any(r["incomplete"] for r in report["rows"]) or tot["incomplete"]
    if notes:
        t.add_column("note")
    for r in report["rows"]:
        t.add_row(*[str(r.get(k) if r.get(k) is not None else "?") for k in keys],
                  *[_fmt(r[f]) for f in FIGURES], *(["incomplete" if r["incomplete"] else ""] if notes else []))
    t.add_row(*(["total"] + [""] * (len(keys) - 1)), *[_fmt(tot[f]) for f in FIGURES],
              *(["incomplete" if tot["incomplete"] else ""] if notes else []), style="bold")
    print_table(t)
    con = console()
    if suggestions is not None:
        if not suggestions:
            con.print("nothing to move: no lease was refused for lack of free slices in this period")
        for s in suggestions:
            if s["command"]:
                con.print(f"{s['to']} (priority {s['to_priority']}) had {s['refusals']} lease request(s) refused; "
                              f"{s['from']} left {s['idle_owned_gpu_h']:.1f} owned GPU-h idle "
                              f"({100 * s['idle_share']:.0f} %):\n  {s['command']}")
            else:
                con.print(f"{s['to']} had {s['refusals']} lease request(s) refused; no department with idle "
                              f"owned slices of lower priority to take them from")


def run(args: argparse.Namespace) -> int:
    """Run `gpuctl report`; returns the exit status."""
    from gpuctl.cli.context import load_config, open_fleet
    from gpuctl.cli.output import emit_json
    from gpuctl.fleet.usage_report import build_report, collect, suggest

    try:
        if args.suggest and (args.by != "department" or args.every):
            raise ReportUsageError("--suggest works on one period by department: leave out --by and --every")
        if args.csv and args.json:
            raise ReportUsageError("--csv and --json: choose one")
        # the daemons write a minute within a second or two of its end: "now" is a few seconds ago
        since_s, until_s = period(args.since, args.until, time.time() - WRITE_DELAY_S)
    except ReportUsageError as e:
        print(f"gpuctl report: {e}", file=sys.stderr)
        return ExitCode.USAGE
    cfg = load_config(args)
    fleet = open_fleet(args, cfg)
    try:
        usage = collect(fleet, since_s, until_s, args.every)
    finally:
        fleet.close()
    report = build_report(usage, args.by, node_order=[n.name for n in cfg.nodes])
    suggestions = None
    if args.suggest:
        suggestions = suggest(report, {d.name: d.priority for d in cfg.departments})
        report["suggestions"] = suggestions
    if args.json:
        emit_json(report)
    elif args.csv:
        write_csv(report, sys.stdout)
    else:
        _print_table(report, suggestions)
    for name, reason in report["unreachable_nodes"].items():
        print(f"gpuctl report: node {name} did not answer; rows it may add to are marked incomplete ({reason})",
              file=sys.stderr)
    return ExitCode.UNREACHABLE if report["unreachable_nodes"] else ExitCode.OK
