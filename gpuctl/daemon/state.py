"""The node's durable state: slices, their owners, leases, and the answers of recent requests.

Three parts, one job each:

- :class:`NodeState`: the data (generation, slices, leases, recorded request answers), plain and
  copyable, with its canonical JSON body.
- :class:`StateStore`: the state file ``<dir>/state.json``. Written atomically and durably (temp
  file in the same directory, write, flush, fsync, rename over, fsync of the directory), so a
  daemon killed at any instant finds either the old or the new state. Read strictly: a file that
  is truncated, not JSON, of another format or whose sha256 checksum does not match its body
  raises :class:`StateCorruptError` naming the file and the fault. It is never silently reset.
- :class:`NodeStateManager`: the operations of the control API (assign, split) and the lease hooks
  (add_lease, remove_lease), under one lock. Each works on a copy of the state and, only when the
  whole request is valid, bumps the generation, saves the copy to disk and then swaps it in: a
  request is all-or-nothing and a refused one changes nothing, in memory or on disk.

File format (version 1)::

    {"format": 1, "checksum": "sha256:<hex of the canonical body>", "body": {
        "generation": int, "slices": [Slice.to_json()], "leases": [Lease.to_json()],
        "requests": [{"request_id": str, "op": "assign"|"split", "answer": {...}}]}}

The canonical body is ``json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
encoded as UTF-8.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpuctl.daemon.durable import write_atomically
from gpuctl.daemon.errors import (  # noqa: F401 - the state manager's refusals, re-exported
    DaemonError,
    GpuPresent,
    StateError,
    StaleGeneration,
    WrongOwner,
    SliceLeased,
    MixedOwners,
    GpuMissing,
    RequestIdReused,
    LeaseExists,
    UnknownSlice,
    UnknownGpu,
    UnknownLease,
    InvalidRequest,
    StateWriteError,
    MigReadOnly,
    SliceNotLeasable,
    DeadlinePassed,
)
from gpuctl.model import LEASED_MODES  # noqa: F401 - re-exported (api, tests)
from gpuctl.model import ALLOWED_PARTS, UNASSIGNED, GpuIdentity, Lease, Slice, slice_id

STATE_FILE_NAME = "state.json"
LOCK_FILE_NAME = "state.lock"
#: The state file format this code reads and writes.
STATE_FORMAT = 1
#: How many request answers are kept for replay (the most recent ones).
MAX_RECORDED_REQUESTS = 1000
#: The ways a reassignment may treat a leased slice (see docs/ARCHITECTURE.md).


# --------------------------------------------------------------------------------------------
# Errors


class StateCorruptError(Exception):
    """The state file cannot be trusted. ``path``: the file; ``problem``: what is wrong, in words.

    The daemon refuses to start on it (it never resets state silently); ``gpuctld --reset-state``
    moves the file aside and starts fresh.
    """

    def __init__(self, path: Path, problem: str):
        super().__init__(f"state file {path} is unusable: {problem}")
        self.path = path
        self.problem = problem


class StateLockedError(Exception):
    """Another process (another gpuctld) holds the state directory's lock file."""


# --------------------------------------------------------------------------------------------
# Data


