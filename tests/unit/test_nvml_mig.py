"""MIG: the parent GPU is not a slice; its MIG devices are read-only slices (issue 9 item 23).

The fake NVML answers as a MIG-enabled H200 does: the parent's memory query is refused
(NoPermission), MIG devices come from nvmlDeviceGetMigDeviceHandleByIndex with their own "MIG-"
UUIDs, memory and GPU/compute instance ids; 0xFFFFFFFF ids mean "not MIG". An unknown memory
total never becomes a quota of 0: the slice exists but is not leasable, with the reason.
"""

from __future__ import annotations

import logging

import pytest

from gpuctl.backends.nvml import NvmlBackend
from gpuctl.daemon.leases import GrantRequest, LeaseManager, WorkerStartFailed
from gpuctl.daemon.state import (
    MigReadOnly,
    NodeStateManager,
    SliceNotLeasable,
    StateStore,
)
from gpuctl.model import UNASSIGNED, GpuIdentity, Lease, slice_id

try:
    from fake_nvml import FakeNvml
except ImportError:  # tests/ imported as a package
    from tests.fake_nvml import FakeNvml

GIB = 2**30
U32_NA = 0xFFFFFFFF
PARENT = "GPU-9f02c47f-854b-3613-0b4f-ae990a0fa75b"
MIG_A = "MIG-11111111-aaaa-5000-8000-000000000001"
MIG_C = "MIG-33333333-cccc-5000-8000-000000000003"
MIG_D = "MIG-44444444-dddd-5000-8000-000000000004"
PLAIN = "GPU-22222222-0000-4000-8000-000000000002"
NO_PERMISSION = {"error": "NVML_ERROR_NO_PERMISSION"}


def h200_mig_case() -> dict:
    """GPU 0: an H200 with MIG on (1g, empty slot, 2g, a device with bad ids and memory); GPU 1: MIG off."""
    return {"gpu_count": 2, "gpu": {
        "0": {"name": "NVIDIA H200", "uuid": PARENT, "mig_mode": [1, 1],
              "memory_v1": NO_PERMISSION, "memory_v2": NO_PERMISSION,
              "max_mig_device_count": 7,
              "mig_devices": [
                  {"uuid": MIG_A, "name": "NVIDIA H200 MIG 1g.18gb", "gpu_instance_id": 9, "compute_instance_id": 0,
                   "memory": {"total": 16 * GIB + 768 * 2**20, "free": 16 * GIB, "used": 768 * 2**20},
                   "compute_running_processes": [{"pid": 321, "usedGpuMemory": 512 * 2**20}]},
                  None,
                  {"uuid": MIG_C, "name": "NVIDIA H200 MIG 2g.35gb", "gpu_instance_id": 3, "compute_instance_id": 0,
                   "memory": {"total": 33 * GIB, "free": 33 * GIB, "used": 0},
                   "attributes": {"multiprocessorCount": 32, "computeInstanceSliceCount": 2}},
                  {"uuid": MIG_D, "gpu_instance_id": U32_NA, "compute_instance_id": U32_NA,
                   "memory": {"total": 2**64 - 1, "free": 0, "used": 0}},
              ]},
        "1": {"name": "NVIDIA H200", "uuid": PLAIN},
    }}


def make(monkeypatch, case=None):
    fake = FakeNvml(case or h200_mig_case()).install(monkeypatch)
    return fake, NvmlBackend()


def test_mig_devices_enumerated_after_their_parent(monkeypatch):
    fake, backend = make(monkeypatch)
    parent, a, c, d, plain = backend.gpus()
    assert (parent.uuid, parent.mig_enabled, parent.memory_total_bytes, parent.is_mig_device) == (PARENT, True, None, False)
    assert (a.uuid, a.index, a.name, a.parent_uuid) == (MIG_A, 0, "NVIDIA H200 MIG 1g.18gb", PARENT)
    assert (a.mig_gpu_instance_id, a.mig_compute_instance_id) == (9, 0)
    assert a.memory_total_bytes == 16 * GIB + 768 * 2**20
    assert a.mig_compute_share == pytest.approx(1 / 7)
    assert a.pci_bus_id == parent.pci_bus_id
    assert (c.uuid, c.memory_total_bytes, c.mig_compute_share) == (MIG_C, 33 * GIB, pytest.approx(2 / 7))
    # 0xFFFFFFFF means "not MIG": never shown as an id; an impossible memory total is unknown
    assert (d.uuid, d.mig_gpu_instance_id, d.mig_compute_instance_id, d.memory_total_bytes) == (MIG_D, None, None, None)
    assert (plain.uuid, plain.index, plain.mig_enabled, plain.parent_uuid) == (PLAIN, 1, False, None)
    assert plain.memory_total_bytes == 16 * GIB
    assert fake.calls_of("nvmlDeviceGetMigDeviceHandleByIndex") == 7  # every slot asked once, the empty one skipped
    assert fake.calls_of("nvmlDeviceGetMaxMigDeviceCount", 1) == 0  # MIG off: no MIG calls


