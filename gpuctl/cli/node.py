"""`gpuctl node bootstrap NODE_OR_HOST`: install gpuctld on a node over SSH; `gpuctl node forget-gpu
NODE UUID`: retire a GPU the node no longer reports (a row of gpuctl.cli.registry).

``gpuctl node forget-gpu NODE UUID [--yes] [--json]``: a replaced or removed GPU keeps its slices
(and owners) in the node's state, shown as missing; this drops them (POST /v1/gpus/forget, audited
like every change, generation-checked). Refused while a lease holds one of its slices (6), for a
GPU the node still reports (6), for a UUID the node does not know (2); node down: 7.

``gpuctl node bootstrap NODE_OR_HOST [--wheel PATH] [--prefix DIR] [--python PY] [--backend B]
[--no-systemd] [--system-site-packages] [--no-index] [--sudo] [--dry-run] [--yes] [--json]``

NODE_OR_HOST is a node of the fleet config (its SSH settings are used) or an SSH host (alias from
~/.ssh/config, address, ``user@host``); the fleet config is read only when it exists (or --config
names it). Each step is printed on stderr as it runs; stdout carries the ``[[node]]`` snippet to add
to the fleet config (with ``--json``: the whole report, gpuctl.fleet.bootstrap.BootstrapResult.to_json).
It changes the node, so it asks on a terminal and never without one: pass ``--yes``; ``--dry-run``
prints the plan and touches nothing (no SSH connection, no wheel build).

Exit codes: 0 done (or planned); 1 a step failed (the message names the step, the command, its
exit status and its stderr tail); 2 bad flags, no terminal to confirm without --yes; 3 unusable
fleet or ssh config; 6 confirmation refused; 7 the node cannot be reached over SSH.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuctl.cli.context import add_globals, load_config_if_any, transport_options
from gpuctl.cli.errors import UsageError
from gpuctl.cli.output import confirm, emit_json, err, interactive
from gpuctl.exit_codes import ExitCode


def add_arguments(p: argparse.ArgumentParser) -> None:
    """ACTION: bootstrap (with the global flags and its own)."""
    from gpuctl.fleet.bootstrap import BACKENDS, DEFAULT_PREFIX

    nsub = p.add_subparsers(dest="node_verb", metavar="ACTION", parser_class=type(p), required=True)
    help_ = "install or upgrade gpuctl and gpuctld on a node over SSH (venv, systemd unit, health check)"
    b = nsub.add_parser("bootstrap", help=help_, description=help_)
    add_globals(b, top=False)
    b.add_argument("target", metavar="NODE_OR_HOST",
                   help="a node of the fleet config (its SSH settings), or an SSH host / ~/.ssh/config alias")
    b.add_argument("--wheel", metavar="PATH", type=Path,
                   help="the gpuctl wheel to install (default: build one from this gpuctl's source tree)")
    b.add_argument("--prefix", metavar="DIR", default=DEFAULT_PREFIX,
                   help=f"virtual environment on the node (default {DEFAULT_PREFIX})")
    b.add_argument("--python", metavar="PY", default="python3",
                   help="the node's Python >= 3.11 that creates the venv (default python3)")
    b.add_argument("--backend", choices=BACKENDS, default="auto", help="gpuctld's GPU backend in the unit (default auto)")
    b.add_argument("--no-systemd", action="store_true",
                   help="install only: no unit, no service start, no health check")
    b.add_argument("--system-site-packages", action="store_true",
                   help="the venv also sees the node's system packages (python -m venv --system-site-packages)")
    b.add_argument("--no-index", action="store_true",
                   help="pip never reaches a package index: dependencies must already be on the node")
    b.add_argument("--find-links", metavar="DIR",
                   help="a directory of wheels on the node that pip also installs from (with --no-index: offline)")
    b.add_argument("--sudo", action="store_true",
                   help="run the installing commands with `sudo -n` (non-root SSH account)")
    b.add_argument("--dry-run", action="store_true", help="print the plan; connect to nothing, change nothing")
    b.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    help_ = "retire a GPU the node no longer reports (replaced): its slices leave the state and every total"
    f = nsub.add_parser("forget-gpu", help=help_, description=help_)
    add_globals(f, top=False)
    f.add_argument("node", metavar="NODE", help="node name (fleet config)")
    f.add_argument("uuid", metavar="UUID", help="the missing GPU's UUID (gpuctl status --json shows it)")
    f.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def _print_plan(result, out) -> None:
    t = result.target
    o = result.options
    print(f"plan for node {t.name}" + (f" (host {t.node.host})" if t.from_config else "") + ":", file=out)
    for i, s in enumerate(result.steps, 1):
        print(f"  {i:2}. {s.description}", file=out)
        if s.command and s.name not in ("connect",):
            print(f"      $ {s.command}", file=out)
    if not o.systemd:
        print(f"  (--no-systemd: start the daemon yourself, e.g. {o.gpuctld} serve --backend {o.backend})", file=out)


def forget_gpu(args: argparse.Namespace) -> int:
    """`gpuctl node forget-gpu NODE UUID`: see the module docstring. Errors are raised (NodeError
    with the node's code, CliError, UsageError) and said by gpuctl.cli.main."""
    import uuid as uuidlib

    from gpuctl.cli.context import check_node, load_config, open_fleet
    from gpuctl.cli.errors import CliError

    cfg = load_config(args)
    check_node(cfg, args.node, "NODE")
    fleet = open_fleet(args, cfg)
    try:
        snap = fleet.snapshot([args.node])
        node = snap.node(args.node)
        if node is None or not node.reachable:
            raise CliError(f"node {args.node} is unreachable: {node.error if node else 'no answer'}",
                           ExitCode.UNREACHABLE)
        gpu = next((g for g in node.gpus if g.identity.uuid == args.uuid), None)
        if gpu is None:
            known = ", ".join(g.identity.uuid for g in node.gpus) or "none"
            raise UsageError(f"UUID: node {args.node} has no GPU {args.uuid!r} (GPUs: {known})")
        what = (f"Forget GPU {args.uuid} of {args.node} and its {len(gpu.slices)} slice(s) "
                f"({', '.join(f'{s.department} {s.fraction:g}' for s in gpu.slices)})?")
        if not args.yes:
            if not interactive(args):
                raise UsageError("forget-gpu changes the node's state and no terminal is there to confirm: pass --yes")
            if not confirm(what):
                raise CliError(f"cancelled: GPU {args.uuid} kept", ExitCode.CONFLICT)
        answer = fleet.clients[args.node].request("POST", "/v1/gpus/forget", json={
            "request_id": "f-" + uuidlib.uuid4().hex[:12], "generation": node.generation, "gpu_uuid": args.uuid})
    finally:
        fleet.close()
    if args.json:
        emit_json({"node": args.node, **answer})
    else:
        print(f"forgot GPU {args.uuid} of {args.node}: slices {', '.join(answer['forgotten'])}")
    err(f"GPU {args.uuid} of {args.node} forgotten (generation {answer['generation']})")
    return ExitCode.OK


def run(args: argparse.Namespace) -> int:
    """`gpuctl node ACTION`: `bootstrap` or `forget-gpu`. Errors are raised (BootstrapError with its
    exit code, ConfigError: 3, UsageError: 2) and said by gpuctl.cli.main."""
    if args.node_verb == "forget-gpu":
        return forget_gpu(args)
    from gpuctl.fleet.bootstrap import (Bootstrap, BootstrapError, BootstrapOptions, check_wheel, find_source_dir,
                                        load_unit_template, resolve_target)

    cfg = load_config_if_any(args)
    target = resolve_target(args.target, cfg)
    options = BootstrapOptions(prefix=args.prefix, python=args.python, backend=args.backend,
                               systemd=not args.no_systemd, system_site_packages=args.system_site_packages,
                               no_index=args.no_index, find_links=args.find_links, sudo=args.sudo)
    options.check()
    wheel = check_wheel(args.wheel) if args.wheel is not None else None
    source_dir = find_source_dir() if wheel is None else None
    if wheel is None and source_dir is None and not args.dry_run:
        raise BootstrapError("no --wheel given and this gpuctl is not running from its source tree, so no "
                             "wheel can be built: pass --wheel PATH (a gpuctl wheel)", ExitCode.USAGE)
    unit = load_unit_template() if options.systemd else None

    transport = _transport(args, target.node)
    try:
        job = Bootstrap(target, options, transport=transport, wheel=wheel, unit_template=unit, source_dir=source_dir,
                        progress=lambda line: print(f"gpuctl: {line}", file=sys.stderr, flush=True))
        if args.dry_run:
            result = job.result(dry_run=True)
            if args.json:
                emit_json(result.to_json())
            else:
                _print_plan(result, sys.stdout)
                print("dry run: nothing was changed; the fleet config entry would be:\n")
                print(result.node_toml, end="")
            return ExitCode.OK
        if not args.yes:
            if not interactive(args):
                raise UsageError(f"node bootstrap installs gpuctl into {options.prefix} on {target.name}"
                                 + (" and writes and restarts the gpuctld service" if options.systemd else "")
                                 + ", and no terminal is there to confirm: pass --yes (or --dry-run to see the plan)")
            _print_plan(job.result(), sys.stderr)
            if not confirm(f"Install gpuctl on {target.name}?"):
                err("cancelled: nothing was changed")
                return ExitCode.CONFLICT
        result = job.run()
    finally:
        transport.close()
    if args.json:
        emit_json(result.to_json())
    if result.error is not None:
        err(result.error.message)
        return result.exit_code
    if not args.json:
        print(f"# gpuctl is installed on {target.name}; add this to the fleet config:")
        print(result.node_toml, end="")
    if not options.systemd:
        err(f"--no-systemd: gpuctld is installed but not started (run {options.gpuctld} serve on the node)")
    return ExitCode.OK


def _transport(args: argparse.Namespace, node: Any):
    from gpuctl.transport.ssh import SshTransport

    return SshTransport(node, **transport_options(args))