@dataclass
class NodeState:
    """The node's durable state.

    generation: bumped by every change; every change request quotes the generation it was based
    on. slices: slice id -> Slice. leases: lease id -> Lease. requests: request id -> ``{"op":
    "assign"|"split", "answer": dict}``, oldest first, at most :data:`MAX_RECORDED_REQUESTS`.
    """

    generation: int = 0
    slices: dict[str, Slice] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    requests: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)

    def copy(self) -> "NodeState":
        """A deep copy (operations change a copy and swap it in once it is saved)."""
        return copy.deepcopy(self)

    def slices_of(self, gpu_uuid: str) -> list[Slice]:
        """The slices of one GPU, ordered by slice number."""
        found = [s for s in self.slices.values() if s.gpu_uuid == gpu_uuid]
        return sorted(found, key=lambda s: s.id.rsplit("/", 1)[-1].zfill(4))

    def body(self) -> dict[str, Any]:
        """The JSON body written to the state file (see the module docstring)."""
        return {
            "generation": self.generation,
            "slices": [_slice_record(s) for s in self.slices.values()],
            "leases": [lease.to_json() for lease in self.leases.values()],
            "requests": [{"request_id": rid, **entry} for rid, entry in self.requests.items()],
        }

    @classmethod
    def from_body(cls, body: Any, path: Path) -> "NodeState":
        """Read :meth:`body` back. Raises StateCorruptError naming `path` and the bad field."""
        if not isinstance(body, dict):
            raise StateCorruptError(path, f"'body' must be an object, found {type(body).__name__}")
        gen = body.get("generation")
        if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
            raise StateCorruptError(path, f"body.generation must be an integer >= 0, found {gen!r}")
        state = cls(generation=gen)
        for i, raw in enumerate(_list(body, "slices", path)):
            where = f"body.slices[{i}]"
            _require(raw, where, path, id=str, gpu_uuid=str, fraction=(int, float),
                     memory_quota_bytes=(int, type(None)), compute_share=(int, float), department=str)
            s = Slice.from_json(raw)
            if s.id in state.slices:
                raise StateCorruptError(path, f"{where}: slice id {s.id!r} appears twice")
            state.slices[s.id] = s
        for i, raw in enumerate(_list(body, "leases", path)):
            where = f"body.leases[{i}]"
            _require(raw, where, path, id=str, department=str, slice_ids=list, owner=str,
                     ttl_s=(int, float), created_s=(int, float), heartbeat_s=(int, float),
                     expires_s=(int, float))
            lease = Lease.from_json(raw)
            state.leases[lease.id] = lease
        for i, raw in enumerate(_list(body, "requests", path)):
            where = f"body.requests[{i}]"
            _require(raw, where, path, request_id=str, op=str, answer=dict)
            state.requests[raw["request_id"]] = {"op": raw["op"], "answer": raw["answer"]}
        for s in state.slices.values():
            if s.lease_id is not None and s.lease_id not in state.leases:
                raise StateCorruptError(
                    path, f"slice {s.id} is held by lease {s.lease_id!r}, which is not in the file"
                )
        return state


def _slice_record(s: Slice) -> dict[str, Any]:
    d = s.to_json()
    d.pop("leased", None)  # derived from lease_id
    d.pop("usage", None)  # live figures of the lease's worker, not state
    d.pop("not_leasable_reason", None)  # derived from the quota
    return d


def _list(body: dict, key: str, path: Path) -> list:
    value = body.get(key)
    if not isinstance(value, list):
        raise StateCorruptError(path, f"body.{key} must be a list, found {type(value).__name__}")
    return value


def _require(raw: Any, where: str, path: Path, **types: Any) -> None:
    if not isinstance(raw, dict):
        raise StateCorruptError(path, f"{where} must be an object, found {type(raw).__name__}")
    for key, typ in types.items():
        value = raw.get(key)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise StateCorruptError(path, f"{where}.{key} is missing or of the wrong type ({value!r})")


