"""Scheduled moves executed by real gpuctld processes, driven by the real `gpuctl` CLI on local sockets.

Time is moved with the daemons' ``--clock-offset-file`` (gpuctl.daemon.clock), so nothing sleeps
more than the executor's tick. Between `schedule add` and the check no gpuctl process runs: the
result is read from the daemon's own state file.
"""

from __future__ import annotations

import getpass
import os
import socket
import time

import pytest

from daemon_proc import uds_client
from fleet_fixtures import daemon_slices, local_fleet, owners, run_cli
from gpuctl.daemon.state import StateStore


@pytest.fixture
def fleet(tmp_path):
    offset = tmp_path / "clock-offset"
    with local_fleet(tmp_path, {"n1": 31, "n2": 32}, extra_args=["--clock-offset-file", str(offset)]) as (cfg, (d1, d2)):
        yield cfg, d1, d2, offset


def _entries(d) -> list[dict]:
    with uds_client(d.socket_path) as c:
        return c.get("/v1/schedule").json()["entries"]


def _wait_on_disk(d, predicate, timeout_s: float = 3.0) -> dict:
    """Read the daemon's state file (not its API) until predicate(slices) holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        slices = {s.id: s.department for s in StateStore(d.state_dir).load().slices.values()}
        if predicate(slices) or time.monotonic() > deadline:
            return slices
        time.sleep(0.05)


def test_schedule_runs_on_the_node_with_no_gpuctl_then_status_and_audit_show_it(fleet):
    cfg, d1, d2, offset = fleet
    r = run_cli("schedule", "add", "--at", "+1h", "--from", "unassigned", "--to", "research", "--count", "1",
                "--node", "n1", "--yes", "--json", "--request-id", "sched-1", "--config", str(cfg))
    assert r.code == 0, r.stderr
    doc = r.json
    (sid,) = doc["nodes"]["n1"]["slice_ids"]
    assert doc["nodes"]["n1"]["status"] == "installed" and doc["request_id"] == "sched-1"
    assert daemon_slices(d1.socket_path)[sid]["department"] == "unassigned"
    offset.write_text("3601")  # the daemons' clock passes the time; no gpuctl runs now
    slices = _wait_on_disk(d1, lambda s: s[sid] == "research")
    assert slices[sid] == "research"
    st = run_cli("status", "--json", "--config", str(cfg))
    assert st.code == 0, st.stderr
    found = [s for n in st.json["nodes"] for g in n["gpus"] for s in g["slices"] if s["id"] == sid]
    assert found[0]["department"] == "research"
    au = run_cli("audit", "--json", "--config", str(cfg))
    assert au.code == 0, au.stderr
    moves = [rec for rec in au.json["records"] if rec.get("request_id") == "sched-1" and rec.get("moved")]
    assert moves and moves[0]["moved"] == [{"slice_id": sid, "from": "unassigned", "to": "research"}]
    by = moves[0]["who"]["scheduled_by"]
    assert by["ssh_user"] == getpass.getuser() and by["reported"] == f"{getpass.getuser()}@{socket.gethostname()}"
    assert au.json["problems"] == []
    ls = run_cli("schedule", "list", "--json", "--config", str(cfg))
    assert [(e["node"], e["status"]) for e in ls.json["entries"]] == [("n1", "done")]


def test_node_down_at_the_time_runs_the_entry_late_when_it_comes_back(fleet):
    cfg, d1, d2, offset = fleet
    r = run_cli("schedule", "add", "--at", "+1h", "--from", "unassigned", "--to", "training", "--count", "1",
                "--node", "n2", "--yes", "--json", "--config", str(cfg))
    assert r.code == 0, r.stderr
    (sid,) = r.json["nodes"]["n2"]["slice_ids"]
    d2.stop()
    offset.write_text("7200")  # the time passes while the node is down
    d2.start()
    _wait_on_disk(d2, lambda s: s[sid] == "training")
    ls = run_cli("schedule", "list", "--json", "--config", str(cfg))
    (e,) = ls.json["entries"]
    assert e["status"] == "late" and e["late_s"] == pytest.approx(3600, abs=30)
    table = run_cli("schedule", "list", "--config", str(cfg), env={"COLUMNS": "200"})
    assert "late" in table.stdout and "ran 3" in table.stdout


@pytest.mark.parametrize("args, message", [
    (["--at", "yesterday 08:00"], "--at: 'yesterday 08:00' is not a time"),
    (["--at", "2020-01-01T00:00Z"], "is in the past"),
    (["--at", "+1h", "--grace", "10m"], "--grace: only with --revoke"),
    (["--at", "+1h", "--revoke", "--grace", "ten"], "--grace: 'ten' is not a duration"),
])
def test_bad_times_are_refused_and_nothing_is_installed(fleet, args, message):
    cfg, d1, d2, offset = fleet
    r = run_cli("schedule", "add", *args, "--from", "unassigned", "--to", "research", "--count", "1", "--yes",
                "--config", str(cfg))
    assert r.code == 2 and message in r.stderr, r.stderr
    assert _entries(d1) == [] and _entries(d2) == []


def test_unknown_department_is_refused(fleet):
    cfg, d1, d2, offset = fleet
    r = run_cli("schedule", "add", "--at", "+1h", "--from", "unassigned", "--to", "marketing", "--count", "1",
                "--yes", "--config", str(cfg))
    assert r.code == 2 and "--to: unknown department 'marketing'" in r.stderr
    assert _entries(d1) == [] and _entries(d2) == []


def test_too_few_slices_is_refused_and_scheduled_slices_are_not_planned_twice(fleet):
    cfg, d1, d2, offset = fleet
    base = ("schedule", "add", "--at", "+1h", "--from", "unassigned", "--to", "research", "--yes", "--json",
            "--config", str(cfg))
    assert run_cli(*base, "--count", "3").code == 0
    r = run_cli(*base, "--count", "2")  # 4 unassigned slices, 3 already scheduled to leave
    assert r.code == 4 and "only 1 free slice(s) of unassigned can move, 2 asked" in r.stderr
    assert sum(len(e["slice_ids"]) for d in (d1, d2) for e in _entries(d)) == 3


def test_same_request_id_again_installs_nothing_more(fleet):
    cfg, d1, d2, offset = fleet
    args = ("schedule", "add", "--at", "+1h", "--from", "unassigned", "--to", "research", "--count", "3", "--yes",
            "--json", "--request-id", "again", "--config", str(cfg))
    first = run_cli(*args)
    assert first.code == 0, first.stderr
    second = run_cli(*args)
    assert second.code == 0, second.stderr
    assert second.json["planned"] == [] and len(second.json["already"]) == 3
    entries = _entries(d1) + _entries(d2)
    assert sum(len(e["slice_ids"]) for e in entries) == 3
    assert {e["at_s"] for e in entries} == {first.json["at_s"]}


def test_cancel_then_the_time_passes_and_nothing_moves(fleet):
    cfg, d1, d2, offset = fleet
    r = run_cli("schedule", "add", "--at", "+1h", "--from", "unassigned", "--to", "research", "--count", "1",
                "--node", "n1", "--yes", "--json", "--config", str(cfg))
    eid = r.json["entry_id"]
    before = owners(d1.socket_path)
    c = run_cli("schedule", "cancel", eid, "--json", "--config", str(cfg))
    assert c.code == 0 and c.json["cancelled"] == ["n1"], c.stderr
    offset.write_text("3700")
    time.sleep(0.6)  # a few executor ticks
    assert owners(d1.socket_path) == before
    again = run_cli("schedule", "cancel", eid, "--config", str(cfg))
    assert again.code == 6 and "already cancelled" in again.stderr
    missing = run_cli("schedule", "cancel", "s-0000000000", "--config", str(cfg))
    assert missing.code == 2 and "no schedule entry 's-0000000000' on any node" in missing.stderr


def test_corrupt_audit_line_is_reported_and_the_daemon_keeps_recording(fleet):
    cfg, d1, d2, offset = fleet
    log = d1.state_dir / "audit.log"
    with open(log, "ab") as f:
        f.write(b'{"event": "cut')  # a cut line, no newline
    r = run_cli("reassign", "--from", "unassigned", "--to", "research", "--count", "1", "--node", "n1", "--yes",
                "--request-id", "after-cut", "--config", str(cfg))
    assert r.code == 0, r.stderr
    au = run_cli("audit", "--node", "n1", "--json", "--config", str(cfg))
    assert au.code == 0
    (p,) = au.json["problems"]
    assert p["node"] == "n1" and p["file"].endswith("audit.log") and p["text"].startswith('{"event": "cut')
    assert any(rec.get("request_id") == "after-cut" and rec.get("moved") for rec in au.json["records"])
    text = run_cli("audit", "--node", "n1", "--config", str(cfg))
    assert f"audit.log line {p['line']}: unreadable audit record" in text.stderr


def test_audit_filters_by_department_and_time(fleet):
    cfg, d1, d2, offset = fleet
    for dept, rid in (("research", "to-research"), ("training", "to-training")):
        r = run_cli("reassign", "--from", "unassigned", "--to", dept, "--count", "1", "--yes", "--request-id", rid,
                    "--config", str(cfg))
        assert r.code == 0, r.stderr
    au = run_cli("audit", "--dept", "training", "--json", "--config", str(cfg))
    rids = {rec.get("request_id") for rec in au.json["records"]}
    assert "to-training" in rids and "to-research" not in rids
    times = [rec["time_s"] for rec in au.json["records"]]
    assert times == sorted(times)
    assert run_cli("audit", "--since", "2099-01-01T00:00Z", "--json", "--config", str(cfg)).json["records"] == []
    bad = run_cli("audit", "--dept", "marketing", "--config", str(cfg))
    assert bad.code == 2 and "--dept: unknown department 'marketing'" in bad.stderr
    bad = run_cli("audit", "--since", "last tuesday", "--config", str(cfg))
    assert bad.code == 2 and "--since:" in bad.stderr


def test_revoke_with_grace_ends_a_real_lease_and_its_worker_then_moves(fleet):
    cfg, d1, d2, offset = fleet
    sid = sorted(daemon_slices(d1.socket_path))[0]
    assert run_cli("reassign", "--from", "unassigned", "--to", "research", "--slice", sid, "--yes",
                   "--config", str(cfg)).code == 0
    with uds_client(d1.socket_path, timeout_s=30) as c:
        lease = c.post("/v1/leases", json={"request_id": "lease-1", "department": "research", "owner": "bob@ws",
                                           "ttl_s": 600, "slice_ids": [sid]})
        assert lease.status_code == 201, lease.text
        lid = lease.json()["lease"]["id"]
        worker_pid = c.get("/v1/leases").json()["leases"][0]["worker_pid"]
    refused = run_cli("schedule", "add", "--at", "+1h", "--from", "research", "--to", "training", "--slice", sid,
                      "--yes", "--config", str(cfg))
    assert refused.code == 6 and f"{sid}: leased by {lid} (use --drain or --revoke)" in refused.stderr
    r = run_cli("schedule", "add", "--at", "+1h", "--from", "research", "--to", "training", "--slice", sid,
                "--revoke", "--grace", "10m", "--yes", "--json", "--config", str(cfg))
    assert r.code == 0, r.stderr
    offset.write_text("3601")
    deadline = time.monotonic() + 3
    while _entries(d1)[0]["status"] != "waiting" and time.monotonic() < deadline:
        time.sleep(0.05)
    (e,) = _entries(d1)
    assert e["status"] == "waiting" and e["pending"] == [sid]
    assert daemon_slices(d1.socket_path)[sid]["lease_id"] == lid  # the lease runs on during the grace
    offset.write_text(str(3601 + 600))
    slices = _wait_on_disk(d1, lambda s: s[sid] == "training")
    assert slices[sid] == "training"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"worker {worker_pid} still runs after its lease was revoked")
    with uds_client(d1.socket_path) as c:
        assert c.get("/v1/leases").json()["leases"] == []
    au = run_cli("audit", "--json", "--config", str(cfg)).json["records"]
    ended = [x for x in au if x.get("leases_ended")]
    assert ended and ended[-1]["leases_ended"][0]["id"] == lid and ended[-1]["who"]["internal"] == "schedule"
