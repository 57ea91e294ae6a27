"""Issue 15 item 1: each node's deadline counts from its own request's start in the fan-out."""

from __future__ import annotations

import threading
import time


from daemon_proc import start_daemon
from delay_proxy import DelayProxy
from fleet_fixtures import run_cli

from gpuctl.fleet.client import FleetClient, NodeError
from gpuctl.config import FleetConfig, Location, NodeConfig


def _local(name: str, sock: str, timeout_s: float = 5.0) -> NodeConfig:
    return NodeConfig(name=name, host=None, transport="local", socket=sock, timeout_s=timeout_s,
                      source=Location("test", 0))


def _fleet(nodes, max_parallel):
    cfg = FleetConfig(path="mem.toml", nodes=tuple(nodes), departments=(), max_parallel=max_parallel)
    return FleetClient(cfg, transport_factory=lambda n: None)


def test_a_stuck_call_frees_its_place_at_its_own_deadline():
    # one place (max_parallel 1): the stuck node's call never returns in time, the others still run
    release = threading.Event()
    nodes = [_local("stuck", "/x", timeout_s=0.3), _local("a", "/x", 5.0), _local("b", "/x", 5.0)]
    fleet = _fleet(nodes, max_parallel=1)
    started: dict[str, float] = {}

    def call(client):
        started[client.name] = time.monotonic()
        if client.name == "stuck":
            release.wait(10)
            return "late"
        if client.name == "a":
            raise NodeError("a", "node a: refused for its own reason", code="wrong_owner", status=409)
        return client.name

    try:
        t0 = time.monotonic()
        res = fleet.fan_out(call)
        elapsed = time.monotonic() - t0
        assert res.values == {"b": "b"}
        assert str(res.errors["stuck"]) == "node stuck: no answer within 0.3 s"
        assert res.errors["stuck"].code == "timeout"
        assert str(res.errors["a"]) == "node a: refused for its own reason"
        assert res.errors["a"].code == "wrong_owner"
        # "a" started once stuck's own deadline (0.3 s + slack 1 s) passed, not before
        assert 1.2 <= started["a"] - t0 <= 2.0
        assert elapsed < 2.5
        # the stuck node is still running: the next fan-out reports it busy, others are asked again
        res2 = fleet.fan_out(call, ["stuck", "b"])
        assert res2.values == {"b": "b"}
        assert "still busy with the previous request" in str(res2.errors["stuck"])
    finally:
        release.set()
        fleet.close()


def test_queued_nodes_get_their_whole_timeout(tmp_path):
    # 6 nodes answering in 0.6 s with timeout 1 s, one at a time: the old batch deadline
    # (max timeout + 1 s = 2 s for everybody) timed out the last three without asking them
    with start_daemon(tmp_path, gpus=1) as d, DelayProxy(d.socket_path, delay_s=0.6) as proxy:
        nodes = [_local(f"n{i}", proxy.listen(tmp_path / f"n{i}.sock"), timeout_s=1.0) for i in range(6)]
        fleet = FleetClient(FleetConfig(path="mem.toml", nodes=tuple(nodes), departments=(), max_parallel=1))
        try:
            t0 = time.monotonic()
            snap = fleet.snapshot()
            elapsed = time.monotonic() - t0
        finally:
            fleet.close()
        assert [(n.name, n.reachable, n.error) for n in snap.nodes] == [(f"n{i}", True, None) for i in range(6)]
        assert all(len(n.gpus) == 1 for n in snap.nodes)
        assert 3.6 <= elapsed < 6.0, elapsed
        assert proxy.requests_delayed >= 6


def test_a_slow_node_over_its_timeout_is_reported_for_its_own_reason(tmp_path):
    with start_daemon(tmp_path, gpus=1) as d, DelayProxy(d.socket_path, delay_s=0.3) as proxy:
        nodes = [_local("slow", proxy.listen(tmp_path / "slow.sock", delay_s=3.0), timeout_s=1.0)]
        nodes += [_local(f"n{i}", proxy.listen(tmp_path / f"n{i}.sock"), timeout_s=1.0) for i in range(4)]
        fleet = FleetClient(FleetConfig(path="mem.toml", nodes=tuple(nodes), departments=(), max_parallel=2))
        try:
            snap = fleet.snapshot()
        finally:
            fleet.close()
        by = {n.name: n for n in snap.nodes}
        assert not by["slow"].reachable and by["slow"].error_code == "timeout"
        assert by["slow"].error.startswith("node slow: timed out after 1 s")
        assert [by[f"n{i}"].reachable for i in range(4)] == [True] * 4


def test_status_json_48_nodes_answering_in_2_5_s_all_reachable(tmp_path):
    # the "done when": 48 nodes that each answer in 2.5 s (timeout 5 s, 16 at a time)
    with start_daemon(tmp_path, gpus=2) as d, DelayProxy(d.socket_path, delay_s=2.5) as proxy:
        lines = ["max_parallel = 16", ""]
        for i in range(48):
            sock = proxy.listen(tmp_path / f"n{i:02d}.sock")
            lines += ["[[node]]", f'name = "n{i:02d}"', 'transport = "local"', f'socket = "{sock}"',
                      "timeout_s = 5.0", ""]
        (tmp_path / "fleet.toml").write_text("\n".join(lines))
        t0 = time.monotonic()
        r = run_cli("--config", str(tmp_path / "fleet.toml"), "status", "--json", timeout_s=90)
        elapsed = time.monotonic() - t0
        assert r.code == 0, r.stderr
        nodes = r.json["nodes"]
        assert [n["name"] for n in nodes] == [f"n{i:02d}" for i in range(48)]
        assert all(n["reachable"] for n in nodes), [n["error"] for n in nodes if not n["reachable"]]
        assert all(len(n["gpus"]) == 2 for n in nodes)
        assert r.stderr == ""
        assert elapsed >= 3 * 2.5  # three rounds of 16: every node was really held 2.5 s
