"""The daemon's durable state: file format, corruption, reconcile, assign/split semantics, leases."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gpuctl.daemon import state as state_mod
from gpuctl.daemon.state import (
    GpuMissing,
    InvalidRequest,
    LeaseExists,
    MixedOwners,
    NodeState,
    NodeStateManager,
    RequestIdReused,
    SliceLeased,
    StaleGeneration,
    StateCorruptError,
    StateLockedError,
    StateStore,
    StateWriteError,
    UnknownGpu,
    UnknownLease,
    UnknownSlice,
    WrongOwner,
    checksum,
)
from gpuctl.model import UNASSIGNED, GpuIdentity, Lease

GIB = 1024**3
GPUS = [GpuIdentity(uuid=f"GPU-{i}", index=i, name="sim", memory_total_bytes=80 * GIB) for i in range(3)]


def lease(lid: str, dept: str, slice_ids: list[str]) -> Lease:
    return Lease(id=lid, department=dept, slice_ids=slice_ids, owner="ann@client1", ttl_s=30.0,
                 created_s=1000.0, heartbeat_s=1000.0, expires_s=1030.0)


@pytest.fixture
def mgr(tmp_path: Path) -> NodeStateManager:
    m = NodeStateManager(StateStore(tmp_path))
    m.reconcile(GPUS)
    return m


def move(sid: str, src: str, dst: str) -> dict[str, str]:
    return {"slice_id": sid, "from": src, "to": dst}


class Unchanged:
    """Captures the manager's state and file before an error, to assert both are untouched."""

    def __init__(self, m: NodeStateManager):
        self.m = m
        self.body = m.snapshot().body()
        self.file = m.store.path.read_bytes()

    def check(self) -> None:
        assert self.m.snapshot().body() == self.body
        assert self.m.store.path.read_bytes() == self.file
        assert StateStore(self.m.store.directory).load().body() == self.body


# ------------------------------------------------------------------------------------ the file


def test_missing_file_loads_fresh_state(tmp_path):
    s = StateStore(tmp_path / "nothing-here").load()
    assert (s.generation, s.slices, s.leases, len(s.requests)) == (0, {}, {}, 0)


def test_write_then_load_gives_the_same_state(mgr, tmp_path):
    mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "research")])
    mgr.split("r2", 2, "GPU-1", 2)
    mgr.add_lease(lease("L1", "research", ["GPU-0/0"]))
    mgr.assign("r3", 4, [move("GPU-0/0", "research", "sales")], "drain")
    loaded = StateStore(tmp_path).load()
    assert loaded.body() == mgr.snapshot().body()
    assert loaded.generation == 5
    assert loaded.slices["GPU-0/0"].pending == {"to": "sales", "request_id": "r3"}
    assert loaded.slices["GPU-0/0"].lease_id == "L1"
    assert loaded.leases["L1"].owner == "ann@client1"
    assert list(loaded.requests) == ["r1", "r2", "r3"]
    assert loaded.slices["GPU-1/1"].fraction == 0.5


def test_file_has_format_and_checksum_and_no_temp_left(mgr, tmp_path):
    data = json.loads((tmp_path / "state.json").read_text())
    assert data["format"] == 1
    assert data["checksum"] == checksum(data["body"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", data["checksum"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_save_fsyncs_file_and_directory_and_renames(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}"))), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", Path(b).name)), real_replace(a, b)))
    StateStore(tmp_path).save(NodeState(generation=3))
    assert calls == [("fsync", False), ("replace", "state.json"), ("fsync", True)]


def _write_valid(tmp_path: Path) -> Path:
    m = NodeStateManager(StateStore(tmp_path))
    m.reconcile(GPUS)
    return tmp_path / "state.json"


