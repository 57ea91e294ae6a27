"""The daemon's schedule (gpuctl.daemon.schedule) with an injected clock: no sleeping, no threads."""

from __future__ import annotations

import pytest

from gpuctl.daemon.audit import AuditLog, read_records
from gpuctl.daemon.schedule import (EntryFinished, ScheduleEntry, ScheduleManager, ScheduleStore, UnknownEntry,
                                    entry_id)
from gpuctl.daemon.state import (InvalidRequest, NodeStateManager, RequestIdReused, StateCorruptError,
                                 StateStore, StateWriteError, UnknownSlice)
from gpuctl.model import GpuIdentity, Lease

T0 = 1_800_000_000.0


class FakeClock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def node(tmp_path):
    clock = FakeClock()
    state = NodeStateManager(StateStore(tmp_path))
    audit = AuditLog(tmp_path, "n1", clock=clock)
    audit.open()
    state.on_commit = audit.on_commit
    state.reconcile([GpuIdentity(index=i, uuid=f"GPU-{i}", name="Sim", memory_total_bytes=1 << 30) for i in range(3)])
    revoked = []
    sched = ScheduleManager(ScheduleStore(tmp_path), state, clock=clock, audit=audit,
                            on_revoke=lambda: revoked.append(1))
    return state, sched, clock, revoked, tmp_path


def _entry(rid="r1", at=T0 + 3600, sids=("GPU-0/0",), src="unassigned", dst="research", **kw) -> ScheduleEntry:
    return ScheduleEntry(id="", request_id=rid, at_s=at, src=src, dst=dst, slice_ids=list(sids), **kw)


def _owner(state, sid):
    return state.snapshot().slices[sid].department


def test_entry_runs_at_its_time_not_before(node):
    state, sched, clock, _, tmp = node
    ans = sched.add(_entry())
    assert ans["replayed"] is False and ans["entry"]["id"] == entry_id("r1") and ans["entry"]["status"] == "planned"
    clock.t = T0 + 3599
    assert sched.run_due() == []
    assert _owner(state, "GPU-0/0") == "unassigned"
    clock.t = T0 + 3600.5
    assert sched.run_due() == [entry_id("r1")]
    assert _owner(state, "GPU-0/0") == "research"
    e = sched.entries()[0]
    assert (e.status, e.moved, e.late_s, e.executed_s) == ("done", ["GPU-0/0"], None, T0 + 3600.5)
    recs = [r for r in read_records(tmp).records if r.get("request_id") == "r1"]
    assert [r.get("phase") or r["event"] for r in recs] == ["begin", "change", "end"]
    assert recs[1]["moved"] == [{"slice_id": "GPU-0/0", "from": "unassigned", "to": "research"}]
    assert recs[1]["who"]["internal"] == "schedule"
    # durable: a new manager reads the same entries from schedule.json
    again = ScheduleManager(ScheduleStore(tmp), state, clock=clock)
    assert [(x.id, x.status) for x in again.entries()] == [(entry_id("r1"), "done")]


def test_late_entry_is_marked_late(node):
    state, sched, clock, _, _ = node
    sched.add(_entry())
    clock.t = T0 + 3600 + 7200  # the daemon was down at the time
    sched.run_due()
    e = sched.entries()[0]
    assert e.status == "late" and e.late_s == pytest.approx(7200)
    assert _owner(state, "GPU-0/0") == "research"


def test_same_request_id_replays_and_other_content_is_refused(node):
    state, sched, clock, _, tmp = node
    sched.add(_entry())
    assert sched.add(_entry())["replayed"] is True
    before = (tmp / "schedule.json").read_bytes()
    with pytest.raises(RequestIdReused, match="already used for schedule entry"):
        sched.add(_entry(dst="training"))
    assert (tmp / "schedule.json").read_bytes() == before
    assert len(sched.entries()) == 1


@pytest.mark.parametrize("kw, error, match", [
    ({"sids": ("GPU-9/0",)}, UnknownSlice, "no slice 'GPU-9/0'"),
    ({"at": float("nan")}, InvalidRequest, "at_s must be a Unix time"),
    ({"dst": "unassigned"}, InvalidRequest, "nothing would move"),
    ({"sids": ()}, InvalidRequest, "slice_ids is empty"),
    ({"leased": "maybe"}, InvalidRequest, "leased must be one of"),
])
def test_bad_entries_are_refused_and_nothing_is_installed(node, kw, error, match):
    state, sched, clock, _, tmp = node
    with pytest.raises(error, match=match):
        sched.add(_entry(**kw))
    assert sched.entries() == [] and not (tmp / "schedule.json").exists()


