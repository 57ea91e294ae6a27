"""A simulated GPU backend: a deterministic, realistic-looking node for CPU-only machines, demos and tests.

Each simulated GPU runs a small state machine of jobs: an idle gap (SM utilization near 0 %, memory
freed, SM clock at idle), then a job (bursts of high SM utilization with noise and short input-bound
dips, memory growing to the job's working set and freed at its end), then another gap, and so on.
Power and temperature follow SM utilization with lag (first-order filters), as they do on real
boards.

Determinism: every random draw comes from a per-GPU ``random.Random`` seeded from (seed, GPU index)
and advanced once per call of :meth:`SimulatedBackend.sample`, so the n-th sample of a backend built
with the same seed is always the same, whatever the wall clock says. Only ``timestamp_s`` is real
time (``time.time()``).

Where the figures come from: an H100 SXM5 80GB board (the default name): 80 GiB of HBM3, 700 W board
power limit, ~70 W idle, SM boost clock 1980 MHz, idle SM clock ~345 MHz; a reserved-memory figure of
~615 MiB and an idle temperature of ~33 °C as read from real NVML (see the team's facts on H200).
"""

from __future__ import annotations

import random
import time
import uuid as uuidlib
from dataclasses import dataclass

from gpuctl.backends.base import GpuBackend
from gpuctl.model import GpuIdentity, GpuSample

GIB = 1024**3

#: Total memory of each simulated GPU, bytes (H100 80GB).
MEMORY_TOTAL_BYTES = 80 * GIB
#: Memory the driver reserves on each GPU (NVML memory v2 "reserved"), bytes.
MEMORY_RESERVED_BYTES = 644_939_776
#: Board power at idle and at full SM utilization, W (H100 SXM5: ~70 W idle, 700 W limit).
POWER_IDLE_W = 70.0
POWER_MAX_W = 700.0
#: GPU temperature at idle and at sustained full load, °C.
TEMPERATURE_IDLE_C = 33.0
TEMPERATURE_FULL_C = 78.0
#: SM clock at idle and at boost, MHz.
SM_CLOCK_IDLE_MHZ = 345
SM_CLOCK_BOOST_MHZ = 1980

#: PCI bus numbers of the 8 GPUs of a DGX H100-like board; GPUs past the 8th get further numbers.
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

# Job shapes, in seconds of simulated time (converted to samples with tick_s).
_IDLE_GAP_S = (15.0, 90.0)
_JOB_LENGTH_S = (40.0, 200.0)
_MEMORY_RAMP_S = 20.0
# Lag of the power and temperature filters: fraction of the gap closed per second.
_POWER_LAG_PER_S = 0.35
_TEMPERATURE_LAG_PER_S = 0.06


@dataclass
class _GpuSim:
    """The moving state of one simulated GPU (internal)."""

    rng: random.Random
    in_job: bool
    remaining: int  # samples left in the current job or gap
    job_util_pct: float = 0.0
    job_memory_bytes: int = 0
    job_memory_util_ratio: float = 0.5
    job_processes: int = 0
    job_elapsed: int = 0
    memory_used_bytes: int = 0
    power_w: float = POWER_IDLE_W
    temperature_c: float = TEMPERATURE_IDLE_C


