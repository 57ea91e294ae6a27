"""Fleet config paths that are not a small regular file (issue 7, item 5): each exits 3 with the
reason, never hangs, reads without bound or ends in a traceback; `config check` and `status` agree.

Each case runs the real CLI (`config check` and `status`) in a subprocess with a time limit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from daemon_proc import REPO_ROOT
from fleet_fixtures import json_error_or_nothing, run_cli

from gpuctl.config import MAX_CONFIG_BYTES, ConfigError, load_config
from gpuctl.regular_file import UnreadableFile, read_regular_file

VALID = '[[node]]\nname = "n1"\ntransport = "local"\nsocket = "/nonexistent/gpuctld.sock"\n'


def _both(path) -> list:
    """`config check` and `status --json` on `path`: both must refuse the same way."""
    return [run_cli("--config", str(path), "config", "check", timeout_s=30),
            run_cli("--config", str(path), "status", "--json", timeout_s=30)]


def _fifo(tmp_path):
    p = tmp_path / "fleet.fifo"
    os.mkfifo(p)
    return p


def _dir(tmp_path):
    p = tmp_path / "fleet.d"
    p.mkdir()
    return p


def _loop(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def _dangling(tmp_path):
    p = tmp_path / "fleet.toml"
    p.symlink_to(tmp_path / "gone.toml")
    return p


def _big(tmp_path):
    p = tmp_path / "big.toml"
    with open(p, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    return p


def _socket(tmp_path):
    import socket
    import tempfile

    d = tempfile.mkdtemp(prefix="gpuctl-cfg-", dir="/tmp")
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(d, "s"))
    s.close()
    return os.path.join(d, "s")


@pytest.mark.parametrize("make, reason", [
    (_fifo, "is a FIFO (named pipe), not a regular file"),
    (lambda tmp: "/dev/zero", "is a character device, not a regular file"),
    (lambda tmp: "/dev/null", "is a character device, not a regular file"),
    (_dir, "is a directory, not a regular file"),
    (_loop, "is a symbolic link loop (too many levels of symbolic links)"),
    (_dangling, "which does not exist (dangling link)"),
    (_big, f"is {MAX_CONFIG_BYTES + 1} bytes, more than the {MAX_CONFIG_BYTES} bytes a config may have"),
    (_socket, "is a socket, not a regular file"),
], ids=["fifo", "dev-zero", "dev-null", "directory", "symlink-loop", "dangling-link", "too-large", "socket"])
def test_config_that_is_not_a_small_regular_file_exits_3_with_the_reason(tmp_path, make, reason):
    path = make(tmp_path)
    try:
        for r in _both(path):
            assert r.code == 3, (r.code, r.stderr)
            assert r.stderr.startswith(f"gpuctl: {path}: ") and reason in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
            assert r.stdout == "" if "check" in r.args else json_error_or_nothing(r)["code"] == 3
    finally:
        if str(path).startswith("/tmp/gpuctl-cfg-"):
            shutil.rmtree(os.path.dirname(str(path)), ignore_errors=True)


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text(VALID)
    link = tmp_path / "fleet.toml"
    link.symlink_to(real)
    check = run_cli("--config", str(link), "config", "check")
    assert check.code == 0, check.stderr
    assert [n.name for n in load_config(link).nodes] == ["n1"]


def test_missing_config_still_says_no_fleet_config(tmp_path):
    for r in _both(tmp_path / "absent.toml"):
        assert r.code == 3 and f"no fleet config at {tmp_path / 'absent.toml'} (from --config)" in r.stderr


def _as_unprivileged() -> list[str]:
    """A command prefix under which permission bits apply (root keeps uid 0 without DAC override)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be tested")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.parametrize("what", ["untraversable-dir", "unreadable-file"])
def test_permission_denied_names_the_cause_and_exits_3(tmp_path, what):
    locked = tmp_path / "locked"
    locked.mkdir()
    cfg = locked / "fleet.toml"
    cfg.write_text(VALID)
    if what == "untraversable-dir":
        locked.chmod(0o600)  # readable listing, no x: the file inside cannot be reached
        reason = f"permission denied: the directory {locked} (or one above it) cannot be traversed"
    else:
        cfg.chmod(0o000)
        reason = "permission denied: the file is not readable by this user"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    try:
        for verb in (["config", "check"], ["status", "--json"]):
            p = subprocess.run([*_as_unprivileged(), sys.executable, "-m", "gpuctl.cli", "--config", str(cfg), *verb],
                               capture_output=True, text=True, env=env, timeout=30, stdin=subprocess.DEVNULL)
            assert p.returncode == 3, (p.returncode, p.stderr)
            assert "Traceback" not in p.stderr and "internal error" not in p.stderr
            assert p.stderr == f"gpuctl: {cfg}: {reason} (no x permission)\n" if what == "untraversable-dir" \
                else p.stderr == f"gpuctl: {cfg}: {reason}\n", p.stderr
        p = subprocess.run([*_as_unprivileged(), sys.executable, "-m", "gpuctl.cli", "--config", str(cfg), "config",
                            "path", "--json"], capture_output=True, text=True, env=env, timeout=30,
                           stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr  # says where it looks; never a PermissionError traceback
        assert json.loads(p.stdout)["path"] == str(cfg)
    finally:
        locked.chmod(0o700)
        cfg.chmod(0o600)


def test_empty_config_check_and_status_agree(tmp_path):
    """Before: `config check` said OK on an empty file while `status` exited 3."""
    for text in ("", "# nothing yet\n", '[[department]]\nname = "research"\n'):
        empty = tmp_path / "empty.toml"
        empty.write_text(text)
        for r in _both(empty):
            assert r.code == 3, (text, r.code, r.stderr)
            assert f"gpuctl: {empty}: defines no nodes: add a [[node]] table" in r.stderr
            assert r.stdout == "" if "check" in r.args else json_error_or_nothing(r)["code"] == 3


def test_read_regular_file_reads_at_most_the_bound(tmp_path):
    ok = tmp_path / "ok"
    ok.write_bytes(b"x" * 100)
    assert read_regular_file(ok, 100) == b"x" * 100
    with pytest.raises(UnreadableFile) as e:
        read_regular_file(ok, 99)
    assert e.value.reason == "is 100 bytes, more than the 99 bytes a config may have"
    with pytest.raises(UnreadableFile) as e:
        read_regular_file(tmp_path / "nope", 10)
    assert e.value.missing
    with pytest.raises(ConfigError) as ce:
        load_config("/dev/zero")
    assert str(ce.value) == "/dev/zero: is a character device, not a regular file"
