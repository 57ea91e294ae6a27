"""Frame parser and value codec: bounds, refusals, and property tests (hypothesis)."""

from __future__ import annotations

import hmac
import json
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np

from gpuctl.datapath.protocol import (
    ARRAY_META,
    DEFAULT_LIMITS,
    GET_FRAME,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    PROTOCOL_VERSION,
    WIRE_DTYPES,
    ConnectionLost,
    DType,
    FrameReader,
    FrameType,
    Handle,
    Limits,
    ProtocolError,
    array_meta,
    check_hello,
    decode_meta,
    decode_value,
    describe_value,
    encode_meta,
    pack_header,
    parse_array_meta,
    parse_header,
)


def test_header_round_trip():
    h = parse_header(pack_header(FrameType.BATCH, 123, 4567, 1))
    assert (h.version, h.ftype, h.flags, h.meta_len, h.payload_len) == (PROTOCOL_VERSION, FrameType.BATCH, 1, 123, 4567)
    assert HEADER_SIZE == 20


@pytest.mark.parametrize(
    "raw, code, message",
    [
        (HEADER.pack(b"HTTP", PROTOCOL_VERSION, 3, 0, 0, 0), "bad_magic", r"header.magic: b'HTTP' is not b'GCDP'"),
        (HEADER.pack(MAGIC, 9, 3, 0, 0, 0), "version", r"header.version: protocol 9 not supported \(this side speaks 2\)"),
        (HEADER.pack(MAGIC, PROTOCOL_VERSION, 77, 0, 0, 0), "frame_type", r"header.type: unknown frame type 77"),
        (HEADER.pack(MAGIC, PROTOCOL_VERSION, 3, 0, DEFAULT_LIMITS.max_meta_bytes + 1, 0), "oversized",
         r"header.meta_len: 8388609 bytes exceeds the limit of 8388608"),
        (HEADER.pack(MAGIC, PROTOCOL_VERSION, 3, 0, 0, 2**63), "oversized", r"header.payload_len: 9223372036854775808 bytes exceeds"),
        (b"GCDP\x01", "truncated", r"header: 5 bytes, expected 20"),
    ],
)
def test_bad_headers_refused(raw, code, message):
    with pytest.raises(ProtocolError, match=message) as ei:
        parse_header(raw)
    assert ei.value.code == code


def test_meta_must_be_a_json_object():
    assert decode_meta(b'{"ops": []}') == {"ops": []}
    with pytest.raises(ProtocolError, match="meta: expected a JSON object, got list"):
        decode_meta(b"[1]")
    with pytest.raises(ProtocolError, match="meta: not valid JSON"):
        decode_meta(b"{\x00")
    with pytest.raises(ProtocolError, match="meta: not valid JSON"):
        decode_meta(b"[" * 100_000)  # deep nesting is refused, not a crash


def test_decode_value_forms():
    v = decode_value([{"h": 3}, {"s": [1, None, -1]}, {"e": 1}, {"d": "float32"}, {"c": [1, 2]}, [1, [2.5]], "ij->i", None])
    assert v == (Handle(3), slice(1, None, -1), Ellipsis, "float32", 1 + 2j, (1, (2.5,)), "ij->i", None)
    assert isinstance(v[0], Handle) and isinstance(v[3], DType)
    assert describe_value(v) == "(h3, 1::-1, ..., float32, (1+2j), (1, (2.5,)), ...)"


@pytest.mark.parametrize(
    "value, message",
    [
        ({"h": -1}, "handle must be a non-negative integer, got -1"),
        ({"h": "1"}, "handle must be a non-negative integer"),
        ({"s": [1, 2]}, r"slice must be \[start, stop, step\]"),
        ({"s": [1.5, 2, None]}, r"slice must be \[start, stop, step\]"),
        ({"d": "object"}, "dtype 'object' is not allowed"),
        ({"d": "<U10"}, "dtype '<U10' is not allowed"),
        ({"x": 1}, "unknown tagged value 'x'"),
        ({"h": 1, "s": 2}, "tagged value must have exactly one key"),
        ({"__class__": "os.system"}, "unknown tagged value '__class__'"),
        ([[[[[[[[[1]]]]]]]]], "nested deeper than 8"),
        (list(range(5000)), "argument list of 5000 items"),
        ("x" * 1_048_577, "string argument of 1048577 characters \\(limit 1048576\\)"),
    ],
)
def test_decode_value_refusals(value, message):
    with pytest.raises(ValueError, match=message):
        decode_value(value)


