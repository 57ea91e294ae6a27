"""Leases on real gpuctld processes (simulated backend, NumPy executor): grant, status, release,
ttl expiry, heartbeat, revoke and drain, worker death, daemon kill -9 and restart, SIGTERM; plus the
pure slice-choice rule (gpuctl.leasing) and the usage split."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from daemon_proc import start_daemon
from gpuctl.daemon.leases import split_usage
from gpuctl.leasing import best_pick, describe_idle, validate_amount
from gpuctl.model import Slice

OWNER = "alice@client1"


# ---------------------------------------------------------------------------- helpers


def pid_gone(pid: int) -> bool:
    """True when no process `pid` runs (a zombie counts as gone: it runs no code)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


def wait_for(pred, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def slices(c) -> dict[str, dict]:
    return {s["id"]: s for s in c.get("/v1/slices").json()["slices"]}


def setup_owners(c) -> dict[str, str]:
    """GPU 0 whole -> research; GPU 1 in quarters -> research; GPU 2 -> training; GPU 3 unassigned.
    Returns {"whole", "quarter0".."quarter3", "training"} -> slice id."""
    gpus = c.get("/v1/node").json()["gpus"]
    u = [g["uuid"] for g in sorted(gpus, key=lambda g: g["index"])]
    gen = c.get("/v1/slices").json()["generation"]
    r = c.post("/v1/assign", json={"request_id": "setup-1", "generation": gen, "moves": [
        {"slice_id": f"{u[0]}/0", "from": "unassigned", "to": "research"},
        {"slice_id": f"{u[1]}/0", "from": "unassigned", "to": "research"},
        {"slice_id": f"{u[2]}/0", "from": "unassigned", "to": "training"}]})
    assert r.status_code == 200, r.text
    r = c.post("/v1/split", json={"request_id": "setup-2", "generation": r.json()["generation"],
                                  "gpu_uuid": u[1], "parts": 4})
    assert r.status_code == 200, r.text
    ids = {"whole": f"{u[0]}/0", "training": f"{u[2]}/0"}
    ids.update({f"quarter{k}": f"{u[1]}/{k}" for k in range(4)})
    return ids


def grant(c, **body):
    body = {"request_id": f"g-{time.monotonic_ns()}", "department": "research", "owner": OWNER, "ttl_s": 60,
            **body}
    return c.post("/v1/leases", json=body)


def state_body(d) -> dict:
    return json.loads(d.state_file.read_text())["body"]


@pytest.fixture
def node(tmp_path):
    d = start_daemon(tmp_path, gpus=4, seed=3)
    try:
        with d.client() as c:
            ids = setup_owners(c)
            yield d, c, ids
    finally:
        d.stop()


def remote_sum(attach: str, n: int = 1000) -> float:
    """sum(arange(n) * 2) through gpuctl.remote on the lease's worker (in this process)."""
    import gpuctl.remote as cp

    cp.attach(attach)
    try:
        a = cp.arange(n, dtype=cp.float64)
        return float((a * 2).sum().get())
    finally:
        cp.detach()


# ---------------------------------------------------------------------------- grant, status, release


def test_grant_takes_best_fitting_idle_slice_durably_and_status_shows_it(node):
    d, c, ids = node
    r = grant(c, gpus=0.25)
    assert r.status_code == 201, r.text
    ans = r.json()
    lease = ans["lease"]
    # best fit: one 1/4 slice (the smallest slice number), not the whole GPU 0
    assert lease["slice_ids"] == [ids["quarter0"]]
    assert lease["department"] == "research" and lease["owner"] == OWNER and lease["ttl_s"] == 60
    assert len(ans["token"]) == 64 and int(ans["token"], 16) >= 0
    host, port = ans["endpoint"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0 and lease["endpoint"] == ans["endpoint"]
    assert ans["attach"] == f"tcp://{ans['endpoint']}?lease={lease['id']}&token={ans['token']}"
    assert ans["gpu_index"] == 1
    # durable before the answer: the state file holds the lease and the slice's lease id
    body = state_body(d)
    assert [x["id"] for x in body["leases"]] == [lease["id"]]
    assert {s["id"]: s["lease_id"] for s in body["slices"]}[ids["quarter0"]] == lease["id"]
    assert ans["token"] not in d.state_file.read_text()  # the token is never stored
    # the data path works, and status shows the slice leased with its usage
    assert remote_sum(ans["attach"]) == 999_000.0
    status = c.get("/v1/status").json()
    by_id = {s["id"]: s for g in status["gpus"] for s in g["slices"]}
    assert by_id[ids["quarter0"]]["leased"] is True and by_id[ids["quarter0"]]["lease_id"] == lease["id"]
    assert by_id[ids["quarter1"]]["leased"] is False and by_id[ids["quarter1"]]["usage"] is None
    assert [x["id"] for x in status["leases"]] == [lease["id"]]
    def usage_after_io():
        u = c.get("/v1/status").json()["gpus"][1]["slices"][0]["usage"]
        return u if u and u["bytes_in"] else None

    usage = wait_for(usage_after_io, 5, "usage figures with the data path's bytes (stats every 1 s)")
    assert set(usage) == {"memory_in_use_bytes", "ops_per_s", "bytes_in", "bytes_out"}
    assert usage["bytes_in"] > 0 and usage["bytes_out"] > 0
    listed = c.get("/v1/leases").json()["leases"]
    assert len(listed) == 1 and listed[0]["worker_alive"] is True and listed[0]["gpu_index"] == 1
    assert not pid_gone(listed[0]["worker_pid"])


def test_grant_by_count_and_by_ids_on_one_gpu(node):
    d, c, ids = node
    r = grant(c, slices=2)
    assert r.status_code == 201, r.text
    assert r.json()["lease"]["slice_ids"] == [ids["quarter0"], ids["quarter1"]]
    r = grant(c, slice_ids=[ids["quarter3"]])
    assert r.status_code == 201, r.text
    assert r.json()["lease"]["slice_ids"] == [ids["quarter3"]]
    r = grant(c, gpus=1)  # the whole GPU 0 (GPU 1 has only 1/4 idle now)
    assert r.status_code == 201, r.text
    assert r.json()["lease"]["slice_ids"] == [ids["whole"]]
    assert len(c.get("/v1/leases").json()["leases"]) == 3


REFUSED = [
    ({"department": "inference", "gpus": 0.25}, 409, "insufficient_slices",
     "no GPU has free slices of department 'inference' covering 0.25 GPU-equivalents"),
    ({"slice_ids": ["TRAINING"]}, 409, "wrong_owner", "is owned by 'training', not 'research'"),
    ({"slice_ids": ["GPU-nope/0"]}, 404, "unknown_slice", "no slice 'GPU-nope/0'"),
    ({"slice_ids": ["WHOLE", "QUARTER0"]}, 400, "invalid_field", "a lease holds slices of one GPU"),
    ({"gpus": 1.5}, 400, "invalid_field", "gpus must be > 0 and <= 1"),
    ({"slices": 2, "gpus": 0.5}, 400, "invalid_field", "give exactly one of slices"),
    ({"gpus": 0.5, "ttl_s": 0}, 400, "invalid_field", "ttl_s must be a number of seconds 1..86400"),
    ({"gpus": 0.5, "colour": "red"}, 400, "unknown_field", "colour is not a field of this request"),
    ({"gpus": 0.5, "owner": ""}, 400, "invalid_field", "owner must not be empty"),
]


def test_refused_grants_name_the_fault_and_change_nothing(node):
    d, c, ids = node
    for body, status, code, words in REFUSED:
        if "slice_ids" in body:
            body = {**body, "slice_ids": [ids.get(s.lower(), s) for s in body["slice_ids"]]}
        before_file = d.state_file.read_bytes()
        before = slices(c)
        r = grant(c, **body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == code and words in err["message"], (body, err)
        assert slices(c) == before and d.state_file.read_bytes() == before_file
        assert c.get("/v1/leases").json()["leases"] == []
    assert "granted" not in d.stderr_text() and "worker pid" not in d.stderr_text()  # no worker started


def test_insufficient_message_lists_idle_slices_and_leased_slice_refused(node):
    d, c, ids = node
    assert grant(c, slice_ids=[ids["whole"]]).status_code == 201
    r = grant(c, slices=5)  # a valid count, but no GPU has 5 idle slices of research
    assert r.status_code == 409 and r.json()["error"]["code"] == "insufficient_slices"
    assert r.json()["error"]["message"].endswith("free slices of research: GPU 1: 1/4+1/4+1/4+1/4")
    r = grant(c, slices=4)
    assert r.status_code == 201
    before = slices(c)
    r = grant(c, gpus=0.125)
    assert r.status_code == 409
    assert r.json()["error"]["message"].endswith("free slices of research: none")
    r = grant(c, slice_ids=[ids["whole"]])
    assert r.status_code == 409 and r.json()["error"]["code"] == "slice_leased"
    assert slices(c) == before


def test_request_id_reuse_is_refused_naming_the_lease(node):
    d, c, ids = node
    r = grant(c, gpus=0.25, request_id="same")
    assert r.status_code == 201
    lid = r.json()["lease"]["id"]
    before = slices(c)
    again = grant(c, gpus=0.25, request_id="same")
    assert again.status_code == 409 and again.json()["error"]["code"] == "request_id_reused"
    assert f"already granted lease {lid}" in again.json()["error"]["message"]
    assert slices(c) == before


def test_release_frees_slices_and_stops_worker(node):
    d, c, ids = node
    ans = grant(c, gpus=0.25).json()
    lid = ans["lease"]["id"]
    pid = c.get(f"/v1/leases/{lid}").json()["lease"]["worker_pid"]
    r = c.delete(f"/v1/leases/{lid}")
    assert r.status_code == 200, r.text
    assert r.json()["released"] == lid and r.json()["slice_ids"] == [ids["quarter0"]]
    assert pid_gone(pid)
    assert slices(c)[ids["quarter0"]]["lease_id"] is None
    assert state_body(d)["leases"] == []
    again = c.delete(f"/v1/leases/{lid}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "unknown_lease"
    hb = c.post(f"/v1/leases/{lid}/heartbeat", json={})
    assert hb.status_code == 404 and f"no lease '{lid}'" in hb.json()["error"]["message"]
    bad = c.delete("/v1/leases/..%2Fetc")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "lease_id"


# ---------------------------------------------------------------------------- expiry and heartbeat


def test_ttl_expiry_frees_slices_and_stops_worker(node):
    d, c, ids = node
    ans = grant(c, gpus=0.25, ttl_s=1).json()
    lid = ans["lease"]["id"]
    pid = c.get(f"/v1/leases/{lid}").json()["lease"]["worker_pid"]
    assert not pid_gone(pid)
    wait_for(lambda: c.get("/v1/leases").json()["leases"] == [], 5, "expiry")
    assert slices(c)[ids["quarter0"]]["lease_id"] is None
    wait_for(lambda: pid_gone(pid), 5, "worker exit")
    # logged once the state says so (after the slices are idle): wait for the line itself
    wait_for(lambda: "ended (expired)" in d.stderr_text(), 5, "the expiry's log line")


def test_heartbeat_keeps_the_lease_past_its_ttl(node):
    d, c, ids = node
    ans = grant(c, gpus=0.25, ttl_s=2.5).json()
    lid = ans["lease"]["id"]
    first_expiry = ans["lease"]["expires_s"]
    start = time.monotonic()
    while time.monotonic() - start < 3.2:  # past the 2.5 s ttl; a heartbeat every 0.4 s leaves
        time.sleep(0.4)                     # 2 s of room for a loaded machine
        r = c.post(f"/v1/leases/{lid}/heartbeat", json={})
        assert r.status_code == 200, r.text
    assert r.json()["expires_s"] > first_expiry + 3.0
    listed = c.get("/v1/leases").json()["leases"]
    assert [x["id"] for x in listed] == [lid] and listed[0]["expires_s"] == r.json()["expires_s"]
    assert remote_sum(ans["attach"], 10) == 90.0  # the worker's deadline moved too


# ---------------------------------------------------------------------------- revoke, drain, worker death


def test_reassign_of_leased_slice_refused_then_revoke_ends_lease_and_worker(node):
    d, c, ids = node
    import gpuctl.remote as cp

    ans = grant(c, slice_ids=[ids["whole"]]).json()
    lid = ans["lease"]["id"]
    pid = c.get(f"/v1/leases/{lid}").json()["lease"]["worker_pid"]
    cp.attach(ans["attach"])
    try:
        a = cp.ones(100)
        assert float(a.sum().get()) == 100.0
        gen = c.get("/v1/slices").json()["generation"]
        move = [{"slice_id": ids["whole"], "from": "research", "to": "training"}]
        before = slices(c)
        r = c.post("/v1/assign", json={"request_id": "mv-1", "generation": gen, "moves": move})
        assert r.status_code == 409 and r.json()["error"]["code"] == "slice_leased"
        assert slices(c) == before and not pid_gone(pid)
        r = c.post("/v1/assign", json={"request_id": "mv-2", "generation": gen, "moves": move, "leased": "revoke"})
        assert r.status_code == 200 and r.json()["moved"] == [ids["whole"]]
        assert pid_gone(pid)  # stopped before the answer
        assert c.get("/v1/leases").json()["leases"] == []
        assert slices(c)[ids["whole"]]["department"] == "training"
        with pytest.raises(ConnectionError):
            float((a + 1).sum().get())
    finally:
        cp.detach()


def test_drained_move_applies_when_lease_released(node):
    d, c, ids = node
    lid = grant(c, slice_ids=[ids["whole"]]).json()["lease"]["id"]
    gen = c.get("/v1/slices").json()["generation"]
    r = c.post("/v1/assign", json={"request_id": "dr-1", "generation": gen, "leased": "drain",
                                   "moves": [{"slice_id": ids["whole"], "from": "research", "to": "training"}]})
    assert r.status_code == 200 and r.json()["pending"] == [ids["whole"]]
    r = c.delete(f"/v1/leases/{lid}")
    assert r.json()["drained"] == [ids["whole"]]
    assert slices(c)[ids["whole"]]["department"] == "training"


def test_worker_killed_ends_lease_and_frees_slice(node):
    d, c, ids = node
    ans = grant(c, gpus=0.25).json()
    lid = ans["lease"]["id"]
    pid = c.get(f"/v1/leases/{lid}").json()["lease"]["worker_pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: c.get("/v1/leases").json()["leases"] == [], 5, "lease end after worker death")
    assert slices(c)[ids["quarter0"]]["lease_id"] is None
    assert "had exited by itself" in d.stderr_text()
    r = c.post(f"/v1/leases/{lid}/heartbeat", json={})
    assert r.status_code == 404


# ---------------------------------------------------------------------------- daemon stop, crash, restart


def test_kill9_then_restart_ends_restored_leases(node):
    d, c, ids = node
    ans = grant(c, gpus=0.25).json()
    lid = ans["lease"]["id"]
    pid = c.get(f"/v1/leases/{lid}").json()["lease"]["worker_pid"]
    d.kill9()
    wait_for(lambda: pid_gone(pid), 5, "worker exit after its daemon died (control pipe closed)")
    assert [x["id"] for x in state_body(d)["leases"]] == [lid]  # the durable record survived the crash
    d.restart()
    with d.client() as c2:
        assert c2.get("/v1/leases").json()["leases"] == []
        assert slices(c2)[ids["quarter0"]]["lease_id"] is None
        assert c2.post(f"/v1/leases/{lid}/heartbeat", json={}).status_code == 404
    assert state_body(d)["leases"] == []
    assert f"lease {lid} ({OWNER}, research, slices {ids['quarter0']}) ended at start-up" in d.stderr_text()
    import gpuctl.remote as cp

    with pytest.raises(ConnectionError):  # AttachError / WorkerLostError: the client sees an error
        cp.attach(ans["attach"])
        float(cp.ones(3).sum().get())
    cp.detach()


def test_sigterm_stops_workers_and_ends_leases(node):
    d, c, ids = node
    lid = grant(c, gpus=0.25).json()["lease"]["id"]
    pid = c.get(f"/v1/leases/{lid}").json()["lease"]["worker_pid"]
    assert d.stop() == 0
    assert pid_gone(pid)
    assert state_body(d)["leases"] == []
    assert f"ended 1 lease(s) and stopped their workers: {lid}" in d.stderr_text()


def test_worker_user_options(tmp_path):
    bad = start_daemon(tmp_path, gpus=1, name="bad", extra_args=["--worker-user", "no-such-user-x"], wait=False)
    try:
        assert bad.wait_exit() == 2
        assert "--worker-user: no user 'no-such-user-x' on this node" in bad.stderr_text()
    finally:
        bad.stop()
    root = start_daemon(tmp_path, gpus=1, name="root", extra_args=["--worker-user", "root"], wait=False)
    try:
        assert root.wait_exit() == 2 and "is root; workers must run as an unprivileged user" in root.stderr_text()
    finally:
        root.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_worker_runs_as_worker_user_or_grant_fails_cleanly(tmp_path):
    d = start_daemon(tmp_path, gpus=2, name="nobody", extra_args=["--worker-user", "nobody"])
    try:
        with d.client() as c:
            gen = c.get("/v1/slices").json()["generation"]
            sid = sorted(slices(c))[0]
            c.post("/v1/assign", json={"request_id": "s", "generation": gen, "moves": [
                {"slice_id": sid, "from": "unassigned", "to": "research"}]})
            before_file = d.state_file.read_bytes()
            r = grant(c, gpus=1)
            nobody_runs_python = subprocess.run(
                ["su", "-s", "/bin/sh", "nobody", "-c", f"{sys.executable} -c pass"],
                capture_output=True).returncode == 0
            if nobody_runs_python:
                assert r.status_code == 201, r.text
                pid = c.get(f"/v1/leases/{r.json()['lease']['id']}").json()["lease"]["worker_pid"]
                assert os.stat(f"/proc/{pid}").st_uid == 65534
            else:  # this machine's Python is not readable by nobody: a clear refusal, nothing leased
                assert r.status_code == 500, r.text
                err = r.json()["error"]
                assert err["code"] == "worker_start_failed" and "did not start" in err["message"]
                assert "nothing was leased" in err["message"]
                assert d.state_file.read_bytes() == before_file
                assert slices(c)[sid]["lease_id"] is None
    finally:
        d.stop()


# ---------------------------------------------------------------------------- pure rules


def _s(uuid: str, k: int, frac: float, dept: str = "research", lease: str | None = None) -> Slice:
    return Slice(id=f"{uuid}/{k}", gpu_uuid=uuid, fraction=frac, memory_quota_bytes=int(80e9 * frac),
                 compute_share=frac, department=dept, lease_id=lease)


def test_best_pick_rule():
    sl = [_s("A", 0, 1.0), _s("B", 0, 0.5), _s("B", 1, 0.25), _s("B", 2, 0.25, lease="x"),
          _s("C", 0, 0.5), _s("C", 1, 0.5), _s("D", 0, 1.0, dept="training")]
    idx = {"A": 0, "B": 1, "C": 2, "D": 3}
    assert [s.id for s in best_pick(sl, "research", idx, gpus=0.25).slices] == ["B/1"]
    assert [s.id for s in best_pick(sl, "research", idx, gpus=0.5).slices] == ["B/0"]  # least idle left
    assert [s.id for s in best_pick(sl, "research", idx, gpus=0.75).slices] == ["B/0", "B/1"]
    assert [s.id for s in best_pick(sl, "research", idx, gpus=1).slices] == ["A/0"]  # one slice beats two
    assert [s.id for s in best_pick(sl, "research", idx, count=2).slices] == ["B/0", "B/1"]
    assert best_pick(sl, "research", idx, count=3) is None
    assert best_pick(sl, "research", {"B": 1}, gpus=1) is None  # A's GPU not reported: skipped
    assert best_pick(sl, "inference", idx, gpus=0.125) is None
    assert describe_idle(sl, "research", idx) == "GPU 0: 1, GPU 1: 1/2+1/4, GPU 2: 1/2+1/2"
    with pytest.raises(ValueError, match="gpus must be > 0 and <= 1"):
        validate_amount(None, 2.0)
    with pytest.raises(ValueError, match="exactly one"):
        validate_amount(1, 0.5)


def test_split_usage_by_fraction():
    two = [_s("B", 0, 0.5), _s("B", 1, 0.25)]
    out = split_usage({"memory_in_use_bytes": 1001, "ops_per_s": 30.0, "bytes_in": 10, "bytes_out": 3}, two)
    assert out["B/0"] == {"memory_in_use_bytes": 668, "ops_per_s": 20.0, "bytes_in": 7, "bytes_out": 2}
    assert out["B/1"] == {"memory_in_use_bytes": 333, "ops_per_s": 10.0, "bytes_in": 3, "bytes_out": 1}
    one = split_usage({"memory_in_use_bytes": 5, "bytes_in": 1, "bytes_out": 2}, [_s("A", 0, 1.0)])
    assert one["A/0"] == {"memory_in_use_bytes": 5, "ops_per_s": None, "bytes_in": 1, "bytes_out": 2}


def test_lease_modules_are_headless():
    code = ("import sys, gpuctl.leasing, gpuctl.daemon.leases, gpuctl.cli.leases, gpuctl.cli; "
            "print('textual' in sys.modules, 'gpuctl.datapath.launcher' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]  # and the CLI does not load the worker launcher


def test_node_ties_go_to_the_first_node_in_the_config_whatever_the_gpu_index():
    # Before: the GPU index came before config order, so node b (GPU 0) beat node a (GPU 1) though
    # README says ties go to the first node in the config.
    from gpuctl.fleet.leases import choose_nodes
    from gpuctl.model import FleetSnapshot, GpuIdentity, GpuStatus, NodeStatus

    def node(name, owners):
        gpus = [GpuStatus(GpuIdentity(uuid=f"{name}{i}", index=i, name="sim"), None, [_s(f"{name}{i}", 0, 1.0, o)])
                for i, o in enumerate(owners)]
        return NodeStatus(name, True, gpus=gpus)

    snap = FleetSnapshot([node("a", ["training", "research"]), node("b", ["research"])])
    assert choose_nodes(snap, "research", None, 0.5) == ["a", "b"]
    # a better fit still wins over config order: a quarter on c beats the whole GPU on a
    snap.nodes.append(NodeStatus("c", True, gpus=[GpuStatus(GpuIdentity(uuid="c0", index=3, name="sim"), None,
                                                            [_s("c0", 0, 0.5), _s("c0", 1, 0.5, "training")])]))
    assert choose_nodes(snap, "research", None, 0.5) == ["c", "a", "b"]


def test_cli_lease_says_the_granted_fraction(tmp_path, node):
    # Before: `lease --gpus 0.3` took a 1/2 slice and never said so.
    from fleet_fixtures import run_cli

    d, c, ids = node
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[[department]]\nname = "research"\n\n[[node]]\nname = "n1"\ntransport = "local"\n'
                   f'socket = "{d.socket_path}"\n')
    r = run_cli("--config", str(cfg), "lease", "--dept", "research", "--gpus", "0.3")
    assert r.code == 0, r.stderr
    assert "granted    1/2 GPU (asked 0.3: the smallest free slices covering it)\n" in r.stdout
    r = run_cli("--config", str(cfg), "--json", "lease", "--dept", "research", "--gpus", "0.25")
    assert r.code == 0, r.stderr
    assert r.json["gpu_equivalents"] == 0.25 and r.json["asked_gpu_equivalents"] == 0.25
    assert len(r.json["lease"]["slice_ids"]) == 1
