"""Plans: what each department should own over time, as windows in a TOML file (headless, no I/O
beyond reading the file).

File format::

    [plan]
    name = "daytime-inference"   # identifies this plan's schedule entries on the nodes (default: file stem)
    pool = "unassigned"          # windows take GPUs from the pool and give them back at their end
    capacity_gpus = 16           # GPU-equivalents the pool holds (optional: else the fleet is asked)
    zone = "Europe/Paris"        # zone of times written without one (default: the system's zone)

    [[window]]
    department = "inference"
    gpus = 4                     # GPU-equivalents
    start = "2026-03-02T08:00"   # ISO 8601; with `every`: the first day the recurrence may start
    end = "2026-06-30T20:00"     # with `every`: no occurrence starts at or after it
    every = "0 8 * * 1-5"        # optional cron expression (croniter): each occurrence's start
    duration = "12h"             # with `every`: each occurrence's length
    nodes = ["gpu-01"]           # optional: only slices of these nodes
    on_conflict = "drain"        # drain | revoke: what happens to leased slices when a move is due

Cron occurrences are computed in the plan's zone with croniter and zoneinfo, so "08:00 on weekdays"
stays 08:00 local time across daylight-saving changes. Every error is a gpuctl.config.ConfigError
naming ``file:line: key``.

Department priority (lower number = more important, from the fleet config) decides who is short
when windows over-commit the pool: at each instant the pool is handed out in priority order.
"""

from __future__ import annotations

import datetime as dt
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from gpuctl.config import ConfigError, _decode, _scan, _toml_error
from gpuctl.model import UNASSIGNED
from gpuctl.timeparse import TimeError, parse_duration, system_zone

ON_CONFLICT = ("drain", "revoke")
#: Most occurrences one recurring window may produce within a check or apply horizon.
MAX_OCCURRENCES = 10000
_EPS = 1e-9


@dataclass
class Window:
    """One [[window]] of a plan. Times in Unix seconds; ``line``: where it starts in the file."""

    index: int
    line: int | None
    department: str
    gpus: float
    start_s: float
    end_s: float
    every: str | None = None
    duration_s: float | None = None
    nodes: tuple[str, ...] = ()
    on_conflict: str = "drain"

    @property
    def label(self) -> str:
        """``window[2] (line 14, inference)``."""
        return f"window[{self.index}] (line {self.line}, {self.department})"


@dataclass
class Plan:
    """A parsed plan file: name, pool department, capacity (GPU-equivalents or None), zone, windows."""

    path: str
    name: str
    pool: str
    capacity_gpus: float | None
    zone: dt.tzinfo
    windows: list[Window] = field(default_factory=list)


@dataclass(frozen=True)
class Occurrence:
    """One interval [start_s, end_s) of a window."""

    window: Window
    start_s: float
    end_s: float


def load_plan(path: str | Path, departments: dict[str, int], nodes: set[str] | None = None) -> Plan:
    """Read and validate a plan file. departments: name -> priority (from the fleet config); nodes:
    the fleet's node names (None: not checked). Raises ConfigError naming file:line: key."""
    p = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(p, f"cannot read the plan file: {e.strerror or e}") from None
    text = _decode(data, p)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _toml_error(e, text, p) from None
    lines, _ = _scan(text)
    return _Reader(p, lines, departments, nodes).plan(raw)


