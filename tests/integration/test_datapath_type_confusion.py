"""Authenticated but type-confused data-path frames (issue 7 item 3): every field of a BATCH of the
wrong type (an op name that is a list or an object, a GET of an int, a buffer dtype given as a
list...) gets an answer, a REPLY naming the op or an ERROR frame, and the session goes on; the
worker never ends a connection thread with a traceback, and its stderr grows by a bounded number
of lines however many connections a peer refuses to complete.

The property test is the frame fuzzer of tests/test_datapath_worker.py
(test_random_bytes_after_handshake_never_hurt_others) extended from random bytes to well-framed
frames whose fields have random JSON types.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctl.datapath.protocol import (
    FLAG_SYNC,
    FrameType,
    encode_meta,
    hello_meta,
    pack_header,
    recv_header,
    recv_meta,
    send_frame,
)
from gpuctl.datapath.session import PeerLog
from gpuctl.datapath.testing import running_worker
from gpuctl.remote._connection import parse_attach


@pytest.fixture(scope="module")
def worker():
    with running_worker() as (handle, url):
        yield handle, url


def _session(url: str) -> socket.socket:
    spec = parse_attach(url)
    s = socket.create_connection((spec.host, spec.port), timeout=10)
    send_frame(s, FrameType.HELLO, hello_meta(spec.lease_id), [memoryview(spec.token)])
    hdr = recv_header(s)
    assert hdr.ftype == FrameType.WELCOME
    recv_meta(s, hdr)
    return s


def _ask(s: socket.socket, meta: dict, payload: bytes = b"") -> tuple[FrameType, dict]:
    """Send one SYNC BATCH; the answer's frame type and metadata (its payload is read and dropped)."""
    m = encode_meta(meta)
    s.sendall(pack_header(FrameType.BATCH, len(m), len(payload), FLAG_SYNC) + m + payload)
    hdr = recv_header(s)
    answer = recv_meta(s, hdr)
    if hdr.payload_len:
        s.recv(hdr.payload_len, socket.MSG_WAITALL)
    return hdr.ftype, answer


def _still_served(s: socket.socket) -> None:
    ftype, answer = _ask(s, {"ops": [["zeros", [1_000_000], [[2]]], ["get", [], [{"h": 1_000_000}]],
                                     ["free", [], [{"h": 1_000_000}]]]})
    assert ftype == FrameType.REPLY and answer["error"] is None, answer
    assert answer["results"] == [{"shape": [2], "dtype": "float64", "nbytes": 16}]


def _stderr(handle) -> str:
    return (Path(handle.run_dir) / "stderr.log").read_text(errors="replace")


@pytest.mark.parametrize("meta, frame, words", [
    ({"ops": [[["add"], [1], []]]}, FrameType.REPLY, "the op name must be a string, got list"),
    ({"ops": [[{"n": "add"}, [], []]]}, FrameType.REPLY, "the op name must be a string, got dict"),
    ({"ops": [[7, [], []], ["mem", [], []]]}, FrameType.REPLY, "the op name must be a string, got int"),
    ({"ops": [["get", [], [5]]]}, FrameType.REPLY, "get takes one handle, got (5)"),
    ({"ops": [["meta", [], ["x"]]]}, FrameType.REPLY, "meta takes one handle"),
    ({"ops": [["get", [], [[1, 2]]]]}, FrameType.REPLY, "get takes one handle"),
    ({"ops": [["free", [], [3]]]}, FrameType.REPLY, "free takes handles, got 3"),
    ({"ops": [["upload", [1], [[0]]]]}, FrameType.REPLY, "buffer index"),
    ({"ops": [["zeros", {"a": 1}, [[2]]]]}, FrameType.REPLY, "outs must be a list"),
    ({"ops": [["zeros", [1], "2"]]}, FrameType.REPLY, "args must be a list"),
    ({"ops": [["zeros", [1], [[2]], [1]]]}, FrameType.REPLY, "kwargs an object"),
    ({"ops": {"add": 1}}, FrameType.ERROR, "meta.ops: must be a list"),
    ({"ops": [], "bufs": [[["float32"], [2]]]}, FrameType.ERROR, "meta.bufs[0]: expected [dtype, [dims...]]"),
    ({"ops": [], "bufs": [[{"d": "float32"}, [2]]]}, FrameType.ERROR, "meta.bufs[0]: expected"),
    ({"ops": [], "bufs": [["float32", {"n": 2}]]}, FrameType.ERROR, "meta.bufs[0]: expected"),
    ({"ops": [], "bufs": [["float32", [2.0]]]}, FrameType.ERROR, "meta.bufs[0]: expected"),
    ({"ops": [], "bufs": "float32"}, FrameType.ERROR, "meta.bufs: must be a list"),
], ids=["name-list", "name-dict", "name-int", "get-int", "meta-str", "get-list", "free-int", "upload-list",
        "outs-dict", "args-str", "kwargs-list", "ops-dict", "dtype-list", "dtype-dict", "dims-dict", "dims-float",
        "bufs-str"])
