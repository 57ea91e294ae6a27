"""Scheduled moves that gpuctld executes itself, at their time, with no gpuctl process running.

- :class:`ScheduleEntry`: one node's part of a scheduled reassignment: at ``at_s`` (Unix s, UTC)
  move ``slice_ids`` from ``from`` to ``to``; ``leased``: "refuse" (a leased slice fails the entry,
  with the reason), "drain" (leased slices move when their lease ends; the entry is "waiting"
  until then) or "revoke" (leased slices wait ``grace_s`` seconds, then their leases are ended).
- :class:`ScheduleStore`: the file ``<state dir>/schedule.json``, same rules as the state file
  (gpuctl.daemon.state): written atomically and durably before the API answers, read strictly
  (format, sha256 checksum), never reset silently.
- :class:`ScheduleManager`: add (idempotent by request id), cancel, list, and the executor thread.
  It reads an injectable clock (gpuctl.daemon.clock) so tests move time instead of sleeping.

Execution uses the state's own assign with the entry's request id, so an entry executed, then
interrupted by a crash before the schedule file said "done", replays the recorded answer on the
next start and never moves twice. An entry whose time passed while gpuctld was down runs when it
comes back, marked ``late`` (``late_s``: how late, s).

Status: planned -> done | late (done, over :data:`LATE_AFTER_S` after its time) | failed (``reason``)
| waiting (drain or revoke grace: some slices move later) -> done | late; planned/waiting ->
cancelled.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpuctl.daemon.durable import write_atomically
from gpuctl.daemon.state import (LEASED_MODES, InvalidRequest, NodeStateManager, RequestIdReused,
                                 StaleGeneration, StateCorruptError, StateError, StateWriteError, UnknownSlice,
                                 checksum)

log = logging.getLogger("gpuctld.schedule")

SCHEDULE_FILE_NAME = "schedule.json"
SCHEDULE_FORMAT = 1
#: An entry executed more than this many seconds after its time is marked late.
LATE_AFTER_S = 60.0
#: Most entries kept; past it the oldest finished ones (done, late, failed, cancelled) are dropped.
MAX_ENTRIES = 5000
#: How often the executor looks for due entries, seconds.
TICK_S = 0.2
STATUSES = ("planned", "waiting", "done", "late", "failed", "cancelled")
FINISHED = ("done", "late", "failed", "cancelled")


class UnknownEntry(StateError):
    """No schedule entry with that id on this node."""

    status = 404
    code = "unknown_entry"


class EntryFinished(StateError):
    """A cancel of an entry that already ran (or was cancelled)."""

    code = "entry_finished"


def entry_id(request_id: str) -> str:
    """The entry id of a request id: ``"s-"`` + 10 hex digits of its sha256 (the same on every
    node, so ``gpuctl schedule cancel ID`` reaches every node's part)."""
    return "s-" + hashlib.sha256(request_id.encode()).hexdigest()[:10]


@dataclass
class ScheduleEntry:
    """One scheduled move on this node (see the module docstring). Times are Unix seconds (UTC)."""

    id: str
    request_id: str
    at_s: float
    src: str
    dst: str
    slice_ids: list[str]
    leased: str = "refuse"
    grace_s: float = 0.0
    created_s: float = 0.0
    who: dict[str, Any] | None = None
    plan: str | None = None
    label: str | None = None
    status: str = "planned"
    reason: str | None = None
    executed_s: float | None = None
    late_s: float | None = None
    moved: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    revoke_at_s: float | None = None
    finished_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["from"], d["to"] = d.pop("src"), d.pop("dst")
        return d

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "ScheduleEntry":
        d = dict(raw)
        d["src"], d["dst"] = d.pop("from"), d.pop("to")
        return cls(**d)

    def same_request(self, other: "ScheduleEntry") -> bool:
        """True when `other` asks for the same thing (a replay of the same request id)."""
        key = lambda e: (round(e.at_s, 3), e.src, e.dst, sorted(e.slice_ids), e.leased,  # noqa: E731
                         round(e.grace_s, 3), e.plan)
        return key(self) == key(other)


_FIELDS = {"id": str, "request_id": str, "at_s": (int, float), "from": str, "to": str, "slice_ids": list,
           "leased": str, "grace_s": (int, float), "created_s": (int, float), "status": str}


class ScheduleStore:
    """The file ``<directory>/schedule.json``: ``{"format": 1, "checksum": "sha256:<hex>", "body":
    {"entries": [ScheduleEntry.to_json()]}}`` (checksum of the canonical body, as state.json)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.path = self.directory / SCHEDULE_FILE_NAME

    def load(self) -> list[ScheduleEntry]:
        """The entries ([] when there is no file). Raises StateCorruptError naming the file and fault."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StateCorruptError(self.path, f"cannot be read: {e.strerror or e}") from e
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise StateCorruptError(self.path, f"not valid JSON (truncated?): {e}") from e
        if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
            fmt = data.get("format") if isinstance(data, dict) else None
            raise StateCorruptError(self.path, f"format is {fmt!r}; this gpuctld reads format {SCHEDULE_FORMAT}")
        body = data.get("body")
        if not isinstance(body, dict):
            raise StateCorruptError(self.path, "'body' is missing or not an object")
        if data.get("checksum") != checksum(body):
            raise StateCorruptError(self.path, f"checksum mismatch: the file says {data.get('checksum')!r}, "
                                               f"its body hashes to {checksum(body)!r}")
        entries = body.get("entries")
        if not isinstance(entries, list):
            raise StateCorruptError(self.path, "body.entries must be a list")
        out = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise StateCorruptError(self.path, f"body.entries[{i}] must be an object")
            for key, typ in _FIELDS.items():
                if not isinstance(e.get(key), typ) or isinstance(e.get(key), bool):
                    raise StateCorruptError(self.path, f"body.entries[{i}].{key} is missing or of the wrong type")
            try:
                out.append(ScheduleEntry.from_json(e))
            except TypeError as exc:
                raise StateCorruptError(self.path, f"body.entries[{i}]: {exc}") from exc
        return out

    def save(self, entries: list[ScheduleEntry]) -> None:
        """Write atomically and durably (gpuctl.daemon.durable). Raises OSError."""
        body = {"entries": [e.to_json() for e in entries]}
        data = {"format": SCHEDULE_FORMAT, "checksum": checksum(body), "body": body}
        write_atomically(self.path, (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode())

    def move_aside(self) -> Path:
        """Rename an unusable file to ``schedule.json.corrupt-<n>``; returns the new path."""
        n = 1
        while (target := self.path.with_name(f"{SCHEDULE_FILE_NAME}.corrupt-{n}")).exists():
            n += 1
        self.path.replace(target)
        return target


class ScheduleManager:
    """The node's schedule (thread-safe): add, cancel, list, and the executor.

    state: the node's state manager (moves go through its assign). clock: Unix time (s), the
    daemon's injectable clock. audit: the node's AuditLog (executions are recorded) or None.
    on_revoke: called after an execution ended leases (the lease manager stops their workers).
    """

    def __init__(self, store: ScheduleStore, state: NodeStateManager, *, clock: Callable[[], float],
                 audit: Any = None, on_revoke: Callable[[], Any] | None = None, tick_s: float = TICK_S):
        self.store = store
        self.state = state
        self.clock = clock
        self.audit = audit
        self.on_revoke = on_revoke
        self.tick_s = tick_s
        self._entries: dict[str, ScheduleEntry] = {e.id: e for e in store.load()}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading

    def entries(self) -> list[ScheduleEntry]:
        """Copies of every entry, by time."""
        with self._lock:
            return sorted((copy.deepcopy(e) for e in self._entries.values()), key=lambda e: (e.at_s, e.id))

    # -- changing

    def _save(self, entries: dict[str, ScheduleEntry]) -> None:
        try:
            self.store.save(list(entries.values()))
        except OSError as e:
            raise StateWriteError(f"could not write the schedule file {self.store.path}: {e.strerror or e}; "
                                  f"nothing was changed") from e
        self._entries = entries

    def add(self, entry: ScheduleEntry) -> dict[str, Any]:
        """Install an entry (written to disk before this returns). Returns ``{"entry", "replayed"}``;
        the same request id again returns the recorded entry with ``replayed: true``.

        Raises InvalidRequest (bad time, mode, from == to, no slices), UnknownSlice (naming the
        slice), RequestIdReused (the request id names another entry), StateWriteError.
        """
        if not math.isfinite(entry.at_s) or entry.at_s <= 0:
            raise InvalidRequest(f"at_s must be a Unix time in seconds, got {entry.at_s!r}", field="at_s")
        if entry.leased not in LEASED_MODES:
            raise InvalidRequest(f"leased must be one of {', '.join(LEASED_MODES)}, got {entry.leased!r}",
                                 field="leased")
        if not math.isfinite(entry.grace_s) or entry.grace_s < 0:
            raise InvalidRequest(f"grace_s must be >= 0 seconds, got {entry.grace_s!r}", field="grace_s")
        if entry.src == entry.dst:
            raise InvalidRequest(f"from and to are both {entry.src!r}: nothing would move", field="to")
        if not entry.slice_ids:
            raise InvalidRequest("slice_ids is empty: name at least one slice", field="slice_ids")
        if len(set(entry.slice_ids)) != len(entry.slice_ids):
            raise InvalidRequest("slice_ids names a slice twice", field="slice_ids")
        slices = self.state.snapshot().slices
        for i, sid in enumerate(entry.slice_ids):
            if sid not in slices:
                raise UnknownSlice(f"slice_ids[{i}]: no slice {sid!r} on this node", field=f"slice_ids[{i}]")
        entry.id = entry_id(entry.request_id)
        with self._lock:
            old = self._entries.get(entry.id)
            if old is not None:
                if old.request_id != entry.request_id or not old.same_request(entry):
                    raise RequestIdReused(
                        f"request id {entry.request_id!r} was already used for schedule entry {old.id} "
                        f"({old.src} -> {old.dst} at {old.at_s:.0f}); use a new request id", field="request_id")
                return {"entry": copy.deepcopy(old).to_json(), "replayed": True}
            entry.status, entry.created_s = "planned", self.clock()
            new = dict(self._entries)
            new[entry.id] = entry
            self._prune(new)
            self._save(new)
        self._wake.set()
        return {"entry": copy.deepcopy(entry).to_json(), "replayed": False}

    def cancel(self, eid: str) -> dict[str, Any]:
        """Cancel a planned or waiting entry (a waiting drain keeps the moves already pending on
        slices). Returns ``{"entry"}``. Raises UnknownEntry, EntryFinished, StateWriteError."""
        with self._lock:
            old = self._entries.get(eid)
            if old is None:
                raise UnknownEntry(f"no schedule entry {eid!r} on this node", field="id")
            if old.status in FINISHED:
                raise EntryFinished(f"schedule entry {eid} is already {old.status}"
                                    f"{': ' + old.reason if old.reason else ''}; nothing to cancel", field="id")
            e = copy.deepcopy(old)
            e.status, e.finished_s = "cancelled", self.clock()
            new = dict(self._entries)
            new[eid] = e
            self._save(new)
            return {"entry": copy.deepcopy(e).to_json()}

    @staticmethod
    def _prune(entries: dict[str, ScheduleEntry]) -> None:
        if len(entries) <= MAX_ENTRIES:
            return
        finished = sorted((e for e in entries.values() if e.status in FINISHED),
                          key=lambda e: e.finished_s or e.at_s)
        for e in finished[: len(entries) - MAX_ENTRIES]:
            del entries[e.id]

    # -- executing

    def run_due(self) -> list[str]:
        """Execute every planned entry whose time has come and advance waiting ones. Returns the
        ids of entries whose status changed. Never raises for an entry's failure (it is recorded)."""
        changed = []
        now = self.clock()
        for listed in self.entries():
            # under the lock: a cancel that arrives meanwhile waits, then finds the entry finished
            with self._lock:
                e = copy.deepcopy(self._entries.get(listed.id))
                if e is None:
                    continue
                try:
                    if e.status == "planned" and e.at_s <= now:
                        self._execute(e, now)
                        changed.append(e.id)
                    elif e.status == "waiting" and self._advance(e, now):
                        changed.append(e.id)
                except StateWriteError as exc:  # the schedule file: retried next round
                    log.error("schedule entry %s: %s", e.id, exc.message)
        return changed

    def _assign(self, rid: str, moves: list[dict[str, str]], mode: str) -> dict[str, Any]:
        for _ in range(20):
            try:
                return self.state.assign(rid, self.state.generation, moves, mode)
            except StaleGeneration:
                continue
        raise StateError("the node's state kept changing; the entry is retried next round")

    def _audited(self, e: ScheduleEntry, action: str, fn: Callable[[], None]) -> None:
        who = {"internal": "schedule", "scheduled_by": e.who}
        if self.audit is None:
            fn()
            return
        op = self.audit.next_op()
        self.audit.append({"event": "request", "phase": "begin", "op": op, "request_id": e.request_id,
                           "who": who, "action": action, "entry": e.id, "at_s": e.at_s})
        with self.audit.context(who, e.request_id, action, op):
            fn()
        after = self._entries.get(e.id, e)
        self.audit.append({"event": "request", "phase": "end", "op": op, "request_id": e.request_id,
                           "who": who, "action": action, "entry": e.id, "status": after.status,
                           "outcome": "ok" if after.status in ("done", "late", "waiting") else "refused",
                           "reason": after.reason, "late_s": after.late_s,
                           "moved_slice_ids": after.moved, "pending_slice_ids": after.pending})

    def _execute(self, e: ScheduleEntry, now: float) -> None:
        def run() -> None:
            moves = [{"slice_id": sid, "from": e.src, "to": e.dst} for sid in e.slice_ids]
            mode = "drain" if e.leased == "revoke" and e.grace_s > 0 else e.leased
            late = now - e.at_s > LATE_AFTER_S
            done = copy.deepcopy(e)
            done.executed_s, done.late_s = now, round(now - e.at_s, 3) if late else None
            try:
                answer = self._assign(e.request_id, moves, mode)
            except StateError as exc:
                done.status, done.reason, done.finished_s = "failed", exc.message, now
            else:
                done.moved = list(answer.get("moved", []))
                done.pending = list(answer.get("pending", []))
                if done.pending:
                    done.status = "waiting"
                    if e.leased == "revoke":
                        done.revoke_at_s = e.at_s + e.grace_s if not late else now + e.grace_s
                else:
                    done.status, done.finished_s = ("late" if late else "done"), now
                if e.leased == "revoke" and self.on_revoke is not None:
                    self.on_revoke()
            with self._lock:
                new = dict(self._entries)
                new[e.id] = done
                self._save(new)
            log.info("schedule entry %s (%s -> %s, %d slice(s)): %s%s", e.id, e.src, e.dst, len(e.slice_ids),
                     done.status, f": {done.reason}" if done.reason else "")

        self._audited(e, "schedule execute", run)

    def _advance(self, e: ScheduleEntry, now: float) -> bool:
        slices = self.state.snapshot().slices
        still = [sid for sid in e.pending if sid in slices and slices[sid].department == e.src]
        if still and e.revoke_at_s is not None and now >= e.revoke_at_s:
            def revoke() -> None:
                moves = [{"slice_id": sid, "from": e.src, "to": e.dst} for sid in still]
                done = copy.deepcopy(e)
                try:
                    answer = self._assign(e.request_id + "#revoke", moves, "revoke")
                    done.moved += list(answer.get("moved", []))
                    done.pending = []
                    done.status, done.finished_s = ("late" if e.late_s else "done"), now
                except StateError as exc:
                    done.status, done.reason, done.finished_s = "failed", f"revoke after grace: {exc.message}", now
                if self.on_revoke is not None:
                    self.on_revoke()
                with self._lock:
                    new = dict(self._entries)
                    new[e.id] = done
                    self._save(new)

            self._audited(e, "schedule revoke after grace", revoke)
            return True
        if still:
            return False
        done = copy.deepcopy(e)
        done.moved += [sid for sid in e.pending if sid in slices and slices[sid].department == e.dst]
        done.pending = []
        done.status, done.finished_s = ("late" if e.late_s else "done"), now
        with self._lock:
            new = dict(self._entries)
            new[e.id] = done
            self._save(new)
        return True

    def start(self) -> None:
        """Start the executor thread (runs :meth:`run_due` every tick and right after an add)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpuctld-schedule", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_due()
            except Exception:  # noqa: BLE001 - the executor must keep running
                log.exception("schedule round failed")
            self._wake.wait(self.tick_s)
            self._wake.clear()

    def close(self) -> None:
        """Stop the executor thread (an execution in progress finishes first)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
