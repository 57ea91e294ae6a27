"""The per-lease worker process: handshake, refusals of bad frames without harm to other
connections or leases, lease expiry, parent pipe, killed worker, isolation, launcher, TLS."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuctl.remote as cp
from gpuctl.datapath.launcher import WorkerStartError, start_worker
from gpuctl.datapath.protocol import (
    FLAG_SYNC,
    HEADER,
    MAGIC,
    PROTOCOL_VERSION,
    FrameType,
    array_meta,
    encode_meta,
    hello_meta,
    pack_header,
    recv_header,
    recv_meta,
    send_frame,
)
from gpuctl.datapath.testing import running_worker
from gpuctl.remote._connection import AttachError, Connection, WorkerLostError, parse_attach


def _wait(pred, timeout_s=5.0):
    end = time.time() + timeout_s
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _raw(url, authenticate=True):
    spec = parse_attach(url)
    s = socket.create_connection((spec.host, spec.port), timeout=5)
    if authenticate:
        send_frame(s, FrameType.HELLO, hello_meta(spec.lease_id), [memoryview(spec.token)])
        hdr = recv_header(s)
        assert hdr.ftype == FrameType.WELCOME, recv_meta(s, hdr)
        recv_meta(s, hdr)
    return s


def _read_error_or_eof(s):
    """The worker's answer to a broken frame: (code, message) of its ERROR frame, or None at EOF."""
    try:
        hdr = recv_header(s)
    except Exception:  # noqa: BLE001 - EOF / reset: closed without a word
        return None
    meta = recv_meta(s, hdr)
    assert hdr.ftype == FrameType.ERROR
    return meta["code"], meta["message"]


def _closed(s):
    """True when the worker closes the connection (after at most an ERROR frame) within 5 s."""
    s.settimeout(5)
    got = b""
    try:
        while len(got) < 1 << 16:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        else:
            return False
    except socket.timeout:
        return False
    except OSError:
        return True
    return got == b"" or recv_header_bytes_is_error(got)


def recv_header_bytes_is_error(got):
    from gpuctl.datapath.protocol import parse_header

    return parse_header(got[:20]).ftype == FrameType.ERROR


@pytest.fixture(scope="module")
def two_leases():
    with running_worker() as (h1, url1), running_worker() as (h2, url2):
        yield (h1, url1), (h2, url2)


@pytest.fixture()
def bystanders(two_leases):
    """A live connection with an array on each of the two leases; checked after each test."""
    (h1, url1), (h2, url2) = two_leases
    c1, c2 = Connection(parse_attach(url1)), Connection(parse_attach(url2))
    handles = []
    for c, v in ((c1, 1.0), (c2, 2.0)):
        h = c.upload(np.full(4, v))
        handles.append(h)
    yield c1, c2
    for c, h, v in ((c1, handles[0], 1.0), (c2, handles[1], 2.0)):
        assert c.sync("get", [{"h": h}]).tolist() == [v] * 4  # unaffected
        c.close()
    assert h1.alive() and h2.alive()


# -- handshake ----------------------------------------------------------------------------------

def test_wrong_token_refused_and_worker_keeps_serving(two_leases, bystanders):
    (_, url1), _ = two_leases
    spec = parse_attach(url1)
    bad = url1.replace(spec.token.hex(), (b"x" + spec.token[1:]).hex())
    with pytest.raises(AttachError, match=rf"worker at {spec.host}:{spec.port} refused lease {spec.lease_id}: "
                                          r"hello: lease token refused \(wrong token or lease id\)"):
        Connection(parse_attach(bad))
    wrong_lease = url1.replace(f"lease={spec.lease_id}", "lease=other")
    with pytest.raises(AttachError, match="lease token refused"):
        Connection(parse_attach(wrong_lease))


def test_protocol_version_mismatch_refused(two_leases, bystanders):
    (_, url1), _ = two_leases
    s = _raw(url1, authenticate=False)
    s.sendall(HEADER.pack(MAGIC, 1, FrameType.HELLO, 0, 2, 0) + b"{}")  # a version-1 client
    assert _read_error_or_eof(s) == ("version", "header.version: protocol 1 not supported (this side speaks 2)")
    assert _closed(s)
    s = _raw(url1, authenticate=False)
    send_frame(s, FrameType.HELLO, {"protocol": 7, "lease_id": "x"}, [memoryview(b"tok")])
    assert _read_error_or_eof(s) == ("version", "hello.protocol: client speaks 7, worker speaks 2")


