"""`gpuctl run --native` end to end on CPU: a real simulated gpuctld (local transport, and through a
real sshd), the environment CMD receives (GPU UUID, device order, MPS variables from the slice),
exit codes, signal forwarding, the lease released on every exit path, the pid recorded with the
lease, revoke (CMD ended, exit 8) and gpuctl killed (the lease's expiry ends CMD). Also the
revoked plain `gpuctl run` (issue 9 item 17)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from daemon_proc import REPO_ROOT, start_daemon, uds_client
from fleet_fixtures import (cli_env, cli_process, daemon_slices, local_node, run_cli, ssh_cli_args, sshd_node,
                            write_fleet_config)
from gpuctl.backends.simulated import MEMORY_TOTAL_BYTES
from gpuctl.daemon.native import NativeHandle, ProcessRefused
from gpuctl.fleet.native_run import remote_command
from waiting import gone, wait_for

ENV_SCRIPT = ("import json, os, sys; print(json.dumps({k: v for k, v in os.environ.items() "
              "if k.startswith(('CUDA', 'GPUCTL'))}, sort_keys=True)); print('to stderr', file=sys.stderr); "
              "sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)")


def _setup(sock: Path) -> dict[str, str]:
    """GPU 0 in quarters and GPU 1 whole, all research's; returns {"q": GPU 0 uuid, "w": GPU 1 uuid}."""
    with uds_client(sock) as c:
        st = c.get("/v1/status").json()
        g0, g1 = (g["identity"]["uuid"] for g in st["gpus"][:2])
        r = c.post("/v1/split", json={"request_id": "split", "generation": st["generation"], "gpu_uuid": g0,
                                      "parts": 4})
        assert r.status_code == 200, r.text
        sids = [s["id"] for s in daemon_slices(sock).values() if s["gpu_uuid"] in (g0, g1)]
        r = c.post("/v1/assign", json={"request_id": "give", "generation": r.json()["generation"], "moves": [
            {"slice_id": sid, "from": "unassigned", "to": "research"} for sid in sids]})
        assert r.status_code == 200, r.text
    return {"q": g0, "w": g1}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One simulated gpuctld (2 GPUs, --native-grace 1) and a fleet config reaching it locally."""
    tmp = tmp_path_factory.mktemp("native")
    d = start_daemon(tmp, gpus=2, seed=3, name="n1", extra_args=["--native-grace", "1"])
    try:
        gpus = _setup(d.socket_path)
        cfg = write_fleet_config(tmp / "fleet.toml", {"n1": local_node(d.socket_path)}, departments={})
        yield {"daemon": d, "cfg": str(cfg), **gpus}
    finally:
        d.stop()


@pytest.fixture
def cfg(node):
    """The config path; after the test, asserts that no lease is left (and ends any)."""
    yield node["cfg"]
    left = leases(node)
    with uds_client(node["daemon"].socket_path) as c:
        for lease in left:
            c.delete(f"/v1/leases/{lease['id']}")
    assert left == [], f"leases left behind: {[x['id'] for x in left]}"


def leases(node) -> list[dict]:
    with uds_client(node["daemon"].socket_path) as c:
        return c.get("/v1/leases").json()["leases"]


# ---------------------------------------------------------------------------- environment


def test_fractional_native_run_gets_uuid_device_order_and_mps_variables(node, cfg):
    # what gpuctl's own environment says about CUDA must not leak into CMD's
    r = run_cli("--config", cfg, "run", "--native", "--dept", "research", "--gpus", "0.25", "--",
                sys.executable, "-c", ENV_SCRIPT, env={"CUDA_VISIBLE_DEVICES": "7", "CUDA_MPS_PIPE_DIRECTORY": "/bogus"})
    assert r.code == 0, r.stderr
    env = json.loads(r.stdout)
    quarter = MEMORY_TOTAL_BYTES // 4
    mps_dir = node["daemon"].socket_path.parent / "mps" / node["q"][4:22].replace("-", "")[:16]
    assert env == {
        "CUDA_VISIBLE_DEVICES": node["q"],  # the GPU's UUID, never an index
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={quarter >> 20}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PIPE_DIRECTORY": str(mps_dir / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(mps_dir / "log"),
        "GPUCTL_MEMORY_QUOTA_BYTES": str(quarter),
        "GPUCTL_COMPUTE_SHARE": "0.25",
    }
    assert "to stderr" in r.stderr and "native attach" in r.stderr and "released lease" in r.stderr


def test_whole_gpu_native_run_has_no_mps_variables(node, cfg):
    r = run_cli("--config", cfg, "run", "--native", "--dept", "research", "--gpus", "1", "--",
                sys.executable, "-c", ENV_SCRIPT, env={"CUDA_MPS_PIPE_DIRECTORY": "/bogus"})
    assert r.code == 0, r.stderr
    env = json.loads(r.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == node["w"] and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not [k for k in env if k.startswith("CUDA_MPS_")]


# ---------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize("argv, code, words", [
    ([sys.executable, "-c", ENV_SCRIPT, "3"], 3, ""),
    (["no-such-command-xyz"], 127, "cannot start 'no-such-command-xyz'"),
    ([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], 137, ""),
], ids=["exit-3", "not-found", "killed-by-9"])
def test_native_exit_status_and_lease_released(node, cfg, argv, code, words):
    r = run_cli("--config", cfg, "run", "--native", "--dept", "research", "--gpus", "0.5", "--", *argv)
    assert r.code == code, r.stderr
    assert words in r.stderr and "released lease" in r.stderr


def test_native_cwd(node, cfg, tmp_path):
    r = run_cli("--config", cfg, "run", "--native", "--cwd", str(tmp_path), "--dept", "research", "--gpus", "0.25",
                "--", sys.executable, "-c", "import os; print(os.getcwd())")
    assert r.code == 0 and r.stdout.strip() == str(tmp_path), r.stderr
    r = run_cli("--config", cfg, "run", "--native", "--cwd", str(tmp_path / "nope"), "--dept", "research",
                "--gpus", "0.25", "--", sys.executable, "-c", "pass")
    assert r.code == 126 and f"--cwd {tmp_path / 'nope'}: no such directory" in r.stderr
    assert "released lease" in r.stderr


# ---------------------------------------------------------------------------- pids, signals


HANDLER = textwrap.dedent("""
    import os, signal, sys, time
    def on_term(signum, frame):
        print("got", signal.Signals(signum).name, flush=True)
        sys.exit(42)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print("ready", os.getpid(), flush=True)
    time.sleep(60)