def test_mig_samples_in_identity_order_with_their_own_memory(monkeypatch):
    _, backend = make(monkeypatch)
    parent, a, c, d, plain = backend.sample()
    assert [s.uuid for s in (parent, a, c, d, plain)] == [PARENT, MIG_A, MIG_C, MIG_D, PLAIN]
    assert parent.memory_total_bytes is None and parent.sm_util_pct == 10 and parent.error is None
    assert (a.memory_total_bytes, a.memory_used_bytes, a.process_count) == (16 * GIB + 768 * 2**20, 768 * 2**20, 1)
    assert a.sm_util_pct is None and a.temperature_c is None and a.power_w is None  # NotSupported on MIG: N/A
    assert a.error is None
    assert d.memory_total_bytes is None and d.quality_events == 1


def test_mig_device_without_handle_does_not_hide_the_others(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="gpuctl.backends.nvml")
    case = h200_mig_case()
    case["gpu"]["0"]["mig_devices"][2]["handle"] = NO_PERMISSION
    _, backend = make(monkeypatch, case)
    assert [g.uuid for g in backend.gpus()] == [PARENT, MIG_A, MIG_D, PLAIN]
    assert [s.error for s in backend.sample()] == [None] * 4
    assert any("nvmlDeviceGetMigDeviceHandleByIndex" in r.getMessage() for r in caplog.records)


# ---- the node's slices --------------------------------------------------------------------------


@pytest.fixture
def identities(monkeypatch) -> list[GpuIdentity]:
    _, backend = make(monkeypatch)
    return backend.gpus()


def manager(tmp_path, identities) -> NodeStateManager:
    m = NodeStateManager(StateStore(tmp_path))
    m.reconcile(identities)
    return m


def test_parent_is_not_a_slice_mig_devices_are_read_only_slices(tmp_path, identities):
    m = manager(tmp_path, identities)
    snap = m.snapshot()
    assert snap.slices_of(PARENT) == []
    a = snap.slices[slice_id(MIG_A, 0)]
    assert (a.mig, a.gpu_uuid, a.memory_quota_bytes, a.department) == (True, MIG_A, 16 * GIB + 768 * 2**20, UNASSIGNED)
    assert a.fraction == a.compute_share == pytest.approx(1 / 7)
    assert snap.slices[slice_id(MIG_C, 0)].fraction == pytest.approx(2 / 7)
    d = snap.slices[slice_id(MIG_D, 0)]
    assert d.memory_quota_bytes is None  # unknown, never 0
    assert d.not_leasable_reason == (f"slice {MIG_D}/0 is not leasable: its memory quota is unknown "
                                     f"(NVML gave no memory total for GPU {MIG_D})")
    assert d.to_json()["not_leasable_reason"] == d.not_leasable_reason
    plain = snap.slices[slice_id(PLAIN, 0)]
    assert (plain.mig, plain.memory_quota_bytes) == (False, 16 * GIB)
    # durable: the unknown quota is written and read back as unknown
    again = NodeStateManager(StateStore(tmp_path))
    assert again.snapshot().slices[slice_id(MIG_D, 0)].memory_quota_bytes is None


@pytest.mark.parametrize("uuid, parts, what", [
    (PARENT, 2, "has MIG on (it is not a slice; its MIG devices are)"),
    (MIG_A, 2, "is a MIG device"),
    (MIG_C, 1, "is a MIG device"),  # merge = split into one part
])
def test_split_and_merge_of_mig_refused_and_nothing_changes(tmp_path, identities, uuid, parts, what):
    m = manager(tmp_path, identities)
    before = m.snapshot()
    with pytest.raises(MigReadOnly) as info:
        m.split("r1", m.generation, uuid, parts)
    assert str(info.value) == (f"GPU {uuid} {what}: MIG slices are read-only in gpuctl and are never split or "
                               f"merged; change the MIG layout with nvidia-smi mig on the node")
    assert info.value.code == "mig_read_only" and info.value.field == "gpu_uuid"
    assert m.snapshot().body() == before.body()


def test_slice_with_unknown_quota_is_never_leased(tmp_path, identities):
    m = manager(tmp_path, identities)
    m.assign("r1", m.generation, [{"slice_id": slice_id(u, 0), "from": UNASSIGNED, "to": "research"}
                                  for u in (MIG_A, MIG_D)])
    before = m.snapshot()
    lease = Lease(id="lease-x", department="research", slice_ids=[slice_id(MIG_D, 0)], owner="u@h",
                  ttl_s=60, created_s=0, heartbeat_s=0, expires_s=60)
    with pytest.raises(SliceNotLeasable) as info:
        m.add_lease(lease)
    assert str(info.value).startswith(f"slice_ids[0]: slice {MIG_D}/0 is not leasable: its memory quota is unknown")
    assert m.snapshot().body() == before.body()

    started = []

    def start_worker(**kw):  # records what the launcher was asked, then refuses (no process started)
        started.append(kw)
        raise RuntimeError("test launcher: not started")

    leases = LeaseManager(m, identities, executor="numpy", start_worker=start_worker)
    with pytest.raises(SliceNotLeasable):
        leases.grant(GrantRequest(request_id="g1", department="research", owner="u@h", ttl_s=60,
                                  slice_ids=[slice_id(MIG_D, 0)]))
    assert started == [] and m.snapshot().body() == before.body()
    # chosen by amount, the unknown-quota slice is skipped and the MIG slice with a quota is used
    with pytest.raises(WorkerStartFailed, match="test launcher: not started"):
        leases.grant(GrantRequest(request_id="g2", department="research", owner="u@h", ttl_s=60, slices=1))
    assert [kw["quota_bytes"] for kw in started] == [16 * GIB + 768 * 2**20]
    assert m.snapshot().body() == before.body()