def test_batch_before_hello_refused(two_leases, bystanders):
    (_, url1), _ = two_leases
    s = _raw(url1, authenticate=False)
    send_frame(s, FrameType.BATCH, {"ops": []})
    assert _read_error_or_eof(s) == ("handshake", "expected HELLO, got BATCH")


def test_oversized_hello_refused(two_leases, bystanders):
    (_, url1), _ = two_leases
    s = _raw(url1, authenticate=False)
    s.sendall(pack_header(FrameType.HELLO, 1 << 20, 0))
    code, msg = _read_error_or_eof(s)
    assert code == "oversized" and msg == "header.meta_len: 1048576 bytes exceeds the limit of 4096"


# -- malformed frames after the handshake ---------------------------------------------------------

@pytest.mark.parametrize(
    "raw, want",
    [
        (b"NOPE" + bytes(16), ("bad_magic", "header.magic: b'NOPE' is not b'GCDP'")),
        (HEADER.pack(MAGIC, PROTOCOL_VERSION, 3, 0, 1 << 30, 0), ("oversized", "header.meta_len: 1073741824 bytes exceeds the limit of 8388608")),
        (HEADER.pack(MAGIC, PROTOCOL_VERSION, 3, 0, 0, 1 << 40), ("oversized", "header.payload_len: 1099511627776 bytes exceeds the limit of 4294967296")),
        (HEADER.pack(MAGIC, PROTOCOL_VERSION, 99, 0, 0, 0), ("frame_type", "header.type: unknown frame type 99")),
        (pack_header(FrameType.HELLO, 2, 0) + b"{}", ("frame_type", "frame type HELLO not expected after the handshake")),
        (pack_header(FrameType.BATCH, 5, 0) + b"[1,2]", ("bad_meta", "meta: expected a JSON object, got list")),
        (pack_header(FrameType.BATCH, 3, 0) + b"{{{", ("bad_meta", None)),
        (pack_header(FrameType.BATCH, 9, 0) + b'{"ops":7}', ("bad_meta", "meta.ops: must be a list of at most 65536 ops")),
        (lambda: (m := encode_meta({"ops": [], "bufs": [["float64", [4]]]}),
                  pack_header(FrameType.BATCH, len(m), 8) + m + bytes(8))[1],
         ("bad_meta", "meta.bufs: buffers describe 32 bytes but header.payload_len is 8")),
        (lambda: (m := encode_meta({"ops": [], "bufs": [["object", [4]]]}),
                  pack_header(FrameType.BATCH, len(m), 32) + m + bytes(32))[1],
         ("bad_meta", "meta.bufs[0]: expected [dtype, [dims...]], got ['object', [4]]")),
        (lambda: (m := encode_meta({"ops": [], "bufs": [["int8", [1 << 20] * 3]]}),
                  pack_header(FrameType.BATCH, len(m), 0) + m)[1],
         ("oversized", "meta.bufs[0]: 1152921504606846976 elements (limit 68719476736)")),
        (pack_header(FrameType.GET, 4, 0) + bytes(4), ("bad_meta", "GET: meta_len must be 8 and payload_len 0, got 4 and 0")),
        (pack_header(FrameType.GET, 8, 3) + bytes(11), ("bad_meta", "GET: meta_len must be 8 and payload_len 0, got 8 and 3")),
        (pack_header(FrameType.ARRAY, 10, 0) + bytes(10), ("frame_type", "frame type ARRAY not expected after the handshake")),
    ],
    ids=["magic", "meta_len", "payload_len", "type", "hello_again", "meta_list", "meta_json", "ops_type",
         "bufs_mismatch", "bufs_dtype", "bufs_elements", "get_meta_len", "get_payload", "array_to_worker"],
)
def test_malformed_frame_refused_others_unaffected(two_leases, bystanders, request, raw, want):
    (_, url1), _ = two_leases
    s = _raw(url1)
    s.sendall(raw() if callable(raw) else raw)
    code, msg = _read_error_or_eof(s)
    assert code == want[0]
    if want[1] is not None:
        assert msg == want[1]
    if request.node.callspec.id in KEPT_AFTER_ERROR:
        assert _session_works(s)  # the frame was whole: skipped, answered ERROR, session kept
        s.close()
    else:
        assert _closed(s)  # the stream itself is broken: nothing after it can be trusted


