"""The schedule on the control API (contract: docs/ARCHITECTURE.md, "Schedule").

- ``POST /v1/schedule`` ``{"request_id", "at_s", "from", "to", "slice_ids", "leased"?, "grace_s"?,
  "plan"?, "label"?}`` -> ``{"entry", "replayed"}`` (idempotent by request id).
- ``GET /v1/schedule`` -> ``{"now_s", "entries": [entry]}`` (now_s: the daemon's clock).
- ``DELETE /v1/schedule/{id}`` -> ``{"entry"}`` (cancelled); 404 unknown_entry, 409 entry_finished.
"""

from __future__ import annotations

import math
import urllib.parse
from typing import Any

from gpuctl.daemon.api import ApiError, ApiRequest, ControlApi, _get, _no_unknown, _request_id
from gpuctl.daemon.schedule import ScheduleEntry, ScheduleManager
from gpuctl.daemon.state import LEASED_MODES
from gpuctl.model import UNASSIGNED

#: Most slices one entry may name.
MAX_SLICES_PER_ENTRY = 4096


def _number(data: dict[str, Any], key: str, *, required: bool, default: float = 0.0) -> float:
    if key not in data:
        if required:
            raise ApiError(400, "missing_field", f"{key} is required", key)
        return default
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise ApiError(400, "invalid_field", f"{key} must be a number of seconds, got {str(v)[:40]!r}", key)
    return float(v)


def parse_entry(data: dict[str, Any]) -> ScheduleEntry:
    """Validate a POST /v1/schedule body into a ScheduleEntry (id filled in by the manager).
    Raises ApiError 400 naming the field."""
    _no_unknown(data, {"request_id", "at_s", "from", "to", "slice_ids", "leased", "grace_s", "plan", "label"})
    rid = _request_id(data)
    at_s = _number(data, "at_s", required=True)
    if at_s <= 0:
        raise ApiError(400, "invalid_field", f"at_s must be a Unix time in seconds (> 0), got {at_s}", "at_s")
    src = _get(data, "from", str, "from")
    dst = _get(data, "to", str, "to")
    for key, name in (("from", src), ("to", dst)):
        if name != UNASSIGNED and name.casefold() == UNASSIGNED:
            raise ApiError(400, "invalid_field", f"{key}: {name!r} is reserved; write {UNASSIGNED!r}", key)
    raw = _get(data, "slice_ids", list, "slice_ids")
    if not raw or len(raw) > MAX_SLICES_PER_ENTRY:
        raise ApiError(400, "invalid_field", f"slice_ids must name 1..{MAX_SLICES_PER_ENTRY} slices", "slice_ids")
    slice_ids = []
    for i, sid in enumerate(raw):
        if not isinstance(sid, str):
            raise ApiError(400, "invalid_field", f"slice_ids[{i}] must be a string", f"slice_ids[{i}]")
        slice_ids.append(_get({"x": sid}, "x", str, f"slice_ids[{i}]"))
    leased = _get(data, "leased", str, "leased", required=False, default="refuse")
    if leased not in LEASED_MODES:
        raise ApiError(400, "invalid_field", f"leased must be one of {', '.join(LEASED_MODES)}, got {leased!r}",
                       "leased")
    grace = _number(data, "grace_s", required=False)
    if grace < 0:
        raise ApiError(400, "invalid_field", f"grace_s must be >= 0, got {grace}", "grace_s")
    plan = _get(data, "plan", str, "plan", required=False)
    label = _get(data, "label", str, "label", required=False)
    return ScheduleEntry(id="", request_id=rid, at_s=at_s, src=src, dst=dst, slice_ids=slice_ids,
                         leased=leased, grace_s=grace, plan=plan, label=label)


def install(api: ControlApi, schedule: ScheduleManager, audit: Any = None) -> None:
    """Add the schedule routes to `api`. The entry's ``who`` is the audit context of the request
    (gpuctl.daemon.audit_api) when there is one."""

    def add(request: ApiRequest) -> tuple[int, dict[str, Any]]:
        entry = parse_entry(request.json_object())
        ctx = audit.current() if audit is not None else None
        entry.who = ctx.who if ctx is not None else None
        request.note = f"request_id={entry.request_id}"
        return 200, schedule.add(entry)

    def listing(request: ApiRequest) -> tuple[int, dict[str, Any]]:
        return 200, {"now_s": schedule.clock(), "entries": [e.to_json() for e in schedule.entries()]}

    def cancel(request: ApiRequest) -> tuple[int, dict[str, Any]]:
        eid = urllib.parse.unquote(request.path[len("/v1/schedule/"):])
        return 200, schedule.cancel(eid)

    api.add_route("POST", "/v1/schedule", add)
    api.add_route("GET", "/v1/schedule", listing)
    api.add_route("DELETE", "/v1/schedule/", cancel, prefix=True)
