"""The lease verbs of `gpuctl`: lease, release, renew, leases, run (rows of gpuctl.cli.registry).

- ``gpuctl lease --dept D (--gpus X | --slices N) [--node NAME] [--ttl S]``: grant a lease and
  print it (``--json`` adds the token and the ``GPUCTL_ATTACH`` string, shown only here).
- ``gpuctl release ID``: find the node holding lease ID (asks every node) and end it there.
- ``gpuctl leases``: every lease of the fleet.
- ``gpuctl run --dept D (--gpus X | --slices N) [--node NAME] [--ttl S] -- CMD ARGS...``: lease,
  run CMD with ``GPUCTL_ATTACH`` in its environment (stdio inherited: its output streams as it
  comes), heartbeat every ttl/3 in a background thread, release when CMD exits, when gpuctl gets
  SIGINT/SIGTERM (forwarded to CMD first; CMD is waited for) or fails itself, and exit with CMD's
  exit status (128 + N when CMD was killed by signal N). Before CMD starts, gpuctl's own exit codes
  apply; gpuctl's messages go to stderr, stdout is CMD's alone. When the lease is revoked
  (a reassignment with --revoke), CMD gets SIGTERM, then SIGKILL after --grace seconds, gpuctl
  says so on stderr with the node's reason and exits 8 (LEASE_REVOKED) whatever CMD's status.
- ``gpuctl run --native ... [--cwd DIR] -- CMD ARGS...``: the same, but CMD runs ON the leased
  node pinned natively to the slice (GPU UUID, MPS caps): see :mod:`gpuctl.fleet.native_run`.
- ``gpuctl run --native --gpus N [--per-node K] [--nodes A,B] [--dry-run] -- CMD``: N whole GPUs
  on one or more nodes, CMD on each with torchrun's rendezvous environment: see gpuctl.cli.job.

Node choice (no ``--node``) and the grant are gpuctl.fleet.leases.acquire; the exit code of a
refusal is its node error code's row of gpuctl.cli.errors.NODE_CODE_EXIT.

Exit codes (README): 0 OK; 2 USAGE (bad flags, unknown department or node); 4 NOTHING_TO_DO (no
free slices of the department cover the request on one GPU; ``release``: no such lease); 6
CONFLICT (the slices changed owner or were leased meanwhile, or MPS on the GPU serves another user);
7 UNREACHABLE; 1 FAILURE (the node could not start the lease's worker); 8 LEASE_REVOKED (run).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable

from gpuctl.arg_types import seconds_arg
from gpuctl.cli.context import check_node, load_config, open_fleet
from gpuctl.cli.errors import CliError, UsageError
from gpuctl.cli.output import emit_json, err, fmt_bytes, print_table
from gpuctl.cli.registry import Verb
from gpuctl.exit_codes import ExitCode
from gpuctl.fleet.native_run import forward_sigint as _forward_sigint

#: Default lease ttl of `gpuctl lease` (nobody heartbeats it afterwards), seconds.
LEASE_DEFAULT_TTL_S = 600.0
#: Default lease ttl of `gpuctl run` (heartbeated every ttl/3 while CMD runs), seconds.
RUN_DEFAULT_TTL_S = 30.0
#: How long `gpuctl run` waits for CMD to end after forwarding a signal before it kills it, seconds.
CHILD_GRACE_S = 10.0


# --------------------------------------------------------------------------- parser


_ttl = seconds_arg(1, 86400)


def _amount_args(p: argparse.ArgumentParser, ttl_default: float) -> None:
    p.add_argument("--dept", required=True, metavar="DEPT", help="department whose free slices to lease")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--gpus", type=float, metavar="X", help="GPU-equivalents, 0 < X <= 1 (e.g. 0.25)")
    amount.add_argument("--slices", type=int, metavar="N", help="number of slices (of one GPU)")
    p.add_argument("--node", metavar="NAME", help="lease on this node (default: the best-fitting node)")
    p.add_argument("--ttl", type=_ttl, default=ttl_default, metavar="SECONDS",
                   help=f"lease time to live without a heartbeat (default {ttl_default:g})")


def _release_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lease_id", metavar="ID", help="the lease id (lease-...)")


def _no_arguments(p: argparse.ArgumentParser) -> None:
    """`gpuctl leases` takes only the global flags."""


def _run_arguments(p: argparse.ArgumentParser) -> None:
    _amount_args(p, RUN_DEFAULT_TTL_S)
    p.add_argument("--native", action="store_true",
                   help="run CMD on the leased node itself, pinned to the slice (CUDA_VISIBLE_DEVICES=GPU UUID, "
                        "MPS caps for a fraction): any framework, no gpuctl import")
    p.add_argument("--cwd", metavar="DIR", help="CMD's working directory (on the node with --native; default: "
                   "the current directory here, the login directory on an SSH node)")
    p.add_argument("--grace", type=_ttl, default=CHILD_GRACE_S, metavar="SECONDS",
                   help=f"seconds between SIGTERM and SIGKILL when CMD must end (default {CHILD_GRACE_S:g})")
    p.add_argument("--per-node", type=int, metavar="K", help="multi-GPU job (--native): K whole GPUs on each node "
                   "(default: the fewest nodes that hold --gpus N)")
    p.add_argument("--nodes", metavar="A,B", help="multi-GPU job (--native): run on exactly these nodes, the first "
                   "is rank 0 (MASTER_ADDR)")
    p.add_argument("--dry-run", action="store_true", help="multi-GPU job: show the placement, lease nothing")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                   help="the command, after --; it finds the lease in GPUCTL_ATTACH (--native: its GPU in "
                        "CUDA_VISIBLE_DEVICES)")


# --------------------------------------------------------------------------- helpers


def _check_args(args: argparse.Namespace, cfg: Any) -> None:
    """Check --gpus/--slices, --node and --dept against the fleet config; raises UsageError."""
    from gpuctl.leasing import validate_amount
    from gpuctl.model import UNASSIGNED

    try:
        validate_amount(args.slices, args.gpus)
    except ValueError as e:
        flag = "--slices" if args.slices is not None else "--gpus"
        raise UsageError(f"{flag}: {e}") from None
    check_node(cfg, args.node)
    if cfg.departments and args.dept != UNASSIGNED and cfg.department(args.dept) is None:
        raise UsageError(f"--dept: unknown department {args.dept!r} (known: "
                         f"{', '.join(d.name for d in cfg.departments)})")


def _when(t: float) -> str:
    left = t - time.time()
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} (in {max(0, left):.0f} s)"


def granted_gpus(answer: dict[str, Any]) -> float | None:
    """GPU-equivalents a grant holds (the sum of its slices' fractions: the daemon's
    ``gpu_equivalents``; its ``compute_share`` for a daemon that predates that field)."""
    value = answer.get("gpu_equivalents", answer.get("compute_share"))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def granted_label(answer: dict[str, Any], asked_gpus: float | None) -> str:
    """What was granted, in words: ``1/2 GPU (asked 0.3: the smallest free slices covering it)``."""
    from gpuctl.format import fraction_label

    got = granted_gpus(answer)
    if got is None:
        return "unknown"
    text = f"{fraction_label(got)} GPU"
    if asked_gpus is not None and got > asked_gpus + 1e-9:
        text += f" (asked {asked_gpus:g}: the smallest free slices covering it)"
    return text


def _lease_doc(node: str, answer: dict[str, Any], asked_gpus: float | None = None) -> dict[str, Any]:
    doc = {"node": node, "lease": answer["lease"], "gpu_index": answer.get("gpu_index"),
           "endpoint": answer["endpoint"], "token": answer["token"], "attach": answer["attach"],
           "quota_bytes": answer.get("quota_bytes"), "gpu_equivalents": granted_gpus(answer),
           "asked_gpu_equivalents": asked_gpus}
    if answer.get("quota_cap"):
        doc["quota_cap"] = answer["quota_cap"]
    return doc


def _quota_note(node: str, answer: dict[str, Any]) -> str | None:
    """The stderr line for a grant whose quota the node cut (NumPy executor: host memory)."""
    cap = answer.get("quota_cap")
    return f"{node}: lease {answer['lease']['id']}: {cap.get('reason')}" if isinstance(cap, dict) else None


def _describe_lease(node: str, lease: dict[str, Any], gpu_index: Any) -> str:
    return (f"lease {lease['id']} on {node}: {len(lease['slice_ids'])} slice(s) of {lease['department']} on GPU "
            f"{'?' if gpu_index is None else gpu_index} ({', '.join(lease['slice_ids'])}), "
            f"{'endpoint ' + lease['endpoint'] if lease.get('endpoint') else 'native attach'}, expires {_when(lease['expires_s'])}")


# --------------------------------------------------------------------------- verbs


def cmd_lease(args: argparse.Namespace) -> int:
    """`gpuctl lease`: grant and print (stdout: the lease; --json adds token and attach)."""
    from gpuctl.fleet.leases import acquire

    cfg = load_config(args)
    _check_args(args, cfg)
    fleet = open_fleet(args, cfg)
    try:
        node, answer = acquire(fleet, dept=args.dept, count=args.slices, gpus=args.gpus, node=args.node,
                               ttl_s=args.ttl)
    finally:
        fleet.close()
    lease = answer["lease"]
    if note := _quota_note(node, answer):
        err(note)
    if args.json:
        emit_json(_lease_doc(node, answer, args.gpus))
    else:
        print(f"lease      {lease['id']}")
        print(f"node       {node}")
        print(f"department {lease['department']}")
        print(f"granted    {granted_label(answer, args.gpus)}")
        print(f"slices     {', '.join(lease['slice_ids'])} (GPU {answer.get('gpu_index')})")
        print(f"endpoint   {answer['endpoint']}")
        print(f"expires    {_when(lease['expires_s'])}, ttl {lease['ttl_s']:g} s")
        print(f"owner      {lease['owner']}")
        err("the token and GPUCTL_ATTACH string are shown with --json only")
    return ExitCode.OK


def _all_leases(fleet: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    res = fleet.fan_out(lambda c: c.leases())
    rows = []
    for name in fleet.clients:
        for lease in res.values.get(name, []):
            rows.append({"node": name, **lease})
    return rows, {name: str(err) for name, err in res.errors.items()}


def cmd_leases(args: argparse.Namespace) -> int:
    """`gpuctl leases`: every lease of every reachable node (exit 7 when a node is unreachable)."""
    cfg = load_config(args)
    fleet = open_fleet(args, cfg)
    try:
        rows, errors = _all_leases(fleet)
    finally:
        fleet.close()
    if args.json:
        emit_json({"leases": rows, "unreachable_nodes": sorted(errors)})
    else:
        from rich.table import Table

        t = Table(title=f"{len(rows)} lease(s)", title_justify="left")
        for col in ("lease", "node", "department", "owner", "GPU", "slices", "endpoint", "expires in", "memory"):
            # ids and endpoints are copied into other commands: never cut them; the owner may wrap
            t.add_column(col, no_wrap=col != "owner", overflow="fold" if col == "owner" else "ignore")
        now = time.time()
        for r in rows:
            usage = r.get("usage") or {}
            t.add_row(r["id"], r["node"], r["department"], r["owner"], str(r.get("gpu_index", "?")),
                      str(len(r["slice_ids"])), r.get("endpoint") or "-", f"{max(0, r['expires_s'] - now):.0f} s",
                      fmt_bytes(usage.get("memory_in_use_bytes")))
        print_table(t)
    for name, why in errors.items():
        err(f"node {name} unreachable: its leases are not listed ({why})")
    return ExitCode.UNREACHABLE if errors else ExitCode.OK


def _on_holder(args: argparse.Namespace, action: str) -> tuple[int, str | None, dict[str, Any] | None]:
    """Find the node holding lease args.lease_id (asks every node) and call NodeClient.<action> on it.

    Returns (OK, node, answer). Raises CliError for no such lease (NOTHING_TO_DO, or UNREACHABLE
    when some node could not be asked), gpuctl.fleet.client.NodeError for the daemon's refusal."""

    cfg = load_config(args)
    fleet = open_fleet(args, cfg)
    try:
        rows, errors = _all_leases(fleet)
        holder = next((r["node"] for r in rows if r["id"] == args.lease_id), None)
        if holder is None:
            msg = f"no lease {args.lease_id!r} on any reachable node"
            if errors:
                raise CliError(f"{msg}; unreachable: {', '.join(sorted(errors))}", ExitCode.UNREACHABLE)
            raise CliError(msg, ExitCode.NOTHING_TO_DO)
        # a refusal (NodeError) goes up to gpuctl.cli.main: its code's row of NODE_CODE_EXIT
        return ExitCode.OK, holder, getattr(fleet.clients[holder], action)(args.lease_id)
    finally:
        fleet.close()


