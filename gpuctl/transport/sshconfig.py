"""Resolve a host name through an ssh config file the way OpenSSH's ``ssh -G`` does.

gpuctl reads the config itself (paramiko's SSHConfig raises on valid lines such as
``Match final all`` and treats Match criteria it does not know as matching). The rules followed
are OpenSSH's (readconf.c, ssh.c of OpenSSH 9.x; checked against ``ssh -G`` by
tests/integration/test_sshconfig_match.py):

- Lines are ``Keyword args`` or ``Keyword=args``; keywords are case-insensitive; ``#`` starts a
  comment; arguments may be quoted. For each option the first value obtained wins; IdentityFile
  accumulates (duplicates dropped).
- ``Host pattern...``: the block applies when the host name matches a pattern (``*``, ``?``) and
  no ``!pattern`` matches. Patterns compare case-sensitively with the name as given.
- ``Match criteria...``: all criteria must hold. ``all`` (alone, or right after ``canonical`` /
  ``final``), ``canonical``, ``final``, ``host``, ``originalhost``, ``user``, ``localuser``,
  ``exec``, each negatable with ``!``; arguments are comma-separated pattern lists where
  ``!pattern`` vetoes. ``host`` sees the HostName found so far (``%h`` expanded), ``user`` the
  User found so far (else the local user). ``exec`` runs the command with ``$SHELL -c`` (stdin
  and stdout on /dev/null), only when the criteria before it held, and matches on exit status 0.
- A config with a ``Match final`` line is read twice, as ssh does: the second ("final") pass
  keeps every value of the first, matches Host lines and ``Match host`` against the resolved
  (lower-cased) host name, and makes ``final`` and ``canonical`` true.
- ``Include``: files (globbed, sorted; relative to ~/.ssh) are read in place with the including
  block's state; a Host/Match inside them never leaks out; inside a block that does not apply,
  their blocks never apply. Nesting deeper than 16 is an error.

Errors name the file and line (:class:`SshConfigError`). As with ``ssh -G``, a bad line is an
error for every host, whether or not its block applies: a line with no argument, bad quotes, a
Port that is not a port, a ProxyJump that does not parse, a yes/no option that is neither, a
Match criterion that is unknown or cannot be evaluated by gpuctl (``localnetwork``, ``tagged``,
anything newer), a Match line without criteria or with ``all`` combined. A criterion is never
treated as matching when it cannot be evaluated. ``Match exec`` that cannot run or runs longer
than :data:`EXEC_TIMEOUT_S` is an error naming its line. ``CanonicalizeHostname yes|always``
for the host is refused (gpuctl does no DNS canonicalisation; set HostName instead). Keywords
gpuctl does not use are skipped, not checked (ssh -G would reject a misspelt one).
"""

from __future__ import annotations

import fnmatch
import getpass
import glob
import hashlib
import os
import pwd
import re
import socket
import subprocess
from dataclasses import dataclass, field

from gpuctl.transport.filememo import FileMemo

#: OpenSSH's READCONF_MAX_DEPTH: deeper Include nesting is an error (usually a loop).
MAX_INCLUDE_DEPTH = 16

#: How long one ``Match exec`` command may run before the config is refused (seconds).
EXEC_TIMEOUT_S = 10.0

#: The identity files ssh tries when the config names none (used only where they exist).
DEFAULT_IDENTITY_FILES = (
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_dsa",
)

#: Match criteria gpuctl evaluates (OpenSSH 9.x names); any other is refused with file:line.
MATCH_CRITERIA = ("all", "canonical", "final", "host", "originalhost", "user", "localuser", "exec")

_FLAG_VALUES = {"yes": True, "true": True, "no": False, "false": False}
_FLAGS = ("identitiesonly",)
_WHITESPACE = " \t\r\n\f"


class SshConfigError(Exception):
    """An ssh config file could not be used; str() names the file and line."""