""")


SIGNAL_AT_RECORD = textwrap.dedent("""
    import os, signal, sys, time
    import gpuctl.fleet.native_run as native_run
    from gpuctl.cli import main

    recorded = native_run.record_pid

    def catches_sigterm(pid):
        with open(f"/proc/{pid}/status") as f:
            caught = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
        return int(caught, 16) >> (signal.SIGTERM - 1) & 1

    def record_then_signal(client, lease_id, proc, err):
        while not catches_sigterm(proc.pid):  # CMD is ready (its handler is set), as the test waits for
            time.sleep(0.01)
        recorded(client, lease_id, proc, err)
        os.kill(os.getpid(), signal.SIGTERM)  # the pid is on the node: a test (or an admin) may signal now

    native_run.record_pid = record_then_signal
    sys.exit(main(sys.argv[1:]))
""")


def test_signal_that_comes_as_soon_as_the_pid_is_recorded_is_forwarded(node, cfg):
    """The race behind the SIGTERM-over-SSH test's flakes under load: a test sees the pid in GET
    /v1/leases and signals gpuctl at once; gpuctl's handlers must already be in place then (they
    were installed only after record_pid returned: a SIGTERM in between killed gpuctl itself and
    CMD ran on until the lease's expiry). Deterministic: gpuctl signals itself right after
    recording."""
    p = subprocess.run([sys.executable, "-c", SIGNAL_AT_RECORD, "--config", cfg, "run", "--native", "--dept",
                        "research", "--gpus", "0.25", "--", sys.executable, "-c", HANDLER],
                       capture_output=True, text=True, env=cli_env(), timeout=60)
    assert p.returncode == 42, p.stderr
    assert p.stdout.split()[0] == "ready" and p.stdout.splitlines()[-1] == "got SIGTERM"
    assert "released lease" in p.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_native_records_pid_and_forwards_signals(node, cfg, sig):
    with cli_process("--config", cfg, "run", "--native", "--dept", "research", "--gpus", "0.25", "--",
                     sys.executable, "-c", HANDLER) as p:
        word, pid = p.stdout.readline().split()
        assert word == "ready"
        (lease,) = leases(node)
        assert wait_for(lambda: leases(node)[0]["pids"] == [int(pid)], 5), leases(node)
        assert lease["attach_kind"] == "native" and lease["endpoint"] is None and lease["worker_pid"] is None
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    assert p.returncode == 42, err
    assert out.strip() == f"got {sig.name}" and "released lease" in err


# ---------------------------------------------------------------------------- revoke, expiry


def _revoke(node, to: str = "training") -> list[str]:
    """Move every leased slice of research to `to` with leased=revoke; returns the slice ids."""
    sock = node["daemon"].socket_path
    with uds_client(sock) as c:
        gen = c.get("/v1/slices").json()["generation"]
        sids = [s["id"] for s in daemon_slices(sock).values() if s["lease_id"]]
        r = c.post("/v1/assign", json={"request_id": f"rv-{time.time()}", "generation": gen, "leased": "revoke",
                                       "moves": [{"slice_id": sid, "from": "research", "to": to} for sid in sids]})
        assert r.status_code == 200, r.text
    return sids


def _give_back(node, sids: list[str]) -> None:
    sock = node["daemon"].socket_path
    with uds_client(sock) as c:
        gen = c.get("/v1/slices").json()["generation"]
        r = c.post("/v1/assign", json={"request_id": f"gb-{time.time()}", "generation": gen, "moves": [
            {"slice_id": sid, "from": "training", "to": "research"} for sid in sids]})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("native", [True, False], ids=["native", "remote-attach"])
def test_revoked_run_ends_cmd_and_exits_8(node, cfg, native):
    """CMD ignores SIGTERM: it is SIGKILLed after the grace; gpuctl says the lease was revoked, with
    the node's reason, and exits 8 (LEASE_REVOKED)."""
    script = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "print('ready', os.getpid(), flush=True); time.sleep(60)")
    sids: list[str] = []
    try:
        with cli_process("--config", cfg, "run", *(["--native"] if native else []), "--dept", "research",
                         "--gpus", "0.25", "--ttl", "4", "--grace", "1", "--", sys.executable, "-c", script) as p:
            word, pid = p.stdout.readline().split()
            assert word == "ready"
            if native:
                assert wait_for(lambda: leases(node)[0]["pids"] == [int(pid)], 5)
            sids = _revoke(node)
            out, err = p.communicate(timeout=30)
    finally:
        if sids:
            _give_back(node, sids)
    assert p.returncode == 8, err
    assert "was revoked: a reassignment took its slices (gpuctl reassign --revoke)" in err
    assert "CMD ended with exit status 137; exiting 8 (LEASE_REVOKED)" in err
    assert gone(int(pid))
    assert "could not release" not in err