def cmd_release(args: argparse.Namespace) -> int:
    """`gpuctl release ID`: end the lease on the node that holds it."""
    code, holder, answer = _on_holder(args, "release_lease")
    if answer is None:
        return code
    if args.json:
        emit_json({"node": holder, **answer})
    else:
        print(f"released {args.lease_id} on {holder}: {len(answer['slice_ids'])} slice(s) free"
              + (f", drained moves applied to {', '.join(answer['drained'])}" if answer.get("drained") else ""))
    return ExitCode.OK


def cmd_renew(args: argparse.Namespace) -> int:
    """`gpuctl renew ID`: heartbeat the lease on the node that holds it (expiry = now + ttl)."""
    code, holder, answer = _on_holder(args, "heartbeat_lease")
    if answer is None:
        return code
    if args.json:
        emit_json({"node": holder, **answer})
    else:
        left = answer["expires_s"] - time.time()
        print(f"renewed {args.lease_id} on {holder}: expires in {left:.0f} s")
    return ExitCode.OK


class _Heartbeat(threading.Thread):
    """Heartbeats one lease every `interval_s` until stopped; says on stderr when the lease ends."""

    def __init__(self, client: Any, lease_id: str, interval_s: float, err: Callable[[str], None],
                 on_revoked: Callable[[], None] | None = None, end_on_loss: bool = False):
        super().__init__(name="gpuctl-heartbeat", daemon=True)
        self.client, self.lease_id, self.interval_s, self.err = client, lease_id, interval_s, err
        self.on_revoked = on_revoked
        self.end_on_loss = end_on_loss  # native: a program never runs on without its lease
        self.stopped = threading.Event()
        self.lost: str | None = None
        self.revoked: str | None = None  # the node's words when a reassignment revoked the lease

    def run(self) -> None:
        from gpuctl.fleet.client import NodeError

        while not self.stopped.wait(self.interval_s):
            try:
                self.client.heartbeat_lease(self.lease_id)
            except NodeError as e:
                if e.reachable:  # the node answered: the lease is gone (expired, revoked, worker died)
                    self.lost = str(e)
                    if e.code == "lease_revoked":
                        self.revoked = str(e)
                        self.err(f"lease {self.lease_id} was revoked: {e}; ending CMD")
                        if self.on_revoked is not None:
                            self.on_revoked()
                    else:
                        self.err(f"lease {self.lease_id} ended: {e}" + ("; ending CMD" if self.end_on_loss else ""))
                        if self.end_on_loss and self.on_revoked is not None:
                            self.on_revoked()
                    return
                self.err(f"heartbeat of lease {self.lease_id} failed, retrying: {e}")


