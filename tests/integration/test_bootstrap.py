"""`gpuctl node bootstrap` against a real sshd on 127.0.0.1 (the node is this machine).

The wheel is built once per module (pip wheel, ~5 s) and installed once (module fixture
`installed`) with --no-systemd --no-index --find-links WHEELHOUSE: the dependencies come from a
wheelhouse packed from the distributions installed in the test's interpreter (tests/support/wheelhouse.py),
so no package index is reached and it works the same from a virtualenv or the system Python. A real
install leaves out --no-index and --find-links: pip then fetches textual, httpx, paramiko, ... from
the node's index into the venv. The systemd steps cannot run here (no systemd); their unit text and the health check are
tested on their own (the health check against a real gpuctld through sshd).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_proc import REPO_ROOT, start_daemon
from fleet_fixtures import run_cli
from sshd import SshServer, free_port, sshd_available
from wheelhouse import build_wheelhouse

from gpuctl.fleet.bootstrap import (BootstrapError, BootstrapOptions, build_wheel, check_wheel, node_toml, render_unit,
                              resolve_target, unit_socket, wait_healthy)
from gpuctl.config import NodeConfig
from gpuctl.transport.errors import TransportError
from gpuctl.transport.ssh import SshTransport

pytestmark = [pytest.mark.sshd, pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd")]

UNIT = (REPO_ROOT / "deploy" / "gpuctld.service").read_text()


class SftpSshServer(SshServer):
    """SshServer with the SFTP subsystem on (internal-sftp), as a stock sshd_config has it."""

    def _write_configs(self) -> None:
        super()._write_configs()
        with open(self.dir / "sshd_config", "a") as f:
            f.write("Subsystem sftp internal-sftp\n")


@pytest.fixture(scope="module")
def sshd():
    with SftpSshServer() as server:
        (server.dir / "empty_ssh_config").write_text("")  # no ~/.ssh/config of this machine's user
        yield server


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(REPO_ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """gpuctl's dependencies as wheels, packed from this interpreter's installed distributions."""
    out = tmp_path_factory.mktemp("wheelhouse")
    build_wheelhouse("gpuctl", out)
    return out


@pytest.fixture(scope="module")
def fleet_toml(sshd, tmp_path_factory) -> Path:
    """A fleet config naming the sshd as node "gpu-a" (its SSH settings only there) and a dead node."""
    path = tmp_path_factory.mktemp("cfg") / "fleet.toml"
    path.write_text(
        f'[[node]]\nname = "gpu-a"\nhost = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
        f'identity_file = "{sshd.user_key}"\n\n'
        f'[[node]]\nname = "gpu-down"\nhost = "127.0.0.1"\nport = {free_port()}\ntimeout_s = 2\n')
    return path


def _common(sshd, fleet_toml) -> list[str]:
    return ["--config", str(fleet_toml), "--known-hosts", str(sshd.known_hosts),
            "--ssh-config", str(sshd.dir / "empty_ssh_config")]


@pytest.fixture(scope="module")
def installed(sshd, wheel, wheelhouse, fleet_toml, tmp_path_factory):
    """One real bootstrap (--json) into a fresh prefix: (prefix, CliResult). A marker file is left in
    the venv to show that a later run updates it in place."""
    prefix = tmp_path_factory.mktemp("node") / "gpuctl"
    args = ["node", "bootstrap", "gpu-a", "--json", *_common(sshd, fleet_toml), "--wheel", str(wheel),
            "--prefix", str(prefix), "--python", sys.executable, "--no-systemd", "--no-index",
            "--find-links", str(wheelhouse), "--yes"]
    first = run_cli(*args, timeout_s=300)
    if first.code == 0:
        (prefix / "lib" / "marker-from-first-run").write_text("kept")
    return prefix, first


def test_bootstrap_installs_gpuctld_into_the_prefix(installed, wheel, sshd):
    prefix, first = installed
    assert first.code == 0, first.stderr
    doc = first.json
    assert doc["ok"] is True and doc["exit_code"] == 0 and doc["node"] == "gpu-a"
    assert doc["address"] == f"127.0.0.1:{sshd.port}"  # the node's port from the fleet config was used
    names = [s["name"] for s in doc["steps"]]
    assert names == ["connect", "check-python", "upload", "create-venv", "install-gpuctl", "verify", "cleanup"]
    assert all(s["status"] == "ok" for s in doc["steps"]), doc["steps"]
    check = doc["steps"][1]
    assert check["detail"] == "Python %d.%d.%d" % sys.version_info[:3]
    assert doc["steps"][5]["detail"] == f"gpuctl 0.1.0 at {prefix}/bin/gpuctld"
    assert doc["node_toml"] == (f'[[node]]\nname = "gpu-a"\nhost = "127.0.0.1"\nuser = "{sshd.user}"\n'
                                f'port = {sshd.port}\nidentity_file = "{sshd.user_key}"\n'
                                f'gpuctld = "{prefix}/bin/gpuctld"\n')
    # steps are said on stderr as they run
    assert "[2/7] check that" in first.stderr and "[7/7] cleanup ok" in first.stderr
    # the node's temp dir is gone, the wheel was uploaded there under its own name
    assert doc["remote_tmp"].startswith("/tmp/gpuctl-bootstrap.") and not Path(doc["remote_tmp"]).exists()
    assert f"{doc['remote_tmp']}/{wheel.name}" in doc["steps"][2]["detail"]
    # the dependencies came from the wheelhouse into the venv itself (no system site packages)
    assert f"--no-index --find-links {doc['find_links']} " in doc["steps"][4]["command"]
    assert "include-system-site-packages = false" in (prefix / "pyvenv.cfg").read_text()
    assert list((prefix / "lib").glob("python3*/site-packages/textual/__init__.py"))
    assert list((prefix / "lib").glob("python3*/site-packages/paramiko/__init__.py"))
    # the installed program runs
    gpuctld = prefix / "bin" / "gpuctld"
    assert gpuctld.is_file() and os.access(gpuctld, os.X_OK)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([str(gpuctld), "bridge", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "usage: gpuctld bridge" in p.stdout


def test_installed_wheel_has_themes_and_tcss(installed):
    """The pip-installed package finds its themes (data-files) and ships the .tcss stylesheets."""
    prefix, first = installed
    assert first.code == 0, first.stderr
    themes = prefix / "share" / "gpuctl" / "themes"
    assert sorted(p.name for p in themes.glob("*.toml")) == ["gpuctl-dark.toml", "gpuctl-light.toml",
                                                              "high-contrast.toml"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import gpuctl, pathlib, gpuctl.themes as t; root = pathlib.Path(gpuctl.__file__).parent; "
            "print(root); print(sorted(str(p.relative_to(root)) for p in root.rglob('*.tcss'))); "
            "print(t.default_theme_dirs()[0])")
    p = subprocess.run([str(prefix / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env,
                       cwd="/", timeout=60)
    assert p.returncode == 0, p.stderr
    root, tcss, theme_dir = p.stdout.splitlines()
    assert root.startswith(str(prefix / "lib"))  # the venv's copy, not this checkout
    assert tcss == str(sorted(str(x.relative_to(REPO_ROOT / "gpuctl")) for x in (REPO_ROOT / "gpuctl").rglob("*.tcss")))
    assert "app.tcss" in tcss and "screens/board.tcss" in tcss
    assert theme_dir == str(themes)


def test_dry_run_changes_nothing(sshd, fleet_toml, wheel, tmp_path):
    prefix = tmp_path / "never"
    r = run_cli("node", "bootstrap", "gpu-a", "--json", *_common(sshd, fleet_toml), "--wheel", str(wheel),
                "--prefix", str(prefix), "--python", sys.executable, "--dry-run")
    assert r.code == 0, r.stderr
    doc = r.json
    assert doc["dry_run"] is True and doc["remote_tmp"] is None
    assert [s["status"] for s in doc["steps"]] == ["planned"] * len(doc["steps"])
    assert [s["name"] for s in doc["steps"]][-4:] == ["install-unit", "start-service", "health", "cleanup"]
    assert f"{sys.executable} -m venv {prefix}" in doc["steps"][4]["command"]
    assert not prefix.exists()
    assert not list(Path("/tmp").glob(f"gpuctl-bootstrap.*/{wheel.name}"))


def test_python_too_old_fails_naming_node_and_version(sshd, fleet_toml, wheel, tmp_path):
    fake = tmp_path / "python-old"
    fake.write_text("#!/bin/sh\necho 3.8.10\n")
    fake.chmod(0o755)
    prefix = tmp_path / "prefix"
    r = run_cli("node", "bootstrap", "gpu-a", *_common(sshd, fleet_toml), "--wheel", str(wheel), "--prefix",
                str(prefix), "--python", str(fake), "--no-systemd", "--yes")
    assert r.code == 1, r.stderr
    assert (f"gpuctl: node gpu-a: step check-python failed: {fake} on the node is Python 3.8.10; gpuctl needs "
            "Python >= 3.11") in r.stderr
    assert not prefix.exists()
    assert r.stdout == ""


def test_missing_python_is_named(sshd, wheel, tmp_path):
    """A host (not a fleet node), through an ~/.ssh/config alias; --python names no program."""
    r = run_cli("node", "bootstrap", "test-sshd", "--ssh-config", str(sshd.ssh_config), "--config",
                str(tmp_path / "absent.toml"), "--wheel", str(wheel), "--prefix", str(tmp_path / "p"),
                "--python", "/nonexistent/python3.99", "--no-systemd", "--yes", "--json")
    assert r.code == 3 and "config file not found" in r.stderr  # an explicit --config must exist
    r = run_cli("node", "bootstrap", "test-sshd", "--ssh-config", str(sshd.ssh_config), "--known-hosts",
                str(sshd.known_hosts), "--wheel", str(wheel),
                "--prefix", str(tmp_path / "p"), "--python", "/nonexistent/python3.99", "--no-systemd", "--yes",
                "--json", env={"GPUCTL_CONFIG": str(tmp_path / "absent.toml")})
    assert r.code == 1, r.stderr
    err = r.json["error"]
    assert err["step"] == "check-python" and err["rc"] == 127
    assert "no Python '/nonexistent/python3.99' on the node" in err["message"]
    assert err["message"].startswith("node test-sshd: ")
    assert not (tmp_path / "p").exists()


def test_no_terminal_without_yes_exits_2(sshd, fleet_toml, wheel, tmp_path):
    prefix = tmp_path / "prefix"
    r = run_cli("node", "bootstrap", "gpu-a", *_common(sshd, fleet_toml), "--wheel", str(wheel),
                "--prefix", str(prefix), "--python", sys.executable, "--no-systemd")
    assert r.code == 2
    assert "no terminal is there to confirm: pass --yes" in r.stderr and "gpu-a" in r.stderr
    assert not prefix.exists()


def test_unreachable_node_exits_7_naming_it(fleet_toml, wheel, tmp_path):
    r = run_cli("node", "bootstrap", "gpu-down", "--config", str(fleet_toml), "--wheel", str(wheel),
                "--prefix", str(tmp_path / "p"), "--no-systemd", "--yes", "--json")
    assert r.code == 7, r.stderr
    doc = r.json
    assert doc["error"]["step"] == "connect"
    assert doc["error"]["message"].startswith("node gpu-down (127.0.0.1:")
    assert "connection refused" in doc["error"]["message"]
    assert "gpuctl: node gpu-down (127.0.0.1:" in r.stderr
    assert [s["status"] for s in doc["steps"]][:2] == ["failed", "skipped"]


def test_failed_remote_step_reports_command_status_and_stderr(sshd, fleet_toml, wheel, tmp_path):
    """A prefix that is a directory of other things: create-venv refuses; nothing in it changes."""
    prefix = tmp_path / "busy"
    prefix.mkdir()
    (prefix / "data.txt").write_text("theirs")
    r = run_cli("node", "bootstrap", "gpu-a", "--json", *_common(sshd, fleet_toml), "--wheel", str(wheel),
                "--prefix", str(prefix), "--python", sys.executable, "--no-systemd", "--yes")
    assert r.code == 1, r.stderr
    err = r.json["error"]
    assert err["step"] == "create-venv" and err["rc"] == 3
    assert err["command"].startswith("sh -c ") and f"-m venv {prefix}" in err["command"]
    assert err["stderr_tail"] == (f"{prefix} exists and is not a Python virtual environment (no pyvenv.cfg): "
                                  "refusing to install into it; choose another --prefix")
    assert "step create-venv failed: `sh -c" in r.stderr and "(exit status 3)" in r.stderr
    assert sorted(p.name for p in prefix.iterdir()) == ["data.txt"]
    steps = {s["name"]: s["status"] for s in r.json["steps"]}
    assert steps["install-gpuctl"] == "skipped" and steps["cleanup"] == "ok"
    assert not Path(r.json["remote_tmp"]).exists()


def test_no_sftp_subsystem_fails_the_upload(wheel, tmp_path):
    with SshServer() as plain:  # no Subsystem line: SFTP refused
        r = run_cli("node", "bootstrap", "test-sshd", "--ssh-config", str(plain.ssh_config), "--known-hosts",
                    str(plain.known_hosts), "--wheel", str(wheel),
                    "--prefix", str(tmp_path / "p"), "--python", sys.executable, "--no-systemd", "--yes", "--json",
                    env={"GPUCTL_CONFIG": str(tmp_path / "absent.toml")})
    assert r.code == 1, r.stderr
    err = r.json["error"]
    assert err["step"] == "upload"
    assert "node test-sshd (127.0.0.1:" in err["message"] and "offers no SFTP" in err["message"]
    assert not (tmp_path / "p").exists()
    assert not Path(r.json["remote_tmp"]).exists()  # the temp dir made before the refusal is removed


@pytest.mark.parametrize("args, message", [
    (["--prefix", "relative/dir"], "--prefix 'relative/dir': must be an absolute path on the node"),
    (["--prefix", "/opt/gpu ctl"], "--prefix '/opt/gpu ctl': only letters, digits"),
    (["--prefix", "/root/gpuctl"], "--prefix /root/gpuctl: the unit has ProtectHome=yes"),
    (["--wheel", "/nonexistent/gpuctl-0.1.0-py3-none-any.whl"], "--wheel /nonexistent/gpuctl-0.1.0-py3-none-any.whl: no such file"),
    (["--backend", "cuda"], "argument --backend: invalid choice: 'cuda'"),
    (["--find-links", "wheels"], "--find-links 'wheels': must be an absolute path of a directory on the node"),
])
def test_bad_flags_exit_2_and_touch_nothing(args, message, tmp_path):
    r = run_cli("node", "bootstrap", "somehost", "--yes", *args, env={"GPUCTL_CONFIG": str(tmp_path / "absent")})
    assert r.code == 2
    assert message in r.stderr
    assert r.stdout == ""


def test_not_a_wheel_is_refused(tmp_path):
    bogus = tmp_path / "gpuctl.tar.gz"
    bogus.write_text("x")
    with pytest.raises(BootstrapError) as e:
        check_wheel(bogus)
    assert e.value.exit_code == 2 and "not a gpuctl wheel" in e.value.message


def test_build_wheel_failure_asks_for_wheel(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text("this is [not toml\n")
    with pytest.raises(BootstrapError) as e:
        build_wheel(src, tmp_path / "out")
    assert e.value.step == "build-wheel" and e.value.exit_code == 1
    assert "pass --wheel PATH" in e.value.message and f"cannot build a wheel from {src}" in e.value.message
    assert not list((tmp_path).glob("out/*.whl"))


def test_render_unit_points_to_the_prefix():
    text = render_unit(UNIT, prefix="/opt/gpuctl", backend="simulated")
    exec_lines = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert exec_lines == ["ExecStart=/opt/gpuctl/bin/gpuctld serve --backend simulated --state-dir /var/lib/gpuctld "
                          "--socket /run/gpuctld/gpuctld.sock"]
    # every other line is kept as it is
    assert [ln for ln in text.splitlines() if not ln.startswith("ExecStart=")] == \
        [ln for ln in UNIT.splitlines() if not ln.startswith("ExecStart=")]
    assert unit_socket(text) == "/run/gpuctld/gpuctld.sock"
    bare = render_unit("[Service]\nExecStart=/usr/bin/gpuctld\n", prefix="/p", backend="nvml")
    assert bare == "[Service]\nExecStart=/p/bin/gpuctld serve --backend nvml\n"
    with pytest.raises(ValueError, match="no ExecStart= line"):
        render_unit("[Service]\n", prefix="/p", backend="nvml")


def test_target_and_snippet():
    t = resolve_target("admin@gpu7.example", None)
    assert (t.name, t.node.host, t.node.user, t.from_config) == ("admin@gpu7.example", "gpu7.example", "admin", False)
    assert node_toml(t, "/opt/gpuctl") == ('[[node]]\nname = "admin@gpu7.example"\nhost = "gpu7.example"\n'
                                           'user = "admin"\ngpuctld = "/opt/gpuctl/bin/gpuctld"\n')
    for bad in ("", "-oProxyCommand=x", "a b", "user@"):
        with pytest.raises(BootstrapError) as e:
            resolve_target(bad, None)
        assert e.value.exit_code == 2 and "NODE_OR_HOST" in e.value.message
    BootstrapOptions(prefix="/opt/gpuctl").check()


def test_health_check_through_the_bridge(installed, sshd, tmp_path):
    """The health step's own check: `PREFIX/bin/gpuctld bridge` against a real daemon, through sshd."""
    prefix, first = installed
    assert first.code == 0, first.stderr
    node = NodeConfig(name="gpu-a", host="127.0.0.1", port=sshd.port, user=sshd.user,
                      identity_file=str(sshd.user_key), timeout_s=5.0)
    t = SshTransport(node, ssh_config_path=str(sshd.dir / "empty_ssh_config"), known_hosts_path=str(sshd.known_hosts))

    def remote(step, command, *, stdin=None, timeout_s=None, check=True):
        return t.run(command, stdin=stdin, timeout_s=timeout_s)

    bridge = f"{prefix}/bin/gpuctld bridge --socket "
    try:
        with start_daemon(tmp_path, gpus=1) as d:
            ok, detail = wait_healthy(remote, bridge + str(d.socket_path), timeout_s=10)
            assert (ok, detail) == (True, "healthy (HTTP/1.1 200 OK)")
        ok, detail = wait_healthy(remote, bridge + str(tmp_path / "none.sock"), timeout_s=0.5, interval_s=0.2)
        assert ok is False
        assert detail == f"gpuctld is not running on this node: no socket at {tmp_path / 'none.sock'}"
    finally:
        t.close()


