"""`gpuctl audit`: the audit logs of every node, merged, newest last.

Each node keeps its own log (gpuctl.daemon.audit); this verb reads them all (``GET /v1/audit``),
filters by time, department and node, and prints one table or, with ``--json``, ``{"records",
"problems", "unreachable"}``. A corrupt or truncated line of a node's log is reported on stderr
(and under ``problems``) with its node, file and line number, never dropped silently.

Exit codes: OK; USAGE (bad --since, unknown --node or --dept); UNREACHABLE (a node could not be
read: the others are still shown).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gpuctl.exit_codes import ExitCode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuctl audit`` options."""
    parser.add_argument("--since", metavar="DURATION|TIME",
                        help="only records since: a duration back from now (2h, 1d) or a time (ISO 8601, 'today 08:00')")
    parser.add_argument("--dept", metavar="DEPT", help="only changes that moved slices or leases of this department")
    parser.add_argument("--node", metavar="NAME", help="only this node's log")


def mentions(record: dict[str, Any], dept: str) -> bool:
    """True when a record moved slices from or to `dept`, or granted/ended one of its leases."""
    for key in ("moved", "pending"):
        for m in record.get(key) or []:
            if isinstance(m, dict) and dept in (m.get("from"), m.get("to")):
                return True
    for key in ("leases_added", "leases_ended"):
        for lease in record.get(key) or []:
            if isinstance(lease, dict) and lease.get("department") == dept:
                return True
    return any(isinstance(s, dict) and s.get("to") == dept for s in record.get("slices_created") or [])


def filter_dept(records: list[dict[str, Any]], dept: str) -> list[dict[str, Any]]:
    """Records that mention `dept`, with the begin/end records of the same operation."""
    ops = {(r.get("node"), r.get("op")) for r in records if r.get("op") and mentions(r, dept)}
    return [r for r in records if mentions(r, dept) or (r.get("op") and (r.get("node"), r.get("op")) in ops)]


def who_text(who: Any) -> str:
    """``ssh_user (reported user@host)`` or ``gpuctld:<job>`` for internal changes."""
    if not isinstance(who, dict):
        return "?"
    if "internal" in who:
        by = who.get("scheduled_by")
        extra = f" for {who_text(by)}" if isinstance(by, dict) else ""
        return f"gpuctld:{who['internal']}{extra}"
    user = who.get("ssh_user") or f"uid {who.get('peer_uid')}"
    rep = who.get("reported")
    return f"{user} ({rep})" if rep else str(user)


def what_text(r: dict[str, Any]) -> str:
    """What a record says happened, in a few words."""
    parts = []
    moved = r.get("moved") or []
    if moved and isinstance(moved[0], dict):
        pairs: dict[tuple[str, str], int] = {}
        for m in moved:
            pairs[(m.get("from"), m.get("to"))] = pairs.get((m.get("from"), m.get("to")), 0) + 1
        parts += [f"{n} slice(s) {a} -> {b}" for (a, b), n in pairs.items()]
    if r.get("moved_slice_ids"):
        parts.append(f"{len(r['moved_slice_ids'])} slice(s) moved")
    for key, word in (("pending", "waiting to drain"), ("leases_added", "lease(s) granted"),
                      ("leases_ended", "lease(s) ended"), ("split", "GPU(s) split"),
                      ("slices_created", "slice(s) created")):
        if r.get(key):
            parts.append(f"{len(r[key])} {word}")
    if r.get("phase") == "begin":
        parts.append("started")
    if r.get("error"):
        parts.append(f"{r['error'].get('code')}: {r['error'].get('message')}")
    if r.get("reason"):
        parts.append(str(r["reason"]))
    if r.get("note"):
        parts.append(str(r["note"]))
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    """Run ``gpuctl audit``; returns an ExitCode."""
    from gpuctl.cli import UsageError  # gpuctl.cli's own class (under `python -m gpuctl.cli` there are two)

    try:
        return _run(args)
    except UsageError as e:
        print(f"gpuctl: {e}", file=sys.stderr)
        return ExitCode.USAGE


def _run(args: argparse.Namespace) -> int:
    from gpuctl.cli import UsageError, _check_node, _console, _emit_json, _err, _fleet, _load_config
    from gpuctl.timeparse import TimeError, parse_since, show_local

    cfg = _load_config(args)
    _check_node(cfg, args.node)
    if args.dept and args.dept != "unassigned" and args.dept not in {d.name for d in cfg.departments}:
        known = ", ".join(sorted(d.name for d in cfg.departments))
        raise UsageError(f"--dept: unknown department {args.dept!r} (known: {known}, unassigned)")
    since_s = None
    if args.since:
        try:
            since_s = parse_since(args.since, time.time())
        except TimeError as e:
            raise UsageError(f"--since: {e}") from None
    fleet = _fleet(args, cfg)
    try:
        res = fleet.fan_out(lambda c: c.audit(since_s), [args.node] if args.node else None)
    finally:
        fleet.close()
    records: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    for node, doc in res.values.items():
        for r in doc.get("records", []):
            records.append({**r, "node_name": node})
        problems += [{"node": node, **p} for p in doc.get("problems", [])]
        if doc.get("truncated"):
            _err(f"node {node}: only its newest {len(doc.get('records', []))} records were sent; use --since")
    records.sort(key=lambda r: (r.get("time_s") or 0, r.get("node_name")))
    if args.dept:
        records = filter_dept(records, args.dept)
    if args.json:
        _emit_json({"records": records, "problems": problems,
                    "unreachable": {n: str(e) for n, e in res.errors.items()}})
    else:
        from rich.table import Table

        t = Table(title="audit (local time, newest last)", title_justify="left")
        for col in ("time", "node", "who", "action", "request", "what", "outcome"):
            t.add_column(col, no_wrap=col in ("time", "node"))
        for r in records:
            t.add_row(show_local(r.get("time_s") or 0), r["node_name"], who_text(r.get("who")),
                      str(r.get("action") or r.get("event")), str(r.get("request_id") or ""), what_text(r),
                      str(r.get("outcome") or ""))
        _console().print(t)
    for p in problems:
        _err(f"node {p['node']}: {p['file']} line {p['line']}: unreadable audit record ({p['error']}): "
             f"{p['text'][:80]!r}")
    for node, err in res.errors.items():
        _err(f"node {node}: its audit log is not shown: {err}")
    return ExitCode.UNREACHABLE if res.errors else ExitCode.OK
