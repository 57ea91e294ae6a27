"""Resolve a host name through ~/.ssh/config the way `ssh -G` does, Include directives included.

paramiko.SSHConfig does the matching (Host/Match blocks, first value wins, %h/~ tokens) but does
not follow ``Include``; :func:`expand_includes` inlines included files first, with OpenSSH's rules:
relative paths are taken relative to ~/.ssh (for a user config), patterns are globbed and sorted,
a pattern matching nothing is ignored, and includes nest up to 16 levels.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass

import paramiko

#: OpenSSH's READCONF_MAX_DEPTH: deeper Include nesting is an error (usually a loop).
MAX_INCLUDE_DEPTH = 16

#: The identity files ssh tries when the config names none (used only where they exist).
DEFAULT_IDENTITY_FILES = (
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_dsa",
)

_LINE = re.compile(r"^\s*(?P<key>[A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(?P<value>.*?)\s*$")


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


def _block_header(key: str) -> bool:
    return key.lower() in ("host", "match")


def expand_includes(path: str, *, include_dir: str | None = None, _depth: int = 0) -> str:
    """The text of ssh config `path` with every ``Include`` replaced by the included files' text.

    include_dir: where relative Include paths are looked up (default ~/.ssh, as OpenSSH does for
    user configs). An Include inside a Host/Match block applies only there: when an included file
    opens blocks of its own, the enclosing block's header is repeated after it (``Host *`` at top
    level) so later lines keep their meaning. Raises SshConfigError naming file:line for a nesting
    deeper than :data:`MAX_INCLUDE_DEPTH` or an unparsable Include line; OSError if `path` itself
    cannot be read.
    """
    if _depth > MAX_INCLUDE_DEPTH:
        raise SshConfigError(f"{path}: Include nested deeper than {MAX_INCLUDE_DEPTH} levels (a loop?)")
    base = os.path.expanduser(include_dir or "~/.ssh")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    out: list[str] = []
    header = "Host *"
    for lineno, line in enumerate(lines, 1):
        m = _LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            out.append(line)
            continue
        key, value = m.group("key"), m.group("value")
        if _block_header(key):
            header = line.strip()
            out.append(line)
            continue
        if key.lower() != "include":
            out.append(line)
            continue
        try:
            patterns = shlex.split(value)
        except ValueError as exc:
            raise SshConfigError(f"{path}:{lineno}: bad Include line: {exc}") from exc
        out.append(f"# {line.strip()}  (expanded by gpuctl)")
        opened_block = False
        for pattern in patterns:
            pattern = os.path.expanduser(pattern)
            if not os.path.isabs(pattern):
                pattern = os.path.join(base, pattern)
            for included in sorted(glob.glob(pattern)):
                if os.path.isdir(included):
                    continue
                try:
                    text = expand_includes(included, include_dir=include_dir, _depth=_depth + 1)
                except SshConfigError as exc:
                    raise SshConfigError(f"{exc}\n  included from {path}:{lineno}") from exc
                except OSError as exc:
                    raise SshConfigError(f"{path}:{lineno}: cannot read included {included}: {exc.strerror}") from exc
                out.append(text)
                opened_block = opened_block or any(
                    (mm := _LINE.match(t)) is not None and _block_header(mm.group("key")) for t in text.splitlines()
                )
        if opened_block:
            out.append(header)
    return "\n".join(out)


def _parse_port(value: object, where: str) -> int:
    try:
        port = int(str(value))
    except ValueError:
        raise SshConfigError(f"{where}: Port {value!r} is not a number") from None
    if not 0 < port < 65536:
        raise SshConfigError(f"{where}: Port {port} is out of range 1-65535")
    return port


def _seconds(value: object) -> float | None:
    try:
        return float(str(value))
    except (TypeError, ValueError):
        return None


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """One ProxyJump hop ``[user@]host[:port]`` (or ``ssh://[user@]host[:port]``) -> (user, host, port).

    IPv6 literals may be bracketed (``[::1]:2222``). Raises SshConfigError for an empty host or a
    port that is not a number.
    """
    s = spec.strip()
    if s.startswith("ssh://"):
        s = s[len("ssh://") :]
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


def load_config(config_path: str | None = None, *, include_dir: str | None = None) -> paramiko.SSHConfig:
    """paramiko.SSHConfig of `config_path` (default ~/.ssh/config) with Includes followed.

    A missing default file gives an empty config; a missing explicit `config_path` raises
    SshConfigError naming it (like ``ssh -F``).
    """
    path = os.path.expanduser(config_path or "~/.ssh/config")
    if not os.path.exists(path):
        if config_path is not None:
            raise SshConfigError(f"ssh config {path} does not exist")
        return paramiko.SSHConfig()
    try:
        text = expand_includes(path, include_dir=include_dir)
    except OSError as exc:
        raise SshConfigError(f"cannot read ssh config {path}: {exc.strerror}") from exc
    return paramiko.SSHConfig.from_text(text)


def resolve_host(
    alias: str,
    *,
    config: paramiko.SSHConfig | None = None,
    config_path: str | None = None,
    include_dir: str | None = None,
    user: str | None = None,
    port: int | None = None,
    identity_file: str | None = None,
) -> SshHost:
    """Resolve `alias` like ``ssh -G alias``; explicit user/port/identity_file override the config.

    config: an already loaded config (else loaded from `config_path`, default ~/.ssh/config, with
    Includes relative to `include_dir`, default ~/.ssh). Raises SshConfigError for an unusable
    config (bad Port value, unreadable included file, Include loop).
    """
    if config is None:
        config = load_config(config_path, include_dir=include_dir)
    try:
        found = config.lookup(alias)
    except Exception as exc:  # paramiko raises several types for bad Match/token lines
        raise SshConfigError(f"ssh config: cannot resolve host {alias}: {exc}") from exc
    where = f"ssh config for host {alias}"
    hostname = found.get("hostname", alias)
    port_value = port if port is not None else _parse_port(found.get("port", 22), where)
    login = user or found.get("user") or getpass.getuser()
    if identity_file:
        files, given = (os.path.expanduser(identity_file),), True
    elif found.get("identityfile"):
        files, given = tuple(os.path.expanduser(p) for p in found["identityfile"]), True
    else:
        files, given = tuple(os.path.expanduser(p) for p in DEFAULT_IDENTITY_FILES), False
    jump = found.get("proxyjump")
    hops = () if not jump or jump.strip().lower() == "none" else tuple(h.strip() for h in jump.split(",") if h.strip())
    for hop in hops:
        parse_jump(hop)  # validate now, so a bad hop is reported as a config problem
    proxy_command = found.get("proxycommand")
    if proxy_command and proxy_command.strip().lower() == "none":
        proxy_command = None
    return SshHost(
        alias=alias,
        hostname=hostname,
        port=port_value,
        user=login,
        identity_files=files,
        identity_files_given=given,
        identities_only=str(found.get("identitiesonly", "no")).lower() == "yes",
        proxy_jump=hops,
        proxy_command=proxy_command,
        host_key_alias=found.get("hostkeyalias"),
        server_alive_interval_s=_seconds(found.get("serveraliveinterval")),
        connect_timeout_s=_seconds(found.get("connecttimeout")),
    )
