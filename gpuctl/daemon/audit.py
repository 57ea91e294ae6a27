"""The node's audit log: who changed what, when, with which request id, and the outcome.

File ``<state dir>/audit.log``: JSON lines (one record per line, UTF-8), appended with O_APPEND and
fsync'ed before the API answers; when it passes ``max_bytes`` it is rotated to ``audit.log.1``
(``.1`` -> ``.2`` ..., at most ``keep`` old files), so the log stays size-bounded.

Records (every one has ``time_s`` (Unix s, from the daemon's clock), ``node``, ``event``, ``op``):

- ``request`` (``phase: "begin"``): a change request arrived (any POST/DELETE of the control API),
  written BEFORE the request runs: method, path, request_id, who. If it cannot be written the
  request is refused (503 ``audit_unavailable``) and nothing changes.
- ``change``: what a state change did, written from the state manager's commit hook after the
  state file is on disk and before the operation returns: ``moved`` ([{slice_id, from, to}]),
  ``split`` ({gpu_uuid, slices}), ``leases_added`` / ``leases_ended`` ([{id, department, owner,
  slice_ids}]), ``generation``; with who / request_id / action of the request or internal job
  that made it.
- ``request`` (``phase: "end"``): the answer: status, ``outcome`` ("ok" | "refused" | "error"),
  error code and message.
- ``incomplete``: found at start-up: a ``begin`` with no ``end`` (the daemon was killed in
  between). It quotes the request id and, when the state recorded an answer for it, that answer:
  so a move is never without its audit record, or the audit says it is incomplete.

who: ``{"ssh_user", "peer_uid", "peer_pid", "ssh_client", "reported"}``: the account of the peer
process (the SSH login user, since ``gpuctld bridge`` runs as that user), its uid and pid
(SO_PEERCRED), the SSH client address from the bridge's environment (SSH_CONNECTION, when
readable), and the ``user@host`` gpuctl reports in the ``Gpuctl-User`` header. Internal jobs
(schedule, lease monitor) have ``{"internal": "<job>"}``.

A line that is not a JSON object (corrupt, or cut by a crash) is reported by
:func:`read_records` with its file and line number, never dropped silently; the writer starts a
new line after a cut one, and the daemon keeps running.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pwd
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from gpuctl.daemon.durable import fsync_directory

log = logging.getLogger("gpuctld.audit")

AUDIT_FILE_NAME = "audit.log"
#: Size (bytes) past which audit.log is rotated.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: Rotated files kept (audit.log.1 .. audit.log.N).
DEFAULT_KEEP = 5
#: Header in which gpuctl reports the admin's user@host.
REPORTED_USER_HEADER = "gpuctl-user"
#: Most records one GET /v1/audit returns (the newest ones).
MAX_RECORDS_PER_ANSWER = 20000
#: Most problem lines one read reports (a file of garbage would otherwise answer one per line);
#: the rest are counted (ReadResult.problems_omitted).
MAX_PROBLEMS_PER_ANSWER = 100
#: Most bytes read from the end of one audit file (4 rotations' worth): a file grown past it
#: (rotation failing, a file put there by hand) is read from there on, with a problem saying so.
MAX_READ_BYTES_PER_FILE = 4 * DEFAULT_MAX_BYTES
#: Block size (bytes) for counting the lines of a file's unread head.
_COUNT_BLOCK_BYTES = 1024 * 1024


class AuditWriteError(Exception):
    """The audit log could not be written (disk full, permissions); the message names the file."""


@dataclass
class AuditContext:
    """Who is changing the state on this thread, under which request id and action."""

    who: dict[str, Any]
    request_id: str | None = None
    action: str | None = None
    op: str | None = None


@dataclass
class Problem:
    """A line of an audit file that is not a record: file, 1-based line number, error, the text."""

    file: str
    line: int
    error: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "error": self.error, "text": self.text}


@dataclass
class ReadResult:
    """Records (oldest first) and the problems met while reading them. truncated: more records
    matched than were returned (read_newest's limit). files_read: the files opened, in the order
    read; lines_parsed: non-blank lines parsed (the cost of the read)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    truncated: bool = False
    files_read: list[str] = field(default_factory=list)
    lines_parsed: int = 0
    #: Problems found past MAX_PROBLEMS_PER_ANSWER, counted only.
    problems_omitted: int = 0

    def add_problem(self, problem: "Problem") -> None:
        """Keep `problem`, or count it once MAX_PROBLEMS_PER_ANSWER are kept."""
        if len(self.problems) < MAX_PROBLEMS_PER_ANSWER:
            self.problems.append(problem)
        else:
            self.problems_omitted += 1


def audit_files(directory: Path) -> list[Path]:
    """The audit files of a state directory, oldest first (audit.log.N ... audit.log.1, audit.log)."""
    directory = Path(directory)
    rotated = []
    for p in directory.glob(AUDIT_FILE_NAME + ".*"):
        suffix = p.name[len(AUDIT_FILE_NAME) + 1:]
        if suffix.isdigit():
            rotated.append((int(suffix), p))
    files = [p for _, p in sorted(rotated, reverse=True)]
    current = directory / AUDIT_FILE_NAME
    if current.exists():
        files.append(current)
    return files


def _parse_line(raw: bytes, file: str, number: int, cut: bool) -> dict[str, Any] | Problem:
    """One non-blank line as a record, or the Problem it is (`cut`: the file's last line, without
    its newline: "truncated")."""
    try:
        rec = json.loads(raw.decode("utf-8"))
        if not isinstance(rec, dict):
            raise ValueError(f"a JSON {type(rec).__name__}, not an object")
    except RecursionError:  # "[[[[..." nested deeper than the interpreter's stack
        return Problem(file, number, "nested too deep to be a record", raw[:200].decode("utf-8", "replace"))
    except (UnicodeDecodeError, ValueError) as e:
        why = "truncated (no newline at the end of the file)" if cut else str(e)
        return Problem(file, number, why, raw[:200].decode("utf-8", "replace"))
    return rec


def parse_lines(data: bytes, file: str, first_line: int = 1) -> ReadResult:
    """Parse the bytes of one audit file. Blank lines are skipped; every other line that is not a
    JSON object is a Problem (the last line without its newline: "truncated")."""
    out = ReadResult()
    lines = data.split(b"\n")
    ends_clean = data.endswith(b"\n") or not data
    for i, raw in enumerate(lines, start=first_line):
        if not raw.strip():
            continue
        out.lines_parsed += 1
        got = _parse_line(raw, file, i, i == first_line + len(lines) - 1 and not ends_clean)
        if isinstance(got, Problem):
            out.problems.append(got)
        else:
            out.records.append(got)
    return out


def _read_file(path: Path, seen: set[tuple[int, int]]) -> tuple[bytes, int, list[Problem]] | None:
    """The bytes of one audit file to parse, the line number of their first line and the problems
    of reading it; None when the file is gone or was already read under another name (rotation
    renamed it between listing and reading: its records are not answered twice). At most
    MAX_READ_BYTES_PER_FILE bytes, from the end (the lines before are counted, not kept; the first
    whole line after the cut is the first parsed). Raises OSError when it cannot be read."""
    try:  # O_NONBLOCK: a FIFO put in its place must not hang the request
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:  # rotated away after audit_files listed it: its records moved on
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO, a device (/dev/zero), a directory
            raise OSError(errno.EINVAL, "not a regular file")
    except OSError:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        if (st.st_dev, st.st_ino) in seen:
            return None
        seen.add((st.st_dev, st.st_ino))
        start = max(0, st.st_size - MAX_READ_BYTES_PER_FILE)
        if not start:
            return f.read(MAX_READ_BYTES_PER_FILE), 1, []
        first = 1
        left = start
        while left > 0:
            block = f.read(min(_COUNT_BLOCK_BYTES, left))
            if not block:
                break
            first += block.count(b"\n")
            left -= len(block)
        data = f.read(MAX_READ_BYTES_PER_FILE)
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
        first += 1 if cut >= 0 else 0
        why = (f"{st.st_size} bytes, more than the {MAX_READ_BYTES_PER_FILE} read from a file's end: "
               f"lines 1..{first - 1} not read")
        return data, first, [Problem(str(path), 0, why, "")]


def read_records(directory: Path, since_s: float | None = None) -> ReadResult:
    """All records of a state directory's audit files (oldest first), those with ``time_s >=
    since_s`` when given, and the problem lines of the files read (the oldest
    MAX_PROBLEMS_PER_ANSWER; the rest counted in problems_omitted). Files are read newest first and
    each file once (by inode), so a rotation while reading neither repeats nor loses records."""
    out = ReadResult()
    seen: set[tuple[int, int]] = set()
    parts: list[tuple[str | None, list[dict[str, Any]], list[Problem]]] = []  # newest file first
    for path in reversed(audit_files(directory)):  # newest first, as read_newest (rotation races)
        try:
            got = _read_file(path, seen)
        except OSError as e:
            parts.append((None, [], [Problem(str(path), 0, f"cannot be read: {e.strerror or e}", "")]))
            continue
        if got is None:
            continue
        data, first, problems = got
        part = parse_lines(data, str(path), first)
        out.lines_parsed += part.lines_parsed
        kept = [rec for rec in part.records
                if since_s is None or not isinstance(rec.get("time_s"), (int, float)) or rec["time_s"] >= since_s]
        parts.append((str(path), kept, problems + part.problems))
    for name, recs, problems in reversed(parts):
        if name is not None:
            out.files_read.append(name)
        out.records.extend(recs)
        for p in problems:
            out.add_problem(p)
    return out


def read_newest(directory: Path, since_s: float | None = None, limit: int = MAX_RECORDS_PER_ANSWER) -> ReadResult:
    """The newest `limit` records with ``time_s >= since_s`` (all times when None), oldest first,
    reading only what that needs (``GET /v1/audit``): the files newest first (audit.log, then
    audit.log.1, ...) and each from its last line back, stopping at the record after the limit
    (``truncated``) or at the first record older than `since_s` (records are appended in the
    order of the daemon's clock, so everything before it is older too; a clock stepped back
    mid-log is the exception and may hide records written before the step). A file never reached
    is never opened. Problems: those of the lines parsed, oldest first. Raises ValueError when
    `limit` < 1."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    out = ReadResult()
    parts: list[tuple[list[dict[str, Any]], list[Problem]]] = []  # per file, newest file first
    found = 0
    done = False
    seen: set[tuple[int, int]] = set()
    kept_problems = 0
    for path in reversed(audit_files(directory)):
        try:
            got_file = _read_file(path, seen)
        except OSError as e:
            parts.append(([], [Problem(str(path), 0, f"cannot be read: {e.strerror or e}", "")]))
            continue
        if got_file is None:
            continue
        data, first, head_problems = got_file
        out.files_read.append(str(path))
        lines = data.split(b"\n")
        ends_clean = data.endswith(b"\n") or not data
        recs: list[dict[str, Any]] = []
        problems: list[Problem] = []
        for i in range(len(lines), 0, -1):
            raw = lines[i - 1]
            if not raw.strip():
                continue
            out.lines_parsed += 1
            got = _parse_line(raw, str(path), first + i - 1, i == len(lines) and not ends_clean)
            if isinstance(got, Problem):
                if kept_problems < MAX_PROBLEMS_PER_ANSWER:
                    problems.append(got)
                    kept_problems += 1
                else:
                    out.problems_omitted += 1
                continue
            t = got.get("time_s")
            if since_s is not None and isinstance(t, (int, float)) and t < since_s:
                done = True
                break
            if found == limit:
                out.truncated = done = True
                break
            recs.append(got)
            found += 1
        recs.reverse()
        problems.reverse()
        parts.append((recs, head_problems + problems))
        if done:
            break
    for recs, problems in reversed(parts):
        out.records.extend(recs)
        out.problems.extend(problems)
    return out


def who_of_peer(uid: int | None, pid: int | None, reported: str | None) -> dict[str, Any]:
    """The ``who`` of a request: the peer's account name (the SSH login user behind the bridge),
    uid, pid, the SSH client address from the peer's environment (None when not readable or not
    over SSH), and the user@host gpuctl reported (None when not sent)."""
    user = None
    if uid is not None:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = f"uid {uid}"
    ssh_client = None
    if pid is not None:
        env = _environ_of(pid)
        conn = env.get("SSH_CONNECTION")
        if conn:
            parts = conn.split()
            ssh_client = f"{parts[0]} port {parts[1]}" if len(parts) >= 2 else conn[:80]
    return {"ssh_user": user, "peer_uid": uid, "peer_pid": pid, "ssh_client": ssh_client,
            "reported": reported}


def _environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k in (b"SSH_CONNECTION", b"USER"):
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


class AuditLog:
    """The audit log of one node (thread-safe).

    directory: the state directory. node: the node's hostname (in every record). clock: Unix time
    (s). max_bytes / keep: rotation. Raises nothing at construction; :meth:`open` raises
    AuditWriteError naming the file when it cannot be opened for appending.
    """

    def __init__(self, directory: str | os.PathLike, node: str, *, clock: Callable[[], float] = time.time,
                 max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP):
        self.directory = Path(directory)
        self.path = self.directory / AUDIT_FILE_NAME
        self.node = node
        self.clock = clock
        self.max_bytes = max_bytes
        self.keep = keep
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._local = threading.local()
        self._boot = f"{int(time.time())}-{os.getpid()}"
        self._n = 0

    # -- writing

    def open(self) -> None:
        """Open audit.log for appending; a last line cut by a crash gets its newline first (it is
        then reported as truncated by the reader, and the next record starts on its own line)."""
        with self._lock:
            if self._fd is not None:
                return
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
                if not _ends_with_newline(fd):
                    os.write(fd, b"\n")
                    log.warning("audit log %s ended in a cut line (a crash while writing); "
                                "it is kept and reported by `gpuctl audit`", self.path)
            except OSError as e:
                raise AuditWriteError(f"cannot open the audit log {self.path}: {e.strerror or e}") from e
            self._fd = fd

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def next_op(self) -> str:
        """A new operation id, unique on this node: ``<boot>-<n>``."""
        with self._lock:
            self._n += 1
            return f"{self._boot}-{self._n}"

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write one record (``time_s`` and ``node`` added) and fsync it; returns the record.
        Raises AuditWriteError naming the file (the caller decides whether to refuse)."""
        rec = {"time_s": round(self.clock(), 6), "node": self.node, **record}
        line = (json.dumps(rec, ensure_ascii=False, sort_keys=True, default=str) + "\n").encode("utf-8", "backslashreplace")
        with self._lock:
            try:
                if self._fd is None:
                    self.open()
                assert self._fd is not None
                if not _ends_with_newline(self._fd):  # another writer left a cut line: start a new one
                    line = b"\n" + line
                os.write(self._fd, line)
                os.fsync(self._fd)
                if os.fstat(self._fd).st_size >= self.max_bytes:
                    self._rotate()
            except OSError as e:
                raise AuditWriteError(f"cannot write the audit log {self.path}: {e.strerror or e}") from e
        return rec

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        oldest = self.path.with_name(f"{AUDIT_FILE_NAME}.{self.keep}")
        oldest.unlink(missing_ok=True)
        for k in range(self.keep - 1, 0, -1):
            src = self.path.with_name(f"{AUDIT_FILE_NAME}.{k}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{AUDIT_FILE_NAME}.{k + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{AUDIT_FILE_NAME}.1"))
        else:
            self.path.unlink()
        fsync_directory(self.directory)
        self.open()

    # -- context of the change being made on this thread

    @contextlib.contextmanager
    def context(self, who: dict[str, Any], request_id: str | None = None, action: str | None = None,
                op: str | None = None) -> Iterator[AuditContext]:
        """Within the block, state changes on this thread are recorded with `who`, `request_id`
        and `action` (nested blocks restore the outer context)."""
        prev = getattr(self._local, "ctx", None)
        ctx = AuditContext(who=who, request_id=request_id, action=action, op=op)
        self._local.ctx = ctx
        try:
            yield ctx
        finally:
            self._local.ctx = prev

    def current(self) -> AuditContext | None:
        """The context of this thread, or None."""
        return getattr(self._local, "ctx", None)

    # -- the state manager's commit hook

    def on_commit(self, old: Any, new: Any) -> None:
        """NodeStateManager.on_commit: append a ``change`` record describing old -> new.

        Never raises (the state is already on disk): a failed write is logged; the ``begin``
        record of the request then stands without its change and the reader shows it.
        """
        try:
            rec = describe_change(old, new)
            if rec is None:
                return
            ctx = self.current()
            if ctx is None:
                thread = threading.current_thread().name
                job = "lease monitor" if thread == "gpuctld-leases" else "gpuctld"
                rec.update(who={"internal": job}, request_id=None, action=None, op=None)
            else:
                rec.update(who=ctx.who, request_id=ctx.request_id, action=ctx.action, op=ctx.op)
            self.append(rec)
        except Exception as e:  # noqa: BLE001 - the change is made; the audit failure is logged
            log.error("audit: could not record a change of generation %s: %s",
                      getattr(new, "generation", "?"), e)

    # -- start-up

    def recover(self, recorded: Callable[[str], dict[str, Any] | None], generation: int) -> list[dict[str, Any]]:
        """Append an ``incomplete`` record for each ``begin`` of audit.log with no ``end`` (the
        daemon stopped in between); `recorded(request_id)` gives the state's answer for that
        request id, if any. Returns the records written."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return []
        part = parse_lines(data, str(self.path))
        begun: dict[str, dict[str, Any]] = {}
        changes: dict[str, list[dict[str, Any]]] = {}
        for rec in part.records:
            op = rec.get("op")
            if not isinstance(op, str):
                continue
            if rec.get("event") == "request" and rec.get("phase") == "begin":
                begun[op] = rec
            elif rec.get("event") in ("request", "incomplete") and rec.get("phase") in ("end", None):
                begun.pop(op, None)
            elif rec.get("event") == "change":
                changes.setdefault(op, []).append(rec)
        written = []
        for op, rec in begun.items():
            rid = rec.get("request_id")
            answer = recorded(rid) if isinstance(rid, str) else None
            note = ("gpuctld stopped before the outcome of this request was recorded; "
                    f"the state at restart is generation {generation}")
            out = {"event": "incomplete", "op": op, "request_id": rid, "who": rec.get("who"),
                   "action": rec.get("action"), "outcome": "incomplete", "note": note,
                   "change_recorded": bool(changes.get(op)), "state_answer": answer}
            written.append(self.append(out))
        return written


def _ends_with_newline(fd: int) -> bool:
    """True when the file is empty or its last byte is a newline."""
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def _slice_owner_map(state: Any) -> dict[str, tuple[str, str]]:
    return {sid: (s.department, s.gpu_uuid) for sid, s in state.slices.items()}


def describe_change(old: Any, new: Any) -> dict[str, Any] | None:
    """A ``change`` record body for NodeState `old` -> `new` (None when nothing a record names
    changed): owners moved, GPUs re-split, leases added or ended, moves left pending."""
    before, after = _slice_owner_map(old), _slice_owner_map(new)
    moved = [{"slice_id": sid, "from": before[sid][0], "to": after[sid][0]}
             for sid in sorted(after) if sid in before and before[sid][0] != after[sid][0]]
    def layout(state: Any) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for sid, s in state.slices.items():
            out.setdefault(s.gpu_uuid, {})[sid] = s.fraction
        return out

    old_gpus, new_gpus = layout(old), layout(new)
    split = [{"gpu_uuid": gpu, "slices_before": sorted(old_gpus[gpu]), "slices_after": sorted(new_gpus[gpu]),
              "parts": len(new_gpus[gpu])}
             for gpu in sorted(new_gpus) if gpu in old_gpus and old_gpus[gpu] != new_gpus[gpu]]
    created = sorted(sid for gpu in new_gpus if gpu not in old_gpus for sid in new_gpus[gpu])
    pending = [{"slice_id": sid, "from": s.department, "to": s.pending.get("to")}
               for sid, s in sorted(new.slices.items())
               if s.pending and not (old.slices.get(sid) and old.slices[sid].pending == s.pending)]

    def lease_json(lease: Any) -> dict[str, Any]:
        return {"id": lease.id, "department": lease.department, "owner": lease.owner,
                "slice_ids": list(lease.slice_ids)}

    added = [lease_json(lease) for lid, lease in new.leases.items() if lid not in old.leases]
    ended = [lease_json(lease) for lid, lease in old.leases.items() if lid not in new.leases]
    if not (moved or split or created or pending or added or ended):
        return None
    rec: dict[str, Any] = {"event": "change", "generation": new.generation, "outcome": "ok"}
    if moved:
        rec["moved"] = moved
    if pending:
        rec["pending"] = pending
    if split:
        rec["split"] = split
    if created:
        rec["slices_created"] = [{"slice_id": sid, "to": after[sid][0]} for sid in created]
    if added:
        rec["leases_added"] = added
    if ended:
        rec["leases_ended"] = ended
    return rec
