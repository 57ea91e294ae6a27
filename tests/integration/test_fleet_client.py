"""FleetClient fan-out: a slow or dead node is reported with its reason and never delays the others."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from daemon_proc import start_daemon
from gpuctl.fleet.client import FleetClient, NodeError
from gpuctl.config import DepartmentConfig, FleetConfig, Location, NodeConfig
from gpuctl.fleet.reassign import ReassignRequest, execute, prepare
from gpuctl.exit_codes import ExitCode


def _local(name: str, sock: str, timeout_s: float = 5.0) -> NodeConfig:
    return NodeConfig(name=name, host=None, transport="local", socket=sock, timeout_s=timeout_s,
                      source=Location("test", 0))


class SilentSocket:
    """A Unix socket that accepts connections and never answers (a hung daemon)."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.conns: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                c, _ = self.sock.accept()
                self.conns.append(c)
            except OSError:
                continue

    def close(self):
        self._stop = True
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def two_good(tmp_path):
    d1 = start_daemon(tmp_path, gpus=2, seed=31, name="g1")
    d2 = start_daemon(tmp_path, gpus=2, seed=32, name="g2")
    try:
        yield d1, d2
    finally:
        d1.stop()
        d2.stop()


def test_hung_node_times_out_without_delaying_others(tmp_path, two_good):
    d1, d2 = two_good
    hung = SilentSocket(tmp_path / "hung.sock")
    cfg = FleetConfig(path=str(tmp_path / "f.toml"), nodes=(
        _local("g1", str(d1.socket_path)), _local("hung", str(hung.path), timeout_s=1.0),
        _local("g2", str(d2.socket_path)), _local("gone", str(tmp_path / "nothing.sock"))),
        departments=())
    fleet = FleetClient(cfg)
    try:
        t0 = time.monotonic()
        snap = fleet.snapshot()
        elapsed = time.monotonic() - t0
        assert [n.name for n in snap.nodes] == ["g1", "hung", "g2", "gone"]
        g1, h, g2, gone = snap.nodes
        assert g1.reachable and len(g1.gpus) == 2 and g2.reachable and len(g2.gpus) == 2
        assert not h.reachable and h.error_code == "timeout" and "hung" in h.error
        assert not gone.reachable and "gone" in gone.error and gone.error_code != "timeout"
        assert elapsed < 4.0, f"one hung node (timeout 1 s) delayed the snapshot {elapsed:.1f} s"
    finally:
        fleet.close()
        hung.close()


def test_stale_generation_between_plan_and_execute_is_a_conflict(tmp_path, two_good):
    """Another admin changes the node after our snapshot: the daemon refuses, nothing is merged."""
    d1, d2 = two_good
    cfg = FleetConfig(path="f.toml", nodes=(_local("g1", str(d1.socket_path)),),
                      departments=(DepartmentConfig("research", source=Location("t", 0)),))
    fleet = FleetClient(cfg)
    try:
        plan = prepare(fleet, ReassignRequest("unassigned", "research", count=1))
        # the other admin: a split bumps the generation
        with d1.client() as c:
            st = c.get("/v1/status").json()
            other = [g for g in st["gpus"] if g["slices"][0]["id"] != plan.moves[0].slice_id][0]
            assert c.post("/v1/split", json={"request_id": "other", "generation": st["generation"],
                                             "gpu_uuid": other["identity"]["uuid"], "parts": 2}).status_code == 200
            before = c.get("/v1/slices").json()["slices"]
        result = execute(fleet, plan)
        assert result.moved == []
        (moves, err), = result.failed.values()
        assert isinstance(err, NodeError) and err.code == "stale_generation"
        assert "generation" in str(err)
        assert result.exit_code == ExitCode.CONFLICT
        with d1.client() as c:
            assert c.get("/v1/slices").json()["slices"] == before
    finally:
        fleet.close()
