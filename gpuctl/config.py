"""The fleet config file (TOML): which nodes make up the fleet, how to reach them, which departments exist.

The file lives at :func:`default_config_path` (``$XDG_CONFIG_HOME/gpuctl/fleet.toml``) unless the CLI is
given ``--config``. Its keys are documented in docs/CONFIG.md. Shape::

    theme = "gpuctl-dark"          # optional, console theme name
    refresh_s = 1.0                # optional, console poll interval (seconds, > 0)
    max_parallel = 16              # optional, nodes contacted at once (>= 1)

    [[department]]                 # or [department.research] / [department."研究部"]
    name = "research"
    priority = 10                  # lower number = more important
    color = "#ff8800"              # "#rrggbb" or a color / theme variable name

    [[node]]                       # or [node.gpu01]
    name = "gpu01"
    host = "gpu01.example.com"     # required for transport "ssh"
    transport = "ssh"              # "ssh" (default) or "local"

The file is always read as bytes: a UTF-8 byte order mark is accepted, any other encoding is refused with
the place of the first bad byte. Every error is a :class:`ConfigError` naming ``path:line[:column]`` and,
for a bad value, the key (``node[1].port``); the loader either returns a whole :class:`FleetConfig` or
raises, never a half config.

tomllib gives no line numbers for keys, so a small scanner of the source (:func:`_scan`) records the line
where each table header and each ``key =`` starts; the n-th ``[[node]]`` header is the n-th element.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn

from gpuctl.model import UNASSIGNED
from gpuctl.regular_file import UnreadableFile, read_regular_file

__all__ = [
    "ConfigError",
    "ConfigErrors",
    "DepartmentConfig",
    "FleetConfig",
    "Location",
    "NodeConfig",
    "TRANSPORTS",
    "TelemetryConfig",
    "ValueChecks",
    "default_config_path",
    "load_config",
    "parse_config",
    "render_config",
]

#: The ways the fleet client reaches a node's gpuctld: over SSH (paramiko, then `gpuctld bridge` on the
#: node) or straight to a Unix socket on this machine.
TRANSPORTS = ("ssh", "local")

#: Largest fleet config read, bytes (a config of thousands of nodes is well under it; /dev/zero is not).
MAX_CONFIG_BYTES = 4 * 1024 * 1024

#: The daemon's default control socket on a node (used when `socket` is not given).
DEFAULT_SOCKET = "/run/gpuctld/gpuctld.sock"

_BOM = b"\xef\xbb\xbf"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_HEX_COLOR = re.compile(r"#[0-9A-Fa-f]{6}")
_COLOR_NAME = re.compile(r"\$?[A-Za-z][A-Za-z0-9_-]*")
_TOML_POS = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")
_REDEFINITIONS = (
    "Cannot overwrite a value",
    "Cannot declare",
    "Cannot mutate immutable namespace",
    "Cannot redefine namespace",
    "Duplicate inline table key",
)
_UNICODE_HINT = 'quote non-ASCII names, e.g. [department."研究部"]'


# --------------------------------------------------------------------------------------------------
# Public types


class ConfigError(Exception):
    """A fleet config that cannot be used, with the place it went wrong.

    Attributes: path (str, as given to the loader), line and column (1-based, None when unknown), key
    (the config key in the file's terms, e.g. ``"node[1].port"`` or ``"department.research.color"``,
    None when the error is not about one key), message (what is wrong and, where possible, the fix).
    ``str()`` is ``"path:line:column: key: message"`` with the unknown parts left out.
    """

    def __init__(
        self,
        path: str,
        message: str,
        *,
        line: int | None = None,
        column: int | None = None,
        key: str | None = None,
    ) -> None:
        self.path = path
        self.line = line
        self.column = column
        self.key = key
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        place = self.path
        if self.line is not None:
            place += f":{self.line}"
            if self.column is not None:
                place += f":{self.column}"
        parts = [place]
        if self.key:
            parts.append(self.key)
        parts.append(self.message)
        return ": ".join(parts)


class ConfigErrors(ConfigError):
    """Several problems of one config, found in one pass (file order). Its path, line, key and
    message are the first one's; ``errors`` lists them all; ``str()`` is one line per problem."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(first.path, first.message, line=first.line, column=first.column, key=first.key)

    def __str__(self) -> str:
        return "\n".join(ConfigError.__str__(e) for e in self.errors)


