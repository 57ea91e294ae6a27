"""Fleet usage reports (sreport-like) from every node's usage accounting, and "what to move".

Headless. :func:`collect` asks every node ``GET /v1/usage`` in parallel (gpuctl.daemon.usage_api);
:func:`build_report` merges the answers into rows by department, node or GPU, optionally per day
or week; :func:`suggest` pairs departments whose owned slices sat idle with departments whose
lease requests were refused. A node that did not answer is named in ``unreachable_nodes`` and
every row it may have added to is marked ``incomplete`` (its figures are never counted as zero).

Figures are GPU-hours (a slice's hours x its fraction of the GPU):
owned_gpu_h (unassigned included, so the owned column of the fleet adds up to its GPU count x
hours recorded), leased_gpu_h, used_gpu_h (SM-utilization-weighted), mean_sm_util_pct (SM
utilization while owned, where known), idle_owned_gpu_h (owned, not leased, SM < 5 %),
outside_gpu_h (owned, not leased, while processes outside gpuctl ran on the GPU; where the process
list was known).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from gpuctl.model import UNASSIGNED

BY = ("department", "node", "gpu")
EVERY = ("day", "week")
#: The figures of a report row, in output order.
FIGURES = ("owned_gpu_h", "leased_gpu_h", "used_gpu_h", "mean_sm_util_pct", "idle_owned_gpu_h", "outside_gpu_h")
#: A department whose idle owned share is at least this is offered as a donor by suggest().
IDLE_SHARE_TO_SUGGEST = 0.5


@dataclass
class FleetUsage:
    """Answers of GET /v1/usage by node name, errors (message) by node name, and the period."""

    since_s: int
    until_s: int
    every: str | None
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def collect(fleet: Any, since_s: float, until_s: float, every: str | None = None) -> FleetUsage:
    """GET /v1/usage from every node of `fleet` (a gpuctl.fleet.client.FleetClient) in parallel. The
    report's period is rounded down to the minute (the daemons do the same). Blocking (network)."""
    params: dict[str, Any] = {"since": int(since_s), "until": int(until_s)}
    since, until = int(since_s) // 60 * 60, int(until_s) // 60 * 60
    if every:
        params["every"] = every
    res = fleet.fan_out(lambda c: c.request("GET", "/v1/usage", params=params))
    out = FleetUsage(since, until, every, answers=dict(res.values))
    for name, err in res.errors.items():
        out.errors[name] = str(err)
    return out


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _finish(acc: dict[str, float]) -> dict[str, Any]:
    h = 3600.0
    return {
        "owned_gpu_h": acc["owned_gpu_s"] / h,
        "leased_gpu_h": acc["leased_gpu_s"] / h,
        "used_gpu_h": acc["used_gpu_s"] / h,
        "mean_sm_util_pct": (100.0 * acc["used_gpu_s"] / acc["sm_known_gpu_s"]) if acc["sm_known_gpu_s"] else None,
        "idle_owned_gpu_h": acc["idle_gpu_s"] / h,
        "outside_gpu_h": acc["outside_gpu_s"] / h,
    }


_SUMS = ("owned_gpu_s", "leased_gpu_s", "used_gpu_s", "sm_known_gpu_s", "idle_gpu_s", "outside_gpu_s")


