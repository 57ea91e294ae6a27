"""known_hosts: look up, verify and add SSH host keys with OpenSSH's file format and rules.

Own parser rather than paramiko.HostKeys because messages must cite FILE:LINE of a changed key and
because @revoked lines must refuse. Supports hashed names (|1|salt|hash), wildcard and negated
patterns, "[host]:port" names for ports other than 22, and @revoked markers (@cert-authority lines
are skipped: certificates are not supported).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

from gpuctl.transport.filememo import FileMemo


def _pattern_matches(name: str, pattern: str) -> bool:
    """ssh's match_pattern: only `*` (any run) and `?` (one character) are special; `[` is literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.DOTALL) is not None


def host_entry_name(host: str, port: int) -> str:
    """The name known_hosts uses for host:port: ``host`` for port 22, else ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint_sha256(key_blob: bytes) -> str:
    """``SHA256:<base64 without padding>`` of a public key blob, as `ssh` and `ssh-keygen -l` print it."""
    digest = hashlib.sha256(key_blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def key_type_label(key_type: str) -> str:
    """"ssh-ed25519" -> "ED25519", "ssh-rsa" -> "RSA", "ecdsa-sha2-nistp256" -> "ECDSA" (ssh's words)."""
    if key_type.startswith("ecdsa-"):
        return "ECDSA"
    return key_type.removeprefix("ssh-").split("@")[0].upper()


def blob_key_type(blob: bytes) -> str:
    """The key type string at the start of an SSH public key blob ("" when malformed)."""
    if len(blob) < 4:
        return ""
    n = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + n].decode("ascii", "replace")


@dataclass(frozen=True)
class KnownHostLine:
    """One usable line of a known_hosts file: where it is, its marker, patterns and key."""

    path: str
    lineno: int
    marker: str | None  # None or "@revoked"
    patterns: str
    key_type: str
    key_blob: bytes

    @property
    def where(self) -> str:
        """``FILE:LINE`` of this entry."""
        return f"{self.path}:{self.lineno}"

    def matches(self, name: str) -> bool:
        """True when `name` (see :func:`host_entry_name`) matches this line's host patterns."""
        name = name.lower()
        if self.patterns.startswith("|1|"):
            try:
                _, _, salt64, hash64 = self.patterns.split("|", 3)
                salt = base64.b64decode(salt64)
                want = base64.b64decode(hash64)
            except (ValueError, binascii.Error):
                return False
            return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)
        positive = False
        for pattern in self.patterns.lower().split(","):
            negate = pattern.startswith("!")
            pattern = pattern[1:] if negate else pattern
            if _pattern_matches(name, pattern):
                if negate:
                    return False
                positive = True
        return positive


@dataclass(frozen=True)
class HostKeyCheck:
    """Result of :meth:`KnownHosts.check`.

    status: "ok" (a line holds this key), "unknown" (no line of this key type for the host),
    "changed" (lines of this key type hold a different key; `line` is the first), "revoked" (the
    key is on a @revoked line, `line`). other_types: key types known for the host under other
    algorithms (reported with "unknown").
    """

    status: str
    line: KnownHostLine | None = None
    other_types: tuple[str, ...] = ()


class KnownHosts:
    """The lines of known_hosts files; `path` is the user's file (written by :meth:`add`).

    extra_paths: read-only files also consulted (e.g. /etc/ssh/ssh_known_hosts). Missing files
    count as empty. Malformed lines are skipped, as ssh does.
    """

    def __init__(self, path: str, extra_paths: tuple[str, ...] = ()):
        self.path = os.path.expanduser(path)
        self.extra_paths = tuple(os.path.expanduser(p) for p in extra_paths)
        self.lines: list[KnownHostLine] = []
        for p in (self.path, *self.extra_paths):
            self.lines.extend(self._read(p))

    @staticmethod
    def _read(path: str) -> list[KnownHostLine]:
        """The usable lines of `path` ([] when missing); parsed once per process while the file is
        unchanged (gpuctl.transport.filememo)."""
        return list(_PARSED.get(path, lambda: (tuple(KnownHosts._parse(path)), (path,))))

    @staticmethod
    def _parse(path: str) -> list[KnownHostLine]:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                raw = f.read().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for lineno, line in enumerate(raw, 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            marker = None
            if fields[0].startswith("@"):
                marker, fields = fields[0], fields[1:]
                if marker != "@revoked":
                    continue  # @cert-authority: certificates are not supported
            if len(fields) < 3:
                continue
            try:
                blob = base64.b64decode(fields[2], validate=True)
            except (ValueError, binascii.Error):
                continue
            out.append(KnownHostLine(path, lineno, marker, fields[0], fields[1], blob))
        return out

    def for_host(self, name: str) -> list[KnownHostLine]:
        """Lines whose patterns match `name`, in file order."""
        return [ln for ln in self.lines if ln.matches(name)]

    def known_key_types(self, name: str) -> list[str]:
        """Key types (e.g. "ssh-ed25519") known for `name`, revoked lines excluded, first-seen order."""
        types: list[str] = []
        for ln in self.for_host(name):
            if ln.marker is None and ln.key_type not in types:
                types.append(ln.key_type)
        return types

    def check(self, name: str, key_blob: bytes) -> HostKeyCheck:
        """Compare the server's key (public blob) with the lines for `name`; see HostKeyCheck."""
        key_type = blob_key_type(key_blob)
        for ln in self.lines:
            if ln.marker == "@revoked" and ln.key_blob == key_blob:
                return HostKeyCheck("revoked", ln)
        lines = [ln for ln in self.for_host(name) if ln.marker is None]
        same_type = [ln for ln in lines if ln.key_type == key_type]
        for ln in same_type:
            if ln.key_blob == key_blob:
                return HostKeyCheck("ok", ln)
        if same_type:
            return HostKeyCheck("changed", same_type[0])
        return HostKeyCheck("unknown", None, tuple(dict.fromkeys(ln.key_type for ln in lines)))

    def add(self, name: str, key_type: str, key_blob: bytes) -> None:
        """Append ``name key_type base64`` to the user's file (creating it 0600, its directory 0700).

        Raises OSError when the file cannot be written. The in-memory lines are updated too.
        """
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        needs_newline = False
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        line = f"{name} {key_type} {base64.b64encode(key_blob).decode('ascii')}\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(("\n" if needs_newline else "") + line)
            f.flush()
            os.fsync(f.fileno())
        self.lines = self._read(self.path) + [ln for p in self.extra_paths for ln in self._read(p)]


#: Lines of known_hosts files read by this process (KnownHosts._read).
_PARSED: FileMemo[tuple[KnownHostLine, ...]] = FileMemo()