#: Words an admin may write for a key, and the key they mean (tried before spelling distance).
KEY_SYNONYMS = {"hostname": "host", "address": "host", "addr": "host", "ip": "host", "server": "host",
                "username": "user", "login": "user", "identityfile": "identity_file", "key": "identity_file",
                "keyfile": "identity_file", "key_file": "identity_file", "ssh_key": "identity_file",
                "timeout": "timeout_s", "refresh": "refresh_s", "interval": "refresh_s", "colour": "color",
                "prio": "priority", "socket_path": "socket", "sock": "socket", "parallel": "max_parallel"}


def suggest_key(key: str, known: tuple[str, ...]) -> str | None:
    """The known key `key` most likely means: a synonym (``hostname`` -> ``host``), else a known
    key that `key` starts or ends with or that starts with `key` (the longest), else the closest
    spelling (difflib, ratio >= 0.6); None when nothing is close."""
    norm = key.strip().lower().replace("-", "_")
    if norm in known:
        return norm
    syn = KEY_SYNONYMS.get(norm.replace("_", "")) or KEY_SYNONYMS.get(norm)
    if syn in known:
        return syn
    related = [k for k in known if len(k) >= 3 and (norm.startswith(k) or norm.endswith(k) or k.startswith(norm))]
    if related and len(norm) >= 3:
        return max(related, key=len)
    near = difflib.get_close_matches(norm, known, n=1, cutoff=0.6)
    return near[0] if near else None


@dataclass(frozen=True)
class Location:
    """Where something was defined: ``path`` of the config file and 1-based ``line`` (None if unknown).

    ``str()`` is ``"path:line"`` (or just ``"path"``).
    """

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return self.path if self.line is None else f"{self.path}:{self.line}"


@dataclass(frozen=True)
class NodeConfig:
    """One GPU node of the fleet, as configured.

    name: the node's name in gpuctl (CLI arguments, console rows); unique in the fleet.
    host: SSH host (a name from ~/.ssh/config or an address); required for transport "ssh", None when
    absent (transport "local"). user, port (1..65535), identity_file (path as written, "~" not yet
    expanded): SSH settings, None = let the SSH config / defaults decide. socket: path of gpuctld's Unix
    socket on the node (transport "ssh") or on this machine (transport "local", required there); None =
    the daemon's default, :data:`DEFAULT_SOCKET`. transport: one of :data:`TRANSPORTS`. gpuctld: the
    command run on the node for the daemon's bridge (remote program path), default "gpuctld".
    timeout_s: seconds to wait for the node (SSH connect, each API call) before it shows as unreachable.
    source: where the node was defined (not compared).
    """

    name: str
    host: str | None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    socket: str | None = None
    transport: str = "ssh"
    gpuctld: str = "gpuctld"
    timeout_s: float = 5.0
    source: Location | None = field(default=None, compare=False)

    @property
    def socket_path(self) -> str:
        """The control socket to use: `socket`, or the daemon's default :data:`DEFAULT_SOCKET`."""
        return self.socket or DEFAULT_SOCKET


@dataclass(frozen=True)
class DepartmentConfig:
    """A department as configured: name (unique, never "unassigned"), priority (int >= 0, lower number
    = more important), color ("#rrggbb", a color name or a theme variable like "$dept-research"; None =
    the theme picks one), source: where it was defined (not compared)."""

    name: str
    priority: int = 100
    color: str | None = None
    source: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TelemetryConfig:
    """Where the console takes telemetry and history from (``[telemetry]``): source "nodes" (each
    node's gpuctld over SSH, the default) or "prometheus" (url: ``http(s)://host:port`` of a
    Prometheus scraping every gpuctld; see docs/PROMETHEUS.md); timeout_s per Prometheus request.
    Ownership changes always go to the nodes over SSH."""

    source: str = "nodes"
    url: str | None = None
    timeout_s: float = 5.0


@dataclass(frozen=True)
class FleetConfig:
    """The whole fleet config.

    path: the file it came from (as given). nodes, departments: in file order. theme: console theme
    name (None = built-in default). refresh_s: console poll interval in seconds (> 0). max_parallel:
    how many nodes the fleet client contacts at once (>= 1).
    """

    path: str
    nodes: tuple[NodeConfig, ...] = ()
    departments: tuple[DepartmentConfig, ...] = ()
    theme: str | None = None
    refresh_s: float = 1.0
    max_parallel: int = 16
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def node(self, name: str) -> NodeConfig | None:
        """The node called `name`, or None when the config has no such node."""
        return next((n for n in self.nodes if n.name == name), None)

    def department(self, name: str) -> DepartmentConfig | None:
        """The department called `name`, or None when the config has none ("unassigned" is never
        configured, so it gives None too)."""
        return next((d for d in self.departments if d.name == name), None)


