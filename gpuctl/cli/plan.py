"""`gpuctl plan check|show|apply FILE`: declarative plans of department ownership over time.

- ``check``: validate the file (errors name file:line: key) and find over-commitment of the pool at
  any instant, naming the instant, the windows and who is short (by department priority).
- ``show``: ownership per department over time, as a table and a timeline chart.
- ``apply``: turn the plan into schedule entries on the nodes (gpuctl.fleet.plan_apply), replacing the
  entries of the previous application of the same plan; applying it again changes nothing.

Exit codes: OK; CONFIG (bad plan or fleet config); CONFLICT (check: over-commitment; apply: a
refused confirmation or a node refused an entry); PARTIAL (apply: some nodes not updated);
UNREACHABLE (the pool's capacity or the nodes could not be read); USAGE (bad --from/--to).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gpuctl.cli.actions import add_actions, inherit_options
from gpuctl.exit_codes import ExitCode

#: Default horizon of check/show/apply, seconds (7 days).
DEFAULT_HORIZON_S = 7 * 86400.0
#: Width of the timeline chart, characters.
CHART_WIDTH = 60
_BARS = " ▁▂▃▄▅▆▇█"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuctl plan`` and its actions."""
    sub = add_actions(parser, "plan_verb")
    for name, help_ in (("check", "validate a plan file and find over-commitment"),
                        ("show", "ownership per department over time (table and timeline)"),
                        ("apply", "install the plan's moves as schedule entries on the nodes")):
        p = sub.add_parser(name, help=help_, description=help_)
        inherit_options(parser, p)
        p.add_argument("file", metavar="FILE", help="plan file (TOML)")
        p.add_argument("--from", dest="from_", metavar="TIME", help="start of the period (default: now)")
        p.add_argument("--to", metavar="TIME", help="end of the period (default: 7 days later, or the last window's end)")
        if name == "apply":
            p.add_argument("--dry-run", action="store_true", help="show what would be installed, change nothing")
            p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def run(args: argparse.Namespace) -> int:
    """Run ``gpuctl plan ACTION FILE``; returns an ExitCode (errors are raised: gpuctl.cli.main says them and maps them to exit codes)."""
    return {"check": _check, "show": _show, "apply": _apply}[args.plan_verb](args)


def _context(args: argparse.Namespace) -> tuple[Any, Any, dict[str, int], float, float]:
    """(fleet config, plan, priorities, from_s, to_s). Raises ConfigError, UsageError."""
    from gpuctl.cli.context import load_config
    from gpuctl.cli.errors import UsageError
    from gpuctl.fleet.plan import load_plan
    from gpuctl.timeparse import TimeError, parse_time

    cfg = load_config(args)
    priorities = {d.name: d.priority for d in cfg.departments}
    plan = load_plan(args.file, priorities, {n.name for n in cfg.nodes})
    now = time.time()
    try:
        from_s = parse_time(args.from_, now) if args.from_ else now
        if args.to:
            to_s = parse_time(args.to, now)
        else:
            ends = [w.end_s for w in plan.windows if w.every is None]
            to_s = max([from_s + DEFAULT_HORIZON_S] + [e for e in ends if e <= from_s + 366 * 86400])
    except TimeError as e:
        raise UsageError(f"--from/--to: {e}") from None
    if to_s <= from_s:
        raise UsageError("--to: the period must end after it starts")
    return cfg, plan, priorities, from_s, to_s


def _pool_capacity(args: argparse.Namespace, cfg: Any, plan: Any) -> float:
    """The plan's capacity_gpus, else what the pool owns in the fleet now. Raises NodeError-free
    RuntimeError naming unreachable nodes."""
    if plan.capacity_gpus is not None:
        return plan.capacity_gpus
    from gpuctl.cli.context import open_fleet

    fleet = open_fleet(args, cfg)
    try:
        snap = fleet.snapshot()
    finally:
        fleet.close()
    down = [n.name for n in snap.nodes if not n.reachable]
    if down:
        raise RuntimeError(f"the pool's capacity is unknown: node(s) {', '.join(down)} unreachable "
                           f"(or set [plan] capacity_gpus in {plan.path})")
    return sum(s.fraction for n in snap.nodes for s in n.slices() if s.department == plan.pool)


