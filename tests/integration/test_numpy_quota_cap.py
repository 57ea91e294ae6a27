"""NumPy-executor lease quotas are capped by host memory (issue 7 item 4): a simulated GPU has
80 GiB, the host far less; the grant's answer says when and why a quota was cut, and the worker
enforces the cut quota."""

from __future__ import annotations

import time

import numpy as np
import pytest

from daemon_proc import start_daemon
from gpuctl.daemon.host_memory import DEFAULT_FRACTION, FALLBACK_CAP_BYTES, HostMemoryCap, mem_available_bytes

CAP = 64 * 1024 * 1024


def _grant_whole_gpu(c) -> dict:
    gpus = c.get("/v1/node").json()["gpus"]
    sid = f"{gpus[0]['uuid']}/0"
    gen = c.get("/v1/slices").json()["generation"]
    r = c.post("/v1/assign", json={"request_id": "cap-setup", "generation": gen,
                                   "moves": [{"slice_id": sid, "from": "unassigned", "to": "research"}]})
    assert r.status_code == 200, r.text
    r = c.post("/v1/leases", json={"request_id": f"cap-{time.monotonic_ns()}", "department": "research",
                                   "owner": "alice@client1", "ttl_s": 60, "slices": 1})
    assert r.status_code == 201, r.text
    return r.json()


def test_meminfo_parsing_and_cap_sources(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:    8000000 kB\n")
    assert mem_available_bytes(str(info)) == 8_000_000 * 1024
    cap = HostMemoryCap.from_options(None, str(info))
    assert cap.cap_bytes == int(8_000_000 * 1024 * DEFAULT_FRACTION)
    assert "MemAvailable (8192000000 bytes)" in cap.source
    assert HostMemoryCap.from_options(CAP, str(info)) == HostMemoryCap(CAP, "gpuctld --numpy-quota-cap-bytes")
    missing = HostMemoryCap.from_options(None, str(tmp_path / "nope"))
    assert missing.cap_bytes == FALLBACK_CAP_BYTES and "unreadable" in missing.source
    (tmp_path / "odd").write_text("MemAvailable: lots\n")
    assert mem_available_bytes(str(tmp_path / "odd")) is None
    assert mem_available_bytes("/proc/meminfo") > 0  # the real file of this machine


def test_apply_cuts_only_quotas_over_the_cap():
    cap = HostMemoryCap(CAP, "test")
    assert cap.apply(CAP) == (CAP, None)
    quota, note = cap.apply(80 * 2**30)
    assert quota == CAP
    assert note == {"requested_bytes": 80 * 2**30, "cap_bytes": CAP,
                    "reason": f"the NumPy executor holds arrays in host memory: quota cut from {80 * 2**30} "
                              f"to {CAP} bytes (test)"}


def test_lease_quota_is_cut_to_the_cap_said_so_and_enforced(tmp_path):
    # Before: a whole simulated GPU gave an 80 GiB quota of host memory to one client.
    import gpuctl.remote as cp

    with start_daemon(tmp_path, gpus=1, extra_args=["--numpy-quota-cap-bytes", str(CAP)]) as d, d.client() as c:
        ans = _grant_whole_gpu(c)
        assert ans["quota_bytes"] == CAP
        assert ans["quota_cap"]["requested_bytes"] == 80 * 2**30 and ans["quota_cap"]["cap_bytes"] == CAP
        assert "--numpy-quota-cap-bytes" in ans["quota_cap"]["reason"]
        assert "NumPy lease quotas are capped at 67108864 bytes (gpuctld --numpy-quota-cap-bytes)" in d.stderr_text()
        cp.attach(ans["attach"])
        try:
            assert cp.cuda.runtime.memGetInfo()[1] == CAP  # the worker's quota is the cut one
            small = cp.asarray(np.ones(1000))
            assert float(small.sum().get()) == 1000.0
            with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="quota"):
                cp.zeros(CAP // 8 + 1, dtype=cp.float64).get()
        finally:
            cp.detach()


def test_default_cap_is_half_of_mem_available(tmp_path):
    available = mem_available_bytes()
    with start_daemon(tmp_path, gpus=1) as d, d.client() as c:
        ans = _grant_whole_gpu(c)
        log = d.stderr_text()
    assert "x MemAvailable" in log
    if 80 * 2**30 > available * DEFAULT_FRACTION * 1.5:  # every machine this runs on, surely
        assert ans["quota_bytes"] < 80 * 2**30
        assert ans["quota_bytes"] == ans["quota_cap"]["cap_bytes"]
        assert abs(ans["quota_bytes"] - available * DEFAULT_FRACTION) < 0.25 * available  # MemAvailable moves a bit
        assert "x MemAvailable" in ans["quota_cap"]["reason"]


def test_quota_under_the_cap_is_left_alone(tmp_path):
    with start_daemon(tmp_path, gpus=1, extra_args=["--numpy-quota-cap-bytes", str(100 * 2**30)]) as d, \
            d.client() as c:
        ans = _grant_whole_gpu(c)
    assert ans["quota_bytes"] == 80 * 2**30 and "quota_cap" not in ans


def test_a_cap_too_small_is_a_usage_error(tmp_path):
    d = start_daemon(tmp_path, gpus=1, extra_args=["--numpy-quota-cap-bytes", "10"], wait=False)
    try:
        assert d.wait_exit() == 2
        assert "--numpy-quota-cap-bytes: must be >= 1048576 bytes, got 10" in d.stderr_text()
    finally:
        d.stop()
