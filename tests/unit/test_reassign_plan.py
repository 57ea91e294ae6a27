"""Planning of reassignments on hand-made snapshots (no I/O): which slices move, and why not."""

import pytest

from gpuctl.exit_codes import ExitCode
from gpuctl.model import (UNASSIGNED, FleetSnapshot, GpuIdentity, GpuSample, GpuStatus, NodeStatus,
                          Slice)
from gpuctl.fleet.reassign import Move, Plan, ReassignError, ReassignRequest, ReassignResult, plan
from gpuctl.fleet.client import NodeError

GiB = 1 << 30


def gpu(node: str, index: int, owners: list[str], leased: set[int] = frozenset(), **sample_kw) -> GpuStatus:
    uuid = f"GPU-{node}-{index}"
    frac = 1 / len(owners)
    slices = [Slice(id=f"{uuid}/{k}", gpu_uuid=uuid, fraction=frac, memory_quota_bytes=int(80 * GiB * frac),
                    compute_share=frac, department=d, lease_id=("L1" if k in leased else None))
              for k, d in enumerate(owners)]
    sample = GpuSample(uuid=uuid, timestamp_s=0.0, sm_util_pct=10.0, **sample_kw)
    return GpuStatus(GpuIdentity(uuid=uuid, index=index, name="sim"), sample, slices)


def snapshot() -> FleetSnapshot:
    a = NodeStatus("a", True, generation=3, gpus=[
        gpu("a", 0, ["research"]), gpu("a", 1, ["research", "training"]),
        gpu("a", 2, [UNASSIGNED]), gpu("a", 3, ["research"], leased={0})])
    b = NodeStatus("b", True, generation=7, gpus=[
        gpu("b", 0, ["research"]), gpu("b", 1, ["research"]), gpu("b", 2, [UNASSIGNED]),
        gpu("b", 3, ["research", "research", "research", "research"])])
    c = NodeStatus("c", False, error="node c: connection refused")
    return FleetSnapshot([a, b, c])


DEPTS = ["research", "training", "inference"]


def test_whole_gpus_first_then_fewest_nodes():
    req = ReassignRequest("research", "training", count=3)
    p = plan(snapshot(), req)
    # whole GPUs: a/0, b/0, b/1 (a/3 is leased); node b has more candidates, so it comes first
    assert [m.slice_id for m in p.moves] == ["GPU-b-0/0", "GPU-b-1/0", "GPU-a-0/0"]
    assert p.shortfall is None
    assert p.skipped == {"c": "node c: connection refused"}


def test_gpu_equivalents_uses_fractions():
    p = plan(snapshot(), ReassignRequest("research", "inference", gpus=3.75))
    assert sum(m.fraction for m in p.moves) == pytest.approx(3.75)
    assert [m.slice_id for m in p.moves] == ["GPU-b-0/0", "GPU-b-1/0", "GPU-a-0/0", "GPU-a-1/0", "GPU-b-3/0"]
    assert all(not m.leased for m in p.moves)
    odd = plan(snapshot(), ReassignRequest("research", "inference", gpus=0.3))
    assert odd.moves == [] and "cannot make 0.3 GPU-equivalents" in odd.shortfall


def test_shortfall_moves_nothing_and_names_leased():
    p = plan(snapshot(), ReassignRequest("research", "training", count=20))
    assert p.moves == []
    assert p.shortfall == "only 8 free slice(s) of research can move, 20 asked (1 leased: use --drain or --revoke)"
    r = ReassignResult("r-1", p)
    assert r.exit_code == ExitCode.NOTHING_TO_DO


def test_drain_includes_leased_after_idle():
    p = plan(snapshot(), ReassignRequest("research", "training", count=9, leased="drain"))
    assert len(p.moves) == 9
    assert p.moves[-1].slice_id == "GPU-a-3/0" and p.moves[-1].leased


def test_gpu_with_unknown_process_list_is_never_idle():
    snap = snapshot()
    snap.nodes[0].gpus[0].sample.processes_error = "process list unavailable (driver too old)"
    p = plan(snap, ReassignRequest("research", "training", count=8))
    assert "GPU-a-0/0" not in [m.slice_id for m in p.moves]
    assert p.skipped["a GPU 0"] == "process list unavailable (driver too old)"


def test_lost_gpu_is_never_a_candidate():
    snap = snapshot()
    snap.nodes[1].gpus[0].sample.error = "lost: node needs reboot"
    p = plan(snap, ReassignRequest("research", "training", count=1, node="b"))
    assert [m.slice_id for m in p.moves] == ["GPU-b-1/0"]
    assert p.skipped == {"b GPU 0": "lost: node needs reboot"}