def test_type_confused_field_is_answered_and_the_session_goes_on(worker, meta, frame, words):
    # Before: name-list/name-dict raised TypeError (unhashable) inside the error handler, get-int an
    # AttributeError in the reply, dtype-list a TypeError in the buffer check: the connection thread
    # died with a traceback and no ERROR frame.
    handle, url = worker
    s = _session(url)
    try:
        ftype, answer = _ask(s, meta)
        assert ftype == frame, answer
        text = answer["error"]["message"] if frame == FrameType.REPLY else answer["message"]
        assert words in text
        if frame == FrameType.REPLY:
            assert text.startswith("op #")
        else:
            assert answer["code"] in ("bad_meta", "oversized")
        _still_served(s)
    finally:
        s.close()
    assert "Traceback" not in _stderr(handle)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)
_names = st.sampled_from(["get", "meta", "mem", "stats", "sync", "free", "upload", "rawkernel", "add", "zeros",
                          "reshape", "getitem", "nope"]) | _json
_handles = st.lists(st.integers(0, 4) | _json, max_size=3)
_op = st.one_of(
    st.tuples(_names, _handles, st.lists(st.just({"h": 1}) | _json, max_size=3)).map(list),
    st.tuples(_names, _handles, _json, _json).map(list),
    _json,
)
_buf = st.one_of(st.tuples(st.sampled_from(["float32", "int8"]) | _json, st.lists(st.integers(0, 3), max_size=2) | _json)
                 .map(list), _json)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=5) | _json, bufs=st.lists(_buf, max_size=2) | _json | st.none())
def test_frames_with_fields_of_random_types_always_get_an_answer(worker, ops, bufs):
    handle, url = worker
    meta = {"ops": ops} if bufs is None else {"ops": ops, "bufs": bufs}
    s = _session(url)
    try:
        ftype, answer = _ask(s, meta)
        assert ftype in (FrameType.REPLY, FrameType.ERROR), (ftype, answer)
        if ftype == FrameType.ERROR:
            assert answer["code"] in ("bad_meta", "oversized") and answer["message"]
        _still_served(s)
    finally:
        s.close()


def test_fuzzing_left_no_traceback(worker):
    handle, _ = worker
    assert "Traceback" not in _stderr(handle)


def test_refused_connections_do_not_grow_the_log_without_bound():
    # Before: one stderr line per refused connection, without a cap.
    with running_worker() as (handle, url):
        spec = parse_attach(url)
        before = _stderr(handle).count("\n")
        for _ in range(200):
            s = socket.create_connection((spec.host, spec.port), timeout=5)
            s.sendall(b"NOPE" + bytes(16))
            try:
                s.recv(4096)
            except OSError:
                pass
            s.close()
        time.sleep(0.2)
        lines = _stderr(handle).count("\n") - before
        assert 1 <= lines <= 20 + 1, lines
        assert "refused: header.magic" in _stderr(handle)


def test_peer_log_counts_what_it_leaves_out(capsys):
    plog = PeerLog(lines=3, window_s=0.2)
    assert [plog(f"line {i}") for i in range(5)] == [True, True, True, False, False]
    time.sleep(0.25)
    assert plog("later")
    err = capsys.readouterr().err.splitlines()
    assert err == ["gpuctl-worker: line 0", "gpuctl-worker: line 1", "gpuctl-worker: line 2",
                   "gpuctl-worker: (2 line(s) about connections left out: more than 3 in 0.2 s)",
                   "gpuctl-worker: later"]