def test_revoked_native_run_says_so_even_when_the_node_ended_cmd_first(node, cfg):
    """Default ttl (heartbeat every 10 s): the node's SIGTERM ends CMD long before the next
    heartbeat; gpuctl still finds out why and exits 8."""
    script = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
              "print('ready', os.getpid(), flush=True); time.sleep(60)")
    sids: list[str] = []
    try:
        with cli_process("--config", cfg, "run", "--native", "--dept", "research", "--gpus", "0.25", "--",
                         sys.executable, "-c", script) as p:
            word, pid = p.stdout.readline().split()
            assert wait_for(lambda: leases(node) and leases(node)[0]["pids"] == [int(pid)], 5)
            t0 = time.monotonic()
            sids = _revoke(node)
            out, err = p.communicate(timeout=30)
            assert time.monotonic() - t0 < 8  # not at the next heartbeat
    finally:
        if sids:
            _give_back(node, sids)
    assert p.returncode == 8, err
    assert "CMD ended with exit status 0; exiting 8 (LEASE_REVOKED)" in err and "could not release" not in err


def test_native_cmd_ended_by_the_node_when_gpuctl_is_killed(node, cfg):
    """gpuctl killed -9: nobody heartbeats, the lease expires at its ttl and the node ends CMD (SIGTERM)."""
    script = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
              "print('ready', os.getpid(), flush=True); time.sleep(60)")
    try:
        with cli_process("--config", cfg, "run", "--native", "--dept", "research", "--gpus", "0.25", "--ttl", "2", "--",
                         sys.executable, "-c", script) as p:
            word, pid = p.stdout.readline().split()
            assert wait_for(lambda: leases(node) and leases(node)[0]["pids"] == [int(pid)], 5)
            p.kill()
            p.wait()
            assert wait_for(lambda: leases(node) == [], 10)
            assert wait_for(lambda: gone(int(pid)), 5)
    finally:
        if not gone(int(pid)):
            os.kill(int(pid), signal.SIGKILL)


