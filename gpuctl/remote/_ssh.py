"""The data path through the node's SSH connection, for networks that are not trusted.

The client opens a ``direct-tcpip`` channel over an SSH connection to the node (paramiko) to the
worker's endpoint as the node sees it (by default the worker listens on the node's loopback,
127.0.0.1, which nothing outside the node can reach), and speaks the same frames inside it: the
node's sshd authenticates both ends and encrypts; the lease token is still checked by the worker.

Two ways in:

* ``GPUCTL_ATTACH=ssh://[USER@]NODE[:SSHPORT]/HOST:PORT?lease=ID&token=HEX[&known_hosts=PATH]
  [&identity=PATH]``: this module opens the SSH connection itself with paramiko's SSHClient:
  host keys from the system and ``known_hosts`` (default ``~/.ssh/known_hosts``); an unknown or
  changed host key is refused (never trusted on first use); keys from ``identity``, else the
  ssh-agent and ``~/.ssh/id_*``. ~/.ssh/config (ProxyJump, aliases) is not read on this path.
* ``gpuctl.remote.attach(url, ssh=transport)``: an SSH connection the caller already holds (a
  ``paramiko.Transport`` or ``paramiko.SSHClient``, e.g. the one the fleet client uses to reach
  gpuctld); it stays the caller's (closing the data path closes only its channel).
"""

from __future__ import annotations

import os
import socket
from typing import Any


class ChannelSocket:
    """A paramiko Channel with the socket methods the data path calls (``recv_into``,
    ``sendall``, ``settimeout``, ``close``); no ``sendmsg``, so frames go out part by part.
    `owned`: an SSHClient to close with the channel (the ssh:// form opened it)."""

    def __init__(self, channel: Any, owned: Any = None):
        self._channel = channel
        self._owned = owned

    def recv_into(self, view: memoryview, nbytes: int = 0) -> int:
        """Receive at most `nbytes` (or len(view)) bytes into `view`; 0 at EOF."""
        n = min(nbytes or len(view), len(view))
        data = self._channel.recv(n)
        k = len(data)
        view[:k] = data
        return k

    def sendall(self, data: Any) -> None:
        """Send every byte of `data` (bytes or a byte memoryview). Raises OSError when the
        channel is closed."""
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        while len(view):
            sent = self._channel.send(view[: 1 << 20])
            if sent <= 0:
                raise ConnectionResetError("the SSH channel to the worker is closed")
            view = view[sent:]

    def settimeout(self, timeout_s: float | None) -> None:
        self._channel.settimeout(timeout_s)

    def close(self) -> None:
        """Close the channel, and the SSH connection when this object opened it."""
        try:
            self._channel.close()
        finally:
            if self._owned is not None:
                self._owned.close()
                self._owned = None


def open_channel(ssh: Any, host: str, port: int, lease_id: str, timeout_s: float) -> ChannelSocket:
    """A ``direct-tcpip`` channel over `ssh` (paramiko Transport or SSHClient) to the worker at
    host:port as the node sees it. Raises ConnectionError naming the endpoint and sshd's reason
    (worker not listening, forwarding refused by the node's sshd, SSH connection down)."""
    import paramiko

    transport = ssh.get_transport() if isinstance(ssh, paramiko.SSHClient) else ssh
    if transport is None or not transport.is_active():
        raise ConnectionError(f"the SSH connection for lease {lease_id} is not open")
    try:
        channel = transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout_s)
    except paramiko.ChannelException as e:
        raise ConnectionError(f"the node's sshd could not reach the worker of lease {lease_id} at {host}:{port}: "
                              f"{e.text} (is the worker running, and does sshd allow TCP forwarding?)") from None
    except (paramiko.SSHException, EOFError, OSError) as e:
        raise ConnectionError(f"could not open an SSH channel to the worker of lease {lease_id} at "
                              f"{host}:{port}: {e}") from None
    return ChannelSocket(channel)


def connect(ssh_host: str, ssh_port: int, ssh_user: str | None, known_hosts: str | None, identity: str | None,
            timeout_s: float) -> Any:
    """An authenticated paramiko SSHClient to the node (see the module docstring for the trust
    rules). Raises ConnectionError naming user@host:port and why (unknown host key, refused
    authentication, unreachable)."""
    import paramiko

    client = paramiko.SSHClient()
    where = f"{ssh_user + '@' if ssh_user else ''}{ssh_host}:{ssh_port}"
    try:
        client.load_system_host_keys()
        path = os.path.expanduser(known_hosts or "~/.ssh/known_hosts")
        if os.path.exists(path):
            client.load_host_keys(path)
        elif known_hosts:
            raise ConnectionError(f"ssh {where}: known_hosts file {known_hosts} does not exist")
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(ssh_host, port=ssh_port, username=ssh_user, key_filename=identity,
                       look_for_keys=identity is None, allow_agent=True, timeout=timeout_s,
                       banner_timeout=timeout_s, auth_timeout=timeout_s)
    except ConnectionError:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        raise ConnectionError(f"ssh {where}: the host key has CHANGED ({e}); refused") from None
    except paramiko.SSHException as e:
        client.close()
        if "not found in known_hosts" in str(e):
            raise ConnectionError(f"ssh {where}: unknown host key (not in "
                                  f"{known_hosts or '~/.ssh/known_hosts'}); refused") from None
        raise ConnectionError(f"ssh {where}: {e}") from None
    except (OSError, socket.timeout, EOFError) as e:
        client.close()
        raise ConnectionError(f"ssh {where}: {e}") from None
    return client
