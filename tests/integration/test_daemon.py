"""gpuctld: the telemetry sampler, the control API in-process, and real daemon processes."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from daemon_proc import start_daemon, uds_client
from waiting import wait_for
from gpuctl.backends.base import GpuBackend
from gpuctl.backends.simulated import SimulatedBackend
from gpuctl.daemon.api import ControlApi
from gpuctl.daemon.server import SocketInUseError, prepare_socket_path, serve, serve_in_thread
from gpuctl.daemon.state import NodeStateManager, StateStore
from gpuctl.daemon.telemetry import RING_SLACK, Sampler
from gpuctl.model import UNASSIGNED, GpuIdentity, GpuSample

# ------------------------------------------------------------------------------------ sampler


class FlakyBackend(GpuBackend):
    """Two GPUs; raises on the rounds listed in `fail_on` (1-based)."""

    name = "flaky"

    def __init__(self, fail_on: set[int]):
        self.calls = 0
        self.fail_on = fail_on

    def gpus(self) -> list[GpuIdentity]:
        return [GpuIdentity(uuid=f"GPU-{i}", index=i, name="x") for i in range(2)]

    def sample(self) -> list[GpuSample]:
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("driver hiccup")
        return [GpuSample(uuid=f"GPU-{i}", timestamp_s=float(self.calls), sm_util_pct=float(self.calls)) for i in range(2)]


def test_sampler_cursor_and_since():
    s = Sampler(FlakyBackend(set()), interval_s=1.0, history_s=10.0)
    assert s.latest() == {} and s.since(0) == (0, [])
    for _ in range(3):
        assert s.sample_once()
    cursor, samples = s.since(0)
    assert cursor == 3 and [x.timestamp_s for x in samples] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    s.sample_once()
    cursor2, new = s.since(cursor, uuid="GPU-1")
    assert cursor2 == 4 and [(x.uuid, x.timestamp_s) for x in new] == [("GPU-1", 4.0)]
    assert s.since(4) == (4, [])
    assert s.latest()["GPU-0"].sm_util_pct == 4.0
    # A cursor from an earlier daemon (beyond ours) gets the whole ring.
    assert len(s.since(99)[1]) == 8


def test_sampler_ring_keeps_history_and_drops_older():
    s = Sampler(FlakyBackend(set()), interval_s=1.0, history_s=10.0)
    assert s.ring.maxlen == 10 + RING_SLACK
    for _ in range(40):
        s.sample_once()
    cursor, samples = s.since(0)
    assert cursor == 40 and len(samples) == 2 * (10 + RING_SLACK)
    assert samples[0].timestamp_s == 40 - (10 + RING_SLACK) + 1


def test_sampler_survives_backend_errors_and_logs_once(caplog):
    s = Sampler(FlakyBackend({2, 3}), interval_s=1.0)
    results = [s.sample_once() for _ in range(4)]
    assert results == [True, False, False, True]
    assert s.failures == 2 and s.last_error is None and s.sequence == 2
    logged = [r for r in caplog.records if "driver hiccup" in r.getMessage()]
    assert len(logged) == 1 and "RuntimeError: driver hiccup" in logged[0].getMessage()


def test_sampler_thread_samples_and_stops():
    s = Sampler(FlakyBackend(set()), interval_s=0.02)
    s.start()
    try:
        deadline = time.monotonic() + 5
        while s.sequence < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        s.stop()
    assert s.sequence >= 3
    n = s.sequence
    time.sleep(0.06)
    assert s.sequence == n  # stopped


def test_sampler_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval_s must be > 0 seconds, got 0"):
        Sampler(FlakyBackend(set()), interval_s=0)


# ------------------------------------------------------------------------------------ API in-process


@pytest.fixture
def sockdir():
    d = Path(tempfile.mkdtemp(prefix="gpuctld-t", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def served(tmp_path, sockdir):
    """An in-process API on a Unix socket: (api, socket path, httpx client)."""
    backend = SimulatedBackend(gpus=2, seed=3)
    manager = NodeStateManager(StateStore(tmp_path / "state"))
    manager.reconcile(backend.gpus())
    sampler = Sampler(backend, interval_s=1.0)
    sampler.sample_once()
    api = ControlApi(backend_name="simulated", gpus=backend.gpus(), sampler=sampler, state=manager, hostname="node-a")
    path = sockdir / "api.sock"
    server = serve(api, path)
    serve_in_thread(server, poll_interval_s=0.02)
    client = uds_client(path)
    try:
        yield api, path, client
    finally:
        client.close()
        server.shutdown()
        server.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path):
        super().__init__("gpuctld", timeout=5)
        self.unix_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.unix_path)


def error_of(r) -> dict:
    body = r.json()
    assert list(body) == ["error"]
    assert set(body["error"]) == {"code", "message", "field"}
    return body["error"]


def test_socket_mode_is_0660_and_removed_on_close(tmp_path, sockdir):
    backend = SimulatedBackend(gpus=1)
    manager = NodeStateManager(StateStore(tmp_path))
    api = ControlApi(backend_name="simulated", gpus=backend.gpus(), sampler=Sampler(backend), state=manager)
    path = sockdir / "m.sock"
    server = serve(api, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660 and stat.S_ISSOCK(os.stat(path).st_mode)
    server.close()
    assert not path.exists()


def test_keep_alive_and_content_length(served):
    _, path, _ = served
    conn = UnixHTTPConnection(path)
    try:
        conn.request("GET", "/v1/health")
        r1 = conn.getresponse()
        body1 = r1.read()
        sock = conn.sock
        conn.request("GET", "/v1/node")
        r2 = conn.getresponse()
        body2 = r2.read()
        assert conn.sock is sock  # same connection: kept alive
        assert int(r1.getheader("Content-Length")) == len(body1)
        assert int(r2.getheader("Content-Length")) == len(body2)
        assert json.loads(body2)["hostname"] == "node-a" and len(json.loads(body2)["gpus"]) == 2
    finally:
        conn.close()


def test_body_over_1_mib_is_refused_with_413(served):
    api, path, client = served
    conn = UnixHTTPConnection(path)
    try:
        conn.putrequest("POST", "/v1/assign")
        conn.putheader("Content-Length", str(2 * 1024 * 1024))
        conn.endheaders()
        r = conn.getresponse()
        body = json.loads(r.read())
        assert r.status == 413 and r.getheader("Connection") == "close"
        assert body["error"]["code"] == "body_too_large"
        assert "the limit is 1048576 bytes" in body["error"]["message"]
    finally:
        conn.close()
    assert client.get("/v1/health").status_code == 200


def test_garbage_request_line_gets_json_400_and_server_goes_on(served):
    _, path, client = served
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(path))
    s.sendall(b"GARBAGE\r\n\r\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["code"] == "bad_http"
    assert client.get("/v1/health").json()["ok"] is True


GOOD_ASSIGN = {"request_id": "r1", "generation": 1, "moves": [{"slice_id": "S", "from": UNASSIGNED, "to": "research"}]}


def _assign(**changes):
    body = json.loads(json.dumps(GOOD_ASSIGN))
    for k, v in changes.items():
        if v is ...:
            body.pop(k)
        else:
            body[k] = v
    return body


@pytest.mark.parametrize(
    "body, status, code, field, message",
    [
        (_assign(request_id=...), 400, "missing_field", "request_id", "request_id is required"),
        (_assign(request_id=5), 400, "invalid_field", "request_id", "request_id must be a string, got 5"),
        (_assign(request_id=" "), 400, "invalid_field", "request_id", "request_id must not be empty"),
        (_assign(generation="1"), 400, "invalid_field", "generation", 'generation must be an integer, got "1"'),
        (_assign(generation=True), 400, "invalid_field", "generation", "generation must be an integer, got true"),
        (_assign(generation=-1), 400, "invalid_field", "generation", "generation must be >= 0"),
        (_assign(moves={}), 400, "invalid_field", "moves", "moves must be a list"),
        (_assign(moves=[]), 400, "invalid_field", "moves", "moves must name at least one slice"),
        (_assign(moves=["x"]), 400, "invalid_field", "moves[0]", "moves[0] must be an object"),
        (_assign(moves=[{"slice_id": "S", "from": "a"}]), 400, "missing_field", "moves[0].to", "moves[0].to is required"),
        (_assign(moves=[{"slice_id": "S", "from": "a", "to": "b", "too": 1}]), 400, "unknown_field", "moves[0].too",
         "moves[0].too is not a field of this request"),
        (_assign(leased="sometimes"), 400, "invalid_field", "leased", "leased must be one of refuse, drain, revoke"),
        (_assign(leassed="drain"), 400, "unknown_field", "leassed", "leassed is not a field of this request"),
    ],
)
def test_assign_validation_names_the_field(served, body, status, code, field, message):
    api, _, client = served
    gen, file_before = api.state.generation, api.state.store.path.read_bytes()
    r = client.post("/v1/assign", json=body)
    err = error_of(r)
    assert (r.status_code, err["code"], err["field"]) == (status, code, field)
    assert message in err["message"]
    assert api.state.generation == gen and api.state.store.path.read_bytes() == file_before


@pytest.mark.parametrize(
    "body, field, message",
    [
        ({"request_id": "s", "generation": 1, "parts": 2}, "gpu_uuid", "gpu_uuid is required"),
        ({"request_id": "s", "generation": 1, "gpu_uuid": "G", "parts": 3}, "parts", "parts must be one of 1, 2, 4, 8, got 3"),
        ({"request_id": "s", "generation": 1, "gpu_uuid": "G", "parts": "2"}, "parts", 'parts must be an integer, got "2"'),
    ],
)
def test_split_validation_names_the_field(served, body, field, message):
    _, _, client = served
    r = client.post("/v1/split", json=body)
    err = error_of(r)
    assert r.status_code == 400 and err["field"] == field and message in err["message"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"request_id": "r1",\n "generation": }', "not valid JSON: Expecting value at line 2 column 16"),
        (b"", "the request body is empty"),
        (b"[1]", "must be a JSON object, not list"),
        (b"\xff", "not UTF-8 (byte 0)"),
    ],
)
def test_bad_json_is_400_naming_line_and_column(served, content, message):
    _, _, client = served
    r = client.post("/v1/assign", content=content)
    err = error_of(r)
    assert r.status_code == 400 and err["code"] == "bad_json" and message in err["message"]
    assert err["field"] is None


def test_unknown_path_method_and_query_errors(served):
    api, _, client = served
    r = client.get("/v1/nope")
    assert r.status_code == 404 and error_of(r) == {"code": "unknown_path", "message": "no such path: /v1/nope", "field": None}
    r = client.delete("/v1/status")
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"
    r = client.get("/v1/telemetry", params={"since": "abc"})
    assert r.status_code == 400 and error_of(r)["field"] == "since" and "'abc'" in error_of(r)["message"]
    r = client.get("/v1/telemetry", params={"uuid": "GPU-nope"})
    assert r.status_code == 404 and error_of(r)["field"] == "uuid"
    r = client.get("/v1/requests/never-seen")
    assert r.status_code == 404 and error_of(r)["code"] == "unknown_request" and "'never-seen'" in error_of(r)["message"]
    assert client.get("/v1/health").status_code == 200


def test_internal_error_is_500_and_server_goes_on(served):
    api, _, client = served

    def broken(request):
        raise ZeroDivisionError("oops")

    api.add_route("GET", "/v1/broken", broken)
    r = client.get("/v1/broken")
    assert r.status_code == 500 and error_of(r)["message"] == "internal error: ZeroDivisionError: oops"
    assert client.get("/v1/health").status_code == 200


def test_status_shows_missing_gpu_and_sampling_error(served):
    api, _, client = served
    api.state.missing_gpus = {"GPU-gone"}
    api.sampler.last_error = "RuntimeError: boom"
    body = client.get("/v1/status").json()
    assert body["missing_gpus"] == ["GPU-gone"]
    gone = body["gpus"][-1]
    assert gone["identity"]["uuid"] == "GPU-gone" and gone["sample"]["error"].startswith("missing:")
    assert (body["error"], body["error_code"]) == ("telemetry sampling failed: RuntimeError: boom", "sampling_failed")


def test_stale_socket_is_removed_but_a_live_one_is_refused(sockdir):
    stale = sockdir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # bound, never listening: nobody answers
    prepare_socket_path(stale)
    assert not stale.exists()

    live = sockdir / "live.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(live))
    listener.listen(1)
    try:
        with pytest.raises(SocketInUseError, match=f"another gpuctld is already answering on {re.escape(str(live))}"):
            prepare_socket_path(live)
        assert live.exists()
    finally:
        listener.close()

    plain = sockdir / "plain"
    plain.write_text("keep me")
    with pytest.raises(SocketInUseError, match="exists and is not a socket"):
        prepare_socket_path(plain)
    assert plain.read_text() == "keep me"


# ------------------------------------------------------------------------------------ real daemons


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("d"), gpus=8, seed=1, interval_s=0.05)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


def test_health_and_status_shape(daemon, client):
    h = client.get("/v1/health").json()
    assert h["ok"] is True and h["backend"] == "simulated" and h["pid"] == daemon.pid
    assert h["version"] and h["uptime_s"] >= 0 and h["hostname"] == socket.gethostname()
    s = client.get("/v1/status").json()
    assert set(s) >= {"hostname", "backend", "generation", "gpus", "leases", "error", "error_code"}
    assert s["error"] is None and s["error_code"] is None and s["leases"] == []
    assert len(s["gpus"]) == 8
    expected_uuids = [g.uuid for g in SimulatedBackend(gpus=8, seed=1).gpus()]
    assert [g["identity"]["uuid"] for g in s["gpus"]] == expected_uuids
    for g in s["gpus"]:
        assert g["sample"] is not None and g["sample"]["uuid"] == g["identity"]["uuid"]
        assert 0 <= g["sample"]["sm_util_pct"] <= 100


def test_fresh_daemon_has_every_gpu_unassigned(tmp_path):
    with start_daemon(tmp_path, gpus=2, seed=4) as d, d.client() as c:
        s = c.get("/v1/status").json()
        assert s["generation"] == 1
        assert [[(x["department"], x["fraction"], x["leased"]) for x in g["slices"]] for g in s["gpus"]] == [
            [(UNASSIGNED, 1.0, False)], [(UNASSIGNED, 1.0, False)]]


def test_telemetry_since_cursor(client):
    t = client.get("/v1/telemetry", params={"since": 0}).json()
    assert t["interval_s"] == 0.05 and t["cursor"] >= 1
    assert len(t["samples"]) == 8 * t["cursor"]  # the ring holds 10 minutes: nothing dropped yet
    time.sleep(0.2)
    uuid = t["samples"][0]["uuid"]
    t2 = client.get("/v1/telemetry", params={"since": t["cursor"], "uuid": uuid}).json()
    assert t2["cursor"] > t["cursor"]
    assert len(t2["samples"]) == t2["cursor"] - t["cursor"]
    assert {s["uuid"] for s in t2["samples"]} == {uuid}
    assert all(s["timestamp_s"] >= t["samples"][-1]["timestamp_s"] for s in t2["samples"])


def test_assign_stale_replay_split_and_request_lookup(daemon, client):
    s = client.get("/v1/slices").json()
    gen = s["generation"]
    sid = sorted(x["id"] for x in s["slices"])[0]
    gpu_uuid = sid.rsplit("/", 1)[0]
    body = {"request_id": "d-assign-1", "generation": gen,
            "moves": [{"slice_id": sid, "from": UNASSIGNED, "to": "research"}]}
    r = client.post("/v1/assign", json=body)
    assert r.status_code == 200
    assert r.json() == {"generation": gen + 1, "moved": [sid], "pending": [], "replayed": False,
                        "moves": body["moves"]}

    # Same generation again under a new request id: stale.
    r = client.post("/v1/assign", json={**body, "request_id": "d-assign-2"})
    err = r.json()["error"]
    assert r.status_code == 409 and err["code"] == "stale_generation" and err["field"] == "generation"
    assert f"based on generation {gen}, the node is at generation {gen + 1}" in err["message"]
    assert err["current_generation"] == gen + 1

    # Replay: recorded answer, nothing changes.
    r = client.post("/v1/assign", json=body)
    assert r.status_code == 200 and r.json() == {"generation": gen + 1, "moved": [sid], "pending": [], "replayed": True,
                                                 "moves": body["moves"]}
    assert client.get("/v1/requests/d-assign-1").json()["moved"] == [sid]

    # Wrong owner names the slice and its real owner.
    r = client.post("/v1/assign", json={**body, "request_id": "d-assign-3", "generation": gen + 1})
    assert r.status_code == 409 and r.json()["error"]["code"] == "wrong_owner"
    assert f"slice {sid} is owned by 'research', not 'unassigned'" in r.json()["error"]["message"]

    r = client.post("/v1/split", json={"request_id": "d-split-1", "generation": gen + 1, "gpu_uuid": gpu_uuid, "parts": 4})
    assert r.status_code == 200
    out = r.json()
    assert out["generation"] == gen + 2
    assert [(x["id"], x["fraction"], x["department"], x["memory_quota_bytes"]) for x in out["slices"]] == [
        (f"{gpu_uuid}/{k}", 0.25, "research", 20 * 1024**3) for k in range(4)]
    status = client.get("/v1/status").json()
    assert status["generation"] == gen + 2
    g = next(x for x in status["gpus"] if x["identity"]["uuid"] == gpu_uuid)
    assert len(g["slices"]) == 4

    r = client.post("/v1/split", json={"request_id": "d-split-2", "generation": gen + 2, "gpu_uuid": "GPU-nope", "parts": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_gpu"
    assert client.get("/v1/slices").json()["generation"] == gen + 2


def test_requests_are_logged_with_peer_uid(daemon, client):
    client.post("/v1/assign", json={"request_id": "log-1", "generation": 0, "moves": [{"slice_id": "x", "from": "a", "to": "b"}]})
    deadline = time.monotonic() + 5
    pattern = rf'uid={os.getuid()} pid=\d+ "POST /v1/assign HTTP/1.1" 409 [\d.]+ms request_id=log-1'
    while not re.search(pattern, daemon.stderr_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert re.search(pattern, daemon.stderr_text())


def test_daemon_keeps_serving_after_bad_requests(daemon, client):
    for content in (b"{", b"[]", b'{"request_id": 1}', b"x" * 10):
        assert client.post("/v1/assign", content=content).status_code == 400
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(daemon.socket_path))
    s.sendall(b"POST /v1/assign HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")  # then hang up mid-body
    s.close()
    assert client.get("/v1/health").json()["pid"] == daemon.pid
    assert daemon.proc.poll() is None


def test_kill9_then_restart_keeps_ownership(tmp_path):
    d = start_daemon(tmp_path, gpus=2, seed=2)
    try:
        with d.client() as c:
            s = c.get("/v1/slices").json()
            sid = sorted(x["id"] for x in s["slices"])[1]
            r = c.post("/v1/assign", json={"request_id": "k1", "generation": s["generation"],
                                           "moves": [{"slice_id": sid, "from": UNASSIGNED, "to": "sales"}]})
            assert r.status_code == 200
        old_pid = d.pid
        d.kill9()
        assert d.socket_path.exists()  # left behind by the crash
        d.restart()
        assert d.pid != old_pid
        with d.client() as c:
            s2 = c.get("/v1/slices").json()
            assert s2["generation"] == s["generation"] + 1
            assert {x["id"]: x["department"] for x in s2["slices"]}[sid] == "sales"
            assert c.get("/v1/requests/k1").json()["replayed"] is True
        assert "removing stale socket file" in d.stderr_text()
        assert d.stop() == 0
        assert not d.socket_path.exists()  # clean shutdown removes it
    finally:
        d.stop()


def test_corrupt_state_file_stops_the_daemon_naming_the_file(tmp_path):
    d = start_daemon(tmp_path, gpus=2, seed=2)
    try:
        d.stop()
        state_file = d.state_file
        good = state_file.read_bytes()
        state_file.write_bytes(good[: len(good) // 3])
        d.start(wait=False)
        assert d.wait_exit() == 3
        err = d.stderr_text()
        assert f"state file {state_file} is unusable: not valid JSON (truncated?)" in err
        assert "--reset-state" in err
        assert state_file.read_bytes() == good[: len(good) // 3]  # untouched
        assert not d.socket_path.exists()

        # --reset-state moves it aside, says so, and starts fresh.
        d.args.append("--reset-state")
        d.start()
        aside = [p for p in d.state_dir.iterdir() if p.name.startswith("state.json.corrupt-")]
        assert len(aside) == 1 and aside[0].read_bytes() == good[: len(good) // 3]
        assert f"moved it to {aside[0]}" in d.stderr_text()
        with d.client() as c:
            assert c.get("/v1/slices").json()["generation"] == 1
        # A good file is never moved aside, even with --reset-state.
        d.restart()
        assert f"the state file {state_file} is fine; kept as it is" in d.stderr_text()
        assert len([p for p in d.state_dir.iterdir() if p.name.startswith("state.json.corrupt-")]) == 1
    finally:
        d.stop()


def test_second_daemon_on_the_same_socket_refuses(daemon, tmp_path):
    other = start_daemon(tmp_path, gpus=1, seed=9, wait=False,
                         extra_args=["--socket", str(daemon.socket_path)])
    try:
        assert other.wait_exit() == 1
        assert f"another gpuctld is already answering on {daemon.socket_path}" in other.stderr_text()
    finally:
        other.stop()
    with uds_client(daemon.socket_path) as c:
        assert c.get("/v1/health").json()["pid"] == daemon.pid


def test_second_daemon_on_the_same_state_dir_refuses(daemon, tmp_path, sockdir):
    other = start_daemon(tmp_path, gpus=1, wait=False,
                         extra_args=["--state-dir", str(daemon.state_dir), "--socket", str(sockdir / "x.sock")])
    try:
        assert other.wait_exit() == 1
        assert f"state directory {daemon.state_dir} is in use by another gpuctld (pid {daemon.pid})" in other.stderr_text()
    finally:
        other.stop()


def test_nvml_backend_that_cannot_start_exits_with_the_reason(tmp_path):
    import subprocess
    import sys

    from daemon_proc import REPO_ROOT

    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    except Exception:
        pass
    sock = Path(tempfile.mkdtemp(prefix="gpuctld-n", dir="/tmp"))
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gpuctl.daemon", "--backend", "auto", "--state-dir", str(tmp_path / "s"),
             "--socket", str(sock / "n.sock")],
            capture_output=True, text=True, timeout=30, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
    finally:
        shutil.rmtree(sock, ignore_errors=True)
    assert p.returncode == 1
    assert "gpuctld: backend auto cannot start:" in p.stderr and "fix:" in p.stderr
    assert "auto never falls back to the simulated backend" in p.stderr


def test_unknown_socket_group_is_refused_and_leaves_no_socket(tmp_path, sockdir):
    backend = SimulatedBackend(gpus=1)
    api = ControlApi(backend_name="simulated", gpus=backend.gpus(), sampler=Sampler(backend),
                     state=NodeStateManager(StateStore(tmp_path)))
    path = sockdir / "g.sock"
    with pytest.raises(ValueError, match=r"no group 'no-such-group-x' on this node for the socket \(create it: groupadd no-such-group-x\)"):
        serve(api, path, group="no-such-group-x")
    assert not path.exists()


def test_unknown_command_is_a_usage_error(capsys):
    from gpuctl.daemon.main import main

    assert main(["frobnicate"]) == 2
    assert "gpuctld: unknown command 'frobnicate': use 'serve' (default) or 'bridge'" in capsys.readouterr().err


def test_daemon_logs_changes_not_polls(tmp_path):
    # Before: every GET /v1/status was an INFO line (one per node per second per console).
    d = start_daemon(tmp_path, gpus=2, seed=5, name="quiet")
    try:
        with uds_client(d.socket_path) as c:
            for _ in range(5):
                assert c.get("/v1/status").status_code == 200
            st = c.get("/v1/status").json()
            sid = st["gpus"][0]["slices"][0]["id"]
            r = c.post("/v1/assign", json={"request_id": "log-1", "generation": st["generation"],
                                            "moves": [{"slice_id": sid, "from": UNASSIGNED, "to": "research"}]})
            assert r.status_code == 200, r.text
            assert c.get("/v1/nothing-here").status_code == 404
        # a request's log line comes after its answer: wait for the last one (the GETs before it
        # would have been logged by then)
        assert wait_for(lambda: '"GET /v1/nothing-here HTTP/1.1" 404 ' in d.stderr_text(), 10), d.stderr_text()
        text = d.stderr_text()
        assert '"GET /v1/status' not in text and '"GET /v1/health' not in text
        assert re.search(r'"POST /v1/assign HTTP/1.1" 200 ', text), text
        assert re.search(r'"GET /v1/nothing-here HTTP/1.1" 404 ', text), text  # a refused read is said
    finally:
        d.stop()
    loud = start_daemon(tmp_path, gpus=1, seed=5, name="loud", extra_args=["--log-level", "debug"])
    try:
        with uds_client(loud.socket_path) as c:
            c.get("/v1/status")
        assert wait_for(lambda: '"GET /v1/status HTTP/1.1" 200 ' in loud.stderr_text(), 10), loud.stderr_text()
    finally:
        loud.stop()


def test_request_log_levels():
    import logging

    from gpuctl.daemon.server import request_log_level

    assert request_log_level("GET /v1/status HTTP/1.1", 200) == logging.DEBUG
    assert request_log_level("HEAD /v1/health HTTP/1.1", 200) == logging.DEBUG
    assert request_log_level("POST /v1/leases/lease-1/heartbeat HTTP/1.1", 200) == logging.DEBUG
    assert request_log_level("POST /v1/leases/lease-1/heartbeat HTTP/1.1", 410) == logging.INFO  # lease gone: said
    assert request_log_level("GET /v1/status HTTP/1.1", 400) == logging.INFO
    assert request_log_level("POST /v1/assign HTTP/1.1", 200) == logging.INFO
    assert request_log_level("DELETE /v1/leases/lease-1 HTTP/1.1", 200) == logging.INFO
    assert request_log_level("-", 400) == logging.INFO