class SimulatedBackend(GpuBackend):
    """`gpus` simulated GPUs named `name_prefix`, deterministic for `seed`.

    gpus: number of GPUs (>= 1; ValueError otherwise). seed: any int; the same seed gives the same
    UUIDs, PCI bus ids and sequence of samples. tick_s: simulated seconds per call of :meth:`sample`
    (the daemon's sampling interval; > 0); job lengths and the power/temperature lag are in seconds
    and scaled by it.
    """

    name = "simulated"

    def __init__(
        self,
        gpus: int = 8,
        seed: int = 0,
        name_prefix: str = "NVIDIA H100 80GB HBM3",
        tick_s: float = 1.0,
    ):
        if not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"simulated backend: gpus must be an integer >= 1, got {gpus!r}")
        if not tick_s > 0:
            raise ValueError(f"simulated backend: tick_s must be > 0 seconds, got {tick_s!r}")
        self.seed = seed
        self.tick_s = float(tick_s)
        self.sample_count = 0
        id_rng = random.Random(f"gpuctl-simulated-ids:{seed}")
        self._identities = []
        for i in range(gpus):
            gpu_uuid = uuidlib.UUID(bytes=id_rng.randbytes(16), version=4)
            bus = _PCI_BUSES[i] if i < len(_PCI_BUSES) else 0xDC + i - len(_PCI_BUSES)
            self._identities.append(
                GpuIdentity(
                    uuid=f"GPU-{gpu_uuid}",
                    index=i,
                    name=name_prefix,
                    pci_bus_id=f"00000000:{bus % 256:02X}:00.0",
                    memory_total_bytes=MEMORY_TOTAL_BYTES,
                    mig_enabled=False,
                )
            )
        self._sims = []
        for i in range(gpus):
            rng = random.Random(f"gpuctl-simulated-load:{seed}:{i}")
            # Start each GPU at a random point of a job or a gap, so GPUs are out of step.
            in_job = rng.random() < 0.5
            sim = _GpuSim(rng=rng, in_job=False, remaining=0)
            if in_job:
                self._start_job(sim)
                sim.remaining = rng.randint(1, sim.remaining)
            else:
                sim.remaining = rng.randint(1, self._samples(_IDLE_GAP_S[1]))
            self._sims.append(sim)

    def _samples(self, seconds: float) -> int:
        return max(1, round(seconds / self.tick_s))

    def _start_job(self, sim: _GpuSim) -> None:
        rng = sim.rng
        sim.in_job = True
        sim.remaining = rng.randint(self._samples(_JOB_LENGTH_S[0]), self._samples(_JOB_LENGTH_S[1]))
        sim.job_util_pct = rng.uniform(84.0, 99.0)
        sim.job_memory_bytes = int(rng.uniform(8, 76) * GIB)
        sim.job_memory_util_ratio = rng.uniform(0.25, 0.7)
        sim.job_processes = rng.choice((1, 1, 1, 2, 4))
        sim.job_elapsed = 0

    def _end_job(self, sim: _GpuSim) -> None:
        sim.in_job = False
        sim.remaining = sim.rng.randint(self._samples(_IDLE_GAP_S[0]), self._samples(_IDLE_GAP_S[1]))
        sim.job_processes = 0

    def gpus(self) -> list[GpuIdentity]:
        """The simulated GPUs in index order (never raises)."""
        return list(self._identities)

    def sample(self) -> list[GpuSample]:
        """Advance the simulation by one tick and return one sample per GPU, in index order."""
        self.sample_count += 1
        now = time.time()
        power_alpha = min(1.0, _POWER_LAG_PER_S * self.tick_s)
        temp_alpha = min(1.0, _TEMPERATURE_LAG_PER_S * self.tick_s)
        out = []
        for identity, sim in zip(self._identities, self._sims):
            rng = sim.rng
            if sim.remaining <= 0:
                if sim.in_job:
                    self._end_job(sim)
                else:
                    self._start_job(sim)
            sim.remaining -= 1
            if sim.in_job:
                sim.job_elapsed += 1
                if rng.random() < 0.06:  # input-bound dip (data loading, checkpoint)
                    util = rng.uniform(15.0, 55.0)
                else:
                    util = sim.job_util_pct + rng.gauss(0.0, 3.0)
                ramp = min(1.0, sim.job_elapsed / self._samples(_MEMORY_RAMP_S))
                noise = rng.randint(-64, 64) * 1024 * 1024
                sim.memory_used_bytes = max(0, int(sim.job_memory_bytes * ramp) + noise)
                processes = sim.job_processes
            else:
                util = 0.0 if rng.random() < 0.85 else rng.uniform(0.0, 3.0)
                sim.memory_used_bytes = 0
                processes = 0
            util = min(100.0, max(0.0, util))
            limit = MEMORY_TOTAL_BYTES - MEMORY_RESERVED_BYTES
            sim.memory_used_bytes = min(sim.memory_used_bytes, limit)
            power_target = POWER_IDLE_W + (POWER_MAX_W - POWER_IDLE_W) * util / 100.0
            sim.power_w += (power_target - sim.power_w) * power_alpha
            temp_target = TEMPERATURE_IDLE_C + (TEMPERATURE_FULL_C - TEMPERATURE_IDLE_C) * util / 100.0
            sim.temperature_c += (temp_target - sim.temperature_c) * temp_alpha
            if util < 5.0:
                clock = SM_CLOCK_IDLE_MHZ
            else:
                # Boost, minus a little thermal throttling above 70 °C.
                clock = SM_CLOCK_BOOST_MHZ - int(max(0.0, sim.temperature_c - 70.0) * 15)
                clock -= rng.choice((0, 0, 15, 30))
            out.append(
                GpuSample(
                    uuid=identity.uuid,
                    timestamp_s=now,
                    sm_util_pct=round(util, 1),
                    memory_util_pct=round(util * sim.job_memory_util_ratio, 1) if sim.in_job else 0.0,
                    memory_used_bytes=sim.memory_used_bytes,
                    memory_reserved_bytes=MEMORY_RESERVED_BYTES,
                    memory_total_bytes=MEMORY_TOTAL_BYTES,
                    temperature_c=round(sim.temperature_c, 1),
                    power_w=round(min(POWER_MAX_W, sim.power_w + rng.uniform(-2.0, 2.0)), 1),
                    sm_clock_mhz=clock,
                    process_count=processes,
                )
            )
        return out
