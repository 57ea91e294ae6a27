"""gpuctld's usage accounting and Prometheus options, and their start-up (kept out of main.py).

Options added to ``gpuctld serve``: ``--history DURATION`` (simulated backend: fill the usage
database with a deterministic past, e.g. 30d), ``--no-usage`` (record nothing),
``--metrics-listen ADDR:PORT`` (serve Prometheus metrics there; off by default) and
``--metrics-node NAME`` (the ``node`` label; default the hostname).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from gpuctl.durations import DurationError, parse_duration

log = logging.getLogger("gpuctld.usage")

#: Longest simulated past, seconds (the hourly retention).
MAX_HISTORY_S = 400 * 86400


def _history(text: str) -> float:
    try:
        value = parse_duration(text)
    except DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not 0 < value <= MAX_HISTORY_S:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 400d, got {text}")
    return value


def parse_listen(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``[::1]:9400`` for IPv6) -> (addr, port). ValueError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--metrics-listen must be ADDR:PORT (e.g. 127.0.0.1:9400), got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--metrics-listen: port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--metrics-listen: port must be 0..65535, got {number}")
    return host, number


def _listen(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the usage and metrics options to gpuctld's parser."""
    p.add_argument("--history", type=_history, default=None, metavar="DURATION",
                   help="simulated backend: fill the usage database with a deterministic past of DURATION "
                        "(e.g. 30d; at most 400d) before the time it already covers")
    p.add_argument("--no-usage", action="store_true", help="do not record usage accounting (usage.sqlite3)")
    p.add_argument("--metrics-listen", type=_listen, default=None, metavar="ADDR:PORT",
                   help="serve Prometheus metrics on http://ADDR:PORT/metrics (off by default; the only "
                        "listening socket gpuctld opens besides lease workers; no authentication)")
    p.add_argument("--metrics-node", default=None, metavar="NAME",
                   help="value of the node label of the metrics (default: the hostname)")


@dataclass
class Observability:
    """What :func:`start` started; :meth:`stop` ends it (idempotent)."""

    usage: Any = None
    metrics: Any = None
    notes: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
        if self.usage is not None:
            self.usage.stop()
            self.usage = None


def start(args: argparse.Namespace, *, api: Any, state: Any, sampler: Any, state_dir: Any, backend: Any,
          gpus: list) -> Observability:
    """Start usage accounting (filling the simulated past first when asked) and the metrics server.

    Raises ValueError with a message for the operator: --history without the simulated backend,
    a usage database that is not a database, a metrics address that cannot be bound.
    """
    import sqlite3

    from gpuctl.daemon.usage import UsageService, holds_of
    from gpuctl.daemon.usage_api import install

    out = Observability()
    if args.history is not None and backend.name != "simulated":
        raise ValueError("--history fills a simulated past: it needs --backend simulated")
    if not args.no_usage:
        try:
            service = UsageService(state, sampler, state_dir, tick_s=min(1.0, args.interval))
        except sqlite3.DatabaseError as e:
            raise ValueError(f"usage database {state_dir}/usage.sqlite3 is unusable: {e}; move it aside "
                             f"or start with --no-usage") from None
        now = time.time()
        if args.history is not None:
            from gpuctl.daemon.usage_history import fill_simulated_past

            memory = {g.uuid: g.memory_total_bytes for g in gpus}
            rows = fill_simulated_past(service.db, holds_of(state.snapshot()), memory, args.seed,
                                       now - args.history, now)
            out.notes.append(f"--history: wrote {rows} usage rows of simulated past" if rows else
                             "--history: the usage database already covers that past; nothing written")
        service.start(at_s=now)
        install(api, service, {g.uuid: g.index for g in gpus})
        out.usage = service
    if args.metrics_listen is not None:
        from gpuctl.daemon.metrics import MetricsServer

        addr, port = args.metrics_listen
        try:
            out.metrics = MetricsServer(api, node=args.metrics_node or api.hostname, addr=addr, port=port)
        except OSError as e:
            out.stop()
            raise ValueError(f"--metrics-listen {addr}:{port}: cannot listen: {e.strerror or e}") from None
        out.notes.append(f"metrics on http://{addr}:{out.metrics.port}/metrics")
    return out