@pytest.mark.parametrize(
    "mangle, problem",
    [
        (lambda b: b[: len(b) // 2], r"not valid JSON \(truncated\?\): .* at line \d+ column \d+"),
        (lambda b: b"", r"it is empty \(0 bytes\)"),
        (lambda b: b"\xff\xfe garbage", r"not UTF-8 at byte 0"),
        (lambda b: b"[1, 2]", r"top level must be an object, found list"),
        (lambda b: b.replace(b'"unassigned"', b'"research"', 1), r"checksum mismatch: the file says 'sha256:"),
        (lambda b: b.replace(b'"format": 1', b'"format": 2'), r"format is 2; this gpuctld reads format 1"),
        (lambda b: json.dumps({"format": 1, "checksum": "x"}).encode(), r"'body' is missing or not an object"),
    ],
    ids=["truncated", "empty", "not-utf8", "not-object", "checksum", "format", "no-body"],
)
def test_corrupt_file_raises_naming_the_file(tmp_path, mangle, problem):
    path = _write_valid(tmp_path)
    bad = mangle(path.read_bytes())
    path.write_bytes(bad)
    with pytest.raises(StateCorruptError) as e:
        StateStore(tmp_path).load()
    assert str(path) in str(e.value)
    assert re.search(problem, str(e.value)), str(e.value)
    assert e.value.path == path
    assert path.read_bytes() == bad  # never reset, never rewritten


def test_body_with_bad_field_names_it_even_with_a_good_checksum(tmp_path):
    path = _write_valid(tmp_path)
    data = json.loads(path.read_text())
    data["body"]["slices"][1]["department"] = 7
    data["checksum"] = checksum(data["body"])
    path.write_text(json.dumps(data))
    with pytest.raises(StateCorruptError, match=r"body\.slices\[1\]\.department is missing or of the wrong type \(7\)"):
        StateStore(tmp_path).load()


def test_slice_held_by_unknown_lease_is_corrupt(tmp_path):
    path = _write_valid(tmp_path)
    data = json.loads(path.read_text())
    data["body"]["slices"][0]["lease_id"] = "ghost"
    data["checksum"] = checksum(data["body"])
    path.write_text(json.dumps(data))
    with pytest.raises(StateCorruptError, match="held by lease 'ghost', which is not in the file"):
        StateStore(tmp_path).load()


def test_leftover_temp_files_are_ignored(tmp_path):
    _write_valid(tmp_path)
    (tmp_path / ".state.json.abc123.tmp").write_bytes(b'{"format": 1, "body": {"genera')
    loaded = StateStore(tmp_path).load()
    assert loaded.generation == 1 and len(loaded.slices) == 3


def test_move_aside_renames_the_bad_file(tmp_path):
    path = _write_valid(tmp_path)
    path.write_bytes(b"{")
    aside = StateStore(tmp_path).move_aside()
    assert re.fullmatch(r"state\.json\.corrupt-\d{8}T\d{6}", aside.name)
    assert aside.read_bytes() == b"{" and not path.exists()


def test_lock_refuses_a_second_holder(tmp_path):
    first = StateStore(tmp_path)
    first.lock()
    try:
        with pytest.raises(StateLockedError, match=rf"state directory {re.escape(str(tmp_path))} is in use by another gpuctld \(pid {os.getpid()}\)"):
            StateStore(tmp_path).lock()
    finally:
        first.unlock()
    second = StateStore(tmp_path)
    second.lock()
    second.unlock()


def test_failed_write_changes_nothing(mgr, monkeypatch):
    before = Unchanged(mgr)

    def refuse(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(StateWriteError, match="could not write the state file .*state.json: No space left on device; nothing was changed"):
        mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "research")])
    monkeypatch.undo()
    before.check()
    assert [p.name for p in mgr.store.directory.iterdir()] == ["state.json"]  # the temp file was removed


# ------------------------------------------------------------------------------------ reconcile


def test_reconcile_gives_new_gpus_one_unassigned_slice(mgr):
    s = mgr.snapshot()
    assert s.generation == 1
    assert sorted(s.slices) == ["GPU-0/0", "GPU-1/0", "GPU-2/0"]
    sl = s.slices["GPU-2/0"]
    assert (sl.fraction, sl.memory_quota_bytes, sl.compute_share, sl.department, sl.lease_id) == (
        1.0, 80 * GIB, 1.0, UNASSIGNED, None)
    assert mgr.reconcile(GPUS) == []
    assert mgr.generation == 1  # nothing new: no change


def test_reconcile_keeps_slices_of_vanished_gpus(mgr, tmp_path):
    mgr.assign("r1", 1, [move("GPU-2/0", UNASSIGNED, "research")])
    again = NodeStateManager(StateStore(tmp_path))
    assert again.reconcile(GPUS[:2]) == []
    assert again.missing_gpus == {"GPU-2"}
    assert again.snapshot().slices["GPU-2/0"].department == "research"
    with pytest.raises(GpuMissing, match="GPU GPU-2 is not reported by the backend"):
        again.split("r2", 2, "GPU-2", 2)


# ------------------------------------------------------------------------------------ assign


def test_assign_moves_bumps_generation_and_saves(mgr, tmp_path):
    ans = mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "research"), move("GPU-1/0", UNASSIGNED, "sales")])
    assert ans == {"generation": 2, "moved": ["GPU-0/0", "GPU-1/0"], "pending": [], "replayed": False,
                   "moves": [move("GPU-0/0", UNASSIGNED, "research"), move("GPU-1/0", UNASSIGNED, "sales")]}
    on_disk = StateStore(tmp_path).load()
    assert on_disk.generation == 2
    assert on_disk.slices["GPU-0/0"].department == "research"
    assert on_disk.slices["GPU-1/0"].department == "sales"


