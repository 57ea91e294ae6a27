"""Adversarial input to gpuctld's control API: malformed HTTP, hostile JSON, hostile strings, slow
and many clients. Every bad request must get a clear 4xx naming the field, change nothing (state
file bytes and generation), and leave the daemon serving everyone else.

Most tests talk to one real `gpuctld --backend simulated` process over raw sockets; the timeout and
connection-cap tests use an in-process server with small limits so they stay fast.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from daemon_proc import start_daemon, uds_client
from gpuctl.backends.simulated import SimulatedBackend
from gpuctl.daemon.api import ControlApi
from gpuctl.daemon.server import serve, serve_in_thread
from gpuctl.daemon.state import NodeStateManager, StateStore
from gpuctl.daemon.telemetry import Sampler


# --------------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("badinput"), gpus=4)
    try:
        yield d
    finally:
        d.stop()


def raw(path: Path, data: bytes, *, half_close: bool = True, timeout_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes (or `timeout_s`)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    s.connect(str(path))
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def parse_answer(out: bytes) -> tuple[int, dict]:
    """(status, JSON body) of the first HTTP answer in `out`."""
    head, sep, rest = out.partition(b"\r\n\r\n")
    assert sep, f"no HTTP answer: {out[:200]!r}"
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
    assert m, f"no status line: {head[:200]!r}"
    length = int(re.search(rb"(?im)^content-length: (\d+)", head).group(1))
    return int(m.group(1)), json.loads(rest[:length])


def post(path: Path, target: str, body: bytes | str) -> tuple[int, dict]:
    body = body.encode() if isinstance(body, str) else body
    head = f"POST {target} HTTP/1.1\r\nHost: gpuctld\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    return parse_answer(raw(path, head + body))


class Unchanged:
    """Asserts that the state file's bytes and the generation did not change inside the block."""

    def __init__(self, d):
        self.d = d

    def __enter__(self):
        self.before = hashlib.sha256(self.d.state_file.read_bytes()).hexdigest()
        with self.d.client() as c:
            self.generation = c.get("/v1/slices").json()["generation"]
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            assert hashlib.sha256(self.d.state_file.read_bytes()).hexdigest() == self.before, "state file changed"
            with self.d.client() as c:
                assert c.get("/v1/slices").json()["generation"] == self.generation
                assert c.get("/v1/health").status_code == 200  # still serving


def slices(d) -> tuple[int, list[dict]]:
    with d.client() as c:
        body = c.get("/v1/slices").json()
    return body["generation"], body["slices"]


def assign_body(d, **changes) -> dict:
    gen, ss = slices(d)
    idle = next(s for s in ss if s["department"] == "unassigned")
    body = {"request_id": "adv-1", "generation": gen,
            "moves": [{"slice_id": idle["id"], "from": "unassigned", "to": "research"}]}
    body.update(changes)
    return body


# ------------------------------------------------------------------------------- JSON that breaks


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a":' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
    ('{"request_id": "x", "generation": ' + "9" * 5000 + ', "moves": []}', "number"),
    ('{"request_id": "x", "generation": NaN, "moves": []}', "NaN"),
    ('{"request_id": "x", "generation": -Infinity, "moves": []}', "-Infinity"),
], ids=["deep-list", "deep-object", "5000-digits", "NaN", "-Infinity"])  # short ids: PYTEST_CURRENT_TEST is in the daemon's env
def test_hostile_json_is_400_bad_json_not_500(daemon, text, words):
    with Unchanged(daemon):
        status, body = post(daemon.socket_path, "/v1/assign", text)
    assert status == 400, body
    assert body["error"]["code"] == "bad_json"
    assert words in body["error"]["message"]


@pytest.mark.parametrize("template, field", [
    ('{{"request_id": "\\ud800", "generation": {gen}, "moves": [{{"slice_id": "{sid}", "from": "unassigned", "to": "x"}}]}}',
     "request_id"),
    ('{{"request_id": "sur", "generation": {gen}, "moves": [{{"slice_id": "{sid}", "from": "unassigned", "to": "\\udc00"}}]}}',
     "moves[0].to"),
])
def test_lone_surrogates_are_refused_naming_the_field(daemon, template, field):
    gen, ss = slices(daemon)
    with Unchanged(daemon):
        status, body = post(daemon.socket_path, "/v1/assign", template.format(gen=gen, sid=ss[0]["id"]))
    assert status == 400, body
    assert body["error"]["field"] == field
    assert "printable" in body["error"]["message"]


