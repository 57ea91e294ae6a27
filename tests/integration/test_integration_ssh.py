"""End to end over a REAL OpenSSH sshd on 127.0.0.1: two real simulated gpuctld, the real `gpuctl` CLI.

The CLI reaches each daemon's Unix socket through sshd (`gpuctld bridge` in an exec channel), with
the test's generated user key, ssh config and known_hosts. Asserts the JSON and the daemons' own
state (read directly from their sockets, not through gpuctl).
"""

from __future__ import annotations

import pytest

from daemon_proc import start_daemon
from fleet_fixtures import daemon_slices, owners, run_cli, ssh_cli_args, sshd_node, write_fleet_config
from sshd import sshd_available

pytestmark = [pytest.mark.sshd,
              pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen")]


@pytest.fixture
def fleet(sshd, tmp_path):
    d1 = start_daemon(tmp_path, gpus=4, seed=21, name="alpha")
    d2 = start_daemon(tmp_path, gpus=4, seed=22, name="beta")
    cfg = write_fleet_config(tmp_path / "fleet.toml",
                             {"alpha": sshd_node(d1.socket_path), "beta": sshd_node(d2.socket_path)})
    ssh_args = ssh_cli_args(cfg, sshd)
    try:
        yield ssh_args, d1, d2
    finally:
        d1.stop()
        d2.stop()


def _total(*daemons) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in daemons:
        for k, v in owners(d.socket_path).items():
            out[k] = out.get(k, 0) + v
    return out


def test_status_json_over_ssh_returns_both_nodes(fleet):
    ssh_args, d1, d2 = fleet
    r = run_cli(*ssh_args, "status", "--json")
    assert r.code == 0, r.stderr
    nodes = r.json["nodes"]
    assert [(n["name"], n["reachable"], n["error"]) for n in nodes] == [("alpha", True, None), ("beta", True, None)]
    for n, d in zip(nodes, (d1, d2)):
        assert len(n["gpus"]) == 4
        assert {s["id"] for g in n["gpus"] for s in g["slices"]} == set(daemon_slices(d.socket_path))
        assert all(isinstance(g["temperature_c"], (int, float)) for g in n["gpus"])


def test_reassign_over_ssh_then_same_request_id_moves_nothing_more(fleet):
    ssh_args, d1, d2 = fleet
    cmd = (*ssh_args, "reassign", "--from", "unassigned", "--to", "research", "--count", "2", "--yes",
           "--request-id", "ssh-req-1", "--json")
    r = run_cli(*cmd)
    assert r.code == 0, r.stderr
    assert len(r.json["moved"]) == 2
    moved_ids = {m["slice_id"] for m in r.json["moved"]}
    after = _total(d1, d2)
    assert after == {"research": 2, "unassigned": 6}
    for d in (d1, d2):
        for sid, s in daemon_slices(d.socket_path).items():
            assert (s["department"] == "research") == (sid in moved_ids)
    again = run_cli(*cmd)
    assert again.code == 0, again.stderr
    assert again.json["moved"] == []
    assert {m["slice_id"] for m in again.json["already"]} == moved_ids
    assert _total(d1, d2) == after


def test_partial_failure_then_rerun_completes(fleet):
    """Node beta goes down mid-way: alpha's part moves, beta's is reported; the re-run completes it."""
    ssh_args, d1, d2 = fleet
    # fill alpha's unassigned pool except one GPU, so 3 slices need both nodes
    assert run_cli(*ssh_args, "reassign", "--from", "unassigned", "--to", "training", "--count", "3",
                   "--node", "alpha", "--yes").code == 0
    d2.stop()
    r = run_cli(*ssh_args, "--json", "reassign", "--from", "unassigned", "--to", "research", "--count", "1",
                "--yes", "--request-id", "half")
    # beta may hold this request id from an earlier run and cannot be asked: nothing is planned elsewhere
    assert r.code == 7 and r.json["moved"] == [] and list(r.json["unsettled"]) == ["beta"], r.stderr
    assert "request half may already be recorded on beta, which could not be asked" in r.stderr
    r = run_cli(*ssh_args, "--json", "reassign", "--from", "unassigned", "--to", "research", "--count", "1",
                "--yes", "--request-id", "half", "--node", "alpha")
    assert r.code == 0, r.stderr  # alpha alone can satisfy 1
    assert [m["node"] for m in r.json["moved"]] == ["alpha"]
    d2.restart()
    r2 = run_cli(*ssh_args, "--json", "reassign", "--from", "unassigned", "--to", "research", "--count", "3",
                 "--yes", "--request-id", "half")
    # one already done on alpha; alpha applied this request id, so the other two come from beta
    assert r2.code == 0, r2.stderr
    assert [m["node"] for m in r2.json["already"]] == ["alpha"]
    assert sorted(m["node"] for m in r2.json["moved"]) == ["beta", "beta"]
    assert owners(d2.socket_path) == {"research": 2, "unassigned": 2}


def test_kill9_daemon_keeps_ownership_across_restart(fleet):
    ssh_args, d1, d2 = fleet
    assert run_cli(*ssh_args, "reassign", "--from", "unassigned", "--to", "training", "--count", "4",
                   "--node", "beta", "--yes").code == 0
    before = daemon_slices(d2.socket_path)
    d2.kill9()
    d2.restart()
    assert daemon_slices(d2.socket_path) == before
    r = run_cli(*ssh_args, "status", "--json", "--node", "beta")
    assert r.code == 0, r.stderr
    assert {s["department"] for g in r.json["nodes"][0]["gpus"] for s in g["slices"]} == {"training"}


def test_unreachable_node_over_ssh_leaves_the_other_intact(fleet):
    ssh_args, d1, d2 = fleet
    d2.stop()
    r = run_cli(*ssh_args, "status", "--json")
    assert r.code == 7
    alpha, beta = r.json["nodes"]
    assert alpha["reachable"] and len(alpha["gpus"]) == 4
    assert not beta["reachable"]
    assert "gpuctld is not running on this node" in beta["error"] or "nothing listens" in beta["error"]


def test_unknown_host_key_is_refused_with_fingerprint(fleet, sshd, tmp_path):
    ssh_args, d1, d2 = fleet
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    args = list(ssh_args)
    args[args.index("--known-hosts") + 1] = str(empty)
    before = daemon_slices(d1.socket_path)
    r = run_cli(*args, "status", "--json")
    assert r.code == 7
    errors = [n["error"] for n in r.json["nodes"]]
    assert all("SHA256:" in e and "--accept-new-host-key" in e for e in errors), errors
    assert empty.read_text() == ""
    ok = run_cli(*args, "--accept-new-host-key", "status", "--json")
    assert ok.code == 0, ok.stderr
    assert "127.0.0.1" in empty.read_text()
    assert daemon_slices(d1.socket_path) == before
