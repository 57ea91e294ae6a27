"""The real `gpuctl` CLI against two real simulated gpuctld processes on local Unix sockets.

(The same flows over real sshd are in test_integration_ssh.py.)
"""

from __future__ import annotations

import pytest

from gpuctl.backends.simulated import MEMORY_TOTAL_BYTES
from fleet_fixtures import daemon_slices, json_error_or_nothing, local_fleet, owners, run_cli


@pytest.fixture
def fleet(tmp_path):
    with local_fleet(tmp_path, {"n1": 11, "n2": 12}, gpus=4) as (cfg, (d1, d2)):
        yield cfg, d1, d2


def test_status_json_shape_and_values(fleet):
    cfg, d1, d2 = fleet
    r = run_cli("status", "--json", "--config", str(cfg))  # global flags after the verb
    assert r.code == 0, r.stderr
    doc = r.json
    assert [n["name"] for n in doc["nodes"]] == ["n1", "n2"]
    for n in doc["nodes"]:
        assert n["reachable"] is True and n["error"] is None
        assert len(n["gpus"]) == 4
        for g in n["gpus"]:
            assert g["uuid"].startswith("GPU-")
            assert g["memory_total_bytes"] == MEMORY_TOTAL_BYTES
            assert 0 <= g["sm_util_pct"] <= 100
            assert g["slices"] == [{**g["slices"][0], "fraction": 1.0, "department": "unassigned",
                                    "leased": False}]
    # the same figures the daemon holds
    direct = daemon_slices(d1.socket_path)
    assert {s["id"] for g in doc["nodes"][0]["gpus"] for s in g["slices"]} == set(direct)
    # flags before the verb work too
    r2 = run_cli("--json", "--config", str(cfg), "status", "--node", "n2")
    assert r2.code == 0 and [n["name"] for n in r2.json["nodes"]] == ["n2"]


def test_reassign_moves_then_replay_moves_nothing_more(fleet):
    cfg, d1, d2 = fleet
    args = ("--config", str(cfg), "reassign", "--from", "unassigned", "--to", "research",
            "--count", "2", "--yes", "--request-id", "req-1", "--json")
    r = run_cli(*args)
    assert r.code == 0, r.stderr
    assert len(r.json["moved"]) == 2
    # fewest nodes: both on one node
    assert len({m["node"] for m in r.json["moved"]}) == 1
    total = {**owners(d1.socket_path)}
    for k, v in owners(d2.socket_path).items():
        total[k] = total.get(k, 0) + v
    assert total == {"research": 2, "unassigned": 6}
    again = run_cli(*args)
    assert again.code == 0, again.stderr
    assert again.json["moved"] == [] and len(again.json["already"]) == 2
    total2 = {**owners(d1.socket_path)}
    for k, v in owners(d2.socket_path).items():
        total2[k] = total2.get(k, 0) + v
    assert total2 == total


def test_reassign_without_tty_needs_yes_and_changes_nothing(fleet):
    cfg, d1, d2 = fleet
    before = (daemon_slices(d1.socket_path), daemon_slices(d2.socket_path))
    r = run_cli("--config", str(cfg), "reassign", "--from", "unassigned", "--to", "research", "--count", "1")
    assert r.code == 2
    assert "pass --yes" in r.stderr
    assert r.stdout == ""
    assert (daemon_slices(d1.socket_path), daemon_slices(d2.socket_path)) == before


def test_reassign_shortfall_exit_code_and_message(fleet):
    cfg, d1, d2 = fleet
    before = daemon_slices(d1.socket_path)
    r = run_cli("--config", str(cfg), "reassign", "--from", "research", "--to", "training", "--count", "1",
                "--yes")
    assert r.code == 4
    assert "only 0 free slice(s) of research can move, 1 asked" in r.stderr
    assert daemon_slices(d1.socket_path) == before


def test_dry_run_changes_nothing(fleet):
    cfg, d1, d2 = fleet
    before = daemon_slices(d1.socket_path)
    r = run_cli("--config", str(cfg), "--json", "reassign", "--from", "unassigned", "--to", "training",
                "--gpus", "3", "--dry-run")
    assert r.code == 0, r.stderr
    assert len(r.json["planned"]) == 3 and r.json["moved"] == []
    assert daemon_slices(d1.socket_path) == before


