"""NvmlBackend on a real NVIDIA GPU, checked against `nvidia-smi` (marked `gpu`).

Skipped unless NVML starts (pynvml.nvmlInit) and `nvidia-smi` is on PATH. Run on a GPU node with
``python -m pytest tests/integration/test_gpu_nvml.py -m gpu -v``. Tolerances: UUID, name, index, PCI bus id
exact; memory total exact in MiB; memory used within 64 MiB + 2 % (either v2 "used" or used +
reserved, since nvidia-smi versions differ); temperature ±3 °C; power ±(15 % + 10 W); SM clock
±(25 % + 150 MHz); SM utilization ±30 points (both are instants a few ms apart).
"""

from __future__ import annotations

import csv
import functools
import io
import shutil
import subprocess
import time

import pytest

pynvml = pytest.importorskip("pynvml")

from gpuctl.backends.nvml import NvmlBackend  # noqa: E402

MIB = 2**20
QUERY = "uuid,index,name,pci.bus_id,memory.total,memory.used,temperature.gpu,power.draw,clocks.sm,utilization.gpu"


@functools.cache
def _nvml_available() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass
    return True


def needs_gpu(test):
    """Mark `test` as `gpu` and skip it where NVML or nvidia-smi is missing."""
    skip = pytest.mark.skipif(not _nvml_available(), reason="needs NVML (NVIDIA driver) and nvidia-smi")
    return pytest.mark.gpu(skip(test))


def _number(text: str) -> float | None:
    """A figure of nvidia-smi's CSV: None for "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"..."""
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "NA"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_smi(output: str) -> dict[str, dict[str, object]]:
    """nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits output, by UUID."""
    keys = QUERY.split(",")
    rows = {}
    for fields in csv.reader(io.StringIO(output), skipinitialspace=True):
        if not fields:
            continue
        assert len(fields) == len(keys), f"unexpected nvidia-smi row {fields!r}"
        row: dict[str, object] = dict(zip(keys, (f.strip() for f in fields)))
        for key in keys[4:]:
            row[key] = _number(str(row[key]))
        rows[str(row["uuid"])] = row
    return rows


def test_parse_smi_handles_not_available():
    """Runs everywhere: the CSV parser turns nvidia-smi's bracketed N/A forms into None."""
    rows = parse_smi("GPU-1, 0, NVIDIA H200, 00000000:00:06.0, 143771, 0, 33, [N/A], 375, [Not Supported]\n")
    row = rows["GPU-1"]
    assert row["memory.total"] == 143771 and row["power.draw"] is None and row["utilization.gpu"] is None
    assert row["name"] == "NVIDIA H200" and row["index"] == "0"
    with pytest.raises(AssertionError, match="unexpected nvidia-smi row"):
        parse_smi("GPU-1, 0\n")


def nvidia_smi() -> dict[str, dict[str, object]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    return parse_smi(out)


@pytest.fixture
def backend():
    b = NvmlBackend()
    try:
        yield b
    finally:
        b.close()


def _close(ours: float | None, theirs: float | None, tolerance: float, what: str) -> None:
    if theirs is None:
        return  # nvidia-smi says N/A: nothing to compare against
    assert ours is not None, f"{what}: nvidia-smi shows {theirs} but NvmlBackend gave N/A"
    assert abs(ours - theirs) <= tolerance, f"{what}: ours {ours} vs nvidia-smi {theirs} (tolerance {tolerance})"


@needs_gpu
def test_identities_match_nvidia_smi(backend):
    smi = nvidia_smi()
    gpus = [g for g in backend.gpus() if not g.is_mig_device]  # nvidia-smi --query-gpu lists physical GPUs
    assert len(gpus) == len(smi)
    for g in gpus:
        row = smi[g.uuid]
        assert g.index == int(str(row["index"]))
        assert g.name == row["name"]
        assert g.pci_bus_id is not None and g.pci_bus_id.lower() == str(row["pci.bus_id"]).lower()
        assert g.memory_total_bytes is not None
        assert abs(g.memory_total_bytes / MIB - float(row["memory.total"])) < 1.0  # type: ignore[arg-type]
        assert g.mig_enabled in (True, False)


@needs_gpu
def test_samples_match_nvidia_smi(backend):
    smi = nvidia_smi()
    t0 = time.monotonic()
    samples = backend.sample()
    elapsed_s = time.monotonic() - t0
    assert elapsed_s < 0.5 * len(samples) + 0.5, f"sample() took {elapsed_s:.3f} s"
    assert [s.uuid for s in samples] == [g.uuid for g in backend.gpus()]
    for s in samples:
        row = smi[s.uuid]
        assert s.error is None, s.error
        assert s.quality_events == 0
        assert s.timestamp_s == pytest.approx(time.time(), abs=30)
        assert s.memory_total_bytes is not None
        assert abs(s.memory_total_bytes / MIB - float(row["memory.total"])) < 1.0  # type: ignore[arg-type]
        smi_used = row["memory.used"]
        if smi_used is not None:
            assert s.memory_used_bytes is not None
            tol = 64 + 0.02 * float(row["memory.total"])  # type: ignore[arg-type]
            used = s.memory_used_bytes / MIB
            with_reserved = used + (s.memory_reserved_bytes or 0) / MIB
            assert min(abs(used - smi_used), abs(with_reserved - smi_used)) <= tol, (
                f"memory used: ours {used:.0f} MiB (+reserved {with_reserved:.0f}) vs nvidia-smi {smi_used} MiB"
            )
        if s.memory_reserved_bytes is not None:  # v2: used excludes reserved
            assert s.memory_used_bytes is not None
            assert s.memory_used_bytes + s.memory_reserved_bytes <= s.memory_total_bytes
        _close(s.temperature_c, row["temperature.gpu"], 3, "temperature °C")
        power = row["power.draw"]
        _close(s.power_w, power, 0.15 * (power or 0) + 10, "power W")  # type: ignore[operator]
        clock = row["clocks.sm"]
        _close(s.sm_clock_mhz, clock, 0.25 * (clock or 0) + 150, "SM clock MHz")  # type: ignore[operator]
        _close(s.sm_util_pct, row["utilization.gpu"], 30, "SM utilization %")
        if s.sm_util_pct is not None:
            assert 0 <= s.sm_util_pct <= 100 and s.memory_util_pct is not None
        assert (s.process_count is None) == (s.processes_error is not None)
        if s.process_count is not None:
            assert s.process_count >= 0


@needs_gpu
def test_repeated_samples_and_close(backend):
    first = backend.sample()
    second = backend.sample()
    assert [s.uuid for s in first] == [s.uuid for s in second]
    assert all(b.timestamp_s >= a.timestamp_s for a, b in zip(first, second))
    backend.close()
    backend.close()  # idempotent
