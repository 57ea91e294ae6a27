"""The node's audit log (gpuctl.daemon.audit): records, rotation, corrupt lines, and a daemon killed
(SIGKILL) between the state write and the audit write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from daemon_proc import REPO_ROOT
from gpuctl.daemon.audit import AuditLog, audit_files, read_records
from gpuctl.daemon.state import NodeStateManager, StateStore
from gpuctl.model import GpuIdentity

GIB = 1024**3


def _gpus(n: int = 2) -> list[GpuIdentity]:
    return [GpuIdentity(index=i, uuid=f"GPU-{i:04d}", name="Sim", memory_total_bytes=80 * GIB) for i in range(n)]


def _manager(tmp_path, clock=lambda: 1000.0):
    m = NodeStateManager(StateStore(tmp_path))
    audit = AuditLog(tmp_path, "node-a", clock=clock)
    audit.open()
    m.on_commit = audit.on_commit
    m.reconcile(_gpus())
    return m, audit


def test_assign_records_who_request_id_and_slices(tmp_path):
    m, audit = _manager(tmp_path)
    who = {"ssh_user": "alice", "peer_uid": 1000, "peer_pid": 42, "ssh_client": None, "reported": "alice@ws"}
    with audit.context(who, "r-1", "assign", "op-1"):
        m.assign("r-1", m.generation, [{"slice_id": "GPU-0000/0", "from": "unassigned", "to": "research"}])
    recs = read_records(tmp_path).records
    change = [r for r in recs if r.get("moved")][-1]
    assert change["moved"] == [{"slice_id": "GPU-0000/0", "from": "unassigned", "to": "research"}]
    assert change["who"] == who and change["request_id"] == "r-1" and change["action"] == "assign"
    assert change["node"] == "node-a" and change["time_s"] == 1000.0 and change["generation"] == m.generation
    # reconcile (no request) is recorded as gpuctld's own change
    created = recs[0]
    assert created["who"] == {"internal": "gpuctld"} and len(created["slices_created"]) == 2


def test_split_and_lease_changes_are_described(tmp_path):
    from gpuctl.model import Lease

    m, audit = _manager(tmp_path)
    m.split("r-s", m.generation, "GPU-0001", 2)
    m.add_lease(Lease(id="L1", department="unassigned", slice_ids=["GPU-0001/0"], owner="bob@h", ttl_s=30,
                      created_s=1.0, heartbeat_s=1.0, expires_s=31.0))
    m.remove_lease("L1")
    recs = read_records(tmp_path).records
    assert recs[1]["split"] == [{"gpu_uuid": "GPU-0001", "slices_before": ["GPU-0001/0"],
                                 "slices_after": ["GPU-0001/0", "GPU-0001/1"], "parts": 2}]
    assert recs[2]["leases_added"][0]["id"] == "L1" and recs[2]["leases_added"][0]["owner"] == "bob@h"
    assert recs[3]["leases_ended"][0]["slice_ids"] == ["GPU-0001/0"]


def test_rotation_bounds_the_size_and_keeps_every_record_readable(tmp_path):
    audit = AuditLog(tmp_path, "n", max_bytes=2000, keep=2)
    for i in range(100):
        audit.append({"event": "x", "i": i, "pad": "p" * 50})
    files = audit_files(tmp_path)
    assert [f.name for f in files] == ["audit.log.2", "audit.log.1", "audit.log"]
    assert all(f.stat().st_size < 2000 + 200 for f in files)
    got = [r["i"] for r in read_records(tmp_path).records]
    assert got == sorted(got) and got[-1] == 99 and len(got) < 100  # oldest rotated away, order kept


def test_corrupt_and_truncated_lines_are_reported_not_dropped(tmp_path):
    audit = AuditLog(tmp_path, "n")
    audit.append({"event": "a"})
    audit.close()
    with open(tmp_path / "audit.log", "ab") as f:
        f.write(b"{not json}\n")
        f.write(b'{"event": "cut", "time_s": 1')  # a crash in the middle of a line
    audit2 = AuditLog(tmp_path, "n")
    audit2.open()  # starts a new line after the cut one
    audit2.append({"event": "b"})
    res = read_records(tmp_path)
    assert [r["event"] for r in res.records] == ["a", "b"]
    assert [(p.line, p.text[:10]) for p in res.problems] == [(2, "{not json}"), (3, '{"event": ')]
    assert all(p.file.endswith("audit.log") for p in res.problems)


def test_unwritable_audit_log_is_an_error_naming_the_file(tmp_path):
    from gpuctl.daemon.audit import AuditWriteError

    (tmp_path / "audit.log").mkdir()  # not a file
    audit = AuditLog(tmp_path, "n")
    try:
        audit.open()
    except AuditWriteError as e:
        assert "audit.log" in str(e)
    else:
        raise AssertionError("no error")


KILL_CHILD = textwrap.dedent("""
    import os, signal, sys
    from gpuctl.daemon.audit import AuditLog
    from gpuctl.daemon.state import NodeStateManager, StateStore
    from gpuctl.model import GpuIdentity
    d = sys.argv[1]
    m = NodeStateManager(StateStore(d))
    audit = AuditLog(d, "node-k")
    audit.open()
    m.on_commit = audit.on_commit
    m.reconcile([GpuIdentity(index=0, uuid="GPU-K", name="Sim", memory_total_bytes=1 << 30)])
    who = {"ssh_user": "alice", "peer_uid": 1, "peer_pid": 2, "ssh_client": None, "reported": "alice@ws"}
    op = audit.next_op()
    audit.append({"event": "request", "phase": "begin", "op": op, "request_id": "r-kill", "who": who,
                  "action": "assign"})
    def die(old, new):  # the state file is written; the change record is not: SIGKILL now
        os.kill(os.getpid(), signal.SIGKILL)
    m.on_commit = die
    with audit.context(who, "r-kill", "assign", op):
        m.assign("r-kill", m.generation, [{"slice_id": "GPU-K/0", "from": "unassigned", "to": "research"}])
""")


def test_kill9_between_state_write_and_audit_write_is_reported_incomplete(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    p = subprocess.run([sys.executable, "-c", KILL_CHILD, str(tmp_path)], env=env, capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    store = StateStore(tmp_path)
    state = store.load()
    assert state.slices["GPU-K/0"].department == "research"  # the move is on disk
    before = read_records(tmp_path).records
    assert not any(r.get("moved") for r in before)  # ...and its change record was never written
    m = NodeStateManager(store)
    audit = AuditLog(tmp_path, "node-k")
    audit.open()
    written = audit.recover(m.recorded, m.generation)
    assert len(written) == 1
    rec = written[0]
    assert rec["event"] == "incomplete" and rec["outcome"] == "incomplete" and rec["request_id"] == "r-kill"
    assert rec["who"]["ssh_user"] == "alice"
    assert rec["state_answer"]["moved"] == ["GPU-K/0"]  # the audit says what the state did
    assert rec["change_recorded"] is False
    # recovering again adds nothing: the begin now has its outcome
    assert AuditLog(tmp_path, "node-k").recover(m.recorded, m.generation) == []
    lines = (tmp_path / "audit.log").read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "incomplete"
