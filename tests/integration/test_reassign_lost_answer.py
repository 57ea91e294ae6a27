"""Lost answers in a reassignment across real gpuctld daemons (issue 7, item 1).

Three simulated daemons n1, n2, n3; n3 is reached through a LossyProxy (tests/support/lossy_proxy.py)
that loses or delays the answer of POST /v1/assign, loses the request, or freezes n3's daemon
(SIGSTOP) mid-request, and can be "down". Research owns 1 slice on n1, 1 on n2 and 2 on n3, so
`reassign --from research --to training --count 2` is planned on n3 alone. In every interleaving
the fleet ends with exactly 2 slices moved for --count 2, a timeout or lost connection is reported
as "outcome unknown" (never "not moved"), and a re-run while n3 cannot be asked exits 7 naming it.
"""

from __future__ import annotations

import shutil
import time

import pytest

from daemon_proc import start_daemon, uds_client
from fleet_fixtures import local_node, owners, run_cli, write_fleet_config
from lossy_proxy import LossyProxy, short_socket_dir


#: n3's timeout_s: the client gives up on it after this (+1 s), its requests' deadline is this
N3_TIMEOUT_S = 1.5


def give(socket_path, n: int, dept: str = "research") -> None:
    """Give n unassigned slices of a daemon to `dept` (straight through its API)."""
    with uds_client(socket_path) as c:
        st = c.get("/v1/slices").json()
        ids = [s["id"] for s in st["slices"] if s["department"] == "unassigned"][:n]
        r = c.post("/v1/assign", json={"request_id": f"setup-{dept}-{n}", "generation": st["generation"],
                                       "moves": [{"slice_id": i, "from": "unassigned", "to": dept} for i in ids]})
        assert r.status_code == 200, r.text


@pytest.fixture
def fleet(tmp_path):
    d = [start_daemon(tmp_path, gpus=2, seed=20 + i, name=f"n{i}") for i in (1, 2, 3)]
    sock_dir = short_socket_dir()
    proxy = LossyProxy(sock_dir / "n3.sock", d[2].socket_path, daemon_pid=d[2].pid).up()
    give(d[0].socket_path, 1)
    give(d[1].socket_path, 1)
    give(d[2].socket_path, 2)
    cfg = write_fleet_config(tmp_path / "fleet.toml", {
        "n1": local_node(d[0].socket_path), "n2": local_node(d[1].socket_path),
        "n3": local_node(proxy.socket_path, timeout_s=N3_TIMEOUT_S)}, departments={"research": None, "training": None})
    try:
        yield cfg, d, proxy
    finally:
        proxy.close()
        for x in d:
            x.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def moved_total(d) -> int:
    return sum(owners(x.socket_path).get("training", 0) for x in d)


def reassign(cfg, rid: str = "R", *extra: str):
    return run_cli("--config", str(cfg), "reassign", "--from", "research", "--to", "training", "--count", "2",
                   "--yes", "--request-id", rid, *extra)


def test_lost_answer_is_unknown_and_rerun_while_down_refuses_then_completes(fleet):
    """The issue's sequence: n3 commits but its answer is lost; n3 goes down; the re-run must not
    plan the count on n1 and n2; when n3 is back the re-run finds the request complete."""
    cfg, d, proxy = fleet
    proxy.arm("lose_answer")
    first = reassign(cfg, "R", "--json")
    assert first.code == 7, first.stderr
    doc = first.json
    assert doc["moved"] == [] and doc["failed"] == []
    assert [(u["node"], len(u["slice_ids"])) for u in doc["unknown"]] == [("n3", 2)]
    assert "node n3: outcome unknown for 2 slice(s) (no answer; they may have moved)" in first.stderr
    assert "not moved" not in first.stderr
    assert "run again with --request-id R when n3 answer(s)" in first.stderr
    assert owners(d[2].socket_path).get("training") == 2  # the node did apply it
    before = (owners(d[0].socket_path), owners(d[1].socket_path))

    proxy.down()
    again = reassign(cfg, "R", "--json")
    assert again.code == 7, again.stderr
    assert again.json["moved"] == [] and again.json["planned"] == []
    assert list(again.json["unsettled"]) == ["n3"]
    assert "nothing moved: request R may already be recorded on n3, which could not be asked" in again.stderr
    assert "only 0 free slice" not in again.stderr
    assert (owners(d[0].socket_path), owners(d[1].socket_path)) == before

    proxy.up()
    done = reassign(cfg, "R", "--json")
    assert done.code == 0, done.stderr
    assert done.json["moved"] == [] and sorted(m["node"] for m in done.json["already"]) == ["n3", "n3"]
    assert "request R is already complete" in done.stderr
    assert moved_total(d) == 2