def build_report(usage: FleetUsage, by: str = "department", node_order: list[str] | None = None) -> dict[str, Any]:
    """Merge node answers into a report.

    Returns ``{"since", "until" (ISO UTC), "since_s", "until_s", "hours", "by", "every",
    "rows": [{"bucket" (ISO or None), <key fields>, *FIGURES, "incomplete"}], "total": {*FIGURES,
    "incomplete"}, "fleet_gpus", "fleet_gpu_hours" (reachable nodes' GPUs x hours of the period),
    "unreachable_nodes": {name: reason}, "refusals": [{"department", "count", "gpu_equivalents"}]}``.
    Key fields: ``department``; or ``node``; or ``node``, ``gpu`` (UUID), ``index``.
    """
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, got {by!r}")
    names = list(node_order or []) + sorted((set(usage.answers) | set(usage.errors)) - set(node_order or []))
    incomplete = bool(usage.errors)
    groups: dict[tuple, dict[str, float]] = {}
    meta: dict[tuple, dict[str, Any]] = {}
    fleet_gpus = 0
    refusals: dict[str, dict[str, Any]] = {}
    for name in names:
        ans = usage.answers.get(name)
        if ans is None:
            continue
        index = {g["uuid"]: g["index"] for g in ans.get("gpus", [])}
        fleet_gpus += len(index)
        for r in ans.get("rows", []):
            bucket = r["bucket_s"] if usage.every else None
            if by == "department":
                key, fields = (bucket, r["department"]), {"department": r["department"]}
            elif by == "node":
                key, fields = (bucket, name), {"node": name}
            else:
                key, fields = (bucket, name, r["gpu_uuid"]), {"node": name, "gpu": r["gpu_uuid"],
                                                              "index": index.get(r["gpu_uuid"])}
            acc = groups.setdefault(key, {k: 0.0 for k in _SUMS})
            meta[key] = {"bucket": None if bucket is None else _iso(max(bucket, usage.since_s)), **fields}
            for k in _SUMS:
                acc[k] += r.get(k) or 0.0
        for f in ans.get("refusals", []):
            d = refusals.setdefault(f["department"], {"department": f["department"], "count": 0,
                                                      "gpu_equivalents": None})
            d["count"] += f["count"]
            if f.get("gpu_equivalents") is not None:
                d["gpu_equivalents"] = (d["gpu_equivalents"] or 0.0) + f["gpu_equivalents"]

    def order(key: tuple) -> tuple:
        bucket = key[0] if key[0] is not None else 0
        if by == "node":
            return (bucket, names.index(key[1]))
        if by == "gpu":
            return (bucket, names.index(key[1]), meta[key].get("index") or 0)
        return (bucket, key[1] == UNASSIGNED, key[1])

    rows = []
    for key in sorted(groups, key=order):
        row = {**meta[key], **_finish(groups[key])}
        row["incomplete"] = incomplete if by == "department" else False
        rows.append(row)
    if by in ("node", "gpu"):
        for name in names:
            if name in usage.errors:
                rows.append({"bucket": None, "node": name, **({"gpu": None, "index": None} if by == "gpu" else {}),
                             **{k: None for k in FIGURES}, "incomplete": True})
    total_acc = {k: sum(g[k] for g in groups.values()) for k in _SUMS}
    hours = (usage.until_s - usage.since_s) / 3600.0
    return {
        "since": _iso(usage.since_s), "until": _iso(usage.until_s), "since_s": usage.since_s,
        "until_s": usage.until_s, "hours": hours, "by": by, "every": usage.every,
        "rows": rows, "total": {**_finish(total_acc), "incomplete": incomplete},
        "fleet_gpus": fleet_gpus, "fleet_gpu_hours": fleet_gpus * hours,
        "unreachable_nodes": dict(sorted(usage.errors.items())),
        "refusals": sorted(refusals.values(), key=lambda d: d["department"]),
    }


def _eighths(x: float) -> float:
    return int(x * 8) / 8


