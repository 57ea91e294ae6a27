"""Helpers to run the real `gpuctl` CLI against real daemons, and to read a daemon's state directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from daemon_proc import REPO_ROOT, uds_client


@dataclass
class CliResult:
    """Exit code, stdout and stderr of one `gpuctl` run; `.json` decodes stdout."""

    code: int
    stdout: str
    stderr: str
    args: tuple = ()

    @property
    def json(self):
        return json.loads(self.stdout)


def run_cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout_s: float = 60.0) -> CliResult:
    """Run `python -m gpuctl.cli ARGS` (no terminal: stdin is a pipe) and capture everything."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-m", "gpuctl.cli", *args], capture_output=True, text=True,
                       input=stdin or "", env=full_env, timeout=timeout_s)
    return CliResult(p.returncode, p.stdout, p.stderr, tuple(args))


def json_error_or_nothing(r: CliResult) -> dict | None:
    """stdout of a failed run: with `--json` among its args the one error document
    (``{"error": {"code", "name", "message"}}``, code == the exit code, message == stderr's line),
    else nothing. Returns the error object or None; asserts the shape."""
    if not r.stdout:
        return None
    doc = json.loads(r.stdout)
    assert list(doc) == ["error"] and doc["error"]["code"] == r.code, doc
    assert f"gpuctl: {doc['error']['message']}" in r.stderr
    return doc["error"]


def daemon_slices(socket_path: str | Path) -> dict[str, dict]:
    """The daemon's slices by id, read straight from its control API (not through gpuctl's client)."""
    with uds_client(socket_path) as c:
        data = c.get("/v1/slices").json()
    return {s["id"]: s for s in data["slices"]}


def owners(socket_path: str | Path) -> dict[str, int]:
    """Count of slices per department on one daemon."""
    out: dict[str, int] = {}
    for s in daemon_slices(socket_path).values():
        out[s["department"]] = out.get(s["department"], 0) + 1
    return out
