"""model: a GPU the daemon lists in "missing_gpus" is marked missing and counted apart."""

from gpuctl import model


def _status(missing: list[str]) -> dict:
    def gpu(uuid: str, index: int, dept: str) -> dict:
        return {"identity": {"uuid": uuid, "index": index, "name": "H100"},
                "sample": None,
                "slices": [{"id": f"{uuid}/0", "gpu_uuid": uuid, "fraction": 1.0, "memory_quota_bytes": 1,
                            "compute_share": 1.0, "department": dept}]}
    return {"gpus": [gpu("GPU-a", 0, "research"), gpu("GPU-b", -1, "research")], "missing_gpus": missing,
            "leases": []}


def test_missing_gpus_are_marked_and_left_out_of_department_totals():
    node = model.NodeStatus.from_json(_status(["GPU-b"]), name="n1")
    assert [g.missing for g in node.gpus] == [False, True]
    snap = model.FleetSnapshot([node])
    assert snap.gpu_count() == 1
    (research, unassigned) = model.department_totals(snap, ["research"])
    assert (research.gpu_equivalents, research.missing_gpu_equivalents, research.slices) == (1.0, 1.0, 1)
    assert node.gpus[1].to_json()["missing"] is True and "missing" not in node.gpus[0].to_json()
    again = model.NodeStatus.from_json(_status([]), name="n1")
    assert not any(g.missing for g in again.gpus)