def test_transport_run_and_put_file(sshd, tmp_path):
    node = NodeConfig(name="gpu-a", host="127.0.0.1", port=sshd.port, user=sshd.user,
                      identity_file=str(sshd.user_key), timeout_s=5.0)
    t = SshTransport(node, ssh_config_path=str(sshd.dir / "empty_ssh_config"), known_hosts_path=str(sshd.known_hosts))
    try:
        r = t.run("cat; echo to-stderr >&2; exit 4", stdin=b"hello\n")
        assert (r.rc, r.stdout, r.stderr, r.timed_out) == (4, b"hello\n", b"to-stderr\n", False)
        r = t.run("sleep 5", timeout_s=0.3)
        assert r.timed_out is True and r.rc is None
        src = tmp_path / "blob"
        src.write_bytes(b"x" * 100_000)
        assert t.put_file(src, str(tmp_path / "copy"), 0o600) == 100_000
        assert (tmp_path / "copy").read_bytes() == src.read_bytes()
        assert (tmp_path / "copy").stat().st_mode & 0o777 == 0o600
        with pytest.raises(OSError) as e:
            t.put_file(src, str(tmp_path / "no" / "such" / "dir" / "f"))
        assert str(e.value).startswith(f"node gpu-a (127.0.0.1:{sshd.port}): cannot write {tmp_path}/no/such/dir/f")
    finally:
        t.close()
    down = SshTransport(NodeConfig(name="gpu-down", host="127.0.0.1", port=free_port(), timeout_s=2.0),
                        ssh_config_path=str(sshd.dir / "empty_ssh_config"))
    with pytest.raises(TransportError) as e:
        down.run("true")
    assert str(e.value).startswith("node gpu-down (127.0.0.1:") and "connection refused" in str(e.value)
    down.close()