@pytest.mark.parametrize("fault, applied", [
    ("lose_answer", True),     # applied, answer lost: the re-run finds it recorded
    ("delay_answer", True),    # applied, answer after the client gave up
    ("lose_request", False),   # never reached the node: the re-run moves the 2
    ("freeze", False),         # node frozen past the deadline: it must refuse it when it thaws
])
def test_every_interleaving_moves_exactly_the_count(fleet, fault, applied):
    cfg, d, proxy = fleet
    proxy.arm(fault, delay_s=N3_TIMEOUT_S + 2.5)
    first = reassign(cfg)
    assert first.code == 7, first.stderr
    assert "node n3: outcome unknown for 2 slice(s)" in first.stderr and "not moved" not in first.stderr
    if fault == "freeze":
        time.sleep(0.5)
        proxy.thaw()  # the request waiting in the frozen daemon's socket is read now, past its deadline
        wait_until = time.monotonic() + 10
        while not proxy.late_answers and time.monotonic() < wait_until:
            time.sleep(0.1)
        late = b"".join(proxy.late_answers).decode()  # the thawed daemon's answer, which nobody awaits
        assert late.startswith("HTTP/1.1 409") and '"code": "deadline_passed"' in late.replace('":"', '": "'), late
    n3 = owners(d[2].socket_path)
    assert n3.get("training", 0) == (2 if applied else 0)
    rerun = reassign(cfg, "R", "--json")
    assert rerun.code == 0, rerun.stderr
    assert len(rerun.json["moved"]) == (0 if applied else 2)
    assert moved_total(d) == 2
    # and once more: nothing
    third = reassign(cfg, "R", "--json")
    assert third.code == 0 and third.json["moved"] == []
    assert moved_total(d) == 2


def test_given_request_id_refused_while_a_node_in_scope_is_down(fleet):
    """A first run with --request-id cannot be told from a re-run: while n3 cannot be asked, a
    count is not planned elsewhere (exit 7 naming n3); --node limits the scope; a fresh id moves."""
    cfg, d, proxy = fleet
    proxy.down()
    before = [owners(x.socket_path) for x in d[:2]]
    r = reassign(cfg, "job-7")
    assert r.code == 7
    assert "request job-7 may already be recorded on n3, which could not be asked" in r.stderr
    assert [owners(x.socket_path) for x in d[:2]] == before
    scoped = run_cli("--config", str(cfg), "reassign", "--from", "research", "--to", "training", "--count", "1",
                     "--yes", "--request-id", "job-8", "--node", "n1", "--json")
    assert scoped.code == 0, scoped.stderr
    assert [m["node"] for m in scoped.json["moved"]] == ["n1"]
    fresh = run_cli("--config", str(cfg), "reassign", "--from", "research", "--to", "training", "--count", "1",
                    "--yes", "--json")
    assert fresh.code == 0, fresh.stderr
    assert [m["node"] for m in fresh.json["moved"]] == ["n2"]
    assert moved_total(d[:2]) == 2


def test_rerun_while_node_frozen_refuses(fleet):
    """n3 answers its snapshot, then freezes on the look-up of the request id: exit 7, nothing moved."""
    cfg, d, proxy = fleet
    proxy.arm("freeze", match=b"GET /v1/requests/")
    r = reassign(cfg, "R2", "--json")
    proxy.thaw()
    assert r.code == 7, r.stderr
    assert list(r.json["unsettled"]) == ["n3"] and r.json["moved"] == [], (r.stdout, r.stderr)
    assert moved_total(d) == 0


def test_daemon_refuses_a_request_past_its_deadline(fleet):
    cfg, d, proxy = fleet
    with uds_client(d[0].socket_path) as c:
        st = c.get("/v1/slices").json()
        sid = next(s["id"] for s in st["slices"] if s["department"] == "research")
        body = {"request_id": "late", "generation": st["generation"],
                "moves": [{"slice_id": sid, "from": "research", "to": "training"}]}
        r = c.post("/v1/assign", json={**body, "deadline_unix_s": time.time() - 5})
        assert r.status_code == 409
        err = r.json()["error"]
        assert err["code"] == "deadline_passed" and err["field"] == "deadline_unix_s"
        assert "reached this node 5." in err["message"] and "s after its deadline" in err["message"]
        assert c.get("/v1/requests/late").status_code == 404  # not recorded: a re-run may still apply it
        for bad in ("soon", True, -1, 0, [1], {"s": 1}):
            r = c.post("/v1/assign", json={**body, "deadline_unix_s": bad})
            assert r.status_code == 400, bad
            assert r.json()["error"]["field"] == "deadline_unix_s"
        assert c.get("/v1/slices").json()["generation"] == st["generation"]
        ok = c.post("/v1/assign", json={**body, "deadline_unix_s": time.time() + 30})
        assert ok.status_code == 200 and ok.json()["moved"] == [sid]


def test_too_few_while_a_node_is_down_is_unreachable_not_nothing_to_do(fleet):
    """Research has 2 slices on n1+n2 and 2 on n3; with n3 down, --count 3 cannot be planned: exit 7
    naming n3 (its slices were not counted), not 4 "only 2 idle slices"; nothing moved."""
    cfg, d, proxy = fleet
    proxy.down()
    r = run_cli("--config", str(cfg), "reassign", "--from", "research", "--to", "training", "--count", "3", "--yes")
    assert r.code == 7, r.stderr
    assert ("nothing moved: only 2 free slice(s) of research can move, 3 asked; not counted: the slices of "
            "unreachable node(s) n3") in r.stderr
    assert moved_total(d) == 0