def canonical_bytes(body: dict[str, Any]) -> bytes:
    """The canonical encoding of a state body, whose sha256 is the file's checksum."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum(body: dict[str, Any]) -> str:
    """``"sha256:<hex>"`` of :func:`canonical_bytes`."""
    return "sha256:" + hashlib.sha256(canonical_bytes(body)).hexdigest()


# --------------------------------------------------------------------------------------------
# The file


class StateStore:
    """The state file ``<directory>/state.json`` (see the module docstring for the format)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.path = self.directory / STATE_FILE_NAME
        self._lock_file: Any = None

    def load(self) -> NodeState:
        """Read the state file; a fresh NodeState (generation 0, nothing in it) when there is none.

        Raises StateCorruptError (naming the file) when it cannot be read, is empty or truncated,
        is not JSON, is of another format, or its checksum does not match its body. Temp files
        left by a write that was interrupted are never read.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return NodeState()
        except OSError as e:
            raise StateCorruptError(self.path, f"cannot be read: {e.strerror or e}") from e
        if not raw.strip():
            raise StateCorruptError(self.path, f"it is empty ({len(raw)} bytes)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise StateCorruptError(self.path, f"not UTF-8 at byte {e.start}") from e
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise StateCorruptError(
                self.path, f"not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}"
            ) from e
        if not isinstance(data, dict):
            raise StateCorruptError(self.path, f"top level must be an object, found {type(data).__name__}")
        fmt = data.get("format")
        if fmt != STATE_FORMAT:
            raise StateCorruptError(
                self.path, f"format is {fmt!r}; this gpuctld reads format {STATE_FORMAT}"
            )
        body = data.get("body")
        if not isinstance(body, dict):
            raise StateCorruptError(self.path, "'body' is missing or not an object")
        want = data.get("checksum")
        got = checksum(body)
        if want != got:
            raise StateCorruptError(
                self.path, f"checksum mismatch: the file says {want!r}, its body hashes to {got!r}"
            )
        return NodeState.from_body(body, self.path)

    def save(self, state: NodeState) -> None:
        """Write `state` atomically and durably (temp file, fsync, rename, fsync of the directory).

        Raises OSError when the disk refuses; the previous file is then untouched.
        """
        body = state.body()
        data = {"format": STATE_FORMAT, "checksum": checksum(body), "body": body}
        payload = (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()
        write_atomically(self.path, payload)

    def move_aside(self) -> Path:
        """Rename the state file to ``state.json.corrupt-<YYYYmmddTHHMMSS>``; returns the new path."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        target = self.path.with_name(f"{STATE_FILE_NAME}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{STATE_FILE_NAME}.corrupt-{stamp}-{n}")
            n += 1
        os.replace(self.path, target)
        return target

    def lock(self) -> None:
        """Take the state directory's lock (``state.lock``, flock) for this process.

        Raises StateLockedError naming the directory and the holder's pid when another process
        holds it. Released by :meth:`unlock` or when the process ends.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        f = open(self.directory / LOCK_FILE_NAME, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise StateLockedError(
                f"state directory {self.directory} is in use by another gpuctld (pid {holder})"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock_file = f

    def unlock(self) -> None:
        """Release the lock taken by :meth:`lock` (idempotent)."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


# --------------------------------------------------------------------------------------------
# Operations