# ---------------------------------------------------------------------------- the processes route


def test_processes_route_refusals(node, cfg):
    sock = node["daemon"].socket_path
    with uds_client(sock) as c:
        remote = c.post("/v1/leases", json={"request_id": "pr-1", "department": "research", "owner": "t@h",
                                            "ttl_s": 30, "gpus": 0.25}).json()
        native = c.post("/v1/leases", json={"request_id": "pr-2", "department": "research", "owner": "t@h",
                                            "ttl_s": 30, "gpus": 0.25, "attach": "native"}).json()
        try:
            for lid, body, status, field, words in (
                (remote["lease"]["id"], {"pids": [os.getpid()]}, 400, "pids", "is a remote-attach lease"),
                (native["lease"]["id"], {"pids": ["12"]}, 400, "pids[0]", "must be a process id"),
                (native["lease"]["id"], {"pids": [os.getpid(), 4_000_000]}, 404, "pids[1]", "no process 4000000"),
                (native["lease"]["id"], {"pid": 3}, 400, "pid", "pid"),
                ("lease-nope", {"pids": [os.getpid()]}, 404, "lease_id", "no lease 'lease-nope'"),
            ):
                r = c.post(f"/v1/leases/{lid}/processes", json=body)
                assert r.status_code == status, r.text
                assert r.json()["error"]["field"] == field and words in r.json()["error"]["message"]
            assert [x["pids"] for x in c.get("/v1/leases").json()["leases"] if x["id"] == native["lease"]["id"]] == [[]]
            ok = c.post(f"/v1/leases/{native['lease']['id']}/processes", json={"pids": [os.getpid()]})
            assert ok.status_code == 200 and ok.json()["pids"] == [os.getpid()]
        finally:
            # released by its client: the recorded process (this test) is NOT signalled
            c.delete(f"/v1/leases/{native['lease']['id']}")
            c.delete(f"/v1/leases/{remote['lease']['id']}")


def test_native_handle_refuses_another_uids_process():
    h = NativeHandle("lease-x", grace_s=1)
    with pytest.raises(ProcessRefused, match=rf"pids\[0\]: process {os.getpid()} belongs to uid {os.getuid()}, not "
                                             r"to the caller's uid 12345"):
        h.register([os.getpid()], 12345)
    assert h.processes == {}


