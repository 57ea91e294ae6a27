"""`gpuctl run --native` for a multi-GPU job (``--gpus N`` above 1, ``--per-node K`` or ``--nodes
A,B``): place, lease on every node (all or nothing), launch CMD on each with the torchrun
rendezvous environment, forward signals, release (gpuctl.fleet.job). Not a verb of its own:
gpuctl.cli.leases.cmd_run hands such runs here.

stdout carries the nodes' stdout, each line prefixed ``[node] ``; gpuctl's own lines and the
nodes' stderr (prefixed too) go to stderr. ``--dry-run`` prints the placement (``--json``: as a
document) and leases nothing. Exit codes: those of `gpuctl run` (the first failing node's exit
status; 8 when a lease was revoked), and before the launch 2 (USAGE: a fraction, an uneven split,
an unknown node), 4 (NOTHING_TO_DO: no placement), 6 (CONFLICT: a node gave its GPUs away
meanwhile), 7 (UNREACHABLE).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from gpuctl.cli.context import load_config, open_fleet
from gpuctl.cli.errors import UsageError
from gpuctl.cli.output import emit_json, err
from gpuctl.exit_codes import ExitCode


def is_job(args: argparse.Namespace) -> bool:
    """True when `gpuctl run` asks for a multi-GPU job (--per-node, --nodes, --dry-run, or --gpus > 1)."""
    return bool(getattr(args, "per_node", None) is not None or getattr(args, "nodes", None)
                or getattr(args, "dry_run", False) or (args.gpus is not None and args.gpus > 1))


def _check(args: argparse.Namespace, cfg: Any) -> tuple[int, list[str] | None]:
    """(GPUs, nodes) of a job's flags; raises UsageError naming the flag."""
    from gpuctl.fleet.job import WHOLE_GPUS_ONLY
    from gpuctl.model import UNASSIGNED

    if not args.native:
        raise UsageError("a multi-GPU job (--gpus above 1, --per-node, --nodes, --dry-run) runs with --native: "
                         "remote attach leases one GPU")
    if args.slices is not None:
        raise UsageError(f"--slices: {WHOLE_GPUS_ONLY}")
    if args.gpus is None or args.gpus != int(args.gpus) or args.gpus < 1:
        raise UsageError(f"--gpus {args.gpus:g}: {WHOLE_GPUS_ONLY}")
    if args.node:
        raise UsageError("--node names the node of a single-GPU run; a multi-GPU job takes --nodes A,B")
    nodes = [n.strip() for n in args.nodes.split(",")] if args.nodes else None
    if nodes is not None and not all(nodes):
        raise UsageError(f"--nodes {args.nodes!r}: an empty node name")
    for n in nodes or []:
        if cfg.node(n) is None:
            raise UsageError(f"--nodes: unknown node {n!r} (known: {', '.join(x.name for x in cfg.nodes)})")
    if cfg.departments and args.dept != UNASSIGNED and cfg.department(args.dept) is None:
        raise UsageError(f"--dept: unknown department {args.dept!r} (known: "
                         f"{', '.join(d.name for d in cfg.departments)})")
    return int(args.gpus), nodes


def run_job(args: argparse.Namespace, command: list[str]) -> int:
    """Place, lease, launch, wait, release; the job's exit status (see the module docstring)."""
    from gpuctl.fleet.job import Job, JobError, acquire_all, place
    from gpuctl.fleet.leases import owner
    from gpuctl.fleet.native_run import NativeStartError

    if not command and not args.dry_run:
        raise UsageError("run: give the command after --, e.g. gpuctl run --native --dept research --gpus 2 -- "
                         "torchrun train.py")
    cfg = load_config(args)
    gpus, nodes = _check(args, cfg)
    fleet = open_fleet(args, cfg)
    job: Job | None = None
    old_handlers: dict[int, Any] = {}
    try:
        snap = fleet.snapshot(nodes)
        try:
            placement = place(snap, args.dept, gpus, per_node=args.per_node, nodes=nodes)
        except JobError as e:
            if e.code == "invalid_request":
                raise UsageError(str(e)) from None
            raise
        if args.dry_run:
            if args.json:
                emit_json(placement.to_json())
            else:
                print("\n".join(placement.describe()))
            return ExitCode.OK
        for line in placement.describe():
            err(line)
        answers = acquire_all(fleet, placement, ttl_s=args.ttl, owner=owner(), err=err)
        for part, answer in zip(placement.parts, answers):
            err(f"lease {answer['lease']['id']} on {part.node}: GPU {', '.join(map(str, part.gpu_indices))}, "
                f"native attach")
        job = Job(fleet, cfg, placement, answers, ttl_s=args.ttl, grace_s=args.grace, err=err,
                  stdout=sys.stdout.buffer, stderr=sys.stderr.buffer)
        sigints = [0]

        def forward(signum: int, frame: Any) -> None:
            from gpuctl.fleet.native_run import forward_sigint

            if signum == signal.SIGINT:
                sigints[0] += 1
                first_only = not forward_sigint(sigints[0])
                # a Ctrl-C typed here already reached the local nodes' programs (same process group)
                job.forward(signum, only=lambda p: not (first_only and getattr(p, "shares_terminal", False)))
            else:
                job.forward(signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, forward)
        try:
            job.launch(command, args.cwd)
        except NativeStartError as e:
            err(f"run: {e}")
            return e.exit_code
        rc = job.wait()
        if job.revoked is not None:
            err(f"gpuctl run: {job.revoked}; the job is ended; exiting {int(ExitCode.LEASE_REVOKED)} (LEASE_REVOKED)")
        elif job.failure is not None:
            err(f"gpuctl run: the job failed on {job.failure[0]}: exit status {rc}")
        return rc
    except JobError as e:
        if job is None:
            raise
        err(f"run: {e}")
        return ExitCode.UNREACHABLE if e.code == "unreachable" else ExitCode.FAILURE
    finally:
        if job is not None:
            job.close()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        fleet.close()
