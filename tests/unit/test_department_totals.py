"""The one department-totals rule (gpuctl.model.department_totals), as the CLI and the header use it."""

from __future__ import annotations

from gpuctl import model
from gpuctl.cli.fleet import departments_json
from gpuctl.config import DepartmentConfig, FleetConfig
from gpuctl.fleet.simulated import SimulatedFleetSource


def _slice(sid: str, dept: str, fraction: float, lease: str | None = None) -> model.Slice:
    return model.Slice(id=sid, gpu_uuid="GPU-" + sid, fraction=fraction, memory_quota_bytes=1 << 30,
                       compute_share=fraction, department=dept, lease_id=lease)


def _snapshot() -> model.FleetSnapshot:
    ident = model.GpuIdentity(uuid="GPU-0", index=0, name="sim")
    a = model.NodeStatus(name="a", reachable=True, gpus=[model.GpuStatus(ident, None, [
        _slice("a0", "research", 0.5, lease="lease-1"), _slice("a1", "zeta", 0.25), _slice("a2", model.UNASSIGNED, 0.25)])])
    b = model.NodeStatus(name="b", reachable=True, gpus=[model.GpuStatus(ident, None, [
        _slice("b0", "research", 0.5), _slice("b1", "alpha", 0.5)])])
    down = model.NodeStatus(name="c", reachable=False, error="unreachable")
    return model.FleetSnapshot(nodes=[a, b, down])


def test_order_sums_leased_and_per_node():
    rows = model.department_totals(_snapshot(), ["training", "research"])
    assert [r.name for r in rows] == ["training", "research", "alpha", "zeta", model.UNASSIGNED]
    by = {r.name: r for r in rows}
    assert by["training"].slices == 0 and by["training"].gpu_equivalents == 0.0 and by["training"].configured
    assert by["research"].gpu_equivalents == 1.0 and by["research"].leased_gpu_equivalents == 0.5
    assert by["research"].slices == 2 and by["research"].leased_slices == 1
    assert by["research"].per_node == {"a": 0.5, "b": 0.5}
    assert not by["alpha"].configured and by["alpha"].per_node == {"b": 0.5}
    assert by[model.UNASSIGNED].gpu_equivalents == 0.25 and not by[model.UNASSIGNED].configured


def test_cli_document_is_built_from_the_rule():
    cfg = FleetConfig(path="f.toml", departments=(DepartmentConfig("training", 5), DepartmentConfig("research", 1)))
    doc = departments_json(_snapshot(), cfg)
    assert [d["name"] for d in doc["departments"]] == ["training", "research", "alpha", "zeta", model.UNASSIGNED]
    research = doc["departments"][1]
    assert research == {"name": "research", "priority": 1, "gpu_equivalents": 1.0, "leased_gpu_equivalents": 0.5,
                        "slices": 2, "per_node": {"a": 0.5, "b": 0.5}}
    assert doc["departments"][2]["unknown"] is True and "unknown" not in doc["departments"][4]
    assert doc["unreachable_nodes"] == ["c"]


def test_totals_of_a_simulated_fleet_match_a_plain_sum():
    src = SimulatedFleetSource(nodes=2, gpus_per_node=4, seed=1, frozen=True, history_warmup_samples=1)
    try:
        snap = src.snapshot()
    finally:
        src.close()
    rows = model.department_totals(snap, [d.name for d in src.departments])
    for r in rows:
        mine = [s for n in snap.nodes for s in n.slices() if s.department == r.name]
        assert r.gpu_equivalents == sum(s.fraction for s in mine) and r.slices == len(mine)
    assert sum(r.gpu_equivalents for r in rows) == snap.gpu_count()  # every GPU is whole