#: Cases above whose framing is sound (only metadata fields are refused): the session goes on.
KEPT_AFTER_ERROR = {"meta_list", "meta_json", "ops_type", "bufs_mismatch", "bufs_dtype", "bufs_elements"}


def _session_works(s) -> bool:
    """True when a SYNC batch on `s` gets its REPLY: the connection is still served."""
    send_frame(s, FrameType.BATCH, {"ops": [["zeros", [7], [[3]]], ["get", [], [{"h": 7}]]]}, flags=FLAG_SYNC)
    hdr = recv_header(s)
    meta = recv_meta(s, hdr)
    assert hdr.ftype == FrameType.REPLY, meta
    assert meta["error"] is None and meta["results"][0]["shape"] == [3]
    s.recv(hdr.payload_len, socket.MSG_WAITALL)
    return True


def test_truncated_frame_closes_only_that_connection(two_leases, bystanders):
    (_, url1), _ = two_leases
    s = _raw(url1)
    m = encode_meta({"ops": [["upload", [1], [0]]], "bufs": [["float64", [1000]]]})
    s.sendall(pack_header(FrameType.BATCH, len(m), 8000) + m + bytes(100))  # 100 of 8000 bytes
    s.shutdown(socket.SHUT_WR)
    assert _closed(s)


def test_malformed_ops_are_op_errors_not_disconnects(two_leases, bystanders):
    c1, _ = bystanders
    for bad in (["add"], "junk", ["add", "notalist", []], ["add", [1], {"a": 1}], ["getitem", [], [{"h": 1e9}]]):
        c1._ops.append(bad)
    c1._ops.append(["zeros", [999_999], [[2]]])
    with pytest.raises(TypeError, match=r"op #\d+ \?\(\): an op must be \[name, outs, args\]"):
        c1.sync("get", [{"h": 999_999}])
    assert c1.sync("get", [{"h": 999_999}]).tolist() == [0.0, 0.0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=300))
def test_random_bytes_after_handshake_never_hurt_others(two_leases, bystanders, junk):
    (_, url1), _ = two_leases
    s = _raw(url1)
    try:
        try:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the worker refused and closed before all of it arrived
        assert _closed(s)
    finally:
        s.close()


# -- GET / ARRAY (protocol 2) ------------------------------------------------------------------------

def test_get_fast_path_values_and_accounting(two_leases):
    (h1, url1), _ = two_leases
    c = Connection(parse_attach(url1))
    try:
        before = c.sync("stats")
        a = c.upload(np.arange(12, dtype=np.int32).reshape(3, 4))
        assert c.get(a).tolist() == np.arange(12).reshape(3, 4).tolist()
        c.enqueue("transpose", [a + 100], [{"h": a}])  # queued op and GET leave in one send
        t = c.get(a + 100)
        assert t.shape == (4, 3) and t.dtype == np.int32 and t.flags.c_contiguous  # a view, sent C-ordered
        assert t.tolist() == np.arange(12).reshape(3, 4).T.tolist()
        c.enqueue("zeros", [a + 101], [[0, 5], {"d": "float16"}])
        z = c.get(a + 101)
        assert z.shape == (0, 5) and z.dtype == np.float16
        big = np.random.default_rng(1).standard_normal(50_000)  # 400 kB: the zero-copy chunked send
        b = c.upload(big)
        out = np.empty_like(big)
        assert c.get(b, out=out) is out and np.array_equal(out, big)
        c.enqueue("sum", [a + 102], [{"h": b}])
        assert c.get(a + 102).item() == pytest.approx(big.sum())
        after = c.sync("stats")
        assert after["ops_total"] - before["ops_total"] >= 9
        assert after["bytes_out"] - before["bytes_out"] >= 400_000 + 48 + 8
    finally:
        c.close()


