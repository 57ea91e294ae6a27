"""The fleet verbs: `gpuctl status`, `gpuctl departments`, `gpuctl reassign`.

status: per node, each GPU's telemetry (N/A where the node cannot say) and its slices' owners.
departments: per department, GPU-equivalents owned on each node, leased and in all
(gpuctl.model.department_totals, the same sums as the console's header). reassign: plans with
gpuctl.fleet.reassign.prepare, shows the plan and asks on a terminal (never without one: --yes),
then executes it; its exit code is ReassignResult.exit_code.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpuctl.cli.context import add_move_arguments, check_node, load_config, open_fleet
from gpuctl.cli.errors import UsageError
from gpuctl.cli.output import confirm, console, emit_json, err, fraction_label, interactive, na, print_table
from gpuctl.cli.registry import Verb
from gpuctl.exit_codes import ExitCode
from gpuctl.format import human_bytes, memory_label, power, printable_text, safe_gpu_name, temperature
from gpuctl.model import UNASSIGNED, department_totals


def _status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", metavar="NAME", help="only this node")


def _departments_arguments(p: argparse.ArgumentParser) -> None:
    """`gpuctl departments` takes only the global flags."""


def _reassign_arguments(p: argparse.ArgumentParser) -> None:
    add_move_arguments(p, from_help="department giving slices ('unassigned' for new GPUs; 'any': free slices of the "
                                     "unassigned pool, then of the lowest-priority departments)",
                       drain_help="leased slices move when their lease ends",
                       revoke_help="end the leases of leased slices, then move")
    p.add_argument("--dry-run", action="store_true", help="show what would move, change nothing")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--request-id", metavar="ID", help="idempotency key: a re-run completes, never repeats")


def status_json(snapshot) -> dict[str, Any]:
    """The `gpuctl status --json` document (README documents it): nodes -> GPUs -> slices; null = N/A."""
    nodes = []
    for n in snapshot.nodes:
        gpus = []
        for g in n.gpus:
            s = g.sample
            gpus.append({
                "uuid": g.identity.uuid,
                "index": g.identity.index,
                "name": g.identity.name,
                "pci_bus_id": g.identity.pci_bus_id,
                "sm_util_pct": s.sm_util_pct if s else None,
                "memory_util_pct": s.memory_util_pct if s else None,
                "memory_used_bytes": s.memory_used_bytes if s else None,
                "memory_reserved_bytes": s.memory_reserved_bytes if s else None,
                "memory_total_bytes": (s.memory_total_bytes if s and s.memory_total_bytes is not None
                                       else g.identity.memory_total_bytes),
                "temperature_c": s.temperature_c if s else None,
                "power_w": s.power_w if s else None,
                "sm_clock_mhz": s.sm_clock_mhz if s else None,
                "processes_error": s.processes_error if s else None,
                "error": s.error if s else None,
                "outside_processes": g.outside_processes,
                "lease_processes": g.lease_processes,
                "slices": [{"id": x.id, "fraction": x.fraction, "department": x.department,
                            "leased": x.leased, "lease_id": x.lease_id,
                            "memory_quota_bytes": x.memory_quota_bytes, "pending": x.pending}
                           for x in g.slices],
            })
        nodes.append({"name": n.name, "reachable": n.reachable, "error": n.error,
                      "error_code": n.error_code, "backend": n.backend, "hostname": n.hostname,
                      "generation": n.generation, "gpus": gpus})
    return {"taken_at_s": snapshot.taken_at_s, "nodes": nodes}


def _print_status(snapshot, cfg) -> None:
    from rich.table import Table
    from rich.text import Text

    colors = {d.name: d.color for d in cfg.departments if d.color}
    con = console()
    for n in snapshot.nodes:
        if not n.reachable or n.error:
            con.print(Text(f"{'unreachable' if not n.reachable else 'error'}: {n.error}", style="bold red"))
            continue
        remote = ", ".join(printable_text(str(v), 200) for v in (n.hostname, n.backend))  # the node's words
        t = Table(title=Text(f"{n.name} ({remote}, generation {n.generation})"), title_justify="left")
        t.add_column("GPU", justify="right", no_wrap=True)
        t.add_column("name", no_wrap=True, overflow="ellipsis", max_width=14)
        for col in ("SM %", "memory", "temp", "power"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_column("slices", min_width=14)
        for g in n.gpus:
            s = g.sample
            slices = Text()
            for i, x in enumerate(g.slices):
                if i:
                    slices.append(" ")
                label = f"{x.department} {fraction_label(x.fraction)}" + (" 🔒" if x.leased else "")
                slices.append(label, style=colors.get(x.department) or ("dim" if x.department == "unassigned" else ""))
            name = Text(safe_gpu_name(g.identity.name))  # the node's words: never markup or escapes
            if s and s.error:
                t.add_row(str(g.identity.index), name, Text(s.error, style="red"), "", "", "", slices)
                continue
            mem_total = (s.memory_total_bytes if s else None) or g.identity.memory_total_bytes
            t.add_row(
                str(g.identity.index), name,
                na(s.sm_util_pct if s else None, "{:.0f}"),
                memory_label(s.memory_used_bytes if s else None, mem_total),
                temperature(s.temperature_c if s else None),
                power(s.power_w if s else None),
                slices)
        print_table(t)
        for g in n.gpus:
            for p in g.outside_processes or []:
                con.print(Text(f"GPU {g.identity.index}: outside gpuctl: pid {p['pid']} "
                               f"({p['user'] or 'user unknown'}), {human_bytes(p['memory_used_bytes'])}",
                               style="yellow"))


def cmd_status(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    check_node(cfg, args.node)
    fleet = open_fleet(args, cfg)
    try:
        snap = fleet.snapshot([args.node] if args.node else None)
    finally:
        fleet.close()
    if args.json:
        emit_json(status_json(snap))
    else:
        _print_status(snap, cfg)
    down = [n for n in snap.nodes if not n.reachable]
    for n in down:  # on stderr in every mode (the table shows it too)
        err(f"unreachable: {n.error}")
    return ExitCode.UNREACHABLE if down else ExitCode.OK


def departments_json(snapshot, cfg) -> dict[str, Any]:
    """Per department (gpuctl.model.department_totals: config order, then departments only the
    fleet knows, unassigned last): GPU-equivalents owned per node, leased and in all."""
    rows = []
    for t in department_totals(snapshot, [d.name for d in cfg.departments]):
        dept = cfg.department(t.name)
        row = {"name": t.name, "priority": dept.priority if dept else None, "gpu_equivalents": t.gpu_equivalents,
               "leased_gpu_equivalents": t.leased_gpu_equivalents, "slices": t.slices, "per_node": t.per_node}
        if dept is None and t.name != UNASSIGNED:
            row["unknown"] = True
        rows.append(row)
    unreachable = [n.name for n in snapshot.nodes if not n.reachable]
    return {"departments": rows, "unreachable_nodes": unreachable}


def cmd_departments(args: argparse.Namespace) -> int:
    cfg = load_config(args)
    fleet = open_fleet(args, cfg)
    try:
        snap = fleet.snapshot()
    finally:
        fleet.close()
    doc = departments_json(snap, cfg)
    if args.json:
        emit_json(doc)
    else:
        from rich.table import Table

        t = Table(title="GPU-equivalents per department and node", title_justify="left")
        t.add_column("department")
        t.add_column("priority", justify="right")
        node_names = [n.name for n in snap.nodes if n.reachable]
        for name in node_names:
            t.add_column(name, justify="right")
        t.add_column("total", justify="right")
        t.add_column("leased", justify="right")
        for r in doc["departments"]:
            t.add_row(r["name"], na(r["priority"]),
                      *[f"{r['per_node'].get(nn, 0):g}" for nn in node_names],
                      f"{r['gpu_equivalents']:g}", f"{r['leased_gpu_equivalents']:g}")
        print_table(t)
    for name in doc["unreachable_nodes"]:
        err(f"node {name} unreachable: its slices are not counted")
    return ExitCode.UNREACHABLE if doc["unreachable_nodes"] else ExitCode.OK


def _print_plan(p) -> None:
    """The planned moves, on stderr (stdout stays data), before the confirmation question."""
    from rich.table import Table

    t = Table(title=f"plan: {p.request.src} -> {p.request.dst} (request {p.request.request_id})",
              title_justify="left")
    for col in ("node", "GPU", "slice", "fraction", "leased"):
        t.add_column(col, no_wrap=True)
    for m in p.moves:
        t.add_row(m.node, str(m.gpu_index), m.slice_id, fraction_label(m.fraction), "yes" if m.leased else "")
    print_table(t, stderr=True)


def _print_reassign(result) -> None:
    from rich.table import Table

    req = result.plan.request
    verb = "would move" if req.dry_run else "moved"
    rows = ([(m, verb if not req.dry_run else "planned") for m in (result.plan.moves if req.dry_run else result.moved)]
            + [(m, "pending (drains when its lease ends)") for m in result.pending]
            + [(m, "already moved by an earlier run") for m in result.plan.already]
            + [(m, f"NOT moved: {why}") for moves, why in result.failed.values() for m in moves]
            + [(m, f"OUTCOME UNKNOWN (no answer): {why}") for moves, why in result.unknown.values() for m in moves])
    if rows:
        t = Table(title=f"reassign {req.src} -> {req.dst} (request {result.request_id})", title_justify="left")
        for col in ("node", "GPU", "slice", "fraction", "result"):
            t.add_column(col, no_wrap=col != "result")
        for m, what in rows:
            t.add_row(m.node, str(m.gpu_index), m.slice_id, fraction_label(m.fraction),
                      f"{what} (from {m.owner})" if m.owner else what)
        print_table(t)


def _reassign_messages(result) -> None:
    """Why anything asked for did not happen, on stderr, in every output mode (also --json)."""
    if result.plan.shortfall:
        err(f"nothing moved: {result.plan.shortfall}")
    if result.plan.replay_complete:
        err(f"request {result.request_id} is already complete: nothing more to move")
    for key, why in result.plan.skipped.items():
        err(f"skipped {key}: {why}")
    for node, (moves, why) in result.failed.items():
        err(f"node {node}: {len(moves)} slice(s) not moved: {why}")
    for node, (moves, why) in result.unknown.items():
        err(f"node {node}: outcome unknown for {len(moves)} slice(s) (no answer; they may have moved): {why}")
    if result.unknown:
        err(f"unknown outcome: run again with --request-id {result.request_id} when "
            f"{', '.join(sorted(result.unknown))} answer(s): it completes the request and never moves more "
            f"than asked")
    elif result.failed and (result.moved or result.pending):
        err(f"partial: run again with --request-id {result.request_id} to complete it")


def cmd_reassign(args: argparse.Namespace) -> int:
    from gpuctl.fleet.reassign import ReassignRequest, execute, prepare

    cfg = load_config(args)
    req = ReassignRequest(
        src=args.src, dst=args.dst, count=args.count, gpus=args.gpus, slice_ids=args.slice_ids,
        node=args.node, leased="drain" if args.drain else "revoke" if args.revoke else "refuse",
        request_id=args.request_id, dry_run=args.dry_run)
    check_node(cfg, args.node)
    fleet = open_fleet(args, cfg)
    try:
        p = prepare(fleet, req)
        if p.moves and not req.dry_run and not args.yes:
            if not interactive(args):
                raise UsageError("reassign changes ownership and no terminal is there to confirm: pass --yes "
                                 "(or --dry-run to see the plan)")
            what = (f"Move {len(p.moves)} slice(s) ({p.gpu_equivalents:g} GPU-equivalents) from {req.src} to "
                    f"{req.dst} on {', '.join(sorted({m.node for m in p.moves}))}"
                    + (f", {req.leased} {sum(m.leased for m in p.moves)} leased" if req.leased != "refuse" else "")
                    + "?")
            _print_plan(p)
            if not confirm(what):
                err("cancelled: nothing moved")
                return ExitCode.CONFLICT
        result = execute(fleet, p)
    finally:
        fleet.close()
    if args.json:
        doc = result.to_json()
        doc["exit_code"] = int(result.exit_code)
        emit_json(doc)
    else:
        _print_reassign(result)
    _reassign_messages(result)
    return result.exit_code


status = Verb(_status_arguments, cmd_status)
departments = Verb(_departments_arguments, cmd_departments)
reassign = Verb(_reassign_arguments, cmd_reassign)
