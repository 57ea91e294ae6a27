"""The simulated fleet source the console tests run on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuctl import model

from gpuctl.fleet.simulated import FROZEN_TIME_S, FleetSourceError, SimulatedFleetSource

from gpuctl.themes import REPO_THEMES_DIR


# -- the simulated source -----------------------------------------------------------------------


def test_simulated_source_is_deterministic_and_frozen_is_frozen():
    a = SimulatedFleetSource(seed=3, frozen=True, history_warmup_samples=5)
    b = SimulatedFleetSource(seed=3, frozen=True, history_warmup_samples=5)
    s1, s2 = a.snapshot(), a.snapshot()
    assert [n.to_json() for n in s1.nodes] == [n.to_json() for n in s2.nodes]
    assert [n.to_json() for n in s1.nodes] == [n.to_json() for n in b.snapshot().nodes]
    assert s1.taken_at_s == FROZEN_TIME_S
    live = SimulatedFleetSource(seed=3, history_warmup_samples=5)
    x, y = live.snapshot(), live.snapshot()
    assert [g.sample.sm_util_pct for n in x.nodes for g in n.gpus] != [g.sample.sm_util_pct for n in y.nodes for g in n.gpus]


def test_simulated_source_slices_leases_departments():
    src = SimulatedFleetSource()
    snap = src.snapshot()
    slices = [s for n in snap.nodes for s in n.slices()]
    depts = {s.department for s in slices}
    assert depts == {"research", "training", "inference", model.UNASSIGNED}
    assert {s.fraction for s in slices} == {1.0, 0.5, 0.25}
    for n in snap.nodes:
        for g in n.gpus:
            assert sum(s.fraction for s in g.slices) == 1.0
    leases = [lease for n in snap.nodes for lease in n.leases]
    assert [lease.owner for lease in leases] == ["alice@ws12", "alice@ws12"]
    for n in snap.nodes:
        by_id = {s.id: s for s in n.slices()}
        for lease in n.leases:
            for sid in lease.slice_ids:
                assert by_id[sid].lease_id == lease.id
                assert by_id[sid].department == lease.department


def test_simulated_source_history_cursor_and_errors():
    src = SimulatedFleetSource(nodes=2, gpus_per_node=2, history_warmup_samples=10, unreachable=["node-02"])
    snap = src.snapshot()
    uuid = snap.nodes[0].gpus[0].uuid
    cursor, samples = src.history("node-01", uuid)
    assert len(samples) == 11
    assert cursor == 11  # the daemon's cursor counts sampling rounds (11 rounds of 2 GPUs)
    src.snapshot()
    cursor2, new = src.history("node-01", uuid, since=cursor)
    assert cursor2 == 12 and len(new) == 1
    with pytest.raises(FleetSourceError, match="unknown node 'node-09'"):
        src.history("node-09", uuid)
    with pytest.raises(FleetSourceError, match="node-02: unreachable"):
        src.history("node-02", uuid)
    with pytest.raises(FleetSourceError, match="node-01: no GPU 'GPU-x' on this node"):  # the daemon's 404
        src.history("node-01", "GPU-x")
    assert not snap.nodes[1].reachable and snap.nodes[1].error_code == "unreachable"
    src.close()
    with pytest.raises(FleetSourceError, match="closed"):
        src.snapshot()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nodes": 0}, "nodes must be an integer >= 1, got 0"),
        ({"gpus_per_node": 0}, "gpus_per_node must be an integer >= 1, got 0"),
        ({"history_warmup_samples": -1}, "history_warmup_samples must be >= 0, got -1"),
        ({"unreachable": ["node-99"]}, r"unreachable names unknown nodes \['node-99'\]"),
    ],
)
def test_simulated_source_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimulatedFleetSource(**kwargs)


def test_fleet_source_and_format_do_not_import_textual():
    code = "import sys, gpuctl.fleet.simulated, gpuctl.format; assert 'textual' not in sys.modules, 'textual'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(REPO_THEMES_DIR.parent))