def test_lone_surrogate_in_a_key_still_gets_an_answer(daemon):
    # Before: the unknown_field message held the raw surrogate, encoding the answer failed and the
    # connection was dropped with no answer at all.
    with Unchanged(daemon):
        status, body = post(daemon.socket_path, "/v1/assign", '{"\\ud800": 1}')
    assert status == 400
    assert body["error"]["code"] == "unknown_field"


# ------------------------------------------------------------------------------ hostile strings


@pytest.mark.parametrize("change, field, words", [
    ({"request_id": "a\nb"}, "request_id", "printable"),
    ({"request_id": "a\x00b"}, "request_id", "printable"),
    ({"request_id": " padded"}, "request_id", "spaces"),
    ("to", "moves[0].to", "printable"),
    ("to_spaces", "moves[0].to", "spaces"),
    ("to_long", "moves[0].to", "longer than"),
    ("to_bidi", "moves[0].to", "printable"),
    ("to_same", "moves[0].to", "already"),
    ("to_unassigned_case", "moves[0].to", "reserved"),
    ("slice_ctrl", "moves[0].slice_id", "printable"),
    ({"generation": 2**63}, "generation", "<="),
])
def test_hostile_strings_and_numbers_are_refused_naming_the_field(daemon, change, field, words):
    body = assign_body(daemon)
    move = body["moves"][0]
    if isinstance(change, dict):
        body.update(change)
    elif change == "to":
        move["to"] = "ev\x1b[31mil"
    elif change == "to_spaces":
        move["to"] = " research"
    elif change == "to_long":
        move["to"] = "x" * 100_000
    elif change == "to_bidi":
        move["to"] = "research\u202etxt.exe"
    elif change == "to_same":
        move["to"] = "unassigned"
    elif change == "to_unassigned_case":
        move["to"] = "Unassigned"
    elif change == "slice_ctrl":
        move["slice_id"] = move["slice_id"] + "\r\n"
    with Unchanged(daemon):
        status, answer = post(daemon.socket_path, "/v1/assign", json.dumps(body))
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_field"
    assert answer["error"]["field"] == field
    assert words in answer["error"]["message"]


def test_lease_grant_strings_are_checked_too(daemon):
    body = {"request_id": "lease-adv", "department": "research", "owner": "eve@host\x1b]0;pwned\x07", "slices": 1}
    with Unchanged(daemon):
        status, answer = post(daemon.socket_path, "/v1/leases", json.dumps(body))
    assert status == 400, answer
    assert answer["error"]["field"] == "owner"
    assert "printable" in answer["error"]["message"]


def test_split_of_a_gpu_that_does_not_exist_or_looks_like_a_path(daemon):
    gen, _ = slices(daemon)
    for uuid, status_code, field in [("GPU-nope", 404, "gpu_uuid"), ("../../etc/passwd", 404, "gpu_uuid")]:
        with Unchanged(daemon):
            status, body = post(daemon.socket_path, "/v1/split", json.dumps(
                {"request_id": "split-adv", "generation": gen, "gpu_uuid": uuid, "parts": 2}))
        assert (status, body["error"]["field"]) == (status_code, field)
        assert repr(uuid) in body["error"]["message"]


def test_good_assign_after_the_barrage_still_works(daemon):
    body = assign_body(daemon, request_id="adv-good")
    status, answer = post(daemon.socket_path, "/v1/assign", json.dumps(body))
    assert status == 200, answer
    assert answer["moved"] == [body["moves"][0]["slice_id"]]


# ------------------------------------------------------------------------------------ bad HTTP


@pytest.mark.parametrize("length_header", [
    b"Content-Length: +2\r\n",
    b"Content-Length: 0_2\r\n",
    b"Content-Length: 2\r\nContent-Length: 50\r\n",
    b"Content-Length: 0x2\r\n",
])
def test_odd_content_length_is_refused(daemon, length_header):
    with Unchanged(daemon):
        out = raw(daemon.socket_path, b"POST /v1/assign HTTP/1.1\r\n" + length_header + b"\r\n{}")
    status, body = parse_answer(out)
    assert status == 400
    assert body["error"]["code"] == "bad_http"
    assert "Content-Length" in body["error"]["message"]


def test_body_shorter_than_content_length_gets_an_answer(daemon):
    with Unchanged(daemon):
        out = raw(daemon.socket_path, b"POST /v1/assign HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}")
    status, body = parse_answer(out)
    assert status == 400
    assert "ended after 2 of 100 bytes" in body["error"]["message"]


def test_http_0_9_request_gets_a_status_line(daemon):
    status, body = parse_answer(raw(daemon.socket_path, b"GET /v1/health\r\n"))
    assert status == 400
    assert "HTTP/0.9" in body["error"]["message"]