def test_hello_checks_version_lease_and_token():
    good = {"protocol": PROTOCOL_VERSION, "lease_id": "L1"}
    check_hello(good, b"secret", "L1", b"secret", hmac.compare_digest)
    with pytest.raises(ProtocolError, match="lease token refused") as ei:
        check_hello(good, b"secreT", "L1", b"secret", hmac.compare_digest)
    assert ei.value.code == "auth"
    with pytest.raises(ProtocolError, match="lease token refused"):
        check_hello({"protocol": PROTOCOL_VERSION, "lease_id": "L2"}, b"secret", "L1", b"secret", hmac.compare_digest)
    with pytest.raises(ProtocolError, match="hello.protocol: client speaks 1, worker speaks 2") as ei:
        check_hello({"protocol": 1, "lease_id": "L1"}, b"secret", "L1", b"secret", hmac.compare_digest)
    assert ei.value.code == "version"


def test_token_compared_in_constant_time():
    calls = []

    def compare(a, b):
        calls.append((a, b))
        return hmac.compare_digest(a, b)

    check_hello({"protocol": PROTOCOL_VERSION, "lease_id": "L"}, b"t", "L", b"t", compare)
    assert (b"t", b"t") in calls


# -- property tests ---------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=40))
def test_parse_header_never_fails_unexpectedly(raw):
    try:
        h = parse_header(raw)
    except ProtocolError as e:
        assert e.code in {"truncated", "bad_magic", "version", "frame_type", "oversized"}
    else:
        assert len(raw) == HEADER_SIZE and raw[:4] == MAGIC
        assert h.meta_len <= DEFAULT_LIMITS.max_meta_bytes and h.payload_len <= DEFAULT_LIMITS.max_payload_bytes


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_header_limits_hold_for_any_lengths(ftype, meta_len, payload_len):
    raw = HEADER.pack(MAGIC, PROTOCOL_VERSION, ftype, 0, meta_len, payload_len)
    small = Limits(max_meta_bytes=1000, max_payload_bytes=5000)
    try:
        h = parse_header(raw, small)
    except ProtocolError:
        assert ftype not in {int(t) for t in FrameType} or meta_len > 1000 or payload_len > 5000
    else:
        assert h.meta_len <= 1000 and h.payload_len <= 5000


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_decode_value_accepts_only_known_forms(value):
    try:
        out = decode_value(value)
    except ValueError:
        return
    allowed = (type(None), bool, int, float, str, tuple, slice, complex, Handle, DType, type(Ellipsis))

    def walk(v):
        assert isinstance(v, allowed), type(v)
        if isinstance(v, tuple):
            for x in v:
                walk(x)

    walk(out)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_meta_any_bytes(raw):
    try:
        meta = decode_meta(raw)
    except ProtocolError as e:
        assert e.code == "bad_meta"
    else:
        assert isinstance(meta, dict)
        assert json.loads(raw) == meta


# -- protocol 2: GET / ARRAY frames ---------------------------------------------------------------

def test_get_frame_layout():
    raw = GET_FRAME.pack(MAGIC, PROTOCOL_VERSION, FrameType.GET, 0, 8, 0, 12345)
    assert len(raw) == 28
    h = parse_header(raw[:HEADER_SIZE])
    assert (h.ftype, h.meta_len, h.payload_len) == (FrameType.GET, 8, 0)
    assert int.from_bytes(raw[HEADER_SIZE:], "little") == 12345


@pytest.mark.parametrize("dtype, shape", [("float64", ()), ("float32", (1024,)), ("bool", (2, 0, 3)),
                                          ("complex128", (1,) * 32), ("uint8", (7, 5))])
def test_array_meta_round_trip(dtype, shape):
    code = WIRE_DTYPES.index(dtype)
    meta = array_meta(99, code, shape)
    assert len(meta) == ARRAY_META.size + 8 * len(shape) == 10 + 8 * len(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    assert parse_array_meta(meta, nbytes) == (99, dtype, shape)


@pytest.mark.parametrize(
    "meta, payload_len, message",
    [
        (b"\x00" * 9, 0, r"ARRAY meta: 9 bytes, expected at least 10"),
        (ARRAY_META.pack(1, 14, 0), 0, r"ARRAY meta.dtype: unknown dtype code 14"),
        (ARRAY_META.pack(1, 11, 2) + bytes(8), 8, r"ARRAY meta: 18 bytes do not hold 2 dims"),
        (ARRAY_META.pack(1, 11, 33) + bytes(8 * 33), 0, r"ARRAY meta: 274 bytes do not hold 33 dims \(ndim limit 32\)"),
        (array_meta(1, 11, (3,)), 16, r"ARRAY: shape \(3,\) of float64 is not header.payload_len 16 bytes"),
        (array_meta(1, 0, (1 << 20, 1 << 20)), 0, r"ARRAY meta.shape: 1099511627776 elements \(limit 68719476736\)"),
    ],
)
def test_array_meta_refusals(meta, payload_len, message):
    with pytest.raises(ProtocolError, match=message):
        parse_array_meta(meta, payload_len)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 2**64 - 1))