def cmd_run(args: argparse.Namespace) -> int:
    """`gpuctl run ... -- CMD ARGS`: lease, run CMD attached, release; CMD's exit status."""
    from gpuctl.fleet.client import NodeError
    from gpuctl.fleet.leases import acquire

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    from gpuctl.cli.job import is_job, run_job

    if is_job(args):  # N whole GPUs on one or more nodes: gpuctl.fleet.job
        return run_job(args, command)
    if not command:
        raise UsageError("run: give the command after --, e.g. gpuctl run --dept research --gpus 0.25 -- "
                         "python train.py")
    native = bool(getattr(args, "native", False))
    cfg = load_config(args)
    _check_args(args, cfg)
    fleet = open_fleet(args, cfg)
    proc: Any = None
    heartbeat: _Heartbeat | None = None
    lease_id = node = None
    old_handlers: dict[int, Any] = {}
    try:
        node, answer = acquire(fleet, dept=args.dept, count=args.slices, gpus=args.gpus, node=args.node,
                               ttl_s=args.ttl, attach="native" if native else None)
        lease_id = answer["lease"]["id"]
        err(f"{_describe_lease(node, answer['lease'], answer.get('gpu_index'))}; granted "
            f"{granted_label(answer, args.gpus)}")
        if note := _quota_note(node, answer):
            err(note)
        for warning in answer.get("warnings") or []:
            err(f"warning: lease {lease_id}: {warning}")
        if native:
            from gpuctl.fleet.native_run import NativeStartError, describe_env, record_pid, start_native

            err(f"native on {node}: {describe_env(answer.get('env') or {})}")
            try:
                proc = start_native(cfg.node(node), fleet.clients[node].transport(), answer, command, args.cwd)
            except NativeStartError as e:
                err(f"run: {e}")
                return e.exit_code
            except Exception as e:  # noqa: BLE001 - the node's connection failed: said, then released
                err(f"run: cannot start {command[0]!r} on {node}: {e}")
                return ExitCode.UNREACHABLE
        else:
            env = dict(os.environ)
            env["GPUCTL_ATTACH"] = answer["attach"]
            try:
                proc = subprocess.Popen(command, env=env, cwd=args.cwd)
            except OSError as e:
                err(f"run: cannot start {command[0]!r}: {e.strerror or e}")
                return 127 if isinstance(e, FileNotFoundError) else 126
        sigints = [0]

        def forward(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT:
                sigints[0] += 1
                if getattr(proc, "shares_terminal", True) and not _forward_sigint(sigints[0]):
                    return
            if proc is not None and proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

        # in place before the pid is recorded: whoever sees it on the node may signal gpuctl at once
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, forward)
        if native:
            record_pid(fleet.clients[node], lease_id, proc, err)

        def end_cmd() -> None:
            from gpuctl.fleet.native_run import wait_or_kill

            threading.Thread(target=wait_or_kill, args=(proc, args.grace), daemon=True).start()

        heartbeat = _Heartbeat(fleet.clients[node], lease_id, max(0.2, args.ttl / 3), err, on_revoked=end_cmd,
                               end_on_loss=native)
        heartbeat.start()
        rc = proc.wait()
        rc = rc if rc >= 0 else 128 - rc
        heartbeat.stopped.set()
        if heartbeat.revoked is None and heartbeat.lost is None:
            # CMD may have ended because of a revoke the heartbeat has not seen yet (the node ends a
            # native lease's processes, a remote lease's worker, at once): ask now
            try:
                fleet.clients[node].heartbeat_lease(lease_id)
            except NodeError as e:
                if e.code == "lease_revoked":
                    heartbeat.revoked = str(e)
        if heartbeat.revoked is not None:
            err(f"gpuctl run: lease {lease_id} on {node} was revoked ({heartbeat.revoked}); CMD ended with exit "
                 f"status {rc}; exiting {int(ExitCode.LEASE_REVOKED)} (LEASE_REVOKED)")
            return ExitCode.LEASE_REVOKED
        if getattr(proc, "connection_lost", False):
            err(f"gpuctl run: the SSH connection to {node} was lost: CMD's exit status is unknown (the node ends "
                 f"it when lease {lease_id} expires, within {args.ttl:g} s)")
            return ExitCode.UNREACHABLE
        return rc
    finally:
        if heartbeat is not None:
            heartbeat.stopped.set()
        if proc is not None and proc.poll() is None:  # gpuctl itself failed: CMD must not outlive the lease
            from gpuctl.fleet.native_run import wait_or_kill

            wait_or_kill(proc, args.grace)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        if lease_id is not None and node is not None:
            try:
                fleet.clients[node].release_lease(lease_id)
                err(f"released lease {lease_id} on {node}")
            except NodeError as e:
                if e.code not in ("unknown_lease", "lease_revoked"):
                    err(f"could not release lease {lease_id} on {node}: {e} (it ends at its ttl, "
                         f"{args.ttl:g} s)")
        fleet.close()


lease = Verb(lambda p: _amount_args(p, LEASE_DEFAULT_TTL_S), cmd_lease)
release = Verb(_release_arguments, cmd_release)
renew = Verb(_release_arguments, cmd_renew)
leases = Verb(_no_arguments, cmd_leases)
run = Verb(_run_arguments, cmd_run)