def test_stale_generation_is_refused_and_changes_nothing(mgr):
    before = Unchanged(mgr)
    with pytest.raises(StaleGeneration) as e:
        mgr.assign("r1", 0, [move("GPU-0/0", UNASSIGNED, "research")])
    assert "based on generation 0, the node is at generation 1" in str(e.value)
    assert (e.value.current, e.value.field, e.value.status, e.value.code) == (1, "generation", 409, "stale_generation")
    before.check()


def test_wrong_owner_names_slice_and_actual_owner(mgr):
    before = Unchanged(mgr)
    with pytest.raises(WrongOwner, match=r"moves\[0\]: slice GPU-0/0 is owned by 'unassigned', not 'research'") as e:
        mgr.assign("r1", 1, [move("GPU-0/0", "research", "sales")])
    assert e.value.field == "moves[0].from"
    before.check()


def test_request_is_all_or_nothing(mgr):
    before = Unchanged(mgr)
    with pytest.raises(WrongOwner, match=r"moves\[1\]: slice GPU-1/0"):
        mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "research"), move("GPU-1/0", "sales", "research")])
    before.check()
    assert mgr.recorded("r1") is None  # a refused request is not recorded: it may be retried


def test_unknown_and_duplicate_slices_are_refused(mgr):
    before = Unchanged(mgr)
    with pytest.raises(UnknownSlice, match=r"moves\[0\]: no slice 'GPU-9/0' on this node"):
        mgr.assign("r1", 1, [move("GPU-9/0", UNASSIGNED, "research")])
    with pytest.raises(InvalidRequest, match=r"moves\[1\]: slice GPU-0/0 is moved twice"):
        mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "a"), move("GPU-0/0", UNASSIGNED, "b")])
    with pytest.raises(InvalidRequest, match="moves is empty"):
        mgr.assign("r1", 1, [])
    with pytest.raises(InvalidRequest, match="leased must be one of refuse, drain, revoke, got 'maybe'"):
        mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "a")], "maybe")
    before.check()


def _leased(mgr: NodeStateManager) -> None:
    """GPU-0 split in 2, both halves to research, a lease L1 on both; GPU-1 to research too."""
    mgr.split("s1", 1, "GPU-0", 2)
    mgr.assign("a1", 2, [move("GPU-0/0", UNASSIGNED, "research"), move("GPU-0/1", UNASSIGNED, "research"),
                         move("GPU-1/0", UNASSIGNED, "research")])
    mgr.add_lease(lease("L1", "research", ["GPU-0/0", "GPU-0/1"]))
    assert mgr.generation == 4


def test_leased_slice_is_refused_by_default(mgr):
    _leased(mgr)
    before = Unchanged(mgr)
    with pytest.raises(SliceLeased, match=r"moves\[1\]: slice GPU-0/0 is leased \(lease L1\); use leased=drain"):
        mgr.assign("r1", 4, [move("GPU-1/0", "research", "sales"), move("GPU-0/0", "research", "sales")])
    before.check()


def test_drain_records_pending_and_applies_when_the_lease_ends(mgr, tmp_path):
    _leased(mgr)
    ans = mgr.assign("r1", 4, [move("GPU-0/0", "research", "sales"), move("GPU-1/0", "research", "sales")], "drain")
    assert ans == {"generation": 5, "moved": ["GPU-1/0"], "pending": ["GPU-0/0"], "replayed": False,
                   "moves": [move("GPU-0/0", "research", "sales"), move("GPU-1/0", "research", "sales")]}
    s = mgr.snapshot().slices["GPU-0/0"]
    assert (s.department, s.lease_id, s.pending) == ("research", "L1", {"to": "sales", "request_id": "r1"})
    assert mgr.remove_lease("L1") == ["GPU-0/0"]
    on_disk = StateStore(tmp_path).load()
    assert on_disk.generation == 6 and on_disk.leases == {}
    assert (on_disk.slices["GPU-0/0"].department, on_disk.slices["GPU-0/0"].pending) == ("sales", None)
    assert on_disk.slices["GPU-0/1"].department == "research" and on_disk.slices["GPU-0/1"].lease_id is None
    assert mgr.recorded("r1")["drained"] == ["GPU-0/0"]


def test_revoke_ends_the_lease_then_moves(mgr, tmp_path):
    _leased(mgr)
    ans = mgr.assign("r1", 4, [move("GPU-0/1", "research", "sales")], "revoke")
    assert ans["moved"] == ["GPU-0/1"] and ans["pending"] == []
    on_disk = StateStore(tmp_path).load()
    assert on_disk.leases == {}
    assert on_disk.slices["GPU-0/1"].department == "sales"
    assert on_disk.slices["GPU-0/0"].lease_id is None  # the whole lease ended, not just one slice
    assert on_disk.slices["GPU-0/0"].department == "research"


