"""`gpuctl config check [--connect]` (validate the fleet config, print what it defines) and
`gpuctl config path` (where it is looked for, and why).

check reports every problem in one pass (gpuctl.config.ConfigErrors: one line each, file order),
including the console's settings (theme name, department colors: gpuctl.cli.config_checks); with
``--connect`` it then reaches every node and reports each (exit 7 when one cannot be reached).
"""

from __future__ import annotations

import argparse
import os

from gpuctl.cli.context import add_globals, config_path, load_config, require_nodes
from gpuctl.cli.output import emit_json, err
from gpuctl.exit_codes import ExitCode


def add_arguments(p: argparse.ArgumentParser) -> None:
    """ACTION: check | path (each also takes the global flags)."""
    csub = p.add_subparsers(dest="config_verb", metavar="ACTION", parser_class=type(p), required=True)
    c = csub.add_parser("check", help="validate the fleet config (every problem in one pass) and print what it "
                                      "defines")
    add_globals(c, top=False)
    c.add_argument("--connect", action="store_true", help="also reach every node and report each")
    c = csub.add_parser("path", help="print where the fleet config is looked for")
    add_globals(c, top=False)


def run(args: argparse.Namespace) -> int:
    """Run `config ACTION`; a config error is raised (gpuctl.config.ConfigError: exit 3)."""
    if args.config_verb == "path":
        path, origin = config_path(args)
        if args.json:
            emit_json({"path": str(path), "from": origin, "exists": os.path.exists(path)})
        else:
            print(path)
        return ExitCode.OK
    from gpuctl.cli.config_checks import connect_all, console_checks

    checks, theme_notes = console_checks()
    for note in theme_notes:
        err(note)
    cfg = load_config(args, checks=checks)
    require_nodes(cfg)  # the same rule as status, reassign, ...: an OK here means they can run
    doc = {"path": str(cfg.path), "ok": True,
           "nodes": [{"name": n.name, "host": n.host, "transport": n.transport, "source": str(n.source)}
                     for n in cfg.nodes],
           "departments": [{"name": d.name, "priority": d.priority, "color": d.color, "source": str(d.source)}
                           for d in cfg.departments]}
    rows = connect_all(args, cfg) if getattr(args, "connect", False) else None
    if rows is not None:
        doc["connect"] = rows
        doc["ok"] = all(r["ok"] for r in rows)
    if args.json:
        emit_json(doc)
    else:
        print(f"{cfg.path}: OK, {len(cfg.nodes)} node(s), {len(cfg.departments)} department(s)")
        for n in cfg.nodes:
            print(f"  node {n.name}: {n.transport} {n.host or n.socket}  ({n.source})")
        for d in cfg.departments:
            print(f"  department {d.name}: priority {d.priority}  ({d.source})")
        for r in rows or []:
            print(f"  connect {r['name']}: " + (f"OK in {r['seconds']:g} s (gpuctld {r['version']})" if r["ok"]
                                                else f"FAILED: {r['error']}"))
    failed = [r["name"] for r in rows or [] if not r["ok"]]
    if failed:
        err(f"cannot reach {len(failed)} of {len(rows or [])} node(s): {', '.join(failed)}")
        return ExitCode.UNREACHABLE
    return ExitCode.OK