def default_config_path() -> Path:
    """``$XDG_CONFIG_HOME/gpuctl/fleet.toml``; XDG_CONFIG_HOME unset, empty or relative means ``~/.config``
    (as the XDG Base Directory spec says)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "gpuctl" / "fleet.toml"


@dataclass(frozen=True)
class ValueChecks:
    """Checks of values whose valid set lives outside this module (the console's themes and
    colors: `gpuctl config check` passes them, built from Textual, so config stays headless).
    Each takes the value and returns None when it is fine, else the message (what is wrong and
    what is known)."""

    theme: Callable[[str], str | None] | None = None
    color: Callable[[str], str | None] | None = None


def load_config(path: Path | str, *, checks: ValueChecks | None = None) -> FleetConfig:
    """Read and validate the fleet config at `path` (read as bytes; see :func:`parse_config`).

    Raises :class:`ConfigError` when the file cannot be read (missing, a dangling link or symlink
    loop, no permission on it or a directory above it), is not a regular file (directory, FIFO,
    device, socket), is larger than MAX_CONFIG_BYTES, or is invalid; never returns a partial config.
    """
    shown = str(path)
    try:
        data = read_regular_file(path, MAX_CONFIG_BYTES)
    except UnreadableFile as e:
        if e.missing:
            raise ConfigError(shown, "config file not found (create it, or pass --config PATH)") from None
        raise ConfigError(shown, e.reason) from None
    return parse_config(data, shown, checks=checks)


def parse_config(data: bytes, path: str, *, checks: ValueChecks | None = None) -> FleetConfig:
    """Parse and validate fleet config bytes; `path` is only used in messages and ``FleetConfig.path``.

    A leading UTF-8 BOM is dropped. Raises :class:`ConfigError` for non-UTF-8 bytes ("config must be
    UTF-8 (path)" with the offset, line and column of the first bad byte), TOML syntax errors (line,
    column and a hint for redefinitions and non-ASCII bare keys), and invalid values (line and key).
    """
    text = _decode(data, path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _toml_error(e, text, path) from None
    except RecursionError:  # tomllib recurses once per nested array / inline table
        raise ConfigError(path, "invalid TOML: arrays or inline tables are nested too deeply") from None
    lines, _ = _scan(text)
    return _Validator(path, lines, checks).fleet(raw)


def render_config(cfg: FleetConfig) -> str:
    """The TOML text of `cfg` (array-of-tables form, fields at their defaults left out), such that
    ``parse_config(render_config(cfg).encode(), cfg.path) == cfg`` for a valid `cfg` (source lines are
    not compared). Used by ``gpuctl demo`` to write a config for its daemons."""
    out: list[str] = []
    if cfg.theme is not None:
        out.append(f"theme = {_toml_value(cfg.theme)}")
    out.append(f"refresh_s = {_toml_value(float(cfg.refresh_s))}")
    out.append(f"max_parallel = {_toml_value(cfg.max_parallel)}")
    if cfg.telemetry != TelemetryConfig():
        out += ["", "[telemetry]", f"source = {_toml_value(cfg.telemetry.source)}",
                f"timeout_s = {_toml_value(float(cfg.telemetry.timeout_s))}"]
        if cfg.telemetry.url is not None:
            out.append(f"url = {_toml_value(cfg.telemetry.url)}")
    for d in cfg.departments:
        out += ["", "[[department]]", f"name = {_toml_value(d.name)}", f"priority = {_toml_value(d.priority)}"]
        if d.color is not None:
            out.append(f"color = {_toml_value(d.color)}")
    defaults = NodeConfig(name="", host=None)
    for n in cfg.nodes:
        out += ["", "[[node]]", f"name = {_toml_value(n.name)}"]
        for key in _NODE_KEYS[1:]:
            value = getattr(n, key)
            if key == "timeout_s":
                value = float(value)
            if value is not None and (key == "transport" or value != getattr(defaults, key)):
                out.append(f"{key} = {_toml_value(value)}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------
# Bytes and TOML syntax


def _decode(data: bytes, path: str) -> str:
    """UTF-8 text of `data` without a leading BOM, or ConfigError naming the first bad byte."""
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        offset = e.start
        good = data[:offset].decode("utf-8")
        line = good.count("\n") + 1
        column = len(good) - (good.rfind("\n") + 1) + 1
        hint = "save the file as UTF-8"
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            hint = "the file looks like UTF-16: save it as UTF-8"
        raise ConfigError(
            path,
            f"config must be UTF-8 ({path}): byte 0x{data[offset]:02x} at offset {offset} "
            f"(line {line}, column {column}) is not valid UTF-8; {hint}",
            line=line,
            column=column,
        ) from None


def _toml_error(e: tomllib.TOMLDecodeError, text: str, path: str) -> ConfigError:
    """A ConfigError for a tomllib syntax error: its line and column, its message, and a hint.

    Python 3.14+ puts lineno/colno/msg on the exception; older versions only have the
    "(at line X, column Y)" suffix of the message. Both are read.
    """
    msg = getattr(e, "msg", None)
    line = getattr(e, "lineno", None)
    column = getattr(e, "colno", None)
    text_msg = str(e)
    m = _TOML_POS.search(text_msg)
    if m:
        if line is None and m.group(1):
            line, column = int(m.group(1)), int(m.group(2))
        if not msg:
            msg = text_msg[: m.start()]
    if not msg:
        msg = text_msg
    src_lines = text.split("\n")
    if line is None:  # "end of document"
        line = len(src_lines)
        column = len(src_lines[-1]) + 1
    message = f"invalid TOML: {msg}"
    hint = _toml_hint(msg, text, src_lines, line, column)
    if hint:
        message += f"; {hint}"
    return ConfigError(path, message, line=line, column=column)


def _toml_hint(msg: str, text: str, src_lines: list[str], line: int, column: int | None) -> str | None:
    """A hint for the usual causes of a tomllib error at (line, column), or None."""
    offset = sum(len(s) + 1 for s in src_lines[: line - 1]) + (column or 1) - 1
    offset = max(0, min(offset, len(text)))
    if msg.startswith(_REDEFINITIONS):
        lines, stmt = _scan(text[:offset])
        if stmt is not None:
            path, stmt_line, header = stmt
            for k in range(len(path), 0, -1):
                first = lines.get(path[:k])
                if first is not None and first < stmt_line:
                    if header is not None and k == len(path):
                        shown = f"table [{_display_path(header)}]"
                    else:
                        shown = f"key {_display_path(path[:k])!r}"
                    return f"{shown} is defined twice (first at line {first}); define it once"
        return "a key or table is defined twice; define each once"
    if msg == "Illegal character '\\n'":
        return "a string is not closed before the end of its line"
    char = text[offset] if offset < len(text) else ""
    if char and not char.isascii():
        return f"bare keys must be ASCII letters, digits, '_' or '-': {_UNICODE_HINT}"
    return None


# --------------------------------------------------------------------------------------------------
# Line scanner: where each table header and key starts (tomllib gives no positions)

_Path = tuple  # of str (keys) and int (array-of-tables element indexes)
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\", "e": "\x1b"}


def _scan(text: str) -> tuple[dict[_Path, int], tuple[_Path, int, tuple[str, ...] | None] | None]:
    """Scan TOML source for positions.

    Returns (lines, last): lines maps each resolved path to the 1-based line where it first appears,
    e.g. ``("node", 1)`` -> line of the 2nd ``[[node]]`` header, ``("node", 1, "port")`` -> line of its
    ``port =``, ``("department", "研究部")`` -> line of ``[department."研究部"]``; every prefix of a dotted
    key is recorded too. Keys inside inline tables/arrays are not recorded (their enclosing key is).
    last: (path, line, header) of the last statement started (header: the header's key parts as written,
    None for a key/value statement), used to explain a syntax error when
    given the text up to the error. Best effort: it never raises, whatever the input.
    """
    lines: dict[_Path, int] = {}
    arrays: dict[_Path, int] = {}
    last: tuple[_Path, int, tuple[str, ...] | None] | None = None
    table: _Path = ()
    i, n, line = 0, len(text), 1

    def resolve(parts: list[str]) -> _Path:
        out: _Path = ()
        for p in parts:
            out = out + (p,)
            if out in arrays:
                out = out + (arrays[out] - 1,)
        return out

    def read_key(j: int) -> tuple[list[str], int]:
        parts: list[str] = []
        while j < n:
            while j < n and text[j] in " \t":
                j += 1
            if j >= n:
                break
            c = text[j]
            if c == '"':
                j, s = _read_basic(text, j + 1)
                parts.append(s)
            elif c == "'":
                end = text.find("'", j + 1)
                end = n if end < 0 else end
                parts.append(text[j + 1 : end])
                j = end + 1
            else:
                m = _BARE_KEY.match(text, j)
                if not m:
                    break
                parts.append(m.group())
                j = m.end()
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == ".":
                j += 1
                continue
            break
        return parts, j

    try:
        while i < n:
            c = text[i]
            if c == "\n":
                line += 1
                i += 1
            elif c in " \t\r":
                i += 1
            elif c == "#":
                i = _line_end(text, i)
            elif c == "[":
                is_array = text.startswith("[[", i)
                parts, j = read_key(i + (2 if is_array else 1))
                if is_array and parts:
                    base = resolve(parts[:-1]) + (parts[-1],)
                    k = arrays.get(base, 0)
                    arrays[base] = k + 1
                    lines.setdefault(base, line)
                    table = base + (k,)
                else:
                    table = resolve(parts)
                for m in range(1, len(table) + 1):
                    lines.setdefault(table[:m], line)
                last = (table, line, tuple(parts))
                i = _line_end(text, j)
            else:
                parts, j = read_key(i)
                if not parts or j == i:
                    i = _line_end(text, i)  # not a statement we understand: skip the line
                    continue
                path = table + tuple(parts)
                for m in range(len(table) + 1, len(path) + 1):
                    lines.setdefault(path[:m], line)
                last = (path, line, None)
                if j < n and text[j] == "=":
                    i, line = _skip_value(text, j + 1, line)
                else:
                    i = _line_end(text, j)
    except Exception:  # noqa: BLE001 - positions are best effort; the TOML itself was parsed by tomllib
        pass
    return lines, last


def _line_end(text: str, i: int) -> int:
    """Index of the newline ending the line that holds `i` (or len(text))."""
    j = text.find("\n", i)
    return len(text) if j < 0 else j


def _read_basic(text: str, j: int) -> tuple[int, str]:
    """Read a basic string's body starting at `j` (after the opening quote): (index after the closing
    quote, decoded value)."""
    out: list[str] = []
    n = len(text)
    while j < n and text[j] != '"':
        c = text[j]
        if c == "\\" and j + 1 < n:
            e = text[j + 1]
            if e in "uU":
                width = 4 if e == "u" else 8
                try:
                    out.append(chr(int(text[j + 2 : j + 2 + width], 16)))
                except ValueError:
                    pass
                j += 2 + width
                continue
            out.append(_ESCAPES.get(e, e))
            j += 2
            continue
        out.append(c)
        j += 1
    return j + 1, "".join(out)


def _skip_value(text: str, i: int, line: int) -> tuple[int, int]:
    """Skip a value starting at `i` up to the newline that ends its statement (arrays and multi-line
    strings may span lines). Returns (index of that newline or len(text), line number there)."""
    n = len(text)
    depth = 0
    while i < n:
        c = text[i]
        if c == "\n":
            if depth <= 0:
                return i, line
            line += 1
            i += 1
        elif c in "[{":
            depth += 1
            i += 1
        elif c in "]}":
            depth -= 1
            i += 1
        elif c == "#":
            i = _line_end(text, i)
        elif text.startswith('"""', i) or text.startswith("'''", i):
            quote = text[i : i + 3]
            j = i + 3
            while True:
                k = text.find(quote, j)
                if k < 0:
                    k = n
                    break
                if quote == '"""':
                    backslashes = len(text[j:k]) - len(text[j:k].rstrip("\\"))
                    if backslashes % 2:
                        j = k + 1
                        continue
                break
            while text.startswith(quote[0], k + 3) and k + 3 < n:  # up to 2 quotes may end the body
                k += 1
            line += text.count("\n", i, k)
            i = k + 3
        elif c == '"':
            i, _ = _read_basic(text, i + 1)
        elif c == "'":
            k = text.find("'", i + 1)
            i = n if k < 0 else k + 1
        else:
            i += 1
    return n, line