def test_native_handle_stop_signals_descendants_then_kills():
    """A revoke ends the program and what it started: SIGTERM to all, SIGKILL to those left."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_DFL); print('up', flush=True); "
                                  "time.sleep(60)"], stdout=subprocess.PIPE)
        child.stdout.readline()  # SIG_IGN is inherited: wait until the child has its default back
        print(child.pid, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        h = NativeHandle("lease-y", grace_s=3)
        h.register([parent.pid], None)
        assert h.stop() == 2  # the program and its child
        assert wait_for(lambda: gone(child), 2.5)  # the child took SIGTERM's default
        assert parent.poll() is None  # the parent ignores SIGTERM ...
        assert parent.wait(8) == -signal.SIGKILL  # ... until the grace ends
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# ---------------------------------------------------------------------------- over SSH


def test_remote_command_is_one_shell_line_that_keeps_every_word():
    """Differential: the line, run by a real sh, gives CMD exactly its argv, env and cwd, and the
    pid line first on stderr."""
    argv = ["printf", "%s|", "a b", "$HOME", "'q'", '"d"', "", "*"]
    line = remote_command(argv, {"X_Y": "1 2 $Z"}, "/tmp")
    p = subprocess.run(["sh", "-c", line + '; echo "rc=$?"'], capture_output=True, text=True)
    assert p.stdout == "a b|$HOME|'q'|\"d\"||*|rc=0\n"
    assert p.stderr.startswith("gpuctl-native-pid ")
    env_line = remote_command(["sh", "-c", 'echo "$X_Y" "$(pwd)"; exit 9'], {"X_Y": "1 2 $Z"}, "/tmp")
    p = subprocess.run(["sh", "-c", env_line], capture_output=True, text=True)
    assert p.stdout == "1 2 $Z /tmp\n" and p.returncode == 9
    assert subprocess.run(["sh", "-c", remote_command(["true"], {}, "/no/such/dir")],
                          capture_output=True).returncode == 126
    killed = subprocess.run(["sh", "-c", remote_command(["sh", "-c", "kill -TERM $$"], {}, None)],
                            capture_output=True)
    assert killed.returncode == 128 + signal.SIGTERM  # an exit status, never a death by signal of the shell


@pytest.fixture(scope="module")
def ssh_node(node, tmp_path_factory):
    """The module's daemon reached through a real sshd (gpuctld bridge over SSH)."""
    from sshd import SshServer, sshd_available

    if not sshd_available():
        pytest.skip("needs /usr/sbin/sshd and ssh-keygen")
    with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as sshd:
        cfg = write_fleet_config(tmp_path_factory.mktemp("ssh") / "fleet.toml",
                                 {"n1": sshd_node(node["daemon"].socket_path)}, departments={})
        yield list(ssh_cli_args(cfg, sshd))


