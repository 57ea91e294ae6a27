"""Frame parser and value codec: bounds, refusals, and property tests (hypothesis)."""

from __future__ import annotations

import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.datapath.protocol import (
    DEFAULT_LIMITS,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    PROTOCOL_VERSION,
    DType,
    FrameType,
    Handle,
    Limits,
    ProtocolError,
    check_hello,
    decode_meta,
    decode_value,
    describe_value,
    pack_header,
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