def _check(args: argparse.Namespace) -> int:
    from gpuctl.cli.output import emit_json, err
    from gpuctl.fleet.plan import conflicts, segments
    from gpuctl.timeparse import show_local

    cfg, plan, prio, from_s, to_s = _context(args)
    try:
        capacity = _pool_capacity(args, cfg, plan)
    except RuntimeError as e:
        err(str(e))
        return ExitCode.UNREACHABLE
    segs = segments(plan, from_s, to_s, capacity, prio)
    found = conflicts(plan, segs, capacity)
    if args.json:
        emit_json({"plan": plan.name, "file": plan.path, "pool": plan.pool, "capacity_gpus": capacity,
                    "from_s": from_s, "to_s": to_s, "windows": len(plan.windows),
                    "conflicts": [c.to_json() for c in found], "ok": not found})
    else:
        print(f"{plan.path}: plan {plan.name!r}, {len(plan.windows)} window(s), pool {plan.pool} "
              f"({capacity:g} GPU-equivalents), {show_local(from_s)} .. {show_local(to_s)}")
    for c in found:
        shorts = "; ".join(f"{label} short by {v:g}" for label, v in c.short.items())
        err(f"over-committed at {show_local(c.at_s)} (until {show_local(c.until_s)}): "
             f"{', '.join(c.windows)} want {c.demand:g} of {c.capacity:g} GPU-equivalents; {shorts}")
    if not found and not args.json:
        print("OK: no over-commitment")
    return ExitCode.CONFLICT if found else ExitCode.OK


def timeline_rows(plan: Any, segs: list[Any], from_s: float, to_s: float, width: int = CHART_WIDTH) -> dict[str, str]:
    """Per department, a bar of `width` characters: each column is (to_s - from_s)/width seconds,
    its height the GPU-equivalents the department gets then, scaled to the largest value."""
    depts = list(dict.fromkeys(w.department for w in plan.windows))
    step = (to_s - from_s) / width
    values = {d: [0.0] * width for d in depts}
    for col in range(width):
        t = from_s + (col + 0.5) * step
        for s in segs:
            if s.start_s <= t < s.end_s:
                for d, g in s.by_department(plan).items():
                    values[d][col] = g
                break
    top = max([v for vs in values.values() for v in vs] + [1e-9])
    return {d: "".join(_BARS[round(v / top * (len(_BARS) - 1))] if v > 0 else "·" for v in vs)
            for d, vs in values.items()}


def _show(args: argparse.Namespace) -> int:
    from gpuctl.cli.output import console, emit_json, print_table
    from gpuctl.fleet.plan import segments
    from gpuctl.timeparse import show_local

    cfg, plan, prio, from_s, to_s = _context(args)
    try:
        capacity: float | None = _pool_capacity(args, cfg, plan)
    except RuntimeError as e:  # shown without shortfalls
        from gpuctl.cli.output import err

        err(f"{e}; shown without shortfalls")
        capacity = None
    segs = segments(plan, from_s, to_s, capacity, prio)
    depts = list(dict.fromkeys(w.department for w in plan.windows))
    if args.json:
        emit_json({"plan": plan.name, "from_s": from_s, "to_s": to_s, "segments": [
            {"start_s": s.start_s, "end_s": s.end_s, "gpus": s.by_department(plan),
             "short_gpus": {plan.windows[i].department: v for i, v in s.short.items()}} for s in segs]})
        return ExitCode.OK
    from rich.table import Table

    t = Table(title=f"plan {plan.name}: GPU-equivalents per department (local time)", title_justify="left")
    for col in ["from", "to", *depts]:
        t.add_column(col, no_wrap=True)
    for s in segs:
        by = s.by_department(plan)
        if not by:
            continue
        short = {plan.windows[i].department: v for i, v in s.short.items()}
        t.add_row(show_local(s.start_s), show_local(s.end_s),
                  *[f"{by.get(d, 0):g}" + (f" (short {short[d]:g})" if d in short else "") for d in depts])
    con = console()
    print_table(t)
    rows = timeline_rows(plan, segs, from_s, to_s)
    name_w = max(len(d) for d in rows)
    con.print(f"{'':{name_w}}  {show_local(from_s)}  ..  {show_local(to_s)}")
    for d, bar in rows.items():
        con.print(f"{d:{name_w}}  {bar}")
    return ExitCode.OK


