"""`gpuctl node forget-gpu NODE UUID`: a replaced GPU (no longer reported) is retired, audited;
refused while leased or while the GPU is still there (issue 9 item 9, CLI side)."""

from __future__ import annotations

import json

import pytest

from daemon_proc import start_daemon
from fleet_fixtures import daemon_slices, run_cli


@pytest.fixture
def shrunk(tmp_path):
    """A node that had 3 GPUs and now reports 2: GPU index 2 is missing, its slices research's."""
    d = start_daemon(tmp_path, gpus=3, seed=31, name="n1")
    with d.client() as c:
        st = c.get("/v1/status").json()
        gone = next(g for g in st["gpus"] if g["identity"]["index"] == 2)
        uuid = gone["identity"]["uuid"]
        r = c.post("/v1/split", json={"request_id": "s1", "generation": st["generation"], "gpu_uuid": uuid,
                                      "parts": 2})
        gen = r.json()["generation"]
        r = c.post("/v1/assign", json={"request_id": "a1", "generation": gen, "moves": [
            {"slice_id": f"{uuid}/0", "from": "unassigned", "to": "research"},
            {"slice_id": f"{uuid}/1", "from": "unassigned", "to": "research"}]})
        assert r.status_code == 200, r.text
    d.stop()
    d.args[d.args.index("--gpus") + 1] = "2"
    d.start()
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[[department]]\nname = "research"\n\n[[node]]\nname = "n1"\ntransport = "local"\n'
                   f'socket = "{d.socket_path}"\n')
    try:
        yield cfg, d, uuid
    finally:
        d.stop()


def test_forget_gpu_retires_a_missing_gpu_and_is_audited(shrunk):
    cfg, d, uuid = shrunk
    st = run_cli("--config", str(cfg), "--json", "status").json
    assert uuid in [g["uuid"] for g in st["nodes"][0]["gpus"]]
    r = run_cli("--config", str(cfg), "--json", "node", "forget-gpu", "n1", uuid, "--yes")
    assert r.code == 0, r.stderr
    assert r.json["forgotten"] == [f"{uuid}/0", f"{uuid}/1"] and r.json["departments"] == {"research": 1.0}
    assert not any(s.startswith(uuid) for s in daemon_slices(d.socket_path))
    st = run_cli("--config", str(cfg), "--json", "status").json
    assert uuid not in [g["uuid"] for g in st["nodes"][0]["gpus"]]
    deps = run_cli("--config", str(cfg), "--json", "departments").json
    assert not any(x["name"] == "research" for x in deps["departments"] if x["gpu_equivalents"] > 0)
    records = [json.loads(line) for line in (d.state_dir / "audit.log").read_text().splitlines()]
    assert [x["outcome"] for x in records if x.get("action") == "forget gpu" and x.get("phase") == "end"] == ["ok"]
    again = run_cli("--config", str(cfg), "node", "forget-gpu", "n1", uuid, "--yes")
    assert again.code == 2 and f"node n1 has no GPU '{uuid}'" in again.stderr


def test_forget_gpu_refused_for_a_present_gpu_and_without_yes(shrunk):
    cfg, d, uuid = shrunk
    before = daemon_slices(d.socket_path)
    present = next(s["gpu_uuid"] for s in before.values() if not s["gpu_uuid"] == uuid)
    r = run_cli("--config", str(cfg), "--json", "node", "forget-gpu", "n1", present, "--yes")
    assert r.code == 6, r.stderr
    assert "is reported by the backend" in r.stderr and r.json["error"]["code"] == 6
    r = run_cli("--config", str(cfg), "node", "forget-gpu", "n1", uuid)
    assert r.code == 2 and "pass --yes" in r.stderr
    assert daemon_slices(d.socket_path) == before


def test_state_forget_refuses_a_leased_slice(tmp_path):
    # leases found at start-up are ended, so a leased GPU goes missing only under a running
    # daemon: the refusal is the state manager's
    from gpuctl.daemon.errors import SliceLeased
    from gpuctl.daemon.state import NodeStateManager, StateStore
    from gpuctl.model import GpuIdentity, Lease

    store = StateStore(tmp_path)
    mgr = NodeStateManager(store)
    mgr.reconcile([GpuIdentity(uuid="GPU-a", index=0, name="x", memory_total_bytes=80),
                   GpuIdentity(uuid="GPU-b", index=1, name="x", memory_total_bytes=80)])
    mgr.assign("r1", mgr.generation, [{"slice_id": "GPU-b/0", "from": "unassigned", "to": "research"}])
    mgr.add_lease(Lease(id="lease-1", department="research", owner="u@h", slice_ids=["GPU-b/0"], ttl_s=60,
                        created_s=0, heartbeat_s=0, expires_s=4e9))
    mgr.reconcile([GpuIdentity(uuid="GPU-a", index=0, name="x", memory_total_bytes=80)])  # GPU-b replaced
    gen = mgr.generation
    with pytest.raises(SliceLeased, match="GPU GPU-b cannot be forgotten while slices are leased: GPU-b/0 "
                                          r"\(lease lease-1\)"):
        mgr.forget_gpu("f1", gen, "GPU-b")
    assert mgr.generation == gen and "GPU-b/0" in mgr.snapshot().slices