def _lease(state, sid, lid="L1", dept="unassigned"):
    state.add_lease(Lease(id=lid, department=dept, slice_ids=[sid], owner="bob@h", ttl_s=60,
                          created_s=T0, heartbeat_s=T0, expires_s=T0 + 60))


def test_leased_slice_fails_the_entry_with_the_reason(node):
    state, sched, clock, _, _ = node
    _lease(state, "GPU-0/0")
    sched.add(_entry(sids=("GPU-0/0", "GPU-1/0")))
    gen = state.generation
    clock.t = T0 + 3600
    sched.run_due()
    e = sched.entries()[0]
    assert e.status == "failed" and "GPU-0/0 is leased (lease L1)" in e.reason
    assert state.generation == gen and _owner(state, "GPU-1/0") == "unassigned"  # all or nothing


def test_drain_waits_for_the_lease_then_moves(node):
    state, sched, clock, _, _ = node
    _lease(state, "GPU-0/0")
    sched.add(_entry(sids=("GPU-0/0", "GPU-1/0"), leased="drain"))
    clock.t = T0 + 3600
    sched.run_due()
    e = sched.entries()[0]
    assert (e.status, e.moved, e.pending) == ("waiting", ["GPU-1/0"], ["GPU-0/0"])
    assert _owner(state, "GPU-0/0") == "unassigned"
    clock.t += 1
    sched.run_due()
    assert sched.entries()[0].status == "waiting"
    state.remove_lease("L1")  # the drained move is applied when the lease ends
    sched.run_due()
    e = sched.entries()[0]
    assert (e.status, sorted(e.moved), e.pending) == ("done", ["GPU-0/0", "GPU-1/0"], [])
    assert _owner(state, "GPU-0/0") == "research"


def test_revoke_ends_leases_after_the_grace(node):
    state, sched, clock, revoked, _ = node
    _lease(state, "GPU-0/0")
    sched.add(_entry(leased="revoke", grace_s=600))
    clock.t = T0 + 3600
    sched.run_due()
    e = sched.entries()[0]
    assert e.status == "waiting" and e.revoke_at_s == T0 + 4200
    clock.t = T0 + 4199
    sched.run_due()
    assert "L1" in state.snapshot().leases
    clock.t = T0 + 4200
    sched.run_due()
    assert "L1" not in state.snapshot().leases and _owner(state, "GPU-0/0") == "research"
    assert sched.entries()[0].status == "done" and revoked


def test_cancel_planned_entry_never_runs_and_finished_cannot_be_cancelled(node):
    state, sched, clock, _, _ = node
    sched.add(_entry())
    sched.add(_entry(rid="r2", sids=("GPU-1/0",), at=T0 + 10))
    assert sched.cancel(entry_id("r1"))["entry"]["status"] == "cancelled"
    clock.t = T0 + 4000
    sched.run_due()
    assert _owner(state, "GPU-0/0") == "unassigned"
    with pytest.raises(EntryFinished, match="already late"):
        sched.cancel(entry_id("r2"))
    with pytest.raises(UnknownEntry):
        sched.cancel("s-nope")


def test_crash_between_move_and_schedule_write_moves_once(node, monkeypatch):
    state, sched, clock, _, tmp = node
    sched.add(_entry())
    clock.t = T0 + 3600
    real_save = sched.store.save
    calls = []

    def failing_save(entries):
        calls.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sched.store, "save", failing_save)
    sched.run_due()  # the move is made (state.json), the schedule file could not say so
    assert _owner(state, "GPU-0/0") == "research" and sched.entries()[0].status == "planned"
    gen = state.generation
    monkeypatch.setattr(sched.store, "save", real_save)
    sched.run_due()  # executes again: the state replays its recorded answer, nothing moves twice
    assert state.generation == gen and sched.entries()[0].status == "done" and calls


def test_corrupt_schedule_file_is_refused_naming_it(tmp_path):
    (tmp_path / "schedule.json").write_text('{"format": 1, "checksum": "sha256:00", "body": {"entries": []}}')
    state = NodeStateManager(StateStore(tmp_path))
    with pytest.raises(StateCorruptError, match="schedule.json.*checksum mismatch"):
        ScheduleManager(ScheduleStore(tmp_path), state, clock=FakeClock())


def test_schedule_write_failure_changes_nothing(node, monkeypatch):
    state, sched, clock, _, tmp = node

    def fail(entries):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sched.store, "save", fail)
    with pytest.raises(StateWriteError, match="schedule.json: No space left"):
        sched.add(_entry())
    assert sched.entries() == []
