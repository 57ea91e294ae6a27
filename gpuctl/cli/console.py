"""`gpuctl console` (also bare `gpuctl`) and `gpuctl demo`: the Textual console on the fleet of the
config, or on a demo fleet of simulated gpuctld processes started for the purpose
(gpuctl.fleet.demo). The console is imported only here and only when it opens: every other verb
stays headless.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpuctl.arg_types import seconds_arg
from gpuctl.cli.context import load_config, open_fleet, require_terminal
from gpuctl.cli.errors import UsageError
from gpuctl.cli.registry import Verb
from gpuctl.exit_codes import ExitCode
from gpuctl.fleet.source import LiveFleetSource


def run_console(source, *, readonly: bool = False, theme: str | None = None, refresh_s: float = 1.0,
                theme_from: str | None = None) -> int:
    """Open the Textual console on `source`, a gpuctl.fleet.source.FleetSource (blocks until the
    user quits). Raises UsageError for an unknown --theme (the message lists the known ones) or
    without a terminal; gpuctl.config.ConfigError naming the file when the theme came from the
    fleet config (`theme_from`: its path)."""
    from gpuctl.app import UnknownThemeError, build_app

    require_terminal()
    try:
        app = build_app(source, readonly=readonly, theme=theme, refresh_s=refresh_s)
    except UnknownThemeError as exc:
        if theme_from is not None:
            from gpuctl.config import ConfigError

            raise ConfigError(theme_from, f"{exc} (`gpuctl config check` checks it)", key="theme") from None
        raise UsageError(f"--theme: {exc}") from None
    app.run()
    if app.return_code not in (None, 0):
        reason = getattr(app, "crash_message", None) or "an unexpected error (its traceback is above)"
        print(f"gpuctl: the console stopped on {reason}", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK


def _console_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readonly", action="store_true", default=argparse.SUPPRESS,
                   help="no reassignment possible (a badge says so)")
    p.add_argument("--theme", metavar="NAME", default=argparse.SUPPRESS,
                   help="gpuctl-dark (default), gpuctl-light, high-contrast")


def cmd_console(args: argparse.Namespace) -> int:
    """`gpuctl console`: the console on the config's fleet (needs a terminal)."""
    require_terminal()
    cfg = load_config(args)
    fleet = open_fleet(args, cfg)
    source = LiveFleetSource(fleet)
    if cfg.telemetry.source == "prometheus":  # telemetry from Prometheus, changes over SSH
        from gpuctl.fleet.prometheus import source_for

        source = source_for(cfg, source)
    try:
        flag_theme = getattr(args, "theme", None)
        return run_console(source, readonly=bool(getattr(args, "readonly", False)),
                           theme=flag_theme or cfg.theme, refresh_s=cfg.refresh_s,
                           theme_from=None if flag_theme else str(cfg.path))
    finally:
        fleet.close()


_seconds = seconds_arg(0, 86400)


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--seed", type=int, default=0, help="simulation seed (default 0)")
    p.add_argument("--no-console", action="store_true",
                   help="start the daemons, print the config path and wait (Ctrl-C or SIGTERM stops them)")
    p.add_argument("--restart-after", type=_seconds, metavar="SECONDS",
                   help="with --no-console: restart a node whose gpuctld died after SECONDS (default: only on "
                        "SIGUSR1 to this process)")
    p.add_argument("--write-config", metavar="FILE",
                   help="also write the demo fleet's config to FILE (use it with --config or GPUCTL_CONFIG)")
    p.add_argument("--history", metavar="DURATION", help="give the nodes a simulated usage past (e.g. 30d)")
    p.add_argument("--readonly", action="store_true", default=argparse.SUPPRESS,
                   help="console: no reassignment possible (a badge says so)")
    p.add_argument("--theme", metavar="NAME", default=argparse.SUPPRESS,
                   help="console theme: gpuctl-dark (default), gpuctl-light, high-contrast")


def cmd_demo(args: argparse.Namespace) -> int:
    """`gpuctl demo`: start the demo fleet; open the console on it, or (--no-console) print its
    config path and wait. The daemons stop when this returns."""
    from gpuctl.config import load_config as load
    from gpuctl.fleet.client import FleetClient, default_transport_factory
    from gpuctl.fleet.demo import demo_fleet, serve_without_console

    if args.history is not None:
        from gpuctl.durations import DurationError, parse_duration

        try:
            if not 0 < parse_duration(args.history) <= 400 * 86400:
                raise DurationError(f"--history must be more than 0 and at most 400d, got {args.history!r}")
        except DurationError as e:
            raise UsageError(f"--history: {e}" if not str(e).startswith("--history") else str(e)) from None
    if args.restart_after is not None and not args.no_console:
        raise UsageError("--restart-after: only with --no-console (in the console, restart a node with "
                         "`:node NAME restart`, or send SIGUSR1 to gpuctl)")
    if not args.no_console:
        require_terminal()
    with demo_fleet(args.nodes, args.gpus, args.seed, write_config=args.write_config,
                    history=args.history) as fleet:
        if args.no_console:
            return serve_without_console(fleet, json_out=args.json, restart_after_s=args.restart_after)
        cfg = load(fleet.config_path)
        client = FleetClient(cfg, default_transport_factory())
        try:
            os.environ.setdefault("GPUCTL_DEMO_CONFIG", str(fleet.config_path))
            return run_console(LiveFleetSource(client), readonly=bool(getattr(args, "readonly", False)),
                               theme=getattr(args, "theme", None), refresh_s=cfg.refresh_s)
        finally:
            client.close()


console = Verb(_console_arguments, cmd_console)
demo = Verb(_demo_arguments, cmd_demo)