def test_unreachable_node_leaves_others_intact(fleet):
    cfg, d1, d2 = fleet
    d2.stop()
    r = run_cli("--config", str(cfg), "--json", "status")
    assert r.code == 7
    n1, n2 = r.json["nodes"]
    assert n1["reachable"] is True and len(n1["gpus"]) == 4
    assert n2["reachable"] is False and "n2" in n2["error"] and n2["gpus"] == []
    assert "unreachable: node n2: " in r.stderr


def test_departments_counts_gpu_equivalents(fleet):
    cfg, d1, d2 = fleet
    assert run_cli("--config", str(cfg), "reassign", "--from", "unassigned", "--to", "training",
                   "--count", "3", "--yes").code == 0
    r = run_cli("--config", str(cfg), "departments", "--json")
    assert r.code == 0, r.stderr
    rows = {d["name"]: d for d in r.json["departments"]}
    assert rows["training"]["gpu_equivalents"] == 3.0
    assert rows["unassigned"]["gpu_equivalents"] == 5.0
    assert rows["research"]["gpu_equivalents"] == 0.0


def test_usage_and_config_errors(tmp_path):
    r = run_cli("reassign", "--from", "a")
    assert r.code == 2 and "--to" in r.stderr
    missing = tmp_path / "nope.toml"
    r = run_cli("--config", str(missing), "status")
    assert r.code == 3 and f"no fleet config at {missing}" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[node]]\nname = "x"\nport = "abc"\nhost = "h"\n')
    r = run_cli("--config", str(bad), "status", "--json")
    assert r.code == 3 and f"{bad}:3" in r.stderr and json_error_or_nothing(r)["name"] == "CONFIG"


