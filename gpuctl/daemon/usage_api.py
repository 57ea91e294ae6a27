"""Control-API routes of usage accounting, and the recording of lease refusals.

- ``GET /v1/usage?since=S&until=U[&every=day|week]``: usage of the node's slices per (bucket,
  GPU, department) over [S, U) (Unix seconds, rounded down to the minute; lease refusals to the end of
  second U). Answer::

      {"node", "since_s", "until_s", "every", "recorded_through_s", "sources": [[table, from_s, to_s]],
       "gpus": [{"uuid", "index"}], "rows": [{"bucket_s", "gpu_uuid", "department", "slices",
       "owned_gpu_s", "leased_gpu_s", "used_gpu_s", "sm_known_gpu_s", "idle_gpu_s", "outside_gpu_s"}],
       "refusals": [{"department", "count", "gpu_equivalents"}]}

  Whole hours already rolled up are read from the hourly tables (``sources`` says which). Both
  routes first record up to now (UsageService.record_now): a minute that ended before U is
  answered whole even when the recorder's thread has not had its turn since.
- ``GET /v1/usage/history?since=S&until=U&step_s=N[&gpu=UUID]``: mean SM utilization and memory
  used per step (gpuctl.daemon.usage_db.UsageDb.gpu_history); at most :data:`MAX_HISTORY_POINTS`
  steps per GPU.

A lease request refused with ``insufficient_slices`` is recorded as a refusal of its department
(the "short" side of ``gpuctl report --suggest``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpuctl.daemon.api import ApiError, ApiRequest, ControlApi
from gpuctl.daemon.usage import UsageService

log = logging.getLogger("gpuctld.usage")

#: Bucket lengths of ``every``, seconds, and their origin (weeks start on Monday 00:00 UTC).
EVERY = {"day": (86400, 0), "week": (7 * 86400, 4 * 86400)}
#: Most steps per GPU a history answer may hold.
MAX_HISTORY_POINTS = 2000
#: Earliest and latest times accepted (2000-01-01 .. 2100-01-01), Unix seconds.
MIN_TIME_S, MAX_TIME_S = 946_684_800, 4_102_444_800


def _one(request: ApiRequest, name: str, required: bool = True) -> str | None:
    values = request.query.get(name)
    if not values:
        if required:
            raise ApiError(400, "missing_field", f"query parameter {name} is required", name)
        return None
    if len(values) > 1:
        raise ApiError(400, "invalid_field", f"query parameter {name} is given {len(values)} times", name)
    return values[0]


def _time(request: ApiRequest, name: str) -> int:
    text = _one(request, name)
    try:
        value = int(float(text))
    except (TypeError, ValueError, OverflowError):
        raise ApiError(400, "invalid_field", f"{name} must be Unix seconds, got {text[:40]!r}", name) from None
    if not MIN_TIME_S <= value <= MAX_TIME_S:
        raise ApiError(400, "invalid_field", f"{name} must be between {MIN_TIME_S} and {MAX_TIME_S}, got {value}", name)
    return value


def _period(request: ApiRequest) -> tuple[int, int]:
    """(since, until) rounded down to the minute. Raises ApiError naming the parameter."""
    since, until = _time(request, "since") // 60 * 60, _time(request, "until") // 60 * 60
    if until <= since:
        raise ApiError(400, "invalid_field", f"until ({until}) must be after since ({since}) by a minute or more",
                       "until")
    return since, until


def install(api: ControlApi, service: UsageService, gpu_index: dict[str, int]) -> None:
    """Add the usage routes to `api` and record the lease refusals of its POST /v1/leases route
    (through ControlApi.refusal_hooks). gpu_index: NVML index by GPU UUID."""

    def usage(request: ApiRequest) -> tuple[int, dict[str, Any]]:
        since, until = _period(request)
        every = _one(request, "every", required=False)
        if every is not None and every not in EVERY:
            raise ApiError(400, "invalid_field", f"every must be one of {', '.join(EVERY)}, got {every[:40]!r}", "every")
        bucket, origin = EVERY[every] if every else (None, 0)
        _record_now(service)
        db = service.db
        return 200, {
            "node": api.hostname, "since_s": since, "until_s": until, "every": every,
            "recorded_through_s": db.meta("recorded_through_s"),
            "sources": [list(p) for p in db.plan(since, until)],
            "gpus": [{"uuid": u, "index": i} for u, i in sorted(gpu_index.items(), key=lambda x: x[1])],
            "rows": db.slice_usage(since, until, bucket, origin),
            # refusals to the end of second U (they are not minutes; U is whole seconds)
            "refusals": db.refusals(since, _time(request, "until") + 1),
        }

    def history(request: ApiRequest) -> tuple[int, dict[str, Any]]:
        since, until = _period(request)
        text = _one(request, "step_s")
        try:
            step = int(text)
        except ValueError:
            raise ApiError(400, "invalid_field", f"step_s must be whole seconds, got {text[:40]!r}", "step_s") from None
        if step < 60 or step % 60:
            raise ApiError(400, "invalid_field", f"step_s must be a multiple of 60 seconds, got {step}", "step_s")
        if (until - since) / step > MAX_HISTORY_POINTS:
            raise ApiError(400, "invalid_field", f"step_s {step} gives more than {MAX_HISTORY_POINTS} points for "
                           f"this period; use a step of {-(-(until - since) // MAX_HISTORY_POINTS // 60) * 60} s or more",
                           "step_s")
        gpu = _one(request, "gpu", required=False)
        if gpu is not None and gpu not in gpu_index:
            raise ApiError(404, "unknown_gpu", f"no GPU {gpu[:80]!r} on node {api.hostname}", "gpu")
        _record_now(service)
        return 200, {"node": api.hostname, "since_s": since, "until_s": until, "step_s": step,
                     "points": service.db.gpu_history(gpu, since, until, step)}

    api.add_route("GET", "/v1/usage", usage)
    api.add_route("GET", "/v1/usage/history", history)

    def record_refusal(request: ApiRequest, error: Exception) -> None:
        if (request.method, request.path) == ("POST", "/v1/leases") and error.code == "insufficient_slices":
            _record_refusal(service, request, str(error))

    api.refusal_hooks.append(record_refusal)


def _record_now(service: UsageService) -> None:
    """Write the minutes that ended since the recorder's last round before reading (the recorder's
    thread may be late on a loaded node). A failure is logged and the database answers as it is."""
    try:
        service.record_now()
    except Exception as e:  # noqa: BLE001 - the thread retries; the answer is still what is recorded
        log.error("usage: could not record before reading: %s", e)


def _record_refusal(service: UsageService, request: ApiRequest, message: str) -> None:
    try:
        body = json.loads(request.body)
        dept = body["department"]
        amount = body.get("gpus")  # None when the request counted slices (their size is not known)
        service.db.add_refusal(service.clock(), str(dept), None if amount is None else float(amount), message)
    except Exception:  # noqa: BLE001 - the request was valid enough to be refused; never mask that answer
        pass