def test_unknown_total_of_plain_gpu_is_no_quota_then_filled_when_known(tmp_path):
    unknown = GpuIdentity(uuid=PLAIN, index=0, name="x", memory_total_bytes=None, mig_enabled=False)
    m = manager(tmp_path, [unknown])
    assert m.snapshot().slices[slice_id(PLAIN, 0)].memory_quota_bytes is None
    m.split("s1", m.generation, PLAIN, 2)
    assert [s.memory_quota_bytes for s in m.snapshot().slices_of(PLAIN)] == [None, None]
    known = GpuIdentity(uuid=PLAIN, index=0, name="x", memory_total_bytes=16 * GIB, mig_enabled=False)
    m2 = NodeStateManager(StateStore(tmp_path))
    gen = m2.generation
    m2.reconcile([known])
    assert [s.memory_quota_bytes for s in m2.snapshot().slices_of(PLAIN)] == [8 * GIB, 8 * GIB]
    assert m2.generation == gen + 1


def test_mig_turned_on_retires_the_parents_free_slices(tmp_path, identities):
    whole = GpuIdentity(uuid=PARENT, index=0, name="NVIDIA H200", memory_total_bytes=141 * GIB, mig_enabled=False)
    m = manager(tmp_path, [whole])
    assert [s.id for s in m.snapshot().slices_of(PARENT)] == [slice_id(PARENT, 0)]
    m2 = NodeStateManager(StateStore(tmp_path))
    added = m2.reconcile(identities)
    assert m2.snapshot().slices_of(PARENT) == []
    assert m2.retired_slices == [slice_id(PARENT, 0)]
    assert set(added) == {slice_id(u, 0) for u in (MIG_A, MIG_C, MIG_D, PLAIN)}


# ---- the control API on the NVML backend (in process, fake NVML) --------------------------------


def test_api_shows_mig_slices_and_refuses_split_and_unleasable_grant(tmp_path, monkeypatch):
    import json

    from gpuctl.daemon.api import ApiRequest, ControlApi
    from gpuctl.daemon.telemetry import Sampler

    _, backend = make(monkeypatch)
    gpus = backend.gpus()
    m = manager(tmp_path, gpus)
    sampler = Sampler(backend, interval_s=1.0)
    sampler.sample_once()
    api = ControlApi(backend_name="nvml", gpus=gpus, sampler=sampler, state=m, hostname="h200")
    leases = LeaseManager(m, gpus, executor="numpy", start_worker=lambda **kw: pytest.fail("no worker may start"))
    leases.install(api)

    def call(method, path, body=None):
        return api.handle(ApiRequest(method, path, body=json.dumps(body).encode() if body is not None else b""))

    status, body = call("GET", "/v1/status")
    assert status == 200
    by_uuid = {g["identity"]["uuid"]: g for g in body["gpus"]}
    assert by_uuid[PARENT]["slices"] == [] and by_uuid[PARENT]["identity"]["mig_enabled"] is True
    a = by_uuid[MIG_A]
    assert a["identity"]["parent_uuid"] == PARENT and a["identity"]["mig_gpu_instance_id"] == 9
    assert [(s["mig"], s["memory_quota_bytes"]) for s in a["slices"]] == [(True, 16 * GIB + 768 * 2**20)]
    d = by_uuid[MIG_D]["slices"][0]
    assert d["memory_quota_bytes"] is None and "memory quota is unknown" in d["not_leasable_reason"]

    gen = m.generation
    status, body = call("POST", "/v1/split", {"request_id": "s1", "generation": gen, "gpu_uuid": PARENT, "parts": 2})
    assert status == 409 and body["error"]["code"] == "mig_read_only"
    assert body["error"]["message"].startswith(f"GPU {PARENT} has MIG on")

    m.assign("r1", gen, [{"slice_id": slice_id(MIG_D, 0), "from": UNASSIGNED, "to": "research"}])
    gen = m.generation
    status, body = call("POST", "/v1/leases", {"request_id": "g1", "department": "research", "owner": "u@h",
                                              "slice_ids": [slice_id(MIG_D, 0)]})
    assert status == 409 and body["error"]["code"] == "slice_not_leasable"  # was: a 0-byte quota, then HTTP 500
    assert body["error"]["field"] == "slice_ids[0]"
    assert m.generation == gen and m.snapshot().leases == {}
