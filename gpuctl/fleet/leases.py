"""Lease acquisition for the admin side: which node can hold a lease, and granting it there.

Node choice (no node named): every reachable node's status is read and each node's best lease is
computed with the daemon's own rule (:mod:`gpuctl.leasing`: smallest total fraction covering the
request on one GPU, then fewest slices, then the GPU with the least idle capacity of the
department); the node with the best one wins, ties going to the first in the fleet config (a GPU's
index only breaks ties within one node: it says nothing across nodes). When
that node refuses because another client took the slices meanwhile, the next is tried.
"""

from __future__ import annotations

import getpass
import socket
import uuid
from typing import Any

from gpuctl.fleet.client import NodeError
from gpuctl.leasing import best_pick, describe_amount, describe_idle


class AcquireError(Exception):
    """No lease could be granted. ``str()`` says why (each node's idle slices, or the node's
    refusal); `code` is a node error code: "insufficient_slices" (nothing covers the request),
    "unreachable" (nothing covers it among the nodes reached, and some were not), or the refusing
    daemon's code (NodeError.code)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def owner() -> str:
    """This client as a lease owner: ``user@host`` (getpass.getuser(), socket.gethostname())."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def choose_nodes(snapshot: Any, dept: str, count: int | None, gpus: float | None) -> list[str]:
    """Node names of a gpuctl.model.FleetSnapshot whose slices can hold the lease (`count` slices
    or `gpus` GPU-equivalents of `dept` on one GPU), best fit first (see the module docstring)."""
    scored = []
    for order, n in enumerate(snapshot.nodes):
        if not n.reachable:
            continue
        gpu_index = {g.identity.uuid: g.identity.index for g in n.gpus if g.identity.index >= 0}
        pick = best_pick(n.slices(), dept, gpu_index, count=count, gpus=gpus)
        if pick is not None:
            # (fraction, slices, idle left on that GPU), then config order, then the GPU index
            scored.append((pick.key[:3], order, pick.key[3:], n.name))
    return [name for *_, name in sorted(scored)]


def acquire(fleet: Any, *, dept: str, count: int | None, gpus: float | None, node: str | None,
            ttl_s: float, attach: str | None = None) -> tuple[str, dict[str, Any]]:
    """Grant a lease on `node` or on the best-fitting node of a gpuctl.fleet.client.FleetClient;
    returns (node name, the daemon's grant answer: lease, endpoint, token, attach, gpu_index).

    Raises AcquireError: "insufficient_slices" when no node has idle slices of `dept` covering the
    amount on one GPU (the message lists each node's idle slices), "unreachable" when none of the
    nodes reached does and some could not be reached, else the node's refusal code.
    """
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
            msg = (f"no node has free slices of {dept!r} covering {describe_amount(count, gpus)} on one GPU "
                   f"(a lease holds slices of one GPU); free slices of {dept}: {idle or 'no node reachable'}")
            if unreachable:
                msg += f"; unreachable: {', '.join(unreachable)}"
            raise AcquireError(msg, "unreachable" if unreachable else "insufficient_slices")
    last: NodeError | None = None
    for i, name in enumerate(candidates):
        try:
            answer = fleet.clients[name].grant_lease(
                request_id=f"lease-req-{uuid.uuid4().hex}", department=dept, owner=owner(), ttl_s=ttl_s,
                slices=count, gpus=gpus, **({"attach": attach} if attach else {}))
            return name, answer
        except NodeError as e:
            last = e
            if e.code == "insufficient_slices" and i + 1 < len(candidates):
                continue  # another client took them meanwhile: next best node
            break
    assert last is not None
    raise AcquireError(str(last), last.code)