def _display_path(path: _Path) -> str:
    """A resolved path in the file's terms: ("node", 1, "port") -> "node[1].port",
    ("department", "研究部") -> 'department."研究部"'."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            part = p if _BARE_KEY.fullmatch(p) else _toml_value(p)
            out += f".{part}" if out else part
    return out


def _toml_value(value: Any) -> str:
    """TOML text of a str (basic string), bool, int or finite float."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes are valid TOML basic-string escapes; TOML also wants DEL escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


# --------------------------------------------------------------------------------------------------
# Validation of the parsed document

_TOP_KEYS = ("theme", "refresh_s", "max_parallel", "node", "department", "telemetry")
_TELEMETRY_KEYS = ("source", "url", "timeout_s")
#: Bounds of the config's numbers: refresh_s >= MIN_REFRESH_S; every seconds value <= MAX_SECONDS
#: (timeouts far beyond that overflow the OS's time types); max_parallel <= MAX_PARALLEL (threads).
MIN_REFRESH_S = 0.1
MAX_SECONDS = 1e6
MAX_PARALLEL = 1024


def name_key(name: str) -> str:
    """The identity of a node or department name: NFKC-normalized and case-folded, so "Research",
    "research", "ｒｅｓｅａｒｃｈ" and NFC/NFD spellings of "café" are one name."""
    return unicodedata.normalize("NFKC", name).casefold()


