"""Where the console gets its data: the FleetSource protocol.

Headless (never imports textual). The console (gpuctl/app.py) calls a FleetSource only from
thread workers, because its methods may block on the network. Two implement it:
:class:`LiveFleetSource` (a gpuctl.fleet.client.FleetClient over SSH or a local socket, plus the
reassignment service of `gpuctl reassign`) and gpuctl.fleet.simulated.SimulatedFleetSource (the
same client and service over in-process daemons).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from gpuctl import model
from gpuctl.fleet.client import FleetClient
from gpuctl.fleet.reassign import ReassignRequest, ReassignResult, reassign


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
    fleet_client(): the gpuctl.fleet.client.FleetClient that reaches the nodes' gpuctld control
    APIs, for what only the daemons keep (usage reports and usage history,
    gpuctl.fleet.usage_report), or None when the source has none (the in-process simulated fleet,
    a Prometheus source without SSH control). Does not block; the caller does not close it (close()
    does).
    """

    departments: list[model.Department]

    def snapshot(self) -> model.FleetSnapshot: ...

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[model.GpuSample]]: ...

    def close(self) -> None: ...

    def reassign(self, request: Any) -> Any: ...

    def fleet_client(self) -> FleetClient | None: ...


class LiveFleetSource:
    """The live fleet as a FleetSource: `client` (a FleetClient; closed by close()) for snapshot and
    history, gpuctl.fleet.reassign.reassign for reassign, the same service as `gpuctl reassign`."""

    def __init__(self, client: FleetClient):
        self.client = client

    @property
    def departments(self) -> list[model.Department]:
        """The fleet config's departments, in config order."""
        return self.client.departments

    def snapshot(self) -> model.FleetSnapshot:
        """FleetClient.snapshot (BLOCKING: one GET /v1/status per node, in parallel)."""
        return self.client.snapshot()

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[model.GpuSample]]:
        """FleetClient.history (BLOCKING); raises gpuctl.fleet.client.NodeError."""
        return self.client.history(node, uuid, since)

    def reassign(self, request: ReassignRequest) -> ReassignResult:
        """Plan and execute `request` (BLOCKING); raises ReassignError for an invalid request."""
        return reassign(self.client, request)

    def fleet_client(self) -> FleetClient:
        """`client`: the nodes' control APIs (usage reports and history read through it)."""
        return self.client

    def close(self) -> None:
        """Close the client's connections (idempotent)."""
        self.client.close()
