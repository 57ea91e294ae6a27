"""Helpers to run the real `gpuctl` CLI against real daemons, and to read a daemon's state directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from daemon_proc import REPO_ROOT, DaemonProc, start_daemon, uds_client

#: the departments most CLI tests name: name -> priority (None: the file gives it no priority)
DEPARTMENTS: dict[str, int | None] = {"research": 10, "training": 20}


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


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with this checkout first on PYTHONPATH, then `env` over it."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return full_env


def run_cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout_s: float = 60.0) -> CliResult:
    """Run `python -m gpuctl.cli ARGS` (no terminal: stdin is a pipe) and capture everything."""
    p = subprocess.run([sys.executable, "-m", "gpuctl.cli", *args], capture_output=True, text=True,
                       input=stdin or "", env=cli_env(env), timeout=timeout_s)
    return CliResult(p.returncode, p.stdout, p.stderr, tuple(args))


@contextmanager
def cli_process(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Start `python -m gpuctl.cli ARGS` (stdin /dev/null, stdout and stderr text pipes) and yield
    it running, for tests that read its output or signal it; killed and reaped on exit if it is
    still running."""
    p = subprocess.Popen([sys.executable, "-m", "gpuctl.cli", *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(env))
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


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


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a TOML basic string for the paths and commands tests use


def fleet_toml(nodes: Mapping[str, Mapping[str, object]],
               departments: Mapping[str, int | None] = DEPARTMENTS) -> str:
    """A gpuctl fleet file: one ``[[department]]`` per entry of `departments` (name -> priority,
    None for none), then one ``[[node]]`` per entry of `nodes` (name -> its other keys, in order)."""
    out = []
    for name, prio in departments.items():
        out.append(f'\n[[department]]\nname = "{name}"\n' + ("" if prio is None else f"priority = {prio}\n"))
    for name, fields in nodes.items():
        out.append(f'\n[[node]]\nname = "{name}"\n'
                   + "".join(f"{k} = {_toml_value(v)}\n" for k, v in fields.items()))
    return "".join(out)


def local_node(socket_path: str | Path, **fields: object) -> dict[str, object]:
    """A node reached on a local Unix socket (``transport = "local"``), plus any other keys."""
    return {"transport": "local", "socket": str(socket_path), **fields}


def sshd_node(socket_path: str | Path, **fields: object) -> dict[str, object]:
    """A node reached through the test sshd (host ``test-sshd``), its gpuctld run by this Python."""
    return {"host": "test-sshd", "socket": str(socket_path), "gpuctld": f"{sys.executable} -m gpuctl.daemon",
            "timeout_s": 8, **fields}


def ssh_cli_args(cfg: Path, sshd) -> tuple[str, ...]:
    """The global flags that point `gpuctl` at `cfg` and the test sshd's ssh config and known_hosts."""
    return ("--config", str(cfg), "--ssh-config", str(sshd.ssh_config), "--known-hosts", str(sshd.known_hosts))


def write_fleet_config(path: Path, nodes: Mapping[str, Mapping[str, object]],
                       departments: Mapping[str, int | None] = DEPARTMENTS) -> Path:
    """Write `fleet_toml(nodes, departments)` to `path`; returns `path`."""
    path.write_text(fleet_toml(nodes, departments))
    return path


@contextmanager
def local_fleet(tmp_path: Path, seeds: Mapping[str, int], *, gpus: int = 2,
                departments: Mapping[str, int | None] = DEPARTMENTS,
                extra_args: Sequence[str] | None = None,
                extra_nodes: Mapping[str, Mapping[str, object]] | None = None,
                ) -> Iterator[tuple[Path, list[DaemonProc]]]:
    """Start one simulated gpuctld per entry of `seeds` (node name -> seed, `gpus` GPUs each, with
    `extra_args`) and write tmp_path/fleet.toml naming them as local nodes, then `extra_nodes`.
    Yields (config path, the daemons in `seeds` order); stops every daemon it started on exit."""
    daemons: list[DaemonProc] = []
    try:
        for name, seed in seeds.items():
            daemons.append(start_daemon(tmp_path, gpus=gpus, seed=seed, name=name,
                                        extra_args=tuple(extra_args or ())))
        nodes = {d_name: local_node(d.socket_path) for d_name, d in zip(seeds, daemons)}
        nodes.update(extra_nodes or {})
        yield write_fleet_config(tmp_path / "fleet.toml", nodes, departments), daemons
    finally:
        for d in daemons:
            d.stop()