FAKE_INSTALL = """#!/bin/sh
# install -m MODE SRC DEST, with DEST moved under $FAKE_ROOT
mkdir -p "$FAKE_ROOT$(dirname "$4")" && cp "$3" "$FAKE_ROOT$4" && chmod "$2" "$FAKE_ROOT$4"
"""
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$FAKE_ROOT/systemctl.log"
if [ "$1" = restart ] && [ ! -e "$FAKE_ROOT/no-start" ]; then
  cmd=$(sed -n 's/^ExecStart=//p' "$FAKE_ROOT/etc/systemd/system/gpuctld.service")
  setsid $cmd > "$FAKE_ROOT/gpuctld.log" 2>&1 < /dev/null &
  echo $! > "$FAKE_ROOT/gpuctld.pid"
fi
"""
FAKE_JOURNALCTL = """#!/bin/sh
echo "journal of gpuctld: $*"
"""


def _stop_pid_file(path: Path) -> None:
    import signal
    import time

    if not path.exists():
        return
    pid = int(path.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def test_systemd_steps_start_the_unit_and_wait_for_health(installed, wheel, wheelhouse, tmp_path):
    """The systemd steps with fake install/systemctl/journalctl first on the session's PATH: the
    unit lands (under FAKE_ROOT) with ExecStart = PREFIX/bin/gpuctld, the fake systemctl starts
    exactly that command line, and the health step reaches the daemon through the bridge. It runs
    over the prefix `installed` made: a second bootstrap upgrades in place."""
    import tempfile

    from gpuctl.fleet.bootstrap import Bootstrap, Target

    prefix, first = installed
    assert first.code == 0, first.stderr
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    for name, text in (("install", FAKE_INSTALL), ("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL)):
        (fakebin / name).write_text(text)
        (fakebin / name).chmod(0o755)
    root = Path(tempfile.mkdtemp(prefix="gpuctl-bt-", dir="/tmp"))  # short: the socket path lives here
    template = UNIT.replace("--state-dir /var/lib/gpuctld --socket /run/gpuctld/gpuctld.sock",
                            f"--state-dir {root}/state --socket {root}/gpuctld.sock --gpus 1")
    assert template != UNIT
    env = {"PATH": f"{fakebin}:/usr/local/bin:/usr/bin:/bin", "FAKE_ROOT": str(root)}
    try:
        with SftpSshServer(session_env=env) as server:
            node = NodeConfig(name="gpu-s", host="127.0.0.1", port=server.port, user=server.user,
                              identity_file=str(server.user_key), timeout_s=5.0)
            (server.dir / "empty").write_text("")

            def job(**options):
                t = SshTransport(node, ssh_config_path=str(server.dir / "empty"),
                                 known_hosts_path=str(server.known_hosts))
                opts = BootstrapOptions(prefix=str(prefix), python=sys.executable, backend="simulated",
                                        no_index=True, find_links=str(wheelhouse), **options)
                return t, Bootstrap(Target("gpu-s", node, True), opts, transport=t, wheel=wheel,
                                    unit_template=template)

            t, b = job(health_timeout_s=20)
            try:
                result = b.run()
            finally:
                t.close()
            assert result.error is None, result.error and result.error.message
            steps = {s.name: s for s in result.steps}
            assert [s.name for s in result.steps][-4:] == ["install-unit", "start-service", "health", "cleanup"]
            assert steps["check-root"].detail == "uid 0"
            assert "--force-reinstall" in steps["install-gpuctl"].command  # same version: code replaced anyway
            assert (prefix / "lib" / "marker-from-first-run").read_text() == "kept"  # venv updated, not recreated
            assert steps["health"].detail == "healthy (HTTP/1.1 200 OK)"
            unit = (root / "etc/systemd/system/gpuctld.service").read_text()
            assert f"ExecStart={prefix}/bin/gpuctld serve --backend simulated --state-dir {root}/state" in unit
            assert (root / "systemctl.log").read_text().splitlines() == ["daemon-reload", "enable gpuctld",
                                                                         "restart gpuctld"]
            assert result.node_toml.endswith(f'socket = "{root}/gpuctld.sock"\ngpuctld = "{prefix}/bin/gpuctld"\n')
            _stop_pid_file(root / "gpuctld.pid")

            # the daemon never comes up: the health step fails with its last try and the journal
            (root / "no-start").write_text("")
            (root / "gpuctld.pid").unlink()
            t, b = job(health_timeout_s=1)
            try:
                result = b.run()
            finally:
                t.close()
            err = result.error
            assert err is not None and err.exit_code == 1 and err.step == "health"
            assert err.message.startswith("node gpu-s: step health failed: gpuctld did not answer /v1/health "
                                          "within 1 s (last try: gpuctld is not running on this node: ")
            assert err.stderr_tail == "journal of gpuctld: -u gpuctld -n 15 --no-pager"
            assert {s.name: s.status for s in result.steps}["cleanup"] == "ok"
    finally:
        _stop_pid_file(root / "gpuctld.pid")
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_bootstrap_modules_are_headless():
    code = "import sys, gpuctl.fleet.bootstrap, gpuctl.cli.node; print('textual' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_terminal_answer_no_changes_nothing(wheel, tmp_path):
    """On a terminal, the plan is shown and the question asked; "n" ends it with 6 and no change."""
    import pty

    master, slave = pty.openpty()
    prefix = tmp_path / "prefix"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), GPUCTL_CONFIG=str(tmp_path / "absent.toml"))
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpuctl.cli", "node", "bootstrap", "somehost", "--wheel",
                              str(wheel), "--prefix", str(prefix), "--no-systemd"],
                             stdin=slave, stderr=slave, stdout=subprocess.PIPE, env=env)
        os.write(master, b"n\n")
        out, _ = p.communicate(timeout=60)
        os.close(slave)
        slave = -1
        said = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    text = said.decode()
    assert p.returncode == 6, text
    assert "plan for node somehost:" in text and f"create or update the virtual environment {prefix}" in text
    assert "Install gpuctl on somehost? [y/N]" in text and "cancelled: nothing was changed" in text
    assert out == b"" and not prefix.exists()
