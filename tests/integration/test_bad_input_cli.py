"""Adversarial input to the `gpuctl` CLI: bad flag values, odd request ids, unknown nodes. Every
bad invocation exits with the code README documents, names the flag on stderr, leaves stdout
empty or one JSON document, and moves nothing.
"""

from __future__ import annotations

import json

import pytest

from gpuctl.exit_codes import ExitCode

from daemon_proc import start_daemon
from fleet_fixtures import owners, run_cli
from gpuctl.fleet.client import FleetClient
from gpuctl.config import load_config

CONFIG = """
[[department]]
name = "research"

[[node]]
name = "n1"
transport = "local"
socket = "{s1}"
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("badcli")
    d = start_daemon(tmp, gpus=4, seed=11, name="n1")
    cfg = tmp / "fleet.toml"
    cfg.write_text(CONFIG.format(s1=d.socket_path))
    try:
        yield cfg, d
    finally:
        d.stop()


def _reassign(cfg, *extra: str):
    return run_cli("--config", str(cfg), "reassign", "--from", "unassigned", "--to", "research", "--yes",
                   "--json", *extra)


@pytest.mark.parametrize("extra, words", [
    (("--count", "abc"), "--count: invalid int value: 'abc'"),
    (("--count", "0"), "--count: must be a positive integer, got 0"),
    (("--count", "1e3"), "--count: invalid int value: '1e3'"),
    (("--gpus", "nan"), "--gpus: must be a positive number of GPU-equivalents (finite)"),
    (("--gpus", "inf"), "--gpus: must be a positive number of GPU-equivalents (finite)"),
    (("--gpus", "1e308"), None),  # finite but more than the fleet: nothing to do (4), see below
    (("--gpus", "1e-300"), "--gpus: must be a positive number of GPU-equivalents (finite)"),
    (("--count", "1", "--request-id", "x\ny"), "--request-id: must be 1..200 printable characters"),
    (("--count", "1", "--request-id", " "), "--request-id: must be 1..200 printable characters"),
    (("--count", "1", "--request-id", " pad"), "--request-id: must be 1..200 printable characters"),
    (("--count", "1", "--request-id", "x" * 201), "--request-id: must be 1..200 printable characters"),
    (("--count", "1", "--request-id", "a\x1b[31m"), "--request-id: must be 1..200 printable characters"),
    (("--count", "1", "--node", "nope"), "--node: unknown node 'nope' (known: n1)"),
], ids=["count-abc", "count-0", "count-1e3", "gpus-nan", "gpus-inf", "gpus-1e308", "gpus-tiny", "rid-newline",
        "rid-space", "rid-padded", "rid-long", "rid-escape", "unknown-node"])
def test_bad_values_are_usage_errors_and_move_nothing(fleet, extra, words):
    cfg, d = fleet
    before = owners(d.socket_path)
    r = _reassign(cfg, *extra)
    assert owners(d.socket_path) == before
    if words is None:
        assert r.code == 4, r.stderr
        doc = json.loads(r.stdout)  # one JSON document, nothing else
        assert doc["moved"] == [] and doc["exit_code"] == 4
        return
    assert r.code == 2, (r.code, r.stderr)
    assert json.loads(r.stdout)["error"]["code"] == 2  # --json: the error as one document
    assert words in r.stderr


def test_request_ids_with_url_characters_replay_and_are_found(fleet):
    # Before: GET /v1/requests/{id} was not quoted, so "a/b?c#d" was looked up as "a/b" and a
    # re-run could not see what an earlier run had moved.
    cfg, d = fleet
    fleet_client = FleetClient(load_config(cfg))
    try:
        for rid in ("a/b?c#d", "x%2Fy", "ü ñ"):
            r1 = _reassign(cfg, "--count", "1", "--request-id", rid)
            assert r1.code == 0, r1.stderr
            moved = json.loads(r1.stdout)["moved"]
            assert len(moved) == 1
            answer = fleet_client.clients["n1"].request_result(rid)
            assert answer is not None and answer["moved"] == [moved[0]["slice_id"]]
            before = owners(d.socket_path)
            r2 = _reassign(cfg, "--count", "1", "--request-id", rid)
            assert r2.code == 0, r2.stderr
            assert owners(d.socket_path) == before  # nothing moved twice
    finally:
        fleet_client.close()


@pytest.mark.parametrize("args, code", [
    (("bogus-verb",), 2),
    (("status", "--bogus"), 2),
    (("reassign",), 2),
    (("status", "--node", "nope"), 2),
    (("--config", "/nonexistent/fleet.toml", "status"), 3),
    (("--config", "/etc", "status"), 3),
])
def test_json_mode_errors_are_a_json_document_and_a_message(fleet, args, code):
    # Before: stdout was empty with --json, so a script had only the exit code.
    cfg, _ = fleet
    if args[0] != "--config":
        args = ("--config", str(cfg), *args)
    r = run_cli(*args, "--json")
    assert r.code == code, r.stderr
    assert r.stderr.startswith("gpuctl: ")
    e = json.loads(r.stdout)["error"]
    assert e["code"] == code and e["name"] == ExitCode(code).name
    assert r.stderr.strip() == f"gpuctl: {e['message']}"
