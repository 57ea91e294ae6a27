"""`gpuctl`: the command line. Bare `gpuctl` opens the console; verbs do the same from scripts.

stdout carries data only (tables, or JSON with `--json`); diagnostics go to stderr; exit codes are
`gpuctl.exit_codes.ExitCode` (README.md has the table). Nothing prompts without a terminal: a
change that needs confirmation fails with a message naming `--yes`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from gpuctl import __version__
from gpuctl.exit_codes import ExitCode
from gpuctl.widgets.format import human_bytes as fmt_bytes  # noqa: F401 - re-exported for verb modules

class UsageError(Exception):
    """Bad command-line input; the message names the flag."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D401 - argparse hook
        raise UsageError(f"{self.prog}: {message}")


def _add_globals(p: argparse.ArgumentParser, *, top: bool) -> None:
    d = None if top else argparse.SUPPRESS
    p.add_argument("--config", metavar="FILE", default=d,
                   help="fleet config (default: $XDG_CONFIG_HOME/gpuctl/fleet.toml)")
    p.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="print JSON on stdout (for scripts)")
    p.add_argument("--ssh-config", metavar="FILE", default=d, help="SSH client config (default ~/.ssh/config)")
    p.add_argument("--known-hosts", metavar="FILE", default=d, help="known_hosts file (default ~/.ssh/known_hosts)")
    p.add_argument("--accept-new-host-key", action="store_true",
                   default=False if top else argparse.SUPPRESS,
                   help="trust and record host keys not yet in known_hosts (never a changed one)")
    p.add_argument("-v", "--verbose", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="say on stderr how each node was reached (which SSH control channel)")