def test_get_reports_queued_error_then_recovers(two_leases):
    (_, url1), _ = two_leases
    c = Connection(parse_attach(url1))
    try:
        a = c.upload(np.ones((2, 3)))
        c.enqueue("matmul", [50], [{"h": a}, {"h": a}])
        with pytest.raises(ValueError, match=rf"op #\d+ matmul\(h{a}, h{a}\): .*mismatch"):
            c.get(a)  # a itself is fine: the error of the queued op comes first
        assert c.get(a).tolist() == [[1.0] * 3] * 2  # reported once; the next GET answers
        with pytest.raises(cp.RemoteError, match=r"op #\d+ get\(h50\): h50 is not available: op #\d+ matmul"):
            c.get(50)  # the poisoned output names the failed op
        with pytest.raises(cp.RemoteError, match=r"op #\d+ get\(h777\): unknown handle h777 \(freed, or never"):
            c.get(777)
        assert c.get(a).sum() == 6.0
    finally:
        c.close()


def _fake_worker_answering(reply: bytes) -> tuple[socket.socket, threading.Thread]:
    """A listening fake worker: WELCOME to the HELLO, then `reply` (raw bytes) to the first GET."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        s, _ = srv.accept()
        with s:
            hdr = recv_header(s)
            recv_meta(s, hdr)
            s.recv(hdr.payload_len)
            send_frame(s, FrameType.WELCOME, {"protocol": PROTOCOL_VERSION, "executor": "numpy", "quota_bytes": 1})
            s.recv(28)  # the GET
            s.sendall(reply)
            s.recv(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


def _reply(meta: dict, payload: bytes = b"") -> bytes:
    m = encode_meta(meta)
    return pack_header(FrameType.REPLY, len(m), len(payload)) + m + payload


@pytest.mark.parametrize(
    "reply, message",
    [
        (lambda: pack_header(FrameType.ARRAY, 18, 8) + array_meta(1, 11, (4,)) + bytes(8),
         r"ARRAY: shape \(4,\) of float64 is not header.payload_len 8 bytes"),
        (lambda: pack_header(FrameType.ARRAY, 26, 0) + array_meta(1, 10, (0, 2**64 - 1)),
         r"ARRAY meta.shape: dimension 18446744073709551615 \(limit 68719476736\)"),
        (lambda: _reply({"results": [{"shape": [2], "dtype": "O"}]}, b"A" * 16),
         r"REPLY: get result dtype 'O' is not a wire dtype"),
        (lambda: _reply({"results": [{"shape": [-1], "dtype": "int8"}]}, b"A"),
         r"REPLY: get result shape \[-1\] is not at most 32 dims"),
        (lambda: _reply({"results": [{"shape": [2], "dtype": "float64"}]}, bytes(8)),
         r"REPLY: shape \(2,\) of float64 is not header.payload_len 8 bytes"),
        (lambda: _reply({"results": {"x": 1}}), "REPLY: results must be a list and error an object or null"),
        (lambda: _reply({"results": [None], "error": "boom"}), "REPLY: results must be a list and error an object"),
        (lambda: _reply({"results": [None]}, bytes(8)), "REPLY: 8 payload bytes with no array to receive"),
    ],
    ids=["array_payload", "array_dim", "reply_object_dtype", "reply_negative_dim", "reply_payload",
         "reply_results", "reply_error", "reply_stray_payload"],
)
def test_bad_answer_from_worker_loses_connection(reply, message):
    """The client treats what a broken or spoofed worker sends as data: a frame that does not add
    up (or names dtype 'O', which would make received bytes into pointers) is WorkerLostError
    naming the field, and every later call says so too; no array is handed back."""
    srv, t = _fake_worker_answering(reply())
    try:
        c = Connection(parse_attach(f"tcp://127.0.0.1:{srv.getsockname()[1]}?lease=L&token=00"))
        with pytest.raises(WorkerLostError, match=message):
            c.get(1)
        with pytest.raises(WorkerLostError, match="lost the connection to the worker of lease L"):
            c.get(1)
    finally:
        srv.close()
        t.join(5)


# -- isolation ----------------------------------------------------------------------------------

def test_two_leases_cannot_see_each_others_arrays(two_leases):
    (_, url1), (_, url2) = two_leases
    c1, c2 = Connection(parse_attach(url1)), Connection(parse_attach(url2))
    c1b = Connection(parse_attach(url1))
    try:
        h = c1.upload(np.arange(3.0))
        assert c1.sync("get", [{"h": h}]).tolist() == [0.0, 1.0, 2.0]
        for other in (c2, c1b):  # another lease, and another connection of the same lease
            with pytest.raises(cp.RemoteError, match=rf"op #\d+ get\(h{h}\): unknown handle h{h} "
                                                     r"\(freed, or never created on this connection\)"):
                other.sync("get", [{"h": h}])
    finally:
        for c in (c1, c2, c1b):
            c.close()


def test_arrays_of_two_connections_cannot_be_mixed(two_leases):
    (_, url1), (_, url2) = two_leases
    try:
        cp.attach(url1)
        a = cp.ones(3)
        cp.attach(url2)
        b = cp.ones(3)
        with pytest.raises(ValueError, match="array belongs to another lease/connection"):
            cp.add(b, a)
    finally:
        cp.detach()


# -- lifecycle ----------------------------------------------------------------------------------

def test_token_never_in_argv_or_environment():
    with running_worker() as (h, url):
        token_hex = parse_attach(url).token.hex()
        with open(f"/proc/{h.pid}/cmdline", "rb") as f:
            assert token_hex.encode() not in f.read()
        with open(f"/proc/{h.pid}/environ", "rb") as f:
            assert token_hex.encode() not in f.read()


def test_expired_lease_worker_exits_and_client_gets_clear_error():
    with running_worker(ttl_s=1.5) as (h, url):
        conn = Connection(parse_attach(url))
        x = conn.upload(np.ones(3))
        assert conn.sync("get", [{"h": x}]).tolist() == [1.0] * 3
        assert _wait(lambda: not h.alive(), 5.0)
        assert h.proc.returncode == 0
        assert h.stats()["state"] == "expired"
        with pytest.raises(WorkerLostError, match=rf"lost the connection to the worker of lease {h.lease_id} at "
                                                  rf"{h.endpoint} \(worker ended, lease expired or revoked"):
            conn.sync("get", [{"h": x}])
        with pytest.raises(WorkerLostError):  # and every later op
            conn.enqueue("zeros", [99], [[1]])
        with pytest.raises(AttachError, match="cannot connect to the worker"):
            Connection(parse_attach(url))


def test_extend_keeps_worker_past_first_deadline():
    with running_worker(ttl_s=1.0) as (h, url):
        h.extend(time.time() + 30)
        time.sleep(1.5)
        assert h.alive()
        assert _wait(lambda: (h.stats() or {}).get("expires_at_s", 0) > time.time() + 20, 3)


def test_worker_exits_when_parent_pipe_closes():
    with running_worker() as (h, url):
        h.proc.stdin.close()
        assert _wait(lambda: not h.alive(), 5.0)
        assert h.stats()["state"] == "parent_gone"


def test_stop_writes_final_state():
    with running_worker() as (h, url):
        assert h.stop() == 0
        assert not h.alive() and h.stats()["state"] == "stopped"
        with pytest.raises(ProcessLookupError, match=f"worker of lease {h.lease_id} .* has ended"):
            h.extend(time.time() + 10)


def test_worker_killed_mid_operation_gives_clear_error():
    with running_worker(quota_bytes=1 << 30) as (h, url):
        conn = Connection(parse_attach(url))
        a = conn.upload(np.ones((600, 600)))
        for i in range(200):  # a few seconds of work on this machine
            conn.enqueue("matmul", [1000 + i], [{"h": a}, {"h": a}])
        conn.flush()
        time.sleep(0.2)
        os.kill(h.pid, signal.SIGKILL)
        with pytest.raises(WorkerLostError, match=rf"lost the connection to the worker of lease {h.lease_id}"):
            conn.sync("get", [{"h": a}])
        assert _wait(lambda: not h.alive())


def test_stats_file_written_every_second():
    with running_worker() as (h, url):
        conn = Connection(parse_attach(url))
        x = conn.upload(np.ones(1000))
        conn.sync("get", [{"h": x}])
        assert _wait(lambda: (h.stats() or {}).get("memory_in_use_bytes") == 8000, 3)
        s = h.stats()
        assert s["lease_id"] == h.lease_id and s["pid"] == h.pid and s["endpoint"] == h.endpoint
        assert s["state"] == "serving" and s["connections"] == 1 and s["bytes_in"] > 8000
        conn.close()


# -- launcher -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"executor": "tpu"}, "executor: 'tpu' is not one of numpy, cupy"),
        ({"executor": "cupy"}, "gpu_uuid: the cupy executor needs the lease's GPU UUID"),
        ({"token": b""}, "token: empty lease token"),
        ({"quota_bytes": 0}, "quota_bytes: must be > 0, got 0"),
        ({"compute_share": 1.5}, r"compute_share: must be in \(0, 1\], got 1.5"),
        ({"expires_at_s": 1.0}, "expires_at_s: lease L has already expired"),
    ],
)
def test_launcher_refuses_bad_arguments(kwargs, message):
    args = dict(lease_id="L", token=b"t", quota_bytes=1 << 20, compute_share=1.0, executor="numpy",
                expires_at_s=time.time() + 60)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        start_worker(**args)


def test_launcher_reports_worker_that_cannot_start(tmp_path):
    with pytest.raises(WorkerStartError, match=r"worker of lease L did not start \(exit 2\): .*lease L: .*"):
        start_worker(lease_id="L", token=b"t", quota_bytes=1 << 20, compute_share=1.0, executor="numpy",
                     bind="203.0.113.1", expires_at_s=time.time() + 60, run_dir=str(tmp_path))
    assert "stats.json" not in os.listdir(tmp_path)


# -- TLS ----------------------------------------------------------------------------------------

def _self_signed(tmp_path):
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if not shutil.which("openssl"):
            pytest.skip("neither cryptography nor openssl available")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem"),
                        "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                       check=True, capture_output=True)
        return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")


def test_tls_same_protocol(tmp_path):
    cert, key = _self_signed(tmp_path)
    with running_worker(tls_cert=cert, tls_key=key) as (h, url):
        assert url.startswith("tls://")
        try:
            cp.attach(f"{url}&ca={cert}&server_name=localhost")
            big = np.arange(300_000, dtype=np.float64)  # > one TLS record, > copy threshold
            x = cp.asarray(big)
            np.testing.assert_array_equal((x * 2).get(), big * 2)
            assert float(x.sum()) == float(big.sum())
        finally:
            cp.detach()
        # a client that does not trust the certificate is refused, the worker goes on
        with pytest.raises(AttachError, match="TLS handshake with .* failed: .*CERTIFICATE_VERIFY_FAILED"):
            Connection(parse_attach(url.replace("tls://", "tls://") + "&server_name=localhost"))
        # plain TCP against the TLS worker fails cleanly
        with pytest.raises(AttachError, match="handshake with the worker of lease"):
            Connection(parse_attach(url.replace("tls://", "tcp://")), timeout_s=3)
        assert h.alive()


# -- GPUCTL_ATTACH ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "value, message",
    [
        ("http://h:1?lease=a&token=00", "GPUCTL_ATTACH: scheme must be tcp://, tls:// or ssh://, got 'http'"),
        ("tcp://h?lease=a&token=00", "GPUCTL_ATTACH: expected HOST:PORT after tcp://"),
        ("tcp://h:1?token=00", "GPUCTL_ATTACH: missing lease=ID"),
        ("tcp://h:1?lease=a&token=zz", "GPUCTL_ATTACH: token= must be hexadecimal"),
        ("tcp://h:1?lease=a", "GPUCTL_ATTACH: missing token=HEX"),
    ],
)
def test_attach_spec_errors(value, message):
    with pytest.raises(AttachError, match=message):
        parse_attach(value)


def test_attach_from_environment(monkeypatch):
    with running_worker() as (h, url):
        monkeypatch.setenv("GPUCTL_ATTACH", url)
        cp.detach()
        try:
            assert float(cp.arange(4).sum()) == 6.0
            assert cp.get_connection().lease_id == h.lease_id
        finally:
            cp.detach()
    monkeypatch.delenv("GPUCTL_ATTACH")
    with pytest.raises(AttachError, match="GPUCTL_ATTACH is not set"):
        cp.ones(1)
