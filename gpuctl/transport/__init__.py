"""Transports from the admin's machine to a node's gpuctld: local Unix socket or SSH.

``open_transport(node, ...)`` picks one from ``node.transport``; both give
``.http_client() -> httpx.Client`` (base_url "http://gpuctld", kept alive and reused), ``.error(exc)
-> TransportError`` and ``.close()``. Failures raise :class:`TransportError`, whose str() names the
node (and host:port).
"""

from __future__ import annotations

from typing import Any

from gpuctl.transport.errors import TransportError, transport_error
from gpuctl.transport.local import LocalTransport

__all__ = ["LocalTransport", "SshTransport", "TransportError", "open_transport", "transport_error"]


def open_transport(
    node: Any,
    *,
    ssh_config_path: str | None = None,
    known_hosts_path: str | None = None,
    accept_new_host_key: bool = False,
    passphrase: str | None = None,
    use_agent: bool = True,
    include_dir: str | None = None,
    channel_kinds: tuple[str, ...] | None = None,
) -> LocalTransport | "SshTransport":
    """The transport for `node` (an object with NodeConfig's attributes); touches no network.

    node.transport "local": LocalTransport on node.socket (default: the daemon's default socket).
    "ssh": SshTransport, or with $GPUCTL_SSH_CACHE set a CachedSshTransport through this user's
    SSH connection cache (gpuctl.transport.conncache; not with accept_new_host_key, a passphrase or
    channel_kinds) (the other arguments are its options; see SshTransport; channel_kinds:
    "streamlocal", "relay", "bridge" in the order tried, default all, or $GPUCTL_SSH_CHANNELS). Raises
    TransportError (code "config") naming the node for any other transport value.
    """
    kind = getattr(node, "transport", "ssh")
    if kind == "local":
        return LocalTransport(node.name, node.socket, float(node.timeout_s))
    if kind == "ssh":
        from gpuctl.transport.conncache import CachedSshTransport, cache_idle_s
        from gpuctl.transport.ssh import SshTransport

        try:
            idle_s = cache_idle_s()
        except ValueError as exc:
            raise TransportError(node.name, str(exc), code="config") from exc
        if idle_s is not None and not accept_new_host_key and passphrase is None and channel_kinds is None:
            return CachedSshTransport(node, idle_s=idle_s, ssh_config_path=ssh_config_path,
                                      known_hosts_path=known_hosts_path, include_dir=include_dir,
                                      use_agent=use_agent)

        return SshTransport(
            node,
            ssh_config_path=ssh_config_path,
            include_dir=include_dir,
            known_hosts_path=known_hosts_path,
            accept_new_host_key=accept_new_host_key,
            passphrase=passphrase,
            use_agent=use_agent,
            channel_kinds=channel_kinds,
        )
    raise TransportError(node.name, f"unknown transport {kind!r} (expected 'ssh' or 'local')", code="config")


def __getattr__(name: str) -> Any:
    if name == "SshTransport":
        from gpuctl.transport.ssh import SshTransport

        return SshTransport
    raise AttributeError(name)
