"""`gpuctl VERB | head -1`: when stdout's reader goes away, gpuctl ends as coreutils tools do, by
SIGPIPE (141 in a shell) and with nothing on stderr; a broken pipe anywhere else stays an error
with its message. (Found by a new-admin trial: rich's Console exited 1, documented as an internal
error, in silence.)"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from fleet_fixtures import cli_env, local_fleet

from gpuctl.cli.output import stdout_reader_gone


def _run_with_stdout_closed(*args: str) -> subprocess.CompletedProcess:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before gpuctl writes a byte: every write is EPIPE
    try:
        return subprocess.run([sys.executable, "-m", "gpuctl.cli", *args], stdout=w, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=cli_env(None), timeout=60)
    finally:
        os.close(w)


@pytest.mark.parametrize("verb", [["status"], ["status", "--json"], ["departments"], ["leases"],
                                  ["report", "--since", "1h"], ["config", "path"]])
def test_a_verb_whose_reader_went_away_ends_by_sigpipe_in_silence(tmp_path, verb):
    with local_fleet(tmp_path, {"n1": 11}, gpus=2) as (cfg, _):
        p = _run_with_stdout_closed(*verb, "--config", str(cfg))
    assert p.returncode == -signal.SIGPIPE, (p.returncode, p.stderr)
    # nothing about the pipe (a table's own note on stderr, e.g. a column left out, may precede)
    assert b"error" not in p.stderr and b"Traceback" not in p.stderr and b"pipe" not in p.stderr.lower()
    if verb[0] in ("status", "departments", "config"):
        assert p.stderr == b""


def test_a_broken_pipe_that_is_not_stdout_is_not_taken_for_it(capfd):
    # stdout is a live pipe (pytest's capture): a broken pipe to a node or a child is an error
    assert stdout_reader_gone(BrokenPipeError(errno.EPIPE, "to node n1")) is False
    assert stdout_reader_gone(ValueError("x")) is False


def test_reader_gone_is_seen_on_a_pipe_without_reader(monkeypatch):
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w") as dead:
        monkeypatch.setattr(sys, "stdout", dead)
        assert stdout_reader_gone(BrokenPipeError(errno.EPIPE, "stdout")) is True
        assert stdout_reader_gone(ConnectionResetError(errno.ECONNRESET, "x")) is False