def test_replay_returns_recorded_answer_without_change_or_generation_check(mgr):
    first = mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "research")])
    mgr.assign("r2", 2, [move("GPU-1/0", UNASSIGNED, "research")])
    before = Unchanged(mgr)
    again = mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "research")])  # generation 1 is stale now
    assert again == {**first, "replayed": True}
    assert mgr.recorded("r1") == {**first, "replayed": True}
    before.check()


def test_request_id_reused_for_another_operation_is_refused(mgr):
    mgr.assign("r1", 1, [move("GPU-0/0", UNASSIGNED, "research")])
    before = Unchanged(mgr)
    with pytest.raises(RequestIdReused, match="request id 'r1' was already used by an earlier assign request"):
        mgr.split("r1", 2, "GPU-1", 2)
    before.check()


def test_only_the_last_requests_are_kept(mgr, monkeypatch):
    monkeypatch.setattr(state_mod, "MAX_RECORDED_REQUESTS", 3)
    for i in range(5):
        mgr.assign(f"r{i}", mgr.generation, [move("GPU-0/0", UNASSIGNED if i == 0 else f"d{i - 1}", f"d{i}")])
    assert list(mgr.snapshot().requests) == ["r2", "r3", "r4"]
    assert mgr.recorded("r0") is None


# ------------------------------------------------------------------------------------ split


def test_split_makes_equal_slices_with_quota_and_owner(mgr, tmp_path):
    mgr.assign("a1", 1, [move("GPU-1/0", UNASSIGNED, "research")])
    ans = mgr.split("s1", 2, "GPU-1", 4)
    assert ans["generation"] == 3 and ans["replayed"] is False
    assert [s["id"] for s in ans["slices"]] == ["GPU-1/0", "GPU-1/1", "GPU-1/2", "GPU-1/3"]
    assert all(s["fraction"] == 0.25 and s["compute_share"] == 0.25 and s["memory_quota_bytes"] == 20 * GIB
               and s["department"] == "research" for s in ans["slices"])
    back = mgr.split("s2", 3, "GPU-1", 1)
    assert [(s["id"], s["fraction"], s["memory_quota_bytes"]) for s in back["slices"]] == [("GPU-1/0", 1.0, 80 * GIB)]
    assert sorted(s for s in StateStore(tmp_path).load().slices if s.startswith("GPU-1/")) == ["GPU-1/0"]


def test_split_errors_change_nothing(mgr):
    _leased(mgr)
    mgr.split("s2", 4, "GPU-2", 2)
    mgr.assign("a2", 5, [move("GPU-2/1", UNASSIGNED, "sales")])
    before = Unchanged(mgr)
    with pytest.raises(SliceLeased, match=r"GPU GPU-0 cannot be split while slices are leased: GPU-0/0 \(lease L1\), GPU-0/1 \(lease L1\)"):
        mgr.split("x", 6, "GPU-0", 4)
    with pytest.raises(MixedOwners, match=r"GPU GPU-2 cannot be split: its slices have different owners \(sales, unassigned\)"):
        mgr.split("x", 6, "GPU-2", 4)
    with pytest.raises(UnknownGpu, match="no GPU 'GPU-7' on this node"):
        mgr.split("x", 6, "GPU-7", 2)
    with pytest.raises(InvalidRequest, match="parts must be one of 1, 2, 4, 8, got 3") as e:
        mgr.split("x", 6, "GPU-1", 3)
    assert e.value.field == "parts"
    with pytest.raises(StaleGeneration):
        mgr.split("x", 5, "GPU-1", 2)
    before.check()


# ------------------------------------------------------------------------------------ leases


def test_lease_hooks_validate_and_change_nothing_on_error(mgr):
    _leased(mgr)
    before = Unchanged(mgr)
    with pytest.raises(LeaseExists, match="lease 'L1' already exists"):
        mgr.add_lease(lease("L1", "research", ["GPU-1/0"]))
    with pytest.raises(SliceLeased, match=r"slice_ids\[0\]: slice GPU-0/0 is already leased \(lease L1\)"):
        mgr.add_lease(lease("L2", "research", ["GPU-0/0"]))
    with pytest.raises(WrongOwner, match=r"slice_ids\[0\]: slice GPU-2/0 is owned by 'unassigned', not 'research'"):
        mgr.add_lease(lease("L2", "research", ["GPU-2/0"]))
    with pytest.raises(UnknownSlice, match=r"slice_ids\[1\]: no slice 'GPU-9/0'"):
        mgr.add_lease(lease("L2", "research", ["GPU-1/0", "GPU-9/0"]))
    with pytest.raises(InvalidRequest, match="a lease needs at least one slice"):
        mgr.add_lease(lease("L2", "research", []))
    with pytest.raises(UnknownLease, match="no lease 'L9' on this node"):
        mgr.remove_lease("L9")
    before.check()