def suggest(report: dict[str, Any], priorities: dict[str, int]) -> list[dict[str, Any]]:
    """"What to move": for each department that had lease requests refused (most important first,
    by `priorities`: lower number = more important; departments not in it last), a donor whose
    owned slices sat idle (``unassigned`` first, then the least important department), and the
    reassign command that would move the idle capacity. `report` must be by department.

    Returns ``[{"to", "to_priority", "refusals", "from", "from_priority", "gpus", "idle_owned_gpu_h",
    "idle_share", "command"}]``; a short department with no donor gets ``"from": None`` and no
    command. GPUs offered: the donor's idle GPU-hours / the period's hours (whole eighths), at most
    what the short department asked in one refused request on average, where that is known.
    """
    if report["by"] != "department" or report["every"]:
        raise ValueError("suggest needs a report by department over one period (no --every)")
    hours = report["hours"] or 1.0
    left: dict[str, float] = {}
    share: dict[str, float] = {}
    idle_h: dict[str, float] = {}
    for r in report["rows"]:
        owned = r["owned_gpu_h"] or 0.0
        if owned <= 0:
            continue
        idle_h[r["department"]] = r["idle_owned_gpu_h"]
        share[r["department"]] = r["idle_owned_gpu_h"] / owned
        if r["department"] == UNASSIGNED:  # nobody can lease it: all of it is there to give
            left[UNASSIGNED] = _eighths((owned - r["leased_gpu_h"]) / hours)
        elif share[r["department"]] >= IDLE_SHARE_TO_SUGGEST:
            left[r["department"]] = _eighths(r["idle_owned_gpu_h"] / hours)
    big = 10**9
    donors = sorted((d for d in left if left[d] > 0),
                    key=lambda d: (d != UNASSIGNED, -priorities.get(d, big), d))
    out = []
    short = sorted(report.get("refusals", []), key=lambda f: (priorities.get(f["department"], big), f["department"]))
    for f in short:
        dept = f["department"]
        # the size of a refused request (its mean): a shortfall at one time, not the period's sum
        want = f["gpu_equivalents"] / f["count"] if f.get("gpu_equivalents") else None
        donor = next((d for d in donors if d != dept and left[d] > 0
                      and (d == UNASSIGNED or priorities.get(d, big) >= priorities.get(dept, big))), None)
        item = {"to": dept, "to_priority": priorities.get(dept), "refusals": f["count"], "from": donor,
                "from_priority": priorities.get(donor) if donor else None, "gpus": None,
                "idle_owned_gpu_h": idle_h.get(donor) if donor else None,
                "idle_share": share.get(donor) if donor else None, "command": None}
        if donor:
            gpus = left[donor] if want is None else min(left[donor], max(0.125, _eighths(want)))
            left[donor] -= gpus
            item["gpus"] = gpus
            item["command"] = f"gpuctl reassign --from {donor} --to {dept} --gpus {gpus:g}"
        out.append(item)
    return out


class NoUsageSource(Exception):
    """The fleet source keeps no usage accounting (e.g. the in-process simulated fleet)."""


def _fleet_client(source: Any) -> Any:
    """The gpuctl.fleet.client.FleetClient to ask for usage: `source` itself when it is one, else
    what the FleetSource offers (FleetSource.fleet_client; None: it keeps no usage accounting).
    Raises NoUsageSource when there is none."""
    from gpuctl.fleet.client import FleetClient

    fleet = source if isinstance(source, FleetClient) else source.fleet_client()
    if fleet is None:
        raise NoUsageSource("this fleet source keeps no usage accounting (only gpuctld nodes do)")
    return fleet


def report_from_source(source: Any, since_s: float, until_s: float, by: str = "department",
                       every: str | None = None) -> dict[str, Any]:
    """A report (build_report's shape) from a console FleetSource: its own ``usage_report`` method
    when it has one, else the nodes' GET /v1/usage through the FleetClient it offers
    (FleetSource.fleet_client; or `source` itself when it is a FleetClient). BLOCKING (network).
    Raises NoUsageSource when it offers none."""
    own = getattr(source, "usage_report", None)
    if callable(own):
        return own(since_s, until_s, by, every)
    fleet = _fleet_client(source)
    order = [n.name for n in fleet.config.nodes] if hasattr(fleet, "config") else None
    return build_report(collect(fleet, since_s, until_s, every), by, node_order=order)


def gpu_history_from_source(source: Any, node: str, uuid: str, since_s: float, until_s: float,
                            step_s: int) -> list[dict[str, Any]]:
    """Mean SM utilization and memory used of one GPU per `step_s` from the node's usage
    accounting (GET /v1/usage/history; hourly rollups when the step is whole hours): the points
    ``[{"ts", "gpu_uuid", "sm_util_pct", "memory_used_bytes", "sampled_s"}]``, oldest first.
    Uses the source's own ``usage_history`` when it has one, else the FleetClient it offers
    (FleetSource.fleet_client, or `source` itself when it is a FleetClient). BLOCKING (network).
    Raises NoUsageSource, or the client's NodeError."""
    own = getattr(source, "usage_history", None)
    if callable(own):
        return own(node, uuid, since_s, until_s, step_s)
    fleet = _fleet_client(source)
    since = int(since_s) // step_s * step_s
    answer = fleet.clients[node].request("GET", "/v1/usage/history", params={
        "since": since, "until": int(until_s), "step_s": step_s, "gpu": uuid})
    return answer["points"]