@pytest.mark.sshd
def test_native_over_ssh_env_output_and_exit_status(node, cfg, ssh_node, tmp_path):
    script = ENV_SCRIPT.replace("print('to stderr'", "print('partial', end='', file=sys.stderr, flush=True); "
                                                     "print('to stderr'")
    r = run_cli(*ssh_node, "run", "--native", "--cwd", str(tmp_path), "--dept", "research", "--gpus", "0.25", "--",
                sys.executable, "-c", script, "5")
    assert r.code == 5, r.stderr
    env = json.loads(r.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == node["q"] and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={(MEMORY_TOTAL_BYTES // 4) >> 20}M"
    assert "partialto stderr\n" in r.stderr and "gpuctl-native-pid" not in r.stderr  # streamed, marker removed
    assert "released lease" in r.stderr
    r = run_cli(*ssh_node, "run", "--native", "--dept", "research", "--gpus", "0.25", "--", "no-such-command-xyz")
    assert r.code == 127 and "not found" in r.stderr and "released lease" in r.stderr


KEYBOARD = textwrap.dedent("""
    import os, time
    print("ready", os.getpid(), flush=True)
    try:
        time.sleep(60)
    except KeyboardInterrupt:  # Python's own SIGINT handler: no handler set by the program
        print("KeyboardInterrupt", flush=True)
        raise SystemExit(42)
""")


@pytest.mark.sshd
def test_native_over_ssh_ctrl_c_reaches_a_plain_python_program(node, cfg, ssh_node):
    """A forwarded SIGINT must not be lost to a shell that ignores it for background jobs."""
    with cli_process(*ssh_node, "run", "--native", "--dept", "research", "--gpus", "0.25", "--",
                     sys.executable, "-c", KEYBOARD) as p:
        word, pid = p.stdout.readline().split()
        assert word == "ready"
        assert wait_for(lambda: leases(node) and leases(node)[0]["pids"] == [int(pid)], 10), leases(node)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 42, err
    assert out.strip() == "KeyboardInterrupt" and "released lease" in err


@pytest.mark.sshd
def test_native_over_ssh_status_of_a_program_killed_by_a_signal(node, cfg, ssh_node):
    r = run_cli(*ssh_node, "run", "--native", "--dept", "research", "--gpus", "0.25", "--",
                sys.executable, "-c", "import os; os.kill(os.getpid(), 9)")
    assert r.code == 137, r.stderr  # 128 + 9, as for a local child
    assert "connection" not in r.stderr and "released lease" in r.stderr


@pytest.mark.sshd
def test_native_over_ssh_forwards_sigterm_and_records_remote_pid(node, cfg, ssh_node):
    with cli_process(*ssh_node, "run", "--native", "--dept", "research", "--gpus", "0.25", "--",
                     sys.executable, "-c", HANDLER) as p:
        word, pid = p.stdout.readline().split()
        assert word == "ready"
        assert wait_for(lambda: leases(node) and leases(node)[0]["pids"] == [int(pid)], 10), leases(node)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"on_term" in f.read()  # the recorded pid is CMD itself, not a shell around it
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 42, err
    assert out.strip() == "got SIGTERM" and "released lease" in err


def test_gpuctld_shutdown_ends_native_processes_that_ignore_sigterm(tmp_path):
    d = start_daemon(tmp_path, gpus=1, extra_args=["--native-grace", "1"])
    prog = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        prog.stdout.readline()
        with uds_client(d.socket_path) as c:
            gen = c.get("/v1/slices").json()["generation"]
            sid = next(iter(daemon_slices(d.socket_path)))
            c.post("/v1/assign", json={"request_id": "g", "generation": gen, "moves": [
                {"slice_id": sid, "from": "unassigned", "to": "research"}]})
            lease = c.post("/v1/leases", json={"request_id": "n", "department": "research", "owner": "t@h",
                                               "ttl_s": 60, "gpus": 1, "attach": "native"}).json()
            assert lease["memory_quota_bytes"] == MEMORY_TOTAL_BYTES and lease["compute_share"] == 1.0
            assert c.post(f"/v1/leases/{lease['lease']['id']}/processes",
                          json={"pids": [prog.pid]}).status_code == 200
        t0 = time.monotonic()
        assert d.stop() == 0
        assert prog.wait(5) == -signal.SIGKILL  # SIGTERM ignored: killed after the 1 s grace, before exit
        assert time.monotonic() - t0 < 10
        assert f"lease {lease['lease']['id']}: process {prog.pid} still runs 1 s after SIGTERM: SIGKILL" in d.stderr_text()
    finally:
        if prog.poll() is None:
            prog.kill()
            prog.wait()
        d.stop()


def test_done_when_against_the_demo_fleet(tmp_path):
    """Issue 10's Done-when, literally: `gpuctl run --native --dept research --gpus 0.25 -- python -c
    "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"` prints a GPU UUID against the demo fleet."""
    from gpuctl.fleet.demo import start_demo_fleet

    fleet = start_demo_fleet(nodes=2, gpus=8, seed=0, root=tmp_path)
    try:
        r = run_cli("--config", str(fleet.config_path), "run", "--native", "--dept", "research", "--gpus", "0.25",
                    "--", sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
        assert r.code == 0, r.stderr
        uuid = r.stdout.strip()
        import re

        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid), uuid
        quarter = [s for s in daemon_slices(fleet.nodes[1].socket).values()
                   if s["department"] == "research" and s["fraction"] == 0.25]
        assert [s["gpu_uuid"] for s in quarter] == [uuid]  # the GPU of the slice it leased (sim-02 GPU 6)
    finally:
        fleet.stop()


def test_native_cmd_ended_when_gpuctld_restart_ended_its_lease(tmp_path):
    """gpuctld killed -9 and restarted: leases found at start-up are ended (the old daemon's
    record of the program's pid is gone); gpuctl's next heartbeat hears it and ends CMD."""
    d = start_daemon(tmp_path, gpus=2, seed=4)
    try:
        _setup(d.socket_path)
        cfg = write_fleet_config(tmp_path / "fleet.toml", {"n1": local_node(d.socket_path)}, departments={})
        with cli_process("--config", str(cfg), "run", "--native", "--dept", "research", "--gpus", "0.25", "--ttl", "3",
                         "--", sys.executable, "-c", HANDLER) as p:
            assert p.stdout.readline().split()[0] == "ready"
            d.kill9()
            d.restart()
            out, err = p.communicate(timeout=30)
        assert p.returncode == 42, err
        assert out.strip() == "got SIGTERM"
        assert "ended at start-up" in d.stderr_text() or "ended: " in err
        assert "; ending CMD" in err
    finally:
        d.stop()