class _Reader:
    def __init__(self, path: str, lines: dict, departments: dict[str, int], nodes: set[str] | None):
        self.path, self.lines, self.departments, self.nodes = path, lines, departments, nodes

    def err(self, key_path: tuple, key: str, message: str) -> ConfigError:
        line = None
        for k in range(len(key_path), 0, -1):
            line = self.lines.get(key_path[:k])
            if line is not None:
                break
        return ConfigError(self.path, message, line=line, key=key)

    def plan(self, raw: dict[str, Any]) -> Plan:
        for key in raw:
            if key not in ("plan", "window"):
                raise self.err((key,), key, "unknown table; a plan has [plan] and [[window]] tables")
        head = raw.get("plan", {})
        if not isinstance(head, dict):
            raise self.err(("plan",), "plan", "must be a table: [plan]")
        for key in head:
            if key not in ("name", "pool", "capacity_gpus", "zone"):
                raise self.err(("plan", key), f"plan.{key}", "unknown key (allowed: name, pool, capacity_gpus, zone)")
        name = head.get("name", Path(self.path).stem)
        if not isinstance(name, str) or not name.strip() or not name.isprintable() or len(name) > 100:
            raise self.err(("plan", "name"), "plan.name", "must be 1..100 printable characters")
        pool = head.get("pool", UNASSIGNED)
        if pool != UNASSIGNED and pool not in self.departments:
            raise self.err(("plan", "pool"), "plan.pool", f"unknown department {pool!r} "
                           f"(known: {', '.join(sorted(self.departments))}, {UNASSIGNED})")
        cap = head.get("capacity_gpus")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not
                                math.isfinite(cap) or cap < 0):
            raise self.err(("plan", "capacity_gpus"), "plan.capacity_gpus", f"must be a number >= 0, got {cap!r}")
        zone: dt.tzinfo = system_zone()
        if "zone" in head:
            try:
                zone = ZoneInfo(str(head["zone"]))
            except (ZoneInfoNotFoundError, ValueError):
                raise self.err(("plan", "zone"), "plan.zone", f"unknown time zone {head['zone']!r} "
                               f"(an IANA name such as Europe/Paris)") from None
        plan = Plan(self.path, name, pool, float(cap) if cap is not None else None, zone)
        windows = raw.get("window", [])
        if not isinstance(windows, list) or not windows:
            raise self.err(("window",), "window", "a plan needs at least one [[window]]")
        for i, w in enumerate(windows):
            plan.windows.append(self.window(i, w, plan))
        return plan

    def window(self, i: int, w: Any, plan: Plan) -> Window:
        kp = ("window", i)
        where = f"window[{i}]"
        allowed = ("department", "gpus", "start", "end", "every", "duration", "nodes", "on_conflict")
        for key in w:
            if key not in allowed:
                raise self.err(kp + (key,), f"{where}.{key}", f"unknown key (allowed: {', '.join(allowed)})")
        for key in ("department", "gpus", "start", "end"):
            if key not in w:
                raise self.err(kp, f"{where}.{key}", "is required")
        dept = w["department"]
        if dept not in self.departments:
            raise self.err(kp + ("department",), f"{where}.department",
                           f"unknown department {dept!r} (known: {', '.join(sorted(self.departments))})")
        if dept == plan.pool:
            raise self.err(kp + ("department",), f"{where}.department", f"{dept!r} is the plan's pool")
        gpus = w["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not math.isfinite(gpus) or gpus <= 0:
            raise self.err(kp + ("gpus",), f"{where}.gpus", f"must be a number of GPU-equivalents > 0, got {gpus!r}")
        start = self.time(kp, where, "start", w["start"], plan.zone)
        end = self.time(kp, where, "end", w["end"], plan.zone)
        if end <= start:
            raise self.err(kp + ("end",), f"{where}.end", f"{w['end']} is not after start {w['start']}: "
                           f"a window must end after it starts")
        every, duration = w.get("every"), None
        if every is not None:
            if not isinstance(every, str) or not croniter.is_valid(every):
                raise self.err(kp + ("every",), f"{where}.every",
                               f"{every!r} is not a cron expression (minute hour day month weekday, e.g. '0 8 * * 1-5')")
            if "duration" not in w:
                raise self.err(kp, f"{where}.duration", "is required with every (each occurrence's length, e.g. 12h)")
            try:
                duration = parse_duration(str(w["duration"]))
            except TimeError as e:
                raise self.err(kp + ("duration",), f"{where}.duration", str(e)) from None
        elif "duration" in w:
            raise self.err(kp + ("duration",), f"{where}.duration", "only with every (a one-off window runs start..end)")
        nodes = w.get("nodes", [])
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise self.err(kp + ("nodes",), f"{where}.nodes", "must be a list of node names")
        if self.nodes is not None:
            for n in nodes:
                if n not in self.nodes:
                    raise self.err(kp + ("nodes",), f"{where}.nodes",
                                   f"unknown node {n!r} (known: {', '.join(sorted(self.nodes))})")
        mode = w.get("on_conflict", "drain")
        if mode not in ON_CONFLICT:
            raise self.err(kp + ("on_conflict",), f"{where}.on_conflict", f"must be drain or revoke, got {mode!r}")
        return Window(i, self.lines.get(kp), dept, float(gpus), start, end, every, duration, tuple(nodes), mode)

    def time(self, kp: tuple, where: str, key: str, value: Any, zone: dt.tzinfo) -> float:
        if isinstance(value, dt.datetime):
            when = value
        elif isinstance(value, dt.date):
            when = dt.datetime(value.year, value.month, value.day)
        elif isinstance(value, str):
            try:
                when = dt.datetime.fromisoformat(value)
            except ValueError:
                raise self.err(kp + (key,), f"{where}.{key}",
                               f"{value!r} is not an ISO 8601 time (2026-03-02T08:00, zone optional)") from None
        else:
            raise self.err(kp + (key,), f"{where}.{key}", f"must be a time, got {value!r}")
        if when.tzinfo is None:
            when = when.replace(tzinfo=zone)
        return when.timestamp()


def occurrences(plan: Plan, from_s: float, to_s: float) -> list[Occurrence]:
    """Every window interval that overlaps [from_s, to_s), by start time. A recurring window's
    starts come from croniter in the plan's zone (so DST keeps the local time of day)."""
    out = []
    for w in plan.windows:
        if w.every is None:
            if w.start_s < to_s and w.end_s > from_s:
                out.append(Occurrence(w, w.start_s, w.end_s))
            continue
        assert w.duration_s is not None
        first = max(w.start_s, from_s - w.duration_s)
        base = dt.datetime.fromtimestamp(first, plan.zone) - dt.timedelta(seconds=1)
        it = croniter(w.every, base)
        for _ in range(MAX_OCCURRENCES):
            s = it.get_next(dt.datetime).timestamp()
            if s >= w.end_s or s >= to_s:
                break
            if s < w.start_s:
                continue
            if s + w.duration_s > from_s:
                out.append(Occurrence(w, s, s + w.duration_s))
    out.sort(key=lambda o: (o.start_s, o.window.index))
    return out


@dataclass
class Segment:
    """[start_s, end_s) during which the same windows are active. wanted / given: GPU-equivalents
    per window index (given = after the pool is handed out in priority order); short: window
    index -> GPU-equivalents missing."""

    start_s: float
    end_s: float
    active: list[Occurrence]
    wanted: dict[int, float]
    given: dict[int, float]

    @property
    def short(self) -> dict[int, float]:
        return {i: self.wanted[i] - self.given.get(i, 0.0) for i in self.wanted
                if self.wanted[i] - self.given.get(i, 0.0) > _EPS}

    def by_department(self, plan: Plan) -> dict[str, float]:
        """GPU-equivalents given to each department in this segment."""
        out: dict[str, float] = {}
        for i, g in self.given.items():
            d = plan.windows[i].department
            out[d] = out.get(d, 0.0) + g
        return out


def segments(plan: Plan, from_s: float, to_s: float, capacity_gpus: float | None,
             priorities: dict[str, int]) -> list[Segment]:
    """The timeline between from_s and to_s cut at every window boundary. With a capacity the pool
    is handed out in priority order (then window order); without one every window gets what it wants."""
    occ = occurrences(plan, from_s, to_s)
    cuts = sorted({from_s, to_s} | {t for o in occ for t in (o.start_s, o.end_s) if from_s < t < to_s})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        active = [o for o in occ if o.start_s <= a < o.end_s]
        wanted: dict[int, float] = {}
        for o in active:
            wanted[o.window.index] = wanted.get(o.window.index, 0.0) + o.window.gpus
        given: dict[int, float] = {}
        left = math.inf if capacity_gpus is None else capacity_gpus
        for i in sorted(wanted, key=lambda i: (priorities.get(plan.windows[i].department, 1 << 30), i)):
            given[i] = min(wanted[i], max(left, 0.0))
            left -= given[i]
        out.append(Segment(a, b, active, wanted, given))
    return out


@dataclass
class Conflict:
    """An over-commitment: from ``at_s`` until ``until_s`` the windows want ``demand`` GPU-equivalents
    of a pool of ``capacity``; ``short``: window label -> GPU-equivalents it does not get."""

    at_s: float
    until_s: float
    windows: list[str]
    demand: float
    capacity: float
    short: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"at_s": self.at_s, "until_s": self.until_s, "windows": self.windows, "demand_gpus": self.demand,
                "capacity_gpus": self.capacity, "short_gpus": self.short}


def conflicts(plan: Plan, segs: list[Segment], capacity_gpus: float) -> list[Conflict]:
    """The over-committed segments, consecutive ones with the same shortfall merged."""
    out: list[Conflict] = []
    for s in segs:
        short = s.short
        if not short:
            continue
        named = {plan.windows[i].label: round(v, 6) for i, v in short.items()}
        labels = [plan.windows[i].label for i in sorted(s.wanted)]
        if out and out[-1].until_s == s.start_s and out[-1].short == named and out[-1].windows == labels:
            out[-1].until_s = s.end_s
            continue
        out.append(Conflict(s.start_s, s.end_s, labels, round(sum(s.wanted.values()), 6), capacity_gpus, named))
    return out
