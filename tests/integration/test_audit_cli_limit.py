"""`gpuctl audit --limit N` against two real simulated gpuctld: each node's newest N records, the
same as the tail of each node's whole log; a bad --limit is refused before any node is asked."""

from __future__ import annotations

from fleet_fixtures import local_fleet, run_cli


def _move(cfg, dept_from: str, dept_to: str) -> None:
    r = run_cli("reassign", "--from", dept_from, "--to", dept_to, "--count", "4", "--yes", "--config", str(cfg))
    assert r.code == 0, r.stderr


def test_limit_gives_each_nodes_newest_records(tmp_path):
    with local_fleet(tmp_path, {"n1": 11, "n2": 12}, gpus=2) as (cfg, _daemons):
        _move(cfg, "unassigned", "research")
        _move(cfg, "research", "training")
        _move(cfg, "training", "unassigned")
        full = run_cli("audit", "--json", "--config", str(cfg))
        assert full.code == 0, full.stderr
        by_node = {n: [r for r in full.json["records"] if r["node_name"] == n] for n in ("n1", "n2")}
        assert all(len(recs) > 3 for recs in by_node.values()), {n: len(r) for n, r in by_node.items()}

        some = run_cli("audit", "--json", "--limit", "3", "--config", str(cfg))
        assert some.code == 0, some.stderr
        for node, recs in by_node.items():
            assert [r for r in some.json["records"] if r["node_name"] == node] == recs[-3:]
        assert "only its newest records were sent" in some.stderr  # said, never silent

        one = run_cli("audit", "--json", "--limit", "1", "--node", "n2", "--config", str(cfg))
        assert one.code == 0 and one.json["records"] == by_node["n2"][-1:]


def test_bad_limit_is_a_usage_error_and_asks_no_node(tmp_path):
    with local_fleet(tmp_path, {"n1": 11}, gpus=1, extra_args=["--log-level", "debug"]) as (cfg, (d1,)):
        before = d1.log_path.read_text()
        for bad in ("0", "-1", "20001", "ten"):
            r = run_cli("audit", "--limit", bad, "--config", str(cfg))
            assert r.code == 2, (bad, r.stderr)
            assert f"argument --limit: must be a whole number from 1 to 20000, got '{bad}'" in r.stderr
            assert r.stdout == ""
            j = run_cli("audit", "--json", "--limit", bad, "--config", str(cfg))
            assert j.code == 2 and j.json["error"]["message"] == f"audit: argument --limit: must be a whole number from 1 to 20000, got {bad!r}"
        assert "/v1/audit" not in d1.log_path.read_text()[len(before):]
        assert run_cli("audit", "--limit", "5", "--config", str(cfg)).code == 0
        assert "/v1/audit" in d1.log_path.read_text()[len(before):]  # the check above can fail


def test_unreadable_lines_past_a_nodes_hundred_are_counted_not_lost(tmp_path):
    with local_fleet(tmp_path, {"n1": 11}, gpus=1) as (cfg, (d1,)):
        (d1.state_dir / "audit.log.1").write_bytes(b"\xff\xfe not a record\n" * 250)
        r = run_cli("audit", "--json", "--config", str(cfg))
        assert r.code == 0, r.stderr
        assert len(r.json["problems"]) == 100 and r.json["problems_omitted"] == {"n1": 150}
        assert "node n1: 150 more unreadable audit line(s) not listed" in r.stderr
        plain = run_cli("audit", "--config", str(cfg))
        assert "node n1: 150 more unreadable audit line(s) not listed" in plain.stderr
        assert (d1.state_dir / "audit.log.1").read_bytes() == b"\xff\xfe not a record\n" * 250  # untouched
