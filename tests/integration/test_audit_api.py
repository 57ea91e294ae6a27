"""The audit wrapper of the control API (gpuctl.daemon.audit_api) on a real ControlApi: records
before and after each change, and a change refused when its record cannot be written."""

from __future__ import annotations

import json

from gpuctl.daemon import audit_api
from gpuctl.daemon.api import ApiRequest, ControlApi, Peer
from gpuctl.daemon.audit import AuditLog, AuditWriteError, read_records
from gpuctl.daemon.state import NodeStateManager, StateStore
from gpuctl.model import GpuIdentity


def _api(tmp_path):
    gpus = [GpuIdentity(index=0, uuid="GPU-A", name="Sim", memory_total_bytes=1 << 30)]
    state = NodeStateManager(StateStore(tmp_path))
    audit = AuditLog(tmp_path, "node-x", clock=lambda: 5.0)
    audit.open()
    state.on_commit = audit.on_commit
    state.reconcile(gpus)
    api = ControlApi(backend_name="simulated", gpus=gpus, sampler=None, state=state, hostname="node-x")
    audit_api.install(api, audit)
    return api, state, audit


def _assign(gen: int, rid: str = "r-1") -> ApiRequest:
    body = {"request_id": rid, "generation": gen, "moves": [{"slice_id": "GPU-A/0", "from": "unassigned",
                                                             "to": "research"}]}
    return ApiRequest("POST", "/v1/assign", body=json.dumps(body).encode(), peer=Peer(pid=None, uid=0, gid=0),
                      headers={"gpuctl-user": "alice@ws\x1b[31m"})


def test_change_gets_begin_change_end_records_before_the_answer(tmp_path):
    api, state, audit = _api(tmp_path)
    status, body = api.handle(_assign(state.generation))
    assert status == 200 and body["moved"] == ["GPU-A/0"]
    recs = [r for r in read_records(tmp_path).records if r.get("request_id") == "r-1"]
    assert [(r["event"], r.get("phase")) for r in recs] == [("request", "begin"), ("change", None), ("request", "end")]
    assert len({r["op"] for r in recs}) == 1
    assert recs[0]["who"]["reported"] == "alice@ws\\x1b[31m"  # printable: no terminal escapes in the log
    assert recs[0]["who"]["ssh_user"] == "root" and recs[0]["action"] == "assign"
    assert recs[2]["outcome"] == "ok" and recs[2]["status"] == 200


def test_refused_change_is_recorded_with_its_error(tmp_path):
    api, state, audit = _api(tmp_path)
    status, body = api.handle(_assign(state.generation + 7, rid="r-stale"))
    assert status == 409
    (end,) = [r for r in read_records(tmp_path).records if r.get("request_id") == "r-stale" and r.get("phase") == "end"]
    assert end["outcome"] == "refused" and end["error"]["code"] == "stale_generation"
    assert not any(r.get("moved") for r in read_records(tmp_path).records)


def test_change_is_refused_when_its_audit_record_cannot_be_written(tmp_path, monkeypatch):
    api, state, audit = _api(tmp_path)
    gen = state.generation

    def broken(record):
        raise AuditWriteError(f"cannot write the audit log {audit.path}: No space left on device")

    monkeypatch.setattr(audit, "append", broken)
    status, body = api.handle(_assign(gen))
    assert status == 503 and body["error"]["code"] == "audit_unavailable"
    assert "No space left on device" in body["error"]["message"] and "audit.log" in body["error"]["message"]
    assert state.generation == gen and state.snapshot().slices["GPU-A/0"].department == "unassigned"
    # reads are not audited and still answer
    assert api.handle(ApiRequest("GET", "/v1/slices"))[0] == 200
