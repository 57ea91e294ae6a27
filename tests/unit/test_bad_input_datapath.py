"""Adversarial frames on the remote-attach data path, from the worker's side: the client
(gpuctl.remote) must treat whatever the worker sends as data, never as instructions. A worker that
is spoofed (plain TCP) or broken must at worst lose the connection, never make the client build an
object array from raw bytes (that is a pointer forgery: reading it crashes or reads memory).

These tests run a fake worker on a loopback socket that completes the handshake, then answers
with a hostile frame. The protocol module's own tests (test_datapath_protocol.py) cover headers.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gpuctl.datapath.protocol import (
    DTYPE_CODES,
    FrameReader,
    FrameType,
    ProtocolError,
    array_meta,
    encode_meta,
    pack_header,
)
from gpuctl.remote._connection import AttachSpec, Connection, WorkerLostError


class FakeWorker:
    """Accepts one client, answers HELLO with WELCOME, then answers the next request frame with
    `reply` (raw bytes) and keeps the socket open until closed."""

    def __init__(self, reply: bytes):
        self.reply = reply
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.conn = conn
        reader = FrameReader(conn)
        hdr = reader.header()
        reader.meta(hdr)
        reader.skip(hdr.payload_len)
        meta = encode_meta({"executor": "numpy", "quota_bytes": 1 << 20})
        conn.sendall(pack_header(FrameType.WELCOME, len(meta), 0) + meta)
        try:
            reader.header()  # the client's GET (or BATCH); its content does not matter here
        except ProtocolError:
            return
        conn.sendall(self.reply)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


@pytest.fixture
def fake_worker():
    workers: list[FakeWorker] = []

    def make(reply: bytes) -> Connection:
        w = FakeWorker(reply)
        workers.append(w)
        return Connection(AttachSpec("127.0.0.1", w.port, "lease-fake", b"t" * 32), timeout_s=5.0)

    try:
        yield make
    finally:
        for w in workers:
            w.close()


def _reply_frame(result: dict, payload: bytes) -> bytes:
    meta = encode_meta({"results": [result]})
    return pack_header(FrameType.REPLY, len(meta), len(payload)) + meta + payload


def object_dtype_scenario() -> str:
    """Run in a child process (the bug segfaults): a fake worker answers a 'get' query with a REPLY
    naming dtype 'O' and 16 payload bytes 0x41. Returns what the client raised."""
    workers = []
    w = FakeWorker(_reply_frame({"shape": [2], "dtype": "O"}, b"\x41" * 16))
    workers.append(w)
    conn = Connection(AttachSpec("127.0.0.1", w.port, "lease-fake", b"t" * 32), timeout_s=5.0)
    try:
        value = conn.sync("get", [{"h": 1}])
        del value  # freeing an object array of forged pointers is where it crashes
        return "no error"
    except WorkerLostError as e:
        return f"WorkerLostError: {e}"
    finally:
        conn.close()
        w.close()


def test_reply_with_object_dtype_is_refused_not_turned_into_pointers():
    code = ("import sys; sys.path[:0] = [%r, %r]; import test_bad_input_datapath as t; "
            "print(t.object_dtype_scenario())" % (str(Path(__file__).parent), str(Path(__file__).parents[2])))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, f"client process died with {p.returncode}: {p.stderr[-500:]}"
    assert p.stdout.startswith("WorkerLostError:") and "dtype" in p.stdout


def test_array_frame_with_a_huge_zero_sized_shape_does_not_escape_as_a_raw_error(fake_worker):
    # dims (0, 2**64-1): 0 elements, so parse_array_meta's element limit passes, but NumPy cannot
    # make that shape. The client must report it as the worker's fault (WorkerLostError), or at
    # least never hand back an array; record what it does today.
    meta = array_meta(1, DTYPE_CODES["float32"], (0, 2**64 - 1))
    conn = fake_worker(pack_header(FrameType.ARRAY, len(meta), 0) + meta)
    try:
        with pytest.raises((WorkerLostError, ValueError)) as info:
            conn.get(1)
        if isinstance(info.value, ValueError) and not isinstance(info.value, WorkerLostError):
            assert "dimension" in str(info.value)  # NumPy's "Maximum allowed dimension exceeded"
    finally:
        conn.close()


def test_array_frame_whose_payload_disagrees_with_its_shape_loses_the_connection(fake_worker):
    meta = array_meta(1, DTYPE_CODES["float64"], (4,))
    conn = fake_worker(pack_header(FrameType.ARRAY, len(meta), 8) + meta + b"\0" * 8)
    try:
        with pytest.raises(WorkerLostError, match="payload_len"):
            conn.get(1)
        with pytest.raises(WorkerLostError):  # and stays lost: nothing is read out of sync
            conn.get(1)
    finally:
        conn.close()


def test_frame_of_another_protocol_version_loses_the_connection(fake_worker):
    bad = bytearray(pack_header(FrameType.REPLY, 2, 0) + b"{}")
    bad[4] = 99  # version byte
    conn = fake_worker(bytes(bad))
    try:
        with pytest.raises(WorkerLostError, match="protocol 99 not supported"):
            conn.get(1)
    finally:
        conn.close()


def test_reply_frame_with_an_overflowing_meta_length_loses_the_connection(fake_worker):
    hdr = bytearray(pack_header(FrameType.REPLY, 0, 0))
    hdr[8:12] = (2**32 - 1).to_bytes(4, "little")  # meta_len u32 max: over the 8 MiB limit
    conn = fake_worker(bytes(hdr))
    try:
        with pytest.raises(WorkerLostError, match="meta_len"):
            conn.get(1)
    finally:
        conn.close()


def test_numpy_object_arrays_expose_writable_pointer_bytes():
    # Why the dtype check matters: an object array's buffer is its PyObject pointers.
    out = np.empty(2, np.dtype("O"))
    assert len(memoryview(out).cast("B")) == 2 * np.dtype("O").itemsize
