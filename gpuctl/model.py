"""The fleet's domain model: GPUs, telemetry samples, slices, departments, leases, snapshots.

Plain dataclasses with no UI or transport imports. Every figure carries its unit in its name
(`memory_used_bytes`, `power_w`, `temperature_c`, `sm_util_pct`); `None` means "N/A" (NVML said
NotSupported, the value was out of range, or it was never measured) and is never replaced by 0.

The JSON shapes used by the daemon's control API and by `gpuctl status --json` are produced by the
`to_json()` methods here and read back by the `from_json()` class methods, so one definition serves
the daemon, the fleet client, the CLI and the console.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: The pseudo-department that owns slices given to nobody yet (new GPUs start here).
UNASSIGNED = "unassigned"

#: The ways one GPU may be split: number of equal slices (fractions 1, 1/2, 1/4, 1/8).
ALLOWED_PARTS = (1, 2, 4, 8)

#: What a reassignment does with a leased slice: refuse the request, drain (move the slice when
#: its lease ends) or revoke (end the lease, then move). The daemon and the admin side both check it.
LEASED_MODES = ("refuse", "drain", "revoke")

#: Longest request id (reassignment, split, lease grant) accepted, characters.
MAX_REQUEST_ID_CHARS = 200


def slice_id(gpu_uuid: str, k: int) -> str:
    """The stable id of slice `k` (0-based) of the GPU with UUID `gpu_uuid`: ``"<uuid>/<k>"``."""
    return f"{gpu_uuid}/{k}"


def split_slice_id(sid: str) -> tuple[str, int]:
    """Inverse of :func:`slice_id`: ``"GPU-x/3"`` -> ``("GPU-x", 3)``.

    Raises ValueError naming the id when it is not of that form.
    """
    uuid, sep, k = sid.rpartition("/")
    if not sep or not uuid or not k.isdigit():
        raise ValueError(f"slice id {sid!r} is not of the form '<gpu-uuid>/<n>'")
    return uuid, int(k)


def _pick(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that are fields of dataclass `cls` (unknown keys from newer peers are ignored)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


#: Links between two GPUs of one node, fastest first (the placement of multi-GPU jobs prefers GPUs
#: whose slowest pairwise link comes first here): NVLink; on one board (NVML_TOPOLOGY_INTERNAL);
#: one PCIe switch (SINGLE); several switches (MULTIPLE); one host bridge; one NUMA node; across
#: NUMA nodes (SYSTEM).
GPU_LINKS = ("nvlink", "board", "pcie_switch", "pcie_switches", "host_bridge", "numa_node", "system")


@dataclass(frozen=True)
class GpuIdentity:
    """What identifies one GPU of a node; fixed while the daemon runs.

    uuid: NVML's UUID (nvmlDeviceGetUUID), e.g. "GPU-9f02c47f-...". index: NVML's index (may change
    across reboots; the UUID does not). pci_bus_id: nvmlDeviceGetPciInfo().busId. memory_total_bytes:
    from nvmlDeviceGetMemoryInfo (None when NVML gave an impossible figure). mig_enabled: current MIG
    mode (nvmlDeviceGetMigMode), None where unsupported. A GPU with MIG on is not a slice itself:
    its MIG devices are listed after it as identities of their own.

    MIG devices (nvmlDeviceGetMigDeviceHandleByIndex on a GPU with MIG on) have: uuid "MIG-...";
    index: the parent GPU's NVML index; parent_uuid: the parent GPU's UUID; mig_gpu_instance_id /
    mig_compute_instance_id: NVML's GPU instance and compute instance ids (None when NVML gives
    none, or 0xFFFFFFFF, which means "not MIG"); mig_compute_share: the device's share of the parent,
    0..1 (nvmlDeviceGetAttributes computeInstanceSliceCount / nvmlDeviceGetMaxMigDeviceCount of the
    parent: 1/7 for a 1g device of an H200), None if unknown;
    memory_total_bytes: the device's own memory. For a physical GPU these are None.
    """

    uuid: str
    index: int
    name: str
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    mig_enabled: bool | None = None
    parent_uuid: str | None = None
    mig_gpu_instance_id: int | None = None
    mig_compute_instance_id: int | None = None
    mig_compute_share: float | None = None
    #: Link to each other GPU of the node, peer UUID -> one of :data:`GPU_LINKS` (NVML topology:
    #: nvmlDeviceGetP2PStatus NVLINK, else nvmlDeviceGetTopologyCommonAncestor); None where the
    #: backend reports none (simulated nodes, MIG devices, a driver without the queries).
    peer_links: dict[str, str] | None = field(default=None, compare=False)

    @property
    def is_mig_device(self) -> bool:
        """True for a MIG device (a GPU instance / compute instance of a parent GPU)."""
        return self.parent_uuid is not None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GpuIdentity":
        return cls(**_pick(cls, data))


@dataclass
class GpuSample:
    """One telemetry sample of one GPU, taken by the daemon's sampler thread.

    Units: timestamp_s is Unix time (seconds); *_pct in 0..100 (nvmlDeviceGetUtilizationRates: SM
    and memory-controller utilization); memory_*_bytes in bytes (nvmlDeviceGetMemoryInfo, v2 where
    the driver has it: `used` excludes `reserved`); temperature_c in °C (nvmlDeviceGetTemperature,
    GPU sensor); power_w in W (nvmlDeviceGetPowerUsage, mW / 1000); sm_clock_mhz in MHz
    (nvmlDeviceGetClockInfo, SM). Any field is None when N/A.

    error: a per-GPU error ("lost: node needs reboot") when the GPU did not answer at all.
    processes_error: why the process list is unknown (e.g. "process list unavailable (driver too
    old)"); a GPU with an unknown process list is never treated as idle by reassignment.
    process_count: number of compute processes (nvmlDeviceGetComputeRunningProcesses, entries that
    are not processes dropped: see gpuctl.backends.nvml_processes), None if unknown.
    process_memory_used_bytes: GPU memory those processes use (bytes, sum of usedGpuMemory), None
    when unknown or when NVML gives no figure for one of them (never a partial sum).
    processes: those processes as ``[{"pid": int, "memory_used_bytes": int | None}]`` (usedGpuMemory
    in bytes, None where NVML says N/A), entries the driver got wrong (pid not a positive process id)
    dropped; None when the list is unknown. The daemon splits them into lease and outside processes.
    quality_events: count of out-of-range readings dropped from this sample (data-quality events).
    """

    uuid: str
    timestamp_s: float
    sm_util_pct: float | None = None
    memory_util_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    process_count: int | None = None
    process_memory_used_bytes: int | None = None
    processes_error: str | None = None
    error: str | None = None
    quality_events: int = 0
    processes: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GpuSample":
        return cls(**_pick(cls, data))


@dataclass
class Slice:
    """A fraction of one GPU, owned by one department.

    id: :func:`slice_id` of (gpu_uuid, k). fraction: 1, 0.5, 0.25 or 0.125 of the GPU, or a MIG
    device's share of its parent GPU. memory_quota_bytes: the slice's share of the GPU's memory
    (bytes); None when the GPU's memory total is unknown (never a made-up 0): such a slice is not
    leasable (see :attr:`not_leasable_reason`). compute_share: 0..1 of the SMs.
    mig: True for the slice of a MIG device (gpu_uuid is then the MIG device's UUID): read-only,
    gpuctl never splits or merges it (the MIG layout is changed with nvidia-smi).
    department: owning department's name, or :data:`UNASSIGNED`. lease_id: the lease holding it, or
    None when idle. pending: a drain-mode reassignment waiting for the lease to end, as
    ``{"to": dept, "request_id": id}``, else None.
    usage: for a leased slice, its share of the lease worker's figures as GET /v1/status reports
    them (``{"memory_in_use_bytes", "ops_per_s", "bytes_in", "bytes_out"}``, see
    gpuctl.daemon.leases); None when idle or before the worker's first stats (never a made-up
    zero). Not part of the durable state.
    """

    id: str
    gpu_uuid: str
    fraction: float
    memory_quota_bytes: int | None
    compute_share: float
    department: str = UNASSIGNED
    lease_id: str | None = None
    pending: dict[str, str] | None = None
    usage: dict[str, Any] | None = None
    mig: bool = False

    @property
    def not_leasable_reason(self) -> str | None:
        """Why no lease may take this slice even when free (None: it may)."""
        if self.memory_quota_bytes is None:
            return (f"slice {self.id} is not leasable: its memory quota is unknown (NVML gave no memory total "
                    f"for GPU {self.gpu_uuid})")
        return None

    @property
    def leased(self) -> bool:
        """True while a lease holds this slice ("busy")."""
        return self.lease_id is not None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["leased"] = self.leased
        d["not_leasable_reason"] = self.not_leasable_reason
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Slice":
        return cls(**_pick(cls, data))


@dataclass
class Lease:
    """A client's hold on slices of its department, for remote attach.

    id: lease id. department: the department whose slices it holds. slice_ids: held slices.
    owner: "user@host" of the client. created_s, heartbeat_s, expires_s: Unix times (seconds);
    the lease ends when now > expires_s; each heartbeat moves expires_s to now + ttl_s.
    endpoint: "host:port" of its data-path worker, when one runs.
    """

    id: str
    department: str
    slice_ids: list[str]
    owner: str
    ttl_s: float
    created_s: float
    heartbeat_s: float
    expires_s: float
    endpoint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Lease":
        return cls(**_pick(cls, data))


@dataclass(frozen=True)
class Department:
    """A department of the organization: owns slices, has a priority (lower number = more important)
    and a display color (a theme variable name or a color the console understands)."""

    name: str
    priority: int = 100
    color: str | None = None


@dataclass
class GpuStatus:
    """One GPU as the fleet sees it: identity, latest sample (None before the first) and its slices.

    lease_processes: its GPU processes that belong to a lease (the lease's recorded pids, a remote
    lease's worker, and their descendants): ``[{"pid", "lease_id", "memory_used_bytes"}]``.
    outside_processes: the other ones ("outside gpuctl"): ``[{"pid", "user", "memory_used_bytes"}]``
    (user: login name, or the uid as text, None when the process is not visible to gpuctld). Both
    None when the process list is unknown (see the sample's processes_error). missing: the node's
    backend no longer reports this GPU (replaced or gone; the daemon keeps its slices and owners
    and lists it in its status's "missing_gpus"): not counted in capacity figures.
    """

    identity: GpuIdentity
    sample: GpuSample | None
    slices: list[Slice] = field(default_factory=list)
    lease_processes: list[dict[str, Any]] | None = None
    outside_processes: list[dict[str, Any]] | None = None
    missing: bool = False

    @property
    def uuid(self) -> str:
        return self.identity.uuid

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity.to_json(),
            "sample": self.sample.to_json() if self.sample else None,
            "slices": [s.to_json() for s in self.slices],
            "lease_processes": self.lease_processes,
            "outside_processes": self.outside_processes,
            **({"missing": True} if self.missing else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GpuStatus":
        return cls(
            identity=GpuIdentity.from_json(data["identity"]),
            sample=GpuSample.from_json(data["sample"]) if data.get("sample") else None,
            slices=[Slice.from_json(s) for s in data.get("slices", [])],
            lease_processes=data.get("lease_processes"),
            outside_processes=data.get("outside_processes"),
            missing=bool(data.get("missing", False)),
        )


@dataclass
class NodeStatus:
    """What one node's daemon answered to GET /v1/status, plus reachability as the client saw it.

    name: the node's name in the fleet config. reachable: False when the client could not get an
    answer (then `error` says why and `gpus` is empty). error: node-level error (unreachable, or
    NVML could not start: see `error_code`). generation: the node's state generation, which every
    change must quote. backend: "nvml" or "simulated". hostname: the daemon's hostname.
    """

    name: str
    reachable: bool
    error: str | None = None
    error_code: str | None = None
    generation: int = 0
    backend: str | None = None
    hostname: str | None = None
    gpus: list[GpuStatus] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    fetched_at_s: float = field(default_factory=time.time)

    def slices(self) -> list[Slice]:
        """All slices of this node, GPU by GPU."""
        return [s for g in self.gpus for s in g.slices]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reachable": self.reachable,
            "error": self.error,
            "error_code": self.error_code,
            "generation": self.generation,
            "backend": self.backend,
            "hostname": self.hostname,
            "gpus": [g.to_json() for g in self.gpus],
            "leases": [lease.to_json() for lease in self.leases],
            "fetched_at_s": self.fetched_at_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], name: str | None = None) -> "NodeStatus":
        return cls(
            name=name or data.get("name", "?"),
            reachable=data.get("reachable", True),
            error=data.get("error"),
            error_code=data.get("error_code"),
            generation=data.get("generation", 0),
            backend=data.get("backend"),
            hostname=data.get("hostname"),
            gpus=_mark_missing([GpuStatus.from_json(g) for g in data.get("gpus", [])], data.get("missing_gpus")),
            leases=[Lease.from_json(x) for x in data.get("leases", [])],
            fetched_at_s=data.get("fetched_at_s", time.time()),
        )


def _mark_missing(gpus: list[GpuStatus], missing_uuids: Any) -> list[GpuStatus]:
    """Set GpuStatus.missing for the GPUs a daemon's status lists in "missing_gpus"."""
    if isinstance(missing_uuids, list) and missing_uuids:
        wanted = set(missing_uuids)
        for g in gpus:
            if g.uuid in wanted:
                g.missing = True
    return gpus


@dataclass
class FleetSnapshot:
    """The merged view of every configured node at one moment (nodes in config order)."""

    nodes: list[NodeStatus]
    taken_at_s: float = field(default_factory=time.time)

    def node(self, name: str) -> NodeStatus | None:
        return next((n for n in self.nodes if n.name == name), None)

    def gpu_count(self) -> int:
        """GPUs of the reachable nodes that their backend reports (missing GPUs not counted)."""
        return sum(1 for n in self.nodes for g in n.gpus if not g.missing)


def gpu_equivalents(slices: list[Slice]) -> float:
    """Sum of the slices' fractions, in GPU-equivalents (two 1/2 slices = 1.0)."""
    return sum(s.fraction for s in slices)


@dataclass
class DepartmentTotals:
    """One department's slices across the reachable nodes of a snapshot.

    gpu_equivalents: sum of the fractions of its slices; leased_gpu_equivalents: of those leased.
    slices, leased_slices: counts. per_node: node name -> GPU-equivalents on that node.
    configured: False for a department the fleet config does not name (and for UNASSIGNED).
    """

    name: str
    configured: bool = True
    gpu_equivalents: float = 0.0
    leased_gpu_equivalents: float = 0.0
    slices: int = 0
    leased_slices: int = 0
    per_node: dict[str, float] = field(default_factory=dict)
    missing_gpu_equivalents: float = 0.0


def department_totals(snapshot: FleetSnapshot, departments: list[str]) -> list[DepartmentTotals]:
    """The one department-totals rule (CLI `gpuctl departments` and the console header): one row
    per department in order: `departments` (config order; rows of zero included), then
    departments only the fleet knows (sorted), then UNASSIGNED (always, least important).
    Unreachable nodes count nothing (they report no slices). Slices of a GPU missing from its
    backend (GpuStatus.missing) are counted apart, in missing_gpu_equivalents only."""
    rows: dict[str, DepartmentTotals] = {name: DepartmentTotals(name) for name in departments}
    extra: dict[str, DepartmentTotals] = {}
    unassigned = DepartmentTotals(UNASSIGNED, configured=False)
    for n in snapshot.nodes:
        missing = {g.uuid for g in n.gpus if g.missing}
        for s in n.slices():
            if s.department == UNASSIGNED:
                row = unassigned
            else:
                row = rows.get(s.department) or extra.setdefault(
                    s.department, DepartmentTotals(s.department, configured=False))
            if s.gpu_uuid in missing:
                row.missing_gpu_equivalents += s.fraction
                continue
            row.gpu_equivalents += s.fraction
            row.slices += 1
            if s.leased:
                row.leased_gpu_equivalents += s.fraction
                row.leased_slices += 1
            row.per_node[n.name] = row.per_node.get(n.name, 0.0) + s.fraction
    return [*rows.values(), *(extra[k] for k in sorted(extra)), unassigned]
