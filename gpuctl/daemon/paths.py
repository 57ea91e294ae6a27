"""Where gpuctld's control socket lives: one rule shared by the daemon, the bridge and the CLI.

Stdlib only, so the bridge (which runs once per SSH channel) starts fast.
"""

from __future__ import annotations

import os

#: The socket of the system daemon (systemd unit, running as root).
SYSTEM_SOCKET_PATH = "/run/gpuctld/gpuctld.sock"

#: Environment variable that overrides the default socket path (tests, unusual layouts).
SOCKET_ENV = "GPUCTLD_SOCKET"


def default_socket_path() -> str:
    """The control socket path gpuctld listens on when no ``--socket`` is given.

    Rule, first match wins: ``$GPUCTLD_SOCKET`` if set and non-empty; ``/run/gpuctld/gpuctld.sock``
    when running as root (euid 0); else ``$XDG_RUNTIME_DIR/gpuctld.sock``; else (no
    XDG_RUNTIME_DIR, e.g. an SSH session without pam_systemd) ``/run/user/<uid>/gpuctld.sock``,
    which is where systemd puts XDG_RUNTIME_DIR. Returns an absolute path; raises nothing.
    """
    override = os.environ.get(SOCKET_ENV)
    if override:
        return os.path.abspath(override)
    if os.geteuid() == 0:
        return SYSTEM_SOCKET_PATH
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return os.path.join(runtime_dir, "gpuctld.sock")


def socket_candidates() -> list[str]:
    """Socket paths a client without ``--socket`` should try, in order (no duplicates).

    :func:`default_socket_path` first, then the system daemon's :data:`SYSTEM_SOCKET_PATH`: an
    ordinary admin account reaching the node's root daemon over SSH has its own default (under
    XDG_RUNTIME_DIR) but must find the system socket.
    """
    first = default_socket_path()
    return [first] if first == SYSTEM_SOCKET_PATH else [first, SYSTEM_SOCKET_PATH]