class NodeStateManager:
    """The node's state in memory, its operations, and the file behind it; thread-safe.

    Every operation that changes something bumps the generation and saves before it returns;
    when saving fails it raises StateWriteError and the state in memory stays as it was.
    ``missing_gpus``: UUIDs of GPUs that own slices in the state but that the backend did not
    report at the last :meth:`reconcile` (their slices and owners are kept).
    """

    def __init__(self, store: StateStore, state: NodeState | None = None):
        self.store = store
        self._state = state if state is not None else store.load()
        self._lock = threading.RLock()
        self.gpus: dict[str, GpuIdentity] = {}
        self.missing_gpus: set[str] = set()
        self.retired_slices: list[str] = []
        #: Called with the new NodeState after every committed change (must not raise; usage accounting).
        self.listeners: list[Callable[[NodeState], None]] = []
        #: Called as ``on_commit(old, new)`` after each change is on disk, before it is swapped in
        #: and before the operation returns (the audit log, gpuctl.daemon.audit, hooks in here).
        self.on_commit: Any = None

    # -- reading

    @property
    def generation(self) -> int:
        """The current generation."""
        with self._lock:
            return self._state.generation

    def snapshot(self) -> NodeState:
        """A consistent copy of the whole state."""
        with self._lock:
            return self._state.copy()

    def recorded(self, request_id: str) -> dict[str, Any] | None:
        """The answer recorded for `request_id` (with ``"replayed": true``), or None."""
        with self._lock:
            entry = self._state.requests.get(request_id)
            return {**copy.deepcopy(entry["answer"]), "replayed": True} if entry else None

    # -- changing

    def _commit(self, new: NodeState) -> None:
        new.generation = self._state.generation + 1
        try:
            self.store.save(new)
        except OSError as e:
            raise StateWriteError(
                f"could not write the state file {self.store.path}: {e.strerror or e}; nothing was changed"
            ) from e
        if self.on_commit is not None:
            self.on_commit(self._state, new)
        self._state = new
        for listener in self.listeners:
            listener(new)

    def _replay(self, request_id: str, op: str) -> dict[str, Any] | None:
        entry = self._state.requests.get(request_id)
        if entry is None:
            return None
        if entry["op"] != op:
            raise RequestIdReused(
                f"request id {request_id!r} was already used by an earlier {entry['op']} request; "
                f"use a new request id for this {op}",
                field="request_id",
            )
        return {**copy.deepcopy(entry["answer"]), "replayed": True}

    @staticmethod
    def _check_same_moves(request_id: str, recorded: dict[str, Any], moves: list[dict[str, str]]) -> None:
        """A replayed assign must ask for the moves it recorded (answers recorded before the
        "moves" field existed are not checked). Raises RequestIdReused naming the original."""
        before = recorded.get("moves")
        if before is None:
            return
        key = lambda ms: sorted((m["slice_id"], m["from"], m["to"]) for m in ms)  # noqa: E731
        if key(before) != key(moves):
            first = before[0] if before else {"from": "?", "to": "?"}
            raise RequestIdReused(
                f"request id {request_id!r} was already used for other moves ({len(before)} slice(s) "
                f"{first['from']} -> {first['to']}); use a new request id",
                field="request_id",
            )

    def _check_generation(self, generation: int) -> None:
        if generation != self._state.generation:
            raise StaleGeneration(generation, self._state.generation)

    @staticmethod
    def _record(state: NodeState, request_id: str, op: str, answer: dict[str, Any]) -> None:
        state.requests[request_id] = {"op": op, "answer": copy.deepcopy(answer)}
        while len(state.requests) > MAX_RECORDED_REQUESTS:
            state.requests.popitem(last=False)

    def reconcile(self, gpus: list[GpuIdentity]) -> list[str]:
        """Match the state with the backend's GPUs at start-up.

        A GPU with no slice yet gets one whole slice (fraction 1) owned by UNASSIGNED, with the
        GPU's memory total as quota (None when the backend does not know it: never a made-up 0;
        filled in at a later start-up that knows it). A GPU with MIG on is not a slice: its free
        slices are removed (``retired_slices``); each of its MIG devices gets one read-only slice
        (``mig=True``, fraction and compute share = the device's share of the parent's SMs, else
        1 / the parent's MIG device count; quota = the device's memory). The slices of GPUs the
        backend no longer reports are kept, with their owners and leases, and their GPUs listed in
        ``missing_gpus``. Returns the ids of the slices added (saved, with the generation bumped,
        when anything changed).
        """
        with self._lock:
            self.gpus = {g.uuid: g for g in gpus}
            new = self._state.copy()
            added: list[str] = []
            retired: list[str] = []
            filled = False
            mig_count: dict[str, int] = {}
            for g in gpus:
                if g.parent_uuid is not None:
                    mig_count[g.parent_uuid] = mig_count.get(g.parent_uuid, 0) + 1
            for g in gpus:
                existing = new.slices_of(g.uuid)
                if g.mig_enabled and not g.is_mig_device:
                    for s in existing:
                        if s.lease_id is None:
                            del new.slices[s.id]
                            retired.append(s.id)
                    continue
                if existing:
                    filled = _fill_unknown_quotas(existing, g) or filled
                    continue
                sid = slice_id(g.uuid, 0)
                if g.is_mig_device:
                    share = g.mig_compute_share or 1.0 / mig_count[g.parent_uuid or ""]
                    new.slices[sid] = Slice(id=sid, gpu_uuid=g.uuid, fraction=share,
                                            memory_quota_bytes=g.memory_total_bytes, compute_share=share,
                                            department=UNASSIGNED, mig=True)
                else:
                    new.slices[sid] = Slice(id=sid, gpu_uuid=g.uuid, fraction=1.0,
                                            memory_quota_bytes=g.memory_total_bytes, compute_share=1.0,
                                            department=UNASSIGNED)
                added.append(sid)
            if added or retired or filled:
                self._commit(new)
            self.retired_slices = retired
            self.missing_gpus = {s.gpu_uuid for s in self._state.slices.values()} - set(self.gpus)
            return added

    def assign(
        self, request_id: str, generation: int, moves: list[dict[str, str]], leased_mode: str = "refuse",
        deadline_unix_s: float | None = None,
    ) -> dict[str, Any]:
        """Move slices between departments, all or nothing.

        moves: ``[{"slice_id", "from", "to"}]``; leased_mode: "refuse" | "drain" | "revoke" (what
        to do with a leased slice: refuse the request; record ``pending`` and move it when its
        lease ends; end the lease, releasing all its slices, then move). Returns ``{"generation",
        "moved": [slice_id], "pending": [slice_id], "replayed": False}``; a request id seen
        before returns its recorded answer with ``"replayed": True`` and changes nothing.
        deadline_unix_s: the client's deadline (Unix time, s, this node's clock); a request that
        reaches its commit later is refused, so a node frozen or delayed past the point where the
        client gave up never applies it afterwards.

        Raises StaleGeneration, UnknownSlice, WrongOwner (naming the slice and its actual owner),
        SliceLeased (naming the slice and lease), InvalidRequest (empty or duplicate moves, bad
        mode), RequestIdReused, DeadlinePassed, StateWriteError.
        """
        with self._lock:
            replay = self._replay(request_id, "assign")
            if replay is not None:
                self._check_same_moves(request_id, replay, moves)
                return replay
            self._check_generation(generation)
            if leased_mode not in LEASED_MODES:
                raise InvalidRequest(
                    f"leased must be one of {', '.join(LEASED_MODES)}, got {leased_mode!r}", field="leased"
                )
            if not moves:
                raise InvalidRequest("moves is empty: name at least one slice to move", field="moves")
            new = self._state.copy()
            seen: set[str] = set()
            moved, pending = [], []
            for i, move in enumerate(moves):
                sid, src, dst = move["slice_id"], move["from"], move["to"]
                s = new.slices.get(sid)
                if s is None:
                    raise UnknownSlice(f"moves[{i}]: no slice {sid!r} on this node", field=f"moves[{i}].slice_id")
                if sid in seen:
                    raise InvalidRequest(f"moves[{i}]: slice {sid} is moved twice", field=f"moves[{i}].slice_id")
                seen.add(sid)
                if s.department != src:
                    raise WrongOwner(
                        f"moves[{i}]: slice {sid} is owned by {s.department!r}, not {src!r}",
                        field=f"moves[{i}].from",
                    )
                if s.lease_id is not None:
                    if leased_mode == "refuse":
                        raise SliceLeased(
                            f"moves[{i}]: slice {sid} is leased (lease {s.lease_id}); "
                            f"use leased=drain to move it when the lease ends, or leased=revoke to end the lease",
                            field=f"moves[{i}].slice_id",
                        )
                    if leased_mode == "drain":
                        s.pending = {"to": dst, "request_id": request_id}
                        pending.append(sid)
                        continue
                    _end_lease(new, s.lease_id)
                s.department = dst
                s.pending = None
                moved.append(sid)
            answer = {"generation": self._state.generation + 1, "moved": moved, "pending": pending,
                      "replayed": False,
                      "moves": [{"slice_id": m["slice_id"], "from": m["from"], "to": m["to"]} for m in moves]}
            _check_deadline(request_id, deadline_unix_s)
            self._record(new, request_id, "assign", answer)
            self._commit(new)
            return answer

    def split(self, request_id: str, generation: int, gpu_uuid: str, parts: int, *,
              fractions: list[float] | None = None, department: str | None = None) -> dict[str, Any]:
        """Split one GPU into `parts` equal slices (1, 2, 4 or 8; 1 merges it), or into slices of
        the given `fractions` (1, 1/2, 1/4, 1/8 adding up to 1, in order), replacing its current
        slices.

        Allowed only while none of its slices is leased and all have one owner, who owns the new
        slices; with `department`, the current slices may have any owners and `department` owns the
        new ones (a merge to one department). Memory quota = GPU memory total (bytes, from the
        backend) x fraction; compute share = fraction. Returns ``{"generation", "slices": [Slice.to_json()], "replayed": False}``;
        a request id seen before returns its recorded answer. Raises StaleGeneration, UnknownGpu,
        GpuMissing (the backend no longer reports it), MigReadOnly (a MIG device, or a GPU with MIG on),
        InvalidRequest (parts), SliceLeased,
        MixedOwners, RequestIdReused, StateWriteError.
        """
        with self._lock:
            replay = self._replay(request_id, "split")
            if replay is not None:
                return replay
            self._check_generation(generation)
            if fractions is None:
                if parts not in ALLOWED_PARTS:
                    raise InvalidRequest(
                        f"parts must be one of {', '.join(map(str, ALLOWED_PARTS))}, got {parts!r}", field="parts"
                    )
                fractions = [1.0 / parts] * parts
            elif abs(sum(fractions) - 1.0) > 1e-9 or any(f not in (1.0, 0.5, 0.25, 0.125) for f in fractions):
                raise InvalidRequest(f"fractions must be 1, 1/2, 1/4 or 1/8 adding up to 1, got {fractions}",
                                     field="fractions")
            identity = self.gpus.get(gpu_uuid)
            new = self._state.copy()
            old = new.slices_of(gpu_uuid)
            if (identity is not None and (identity.is_mig_device or identity.mig_enabled)) or any(s.mig for s in old):
                what = "is a MIG device" if (identity and identity.is_mig_device) or any(s.mig for s in old) \
                    else "has MIG on (it is not a slice; its MIG devices are)"
                raise MigReadOnly(
                    f"GPU {gpu_uuid} {what}: MIG slices are read-only in gpuctl and are never split or merged; "
                    f"change the MIG layout with nvidia-smi mig on the node",
                    field="gpu_uuid",
                )
            if not old:
                raise UnknownGpu(f"no GPU {gpu_uuid!r} on this node", field="gpu_uuid")
            if gpu_uuid in self.missing_gpus or (self.gpus and gpu_uuid not in self.gpus):
                raise GpuMissing(
                    f"GPU {gpu_uuid} is not reported by the backend; its slices are kept but it cannot be split",
                    field="gpu_uuid",
                )
            leased = [s for s in old if s.lease_id is not None]
            if leased:
                names = ", ".join(f"{s.id} (lease {s.lease_id})" for s in leased)
                raise SliceLeased(f"GPU {gpu_uuid} cannot be split while slices are leased: {names}",
                                  field="gpu_uuid")
            owners = sorted({s.department for s in old})
            if department is not None:
                owners = [department]
            if len(owners) > 1:
                raise MixedOwners(
                    f"GPU {gpu_uuid} cannot be split: its slices have different owners ({', '.join(owners)}); "
                    f"assign them to one department first",
                    field="gpu_uuid",
                )
            total = identity.memory_total_bytes if identity and identity.memory_total_bytes else None
            if total is None and all(s.memory_quota_bytes is not None for s in old):
                total = sum(s.memory_quota_bytes or 0 for s in old)
            for s in old:
                del new.slices[s.id]
            made = []
            for k, fraction in enumerate(fractions):
                s = Slice(id=slice_id(gpu_uuid, k), gpu_uuid=gpu_uuid, fraction=fraction,
                          memory_quota_bytes=None if total is None else int(total * fraction),
                          compute_share=fraction, department=owners[0])
                new.slices[s.id] = s
                made.append(s)
            answer = {"generation": self._state.generation + 1, "slices": [s.to_json() for s in made],
                      "replayed": False}
            self._record(new, request_id, "split", answer)
            self._commit(new)
            return answer

    def forget_gpu(self, request_id: str, generation: int, gpu_uuid: str) -> dict[str, Any]:
        """Retire a GPU the backend no longer reports (replaced, removed): its slices leave the
        state, so it no longer counts anywhere. Returns ``{"generation", "gpu_uuid", "forgotten":
        [slice ids], "departments": {dept: GPU-equivalents it held}, "replayed": False}``; a request
        id seen before returns its recorded answer. Raises StaleGeneration, UnknownGpu (no slice of
        it in the state), GpuPresent (the backend reports it: it is not missing), SliceLeased (a
        lease holds one of its slices: release or let it expire first), RequestIdReused,
        StateWriteError."""
        with self._lock:
            replay = self._replay(request_id, "forget_gpu")
            if replay is not None:
                return replay
            self._check_generation(generation)
            old = self._state.slices_of(gpu_uuid)
            if not old:
                raise UnknownGpu(f"no GPU {gpu_uuid!r} in this node's state", field="gpu_uuid")
            if gpu_uuid in self.gpus:
                raise GpuPresent(f"GPU {gpu_uuid} is reported by the backend (index {self.gpus[gpu_uuid].index}): "
                                 f"only a missing GPU is forgotten", field="gpu_uuid")
            leased = [s for s in old if s.lease_id is not None]
            if leased:
                names = ", ".join(f"{s.id} (lease {s.lease_id})" for s in leased)
                raise SliceLeased(f"GPU {gpu_uuid} cannot be forgotten while slices are leased: {names}; release "
                                  f"the lease(s) first", field="gpu_uuid")
            new = self._state.copy()
            held: dict[str, float] = {}
            for s in old:
                del new.slices[s.id]
                held[s.department] = held.get(s.department, 0.0) + s.fraction
            answer = {"generation": self._state.generation + 1, "gpu_uuid": gpu_uuid,
                      "forgotten": [s.id for s in old], "departments": held, "replayed": False}
            self._record(new, request_id, "forget_gpu", answer)
            self._commit(new)
            self.missing_gpus.discard(gpu_uuid)
            return answer

    def add_lease(self, lease: Lease) -> int:
        """Record a new lease and mark its slices leased; returns the new generation.

        The slices must exist, be idle and belong to ``lease.department``. Raises LeaseExists,
        InvalidRequest (no slices), UnknownSlice, WrongOwner, SliceLeased, SliceNotLeasable (quota
        unknown), StateWriteError.
        """
        with self._lock:
            if lease.id in self._state.leases:
                raise LeaseExists(f"lease {lease.id!r} already exists", field="id")
            if not lease.slice_ids:
                raise InvalidRequest("a lease needs at least one slice", field="slice_ids")
            new = self._state.copy()
            for i, sid in enumerate(lease.slice_ids):
                s = new.slices.get(sid)
                where = f"slice_ids[{i}]"
                if s is None:
                    raise UnknownSlice(f"{where}: no slice {sid!r} on this node", field=where)
                if s.department != lease.department:
                    raise WrongOwner(
                        f"{where}: slice {sid} is owned by {s.department!r}, not {lease.department!r}", field=where
                    )
                if s.lease_id is not None:
                    raise SliceLeased(f"{where}: slice {sid} is already leased (lease {s.lease_id})", field=where)
                if s.not_leasable_reason:
                    raise SliceNotLeasable(f"{where}: {s.not_leasable_reason}", field=where)
                s.lease_id = lease.id
            new.leases[lease.id] = copy.deepcopy(lease)
            self._commit(new)
            return self._state.generation

    def remove_lease(self, lease_id: str) -> list[str]:
        """End a lease: its slices become idle and drained moves waiting on it are applied.

        Returns the ids of the slices whose pending move was applied. Raises UnknownLease,
        StateWriteError.
        """
        with self._lock:
            if lease_id not in self._state.leases:
                raise UnknownLease(f"no lease {lease_id!r} on this node", field="lease_id")
            new = self._state.copy()
            applied = _end_lease(new, lease_id)
            self._commit(new)
            return applied