def test_explicit_slices_with_reasons():
    snap = snapshot()
    p = plan(snap, ReassignRequest("research", "training", slice_ids=["GPU-a-1/1", "GPU-a-3/0", "nope/0"]))
    assert p.moves == []
    assert p.shortfall == ("GPU-a-1/1: owned by training, not research; "
                           "GPU-a-3/0: leased by L1 (use --drain or --revoke); "
                           "nope/0: not found on the nodes that answered (unreachable: c)")
    ok = plan(snap, ReassignRequest("research", "training", slice_ids=["GPU-a-1/0", "GPU-b-3/2"]))
    assert [(m.node, m.slice_id, m.fraction) for m in ok.moves] == [("a", "GPU-a-1/0", 0.5), ("b", "GPU-b-3/2", 0.25)]


def test_replay_counts_already_moved_and_excludes_nodes():
    already = [Move("b", "GPU-b-0/0", 0, 1.0), Move("b", "GPU-b-1/0", 1, 1.0)]
    p = plan(snapshot(), ReassignRequest("research", "training", count=3), already, exclude_nodes={"b"})
    assert [m.slice_id for m in p.moves] == ["GPU-a-0/0"]
    done = plan(snapshot(), ReassignRequest("research", "training", count=2), already, exclude_nodes={"b"})
    assert done.moves == [] and done.replay_complete
    assert ReassignResult("r", done).exit_code == ExitCode.OK


@pytest.mark.parametrize("kw, message", [
    (dict(src="nope", dst="training", count=1), "--from: unknown department 'nope'"),
    (dict(src="research", dst="research", count=1), "--from and --to are both 'research'"),
    (dict(src="research", dst="training"), "give exactly one of --count, --gpus or --slice"),
    (dict(src="research", dst="training", count=0), "--count: must be a positive integer, got 0"),
    (dict(src="research", dst="training", gpus=-1.0), "--gpus: must be a positive number"),
])
def test_invalid_requests_name_the_flag(kw, message):
    with pytest.raises(ReassignError) as e:
        ReassignRequest(**kw).validate(DEPTS)
    assert message in str(e.value)


def test_exit_codes_for_failures():
    moves = [Move("a", "GPU-a-0/0", 0, 1.0)]
    p = Plan(ReassignRequest("research", "training", count=2), moves=moves + [Move("b", "GPU-b-0/0", 0, 1.0)])
    partial = ReassignResult("r", p, moved=moves,
                             failed={"b": ([Move("b", "GPU-b-0/0", 0, 1.0)], NodeError("b", "down"))})
    assert partial.exit_code == ExitCode.PARTIAL
    stale = ReassignResult("r", p, failed={"a": (moves, NodeError("a", "stale", code="stale_generation", status=409))})
    assert stale.exit_code == ExitCode.CONFLICT
    down = ReassignResult("r", p, failed={"a": (moves, NodeError("a", "refused"))})
    assert down.exit_code == ExitCode.UNREACHABLE


def test_named_slice_problems_have_their_own_exit_codes():
    snap = snapshot()
    snap.nodes.pop()  # node c (down) is not in scope
    leased = plan(snap, ReassignRequest("research", "training", slice_ids=["GPU-a-3/0"]))
    assert ReassignResult("r", leased).exit_code == ExitCode.CONFLICT
    bogus = plan(snap, ReassignRequest("research", "training", slice_ids=["nope/0"]))
    assert ReassignResult("r", bogus).exit_code == ExitCode.NOTHING_TO_DO  # README: nothing matched
    assert bogus.shortfall == "nope/0: no such slice in the fleet"
    both = plan(snap, ReassignRequest("research", "training", slice_ids=["nope/0", "GPU-a-3/0"]))
    assert ReassignResult("r", both).exit_code == ExitCode.CONFLICT


def test_unknown_slice_with_a_node_down_is_unreachable():
    bogus = plan(snapshot(), ReassignRequest("research", "training", slice_ids=["nope/0"]))
    assert ReassignResult("r", bogus).exit_code == ExitCode.UNREACHABLE
    assert bogus.shortfall == "nope/0: not found on the nodes that answered (unreachable: c)"


def test_revoke_takes_a_slice_already_waiting_to_drain():
    snap = snapshot()
    s = snap.nodes[0].gpus[3].slices[0]
    s.pending = {"to": "training", "request_id": "earlier"}
    drain = plan(snap, ReassignRequest("research", "training", slice_ids=[s.id], leased="drain"))
    assert drain.moves == [] and drain.shortfall == (
        f"{s.id}: already waiting to move to training when lease L1 ends (use --revoke to move it now)")
    revoke = plan(snap, ReassignRequest("research", "training", slice_ids=[s.id], leased="revoke"))
    assert [m.slice_id for m in revoke.moves] == [s.id] and revoke.moves[0].leased