@dataclass(frozen=True)
class SshHost:
    """Where and how to connect to one host, after the ssh config and explicit overrides.

    alias: the name looked up. hostname: the address to connect to (HostName, else alias).
    port: TCP port. user: login name. identity_files: expanded paths in the order ssh tries them.
    identity_files_given: True when they come from the config or an explicit override (a missing
    one is then reported), False for ssh's defaults (missing ones are skipped quietly).
    identities_only: IdentitiesOnly (use only these files, and only the agent keys matching
    them). proxy_jump: hops ("[user@]host[:port]") to pass through, in order; () for none.
    proxy_command: ProxyCommand with tokens expanded, or None. host_key_alias: HostKeyAlias or None.
    server_alive_interval_s: ServerAliveInterval in seconds (None: not set). connect_timeout_s:
    ConnectTimeout in seconds, or None.
    """

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identity_files_given: bool
    identities_only: bool
    proxy_jump: tuple[str, ...]
    proxy_command: str | None
    host_key_alias: str | None
    server_alive_interval_s: float | None
    connect_timeout_s: float | None

    @property
    def address(self) -> str:
        """``host:port`` as used in messages (IPv6 literals bracketed)."""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{self.port}"


# ---- parsing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    """One directive: `keyword` (lower case), its arguments, and the raw text after the keyword."""

    path: str
    lineno: int
    keyword: str
    args: tuple[str, ...]
    rest: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"

    @property
    def raw_value(self) -> str:
        """The text after the keyword up to a ``#``, quotes kept (how ssh reads ProxyJump)."""
        return self.rest.split("#", 1)[0].rstrip(_WHITESPACE)


@dataclass(frozen=True)
class _Include:
    """An Include line and the files it read (each parsed), in glob order."""

    line: _Line
    files: tuple[_File, ...]


@dataclass(frozen=True)
class _File:
    path: str
    items: tuple[_Line | _Include, ...]


def _split_args(text: str, where: str) -> list[str]:
    """OpenSSH's argv_split: whitespace-separated words, quotes group, ``#`` at a word start ends
    the line, backslash escapes a quote, a backslash or (unquoted) a space. Raises on open quotes."""
    args: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n or text[i] == "#":
            break
        word: list[str] = []
        quote = ""
        while i < n:
            c = text[i]
            if c == "\\" and i + 1 < n and (text[i + 1] in "'\"\\" or (not quote and text[i + 1] == " ")):
                word.append(text[i + 1])
                i += 2
                continue
            if quote:
                if c == quote:
                    quote = ""
                else:
                    word.append(c)
            elif c in "'\"":
                quote = c
            elif c in _WHITESPACE:
                break
            else:
                word.append(c)
            i += 1
        if quote:
            raise SshConfigError(f"{where}: invalid quotes")
        args.append("".join(word))
    return args


_KEYWORD = re.compile(r"[ \t]*(?P<key>[^ \t=]+)(?:[ \t]*=[ \t]*|[ \t]+|$)")


def _parse_file(path: str, include_dir: str, depth: int) -> _File:
    if depth > MAX_INCLUDE_DEPTH:
        raise SshConfigError(f"{path}: Include nested deeper than {MAX_INCLUDE_DEPTH} levels (a loop?)")
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    items: list[_Line | _Include] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = f"{path}:{lineno}"
        stripped = raw.strip(_WHITESPACE)
        if not stripped or stripped.startswith("#"):
            continue
        m = _KEYWORD.match(stripped)
        if m is None:  # a line starting with "=": no keyword
            raise SshConfigError(f"{where}: no keyword before {stripped!r}")
        keyword = m.group("key").lower()
        rest = stripped[m.end():].strip(_WHITESPACE)
        if not rest:
            raise SshConfigError(f"{where}: no argument after keyword {m.group('key')!r}")
        line = _Line(path, lineno, keyword, tuple(_split_args(rest, where)), rest)
        _check_line(line)
        if keyword == "include":
            items.append(_Include(line, _read_includes(line, include_dir, depth)))
        else:
            items.append(line)
    return _File(path, tuple(items))


