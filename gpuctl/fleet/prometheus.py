"""A FleetSource whose telemetry and history come from a Prometheus that scrapes every gpuctld
(``[telemetry] source = "prometheus"`` in the fleet config), for fleets too large to poll over SSH.

Headless. :meth:`PrometheusFleetSource.snapshot` is one instant query over Prometheus's HTTP API
(``/api/v1/query``) for every ``DCGM_FI_DEV_*`` and ``gpuctl_*`` series (names and labels:
gpuctl.daemon.metrics); a configured node with no ``gpuctl_node_info`` series (never scraped, or
its target down: Prometheus marks its series stale) is a node with ``reachable=False``.
:meth:`history` is a range query over the last :data:`HISTORY_S` seconds. Ownership changes never
go through Prometheus: :meth:`reassign` is the SSH fleet client's (`control`).

Figures are what the daemon exported at its last scrape, so they are up to one scrape interval old.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx

from gpuctl import model

#: Seconds of history a node detail gets (the daemon's own ring keeps 10 minutes too).
HISTORY_S = 600.0
_MIB = 1024 * 1024

#: Sample field <- (metric, scale).
_SAMPLE_FIELDS = {
    "sm_util_pct": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "memory_util_pct": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0),
    "memory_used_bytes": ("gpuctl_gpu_memory_used_bytes", 1.0),
    "memory_total_bytes": ("gpuctl_gpu_memory_total_bytes", 1.0),
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "process_count": ("gpuctl_gpu_processes", 1.0),
}
_INTS = {"memory_used_bytes", "memory_total_bytes", "sm_clock_mhz", "process_count"}


class PrometheusError(Exception):
    """Prometheus did not answer, or answered with an error; the message names the URL."""


class PrometheusFleetSource:
    """FleetSource on a Prometheus at `url` (``http://host:9090``) for the nodes named `nodes`
    (their ``node`` label: ``gpuctld --metrics-node``, default the hostname).

    departments: the fleet config's departments. control: the SSH LiveFleetSource (gpuctl.fleet.source) that reassign()
    uses (None: reassign raises PrometheusError). timeout_s: per HTTP request. client: an httpx
    Client to use instead of a new one (tests).
    """

    def __init__(self, url: str, nodes: Sequence[str], departments: Sequence[model.Department] = (), *,
                 control: Any = None, timeout_s: float = 5.0, client: httpx.Client | None = None):
        self.url = url.rstrip("/")
        self.nodes = list(nodes)
        self.departments = list(departments)
        self.control = control
        self._http = client or httpx.Client(timeout=timeout_s)

    def _query(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            r = self._http.get(f"{self.url}{path}", params=params)
            body = r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise PrometheusError(f"Prometheus at {self.url}: {e}") from e
        if r.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"Prometheus at {self.url}: {body.get('error') or f'HTTP {r.status_code}'}")
        return body["data"]["result"]

    def _selector(self) -> str:
        nodes = "|".join(n.replace("\\", "\\\\").replace("|", "\\|").replace('"', '\\"') for n in self.nodes)
        return f'{{__name__=~"DCGM_FI_DEV_.*|gpuctl_.*",node=~"{nodes}"}}'

    def snapshot(self) -> model.FleetSnapshot:
        """Every configured node from one instant query (BLOCKING). When Prometheus itself does not
        answer, every node is unreachable with that reason."""
        now = time.time()
        try:
            series = self._query("/api/v1/query", {"query": self._selector()})
        except PrometheusError as e:
            return model.FleetSnapshot(nodes=[model.NodeStatus(name=n, reachable=False, error=str(e),
                                                               error_code="unreachable") for n in self.nodes],
                                       taken_at_s=now)
        by_node: dict[str, list[dict[str, Any]]] = {}
        for s in series:
            by_node.setdefault(s["metric"].get("node", ""), []).append(s)
        return model.FleetSnapshot(nodes=[self._node(n, by_node.get(n, []), now) for n in self.nodes], taken_at_s=now)

    def _node(self, name: str, series: list[dict[str, Any]], now: float) -> model.NodeStatus:
        info = next((s for s in series if s["metric"]["__name__"] == "gpuctl_node_info"), None)
        if info is None:
            return model.NodeStatus(name=name, reachable=False, error_code="unreachable",
                                    error=f"node {name}: Prometheus has no current metrics of it "
                                          f"(not scraped, or its gpuctld is down)")
        gen = next((s for s in series if s["metric"]["__name__"] == "gpuctl_node_generation"), None)
        gpus: dict[str, dict[str, Any]] = {}
        slices: dict[str, model.Slice] = {}
        for s in series:
            m, value = s["metric"], float(s["value"][1])
            metric = m["__name__"]
            uuid = m.get("gpu")
            if uuid is None:
                continue
            g = gpus.setdefault(uuid, {"index": int(m.get("index", -1)), "name": "?", "pci": None, "fields": {},
                                       "ts": float(s["value"][0])})
            if metric == "gpuctl_gpu_info":
                g["name"], g["pci"] = m.get("name") or "?", m.get("pci_bus_id") or None
            elif metric.startswith("gpuctl_slice_"):
                sl = slices.setdefault(m["slice"], model.Slice(id=m["slice"], gpu_uuid=uuid, fraction=1.0,
                                                               memory_quota_bytes=0, compute_share=1.0,
                                                               department=m.get("department", model.UNASSIGNED)))
                if metric == "gpuctl_slice_fraction":
                    sl.fraction = value
                elif metric == "gpuctl_slice_compute_share":
                    sl.compute_share = value
                elif metric == "gpuctl_slice_memory_quota_bytes":
                    sl.memory_quota_bytes = int(value)
                elif metric == "gpuctl_slice_leased" and value >= 1:
                    sl.lease_id = m.get("lease") or "(leased)"
                elif metric == "gpuctl_slice_lease_memory_in_use_bytes":
                    sl.usage = {**(sl.usage or {}), "memory_in_use_bytes": int(value)}
                elif metric == "gpuctl_slice_lease_ops_per_second":
                    sl.usage = {**(sl.usage or {}), "ops_per_s": value}
            else:
                for fld, (name, scale) in _SAMPLE_FIELDS.items():
                    if metric == name:
                        g["fields"][fld] = int(value * scale) if fld in _INTS else value * scale
        out = []
        for uuid, g in sorted(gpus.items(), key=lambda kv: kv[1]["index"]):
            ident = model.GpuIdentity(uuid=uuid, index=g["index"], name=g["name"], pci_bus_id=g["pci"],
                                      memory_total_bytes=g["fields"].get("memory_total_bytes"))
            sample = model.GpuSample(uuid=uuid, timestamp_s=g["ts"], **g["fields"]) if g["fields"] else None
            own = sorted((s for s in slices.values() if s.gpu_uuid == uuid), key=lambda s: model.split_slice_id(s.id)[1])
            out.append(model.GpuStatus(ident, sample, own))
        return model.NodeStatus(name=name, reachable=True, backend=info["metric"].get("backend"),
                                hostname=info["metric"].get("hostname"),
                                generation=int(float(gen["value"][1])) if gen else 0, gpus=out, fetched_at_s=now)

    def history(self, node: str, uuid: str, since: int = 0) -> tuple[int, list[model.GpuSample]]:
        """Samples of one GPU from a range query over the last HISTORY_S seconds, newer than the
        cursor `since` (a Unix time in whole seconds, as returned by the previous call) (BLOCKING;
        raises PrometheusError)."""
        now = time.time()
        start = max(now - HISTORY_S, float(since) + 1e-3) if since else now - HISTORY_S
        sel = ",".join(f'{k}="{v}"' for k, v in (("node", node), ("gpu", uuid)))
        names = "|".join(name for name, _ in _SAMPLE_FIELDS.values())
        series = self._query("/api/v1/query_range", {"query": f'{{__name__=~"{names}",{sel}}}',
                                                      "start": f"{start:.3f}", "end": f"{now:.3f}", "step": "1s"})
        at: dict[float, dict[str, Any]] = {}
        for s in series:
            fld = next(f for f, (name, _) in _SAMPLE_FIELDS.items() if name == s["metric"]["__name__"])
            for ts, v in s["values"]:
                at.setdefault(float(ts), {})[fld] = int(float(v)) if fld in _INTS else float(v)
        samples = [model.GpuSample(uuid=uuid, timestamp_s=ts, **f) for ts, f in sorted(at.items())]
        cursor = int(samples[-1].timestamp_s) if samples else int(since)
        return cursor, samples

    def reassign(self, request: Any) -> Any:
        """Ownership changes go to the nodes over SSH: the `control` fleet client's reassign."""
        if self.control is None:
            raise PrometheusError("this console reads telemetry from Prometheus and has no SSH fleet client "
                                  "for changes")
        return self.control.reassign(request)

    def fleet_client(self) -> Any:
        """The SSH control source's FleetClient (usage reports and history come from the nodes'
        gpuctld, not from Prometheus); None without `control`."""
        return None if self.control is None else self.control.fleet_client()

    def close(self) -> None:
        """Close the HTTP client and the control client (idempotent)."""
        self._http.close()
        if self.control is not None:
            self.control.close()


def source_for(config: Any, control: Any) -> PrometheusFleetSource:
    """The PrometheusFleetSource of a fleet config with ``[telemetry] source = "prometheus"``: its
    url and timeout, the config's nodes (node label = node name) and departments, and `control`
    (a LiveFleetSource over the SSH FleetClient) for changes."""
    return PrometheusFleetSource(config.telemetry.url, [n.name for n in config.nodes],
                                 [model.Department(d.name, d.priority, d.color) for d in config.departments],
                                 control=control, timeout_s=config.telemetry.timeout_s)