def test_parse_array_meta_any_bytes(raw, payload_len):
    try:
        seq, dtype, shape = parse_array_meta(raw, payload_len)
    except ProtocolError as e:
        assert e.code in {"bad_meta", "oversized"}
    else:
        assert dtype in WIRE_DTYPES and len(shape) <= 32
        assert int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize == payload_len


# -- FrameReader ---------------------------------------------------------------------------------

def _frames() -> tuple[bytes, list]:
    """Three frames back to back: JSON REPLY, ARRAY with a 300 kB payload, GET."""
    meta = encode_meta({"results": [1], "error": None, "seq": 3})
    big = np.arange(37_500, dtype=np.float64)
    am = array_meta(4, WIRE_DTYPES.index("float64"), big.shape)
    stream = (pack_header(FrameType.REPLY, len(meta), 0) + meta
              + pack_header(FrameType.ARRAY, len(am), big.nbytes) + am + big.tobytes()
              + GET_FRAME.pack(MAGIC, PROTOCOL_VERSION, FrameType.GET, 0, 8, 0, 7))
    return stream, [big]


def _read_all(reader):
    h1 = reader.header()
    m1 = reader.meta(h1)
    h2 = reader.header()
    _, dtype, shape = parse_array_meta(reader.take(h2.meta_len), h2.payload_len)
    out = np.empty(shape, dtype)
    reader.read_into(memoryview(out).cast("B"))
    h3 = reader.header()
    handle = int.from_bytes(reader.take(8), "little")
    return h1.ftype, m1, h2.ftype, out, h3.ftype, handle


class _Chunked:
    """A socket stand-in that hands out `data` in the given chunk sizes (then EOF)."""

    def __init__(self, data: bytes, sizes: list[int]):
        self.data, self.sizes, self.pos, self.calls = data, list(sizes), 0, 0

    def recv_into(self, view, nbytes=0):
        self.calls += 1
        n = min(len(view), nbytes or len(view), self.sizes.pop(0) if self.sizes else len(view))
        chunk = self.data[self.pos:self.pos + n]
        view[:len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


def test_frame_reader_over_a_real_socket():
    stream, (big,) = _frames()
    a, b = socket.socketpair()
    try:
        t = threading.Thread(target=a.sendall, args=(stream,))
        t.start()
        got = _read_all(FrameReader(b, buffer_bytes=4096))
        t.join()
    finally:
        a.close()
        b.close()
    assert got[0] == FrameType.REPLY and got[1] == {"results": [1], "error": None, "seq": 3}
    assert got[2] == FrameType.ARRAY and np.array_equal(got[3], big)
    assert got[4] == FrameType.GET and got[5] == 7


def test_frame_reader_small_frame_in_one_recv():
    raw = GET_FRAME.pack(MAGIC, PROTOCOL_VERSION, FrameType.GET, 0, 8, 0, 5)
    sock = _Chunked(raw * 2, [])
    reader = FrameReader(sock)
    for _ in range(2):
        assert reader.header().ftype == FrameType.GET and int.from_bytes(reader.take(8), "little") == 5
    assert sock.calls == 1 and reader.buffered == 0  # both frames came with one recv_into


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 70_000), max_size=40), st.sampled_from([64, 1000, 4096, 1 << 16]))
def test_frame_reader_any_chunking(sizes, buffer_bytes):
    stream, (big,) = _frames()
    got = _read_all(FrameReader(_Chunked(stream, sizes), buffer_bytes=max(buffer_bytes, 64)))
    assert got[1]["seq"] == 3 and np.array_equal(got[3], big) and got[5] == 7


def test_frame_reader_truncated_and_skip():
    stream, _ = _frames()
    reader = FrameReader(_Chunked(stream[:HEADER_SIZE + 5], []))
    hdr = reader.header()
    with pytest.raises(ConnectionLost, match=r"meta: connection closed after 5 of \d+ bytes"):
        reader.meta(hdr)
    reader = FrameReader(_Chunked(stream, [7]), buffer_bytes=1000)
    h1 = reader.header()
    reader.skip(h1.meta_len)
    h2 = reader.header()
    reader.skip(h2.meta_len + h2.payload_len)  # 300 kB through a 1000-byte buffer
    assert reader.header().ftype == FrameType.GET
    with pytest.raises(ConnectionLost, match="header: connection closed after 0 of 20 bytes"):
        FrameReader(_Chunked(b"", [])).header()
