"""GPU processes split into lease processes and "outside gpuctl" ones (issue 10 item 3), with a
fake NVML: the driver's invalid entries dropped, a native lease's program and its descendants
attributed to the lease, everything else shown as outside with its user and memory, in the
daemon's /v1/status and in `gpuctl status` (text and --json)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from daemon_proc import uds_client
from fake_nvml import FakeNvml
from fleet_fixtures import run_cli
from gpuctl.backends.nvml import NvmlBackend
from gpuctl.daemon.api import ControlApi
from gpuctl.daemon.server import serve, serve_in_thread
from gpuctl.daemon.leases import LeaseManager
from gpuctl.daemon.outside import owner_map, split_processes
from gpuctl.daemon.state import NodeStateManager, StateStore
from gpuctl.daemon.telemetry import Sampler

GIB = 2**30
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_nvml_process_list_drops_invalid_entries(monkeypatch):
    fake = FakeNvml({"gpu_count": 1, "gpu": {"0": {"compute_running_processes": [
        {"pid": 4242, "usedGpuMemory": GIB},
        {"pid": 0, "usedGpuMemory": GIB},             # no such pid
        {"pid": 2**32 - 1, "usedGpuMemory": GIB},      # beyond any pid_max
        {"pid": None, "usedGpuMemory": 5},
        {"pid": 77, "usedGpuMemory": 2**64 - 1},       # NVML_VALUE_NOT_AVAILABLE: N/A, not 16 EiB
        {"pid": 78, "usedGpuMemory": 17 * GIB},        # more than the 16 GiB card: N/A
    ]}}}).install(monkeypatch)
    s = NvmlBackend().sample()[0]
    assert s.process_count == 3  # the valid entries only (issue 9 item 22): never counted when invalid
    assert s.processes == [{"pid": 4242, "memory_used_bytes": GIB}, {"pid": 77, "memory_used_bytes": None},
                           {"pid": 78, "memory_used_bytes": None}]
    assert fake.calls_of("nvmlDeviceGetComputeRunningProcesses") == 1


def test_split_by_lease_pid_and_descendants():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "print(c.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    other = sleeper()
    try:
        child = int(parent.stdout.readline())
        owners = owner_map({"lease-a": [parent.pid]})
        assert owners[parent.pid] == owners[child] == "lease-a" and other.pid not in owners
        mine, outside = split_processes([{"pid": child, "memory_used_bytes": GIB},
                                         {"pid": other.pid, "memory_used_bytes": 2 * GIB},
                                         {"pid": 4_000_000, "memory_used_bytes": None}], owners)
        assert mine == [{"pid": child, "lease_id": "lease-a", "memory_used_bytes": GIB}]
        import pwd

        me = pwd.getpwuid(os.getuid()).pw_name
        assert outside == [{"pid": other.pid, "user": me, "memory_used_bytes": 2 * GIB},
                           {"pid": 4_000_000, "user": None, "memory_used_bytes": None}]  # not visible here
        assert split_processes(None, owners) == (None, None)  # unknown list: unknown, never "none"
    finally:
        for p in (parent, other):
            p.kill()
            p.wait()


@pytest.fixture
def nvml_node(tmp_path, monkeypatch):
    """An in-process gpuctld API (NVML backend over a fake NVML, leases installed) on a socket, and
    a fleet config reaching it; yields (fake case dict, api socket, config path, sampler)."""
    case = {"gpu_count": 2, "gpu": {"0": {"uuid": UUID0, "compute_running_processes": []}, "1": {}}}
    case = FakeNvml(case).install(monkeypatch).case  # the fake's own copy: changes reach its answers
    backend = NvmlBackend()
    manager = NodeStateManager(StateStore(tmp_path / "state"))
    manager.reconcile(backend.gpus())
    sampler = Sampler(backend, interval_s=1.0)
    sampler.sample_once()
    api = ControlApi(backend_name="nvml", gpus=backend.gpus(), sampler=sampler, state=manager)
    leases = LeaseManager(manager, backend.gpus(), executor="numpy", hostname="gpu-a",
                          gpu_processes=lambda: {u: x.processes for u, x in sampler.latest().items()})
    leases.install(api)
    sockdir = Path(tempfile.mkdtemp(prefix="gpuctld-o", dir="/tmp"))
    server = serve(api, sockdir / "api.sock")
    serve_in_thread(server, poll_interval_s=0.02)
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[[node]]\nname = "gpu-a"\ntransport = "local"\nsocket = "{sockdir / "api.sock"}"\n')
    try:
        yield case, sockdir / "api.sock", cfg, sampler, leases
    finally:
        leases.close()
        server.shutdown()
        server.close()
        shutil.rmtree(sockdir, ignore_errors=True)


def test_status_splits_lease_and_outside_processes(nvml_node):
    case, sock, cfg, sampler, _ = nvml_node
    with uds_client(sock) as c:
        gen = c.get("/v1/slices").json()["generation"]
        sid = next(s["id"] for s in c.get("/v1/slices").json()["slices"] if s["gpu_uuid"] == UUID0)
        assert c.post("/v1/assign", json={"request_id": "g", "generation": gen, "moves": [
            {"slice_id": sid, "from": "unassigned", "to": "research"}]}).status_code == 200
        lease = c.post("/v1/leases", json={"request_id": "n", "department": "research", "owner": "t@h",
                                           "ttl_s": 60, "gpus": 1, "attach": "native"}).json()
        lid = lease["lease"]["id"]
        program, outsider = sleeper(), sleeper()
        try:
            assert c.post(f"/v1/leases/{lid}/processes", json={"pids": [program.pid]}).status_code == 200
            case["gpu"]["0"]["compute_running_processes"] = [
                {"pid": program.pid, "usedGpuMemory": 3 * GIB},
                {"pid": outsider.pid, "usedGpuMemory": GIB},
                {"pid": 0, "usedGpuMemory": GIB},
            ]
            sampler.sample_once()
            gpus = {g["identity"]["uuid"]: g for g in c.get("/v1/status").json()["gpus"]}
            assert gpus[UUID0]["lease_processes"] == [{"pid": program.pid, "lease_id": lid,
                                                       "memory_used_bytes": 3 * GIB}]
            assert gpus[UUID0]["outside_processes"] == [{"pid": outsider.pid, "user": "root" if os.getuid() == 0
                                                         else gpus[UUID0]["outside_processes"][0]["user"],
                                                         "memory_used_bytes": GIB}]
            other = next(g for u, g in gpus.items() if u != UUID0)
            assert other["lease_processes"] == [] and other["outside_processes"] == []

            r = run_cli("--config", str(cfg), "status", "--json")
            assert r.code == 0, r.stderr
            (g0,) = [g for g in r.json["nodes"][0]["gpus"] if g["uuid"] == UUID0]
            assert g0["outside_processes"] == gpus[UUID0]["outside_processes"]
            assert g0["lease_processes"][0]["lease_id"] == lid
            text = run_cli("--config", str(cfg), "status")
            assert text.code == 0, text.stderr
            assert f"GPU 0: outside gpuctl: pid {outsider.pid} (" in text.stdout and "1.0 GiB" in text.stdout
            assert f"pid {program.pid}" not in text.stdout  # the lease's own program is not "outside"
        finally:
            c.delete(f"/v1/leases/{lid}")
            for p in (program, outsider):
                p.kill()
                p.wait()


def test_unknown_process_list_stays_unknown(nvml_node):
    case, sock, _, sampler, _ = nvml_node
    case["gpu"]["0"]["compute_running_processes"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    sampler.sample_once()
    with uds_client(sock) as c:
        g0 = next(g for g in c.get("/v1/status").json()["gpus"] if g["identity"]["uuid"] == UUID0)
    assert g0["outside_processes"] is None and g0["lease_processes"] is None
    assert "NVML_ERROR_NO_PERMISSION" in g0["sample"]["processes_error"]


# ---------------------------------------------------------------------------- console


def _gpu_with_outside() -> "tuple":
    from gpuctl import model

    ident = model.GpuIdentity(uuid=UUID0, index=3, name="NVIDIA H200")
    sl = model.Slice(id=f"{UUID0}/0", gpu_uuid=UUID0, fraction=0.5, memory_quota_bytes=70 * GIB, compute_share=0.5,
                     department="research")
    gpu = model.GpuStatus(identity=ident, sample=model.GpuSample(uuid=UUID0, timestamp_s=1.0, sm_util_pct=40.0),
                          slices=[sl], outside_processes=[{"pid": 4242, "user": "bob", "memory_used_bytes": GIB}],
                          lease_processes=[])
    node = model.NodeStatus(name="gpu-a", reachable=True, gpus=[gpu])
    return node, gpu


def test_board_card_marks_a_slice_whose_gpu_runs_outside_work():
    from gpuctl import model
    from gpuctl.widgets.board_cards import card_text
    from gpuctl.widgets.board_model import slice_views

    node, gpu = _gpu_with_outside()
    (view,) = slice_views(model.FleetSnapshot(nodes=[node]))
    assert view.outside_processes == 1
    assert card_text(view) == "gpu-a GPU 3 ½ #0 ⚠1 outside\nSM  40% free"
    gpu.outside_processes = None  # unknown list: no mark (never a made-up count)
    (view,) = slice_views(model.FleetSnapshot(nodes=[node]))
    assert card_text(view) == "gpu-a GPU 3 ½ #0\nSM  40% free"


def test_node_detail_lists_outside_processes():
    from gpuctl.screens.node_detail import slices_text
    from gpuctl.widgets.palette import build_palette

    node, gpu = _gpu_with_outside()
    text = slices_text(node, gpu, build_palette({}, [])).plain
    assert text.splitlines()[-1] == "outside gpuctl: pid 4242 bob 1.0 GiB"


def test_second_cuda_process_of_a_fractional_native_lease_is_ended(nvml_node):
    """mps-01: a program's child inherits the MPS cap, so two CUDA processes of one 1/2 lease would
    hold the whole GPU's memory: the second is ended (SIGTERM) and the lease says why; a whole-GPU
    lease may run several."""
    case, sock, _, sampler, leases = nvml_node
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "print(c.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    with uds_client(sock) as c:
        try:
            child = int(parent.stdout.readline())
            gen = c.get("/v1/slices").json()["generation"]
            r = c.post("/v1/split", json={"request_id": "sp", "generation": gen, "gpu_uuid": UUID0, "parts": 2})
            assert r.status_code == 200, r.text
            sids = [s["id"] for s in c.get("/v1/slices").json()["slices"] if s["gpu_uuid"] == UUID0]
            assert c.post("/v1/assign", json={"request_id": "g2", "generation": r.json()["generation"], "moves": [
                {"slice_id": sid, "from": "unassigned", "to": "research"} for sid in sids]}).status_code == 200
            lid = c.post("/v1/leases", json={"request_id": "half", "department": "research", "owner": "t@h",
                                             "ttl_s": 60, "gpus": 0.5, "attach": "native"}).json()["lease"]["id"]
            assert c.post(f"/v1/leases/{lid}/processes", json={"pids": [parent.pid]}).status_code == 200
            case["gpu"]["0"]["compute_running_processes"] = [{"pid": parent.pid, "usedGpuMemory": GIB},
                                                             {"pid": child, "usedGpuMemory": GIB}]
            sampler.sample_once()
            assert leases.one_client_each() == [(lid, child)]
            assert parent.poll() is None  # the first process keeps running
            import time as _time

            deadline = _time.monotonic() + 5
            while _time.monotonic() < deadline:
                with open(f"/proc/{child}/stat") as f:
                    if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                        break
                _time.sleep(0.05)
            else:
                raise AssertionError(f"child {child} still runs after SIGTERM")
            (listed,) = c.get("/v1/leases").json()["leases"]
            assert listed["warnings"] == [
                f"process {child} was ended: it was a second CUDA process of fractional lease {lid} (process "
                f"{parent.pid} is the first); the MPS memory cap holds per process, so two would together use "
                f"twice the slice's quota: run one CUDA process per fractional lease"]
            assert leases.one_client_each() == []  # said and done once
            c.delete(f"/v1/leases/{lid}")
        finally:
            parent.kill()
            parent.wait()
