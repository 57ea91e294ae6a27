"""`gpuctl schedule add|list|cancel`: reassignments the nodes execute themselves, at a time.

``add`` plans concrete slice moves now (as ``gpuctl reassign`` does, on a fleet snapshot) and
installs each node's part in its gpuctld as a durable schedule entry, all under one request id:
re-running the same command with ``--request-id`` completes a partly installed schedule and never
installs more than asked. The nodes execute their entries at the time whether or not any gpuctl
runs (gpuctl.daemon.schedule). Times: see gpuctl.timeparse; stored in UTC, shown in local time.

Exit codes: OK; USAGE (bad time, department, amount); NOTHING_TO_DO (not enough slices to plan);
PARTIAL (installed on some nodes, not all); UNREACHABLE (no node could be asked); CONFLICT (the
request id names another schedule, a refused confirmation, or cancel of an entry that already ran).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gpuctl.cli.actions import add_actions, inherit_options
from gpuctl.cli.context import add_move_arguments
from gpuctl.exit_codes import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuctl schedule`` and its actions."""
    sub = add_actions(parser, "schedule_verb")
    a = sub.add_parser("add", help="schedule a reassignment at a time (executed by the nodes)",
                       description="schedule a reassignment at a time; each node executes its part itself")
    inherit_options(parser, a)
    a.add_argument("--at", required=True, metavar="TIME",
                   help="+DURATION (+2h), 'tomorrow 08:00', or ISO 8601 with or without zone (local assumed)")
    add_move_arguments(a, from_help="department giving slices",
                       drain_help="at the time, leased slices move when their lease ends",
                       revoke_help="at the time, end leases of leased slices (after --grace)")
    a.add_argument("--grace", metavar="DURATION", help="with --revoke: leases end this long after the time (e.g. 10m)")
    a.add_argument("--request-id", metavar="ID", help="idempotency key: a re-run completes, never adds twice")
    a.add_argument("--dry-run", action="store_true", help="show the planned moves, install nothing")
    a.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    ls = sub.add_parser("list", help="scheduled entries of every node (planned, waiting, done, late, failed)")
    inherit_options(parser, ls)
    ls.add_argument("--node", metavar="NAME", help="only this node")
    c = sub.add_parser("cancel", help="cancel a planned entry on every node that holds it")
    inherit_options(parser, c)
    c.add_argument("entry_id", metavar="ID", help="entry id (s-...) as `gpuctl schedule list` shows")


def run(args: argparse.Namespace) -> int:
    """Run ``gpuctl schedule ACTION``; returns an ExitCode (errors are raised: gpuctl.cli.main says them and maps them to exit codes)."""
    return {"add": _add, "list": _list, "cancel": _cancel}[args.schedule_verb](args)


def _add(args: argparse.Namespace) -> int:
    from gpuctl.cli.context import check_node, load_config, open_fleet
    from gpuctl.cli.errors import UsageError
    from gpuctl.cli.output import err
    from gpuctl.fleet.schedule import ScheduleError, ScheduleRequest, install, prepare
    from gpuctl.timeparse import TimeError, parse_duration, parse_time, show_local

    cfg = load_config(args)
    check_node(cfg, args.node)
    now = time.time()
    try:
        at_s = parse_time(args.at, now)
    except TimeError as e:
        raise UsageError(f"--at: {e}") from None
    if at_s <= now:
        raise UsageError(f"--at: {show_local(at_s)} is in the past (now {show_local(now)}); give a later time")
    if args.grace and not args.revoke:
        raise UsageError("--grace: only with --revoke (how long leases last after the time)")
    try:
        grace_s = parse_duration(args.grace) if args.grace else 0.0
    except TimeError as e:
        raise UsageError(f"--grace: {e}") from None
    req = ScheduleRequest(at_s=at_s, src=args.src, dst=args.dst, count=args.count, gpus=args.gpus,
                          slice_ids=args.slice_ids, node=args.node,
                          leased="drain" if args.drain else "revoke" if args.revoke else "refuse",
                          grace_s=grace_s, request_id=args.request_id, relative=args.at.strip().startswith("+"),
                          dry_run=args.dry_run)
    fleet = open_fleet(args, cfg)
    try:
        try:
            sp = prepare(fleet, req)
        except ScheduleError as e:
            err(str(e))
            return e.exit_code
        if not sp.moves:
            err(f"request {sp.request_id} is already installed on every node that needs it: nothing more to add")
        elif not req.dry_run and not args.yes:
            if not (sys.stdin.isatty() and sys.stderr.isatty() and not args.json):
                raise UsageError("schedule add installs scheduled moves and no terminal is there to confirm: "
                                 "pass --yes (or --dry-run to see the plan)")
            from gpuctl.cli.output import confirm

            if not confirm(f"At {show_local(sp.at_s)}, move {len(sp.moves)} slice(s) ({sp.gpu_equivalents:g} "
                            f"GPU-equivalents) from {req.src} to {req.dst} on {', '.join(sorted(sp.by_node))}?"):
                err("cancelled: nothing scheduled")
                return ExitCode.CONFLICT
        result = install(fleet, sp)
    finally:
        fleet.close()
    doc = result.to_json()
    doc["at"] = show_local(sp.at_s)
    for node, why in result.failed.items():
        err(f"node {node}: not installed ({len(sp.by_node[node])} slice(s)): {why}")
    _report(args, doc)
    if result.exit_code == ExitCode.PARTIAL:
        err(f"partial: run again with --request-id {sp.request_id} to complete it")
    return result.exit_code


