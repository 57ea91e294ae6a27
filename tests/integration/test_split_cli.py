"""`gpuctl split` / `gpuctl merge` against real simulated gpuctld processes (issue 9 item 12)."""

from __future__ import annotations

import pytest

from fleet_fixtures import daemon_slices, local_fleet, run_cli
from gpuctl.backends.simulated import MEMORY_TOTAL_BYTES
from gpuctl.fleet.split import SplitError, parse_fractions


@pytest.fixture
def fleet(tmp_path):
    with local_fleet(tmp_path, {"n1": 21}) as (cfg, (d,)):
        yield cfg, d


def _gpu0(d) -> list[dict]:
    with d.client() as c:
        st = c.get("/v1/status").json()
    g = next(g for g in st["gpus"] if g["identity"]["index"] == 0)
    return g["slices"]


def _cli(cfg, *args):
    return run_cli("--config", str(cfg), *args)


def test_split_into_uneven_fractions_then_merge(fleet):
    cfg, d = fleet
    r = _cli(cfg, "--json", "split", "n1", "0", "--into", "1/2,1/4,1/4", "--yes")
    assert r.code == 0, r.stderr
    got = [(s["fraction"], s["department"], s["memory_quota_bytes"]) for s in _gpu0(d)]
    assert got == [(0.5, "unassigned", MEMORY_TOTAL_BYTES // 2), (0.25, "unassigned", MEMORY_TOTAL_BYTES // 4),
                   (0.25, "unassigned", MEMORY_TOTAL_BYTES // 4)]
    assert [s["fraction"] for s in r.json["slices"]] == [0.5, 0.25, 0.25]
    assert "split: GPU 0 of n1 now 1/2 + 1/4 + 1/4" in r.stderr
    again = _cli(cfg, "split", "n1", "0", "--into", "1/2,1/4,1/4", "--yes")
    assert again.code == 4 and "already split into 1/2 + 1/4 + 1/4" in again.stderr
    r = _cli(cfg, "merge", "n1", "0", "--yes")
    assert r.code == 0, r.stderr
    assert [(s["fraction"], s["department"]) for s in _gpu0(d)] == [(1.0, "unassigned")]


def test_merge_of_parts_with_two_owners_needs_to(fleet):
    cfg, d = fleet
    assert _cli(cfg, "split", "n1", "0", "--into", "1/2,1/2", "--yes").code == 0
    sid = _gpu0(d)[1]["id"]
    assert _cli(cfg, "reassign", "--from", "unassigned", "--to", "research", "--slice", sid, "--yes").code == 0
    before = daemon_slices(d.socket_path)
    r = _cli(cfg, "--json", "merge", "n1", "0", "--yes")
    assert r.code == 6, r.stderr
    assert "its parts have different owners (research, unassigned); name the department that gets the whole GPU " \
           "with --to DEPT" in r.stderr
    assert r.json["error"]["code"] == 6
    assert daemon_slices(d.socket_path) == before
    r = _cli(cfg, "merge", "n1", "0", "--to", "training", "--yes")
    assert r.code == 0, r.stderr
    assert [(s["fraction"], s["department"]) for s in _gpu0(d)] == [(1.0, "training")]
    import json
    ends = [json.loads(line) for line in (d.state_dir / "audit.log").read_text().splitlines()]
    splits = [e for e in ends if e.get("path") == "/v1/split" and e.get("phase") == "begin"]
    # the split and the merge --to, each audited (the refused merge never reached the node)
    assert [(e["action"], e["request_id"].startswith("s-")) for e in splits] == [("split", True)] * 2


def test_split_refused_while_leased_and_without_yes(fleet):
    cfg, d = fleet
    assert _cli(cfg, "reassign", "--from", "unassigned", "--to", "research", "--count", "2", "--yes").code == 0
    assert _cli(cfg, "split", "n1", "0", "--into", "1/2,1/2", "--yes").code == 0
    lease = _cli(cfg, "--json", "lease", "--dept", "research", "--gpus", "0.5", "--node", "n1")
    assert lease.code == 0, lease.stderr
    gpu = lease.json["gpu_index"]
    before = daemon_slices(d.socket_path)
    for verb in (("merge", "n1", str(gpu)), ("split", "n1", str(gpu), "--into", "1/4,1/4,1/4,1/4")):
        r = _cli(cfg, *verb, "--yes")
        assert r.code == 6, (verb, r.stderr)
        assert f"while slices are leased: " in r.stderr and lease.json["lease"]["id"] in r.stderr
    assert daemon_slices(d.socket_path) == before
    r = _cli(cfg, "split", "n1", "1", "--into", "1/2,1/2")
    assert r.code == 2 and "pass --yes" in r.stderr
    assert daemon_slices(d.socket_path) == before


def test_bad_input_names_the_field_and_changes_nothing(fleet):
    cfg, d = fleet
    before = daemon_slices(d.socket_path)
    cases = [(("split", "n1", "0", "--into", "1/2,1/3"), 2, "--into: part 2 (1/3) must be 1, 1/2, 1/4 or 1/8"),
             (("split", "n1", "0", "--into", "1/2,1/4"), 2, "--into: the parts add up to 3/4, not 1"),
             (("split", "n1", "0", "--into", "half"), 2, "--into: part 1 ('half') is not a fraction like 1/2"),
             (("split", "n1", "7", "--into", "1/2,1/2"), 2, "node n1 has no GPU 7 (GPUs: 0, 1)"),
             (("split", "nx", "0", "--into", "1/2,1/2"), 2, "NODE: unknown node 'nx'"),
             (("merge", "n1", "0", "--to", "nobody"), 2, "--to: unknown department 'nobody'"),
             (("merge", "n1", "0"), 4, "already one whole slice of unassigned: nothing to do")]
    for args, code, words in cases:
        r = _cli(cfg, *args, "--yes")
        assert r.code == code, (args, r.code, r.stderr)
        assert words in r.stderr, (args, r.stderr)
    assert daemon_slices(d.socket_path) == before


def test_stale_generation_is_refused(fleet):
    from gpuctl.config import load_config
    from gpuctl.fleet.client import FleetClient, NodeError
    from gpuctl.fleet.split import apply, plan_split

    cfg, d = fleet
    fleet_client = FleetClient(load_config(cfg))
    try:
        p = plan_split(fleet_client.snapshot(), "n1", 0, [0.5, 0.5])
        assert _cli(cfg, "split", "n1", "1", "--into", "1/2,1/2", "--yes").code == 0  # another admin
        before = daemon_slices(d.socket_path)
        with pytest.raises(NodeError) as e:
            apply(fleet_client, p)
        assert e.value.code == "stale_generation"
        assert daemon_slices(d.socket_path) == before
    finally:
        fleet_client.close()


def test_parse_fractions():
    assert parse_fractions("1/2, 1/4,0.25") == [0.5, 0.25, 0.25]
    assert parse_fractions("1") == [1.0]
    assert parse_fractions(",".join(["1/8"] * 8)) == [0.125] * 8
    with pytest.raises(SplitError, match="add up to 5/4"):
        parse_fractions("1,1/4")


def test_daemon_checks_fractions_and_department_fields(fleet):
    cfg, d = fleet
    before = daemon_slices(d.socket_path)
    with d.client() as c:
        st = c.get("/v1/status").json()
        base = {"request_id": "x-1", "generation": st["generation"], "gpu_uuid": st["gpus"][0]["identity"]["uuid"]}
        for extra, field, words in (({"fractions": [0.5, 0.3]}, "fractions[1]", "must be one of 1, 0.5, 0.25, 0.125"),
                                    ({"fractions": [0.5, 0.25]}, "fractions", "must add up to 1"),
                                    ({"fractions": [1.0], "parts": 1}, "parts", "exactly one of parts"),
                                    ({"parts": 1, "department": ""}, "department", "must not be empty")):
            r = c.post("/v1/split", json={**base, **extra})
            assert r.status_code == 400, r.text
            e = r.json()["error"]
            assert e["field"] == field and words in e["message"], e
    assert daemon_slices(d.socket_path) == before


def test_mig_slices_are_refused_by_the_node_with_mig_read_only(tmp_path):
    # the service does not pre-judge MIG: the node refuses it, naming nvidia-smi
    from gpuctl.daemon.errors import MigReadOnly
    from gpuctl.daemon.state import NodeStateManager, StateStore
    from gpuctl.model import FleetSnapshot, GpuIdentity, GpuStatus, NodeStatus
    from gpuctl.fleet.split import plan_merge, plan_split

    mgr = NodeStateManager(StateStore(tmp_path))
    parent = GpuIdentity(uuid="GPU-p", index=0, name="A100", memory_total_bytes=80 << 30, mig_enabled=True)
    mig = GpuIdentity(uuid="MIG-1", index=0, name="A100 MIG 3g", memory_total_bytes=40 << 30, parent_uuid="GPU-p",
                      mig_compute_share=0.5)
    mgr.reconcile([parent, mig])
    gen = mgr.generation
    with pytest.raises(MigReadOnly, match="MIG slices are read-only in gpuctl"):
        mgr.split("s-1", gen, "MIG-1", 2, fractions=[0.5, 0.5])
    assert mgr.generation == gen
    snap = FleetSnapshot([NodeStatus("n1", True, generation=gen, gpus=[
        GpuStatus(mig, None, [s for s in mgr.snapshot().slices.values()])])])
    p = plan_split(snap, "n1", 0, [0.5, 0.5])
    assert p.mig and p.gpu_uuid == "MIG-1"
    assert plan_merge(snap, "n1", 0).mig