def _apply(args: argparse.Namespace) -> int:
    from gpuctl.cli.context import open_fleet
    from gpuctl.cli.errors import UsageError
    from gpuctl.cli.output import confirm, emit_json, err, print_table
    from gpuctl.fleet.plan_apply import PoolSlice, plan_entries
    from gpuctl.fleet.reassign import _gpu_usable
    from gpuctl.timeparse import show_local

    cfg, plan, prio, from_s, to_s = _context(args)
    now = time.time()
    fleet = open_fleet(args, cfg)
    try:
        snap = fleet.snapshot()
        down = {n.name: n.error or "unreachable" for n in snap.nodes if not n.reachable}
        listing = fleet.fan_out(lambda c: c.schedule(), [n.name for n in snap.nodes if n.reachable])
        down.update({n: str(e) for n, e in listing.errors.items()})
        if down:
            for n, why in down.items():
                err(f"node {n}: {why}")
            err("nothing applied: every node's schedule must be read to apply a plan")
            return ExitCode.UNREACHABLE
        pool = [PoolSlice(n.name, s.id, g.identity.index, s.fraction) for n in snap.nodes for g in n.gpus
                if _gpu_usable(g) is None for s in g.slices if s.department == plan.pool]
        existing: dict[str, dict[str, Any]] = {}
        for node, doc in listing.values.items():
            for e in doc.get("entries", []):
                if e.get("plan") != plan.name or e.get("status") == "cancelled":
                    continue
                info = existing.setdefault(e["request_id"], {"slices": {}, "status": e["status"], "entry_ids": {}})
                info["slices"][node] = list(e["slice_ids"])
                info["entry_ids"][node] = e["id"]
        ap = plan_entries(plan, pool, existing, max(now, from_s), to_s, prio)
        add, cancel = ap.to_add, ap.cancel
        doc: dict[str, Any] = {"plan": plan.name, "dry_run": args.dry_run,
                               "add": [e.to_json() for e in add],
                               "unchanged": [e.request_id for e in ap.entries if e.installed],
                               "cancel": cancel, "warnings": ap.warnings, "failed": {}}
        for w in ap.warnings:
            err(w)
        if not args.json:
            from rich.table import Table

            t = Table(title=f"plan {plan.name}: schedule entries (local time)", title_justify="left")
            for col in ("at", "from", "to", "slices", "window", "state"):
                t.add_column(col, no_wrap=True)
            for e in ap.entries:
                t.add_row(show_local(e.at_s), e.src, e.dst, str(e.count), e.label,
                          "installed" if e.installed else ("would add" if args.dry_run else "add"))
            print_table(t)
            n_cancel = sum(len(v) for v in cancel.values())
            print(f"{len(add)} to add, {len(doc['unchanged'])} unchanged, {n_cancel} to cancel")
        if args.dry_run or (not add and not cancel):
            if args.json:
                emit_json(doc)
            return ExitCode.OK
        if not args.yes:
            if not (sys.stdin.isatty() and sys.stderr.isatty() and not args.json):
                raise UsageError("plan apply installs scheduled moves and no terminal is there to confirm: pass --yes "
                                 "(or --dry-run to see them)")
            if not confirm(f"Install {len(add)} and cancel {sum(len(v) for v in cancel.values())} schedule entries?"):
                err("cancelled: nothing applied")
                return ExitCode.CONFLICT
        nodes = sorted({n for e in add for n in e.slices} | set(cancel))

        def apply_node(client: Any) -> list[str]:
            done = []
            for eid in cancel.get(client.name, []):
                client.schedule_cancel(eid)
                done.append(f"cancelled {eid}")
            for e in add:
                sids = e.slices.get(client.name)
                if sids:
                    client.schedule_add({"request_id": e.request_id, "at_s": e.at_s, "from": e.src, "to": e.dst,
                                         "slice_ids": sids, "leased": e.leased, "plan": plan.name,
                                         "label": e.label[:200]})
                    done.append(e.request_id)
            return done

        res = fleet.fan_out(apply_node, nodes)
    finally:
        fleet.close()
    doc["failed"] = {n: str(e) for n, e in res.errors.items()}
    if args.json:
        emit_json(doc)
    for n, e in res.errors.items():
        err(f"node {n}: not fully applied: {e}; run plan apply again to complete it")
    if res.errors:
        return ExitCode.PARTIAL if res.values else ExitCode.UNREACHABLE
    return ExitCode.OK