def test_config_without_nodes_is_a_config_error(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text('[[department]]\nname = "research"\n')
    r = run_cli("--config", str(empty), "status", "--json")
    assert r.code == 3
    assert f"{empty}: defines no nodes: add a [[node]] table" in r.stderr
    assert json_error_or_nothing(r)["code"] == 3
    check = run_cli("--config", str(empty), "config", "check")  # agrees with status (issue 7 item 5)
    assert check.code == 3 and f"{empty}: defines no nodes: add a [[node]] table" in check.stderr


def test_request_id_reused_for_other_departments_is_refused(fleet):
    cfg, d1, d2 = fleet
    first = run_cli("--config", str(cfg), "reassign", "--from", "unassigned", "--to", "training",
                    "--count", "1", "--yes", "--request-id", "job-42")
    assert first.code == 0, first.stderr
    before = (daemon_slices(d1.socket_path), daemon_slices(d2.socket_path))
    r = run_cli("--config", str(cfg), "reassign", "--from", "unassigned", "--to", "research",
                "--count", "3", "--yes", "--request-id", "job-42")
    assert r.code == 2
    assert ("--request-id job-42: already used on node n1 to move slices unassigned -> training, "
            "not unassigned -> research; use a new request id") in r.stderr
    assert (daemon_slices(d1.socket_path), daemon_slices(d2.socket_path)) == before


def test_daemon_refuses_a_replay_with_other_moves(fleet):
    cfg, d1, d2 = fleet
    with d1.client() as c:
        st = c.get("/v1/status").json()
        gen = st["generation"]
        a, b = [g["slices"][0]["id"] for g in st["gpus"][:2]]
        ok = c.post("/v1/assign", json={"request_id": "x1", "generation": gen, "leased": "refuse",
                                        "moves": [{"slice_id": a, "from": "unassigned", "to": "research"}]})
        assert ok.status_code == 200
        before = c.get("/v1/slices").json()
        again = c.post("/v1/assign", json={"request_id": "x1", "generation": gen, "leased": "refuse",
                                           "moves": [{"slice_id": b, "from": "unassigned", "to": "research"}]})
        assert again.status_code == 409
        err = again.json()["error"]
        assert err["code"] == "request_id_reused" and err["field"] == "request_id"
        assert "already used for other moves (1 slice(s) unassigned -> research)" in err["message"]
        assert c.get("/v1/slices").json() == before
        same = c.post("/v1/assign", json={"request_id": "x1", "generation": gen, "leased": "refuse",
                                          "moves": [{"slice_id": a, "from": "unassigned", "to": "research"}]})
        assert same.status_code == 200 and same.json()["replayed"] is True


def test_console_refuses_without_a_terminal(tmp_path):
    cfg = tmp_path / "f.toml"
    cfg.write_text('[[node]]\nname = "x"\ntransport = "local"\nsocket = "/nonexistent.sock"\n')
    for args in (("--config", str(cfg)), ("demo",), ("--config", str(cfg), "console")):
        r = run_cli(*args, timeout_s=20)
        assert r.code == 2, (args, r.stderr)
        assert "the console needs a terminal" in r.stderr
        assert r.stdout == ""


def test_gpuctl_config_env_and_missing_config_messages(tmp_path):
    missing = tmp_path / "none.toml"
    r = run_cli("status", env={"GPUCTL_CONFIG": str(missing)})
    assert r.code == 3
    assert f"no fleet config at {missing} (from $GPUCTL_CONFIG)" in r.stderr
    assert "point GPUCTL_CONFIG (or --config FILE) at one" in r.stderr and "set GPUCTL_CONFIG" not in r.stderr
    r = run_cli("status", env={"GPUCTL_CONFIG": "", "HOME": str(tmp_path)})  # neither: the default path
    assert r.code == 3 and "(from the default path)" in r.stderr and "or set GPUCTL_CONFIG" in r.stderr
    r = run_cli("--config", str(missing), "status")
    assert f"no fleet config at {missing} (from --config)" in r.stderr and "pass --config" not in r.stderr
    r = run_cli("config", "path", "--json", env={"GPUCTL_CONFIG": str(missing)})
    assert r.json == {"path": str(missing), "from": "$GPUCTL_CONFIG", "exists": False}


def test_parser_errors_are_not_prefixed_twice():
    r = run_cli("reassign", "--from", "a", "--to", "b", "--count", "1", "--gpus", "1")
    assert r.code == 2
    assert r.stderr.startswith("gpuctl: reassign: argument --gpus: not allowed with argument --count")


def test_unassigned_slices_cannot_be_leased(fleet):
    cfg, d1, d2 = fleet
    before = daemon_slices(d1.socket_path)
    with d1.client() as c:
        r = c.post("/v1/leases", json={"request_id": "l1", "department": "unassigned", "owner": "a@b",
                                       "slices": 1})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["field"] == "department"
        assert "unassigned slices belong to no department and cannot be leased" in err["message"]
    assert daemon_slices(d1.socket_path) == before


def test_reassign_exit_codes_match_the_readme_table(fleet):
    # Before: --slice bogus exited 2 (USAGE) while README's table says "nothing matched" is 4.
    cfg, d1, d2 = fleet
    before = daemon_slices(d1.socket_path)
    r = run_cli("--config", str(cfg), "--json", "reassign", "--from", "unassigned", "--to", "research",
                "--slice", "bogus/0", "--yes")
    assert r.code == 4, r.stderr
    assert "bogus/0: no such slice in the fleet" in r.stderr and r.json["exit_code"] == 4
    d2.stop()
    for amount in (("--count", "1"), ("--gpus", "1"), ("--slice", "bogus/0")):
        r = run_cli("--config", str(cfg), "reassign", "--from", "unassigned", "--to", "research", *amount,
                    "--node", "n2", "--yes")
        assert r.code == 7, (amount, r.code, r.stderr)  # UNREACHABLE: n2 is down
        assert "n2" in r.stderr
    assert daemon_slices(d1.socket_path) == before


def test_json_error_document_also_for_a_verb_that_returns_a_failing_code(fleet):
    # Before: `release --json` of an unknown lease printed its reason on stderr and nothing on stdout.
    cfg, d1, d2 = fleet
    r = run_cli("--config", str(cfg), "--json", "release", "lease-000000000000")
    assert r.code == 4, r.stderr
    assert r.json == {"error": {"code": 4, "name": "NOTHING_TO_DO",
                                "message": "no lease 'lease-000000000000' on any reachable node"}}
    assert r.stderr == "gpuctl: no lease 'lease-000000000000' on any reachable node\n"
    d2.stop()
    r = run_cli("--config", str(cfg), "--json", "renew", "lease-000000000000")
    assert r.code == 7 and r.json["error"]["name"] == "UNREACHABLE" and "unreachable: n2" in r.json["error"]["message"]