_NODE_KEYS = ("name", "host", "user", "port", "identity_file", "socket", "transport", "gpuctld", "timeout_s")
_DEPT_KEYS = ("name", "priority", "color")
_SSH_ONLY = ("host", "user", "port", "identity_file")


def _got(value: Any) -> str:
    """How a wrong value is shown in a message: strings quoted, TOML words for the rest."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


class _Validator:
    """Turns tomllib's dict into a FleetConfig. Each part (a top-level key, each department, each
    node) is checked on its own and its problems collected, so one pass reports them all: one
    problem raises ConfigError, several ConfigErrors (in file order)."""

    def __init__(self, path: str, lines: dict[_Path, int], checks: ValueChecks | None = None) -> None:
        self.path = path
        self.lines = lines
        self.errors: list[ConfigError] = []
        self.checks = checks or ValueChecks()

    def attempt(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``; a ConfigError it raises is collected and None returned."""
        try:
            return fn(*args)
        except ConfigError as e:
            self.errors.append(e)
            return None

    def raise_collected(self) -> None:
        if not self.errors:
            return
        errors = sorted(self.errors, key=lambda e: (e.line is None, e.line or 0))
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)

    def line(self, loc: _Path) -> int | None:
        """Line of `loc` or of its nearest recorded ancestor."""
        for k in range(len(loc), 0, -1):
            if loc[:k] in self.lines:
                return self.lines[loc[:k]]
        return None

    def fail(self, loc: _Path, message: str, *, keyed: bool = True) -> NoReturn:
        raise ConfigError(self.path, message, line=self.line(loc), key=_display_path(loc) if keyed else None)

    # values ----------------------------------------------------------------------------------------

    def string(self, loc: _Path, value: Any, *, what: str = "a string", shown: bool = False) -> str:
        """A non-empty string; with `shown` (names, theme, color: text put on screen as is) also
        printable, so no terminal escape or invisible character gets into the console."""
        if not isinstance(value, str):
            self.fail(loc, f"must be {what}, got {_got(value)}")
        if not value:
            self.fail(loc, "must not be empty")
        if shown and not value.isprintable():
            self.fail(loc, f"must not hold control or invisible characters, got {value!r}")
        return value

    def integer(self, loc: _Path, value: Any, lo: int, hi: int | None) -> int:
        want = f"an integer {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            self.fail(loc, f"must be {want}, got {_got(value)}")
        return value

    def seconds(self, loc: _Path, value: Any, lo: float = 0.0, hi: float = MAX_SECONDS) -> float:
        """A number of seconds, > lo (or >= lo when lo > 0) and <= hi (timeouts past ~1e9 s overflow)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            self.fail(loc, f"must be a number of seconds > 0, got {_got(value)}")
        if not lo <= value <= hi:
            self.fail(loc, f"must be a number of seconds {lo:g}..{hi:g}, got {_got(value)}")
        return float(value)

    def check_keys(self, loc: _Path, table: dict[str, Any], known: tuple[str, ...], section: str) -> None:
        """Collect one error per unknown key (each with the key it most likely means)."""
        for key in table:
            if key not in known:
                near = suggest_key(key, known)
                hint = f" (did you mean {near!r}?)" if near else f" (known keys: {', '.join(known)})"
                self.attempt(self.fail, loc + (key,), f"unknown key {key!r} in {section}{hint}")

    # document --------------------------------------------------------------------------------------

    def fleet(self, raw: dict[str, Any]) -> FleetConfig:
        self.check_keys((), raw, _TOP_KEYS, "the top level")
        kwargs: dict[str, Any] = {}
        if "theme" in raw:
            kwargs["theme"] = self.attempt(self.theme, raw["theme"])
        if "refresh_s" in raw:
            kwargs["refresh_s"] = self.attempt(lambda: self.seconds(("refresh_s",), raw["refresh_s"], lo=MIN_REFRESH_S))
        if "max_parallel" in raw:
            kwargs["max_parallel"] = self.attempt(self.max_parallel, raw["max_parallel"])
        if "telemetry" in raw:
            kwargs["telemetry"] = self.attempt(self.telemetry, raw["telemetry"])
        departments = tuple(d for d in (self.attempt(self.department, loc, t, name)
                                        for loc, t, name in self.attempt(self.elements, raw, "department") or [])
                            if d is not None)
        self.no_duplicates("department", departments)
        nodes = tuple(n for n in (self.attempt(self.node, loc, t, name)
                                  for loc, t, name in self.attempt(self.elements, raw, "node") or [])
                      if n is not None)
        self.no_duplicates("node", nodes)
        self.raise_collected()
        return FleetConfig(path=self.path, nodes=nodes, departments=departments,
                           **{k: v for k, v in kwargs.items() if v is not None})

    def theme(self, value: Any) -> str:
        name = self.string(("theme",), value, shown=True)
        why = self.checks.theme(name) if self.checks.theme else None
        if why:
            self.fail(("theme",), why)
        return name

    def max_parallel(self, value: Any) -> int:
        n = self.integer(("max_parallel",), value, 1, None)
        if n > MAX_PARALLEL:
            self.fail(("max_parallel",), f"must be an integer 1..{MAX_PARALLEL}, got {n}")
        return n

    def telemetry(self, t: Any) -> TelemetryConfig:
        loc = ("telemetry",)
        if not isinstance(t, dict):
            self.fail(loc, f"must be a table [telemetry], got {_got(t)}")
        self.check_keys(loc, t, _TELEMETRY_KEYS, "[telemetry]")
        source = self.string(loc + ("source",), t.get("source", "nodes"))
        if source not in ("nodes", "prometheus"):
            self.fail(loc + ("source",), f"must be \"nodes\" or \"prometheus\", got {source!r}")
        url = self.string(loc + ("url",), t["url"]) if "url" in t else None
        if url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            self.fail(loc + ("url",), f"must be an http:// or https:// URL like http://prometheus:9090, got {url!r}")
        if source == "prometheus" and url is None:
            self.fail(loc, 'source = "prometheus" needs url = "http://HOST:9090"')
        timeout = self.seconds(loc + ("timeout_s",), t["timeout_s"]) if "timeout_s" in t else 5.0
        return TelemetryConfig(source=source, url=url, timeout_s=timeout)

    def elements(self, raw: dict[str, Any], kind: str) -> list[tuple[_Path, dict[str, Any], str | None]]:
        """(location, table, name from the table key or None) for each [[kind]] / [kind.NAME] element."""
        value = raw.get(kind)
        if value is None:
            return []
        if isinstance(value, list):
            out = []
            for i, t in enumerate(value):
                if not isinstance(t, dict):
                    self.fail((kind, i), f"must be a table ([[{kind}]] with keys below it), got {_got(t)}")
                out.append(((kind, i), t, None))
            return out
        if isinstance(value, dict):
            out = []
            for name, t in value.items():
                if not isinstance(t, dict):
                    self.fail(
                        (kind, name),
                        f"must be a table [{kind}.NAME] naming the {kind}, got {_got(t)} "
                        f"(for one {kind} per block, write [[{kind}]] and name = ...)",
                    )
                out.append(((kind, name), t, name))
            return out
        self.fail((kind,), f"must be [[{kind}]] tables or [{kind}.NAME] tables, got {_got(value)}")

    def name(self, loc: _Path, table: dict[str, Any], key_name: str | None, kind: str) -> str:
        if key_name is not None:
            if "name" in table and table["name"] != key_name:
                self.fail(
                    loc + ("name",),
                    f"the {kind}'s name is its table key {key_name!r}; remove 'name' or make it equal",
                )
            name, name_loc = key_name, loc
        else:
            if "name" not in table:
                self.fail(loc, f"missing required key 'name' in [[{kind}]]")
            name, name_loc = self.string(loc + ("name",), table["name"], shown=True), loc + ("name",)
        if not name:
            self.fail(name_loc, "name must not be empty")
        if name != name.strip() or any(not ch.isprintable() for ch in name):
            self.fail(name_loc, f"name {name!r} must not start or end with spaces or hold control characters")
        return name

    def department(self, loc: _Path, t: dict[str, Any], key_name: str | None) -> DepartmentConfig:
        section = "[[department]]" if key_name is None else f"[{_display_path(loc)}]"
        self.check_keys(loc, t, _DEPT_KEYS, section)
        name = self.name(loc, t, key_name, "department")
        if name_key(name) == UNASSIGNED:
            self.fail(
                loc + ("name",) if key_name is None else loc,
                f"{UNASSIGNED!r} is reserved for slices given to no department; choose another name",
            )
        kwargs: dict[str, Any] = {}
        if "priority" in t:
            kwargs["priority"] = self.attempt(self.integer, loc + ("priority",), t["priority"], 0, None)
        if "color" in t:
            kwargs["color"] = self.attempt(self.color, loc + ("color",), t["color"])
        return DepartmentConfig(name=name, source=Location(self.path, self.line(loc)),
                                **{k: v for k, v in kwargs.items() if v is not None})

    def color(self, loc: _Path, value: Any) -> str:
        color = self.string(loc, value, shown=True)
        if color.startswith("#"):
            if not _HEX_COLOR.fullmatch(color):
                self.fail(loc, f"must be a hex color '#rrggbb', got {color!r}")
        elif not _COLOR_NAME.fullmatch(color):
            self.fail(loc, f"must be '#rrggbb' or a color name like 'dodgerblue', got {color!r}")
        why = self.checks.color(color) if self.checks.color else None
        if why:
            self.fail(loc, why)
        return color

    def node(self, loc: _Path, t: dict[str, Any], key_name: str | None) -> NodeConfig:
        section = "[[node]]" if key_name is None else f"[{_display_path(loc)}]"
        self.check_keys(loc, t, _NODE_KEYS, section)
        name = self.name(loc, t, key_name, "node")
        if any(ch.isspace() for ch in name):
            self.fail(loc + ("name",) if key_name is None else loc, f"node name {name!r} must not contain spaces")
        kwargs: dict[str, Any] = {}
        transport = "ssh"
        if "transport" in t:
            transport = t["transport"]
            if transport not in TRANSPORTS:
                self.fail(loc + ("transport",), f"must be 'ssh' or 'local', got {_got(transport)}")
            kwargs["transport"] = transport
        for key in ("host", "user", "identity_file", "socket", "gpuctld"):
            if key in t:
                kwargs[key] = self.attempt(self.string, loc + (key,), t[key])
        if "port" in t:
            kwargs["port"] = self.attempt(self.integer, loc + ("port",), t["port"], 1, 65535)
        if "timeout_s" in t:
            kwargs["timeout_s"] = self.attempt(self.seconds, loc + ("timeout_s",), t["timeout_s"])
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if transport == "ssh" and "host" not in t and not any(
                suggest_key(k, _NODE_KEYS) == "host" for k in t if k not in _NODE_KEYS):  # said once, as a typo
            self.fail(loc, f"missing required key 'host' in {section} (transport 'ssh' needs the SSH host)")
        if transport == "local":
            if "socket" not in t:
                self.fail(
                    loc,
                    f"missing required key 'socket' in {section} "
                    "(transport 'local' needs the path of gpuctld's Unix socket)",
                )
            for key in _SSH_ONLY:
                if key in t:
                    self.fail(loc + (key,), "is only used with transport 'ssh' (this node's transport is 'local')")
        host = kwargs.pop("host", None)
        return NodeConfig(name=name, host=host, source=Location(self.path, self.line(loc)), **kwargs)

    def no_duplicates(self, kind: str, items: tuple[NodeConfig, ...] | tuple[DepartmentConfig, ...]) -> None:
        first: dict[str, tuple[str, Location | None]] = {}
        for item in items:
            key = name_key(item.name)
            if key in first:
                other, where = first[key]
                same = ("" if other == item.name else f" (as {ascii(other)} and {ascii(item.name)}: names differing "
                                                    f"only in case or Unicode form are one name)")
                self.errors.append(ConfigError(
                    self.path,
                    f"{kind} {item.name!r} is defined twice{same} (first at {where})",
                    line=item.source.line if item.source else None,
                ))
                continue
            first[key] = (item.name, item.source)