def _report(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    from gpuctl.cli.output import emit_json, fraction_label, print_table

    if args.json:
        emit_json(doc)
        return
    from rich.table import Table

    verb = "would schedule" if doc["dry_run"] else "scheduled"
    t = Table(title=f"{verb}: {doc['from']} -> {doc['to']} at {doc['at']} (request {doc['request_id']})",
              title_justify="left")
    for col in ("node", "GPU", "slice", "fraction", "result"):
        t.add_column(col, no_wrap=col != "result")
    for m in doc["planned"]:
        st = doc["nodes"].get(m["node"], {})
        t.add_row(m["node"], str(m["gpu_index"]), m["slice_id"], fraction_label(m["fraction"]),
                  st.get("status", "planned") + (f": {st['error']}" if st.get("error") else ""))
    for m in doc["already"]:
        t.add_row(m["node"], "", m["slice_id"], fraction_label(m["fraction"]), "already installed")
    print_table(t)


def _list(args: argparse.Namespace) -> int:
    from gpuctl.cli.context import check_node, load_config, open_fleet
    from gpuctl.cli.output import emit_json, err, print_table
    from gpuctl.fleet.schedule import entries, entry_note
    from gpuctl.timeparse import show_local

    cfg = load_config(args)
    check_node(cfg, args.node)
    fleet = open_fleet(args, cfg)
    try:
        found, errors = entries(fleet, args.node)
    finally:
        fleet.close()
    if args.json:
        emit_json({"entries": found, "unreachable": {n: str(err) for n, err in errors.items()}})
    else:
        from rich.table import Table

        t = Table(title="schedule (local time)", title_justify="left")
        for col in ("id", "at", "node", "from", "to", "slices", "status", "note"):
            t.add_column(col, no_wrap=col != "note")
        for e in found:
            t.add_row(e["id"], show_local(e["at_s"]), e["node"], e["from"], e["to"], str(len(e["slice_ids"])),
                      e["status"], entry_note(e))
        print_table(t)
    for node, why in errors.items():
        err(f"node {node}: its schedule is not shown: {why}")
    return ExitCode.UNREACHABLE if errors else ExitCode.OK


def _cancel(args: argparse.Namespace) -> int:
    from gpuctl.cli.context import load_config, open_fleet
    from gpuctl.cli.output import emit_json, err
    from gpuctl.fleet.schedule import cancel

    cfg = load_config(args)
    fleet = open_fleet(args, cfg)
    try:
        cancelled, refused, unreachable = cancel(fleet, args.entry_id)
    finally:
        fleet.close()
    if args.json:
        emit_json({"entry_id": args.entry_id, "cancelled": cancelled,
                    "refused": {n: str(e) for n, e in refused.items()},
                    "unreachable": {n: str(e) for n, e in unreachable.items()}})
    else:
        for n in cancelled:
            print(f"{n}: cancelled {args.entry_id}")
    for n, e in refused.items():
        err(f"node {n}: {e}")
    for n, e in unreachable.items():
        err(f"node {n} unreachable: its part (if any) is not cancelled: {e}")
    if refused:
        return ExitCode.CONFLICT
    if unreachable:
        return ExitCode.PARTIAL if cancelled else ExitCode.UNREACHABLE
    if not cancelled:
        err(f"no schedule entry {args.entry_id!r} on any node (see `gpuctl schedule list`)")
        return ExitCode.USAGE
    return ExitCode.OK