def build_parser() -> argparse.ArgumentParser:
    """The whole `gpuctl` argument parser (verbs as subcommands)."""
    parser = _Parser(prog="gpuctl", description="Elastic GPU fleet: console, CLI and scripted mode.")
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    _add_globals(parser, top=True)
    parser.add_argument("--readonly", action="store_true", help="console: no reassignment possible")
    parser.add_argument("--theme", metavar="NAME", help="console theme (gpuctl-dark, gpuctl-light, high-contrast)")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    def verb(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _add_globals(p, top=False)
        return p

    p = verb("status", "per-node GPU telemetry and slice owners")
    p.add_argument("--node", metavar="NAME", help="only this node")

    verb("departments", "slices owned by each department, in GPU-equivalents per node")

    p = verb("reassign", "move slices from one department to another")
    p.add_argument("--from", dest="src", required=True, metavar="DEPT", help="department giving slices ('unassigned' for new GPUs)")
    p.add_argument("--to", dest="dst", required=True, metavar="DEPT", help="department receiving them")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--count", type=int, metavar="N", help="number of slices")
    amount.add_argument("--gpus", type=float, metavar="X", help="GPU-equivalents (e.g. 1.5)")
    amount.add_argument("--slice", dest="slice_ids", action="append", metavar="ID", help="a slice id (repeatable)")
    p.add_argument("--node", metavar="NAME", help="only slices of this node")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--drain", action="store_true", help="leased slices move when their lease ends")
    mode.add_argument("--revoke", action="store_true", help="end the leases of leased slices, then move")
    p.add_argument("--dry-run", action="store_true", help="show what would move, change nothing")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--request-id", metavar="ID", help="idempotency key: a re-run completes, never repeats")

    p = verb("config", "fleet config tools")
    csub = p.add_subparsers(dest="config_verb", metavar="ACTION", parser_class=_Parser, required=True)
    c = csub.add_parser("check", help="validate the fleet config and print what it defines")
    _add_globals(c, top=False)
    c = csub.add_parser("path", help="print where the fleet config is looked for")
    _add_globals(c, top=False)

    p = verb("demo", "start simulated node daemons (gpuctld --backend simulated) and open the console on them")
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--seed", type=int, default=0, help="simulation seed (default 0)")
    p.add_argument("--no-console", action="store_true",
                   help="start the daemons, print the config path and wait (Ctrl-C or SIGTERM stops them)")
    p.add_argument("--write-config", metavar="FILE",
                   help="also write the demo fleet's config to FILE (use it with --config or GPUCTL_CONFIG)")
    p.add_argument("--readonly", action="store_true", default=argparse.SUPPRESS,
                   help="console: no reassignment possible (a badge says so)")
    p.add_argument("--theme", metavar="NAME", default=argparse.SUPPRESS,
                   help="console theme: gpuctl-dark (default), gpuctl-light, high-contrast")

    p = verb("console", "open the console (same as bare gpuctl)")
    p.add_argument("--readonly", action="store_true", default=argparse.SUPPRESS,
                   help="no reassignment possible (a badge says so)")
    p.add_argument("--theme", metavar="NAME", default=argparse.SUPPRESS,
                   help="gpuctl-dark (default), gpuctl-light, high-contrast")

    from gpuctl.leases_cli import add_lease_verbs  # lease, release, leases, run

    add_lease_verbs(verb)
    from gpuctl.bootstrap_cli import add_node_verbs  # node bootstrap

    add_node_verbs(verb)
    return parser


# --------------------------------------------------------------------------- output helpers


def _err(msg: str) -> None:
    print(f"gpuctl: {msg}", file=sys.stderr)


def _emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def _console():
    from rich.console import Console

    return Console(highlight=False)


def fmt_fraction(f: float) -> str:
    """1 -> "1", 0.5 -> "1/2", 0.25 -> "1/4", 0.125 -> "1/8"."""
    if abs(f - 1) < 1e-9:
        return "1"
    for d in (2, 4, 8):
        if abs(f * d - round(f * d)) < 1e-9:
            return f"{round(f * d)}/{d}"
    return f"{f:g}"


def _na(v: Any, fmt: str = "{}") -> str:
    return "N/A" if v is None else fmt.format(v)


# --------------------------------------------------------------------------- config + fleet


def _load_config(args: argparse.Namespace):
    from gpuctl.config import load_config

    path, origin = config_path(args)
    if not path.exists():
        hint = ("" if origin == "--config" else
                " or pass --config FILE (or set GPUCTL_CONFIG)")
        raise FileNotFoundError(
            f"no fleet config at {path} (from {origin}): write one (see README 'Config file'){hint}; "
            f"`gpuctl demo` runs without one")
    return load_config(path)


def config_path(args: argparse.Namespace) -> tuple[Path, str]:
    """Where the fleet config is read from, and why: --config, then $GPUCTL_CONFIG, then
    $XDG_CONFIG_HOME/gpuctl/fleet.toml."""
    from gpuctl.config import default_config_path

    if getattr(args, "config", None):
        return Path(args.config), "--config"
    if os.environ.get("GPUCTL_CONFIG"):
        return Path(os.environ["GPUCTL_CONFIG"]), "$GPUCTL_CONFIG"
    return default_config_path(), "the default path"


def _check_node(cfg, name: str | None) -> None:
    """Raise UsageError naming --node when `name` is given and not a node of the config."""
    if name and cfg.node(name) is None:
        raise UsageError(f"--node: unknown node {name!r} (known: {', '.join(n.name for n in cfg.nodes)})")


def _fleet(args: argparse.Namespace, cfg):
    from gpuctl.client import FleetClient, default_transport_factory
    from gpuctl.config import ConfigError

    if not cfg.nodes:
        raise ConfigError(str(cfg.path), "defines no nodes: add a [[node]] table (see README 'Config file')")

    return FleetClient(cfg, default_transport_factory(
        ssh_config_path=getattr(args, "ssh_config", None),
        known_hosts_path=getattr(args, "known_hosts", None),
        accept_new_host_key=bool(getattr(args, "accept_new_host_key", False))))


# --------------------------------------------------------------------------- status


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

    from gpuctl.widgets.format import memory_label

    colors = {d.name: d.color for d in cfg.departments if d.color}
    con = _console()
    for n in snapshot.nodes:
        if not n.reachable or n.error:
            con.print(Text(f"{'unreachable' if not n.reachable else 'error'}: {n.error}", style="bold red"))
            continue
        t = Table(title=f"{n.name} ({n.hostname}, {n.backend}, generation {n.generation})",
                  title_justify="left")
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
                label = f"{x.department} {fmt_fraction(x.fraction)}" + (" 🔒" if x.leased else "")
                slices.append(label, style=colors.get(x.department) or ("dim" if x.department == "unassigned" else ""))
            if s and s.error:
                t.add_row(str(g.identity.index), g.identity.name, Text(s.error, style="red"), "", "", "", slices)
                continue
            mem_total = (s.memory_total_bytes if s else None) or g.identity.memory_total_bytes
            t.add_row(
                str(g.identity.index), g.identity.name,
                _na(s.sm_util_pct if s else None, "{:.0f}"),
                memory_label(s.memory_used_bytes if s else None, mem_total),
                _na(s.temperature_c if s else None, "{:.0f} °C"),
                _na(s.power_w if s else None, "{:.0f} W"),
                slices)
        con.print(t)


def cmd_status(args: argparse.Namespace) -> int:
    cfg = _load_config(args)
    _check_node(cfg, args.node)
    fleet = _fleet(args, cfg)
    try:
        snap = fleet.snapshot([args.node] if args.node else None)
    finally:
        fleet.close()
    if args.json:
        _emit_json(status_json(snap))
    else:
        _print_status(snap, cfg)
    down = [n for n in snap.nodes if not n.reachable]
    if args.json:  # the table already shows it; with --json, say it where a human reads
        for n in down:
            _err(f"unreachable: {n.error}")
    return ExitCode.UNREACHABLE if down else ExitCode.OK


# --------------------------------------------------------------------------- departments


def departments_json(snapshot, cfg) -> dict[str, Any]:
    """Per department: GPU-equivalents owned per node, busy (leased) and idle, in config order."""
    from gpuctl.model import UNASSIGNED

    order = [d.name for d in cfg.departments] + [UNASSIGNED]
    rows: dict[str, dict[str, Any]] = {
        name: {"name": name, "priority": (cfg.department(name).priority if cfg.department(name) else None),
               "gpu_equivalents": 0.0, "busy_gpu_equivalents": 0.0, "slices": 0, "per_node": {}}
        for name in order}
    for n in snapshot.nodes:
        for s in n.slices():
            r = rows.setdefault(s.department, {"name": s.department, "priority": None, "gpu_equivalents": 0.0,
                                               "busy_gpu_equivalents": 0.0, "slices": 0, "per_node": {},
                                               "unknown": True})
            r["gpu_equivalents"] += s.fraction
            r["slices"] += 1
            if s.leased:
                r["busy_gpu_equivalents"] += s.fraction
            r["per_node"][n.name] = r["per_node"].get(n.name, 0.0) + s.fraction
    unreachable = [n.name for n in snapshot.nodes if not n.reachable]
    return {"departments": list(rows.values()), "unreachable_nodes": unreachable}


def cmd_departments(args: argparse.Namespace) -> int:
    cfg = _load_config(args)
    fleet = _fleet(args, cfg)
    try:
        snap = fleet.snapshot()
    finally:
        fleet.close()
    doc = departments_json(snap, cfg)
    if args.json:
        _emit_json(doc)
    else:
        from rich.table import Table

        t = Table(title="GPU-equivalents per department and node", title_justify="left")
        t.add_column("department")
        t.add_column("priority", justify="right")
        node_names = [n.name for n in snap.nodes if n.reachable]
        for name in node_names:
            t.add_column(name, justify="right")
        t.add_column("total", justify="right")
        t.add_column("busy", justify="right")
        for r in doc["departments"]:
            t.add_row(r["name"], _na(r["priority"]),
                      *[f"{r['per_node'].get(nn, 0):g}" for nn in node_names],
                      f"{r['gpu_equivalents']:g}", f"{r['busy_gpu_equivalents']:g}")
        _console().print(t)
    for name in doc["unreachable_nodes"]:
        _err(f"node {name} unreachable: its slices are not counted")
    return ExitCode.UNREACHABLE if doc["unreachable_nodes"] else ExitCode.OK


# --------------------------------------------------------------------------- reassign


def _confirm(question: str) -> bool:
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _print_plan(p) -> None:
    """The planned moves, on stderr (stdout stays data), before the confirmation question."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"plan: {p.request.src} -> {p.request.dst} (request {p.request.request_id})",
              title_justify="left")
    for col in ("node", "GPU", "slice", "fraction", "leased"):
        t.add_column(col, no_wrap=True)
    for m in p.moves:
        t.add_row(m.node, str(m.gpu_index), m.slice_id, fmt_fraction(m.fraction), "yes" if m.leased else "")
    Console(stderr=True, highlight=False).print(t)


def _print_reassign(result) -> None:
    from rich.table import Table

    con = _console()
    req = result.plan.request
    verb = "would move" if req.dry_run else "moved"
    rows = ([(m, verb if not req.dry_run else "planned") for m in (result.plan.moves if req.dry_run else result.moved)]
            + [(m, "pending (drains when its lease ends)") for m in result.pending]
            + [(m, "already moved by an earlier run") for m in result.plan.already]
            + [(m, f"NOT moved: {err}") for moves, err in result.failed.values() for m in moves])
    if rows:
        t = Table(title=f"reassign {req.src} -> {req.dst} (request {result.request_id})", title_justify="left")
        for col in ("node", "GPU", "slice", "fraction", "result"):
            t.add_column(col, no_wrap=col != "result")
        for m, what in rows:
            t.add_row(m.node, str(m.gpu_index), m.slice_id, fmt_fraction(m.fraction), what)
        con.print(t)
    if result.plan.shortfall:
        _err(f"nothing moved: {result.plan.shortfall}")
    if result.plan.replay_complete:
        _err(f"request {result.request_id} is already complete: nothing more to move")
    for key, why in result.plan.skipped.items():
        _err(f"skipped {key}: {why}")


def cmd_reassign(args: argparse.Namespace) -> int:
    from gpuctl.reassign import ReassignRequest, execute, prepare

    cfg = _load_config(args)
    req = ReassignRequest(
        src=args.src, dst=args.dst, count=args.count, gpus=args.gpus, slice_ids=args.slice_ids,
        node=args.node, leased="drain" if args.drain else "revoke" if args.revoke else "refuse",
        request_id=args.request_id, dry_run=args.dry_run)
    _check_node(cfg, args.node)
    fleet = _fleet(args, cfg)
    try:
        p = prepare(fleet, req)
        if p.moves and not req.dry_run and not args.yes:
            interactive = sys.stdin.isatty() and sys.stderr.isatty() and not args.json
            if not interactive:
                raise UsageError("reassign changes ownership and no terminal is there to confirm: pass --yes "
                                 "(or --dry-run to see the plan)")
            what = (f"Move {len(p.moves)} slice(s) ({p.gpu_equivalents:g} GPU-equivalents) from {req.src} to "
                    f"{req.dst} on {', '.join(sorted({m.node for m in p.moves}))}"
                    + (f", {req.leased} {sum(m.leased for m in p.moves)} leased" if req.leased != "refuse" else "")
                    + "?")
            _print_plan(p)
            if not _confirm(what):
                _err("cancelled: nothing moved")
                return ExitCode.CONFLICT
        result = execute(fleet, p)
    finally:
        fleet.close()
    if args.json:
        doc = result.to_json()
        doc["exit_code"] = int(result.exit_code)
        _emit_json(doc)
    else:
        _print_reassign(result)
    if result.failed:
        for node, (moves, err) in result.failed.items():
            _err(f"node {node}: {len(moves)} slice(s) not moved: {err}")
        if result.moved or result.pending:
            _err(f"partial: run again with --request-id {result.request_id} to complete it")
    return result.exit_code


# --------------------------------------------------------------------------- config


def cmd_config(args: argparse.Namespace) -> int:
    if args.config_verb == "path":
        path, origin = config_path(args)
        if args.json:
            _emit_json({"path": str(path), "from": origin, "exists": path.exists()})
        else:
            print(path)
        return ExitCode.OK
    cfg = _load_config(args)
    doc = {"path": str(cfg.path), "ok": True,
           "nodes": [{"name": n.name, "host": n.host, "transport": n.transport, "source": str(n.source)}
                     for n in cfg.nodes],
           "departments": [{"name": d.name, "priority": d.priority, "color": d.color, "source": str(d.source)}
                           for d in cfg.departments]}
    if args.json:
        _emit_json(doc)
    else:
        print(f"{cfg.path}: OK, {len(cfg.nodes)} node(s), {len(cfg.departments)} department(s)")
        for n in cfg.nodes:
            print(f"  node {n.name}: {n.transport} {n.host or n.socket}  ({n.source})")
        for d in cfg.departments:
            print(f"  department {d.name}: priority {d.priority}  ({d.source})")
    return ExitCode.OK


# --------------------------------------------------------------------------- console, demo


def require_terminal() -> None:
    """Raise UsageError unless stdin and the console's output (stderr, where Textual draws) are a
    terminal: the console never takes over a pipe or a cron job's output."""
    if not (sys.stdin.isatty() and sys.__stderr__ is not None and sys.__stderr__.isatty()):
        raise UsageError("the console needs a terminal (stdin and stderr); for scripts use a verb with "
                         "--json, e.g. `gpuctl status --json` (see `gpuctl --help`)")


def run_console(fleet, *, readonly: bool = False, theme: str | None = None, refresh_s: float = 1.0) -> int:
    """Open the Textual console on a FleetSource (blocks until the user quits). Raises UsageError
    for an unknown theme (the message lists the known ones) or without a terminal."""
    from gpuctl.app import UnknownThemeError, build_app

    require_terminal()
    try:
        app = build_app(fleet, readonly=readonly, theme=theme, refresh_s=refresh_s)
    except UnknownThemeError as exc:
        raise UsageError(f"--theme: {exc}") from None
    app.run()
    if app.return_code not in (None, 0):
        return ExitCode.FAILURE
    return ExitCode.OK


def cmd_console(args: argparse.Namespace) -> int:
    require_terminal()
    cfg = _load_config(args)
    fleet = _fleet(args, cfg)
    try:
        return run_console(fleet, readonly=bool(getattr(args, "readonly", False)),
                           theme=getattr(args, "theme", None) or cfg.theme, refresh_s=cfg.refresh_s)
    finally:
        fleet.close()


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuctl.demo import run_demo

    if not args.no_console:
        require_terminal()
    return run_demo(nodes=args.nodes, gpus=args.gpus, seed=args.seed, console=not args.no_console,
                    readonly=bool(getattr(args, "readonly", False)), theme=getattr(args, "theme", None),
                    json_out=args.json, write_config=args.write_config)


VERBS = {"status": cmd_status, "departments": cmd_departments, "reassign": cmd_reassign,
         "config": cmd_config, "demo": cmd_demo, "console": cmd_console}

from gpuctl.leases_cli import LEASE_VERBS  # noqa: E402 - the lease verbs live in their own module

VERBS.update(LEASE_VERBS)
from gpuctl.bootstrap_cli import NODE_VERBS  # noqa: E402 - node bootstrap lives in its own module

VERBS.update(NODE_VERBS)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gpuctl`; returns the exit code (ExitCode)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        msg = str(exc)  # "gpuctl: ..." or "gpuctl VERB: ..." (argparse's prog)
        print("gpuctl: " + msg.removeprefix("gpuctl: ").removeprefix("gpuctl "), file=sys.stderr)
        return ExitCode.USAGE
    verb = args.verb or "console"
    if args.verbose and verb not in ("console", "demo"):  # the console owns the terminal
        from gpuctl.verbose import enable_verbose

        enable_verbose()
    try:
        return int(VERBS[verb](args))
    except UsageError as exc:
        _err(str(exc))
        return ExitCode.USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return ExitCode.INTERRUPTED
    except FileNotFoundError as exc:
        _err(str(exc))
        return ExitCode.CONFIG
    except Exception as exc:  # noqa: BLE001 - map known error kinds to exit codes, else FAILURE
        from gpuctl.config import ConfigError
        from gpuctl.reassign import ReassignError

        if isinstance(exc, ConfigError):
            _err(str(exc))
            return ExitCode.CONFIG
        if isinstance(exc, ReassignError):
            _err(str(exc))
            return ExitCode.USAGE
        if os.environ.get("GPUCTL_DEBUG"):
            raise
        _err(f"internal error: {type(exc).__name__}: {exc} (set GPUCTL_DEBUG=1 for a traceback)")
        return ExitCode.FAILURE


if __name__ == "__main__":
    sys.exit(main())
