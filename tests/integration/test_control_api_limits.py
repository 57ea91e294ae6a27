"""gpuctld's control socket under abuse: one peer (its own process) holds idle connections, trickles
requests a byte a second, or sends megabytes of headers, while another peer (this test process)
must still get its answers (median under 0.5 s, none later than PROBE_LIMIT_S: a peer locked out
waits 10 s or more; the speed itself is bench/torture.py's), and the daemon's memory (VmRSS from /proc) must come back
to within 20 % of its baseline. Then each limit on its own, against an in-process server with
small limits: the total request deadline, the first-byte timeout, the header budget, the
per-process connection limit.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from daemon_proc import REPO_ROOT, start_daemon, uds_client
from gpuctl.backends.simulated import SimulatedBackend
from gpuctl.daemon.api import ControlApi
from gpuctl.daemon.server import MAX_CONNECTIONS_PER_PID, serve, serve_in_thread
from gpuctl.daemon.state import NodeStateManager, StateStore
from gpuctl.daemon.telemetry import Sampler

ABUSE_CLIENT = REPO_ROOT / "bench" / "abuse_client.py"


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` in bytes (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def start_abuser(socket_path: Path, mode: str, count: int, duration_s: float, **extra: int) -> subprocess.Popen:
    args = [sys.executable, str(ABUSE_CLIENT), "--socket", str(socket_path), "--mode", mode,
            "--count", str(count), "--duration-s", str(duration_s)]
    for k, v in extra.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def abuser_stats(p: subprocess.Popen) -> dict:
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


#: A probe answered later than this was locked out, not slowed down: a peer shut out waits for a
#: slot, i.e. for the abuser's connections to time out (first byte 10 s, formerly idle 300 s). Below
#: it, a loaded CI machine may still take a second or two for one request (seen: 1.8 s).
PROBE_LIMIT_S = 4.0


def probe(socket_path: Path, n: int) -> list[float]:
    """`n` GET /v1/status requests, each on a fresh connection of this process; their latencies
    (s). A request not answered 200 within PROBE_LIMIT_S fails the test."""
    latencies = []
    for _ in range(n):
        t0 = time.monotonic()
        with uds_client(socket_path, timeout_s=PROBE_LIMIT_S) as c:
            r = c.get("/v1/status")
        latencies.append(time.monotonic() - t0)
        assert r.status_code == 200, r.text
        assert latencies[-1] < PROBE_LIMIT_S
    return latencies


def served(latencies: list[float]) -> bool:
    """Every probe answered within PROBE_LIMIT_S and the typical one promptly (median < 0.5 s)."""
    return max(latencies) < PROBE_LIMIT_S and statistics.median(latencies) < 0.5


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("limits"), gpus=2, seed=5)
    try:
        probe(d.socket_path, 20)  # warm up before any baseline is taken
        yield d
    finally:
        d.stop()


def rss_back_to(pid: int, baseline: int, timeout_s: float = 10.0) -> int:
    """Wait until the RSS of `pid` is within 20 % of `baseline`; the RSS then (fails if never)."""
    deadline = time.monotonic() + timeout_s
    while rss_bytes(pid) > 1.2 * baseline and time.monotonic() < deadline:
        time.sleep(0.2)
    after = rss_bytes(pid)
    assert after <= 1.2 * baseline, (baseline, after)
    return after


def test_idle_connections_of_one_peer_do_not_lock_others_out(daemon):
    # Before: 128 silent connections held every slot for 300 s; 0 of 100 other requests answered.
    baseline = rss_bytes(daemon.pid)
    log_lines_before = daemon.stderr_text().count("refused or closed to make room")
    abuser = start_abuser(daemon.socket_path, "idle", 128, 6.0)
    try:
        time.sleep(1.5)
        latencies = probe(daemon.socket_path, 100)
    finally:
        stats = abuser_stats(abuser)
    assert len(latencies) == 100 and served(latencies), latencies
    assert stats["opened"] >= 128
    # one process may hold 32: the rest of its connections were closed to make room
    assert stats["closed_by_daemon"] >= 128 - MAX_CONNECTIONS_PER_PID
    assert daemon.proc.poll() is None
    # thousands of connections closed to make room, a few log lines (one per 5 s at most, counted)
    assert 1 <= daemon.stderr_text().count("refused or closed to make room") - log_lines_before <= 3
    rss_back_to(daemon.pid, baseline)


def test_slowloris_of_one_peer_does_not_lock_others_out(daemon):
    # Before: 200 connections sending 1 byte/s: 0 of 145 other requests answered.
    baseline = rss_bytes(daemon.pid)
    abuser = start_abuser(daemon.socket_path, "slowloris", 200, 6.0)
    try:
        time.sleep(1.5)
        latencies = probe(daemon.socket_path, 100)
    finally:
        stats = abuser_stats(abuser)
    assert served(latencies), latencies
    assert stats["opened"] >= 200 and stats["closed_by_daemon"] >= 200 - MAX_CONNECTIONS_PER_PID
    rss_back_to(daemon.pid, baseline)


def test_big_headers_are_cut_and_memory_returns_to_baseline(daemon):
    # Before: 100 connections x 6 MB of headers took the daemon to 2.58 GB RSS, 430 MB still held after.
    baseline = rss_bytes(daemon.pid)
    abuser = start_abuser(daemon.socket_path, "headers", 100, 5.0, header_bytes=6_000_000)
    peak = baseline
    latencies: list[float] = []
    try:
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            latencies += probe(daemon.socket_path, 5)
            peak = max(peak, rss_bytes(daemon.pid))
    finally:
        stats = abuser_stats(abuser)
    assert served(latencies) and len(latencies) >= 10, latencies
    assert stats["answers"].get("431", 0) >= 1, stats  # the header budget answered, not a silent drop
    assert peak < baseline + 64 * 1024 * 1024, (baseline, peak)
    rss_back_to(daemon.pid, baseline)
    probe(daemon.socket_path, 5)


# --------------------------------------------------------------------- each limit on its own


@pytest.fixture
def small(tmp_path):
    """An in-process API server with small limits: (server, socket path)."""
    sockdir = Path(tempfile.mkdtemp(prefix="gpuctld-lim", dir="/tmp"))
    backend = SimulatedBackend(gpus=1, seed=3)
    manager = NodeStateManager(StateStore(tmp_path / "state"))
    manager.reconcile(backend.gpus())
    sampler = Sampler(backend, interval_s=1.0)
    sampler.sample_once()
    api = ControlApi(backend_name="simulated", gpus=backend.gpus(), sampler=sampler, state=manager)
    path = sockdir / "api.sock"
    server = serve(api, path)
    server.request_timeout_s = 0.6
    server.first_byte_timeout_s = 0.4
    server.max_header_bytes = 8 * 1024
    server.max_connections_per_pid = 3
    serve_in_thread(server)
    try:
        yield server, path
    finally:
        server.shutdown()
        server.close()
        shutil.rmtree(sockdir, ignore_errors=True)


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(path))
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return out


def _closed_now(s: socket.socket) -> bool:
    """True when the server has closed `s` (end of file waiting), False when it is still open."""
    s.setblocking(False)
    try:
        return s.recv(100) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _answer(out: bytes) -> tuple[int, dict]:
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_request_deadline_is_total_not_per_read(small):
    server, path = small
    s = _connect(path)
    request = b"GET /v1/health HTTP/1.1\r\nX-Slow: " + b"a" * 200
    t0 = time.monotonic()
    try:
        for b in request:  # a byte every 50 ms: every read is quick, the whole request is not
            s.sendall(bytes([b]))
            time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        pass
    out = _read_all(s)
    s.close()
    elapsed = time.monotonic() - t0
    status, body = _answer(out)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert "not whole within 0.6 s of its first byte" in body["error"]["message"]
    assert elapsed < 3.0  # 200+ bytes at 50 ms would take 10 s


def test_a_connection_that_never_speaks_is_closed_after_the_first_byte_timeout(small):
    server, path = small
    s = _connect(path)
    t0 = time.monotonic()
    assert _read_all(s) == b""  # closed quietly, no answer
    assert 0.3 < time.monotonic() - t0 < 4.0  # closed by the server (0.4 s), not left open
    s.close()


def test_headers_over_the_budget_get_431_naming_it(small):
    server, path = small
    s = _connect(path)
    try:
        s.sendall(b"GET /v1/health HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20_000 + b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, body = _answer(_read_all(s))
    s.close()
    assert status == 431 and body["error"]["code"] == "bad_http"
    assert "larger than 8192 bytes" in body["error"]["message"]
    with uds_client(path) as c:
        assert c.get("/v1/health").status_code == 200


def test_a_process_at_its_limit_loses_its_own_oldest_idle_connection(small):
    server, path = small
    held = [_connect(path) for _ in range(3)]
    time.sleep(0.1)
    with uds_client(path) as c:  # a 4th connection of this process: the oldest idle one goes
        assert c.get("/v1/health").status_code == 200
    assert held[0].recv(100) == b""
    for s in held:
        s.close()


def test_a_process_whose_connections_all_run_requests_gets_503(small):
    server, path = small
    release = threading.Event()

    def slow(request):
        release.wait(5)
        return 200, {"slow": True}

    server.api.add_route("GET", "/v1/slow", slow)
    answers: list[int] = []

    def one() -> None:
        with uds_client(path) as c:
            answers.append(c.get("/v1/slow").status_code)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while server.connection_count < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    try:
        with uds_client(path) as c:
            r = c.get("/v1/health")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "too_many_connections"
        assert "already has 3 connections to gpuctld, all running requests" in err["message"]
    finally:
        release.set()
        for t in threads:
            t.join(5)
    assert answers == [200, 200, 200]
    with uds_client(path) as c:
        assert c.get("/v1/health").status_code == 200


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_one_user_cannot_take_another_users_room(small):
    server, path = small
    server.max_connections = 6
    server.max_connections_per_pid = 6
    server.max_connections_per_uid = 3
    server.first_byte_timeout_s = 10.0
    os.chmod(path, 0o666)  # let user nobody connect
    os.chmod(path.parent, 0o755)
    held = [_connect(path) for _ in range(6)]  # root: 6 connections (all the server takes), only 3 stay
    time.sleep(0.2)
    closed = [s for s in held if _closed_now(s)]
    assert closed == held[:3]  # the oldest three were closed to make room for root's own newer ones
    script = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
              "s.sendall(b'GET /v1/health HTTP/1.1\\r\\n\\r\\n'); print(s.recv(200).split()[1].decode())")
    python = "/usr/bin/python3"  # a Python user nobody may run (this venv may live under /root)
    if not os.access(python, os.X_OK):
        pytest.skip("no /usr/bin/python3 for user nobody")
    p = subprocess.run([python, "-c", script, str(path)], user="nobody", capture_output=True, text=True,
                       timeout=20)
    assert p.stdout.strip() == "200", p.stderr  # room left for user nobody: root holds only 3 of 6
    for s in held:
        s.close()