def _fill_unknown_quotas(slices: list[Slice], gpu: GpuIdentity) -> bool:
    """Give `slices` (of `gpu`) whose quota is unknown their share of the GPU's memory total, now
    that the backend knows it (in place). Returns True when one changed."""
    total = gpu.memory_total_bytes
    changed = False
    for s in slices:
        if s.memory_quota_bytes is None and total:
            s.memory_quota_bytes = total if s.mig else total // max(1, round(1 / s.fraction))
            changed = True
    return changed


def _check_deadline(request_id: str, deadline_unix_s: float | None) -> None:
    """Raise DeadlinePassed when the client's deadline is behind this node's clock (checked last,
    right before the durable write, so nothing after it can take long)."""
    if deadline_unix_s is None:
        return
    late_s = time.time() - deadline_unix_s
    if late_s > 0:
        raise DeadlinePassed(
            f"request {request_id!r} reached this node {late_s:.1f} s after its deadline: its client has given "
            f"up on it (it reports the outcome as unknown), so it is not applied and nothing changed; run the "
            f"request again (if this keeps happening, this node's clock may be ahead of the admin machine's)",
            field="deadline_unix_s")


def _end_lease(state: NodeState, lease_id: str) -> list[str]:
    """Remove a lease from `state` (in place): free its slices and apply their drained moves.

    A drained move applied here is added to its request's recorded answer under ``"drained"``.
    Returns the ids of the slices moved.
    """
    state.leases.pop(lease_id, None)
    applied = []
    for s in state.slices.values():
        if s.lease_id != lease_id:
            continue
        s.lease_id = None
        if s.pending:
            s.department = s.pending["to"]
            entry = state.requests.get(s.pending.get("request_id", ""))
            if entry is not None:
                entry["answer"].setdefault("drained", []).append(s.id)
            s.pending = None
            applied.append(s.id)
    return applied
