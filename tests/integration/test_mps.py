"""gpuctld's MPS manager with a fake nvidia-cuda-mps-control on PATH: start/stop per GPU, modes,
one uid per GPU (tests/cases/mps mps-04), the client variables (mps-02), and the same through a
real simulated gpuctld started with --mps auto / required."""

from __future__ import annotations

import json
import os
import time
import pwd
from pathlib import Path

import pytest

from daemon_proc import start_daemon, uds_client
from fake_mps import calls, install_fake_mps, path_with
from waiting import wait_for
from fleet_fixtures import daemon_slices
from gpuctl.daemon.mps import MpsError, MpsManager, MpsUserConflict, mps_client_env
from gpuctl.daemon.native import native_env

GPU_A = "GPU-11111111-2222-3333-4444-555555555555"
GPU_B = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    bin_dir, log = install_fake_mps(tmp_path)
    monkeypatch.setenv("PATH", path_with(bin_dir))
    monkeypatch.delenv("FAKE_MPS_FAIL", raising=False)
    return log


def test_one_daemon_per_gpu_started_with_first_lease_stopped_with_last(tmp_path, fake):
    m = MpsManager("auto", tmp_path / "mps")
    d = m.acquire(GPU_A, "lease-1", 1000)
    assert d is not None and (d.pipe_dir / "control").read_text() == GPU_A  # it sees only its GPU, by UUID
    assert d.pipe_dir == tmp_path / "mps" / "1111111122223333" / "pipe"
    assert m.acquire(GPU_A, "lease-2", 1000) is d  # same GPU, same user: shared
    assert m.acquire(GPU_B, "lease-3", 1000).pipe_dir != d.pipe_dir  # another GPU: its own daemon
    starts = [c for c in calls(fake) if c["argv"] == ["-d"]]
    assert [(c["visible"], c["pipe"]) for c in starts] == [(GPU_A, str(d.pipe_dir)),
                                                           (GPU_B, str(m.dirs(GPU_B)[0]))]
    assert m.release(GPU_A, "lease-1") is False and (d.pipe_dir / "control").exists()
    assert m.release(GPU_A, "lease-2") is True  # the quit runs off the release's path
    m.quiesce()
    assert not (d.pipe_dir / "control").exists()
    quit_call = calls(fake)[-1]
    assert quit_call["argv"] == [] and quit_call["stdin"] == "quit\n" and quit_call["pipe"] == str(d.pipe_dir)
    assert sorted(m.running()) == [GPU_B]
    m.close()
    assert m.running() == {} and not (m.dirs(GPU_B)[0] / "control").exists()
    assert m.release(GPU_B, "lease-3") is False  # already stopped by close: nothing twice


def test_daemon_left_by_a_killed_gpuctld_is_quit_before_a_new_one_starts(tmp_path, fake):
    old = MpsManager("auto", tmp_path / "mps")
    d = old.acquire(GPU_A, "lease-1", 0)  # then gpuctld is killed -9: close() never runs
    new = MpsManager("auto", tmp_path / "mps")
    assert new.acquire(GPU_A, "lease-2", 0).pipe_dir == d.pipe_dir
    assert [(c["argv"], c["stdin"]) for c in calls(fake)] == [(["-d"], ""), ([], "quit\n"), (["-d"], "")]
    assert (d.pipe_dir / "control").exists()
    new.close()


def test_another_uid_on_the_gpu_is_refused_not_left_hanging(tmp_path, fake):
    m = MpsManager("auto", tmp_path / "mps")
    m.acquire(GPU_A, "lease-1", 1000)
    with pytest.raises(MpsUserConflict, match=rf"GPU {GPU_A}: its MPS server serves uid 1000 \(leases lease-1\); "
                                              r"MPS serves one user at a time, so a fractional lease for uid 1001"):
        m.acquire(GPU_A, "lease-2", 1001)
    assert m.running()[GPU_A].leases == {"lease-1"}  # unchanged
    assert m.acquire(GPU_B, "lease-3", 1001) is not None  # another GPU is free for that user
    m.close()


