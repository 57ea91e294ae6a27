"""`reassign --from any`: idle slices of the unassigned pool first, then of the lowest-priority
departments (priority: lower number = more important); the result says what was taken from whom."""

from __future__ import annotations

import pytest

from fleet_fixtures import daemon_slices, local_fleet, run_cli
from gpuctl.model import UNASSIGNED, FleetSnapshot, NodeStatus
from gpuctl.fleet.reassign import ReassignError, ReassignRequest, plan

from test_reassign_plan import gpu

PRIO = {"research": 10, "training": 20, "inference": 30}


def _snap() -> FleetSnapshot:
    a = NodeStatus("a", True, generation=1, gpus=[
        gpu("a", 0, ["research"]), gpu("a", 1, ["training"]), gpu("a", 2, ["inference", "inference"]),
        gpu("a", 3, [UNASSIGNED]), gpu("a", 4, ["inference"], leased={0})])
    return FleetSnapshot([a])


def test_any_takes_unassigned_then_lowest_priority_idle_slices():
    p = plan(_snap(), ReassignRequest("any", "research", count=4, priorities=PRIO))
    assert [(m.slice_id, m.owner) for m in p.moves] == [
        ("GPU-a-3/0", UNASSIGNED), ("GPU-a-2/0", "inference"), ("GPU-a-2/1", "inference"), ("GPU-a-1/0", "training")]
    assert all(m.to_json()["from"] == m.owner for m in p.moves)


def test_any_never_takes_from_the_receiver_nor_leased_slices():
    p = plan(_snap(), ReassignRequest("any", "training", count=10, priorities=PRIO))
    assert p.moves == [] and "only 4 free slice(s) of any can move" in p.shortfall
    owners = {m.owner for m in plan(_snap(), ReassignRequest("any", "training", count=4, priorities=PRIO)).moves}
    assert "training" not in owners


def test_priority_order_follows_the_config_not_the_names():
    prio = {"research": 30, "training": 20, "inference": 10}  # research now matters least
    p = plan(_snap(), ReassignRequest("any", "training", count=2, priorities=prio))
    assert [m.owner for m in p.moves] == [UNASSIGNED, "research"]


def test_any_with_slice_ids_is_refused():
    with pytest.raises(ReassignError, match="--from any takes --count or --gpus"):
        ReassignRequest("any", "research", slice_ids=["x"]).validate(list(PRIO))


def test_cli_reassign_from_any_lists_what_it_took_from_whom(tmp_path):
    with local_fleet(tmp_path, {"n1": 61}, gpus=4,
                     departments={"research": 10, "training": 20, "inference": 30}) as (cfg, (d,)):
        sids = sorted(daemon_slices(d.socket_path))
        for sid, dept in zip(sids[:3], ("research", "training", "inference")):
            r = run_cli("reassign", "--from", "unassigned", "--to", dept, "--slice", sid, "--yes", "--config", str(cfg))
            assert r.code == 0, r.stderr
        r = run_cli("reassign", "--from", "any", "--to", "research", "--count", "2", "--yes", "--json",
                    "--request-id", "any-1", "--config", str(cfg))
        assert r.code == 0, r.stderr
        took = [(m["slice_id"], m["from"]) for m in r.json["moved"]]
        assert took == [(sids[3], UNASSIGNED), (sids[2], "inference")]
        after = daemon_slices(d.socket_path)
        assert [after[s]["department"] for s in sids] == ["research", "training", "research", "research"]
        again = run_cli("reassign", "--from", "any", "--to", "research", "--count", "2", "--yes", "--json",
                        "--request-id", "any-1", "--config", str(cfg))
        assert again.code == 0 and again.json["moved"] == [], again.stderr  # a re-run moves nothing more
        assert daemon_slices(d.socket_path) == after
        au = run_cli("audit", "--dept", "inference", "--json", "--config", str(cfg))
        assert any(rec.get("request_id") == "any-1" and rec.get("moved") for rec in au.json["records"])

