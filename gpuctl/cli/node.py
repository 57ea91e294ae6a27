"""`gpuctl node bootstrap NODE_OR_HOST`: install gpuctld on a node over SSH (registered by gpuctl.cli).

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
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from gpuctl.exit_codes import ExitCode


def add_node_verbs(verb: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add ``node bootstrap`` to gpuctl's parser; `verb(name, help)` makes a top-level subparser."""
    from gpuctl.fleet.bootstrap import BACKENDS, DEFAULT_PREFIX

    p = verb("node", "node tools: install gpuctld on a node")
    nsub = p.add_subparsers(dest="node_verb", metavar="ACTION", parser_class=type(p), required=True)
    help_ = "install or upgrade gpuctl and gpuctld on a node over SSH (venv, systemd unit, health check)"
    b = nsub.add_parser("bootstrap", help=help_, description=help_)
    from gpuctl.cli import _add_globals  # the same --config/--json/--ssh-config/... as every verb

    _add_globals(b, top=False)
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
    b.add_argument("--sudo", action="store_true",
                   help="run the installing commands with `sudo -n` (non-root SSH account)")
    b.add_argument("--dry-run", action="store_true", help="print the plan; connect to nothing, change nothing")
    b.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def _err(message: str) -> None:
    print(f"gpuctl: {message}", file=sys.stderr, flush=True)


def _load_fleet_config(args: argparse.Namespace):
    """The fleet config when one is given or exists at the usual place; None otherwise."""
    from gpuctl.config import default_config_path, load_config

    if getattr(args, "config", None):
        return load_config(args.config)  # named explicitly: it must be there
    env = os.environ.get("GPUCTL_CONFIG")
    path = Path(env) if env else default_config_path()
    return load_config(path) if path.exists() else None


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


def cmd_node(args: argparse.Namespace) -> int:
    """`gpuctl node ACTION`: only `bootstrap` exists."""
    from gpuctl.fleet.bootstrap import (Bootstrap, BootstrapError, BootstrapOptions, check_wheel, find_source_dir,
                                  load_unit_template, resolve_target)
    from gpuctl.config import ConfigError

    try:
        try:
            cfg = _load_fleet_config(args)
        except ConfigError as exc:
            raise BootstrapError(str(exc), ExitCode.CONFIG) from exc
        target = resolve_target(args.target, cfg)
        options = BootstrapOptions(prefix=args.prefix, python=args.python, backend=args.backend,
                                   systemd=not args.no_systemd, system_site_packages=args.system_site_packages,
                                   no_index=args.no_index, sudo=args.sudo)
        options.check()
        wheel = check_wheel(args.wheel) if args.wheel is not None else None
        source_dir = find_source_dir() if wheel is None else None
        if wheel is None and source_dir is None and not args.dry_run:
            raise BootstrapError("no --wheel given and this gpuctl is not running from its source tree, so no "
                                 "wheel can be built: pass --wheel PATH (a gpuctl wheel)", ExitCode.USAGE)
        unit = load_unit_template() if options.systemd else None
    except BootstrapError as exc:
        _err(exc.message)
        return exc.exit_code

    transport = _transport(args, target.node)
    try:
        job = Bootstrap(target, options, transport=transport, wheel=wheel, unit_template=unit, source_dir=source_dir,
                        progress=lambda line: print(f"gpuctl: {line}", file=sys.stderr, flush=True))
        if args.dry_run:
            result = job.result(dry_run=True)
            if args.json:
                _emit(result.to_json())
            else:
                _print_plan(result, sys.stdout)
                print("dry run: nothing was changed; the fleet config entry would be:\n")
                print(result.node_toml, end="")
            return ExitCode.OK
        if not args.yes:
            interactive = sys.stdin.isatty() and sys.stderr.isatty() and not args.json
            if not interactive:
                _err(f"node bootstrap installs gpuctl into {options.prefix} on {target.name}"
                     + (f" and writes and restarts the gpuctld service" if options.systemd else "")
                     + ", and no terminal is there to confirm: pass --yes (or --dry-run to see the plan)")
                return ExitCode.USAGE
            _print_plan(job.result(), sys.stderr)
            sys.stderr.write(f"Install gpuctl on {target.name}? [y/N] ")
            sys.stderr.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                _err("cancelled: nothing was changed")
                return ExitCode.CONFLICT
        result = job.run()
    finally:
        transport.close()
    if args.json:
        _emit(result.to_json())
    if result.error is not None:
        _err(result.error.message)
        return result.exit_code
    if not args.json:
        print(f"# gpuctl is installed on {target.name}; add this to the fleet config:")
        print(result.node_toml, end="")
    if not options.systemd:
        _err(f"--no-systemd: gpuctld is installed but not started (run {options.gpuctld} serve on the node)")
    return ExitCode.OK


def _transport(args: argparse.Namespace, node: Any):
    from gpuctl.transport.ssh import SshTransport

    return SshTransport(node, ssh_config_path=getattr(args, "ssh_config", None),
                        known_hosts_path=getattr(args, "known_hosts", None),
                        accept_new_host_key=bool(getattr(args, "accept_new_host_key", False)))


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


NODE_VERBS = {"node": cmd_node}
