"""The audit log on the control API: every change request recorded before it runs and before the
answer goes out, and ``GET /v1/audit`` to read the log.

:func:`install` wraps ``ControlApi.handle`` (whatever server engine calls it): for each request
that is not a GET/HEAD it writes a ``request`` ``begin`` record (who, request id, action), runs the
request with that audit context (so the state's commit hook names who made the change), then
writes the ``end`` record (status, outcome) before returning the answer. When the begin record
cannot be written the request is refused with 503 ``audit_unavailable`` and nothing changes.

``GET /v1/audit[?since_s=T][&limit=N]``: the newest N records (default and most
MAX_RECORDS_PER_ANSWER) with ``time_s >= T``, oldest first; ``truncated`` when older ones matched
too; ``problems``: lines that are not records (at most MAX_PROBLEMS_PER_ANSWER, the newest; the
rest counted in ``problems_omitted``). Only the files and lines that answer needs are read
(gpuctl.daemon.audit.read_newest), not the whole rotated log (up to ~96 MiB).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from gpuctl.daemon.api import ApiError, ApiRequest, ControlApi, printable
from gpuctl.daemon.audit import (MAX_RECORDS_PER_ANSWER, REPORTED_USER_HEADER, AuditLog, AuditWriteError,
                                 read_newest, who_of_peer)

log = logging.getLogger("gpuctld.audit")

#: Longest reported user@host kept, characters.
MAX_REPORTED_CHARS = 200


def reported_user(request: ApiRequest) -> str | None:
    """The ``Gpuctl-User`` header's user@host (printable, cut to 200 characters), or None."""
    headers = getattr(request, "headers", None) or {}
    value = headers.get(REPORTED_USER_HEADER)
    if not value:
        return None
    return printable(value, MAX_REPORTED_CHARS)


def request_id_of(request: ApiRequest) -> str | None:
    """The body's ``request_id`` when the body is a JSON object with a string there, else None."""
    if not request.body:
        return None
    try:
        data = json.loads(request.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    rid = data.get("request_id") if isinstance(data, dict) else None
    return printable(rid, 200) if isinstance(rid, str) else None


def action_of(request: ApiRequest) -> str:
    """Words for what the request does: "assign", "split", "lease grant", "lease renew", ..."""
    path, method = request.path, request.method
    if path == "/v1/assign":
        return "assign"
    if path == "/v1/split":
        return "split"
    if path == "/v1/gpus/forget":
        return "forget gpu"
    if path == "/v1/leases" and method == "POST":
        return "lease grant"
    if path.startswith("/v1/leases/"):
        if method == "DELETE":
            return "lease release"
        if path.endswith("/heartbeat"):
            return "lease renew"
    if path == "/v1/schedule" and method == "POST":
        return "schedule add"
    if path.startswith("/v1/schedule/") and method == "DELETE":
        return "schedule cancel"
    return f"{method} {printable(path, 120)}"


def install(api: ControlApi, audit: AuditLog) -> None:
    """Wrap ``api.handle`` with audit records and add ``GET /v1/audit`` (see the module docstring)."""
    inner = api.handle

    def handle(request: ApiRequest) -> tuple[int, dict[str, Any]]:
        if request.method in ("GET", "HEAD"):
            return inner(request)
        who = who_of_peer(request.peer.uid, request.peer.pid, reported_user(request))
        rid = request_id_of(request)
        action = action_of(request)
        op = audit.next_op()
        try:
            audit.append({"event": "request", "phase": "begin", "op": op, "method": request.method,
                          "path": printable(request.path, 200), "request_id": rid, "who": who,
                          "action": action})
        except AuditWriteError as e:
            log.error("%s", e)
            return 503, ApiError(503, "audit_unavailable",
                                 f"{e}; the change was refused: every change is audited before it is made").to_json()
        with audit.context(who, rid, action, op):
            status, body = inner(request)
        end: dict[str, Any] = {"event": "request", "phase": "end", "op": op, "request_id": rid,
                               "who": who, "action": action, "status": status,
                               "outcome": "ok" if status < 400 else ("refused" if status < 500 else "error")}
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            end["error"] = {"code": err.get("code"), "message": err.get("message")}
        if isinstance(body, dict) and body.get("replayed"):
            end["replayed"] = True
        try:
            audit.append(end)
        except AuditWriteError as e:  # the begin record stands; the reader shows it as open
            log.error("%s (answer of %s %s)", e, request.method, request.path)
        return status, body

    api.handle = handle  # type: ignore[method-assign]

    def get_audit(request: ApiRequest) -> tuple[int, dict[str, Any]]:
        raw = request.query.get("since_s", [None])[-1]
        since = None
        if raw is not None:
            if not re.fullmatch(r"[0-9]{1,15}(\.[0-9]{1,9})?", raw):
                raise ApiError(400, "invalid_field", f"since_s must be a Unix time in seconds, got {raw[:40]!r}",
                               "since_s")
            since = float(raw)
        raw_limit = request.query.get("limit", [None])[-1]
        limit = MAX_RECORDS_PER_ANSWER
        if raw_limit is not None:
            if not re.fullmatch(r"[0-9]{1,9}", raw_limit) or not 1 <= int(raw_limit) <= MAX_RECORDS_PER_ANSWER:
                raise ApiError(400, "invalid_field", f"limit must be a whole number from 1 to "
                               f"{MAX_RECORDS_PER_ANSWER}, got {raw_limit[:40]!r}", "limit")
            limit = int(raw_limit)
        result = read_newest(audit.directory, since, limit)
        return 200, {"node": audit.node, "records": result.records, "truncated": result.truncated,
                     "problems": [p.to_json() for p in result.problems], "problems_omitted": result.problems_omitted}

    api.add_route("GET", "/v1/audit", get_audit)