def _read_includes(line: _Line, include_dir: str, depth: int) -> tuple[_File, ...]:
    files: list[_File] = []
    for pattern in line.args:
        pattern = os.path.expanduser(pattern)
        if not os.path.isabs(pattern):
            pattern = os.path.join(include_dir, pattern)
        for included in sorted(glob.glob(pattern)):
            if os.path.isdir(included):
                continue
            try:
                files.append(_parse_file(included, include_dir, depth + 1))
            except SshConfigError as exc:
                raise SshConfigError(f"{exc}\n  included from {line.where}") from exc
            except OSError as exc:
                raise SshConfigError(f"{line.where}: cannot read included {included}: {exc.strerror}") from exc
    return tuple(files)


def _parse_port(value: object, where: str) -> int:
    text = str(value)
    if not text.isdigit():
        raise SshConfigError(f"{where}: Port {value!r} is not a number")
    port = int(text)
    if not 0 < port < 65536:
        raise SshConfigError(f"{where}: Port {port} is out of range 1-65535")
    return port


def _check_line(line: _Line) -> None:
    """Refuse a line ssh -G refuses whether or not its block applies (for the keywords gpuctl uses)."""
    k, args, where = line.keyword, line.args, line.where
    if not args and k not in ("proxycommand",):
        raise SshConfigError(f"{where}: no argument after keyword {k!r}")
    if k == "port":
        _parse_port(args[0], where)
    elif k in _FLAGS and args[0].lower() not in _FLAG_VALUES:
        raise SshConfigError(f"{where}: {k} must be yes or no, got {args[0]!r}")
    elif k == "proxyjump" and line.raw_value.lower() != "none":
        for hop in line.raw_value.split(","):
            try:
                parse_jump(hop)
            except SshConfigError as exc:
                raise SshConfigError(f"{where}: invalid ProxyJump: {exc}") from None
    elif k == "match":
        _parse_match(line)


@dataclass(frozen=True)
class _Criterion:
    name: str
    negate: bool
    arg: str | None


def _parse_match(line: _Line) -> tuple[_Criterion, ...]:
    """The criteria of a Match line, checked as OpenSSH's match_cfg_line does; raises naming the line."""
    out: list[_Criterion] = []
    args = list(line.args)
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        negate = token.startswith("!")
        name = token[1:].lower() if negate else token.lower()
        if name == "all":
            if len(out) > 1 or i < len(args):
                raise SshConfigError(f"{line.where}: Match '{token}' cannot be combined with other Match criteria "
                                     f"(only 'canonical' or 'final' may come before it)")
            out.append(_Criterion("all", negate, None))
            break
        if name in ("canonical", "final"):
            out.append(_Criterion(name, negate, None))
            continue
        if name not in MATCH_CRITERIA:
            raise SshConfigError(f"{line.where}: Match criterion {token!r} cannot be evaluated by gpuctl "
                                 f"(it knows {', '.join(MATCH_CRITERIA)}); the block is refused, never "
                                 f"treated as matching")
        if i >= len(args):
            raise SshConfigError(f"{line.where}: Match {token} needs an argument")
        out.append(_Criterion(name, negate, args[i]))
        i += 1
    if not out:
        raise SshConfigError(f"{line.where}: Match needs one or more criteria")
    return tuple(out)


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """One ProxyJump hop ``[user@]host[:port]`` (or ``ssh://[user@]host[:port]``) -> (user, host, port).

    IPv6 literals may be bracketed (``[::1]:2222``). Raises SshConfigError for an empty host or a
    port that is not a number.
    """
    s = spec.strip()
    s = s.removeprefix("ssh://")
    user, _, hostport = s.rpartition("@")
    port: int | None = None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":"):
            port = _parse_port(rest[1:], f"ProxyJump {spec!r}")
    elif hostport.count(":") == 1:
        host, _, p = hostport.partition(":")
        port = _parse_port(p, f"ProxyJump {spec!r}")
    else:
        host = hostport
    if not host:
        raise SshConfigError(f"ProxyJump {spec!r}: no host name")
    return (user or None), host, port


# ---- matching ---------------------------------------------------------------------------------


def _match_pattern(string: str, pattern: str) -> bool:
    """OpenSSH's match_pattern: ``*`` and ``?`` wildcards, the rest literal, case-sensitive."""
    return fnmatch.fnmatchcase(string, pattern.replace("[", "[[]"))


