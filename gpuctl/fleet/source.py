"""Where the console gets its data: the FleetSource protocol.

Headless (never imports textual). The console (gpuctl/app.py) calls a FleetSource only from
thread workers, because its methods may block on the network. Two implement it:
gpuctl.fleet.client.FleetClient (the live fleet, over SSH or a local socket) and
gpuctl.fleet.simulated.SimulatedFleetSource (the same FleetClient over in-process daemons).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from gpuctl import model


@runtime_checkable
class FleetSource(Protocol):
    """What the console needs from the fleet.

    departments: the departments of the fleet config, in config order (the console gives them
    colors in this order). snapshot(): the whole fleet now (BLOCKING: network; call it only from
    a thread worker); a node that cannot be reached is a NodeStatus with reachable=False and its
    reason in `error`, never an exception. history(node, uuid, since): the daemon's telemetry
    ring for one GPU, samples of rounds after cursor `since`, as (cursor, samples) where cursor is
    the value to pass next time (BLOCKING). close(): release connections; idempotent.
    reassign(request): plan and run a gpuctl.fleet.reassign.ReassignRequest, returning a
    ReassignResult (BLOCKING; raises gpuctl.fleet.reassign.ReassignError for an invalid request).
    """

    departments: list[model.Department]

    def snapshot(self) -> model.FleetSnapshot: ...

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[model.GpuSample]]: ...

    def close(self) -> None: ...

    def reassign(self, request: Any) -> Any: ...
