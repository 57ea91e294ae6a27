"""NVML process lists on a real GPU, checked against `nvidia-smi --query-compute-apps` (marked `gpu`).

A child process allocates 1 GiB with PyTorch (or CuPy) and waits; the valid entries gpuctl keeps
(gpuctl.backends.nvml_processes) must be exactly nvidia-smi's compute apps of that GPU, and the
child must be counted by NvmlBackend.sample(). Run on a GPU node with
``python -m pytest tests/integration/test_gpu_nvml_processes.py -m gpu -v``. Skipped without NVML, nvidia-smi,
or a CUDA array library.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest

pynvml = pytest.importorskip("pynvml")

from gpuctl.backends.nvml import NvmlBackend
from gpuctl.backends.nvml_processes import validate_processes

try:
    from test_gpu_nvml import needs_gpu
except ImportError:  # tests/ imported as a package
    from tests.test_gpu_nvml import needs_gpu

MIB = 2**20
HOLDER = {
    "torch": "import sys, torch; x = torch.ones(2**28, device='cuda:0'); torch.cuda.synchronize(); "
             "print('ready', flush=True); sys.stdin.read()",
    "cupy": "import sys, cupy; x = cupy.ones(2**28, dtype=cupy.float32); cupy.cuda.Device().synchronize(); "
            "print('ready', flush=True); sys.stdin.read()",
}


def _holder_code() -> str | None:
    for module, code in HOLDER.items():
        if importlib.util.find_spec(module) is not None:
            return code
    return None


def smi_apps() -> dict[str, dict[int, float | None]]:
    """nvidia-smi's compute apps: GPU UUID -> {pid: used memory MiB or None}."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    apps: dict[str, dict[int, float | None]] = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        uuid, pid, used = (f.strip() for f in line.split(","))
        try:
            mem: float | None = float(used)
        except ValueError:
            mem = None
        apps.setdefault(uuid, {})[int(pid)] = mem
    return apps


@needs_gpu
def test_process_list_matches_nvidia_smi_with_a_real_process():
    code = _holder_code()
    if code is None:
        pytest.skip("needs torch or cupy to hold GPU memory")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        backend = NvmlBackend()
        try:
            gpu0 = backend.gpus()[0]
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            valid = validate_processes(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            sample = backend.sample()[0]
        finally:
            backend.close()
        theirs = smi_apps().get(gpu0.uuid, {})
        ours = {p.pid: p.used_memory_bytes for p in valid.processes}
        assert valid.dropped == 0
        assert set(ours) == set(theirs), f"ours {ours} vs nvidia-smi {theirs}"
        assert sample.process_count is not None and sample.process_count >= 1
        for pid, mib in theirs.items():
            if mib is not None and ours[pid] is not None:
                assert abs(ours[pid] / MIB - mib) <= 1, f"pid {pid}: ours {ours[pid] / MIB:.0f} MiB vs {mib} MiB"
        if child.pid in ours and ours[child.pid] is not None:  # visible unless the VM hides pids
            assert ours[child.pid] >= 2**30
    finally:
        child.kill()
        child.wait(timeout=30)
