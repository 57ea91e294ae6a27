"""The lease verbs of `gpuctl`: lease, release, renew, leases, run (registered by gpuctl.cli).

- ``gpuctl lease --dept D (--gpus X | --slices N) [--node NAME] [--ttl S]``: grant a lease and
  print it (``--json`` adds the token and the ``GPUCTL_ATTACH`` string, shown only here).
- ``gpuctl release ID``: find the node holding lease ID (asks every node) and end it there.
- ``gpuctl leases``: every lease of the fleet.
- ``gpuctl run --dept D (--gpus X | --slices N) [--node NAME] [--ttl S] -- CMD ARGS...``: lease,
  run CMD with ``GPUCTL_ATTACH`` in its environment (stdio inherited: its output streams as it
  comes), heartbeat every ttl/3 in a background thread, release when CMD exits, when gpuctl gets
  SIGINT/SIGTERM (forwarded to CMD first; CMD is waited for) or fails itself, and exit with CMD's
  exit status (128 + N when CMD was killed by signal N). Before CMD starts, gpuctl's own exit codes
  apply; gpuctl's messages go to stderr, stdout is CMD's alone.

Node choice (no ``--node``): every reachable node's status is read and each node's best lease is
computed with the daemon's own rule (:mod:`gpuctl.leasing`: smallest total fraction covering the
request on one GPU, then fewest slices, then the GPU with the least idle capacity of the
department); the node with the best one wins, ties going to the first in the fleet config. When
that node refuses because another client took the slices meanwhile, the next is tried.

Exit codes (README): 0 OK; 2 USAGE (bad flags, unknown department or node); 4 NOTHING_TO_DO (no
idle slices of the department cover the request on one GPU; ``release``: no such lease); 6
CONFLICT (the slices changed owner or were leased meanwhile); 7 UNREACHABLE; 1 FAILURE (the node
could not start the lease's worker).
"""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable

from gpuctl.exit_codes import ExitCode

#: Default lease ttl of `gpuctl lease` (nobody heartbeats it afterwards), seconds.
LEASE_DEFAULT_TTL_S = 600.0
#: Default lease ttl of `gpuctl run` (heartbeated every ttl/3 while CMD runs), seconds.
RUN_DEFAULT_TTL_S = 30.0
#: How long `gpuctl run` waits for CMD to end after forwarding a signal before it kills it, seconds.
CHILD_GRACE_S = 10.0


class LeaseCliError(Exception):
    """A lease verb failed: `message` for stderr, `exit_code` (ExitCode) for the process."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------- parser


def _ttl(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"must be 1..86400 seconds, got {text}")
    return value


def _amount_args(p: argparse.ArgumentParser, ttl_default: float) -> None:
    p.add_argument("--dept", required=True, metavar="DEPT", help="department whose idle slices to lease")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--gpus", type=float, metavar="X", help="GPU-equivalents, 0 < X <= 1 (e.g. 0.25)")
    amount.add_argument("--slices", type=int, metavar="N", help="number of slices (of one GPU)")
    p.add_argument("--node", metavar="NAME", help="lease on this node (default: the best-fitting node)")
    p.add_argument("--ttl", type=_ttl, default=ttl_default, metavar="SECONDS",
                   help=f"lease time to live without a heartbeat (default {ttl_default:g})")


def add_lease_verbs(verb: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add lease, release, leases and run to gpuctl's parser; `verb(name, help)` makes a subparser."""
    p = verb("lease", "lease idle slices of a department for remote attach")
    _amount_args(p, LEASE_DEFAULT_TTL_S)
    p = verb("release", "end a lease (its worker stops, its slices are idle again)")
    p.add_argument("lease_id", metavar="ID", help="the lease id (lease-...)")
    p = verb("renew", "heartbeat a lease: its expiry moves to now + its ttl")
    p.add_argument("lease_id", metavar="ID", help="the lease id (lease-...)")
    verb("leases", "every lease of the fleet")
    p = verb("run", "lease slices, run a command attached to them, release when it ends")
    _amount_args(p, RUN_DEFAULT_TTL_S)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                   help="the command, after --; it finds the lease in GPUCTL_ATTACH")


# --------------------------------------------------------------------------- helpers


