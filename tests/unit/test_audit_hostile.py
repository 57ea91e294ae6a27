"""GET /v1/audit against bad query values and damaged, racing or hostile audit files: a 400 naming
the field, or the records with the damage listed as problems; never a crash, memory bounded, and
the files unchanged (gpuctl.daemon.audit.read_newest / read_records, gpuctl.daemon.audit_api)."""

from __future__ import annotations

import itertools
import os

import pytest

import gpuctl.daemon.audit as audit_mod
from gpuctl.daemon.api import ApiError, ApiRequest
from gpuctl.daemon.audit import AuditLog, audit_files, read_newest, read_records
from gpuctl.daemon.audit_api import install


def _log(directory, n=300, max_bytes=4096, start=1000):
    ticks = itertools.count(start)
    audit = AuditLog(directory, "node-a", clock=lambda: float(next(ticks)), max_bytes=max_bytes, keep=80)
    audit.open()
    for i in range(n):
        audit.append({"event": "request", "phase": "begin", "op": f"op-{i}", "i": i})
    return audit


def _contents(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


class Api:
    def __init__(self):
        self.routes = {}

    def handle(self, request):
        return self.routes[(request.method, request.path)](request)

    def add_route(self, method, path, handler):
        self.routes[(method, path)] = handler


@pytest.fixture
def get(tmp_path):
    audit = _log(tmp_path, 50)
    audit.close()
    api = Api()
    install(api, AuditLog(tmp_path, "node-a"))

    def get(query):
        return api.handle(ApiRequest("GET", "/v1/audit", query))
    return get


@pytest.mark.parametrize("bad", ["NaN", "nan", "inf", "-1", "1e9", "", " 5", "1" * 16, "0x10", "5\x00"])
def test_bad_since_is_a_400_naming_the_field(get, tmp_path, bad):
    before = _contents(tmp_path)
    with pytest.raises(ApiError) as e:
        get({"since_s": [bad]})
    assert e.value.status == 400 and e.value.field == "since_s"
    assert f"since_s must be a Unix time in seconds, got {bad[:40]!r}" in str(e.value)
    assert _contents(tmp_path) == before


def test_future_since_answers_nothing_after_one_line_and_repeated_params_use_the_last(get):
    status, body = get({"since_s": ["999999999999999"]})
    assert status == 200 and body["records"] == [] and body["truncated"] is False
    status, body = get({"limit": ["abc", "3"]})
    assert status == 200 and [r["i"] for r in body["records"]] == [47, 48, 49]
    with pytest.raises(ApiError, match="got 'abc'") as e:
        get({"limit": ["3", "abc"]})
    assert e.value.field == "limit"


def test_deeply_nested_line_is_a_problem_not_a_crash(tmp_path):
    _log(tmp_path, 5).close()
    with open(tmp_path / "audit.log", "ab") as f:
        f.write(b"[" * 200_000 + b"\n")
    for got in (read_newest(tmp_path), read_records(tmp_path)):
        assert [r["i"] for r in got.records] == [0, 1, 2, 3, 4]
        (p,) = got.problems
        assert p.line == 6 and p.error == "nested too deep to be a record" and p.text == "[" * 200


def test_garbage_file_answers_at_most_100_problems_and_counts_the_rest(tmp_path):
    _log(tmp_path, 10).close()
    (tmp_path / "audit.log.1").write_bytes(os.urandom(64) .replace(b"\n", b"") + b"\n" + b"\xff\xfe garbage\n" * 5000)
    before = _contents(tmp_path)
    got = read_newest(tmp_path)
    assert [r["i"] for r in got.records] == list(range(10))
    assert len(got.problems) == audit_mod.MAX_PROBLEMS_PER_ANSWER and got.problems_omitted == 5001 - 100
    # the newest problems kept: the file's last lines
    assert got.problems[-1].line == 5001 and got.problems[0].line == 4902
    everything = read_records(tmp_path)
    assert len(everything.problems) == 100 and everything.problems_omitted == 4901
    assert _contents(tmp_path) == before


def test_a_line_of_several_megabytes_and_an_empty_file(tmp_path):
    _log(tmp_path, 3).close()
    big = b'{"time_s": 1002.5, "event": "note", "blob": "' + b"x" * (5 * 1024 * 1024) + b'"}\n'
    with open(tmp_path / "audit.log", "ab") as f:
        f.write(big)
    os.rename(tmp_path / "audit.log", tmp_path / "audit.log.1")
    (tmp_path / "audit.log").write_bytes(b"")
    got = read_newest(tmp_path, limit=2)
    assert [r.get("i", "blob") for r in got.records] == [2, "blob"] and got.truncated
    assert len(got.records[1]["blob"]) == 5 * 1024 * 1024 and got.problems == []


def test_a_file_larger_than_the_read_bound_is_read_from_its_end_with_true_line_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(audit_mod, "MAX_READ_BYTES_PER_FILE", 2000)
    monkeypatch.setattr(audit_mod, "_COUNT_BLOCK_BYTES", 333)
    lines = [b'{"time_s": %d, "i": %d}' % (1000 + i, i) for i in range(400)]
    lines[390] = b"not json"
    (tmp_path / "audit.log").write_bytes(b"\n".join(lines) + b"\n")
    got = read_newest(tmp_path)
    head, bad = got.problems
    assert head.line == 0 and head.error.startswith(f"{len(b''.join(lines)) + 400} bytes, more than the 2000")
    assert bad.line == 391 and bad.text == "not json"  # the file's own line number
    first = got.records[0]["i"]
    assert [r["i"] for r in got.records] == [i for i in range(first, 400) if i != 390]
    assert f"lines 1..{first}" in head.error and 300 < first < 400


def test_rotation_while_reading_neither_repeats_nor_loses(tmp_path, monkeypatch):
    """audit.log is read, then the log rotates (audit.log -> .1, .1 -> .2, ...) before audit.log.1
    is opened: the old audit.log, now .1, is not answered twice."""
    audit = _log(tmp_path, 200, max_bytes=2048)
    rotated = []

    def rotate():
        if not rotated:
            rotated.append(1)
            before = len(audit_files(tmp_path))
            i = 200
            while len(audit_files(tmp_path)) == before:
                audit.append({"event": "request", "phase": "begin", "op": f"op-{i}", "i": i})
                i += 1

    class RotatesWhenOpened(type(tmp_path)):
        def __fspath__(self):
            rotate()
            return super().__fspath__()

    real = audit_files

    def listing(d):
        files = real(d)
        return [RotatesWhenOpened(p) if p.name == "audit.log.1" else p for p in files]

    monkeypatch.setattr(audit_mod, "audit_files", listing)
    for read in (lambda: read_newest(tmp_path, limit=20000), lambda: read_records(tmp_path)):
        rotated.clear()
        got = read()
        assert rotated
        ids = [r["i"] for r in got.records]
        assert len(ids) == len(set(ids)), "a record answered twice"
        assert ids == sorted(ids) and got.problems == []
    audit.close()


def test_a_file_gone_or_unreadable_between_listing_and_reading(tmp_path, monkeypatch):
    _log(tmp_path, 200).close()
    listing = audit_files(tmp_path)
    gone = listing[0]
    os.unlink(gone)
    os.mkdir(gone)  # open() fails with an error other than "no such file"
    got = read_newest(tmp_path)
    assert got.problems[0].file == str(gone) and got.problems[0].error == "cannot be read: not a regular file"
    os.rmdir(gone)
    monkeypatch.setattr(audit_mod, "audit_files", lambda d: listing)
    got = read_newest(tmp_path)
    assert got.problems == [] and got.records == read_records(tmp_path).records


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_rotated_name_that_is_not_a_regular_file_is_a_problem_never_a_hang(tmp_path, kind):
    _log(tmp_path, 20).close()
    odd = tmp_path / "audit.log.1"
    if kind == "fifo":
        os.mkfifo(odd)  # opening it for reading would wait for a writer forever
    elif kind == "device":
        odd.symlink_to("/dev/zero")  # endless zeros
    else:
        odd.mkdir()
    got = read_newest(tmp_path)
    assert [r["i"] for r in got.records] == list(range(20))
    (p,) = got.problems
    assert p.file == str(odd) and p.line == 0
    assert p.error == "cannot be read: not a regular file"
