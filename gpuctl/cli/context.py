"""What every verb shares: the global flags, where the fleet config is and loading it, opening the
fleet, and the terminal check of the console.

The global flags (--config, --json, --ssh-config, --known-hosts, --accept-new-host-key) are defined
once, here, and added both before the verb (`gpuctl --json status`) and after it (`gpuctl status
--json`).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path
from typing import Any

from gpuctl.cli.errors import CliError, UsageError
from gpuctl.exit_codes import ExitCode

#: Global flags that take a value (the verb is the first word that is neither a flag nor a value).
VALUE_FLAGS = ("--config", "--ssh-config", "--known-hosts", "--theme")


def add_globals(p: argparse.ArgumentParser, *, top: bool) -> None:
    """Add the global flags to `p`: with defaults on the top parser, suppressed (so a value given
    before the verb is kept) on a verb's parser."""
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


def add_move_arguments(p: argparse.ArgumentParser, *, from_help: str, drain_help: str, revoke_help: str) -> None:
    """The arguments of a slice move, shared by `reassign` and `schedule add`: --from/--to, one of
    --count/--gpus/--slice, --node, one of --drain/--revoke (ReassignRequest's fields)."""
    p.add_argument("--from", dest="src", required=True, metavar="DEPT", help=from_help)
    p.add_argument("--to", dest="dst", required=True, metavar="DEPT", help="department receiving them")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--count", type=int, metavar="N", help="number of slices")
    amount.add_argument("--gpus", type=float, metavar="X", help="GPU-equivalents (e.g. 1.5)")
    amount.add_argument("--slice", dest="slice_ids", action="append", metavar="ID", help="a slice id (repeatable)")
    p.add_argument("--node", metavar="NAME", help="only slices of this node")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--drain", action="store_true", help=drain_help)
    mode.add_argument("--revoke", action="store_true", help=revoke_help)


def config_path(args: argparse.Namespace) -> tuple[Path, str]:
    """Where the fleet config is read from, and why: --config, then $GPUCTL_CONFIG, then
    $XDG_CONFIG_HOME/gpuctl/fleet.toml."""
    from gpuctl.config import default_config_path

    if getattr(args, "config", None):
        return Path(args.config), "--config"
    if os.environ.get("GPUCTL_CONFIG"):
        return Path(os.environ["GPUCTL_CONFIG"]), "$GPUCTL_CONFIG"
    return default_config_path(), "the default path"


def load_config(args: argparse.Namespace, checks: Any = None):
    """The fleet config (gpuctl.config.FleetConfig). Raises CliError (CONFIG) naming the path and
    where it came from when there is no file, gpuctl.config.ConfigError when it is invalid.
    checks: gpuctl.config.ValueChecks (`config check`: the console's themes and colors)."""
    from gpuctl.config import load_config as load

    path, origin = config_path(args)
    if nothing_at(path):
        hint = {"--config": "", "$GPUCTL_CONFIG": " or point GPUCTL_CONFIG (or --config FILE) at one"}.get(
            origin, " or pass --config FILE (or set GPUCTL_CONFIG)")
        raise CliError(
            f"no fleet config at {path} (from {origin}): write one (see README 'Config file'){hint}; "
            f"`gpuctl demo` runs without one", ExitCode.CONFIG)
    return load(path, checks=checks)


def load_config_if_any(args: argparse.Namespace):
    """The fleet config when --config names one (it must exist) or one is at the usual place; None
    otherwise (verbs that also work without a fleet config, e.g. `node bootstrap HOST`)."""
    from gpuctl.config import load_config as load

    if getattr(args, "config", None):
        return load(args.config)
    path, _ = config_path(args)
    return None if nothing_at(path) else load(path)


def nothing_at(path: Path) -> bool:
    """True only when nothing, not even a dangling link, is at `path` (ENOENT); a symlink loop, a
    directory that cannot be traversed, ... are for gpuctl.config.load_config to name (exit 3)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def require_nodes(cfg: Any) -> None:
    """gpuctl.config.ConfigError when the config defines no nodes (every verb that reads it, and
    `config check`: an OK there means they can run)."""
    from gpuctl.config import ConfigError

    if not cfg.nodes:
        raise ConfigError(str(cfg.path), "defines no nodes: add a [[node]] table (see README 'Config file')")


def check_node(cfg: Any, name: str | None, flag: str = "--node") -> None:
    """Raise UsageError naming `flag` when `name` is given and not a node of the config."""
    if name and cfg.node(name) is None:
        raise UsageError(f"{flag}: unknown node {name!r} (known: {', '.join(n.name for n in cfg.nodes)})")


def transport_options(args: argparse.Namespace) -> dict[str, Any]:
    """The SSH flags as keyword arguments of gpuctl.transport.ssh.SshTransport and
    gpuctl.fleet.client.default_transport_factory."""
    return {"ssh_config_path": getattr(args, "ssh_config", None),
            "known_hosts_path": getattr(args, "known_hosts", None),
            "accept_new_host_key": bool(getattr(args, "accept_new_host_key", False))}


#: Verbs that run for a long time in one process: their heap is left to the collector as it is.
LONG_RUNNING_VERBS = (None, "console", "demo")


def open_fleet(args: argparse.Namespace, cfg: Any):
    """A gpuctl.fleet.client.FleetClient on the config's nodes (the caller closes it). Raises
    gpuctl.config.ConfigError when the config defines no node.

    When this process is the `gpuctl` command itself (main() set ``args.process_entry``) running a
    one-shot verb, the transport modules the nodes use are imported now and the heap so far is
    frozen (gc.freeze: imported modules are never garbage), so the fan-out's collections trace
    only what the fan-out makes: at 64 SSH nodes that was 40-80 ms of the CLI's CPU, with pauses
    up to 58 ms (bench/RESULTS.md, "Fleet scale"). Never for main() called with arguments (tests,
    embedding programs) nor for the console."""
    from gpuctl.fleet.client import FleetClient, default_transport_factory, preload_transports

    require_nodes(cfg)
    fleet = FleetClient(cfg, default_transport_factory(**transport_options(args)))
    if getattr(args, "process_entry", False) and getattr(args, "verb", None) not in LONG_RUNNING_VERBS:
        preload_transports(cfg)
        gc.freeze()
    return fleet


def require_terminal() -> None:
    """Raise UsageError unless stdin and the console's output (stderr, where Textual draws) are a
    terminal: the console never takes over a pipe or a cron job's output."""
    if not (sys.stdin.isatty() and sys.__stderr__ is not None and sys.__stderr__.isatty()):
        raise UsageError("the console needs a terminal (stdin and stderr); for scripts use a verb with "
                         "--json, e.g. `gpuctl status --json` (see `gpuctl --help`)")