def owner() -> str:
    """This client as a lease owner: ``user@host`` (getpass.getuser(), socket.gethostname())."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _exit_for(code: str) -> int:
    if code in ("unreachable", "timeout"):
        return ExitCode.UNREACHABLE
    if code == "insufficient_slices":
        return ExitCode.NOTHING_TO_DO
    if code in ("wrong_owner", "slice_leased", "request_id_reused", "stale_generation", "gpu_missing"):
        return ExitCode.CONFLICT
    if code in ("invalid_field", "missing_field", "unknown_field", "bad_json"):
        return ExitCode.USAGE
    return ExitCode.FAILURE


def _usage(message: str) -> LeaseCliError:
    return LeaseCliError(message, ExitCode.USAGE)


def _check_args(args: argparse.Namespace, cfg: Any) -> None:
    """Check --gpus/--slices, --node and --dept against the fleet config; LeaseCliError (USAGE)."""
    from gpuctl.leasing import validate_amount
    from gpuctl.model import UNASSIGNED

    try:
        validate_amount(args.slices, args.gpus)
    except ValueError as e:
        flag = "--slices" if args.slices is not None else "--gpus"
        raise _usage(f"{flag}: {e}") from None
    if args.node and cfg.node(args.node) is None:
        raise _usage(f"--node: unknown node {args.node!r} (known: {', '.join(n.name for n in cfg.nodes)})")
    if cfg.departments and args.dept != UNASSIGNED and cfg.department(args.dept) is None:
        raise _usage(f"--dept: unknown department {args.dept!r} (known: "
                         f"{', '.join(d.name for d in cfg.departments)})")


def choose_nodes(snapshot: Any, dept: str, count: int | None, gpus: float | None) -> list[str]:
    """Node names whose slices can hold the lease, best fit first (see the module docstring)."""
    from gpuctl.leasing import best_pick

    scored = []
    for order, n in enumerate(snapshot.nodes):
        if not n.reachable:
            continue
        gpu_index = {g.identity.uuid: g.identity.index for g in n.gpus if g.identity.index >= 0}
        pick = best_pick(n.slices(), dept, gpu_index, count=count, gpus=gpus)
        if pick is not None:
            scored.append((pick.key, order, n.name))
    return [name for _, _, name in sorted(scored)]


def acquire(fleet: Any, *, dept: str, count: int | None, gpus: float | None, node: str | None,
            ttl_s: float) -> tuple[str, dict[str, Any]]:
    """Grant a lease on `node` or on the best-fitting node; returns (node name, grant answer).

    Raises LeaseCliError with the exit code: NOTHING_TO_DO when no node has idle slices of `dept`
    covering the amount on one GPU (the message lists each node's idle slices), UNREACHABLE,
    CONFLICT, FAILURE (worker did not start), as the node answered.
    """
    from gpuctl.fleet.client import NodeError
    from gpuctl.leasing import describe_amount, describe_idle

    unreachable: list[str] = []
    if node:
        candidates = [node]
    else:
        snap = fleet.snapshot()
        unreachable = [f"{n.name} ({n.error})" for n in snap.nodes if not n.reachable]
        candidates = choose_nodes(snap, dept, count, gpus)
        if not candidates:
            idle = "; ".join(
                f"{n.name}: " + describe_idle(n.slices(), dept, {g.identity.uuid: g.identity.index
                                                                  for g in n.gpus if g.identity.index >= 0})
                for n in snap.nodes if n.reachable)
            msg = (f"no node has idle slices of {dept!r} covering {describe_amount(count, gpus)} on one GPU "
                   f"(a lease holds slices of one GPU); idle slices of {dept}: {idle or 'no node reachable'}")
            if unreachable:
                msg += f"; unreachable: {', '.join(unreachable)}"
            raise LeaseCliError(msg, ExitCode.UNREACHABLE if unreachable else ExitCode.NOTHING_TO_DO)
    last: NodeError | None = None
    for i, name in enumerate(candidates):
        try:
            answer = fleet.clients[name].grant_lease(
                request_id=f"lease-req-{uuid.uuid4().hex}", department=dept, owner=owner(), ttl_s=ttl_s,
                slices=count, gpus=gpus)
            return name, answer
        except NodeError as e:
            last = e
            if e.code == "insufficient_slices" and i + 1 < len(candidates):
                continue  # another client took them meanwhile: next best node
            break
    assert last is not None
    raise LeaseCliError(str(last), _exit_for(last.code))


def _when(t: float) -> str:
    left = t - time.time()
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} (in {max(0, left):.0f} s)"


def _lease_doc(node: str, answer: dict[str, Any]) -> dict[str, Any]:
    return {"node": node, "lease": answer["lease"], "gpu_index": answer.get("gpu_index"),
            "endpoint": answer["endpoint"], "token": answer["token"], "attach": answer["attach"]}


def _describe_lease(node: str, lease: dict[str, Any], gpu_index: Any) -> str:
    return (f"lease {lease['id']} on {node}: {len(lease['slice_ids'])} slice(s) of {lease['department']} on GPU "
            f"{'?' if gpu_index is None else gpu_index} ({', '.join(lease['slice_ids'])}), endpoint "
            f"{lease.get('endpoint')}, expires {_when(lease['expires_s'])}")


# --------------------------------------------------------------------------- verbs


def cmd_lease(args: argparse.Namespace) -> int:
    """`gpuctl lease`: grant and print (stdout: the lease; --json adds token and attach)."""
    from gpuctl.cli import _emit_json, _err, _fleet, _load_config

    cfg = _load_config(args)
    _check_args(args, cfg)
    fleet = _fleet(args, cfg)
    try:
        node, answer = acquire(fleet, dept=args.dept, count=args.slices, gpus=args.gpus, node=args.node,
                               ttl_s=args.ttl)
    except LeaseCliError as e:
        _err(str(e))
        return e.exit_code
    finally:
        fleet.close()
    lease = answer["lease"]
    if args.json:
        _emit_json(_lease_doc(node, answer))
    else:
        print(f"lease      {lease['id']}")
        print(f"node       {node}")
        print(f"department {lease['department']}")
        print(f"slices     {', '.join(lease['slice_ids'])} (GPU {answer.get('gpu_index')})")
        print(f"endpoint   {answer['endpoint']}")
        print(f"expires    {_when(lease['expires_s'])}, ttl {lease['ttl_s']:g} s")
        print(f"owner      {lease['owner']}")
        _err("the token and GPUCTL_ATTACH string are shown with --json only")
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
    from gpuctl.cli import _console, _emit_json, _err, _fleet, _load_config, fmt_bytes

    cfg = _load_config(args)
    fleet = _fleet(args, cfg)
    try:
        rows, errors = _all_leases(fleet)
    finally:
        fleet.close()
    if args.json:
        _emit_json({"leases": rows, "unreachable_nodes": sorted(errors)})
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
        _console().print(t)
    for name, err in errors.items():
        _err(f"node {name} unreachable: its leases are not listed ({err})")
    return ExitCode.UNREACHABLE if errors else ExitCode.OK


def _on_holder(args: argparse.Namespace, action: str) -> tuple[int, str | None, dict[str, Any] | None]:
    """Find the node holding lease args.lease_id (asks every node) and call NodeClient.<action> on it.

    Returns (exit code, node, answer); errors are said on stderr: no such lease (NOTHING_TO_DO, or
    UNREACHABLE when some node could not be asked), or the daemon's refusal."""
    from gpuctl.cli import _err, _fleet, _load_config
    from gpuctl.fleet.client import NodeError

    cfg = _load_config(args)
    fleet = _fleet(args, cfg)
    try:
        rows, errors = _all_leases(fleet)
        holder = next((r["node"] for r in rows if r["id"] == args.lease_id), None)
        if holder is None:
            msg = f"no lease {args.lease_id!r} on any reachable node"
            if errors:
                _err(f"{msg}; unreachable: {', '.join(sorted(errors))}")
                return ExitCode.UNREACHABLE, None, None
            _err(msg)
            return ExitCode.NOTHING_TO_DO, None, None
        try:
            return ExitCode.OK, holder, getattr(fleet.clients[holder], action)(args.lease_id)
        except NodeError as e:
            _err(str(e))
            code = ExitCode.NOTHING_TO_DO if e.code in ("unknown_lease", "lease_ended") else _exit_for(e.code)
            return code, holder, None
    finally:
        fleet.close()


def cmd_release(args: argparse.Namespace) -> int:
    """`gpuctl release ID`: end the lease on the node that holds it."""
    from gpuctl.cli import _emit_json

    code, holder, answer = _on_holder(args, "release_lease")
    if answer is None:
        return code
    if args.json:
        _emit_json({"node": holder, **answer})
    else:
        print(f"released {args.lease_id} on {holder}: {len(answer['slice_ids'])} slice(s) idle"
              + (f", drained moves applied to {', '.join(answer['drained'])}" if answer.get("drained") else ""))
    return ExitCode.OK


def cmd_renew(args: argparse.Namespace) -> int:
    """`gpuctl renew ID`: heartbeat the lease on the node that holds it (expiry = now + ttl)."""
    from gpuctl.cli import _emit_json

    code, holder, answer = _on_holder(args, "heartbeat_lease")
    if answer is None:
        return code
    if args.json:
        _emit_json({"node": holder, **answer})
    else:
        left = answer["expires_s"] - time.time()
        print(f"renewed {args.lease_id} on {holder}: expires in {left:.0f} s")
    return ExitCode.OK


class _Heartbeat(threading.Thread):
    """Heartbeats one lease every `interval_s` until stopped; says on stderr when the lease ends."""

    def __init__(self, client: Any, lease_id: str, interval_s: float, err: Callable[[str], None]):
        super().__init__(name="gpuctl-heartbeat", daemon=True)
        self.client, self.lease_id, self.interval_s, self.err = client, lease_id, interval_s, err
        self.stopped = threading.Event()
        self.lost: str | None = None

    def run(self) -> None:
        from gpuctl.fleet.client import NodeError

        while not self.stopped.wait(self.interval_s):
            try:
                self.client.heartbeat_lease(self.lease_id)
            except NodeError as e:
                if e.reachable:  # the node answered: the lease is gone (expired, revoked, worker died)
                    self.lost = str(e)
                    self.err(f"lease {self.lease_id} ended: {e}")
                    return
                self.err(f"heartbeat of lease {self.lease_id} failed, retrying: {e}")


def _forward_sigint(count: int) -> bool:
    """A SIGINT typed at the terminal already reached CMD (same foreground process group): forward
    only the second, or one that came from elsewhere."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return count >= 2
    except OSError:
        pass
    return True


def cmd_run(args: argparse.Namespace) -> int:
    """`gpuctl run ... -- CMD ARGS`: lease, run CMD attached, release; CMD's exit status."""
    from gpuctl.cli import _err, _fleet, _load_config
    from gpuctl.fleet.client import NodeError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise _usage("run: give the command after --, e.g. gpuctl run --dept research --gpus 0.25 -- "
                         "python train.py")
    cfg = _load_config(args)
    _check_args(args, cfg)
    fleet = _fleet(args, cfg)
    proc: subprocess.Popen | None = None
    heartbeat: _Heartbeat | None = None
    lease_id = node = None
    old_handlers: dict[int, Any] = {}
    try:
        try:
            node, answer = acquire(fleet, dept=args.dept, count=args.slices, gpus=args.gpus, node=args.node,
                                   ttl_s=args.ttl)
        except LeaseCliError as e:
            _err(str(e))
            return e.exit_code
        lease_id = answer["lease"]["id"]
        _err(_describe_lease(node, answer["lease"], answer.get("gpu_index")))
        env = dict(os.environ)
        env["GPUCTL_ATTACH"] = answer["attach"]
        try:
            proc = subprocess.Popen(command, env=env)
        except OSError as e:
            _err(f"run: cannot start {command[0]!r}: {e.strerror or e}")
            return 127 if isinstance(e, FileNotFoundError) else 126
        sigints = [0]

        def forward(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT:
                sigints[0] += 1
                if not _forward_sigint(sigints[0]):
                    return
            if proc is not None and proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, forward)
        heartbeat = _Heartbeat(fleet.clients[node], lease_id, max(0.2, args.ttl / 3), _err)
        heartbeat.start()
        rc = proc.wait()
        return rc if rc >= 0 else 128 - rc
    finally:
        if heartbeat is not None:
            heartbeat.stopped.set()
        if proc is not None and proc.poll() is None:  # gpuctl itself failed: CMD must not outlive the lease
            proc.terminate()
            try:
                proc.wait(CHILD_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        if lease_id is not None and node is not None:
            try:
                fleet.clients[node].release_lease(lease_id)
                _err(f"released lease {lease_id} on {node}")
            except NodeError as e:
                if e.code != "unknown_lease":
                    _err(f"could not release lease {lease_id} on {node}: {e} (it ends at its ttl, "
                         f"{args.ttl:g} s)")
        fleet.close()


def _reporting(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a verb; a LeaseCliError is said on stderr and becomes its exit code. (Not cli.UsageError:
    under ``python -m gpuctl.cli`` that class exists twice, as __main__'s and gpuctl.cli's.)"""

    def verb(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except LeaseCliError as e:
            print(f"gpuctl: {e}", file=sys.stderr)
            return e.exit_code

    verb.__doc__ = fn.__doc__
    return verb


LEASE_VERBS = {"lease": _reporting(cmd_lease), "release": _reporting(cmd_release),
               "renew": _reporting(cmd_renew),
               "leases": _reporting(cmd_leases), "run": _reporting(cmd_run)}