def test_start_failure_auto_gives_none_with_reason_required_raises(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "An instance of this daemon is already running")
    auto = MpsManager("auto", tmp_path / "a")
    assert auto.acquire(GPU_A, "lease-1", 0) is None
    assert auto.last_error == (f"GPU {GPU_A}: MPS control daemon did not start: nvidia-cuda-mps-control -d exited 1: "
                               "An instance of this daemon is already running")
    assert auto.running() == {}
    req = MpsManager("required", tmp_path / "r")
    with pytest.raises(MpsError, match="did not start: nvidia-cuda-mps-control -d exited 1"):
        req.acquire(GPU_A, "lease-1", 0)
    assert req.running() == {}


def test_missing_program_and_off_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no control program anywhere
    m = MpsManager("required", tmp_path / "mps")
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control not found on PATH"):
        m.acquire(GPU_A, "lease-1", 0)
    assert MpsManager("off", tmp_path / "mps").acquire(GPU_A, "lease-1", 0) is None
    with pytest.raises(ValueError, match="mps mode must be one of auto, off, required, got 'on'"):
        MpsManager("on", tmp_path)


def test_client_variables_from_the_slice():
    # 1/4 of an H200 (150754820096 bytes): the cap is rounded down to whole MiB, never above the quota
    env = mps_client_env(quota_bytes=150754820096 // 4, compute_share=0.25, pipe_dir="/p", log_dir="/l")
    assert env == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=35942M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                   "CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_LOG_DIRECTORY": "/l"}
    assert (35942 << 20) <= 150754820096 // 4 < (35943 << 20)
    # mps-02: the device part counts visible devices (one, by UUID), never the UUID itself
    whole = native_env(device_uuid=GPU_A, quota_bytes=1 << 30, compute_share=1.0, fractional=False,
                       pipe_dir="/p", log_dir="/l")
    assert whole == {"CUDA_VISIBLE_DEVICES": GPU_A, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                     "GPUCTL_MEMORY_QUOTA_BYTES": str(1 << 30), "GPUCTL_COMPUTE_SHARE": "1"}
    eighth = native_env(device_uuid=GPU_A, quota_bytes=10 << 30, compute_share=0.125, fractional=True,
                        pipe_dir=None, log_dir=None)
    assert eighth["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert eighth["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12" and "CUDA_MPS_PIPE_DIRECTORY" not in eighth


# ---------------------------------------------------------------------------- through gpuctld


def _give(sock, dept: str, fraction_split: int | None = None) -> list[str]:
    """Split GPU 0 into `fraction_split` parts (if given) and give all its slices to `dept`."""
    with uds_client(sock) as c:
        status = c.get("/v1/status").json()
        g0 = status["gpus"][0]["identity"]["uuid"]
        gen = status["generation"]
        if fraction_split:
            r = c.post("/v1/split", json={"request_id": "split-0", "generation": gen, "gpu_uuid": g0,
                                          "parts": fraction_split})
            assert r.status_code == 200, r.text
            gen = r.json()["generation"]
        sids = sorted(s["id"] for s in daemon_slices(sock).values() if s["gpu_uuid"] == g0)
        r = c.post("/v1/assign", json={"request_id": "give-0", "generation": gen, "moves": [
            {"slice_id": sid, "from": "unassigned", "to": dept} for sid in sids]})
        assert r.status_code == 200, r.text
    return sids


def _grant(sock, **body):
    body = {"request_id": os.urandom(6).hex(), "department": "research", "owner": "t@h", "ttl_s": 30, **body}
    with uds_client(sock) as c:
        return c.post("/v1/leases", json=body)


def test_gpuctld_auto_starts_mps_for_fractional_leases_only(tmp_path):
    bin_dir, log = install_fake_mps(tmp_path)
    d = start_daemon(tmp_path, gpus=2, extra_args=["--mps", "auto"], env={"PATH": path_with(bin_dir)})
    try:
        # the ready line is printed once the server answers: wait for it, not for /v1/health
        assert wait_for(lambda: "gpuctld ready" in d.stderr_text(), 10), d.stderr_text()
        assert "mps=auto" in d.stderr_text()
        _give(d.socket_path, "research", fraction_split=4)
        whole_gpu = _grant(d.socket_path, gpus=1, attach="native")  # all four quarters: the whole GPU
        assert whole_gpu.status_code == 201 and whole_gpu.json()["mps"] is False
        assert not any(k.startswith("CUDA_MPS_") for k in whole_gpu.json()["env"])
        assert calls(log) == []  # whole-GPU leases never use MPS
        with uds_client(d.socket_path) as c:
            c.delete(f"/v1/leases/{whole_gpu.json()['lease']['id']}")
        a = _grant(d.socket_path, gpus=0.25, attach="native")
        assert a.status_code == 201, a.text
        a = a.json()
        pipe = a["env"]["CUDA_MPS_PIPE_DIRECTORY"]
        assert a["mps"] is True and a["warnings"] == [] and os.path.exists(os.path.join(pipe, "control"))
        assert a["env"]["CUDA_VISIBLE_DEVICES"] == a["gpu_uuid"] == a["device_uuid"]
        b = _grant(d.socket_path, slices=2).json()  # a remote-attach half of the same GPU: same daemon
        assert b["mps"] is True
        assert [c["argv"] for c in calls(log)] == [["-d"]]
        with uds_client(d.socket_path) as c:
            listed = {x["id"]: x for x in c.get("/v1/leases").json()["leases"]}
            assert listed[a["lease"]["id"]]["attach_kind"] == "native" and listed[b["lease"]["id"]]["mps"] is True
            assert c.delete(f"/v1/leases/{a['lease']['id']}").status_code == 200
            assert os.path.exists(os.path.join(pipe, "control"))  # b still holds it
            assert c.delete(f"/v1/leases/{b['lease']['id']}").status_code == 200
        deadline = time.monotonic() + 10  # the daemon quits it off the release's path
        while os.path.exists(os.path.join(pipe, "control")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(os.path.join(pipe, "control"))
        assert calls(log)[-1]["stdin"] == "quit\n"
    finally:
        d.stop()


def test_gpuctld_stops_mps_daemons_on_shutdown(tmp_path):
    bin_dir, log = install_fake_mps(tmp_path)
    d = start_daemon(tmp_path, gpus=1, extra_args=["--mps", "auto"], env={"PATH": path_with(bin_dir)})
    try:
        _give(d.socket_path, "research", fraction_split=2)
        a = _grant(d.socket_path, gpus=0.5, attach="native").json()
        assert os.path.exists(os.path.join(a["env"]["CUDA_MPS_PIPE_DIRECTORY"], "control"))
    finally:
        assert d.stop() == 0
    assert not os.path.exists(os.path.join(a["env"]["CUDA_MPS_PIPE_DIRECTORY"], "control"))
    assert calls(log)[-1]["stdin"] == "quit\n"


def test_gpuctld_required_refuses_when_mps_cannot_start_auto_warns(tmp_path):
    bin_dir, _ = install_fake_mps(tmp_path)
    env = {"PATH": path_with(bin_dir), "FAKE_MPS_FAIL": "permission denied on /dev/nvidiactl"}
    d = start_daemon(tmp_path, gpus=1, name="req", extra_args=["--mps", "required"], env=env)
    try:
        _give(d.socket_path, "research", fraction_split=4)
        before = daemon_slices(d.socket_path)
        r = _grant(d.socket_path, gpus=0.25, attach="native")
        assert r.status_code == 409
        err = r.json()["error"]
        assert err["code"] == "mps_unavailable" and err["field"] == "gpus"
        assert err["message"].endswith("nvidia-cuda-mps-control -d exited 1: permission denied on /dev/nvidiactl; "
                                       "nothing was leased")
        assert daemon_slices(d.socket_path) == before
    finally:
        d.stop()
    d = start_daemon(tmp_path, gpus=1, name="auto", extra_args=["--mps", "auto"], env=env)
    try:
        _give(d.socket_path, "research", fraction_split=4)
        a = _grant(d.socket_path, gpus=0.25, attach="native").json()
        assert a["mps"] is False and len(a["warnings"]) == 1
        assert a["warnings"][0].startswith("time-sliced, without MPS caps: GPU ")
        assert "CUDA_MPS_PIPE_DIRECTORY" not in a["env"]  # no daemon to point at
        assert a["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={(80 << 30) // 4 >> 20}M"
        with uds_client(d.socket_path) as c:
            (listed,) = c.get("/v1/leases").json()["leases"]
            assert listed["warnings"] == a["warnings"]
            c.delete(f"/v1/leases/{a['lease']['id']}")
    finally:
        d.stop()


NOBODY_CLIENT = r"""
import http.client, json, socket, sys
class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sys.argv[1])
c = Conn("gpuctld")
c.request("POST", "/v1/leases", body=sys.argv[2], headers={"Content-Type": "application/json"})
r = c.getresponse()
print(r.status, r.read().decode())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to run a client as nobody) and /usr/bin/python3")
def test_gpuctld_refuses_native_lease_of_another_uid_on_a_gpu_serving_one(tmp_path):
    """mps-04: root's native fractional lease makes GPU 0's MPS server root's; a native fractional
    lease asked by nobody (its own connection: SO_PEERCRED says uid 65534) on that GPU is refused at
    lease time naming both uids, never left hanging; after root's lease ends, nobody gets one."""
    import subprocess

    import shutil
    import tempfile

    nobody = pwd.getpwnam("nobody").pw_uid
    bin_dir, _ = install_fake_mps(tmp_path)
    # a directory of our own that nobody may traverse (never loosen pytest's shared base directory)
    base = Path(tempfile.mkdtemp(prefix="gpuctl-mps04-", dir="/tmp"))
    os.chmod(base, 0o711)
    d = start_daemon(base, gpus=1, extra_args=["--mps", "auto"], env={"PATH": path_with(bin_dir)})
    try:
        os.chmod(d.socket_path.parent, 0o711)
        os.chmod(d.socket_path, 0o666)
        _give(d.socket_path, "research", fraction_split=4)
        mine = _grant(d.socket_path, gpus=0.25, attach="native")
        assert mine.status_code == 201 and mine.json()["mps"] is True
        before = daemon_slices(d.socket_path)

        def as_nobody() -> tuple[int, dict]:
            body = json.dumps({"request_id": os.urandom(6).hex(), "department": "research", "owner": "n@h",
                               "ttl_s": 30, "gpus": 0.25, "attach": "native"})
            p = subprocess.run(["/usr/bin/python3", "-c", NOBODY_CLIENT, str(d.socket_path), body], user=nobody,
                               group=pwd.getpwnam("nobody").pw_gid, extra_groups=[], capture_output=True, text=True, timeout=30, cwd="/")
            assert p.returncode == 0, p.stderr
            code, _, text = p.stdout.partition(" ")
            return int(code), json.loads(text)

        code, answer = as_nobody()
        assert code == 409 and answer["error"]["code"] == "mps_unavailable", answer
        assert (f"its MPS server serves uid 0 (leases {mine.json()['lease']['id']}); MPS serves one user at a time, "
                f"so a fractional lease for uid {nobody} cannot share it") in answer["error"]["message"]
        assert daemon_slices(d.socket_path) == before
        with uds_client(d.socket_path) as c:
            c.delete(f"/v1/leases/{mine.json()['lease']['id']}")
        code, answer = as_nobody()  # root's server exited with its last lease
        assert code == 201 and answer["mps"] is True, answer
        with uds_client(d.socket_path) as c:
            c.delete(f"/v1/leases/{answer['lease']['id']}")
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_grant_refuses_unknown_attach_kind(tmp_path):
    d = start_daemon(tmp_path, gpus=1)
    try:
        _give(d.socket_path, "research")
        r = _grant(d.socket_path, gpus=1, attach="telepathy")
        assert r.status_code == 400
        assert r.json()["error"] == {"code": "invalid_field", "field": "attach",
                                     "message": "attach must be one of remote, native, got 'telepathy'"}
        with uds_client(d.socket_path) as c:
            assert c.get("/v1/leases").json()["leases"] == []
        assert json.loads(json.dumps(daemon_slices(d.socket_path)))  # still serving
    finally:
        d.stop()
