"""Prometheus metrics of a gpuctld (``--metrics-listen ADDR:PORT``), served by prometheus-client.

Every scrape builds the figures from the same answer as ``GET /v1/status`` (so the metrics and the
console never disagree); nothing calls the GPU backend. A figure that is N/A is left out of the
scrape, never exported as a made-up zero.

Per GPU, labels ``node`` (``--metrics-node``, default the hostname), ``gpu`` (UUID), ``index``
(NVML index), ``department`` (the department owning all its slices; ``mixed`` when slices of
several departments share it; ``unassigned``). Names follow dcgm-exporter where the figure is the
same one, in the same unit:

==============================  ============================================  ========
DCGM_FI_DEV_GPU_UTIL            GPU (SM) utilization, nvmlDeviceGetUtilizationRates.gpu    %
DCGM_FI_DEV_MEM_COPY_UTIL       memory-controller utilization                              %
DCGM_FI_DEV_FB_USED             framebuffer memory used                                    MiB
DCGM_FI_DEV_FB_FREE             framebuffer memory free (total - used - reserved)          MiB
DCGM_FI_DEV_GPU_TEMP            GPU temperature                                            °C
DCGM_FI_DEV_POWER_USAGE         power draw                                                 W
DCGM_FI_DEV_SM_CLOCK            SM clock                                                   MHz
gpuctl_gpu_memory_used_bytes    memory used                                                bytes
gpuctl_gpu_memory_total_bytes   memory total                                               bytes
gpuctl_gpu_processes            compute processes on the GPU                               count
gpuctl_gpu_info                 1, labels name (model) and pci_bus_id besides the GPU's
==============================  ============================================  ========

Per slice, labels ``node``, ``gpu``, ``index``, ``slice`` (slice id), ``department`` (owner):
``gpuctl_slice_fraction`` (of its GPU), ``gpuctl_slice_leased`` (1 leased, 0 free; label ``lease``:
the lease id or ""), ``gpuctl_slice_compute_share``, ``gpuctl_slice_memory_quota_bytes``, ``gpuctl_slice_lease_memory_in_use_bytes`` and
``gpuctl_slice_lease_ops_per_second`` (while leased, from the lease worker's figures). Per node:
``gpuctl_node_generation`` and ``gpuctl_node_info{node, backend, hostname}`` = 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from gpuctl.model import UNASSIGNED, NodeStatus

MIB = 1024 * 1024
GPU_LABELS = ("node", "gpu", "index", "department")
SLICE_LABELS = ("node", "gpu", "index", "slice", "department")

#: (metric name, help, function of a GpuSample giving the value or None).
GPU_METRICS: tuple[tuple[str, str, Any], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: s.sm_util_pct),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda s: s.memory_util_pct),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
     lambda s: None if s.memory_used_bytes is None else s.memory_used_bytes / MIB),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
     lambda s: None if s.memory_total_bytes is None or s.memory_used_bytes is None else
     (s.memory_total_bytes - s.memory_used_bytes - (s.memory_reserved_bytes or 0)) / MIB),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.power_w),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: s.sm_clock_mhz),
    ("gpuctl_gpu_memory_used_bytes", "GPU memory used, bytes.", lambda s: s.memory_used_bytes),
    ("gpuctl_gpu_memory_total_bytes", "GPU memory total, bytes.", lambda s: s.memory_total_bytes),
    ("gpuctl_gpu_processes", "Compute processes on the GPU.", lambda s: s.process_count),
)


def gpu_department(slices: list) -> str:
    """The department label of a GPU: its slices' one owner, ``mixed`` for several, ``unassigned``."""
    owners = {s.department for s in slices}
    if not owners:
        return UNASSIGNED
    return owners.pop() if len(owners) == 1 else "mixed"


def families(status: NodeStatus, node: str) -> list[Metric]:
    """The metric families of one node's status (see the module docstring)."""
    gpu_fams = {name: GaugeMetricFamily(name, help_, labels=GPU_LABELS) for name, help_, _ in GPU_METRICS}
    fraction = GaugeMetricFamily("gpuctl_slice_fraction", "Fraction of its GPU the slice is.", labels=SLICE_LABELS)
    leased = GaugeMetricFamily("gpuctl_slice_leased", "1 while a lease holds the slice, else 0.",
                               labels=SLICE_LABELS + ("lease",))
    share = GaugeMetricFamily("gpuctl_slice_compute_share", "Compute share of the slice (0..1).", labels=SLICE_LABELS)
    ginfo = GaugeMetricFamily("gpuctl_gpu_info", "The GPU's model name and PCI bus id.",
                              labels=GPU_LABELS + ("name", "pci_bus_id"))
    quota = GaugeMetricFamily("gpuctl_slice_memory_quota_bytes", "Memory quota of the slice, bytes.",
                              labels=SLICE_LABELS)
    in_use = GaugeMetricFamily("gpuctl_slice_lease_memory_in_use_bytes",
                               "Memory in use by the slice's lease, bytes.", labels=SLICE_LABELS)
    ops = GaugeMetricFamily("gpuctl_slice_lease_ops_per_second", "Operations per second of the slice's lease.",
                            labels=SLICE_LABELS)
    for g in status.gpus:
        if g.identity.index < 0:
            continue  # a GPU missing from the backend has no figures
        labels = [node, g.uuid, str(g.identity.index), gpu_department(g.slices)]
        ginfo.add_metric(labels + [g.identity.name, g.identity.pci_bus_id or ""], 1.0)
        s = g.sample
        if s is not None and s.error is None:
            for name, _, get in GPU_METRICS:
                value = get(s)
                if value is not None:
                    gpu_fams[name].add_metric(labels, float(value))
        for sl in g.slices:
            sl_labels = [node, g.uuid, str(g.identity.index), sl.id, sl.department]
            fraction.add_metric(sl_labels, float(sl.fraction))
            leased.add_metric(sl_labels + [sl.lease_id or ""], 1.0 if sl.leased else 0.0)
            share.add_metric(sl_labels, float(sl.compute_share))
            quota.add_metric(sl_labels, float(sl.memory_quota_bytes))
            usage = sl.usage or {}
            if usage.get("memory_in_use_bytes") is not None:
                in_use.add_metric(sl_labels, float(usage["memory_in_use_bytes"]))
            if usage.get("ops_per_s") is not None:
                ops.add_metric(sl_labels, float(usage["ops_per_s"]))
    info = GaugeMetricFamily("gpuctl_node_info", "The node's daemon: backend and hostname.",
                             labels=("node", "backend", "hostname"))
    info.add_metric([node, status.backend or "", status.hostname or ""], 1.0)
    gen = GaugeMetricFamily("gpuctl_node_generation", "The node's state generation.", labels=("node",))
    gen.add_metric([node], float(status.generation))
    return [*gpu_fams.values(), ginfo, fraction, leased, share, quota, in_use, ops, info, gen]


class _StatusCollector:
    def __init__(self, api: Any, node: str):
        self.api = api
        self.node = node

    def collect(self) -> Iterator[Metric]:
        from gpuctl.daemon.api import ApiRequest

        code, body = self.api.handle(ApiRequest(method="GET", path="/v1/status"))
        if code != 200:
            return iter(())
        return iter(families(NodeStatus.from_json(body, name=self.node), self.node))


class MetricsServer:
    """prometheus-client's HTTP server on (addr, port) (port 0: any free port, see ``.port``),
    serving the metrics of `api` (a gpuctl.daemon.api.ControlApi). Raises OSError when it cannot
    listen."""

    def __init__(self, api: Any, *, node: str, addr: str, port: int):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StatusCollector(api, node))
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = self._server.server_port

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
