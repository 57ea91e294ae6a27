"""GET /v1/audit reads only what its answer needs: the newest files first, each from its end,
stopping at the limit or at `since_s` (gpuctl.daemon.audit.read_newest), with the same records and
problems as reading the whole log (read_records) and cutting it."""

from __future__ import annotations

import itertools

import pytest

from gpuctl.daemon.api import ApiError, ApiRequest
from gpuctl.daemon.audit import AuditLog, audit_files, read_newest, read_records
from gpuctl.daemon.audit_api import install


@pytest.fixture
def log_dir(tmp_path):
    """1500 records (time_s 1000, 1001, ...) in an audit log rotated every 4 KiB: ~37 files."""
    ticks = itertools.count(1000)
    audit = AuditLog(tmp_path, "node-a", clock=lambda: float(next(ticks)), max_bytes=4096, keep=80)
    audit.open()
    for i in range(1500):
        audit.append({"event": "request", "phase": "begin", "op": f"op-{i}", "i": i})
    audit.close()
    assert len(audit_files(tmp_path)) >= 30
    return tmp_path


def test_small_limit_reads_one_file_and_limit_plus_one_lines(log_dir):
    everything = read_records(log_dir)
    got = read_newest(log_dir, limit=10)
    assert got.records == everything.records[-10:] and got.truncated
    # audit.log first; audit.log.1 too only when audit.log holds fewer than 11 records
    assert got.files_read[0] == str(log_dir / "audit.log") and len(got.files_read) <= 2
    assert got.lines_parsed == 11  # the 10 records and the one that says there are more
    assert everything.lines_parsed == 1500 and len(everything.records) == 1500


def test_since_stops_at_the_first_older_record(log_dir):
    everything = read_records(log_dir).records
    since = everything[-100]["time_s"]
    got = read_newest(log_dir, since_s=since)
    assert got.records == read_records(log_dir, since).records == everything[-100:] and not got.truncated
    assert got.lines_parsed == 101  # the 100 answered and the older one where reading stopped
    assert len(got.files_read) < len(audit_files(log_dir)) // 4
    # since and limit together: the newer of the two bounds
    got = read_newest(log_dir, since_s=since, limit=30)
    assert got.records == everything[-30:] and got.truncated and got.lines_parsed == 31


def test_no_bound_gives_the_whole_log_and_its_problems(log_dir):
    oldest = audit_files(log_dir)[0]
    with open(oldest, "ab") as f:  # a line cut by a crash, in the oldest file
        f.write(b'{"time_s": 1, "cut')
    everything = read_records(log_dir)
    got = read_newest(log_dir, limit=20000)
    assert got.records == everything.records and not got.truncated
    assert [p.to_json() for p in got.problems] == [p.to_json() for p in everything.problems]
    (problem,) = got.problems
    assert problem.file == str(oldest) and problem.error.startswith("truncated")
    assert problem.line == len(oldest.read_bytes().split(b"\n"))
    # a small answer never reaches the oldest file: its problem is not read, so not reported
    assert read_newest(log_dir, limit=5).problems == []
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        read_newest(log_dir, limit=0)


class Api:
    """The part of gpuctl.daemon.api.ControlApi that audit_api.install uses."""

    def __init__(self):
        self.routes = {}

    def handle(self, request):
        return self.routes[(request.method, request.path)](request)

    def add_route(self, method, path, handler):
        self.routes[(method, path)] = handler


def test_route_limit_and_its_errors(log_dir):
    api = Api()
    audit = AuditLog(log_dir, "node-a")
    install(api, audit)
    everything = read_records(log_dir).records

    def get(**query):
        return api.handle(ApiRequest("GET", "/v1/audit", {k: [v] for k, v in query.items()}))

    status, body = get(limit="7")
    assert status == 200 and body["records"] == everything[-7:] and body["truncated"] is True
    status, body = get(since_s=str(everything[-3]["time_s"]))
    assert status == 200 and body["records"] == everything[-3:] and body["truncated"] is False
    for bad in ("0", "20001", "ten", "-1", "1.5"):
        with pytest.raises(ApiError) as e:
            get(limit=bad)
        assert e.value.status == 400 and e.value.field == "limit"
        assert f"limit must be a whole number from 1 to 20000, got {bad!r}" in str(e.value)
    assert read_records(log_dir).records == everything  # reading changed nothing
