"""A lease's ttl counts from when it is in place, not from before its worker started: with an
injected clock, a worker start that takes longer than the ttl (a loaded node) must not give a
lease that has expired before it is answered (the root cause of the lease ttl test's flakes)."""

from __future__ import annotations

import pytest

from gpuctl.daemon.leases import GrantRequest, LeaseManager, WorkerStartFailed
from gpuctl.daemon.state import NodeStateManager, StateStore
from gpuctl.model import UNASSIGNED, GpuIdentity

GIB = 1024**3
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Worker:
    """A started worker as the launcher's WorkerHandle looks: records the deadlines it is given."""

    pid = 424242
    endpoint = "127.0.0.1:5555"

    def __init__(self, deadline_s: float, exits_at_start: bool = False):
        self.deadlines = [deadline_s]
        self.exited = exits_at_start
        self.stopped = False

    def alive(self) -> bool:
        return not self.exited and not self.stopped

    def extend(self, expires_at_s: float) -> None:
        if not self.alive():
            raise ProcessLookupError("worker has ended")
        self.deadlines.append(expires_at_s)

    def stop(self, timeout_s: float = 5.0) -> int:
        self.stopped = True
        return 0


def manager(tmp_path, clock: Clock, start_s: float, exits_at_start: bool = False):
    m = NodeStateManager(StateStore(tmp_path))
    m.reconcile([GpuIdentity(index=0, uuid="GPU-0", name="Sim", memory_total_bytes=8 * GIB)])
    m.assign("r1", m.generation, [{"slice_id": "GPU-0/0", "from": UNASSIGNED, "to": "research"}])
    workers = []

    def start_worker(**kw):
        clock.t += start_s  # the worker takes this long to come up
        workers.append(Worker(kw["expires_at_s"], exits_at_start))
        return workers[-1]

    return m, LeaseManager(m, [GpuIdentity(index=0, uuid="GPU-0", name="Sim", memory_total_bytes=8 * GIB)],
                           executor="numpy", start_worker=start_worker, clock=clock), workers


def test_slow_worker_start_does_not_eat_the_ttl(tmp_path):
    clock = Clock(T0)
    _, leases, workers = manager(tmp_path, clock, start_s=2.5)
    ans = leases.grant(GrantRequest(request_id="g1", department="research", owner="a@b", ttl_s=1.0, slices=1))
    lease = ans["lease"]
    # answered at T0 + 2.5: the lease has its whole ttl from there
    assert lease["created_s"] == lease["heartbeat_s"] == T0 + 2.5 and lease["expires_s"] == T0 + 3.5
    (w,) = workers
    assert w.deadlines[0] > T0 + 2.5  # the worker's first deadline leaves room for its start
    assert w.deadlines[-1] == T0 + 3.5  # then it is the lease's
    assert leases.check() == [] and not w.stopped  # alive at its answer
    clock.t = T0 + 3.4
    assert leases.check() == []
    clock.t = T0 + 3.6
    assert leases.check() == [(lease["id"], "expired")] and w.stopped


def test_worker_that_exits_as_it_starts_refuses_the_grant(tmp_path):
    clock = Clock(T0)
    m, leases, workers = manager(tmp_path, clock, start_s=0.1, exits_at_start=True)
    before = m.snapshot().body()
    with pytest.raises(WorkerStartFailed, match="exited right after it started; nothing was leased"):
        leases.grant(GrantRequest(request_id="g1", department="research", owner="a@b", ttl_s=1.0, slices=1))
    assert m.snapshot().body() == before and workers[0].stopped
    assert leases.check() == []
