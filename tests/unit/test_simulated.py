"""The simulated backend: deterministic for a seed, values in range, load that looks like real jobs."""

from __future__ import annotations

import re

import pytest

from gpuctl.backends import make_backend
from gpuctl.backends.simulated import (
    MEMORY_TOTAL_BYTES,
    POWER_IDLE_W,
    POWER_MAX_W,
    SM_CLOCK_BOOST_MHZ,
    SM_CLOCK_IDLE_MHZ,
    SimulatedBackend,
)

GIB = 1024**3
N = 600


def run(backend: SimulatedBackend, n: int = N) -> list[list[dict]]:
    """n rounds of samples as JSON, timestamps dropped (the only wall-clock field)."""
    rounds = []
    for _ in range(n):
        rounds.append([{k: v for k, v in s.to_json().items() if k != "timestamp_s"} for s in backend.sample()])
    return rounds


@pytest.fixture(scope="module")
def seed7() -> tuple[SimulatedBackend, list[list[dict]]]:
    b = SimulatedBackend(gpus=8, seed=7)
    return b, run(b)


def series(rounds: list[list[dict]], gpu: int, key: str) -> list:
    return [r[gpu][key] for r in rounds]


def longest_run(values: list[float], pred) -> int:
    best = cur = 0
    for v in values:
        cur = cur + 1 if pred(v) else 0
        best = max(best, cur)
    return best


def test_identities_are_stable_for_a_seed_and_look_like_nvml():
    a = SimulatedBackend(gpus=8, seed=0).gpus()
    b = SimulatedBackend(gpus=8, seed=0).gpus()
    assert a == b
    assert a[0].uuid == "GPU-81dd2c41-0988-4108-954f-196539c63f8b"  # fixed by seed 0, forever
    assert [g.index for g in a] == list(range(8))
    assert len({g.uuid for g in a}) == 8
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", g.uuid) for g in a)
    assert [g.pci_bus_id for g in a][:2] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert len({g.pci_bus_id for g in a}) == 8
    assert all(g.memory_total_bytes == 80 * GIB == MEMORY_TOTAL_BYTES for g in a)
    assert all(g.name == "NVIDIA H100 80GB HBM3" and g.mig_enabled is False for g in a)


def test_more_than_eight_gpus_get_distinct_bus_ids():
    g = SimulatedBackend(gpus=12, seed=0).gpus()
    assert len({x.pci_bus_id for x in g}) == 12


def test_same_seed_gives_identical_sequences(seed7):
    _, rounds = seed7
    again = run(SimulatedBackend(gpus=8, seed=7))
    assert again == rounds


def test_different_seeds_differ(seed7):
    _, rounds = seed7
    other = SimulatedBackend(gpus=8, seed=8)
    assert {g.uuid for g in other.gpus()}.isdisjoint({g.uuid for g in SimulatedBackend(seed=7).gpus()})
    other_rounds = run(other, 50)
    assert series(other_rounds, 0, "sm_util_pct") != series(rounds[:50], 0, "sm_util_pct")


def test_values_are_in_range(seed7):
    _, rounds = seed7
    for r in rounds:
        assert len(r) == 8
        for s in r:
            assert 0.0 <= s["sm_util_pct"] <= 100.0
            assert 0.0 <= s["memory_util_pct"] <= 100.0
            assert 0 <= s["memory_used_bytes"] <= s["memory_total_bytes"] - s["memory_reserved_bytes"]
            assert POWER_IDLE_W - 5 <= s["power_w"] <= POWER_MAX_W
            assert 25.0 <= s["temperature_c"] <= 85.0
            assert SM_CLOCK_IDLE_MHZ <= s["sm_clock_mhz"] <= SM_CLOCK_BOOST_MHZ
            assert s["process_count"] in (0, 1, 2, 4)
            assert s["error"] is None and s["quality_events"] == 0


def test_every_gpu_has_idle_stretches_and_bursts(seed7):
    _, rounds = seed7
    for gpu in range(8):
        util = series(rounds, gpu, "sm_util_pct")
        assert longest_run(util, lambda v: v < 5.0) >= 10, f"GPU {gpu}: no idle stretch"
        assert longest_run(util, lambda v: v > 80.0) >= 10, f"GPU {gpu}: no burst"


def test_memory_grows_during_a_job_and_is_freed_at_its_end(seed7):
    _, rounds = seed7
    for gpu in range(8):
        mem = series(rounds, gpu, "memory_used_bytes")
        peak = max(range(N), key=lambda i: mem[i])
        assert mem[peak] > 4 * GIB, f"GPU {gpu}: memory never grew"
        assert 0 in mem[peak:] or 0 in mem[:peak], f"GPU {gpu}: memory never freed"
        # Freed after some job: a sample with >4 GiB followed later by 0.
        assert any(mem[i] > 4 * GIB and 0 in mem[i:] for i in range(N)), f"GPU {gpu}: never freed after a job"
        # Growing: within a job, memory rises over several samples before its plateau.
        rises = sum(1 for a, b in zip(mem, mem[1:]) if b - a > 256 * 1024 * 1024)
        assert rises >= 5


def test_power_and_temperature_follow_utilization_with_lag(seed7):
    _, rounds = seed7
    checked = 0
    for gpu in range(8):
        util = series(rounds, gpu, "sm_util_pct")
        power = series(rounds, gpu, "power_w")
        temp = series(rounds, gpu, "temperature_c")
        for i in range(10, N - 20):
            if all(u < 5 for u in util[i - 10:i]) and all(u > 60 for u in util[i:i + 20]):
                # The first busy sample is far from full power; 15 samples later it is much higher.
                assert power[i] < 0.7 * POWER_MAX_W
                assert power[i + 15] > power[i] + 100
                assert temp[i + 15] > temp[i] + 5
                checked += 1
    assert checked >= 3


def test_sm_clock_is_idle_when_idle_and_boosted_when_busy(seed7):
    _, rounds = seed7
    for r in rounds:
        for s in r:
            if s["sm_util_pct"] < 5:
                assert s["sm_clock_mhz"] == SM_CLOCK_IDLE_MHZ
            if s["sm_util_pct"] > 80:
                assert s["sm_clock_mhz"] >= 1800


def test_sample_count_advances_and_samples_follow_gpu_order():
    b = SimulatedBackend(gpus=3, seed=1)
    first = b.sample()
    assert b.sample_count == 1
    assert [s.uuid for s in first] == [g.uuid for g in b.gpus()]
    b.sample()
    assert b.sample_count == 2


def test_tick_s_scales_job_lengths():
    slow = run(SimulatedBackend(gpus=4, seed=3, tick_s=10.0), 300)
    # With 10 s per sample, jobs last 4..20 samples: many more job/idle transitions than at 1 s.
    transitions = sum(
        1 for g in range(4) for a, b in zip(series(slow, g, "process_count"), series(slow, g, "process_count")[1:])
        if (a == 0) != (b == 0)
    )
    assert transitions > 30


@pytest.mark.parametrize(
    "kwargs, message",
    [({"gpus": 0}, "gpus must be an integer >= 1, got 0"), ({"tick_s": 0}, "tick_s must be > 0 seconds, got 0")],
)
def test_bad_arguments_are_refused_with_the_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SimulatedBackend(**kwargs)


def test_make_backend_builds_it():
    b = make_backend("simulated", gpus=2, seed=5)
    assert isinstance(b, SimulatedBackend) and b.name == "simulated" and len(b.gpus()) == 2
    b.close()