def _match_pattern_list(string: str, patterns: str, lower: bool) -> int:
    """OpenSSH's match_pattern_list: 1 if a pattern matches and no ``!pattern`` does, -1 if a
    ``!pattern`` matches, 0 otherwise (a list of only negations never matches)."""
    positive = 0
    for sub in patterns.split(","):
        negated = sub.startswith("!")
        if negated:
            sub = sub[1:]
        if lower:
            sub = sub.lower()
        if _match_pattern(string, sub):
            if negated:
                return -1
            positive = 1
    return positive


def _local_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return getpass.getuser()


def _home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


@dataclass
class _Setting:
    value: str
    where: str


@dataclass
class _Lookup:
    """The state of one resolution: options found so far (first wins) and the names matched."""

    host_arg: str
    host: str  # the name Host lines are matched against (the resolved host name in the final pass)
    final: bool = False
    options: dict[str, _Setting] = field(default_factory=dict)
    identity_files: list[_Setting] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        s = self.options.get(key)
        return s.value if s else None


def _percent_expand(text: str, tokens: dict[str, str], where: str, what: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(text):
            raise SshConfigError(f"{where}: {what}: '%' at the end of {text!r}")
        t = text[i + 1]
        if t == "%":
            out.append("%")
        elif t in tokens:
            out.append(tokens[t])
        else:
            raise SshConfigError(f"{where}: {what}: unknown token %{t} in {text!r}")
        i += 2
    return "".join(out)


class SshConfig:
    """One parsed ssh config file (Includes read), ready for :meth:`lookup` (or :func:`resolve_host`).

    Build with :func:`load_config`. Holds no state between lookups; safe to share between threads.
    """

    def __init__(self, root: _File | None):
        self._root = root
        self.has_match_final = root is not None and any(
            c.name == "final" for line in self._lines(root) if line.keyword == "match" for c in _parse_match(line)
        )

    @classmethod
    def empty(cls) -> SshConfig:
        """A config with no lines (every host resolves to itself, port 22, the local user)."""
        return cls(None)

    def _lines(self, f: _File):
        for item in f.items:
            if isinstance(item, _Include):
                yield item.line
                for g in item.files:
                    yield from self._lines(g)
            else:
                yield item

    # -- one pass

    def _walk(self, f: _File, st: _Lookup, active: bool, nevermatch: bool) -> bool:
        for item in f.items:
            if isinstance(item, _Include):
                outer = active
                for g in item.files:
                    self._walk(g, st, outer, nevermatch or not outer)
                active = outer
                continue
            k = item.keyword
            if k == "host":
                active = False if nevermatch else self._host_line(item, st)
            elif k == "match":
                result = self._match_line(item, st)
                active = False if nevermatch else result
            elif active:
                self._apply(item, st)
        return active

    @staticmethod
    def _host_line(line: _Line, st: _Lookup) -> bool:
        matched = False
        for pattern in line.args:
            negated = pattern.startswith("!")
            if _match_pattern(st.host, pattern[1:] if negated else pattern):
                if negated:
                    return False
                matched = True
        return matched

    def _match_host(self, st: _Lookup) -> str:
        """The host name ``Match host`` and ``%h`` see: HostName so far (``%h`` expanded), else the
        name given; in the final pass the resolved host name."""
        if st.final:
            return st.get("hostname") or st.host
        return self.options_hostname(st)

    @staticmethod
    def options_hostname(st: _Lookup) -> str:
        s = st.options.get("hostname")
        if s is None:
            return st.host_arg
        return _percent_expand(s.value, {"h": st.host_arg}, s.where, "HostName")

    def _match_line(self, line: _Line, st: _Lookup) -> bool:
        result = True
        for c in _parse_match(line):
            if c.name == "all":
                return (not c.negate) if result else False
            if c.name in ("canonical", "final"):
                hit = st.final
            elif c.name == "host":
                hit = _match_pattern_list(self._match_host(st).lower(), c.arg or "", True) == 1
            elif c.name == "originalhost":
                hit = _match_pattern_list(st.host_arg.lower(), c.arg or "", True) == 1
            elif c.name == "user":
                hit = _match_pattern_list(st.get("user") or _local_user(), c.arg or "", False) == 1
            elif c.name == "localuser":
                hit = _match_pattern_list(_local_user(), c.arg or "", False) == 1
            else:  # exec
                if not result:
                    continue  # skipped when a criterion before it failed, as ssh does
                hit = self._exec(line, c.arg or "", st)
            if hit == c.negate:
                result = False
        return result

    def _exec(self, line: _Line, command: str, st: _Lookup) -> bool:
        host = self._match_host(st)
        cmd = _percent_expand(command, self._tokens(st, host), line.where, "Match exec")
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            done = subprocess.run([shell, "-c", cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=EXEC_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise SshConfigError(f"{line.where}: Match exec {cmd!r} did not finish in {EXEC_TIMEOUT_S:g} s; "
                                 f"the block is refused, never treated as matching") from None
        except OSError as exc:
            raise SshConfigError(f"{line.where}: Match exec {cmd!r} could not run ({shell}: {exc.strerror})") from None
        return done.returncode == 0

    @staticmethod
    def _tokens(st: _Lookup, host: str) -> dict[str, str]:
        """ssh's %-tokens for Match exec, IdentityFile and ProxyCommand (OpenSSH 9.x names)."""
        thishost = socket.gethostname()
        port = st.get("port") or "22"
        ruser = st.get("user") or _local_user()
        return {
            "C": hashlib.sha1(f"{thishost}{host}{port}{ruser}".encode()).hexdigest(),
            "L": thishost.split(".")[0],
            "d": _home(),
            "h": host,
            "k": st.get("hostkeyalias") or host,
            "l": thishost,
            "n": st.host_arg,
            "p": port,
            "r": ruser,
            "u": _local_user(),
            "i": str(os.getuid()),
        }

    @staticmethod
    def _apply(line: _Line, st: _Lookup) -> None:
        k, value, where = line.keyword, line.args[0] if line.args else "", line.where
        if k == "identityfile":
            if all(s.value != value for s in st.identity_files):
                st.identity_files.append(_Setting(value, where))
            return
        if k == "proxyjump":
            value = line.raw_value
            if "proxyjump" in st.options or "proxycommand" in st.options:
                return
            st.options["proxyjump"] = _Setting(value, where)
            if value.lower() != "none":
                st.options["proxycommand"] = _Setting("none", where)
            return
        if k == "proxycommand":
            if "proxyjump" not in st.options and "proxycommand" not in st.options:
                st.options["proxycommand"] = _Setting(line.rest, where)
            return
        if k in ("hostname", "user", "port", "identitiesonly", "hostkeyalias", "serveraliveinterval",
                 "connecttimeout", "canonicalizehostname") and k not in st.options:
            st.options[k] = _Setting(value, where)

    # -- resolution

    def lookup(self, alias: str, *, user: str | None = None, port: int | None = None) -> _Lookup:
        """The options that apply to `alias`, after both passes where the config asks for a final one.

        user/port: given on the command line (they win, and ``Match user`` / ``%p`` see them).
        Raises SshConfigError naming file:line.
        """
        st = _Lookup(host_arg=alias, host=alias)
        if user:
            st.options["user"] = _Setting(user, "the node's user")
        if port is not None:
            st.options["port"] = _Setting(str(port), "the node's port")
        if self._root is None:
            st.options["hostname"] = _Setting(alias.lower(), "the name given")
            return st
        self._walk(self._root, st, True, False)
        canon = st.options.get("canonicalizehostname")
        if canon is not None and canon.value.lower() not in ("no", "false"):
            raise SshConfigError(f"{canon.where}: CanonicalizeHostname {canon.value} cannot be evaluated by gpuctl "
                                 f"(no DNS canonicalisation); set HostName for this host instead")
        host = self.options_hostname(st).lower()
        st.options["hostname"] = _Setting(host, st.options["hostname"].where if "hostname" in st.options else "the name given")
        if self.has_match_final:
            st.host, st.final = host, True
            self._walk(self._root, st, True, False)
        return st


def load_config(config_path: str | None = None, *, include_dir: str | None = None) -> SshConfig:
    """The ssh config `config_path` (default ~/.ssh/config), Includes read.

    include_dir: where relative Include paths are looked up (default ~/.ssh, as OpenSSH does for
    user configs). A missing default file gives an empty config; a missing explicit `config_path`
    raises SshConfigError naming it (like ``ssh -F``). Raises SshConfigError naming file:line for a
    line ssh would refuse (see the module docstring).
    """
    path = os.path.expanduser(config_path or "~/.ssh/config")
    if not os.path.exists(path):
        if config_path is not None:
            raise SshConfigError(f"ssh config {path} does not exist")
        return SshConfig.empty()
    base = os.path.expanduser(include_dir or "~/.ssh")

    def parse() -> tuple[SshConfig, list[str] | None]:
        try:
            root = _parse_file(path, base, 0)
        except OSError as exc:
            raise SshConfigError(f"cannot read ssh config {path}: {exc.strerror}") from exc
        return SshConfig(root), _depends_on(root, base)

    return _PARSED.get((path, base), parse)


#: Parsed configs of this process, read again when a file they came from changes (gpuctl.transport.filememo).
_PARSED: FileMemo[SshConfig] = FileMemo()


def _depends_on(f: _File, include_dir: str) -> list[str] | None:
    """The files `f` was read from (Includes too) and the directories its Include patterns glob in
    (a file added there changes the directory's mtime); None (never remembered) when a pattern
    globs in a directory name, whose new subdirectories no one stat watches."""
    out = [f.path]
    for item in f.items:
        if isinstance(item, _Include):
            for pattern in item.line.args:
                pattern = os.path.expanduser(pattern)
                full = pattern if os.path.isabs(pattern) else os.path.join(include_dir, pattern)
                directory = os.path.dirname(full)
                if re.search(r"[*?[]", directory):
                    return None
                out.append(directory)
            for g in item.files:
                more = _depends_on(g, include_dir)
                if more is None:
                    return None
                out += more
    return out


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def resolve_host(
    alias: str,
    *,
    config: SshConfig | None = None,
    config_path: str | None = None,
    include_dir: str | None = None,
    user: str | None = None,
    port: int | None = None,
    identity_file: str | None = None,
) -> SshHost:
    """Resolve `alias` like ``ssh -G alias``; explicit user/port/identity_file override the config.

    config: an already loaded config (else loaded from `config_path`, default ~/.ssh/config, with
    Includes relative to `include_dir`, default ~/.ssh). Raises SshConfigError naming file:line
    for an unusable config (see the module docstring).
    """
    if config is None:
        config = load_config(config_path, include_dir=include_dir)
    st = config.lookup(alias, user=user, port=port)
    hostname = st.get("hostname") or alias.lower()
    port_value = int(st.get("port") or 22)
    login = st.get("user") or _local_user()
    tokens = SshConfig._tokens(st, hostname)
    if identity_file:
        files, given = (os.path.expanduser(identity_file),), True
    elif st.identity_files:
        files = tuple(os.path.expanduser(_percent_expand(s.value, tokens, s.where, "IdentityFile"))
                      for s in st.identity_files)
        given = True
    else:
        files, given = tuple(os.path.expanduser(p) for p in DEFAULT_IDENTITY_FILES), False
    jump = st.get("proxyjump")
    hops = () if not jump or jump.lower() == "none" else tuple(h.strip() for h in jump.split(",") if h.strip())
    command = st.options.get("proxycommand")
    proxy_command = None
    if command is not None and command.value.lower() != "none":
        proxy_command = _percent_expand(command.value, tokens, command.where, "ProxyCommand")
    return SshHost(
        alias=alias,
        hostname=hostname,
        port=port_value,
        user=login,
        identity_files=files,
        identity_files_given=given,
        identities_only=_FLAG_VALUES.get((st.get("identitiesonly") or "no").lower(), False),
        proxy_jump=hops,
        proxy_command=proxy_command,
        host_key_alias=st.get("hostkeyalias"),
        server_alive_interval_s=_seconds(st.get("serveraliveinterval")),
        connect_timeout_s=_seconds(st.get("connecttimeout")),
    )