@pytest.mark.parametrize("since", ["%D9%A2", "1_0", "%201", "%2B1"])
def test_telemetry_since_must_be_plain_ascii_digits(daemon, since):
    status, body = parse_answer(raw(daemon.socket_path, f"GET /v1/telemetry?since={since} HTTP/1.1\r\n\r\n".encode()))
    assert status == 400
    assert body["error"]["field"] == "since"
    assert repr(urllib.parse.unquote(since)) in body["error"]["message"]


def test_control_characters_in_the_request_line_are_escaped_in_the_log(daemon):
    raw(daemon.socket_path, b"GET /v1/nope\x1b[2J\x1b]0;x\x07 HTTP/1.1\r\n\r\n")
    time.sleep(0.05)
    log = daemon.stderr_text()
    assert "\x1b" not in log and "\x07" not in log
    assert "/v1/nope\\x1b[2J" in log


# ---------------------------------------------------------------------- slow and many clients


def test_a_stalled_half_request_does_not_block_others(daemon):
    stalled = []
    try:
        for _ in range(50):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(daemon.socket_path))
            s.sendall(b'POST /v1/assign HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"req')
            stalled.append(s)
        t0 = time.monotonic()
        with daemon.client(timeout_s=5.0) as c:
            assert c.get("/v1/status").status_code == 200
        assert time.monotonic() - t0 < 5.0  # blocked would be 30 s (the whole-request deadline)
    finally:
        for s in stalled:
            s.close()


def test_concurrent_assigns_on_one_generation_exactly_one_wins(daemon):
    gen, ss = slices(daemon)
    idle = next(s for s in ss if s["department"] == "unassigned")
    results: list[int] = []
    lock = threading.Lock()

    def one(k: int) -> None:
        body = {"request_id": f"race-{k}", "generation": gen,
                "moves": [{"slice_id": idle["id"], "from": "unassigned", "to": f"dept{k}"}]}
        status, _ = post(daemon.socket_path, "/v1/assign", json.dumps(body))
        with lock:
            results.append(status)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == [200] + [409] * 23
    assert slices(daemon)[0] == gen + 1


@pytest.fixture
def small_server(tmp_path):
    """An in-process API with a 0.5 s request timeout and at most 4 connections."""
    sockdir = Path(tempfile.mkdtemp(prefix="gpuctld-adv", dir="/tmp"))
    backend = SimulatedBackend(gpus=1, seed=3)
    manager = NodeStateManager(StateStore(tmp_path / "state"))
    manager.reconcile(backend.gpus())
    sampler = Sampler(backend, interval_s=1.0)
    sampler.sample_once()
    api = ControlApi(backend_name="simulated", gpus=backend.gpus(), sampler=sampler, state=manager)
    path = sockdir / "api.sock"
    server = serve(api, path)
    server.request_timeout_s = 0.5
    server.idle_timeout_s = 1.0
    server.max_connections = 4
    serve_in_thread(server, poll_interval_s=0.02)
    try:
        yield server, path
    finally:
        server.shutdown()
        server.close()
        shutil.rmtree(sockdir, ignore_errors=True)


def test_a_stalled_request_is_answered_408_and_closed(small_server):
    server, path = small_server
    t0 = time.monotonic()
    out = raw(path, b"POST /v1/assign HTTP/1.1\r\nContent-Length: 10\r\n\r\n{", half_close=False, timeout_s=5)
    elapsed = time.monotonic() - t0
    status, body = parse_answer(out)
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert 0.4 < elapsed < 3.0


def test_an_idle_keep_alive_connection_is_closed_quietly(small_server):
    server, path = small_server
    t0 = time.monotonic()
    out = raw(path, b"GET /v1/health HTTP/1.1\r\n\r\n", half_close=False, timeout_s=5)
    elapsed = time.monotonic() - t0
    status, body = parse_answer(out)
    assert status == 200 and body["ok"] is True
    assert out.count(b"HTTP/1.1") == 1  # no 408 after an idle wait: just closed
    assert 0.9 < elapsed < 3.0


def test_connections_over_the_cap_get_503_and_others_recover(small_server):
    server, path = small_server
    held = []
    try:
        for _ in range(4):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))
            held.append(s)
        time.sleep(0.1)
        status, body = parse_answer(raw(path, b"GET /v1/health HTTP/1.1\r\n\r\n"))
        assert status == 503
        assert body["error"]["code"] == "too_many_connections"
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    with uds_client(path) as c:
        assert c.get("/v1/health").status_code == 200
