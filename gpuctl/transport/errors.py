"""TransportError: the one exception the transports raise, always naming the node.

The fleet client catches TransportError and shows ``str(exc)`` as the node's status; anything
else that escapes an httpx call on a node can be turned into one with :func:`transport_error`.
"""

from __future__ import annotations

import errno
import os
import socket

import httpcore
import httpx

#: Values of TransportError.code (stable, for `--json` output and exit-code decisions).
CODES = (
    "unreachable",  # DNS, refused, no route, SSH handshake failed, connection lost
    "timeout",  # a connect, auth, command or read step took longer than the node's timeout_s
    "auth",  # SSH authentication failed
    "key",  # an identity file could not be used (encrypted, unreadable cipher, missing)
    "host_key_unknown",  # host key not in known_hosts
    "host_key_changed",  # host key differs from known_hosts (or is revoked)
    "daemon",  # gpuctld not installed / not running / socket not permitted on the node
    "config",  # ssh config could not be used
)


class TransportError(Exception):
    """A node could not be reached or did not answer.

    node: the node's name (fleet config). message: what went wrong and, where there is one, the
    fix. address: "host:port" the transport used (None when unknown, e.g. a local socket).
    code: one of :data:`CODES`. ``str()`` is ``"node NAME (ADDRESS): MESSAGE"``.
    """

    def __init__(self, node: str, message: str, *, address: str | None = None, code: str = "unreachable"):
        self.node = node
        self.message = message
        self.address = address
        self.code = code
        where = f"node {node} ({address})" if address else f"node {node}"
        super().__init__(f"{where}: {message}")


def _os_errno(exc: BaseException) -> int | None:
    """The errno of the first OSError in `exc`'s cause/context chain, else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno
        exc = exc.__cause__ or exc.__context__
    return None


def describe_os_error(exc: OSError) -> str:
    """A short lower-case phrase for a connect-time OSError ("connection refused", ...)."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name ({exc.strerror})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    phrases = {
        errno.ECONNREFUSED: "connection refused",
        errno.EHOSTUNREACH: "no route to host",
        errno.ENETUNREACH: "network unreachable",
        errno.ECONNRESET: "connection reset by peer",
        errno.ETIMEDOUT: "timed out",
    }
    if exc.errno in phrases:
        return phrases[exc.errno]
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def transport_error(
    node: str,
    exc: BaseException,
    *,
    address: str | None = None,
    timeout_s: float | None = None,
    socket_path: str | None = None,
) -> TransportError:
    """Turn any exception raised while talking to `node` into a TransportError naming it.

    A TransportError is returned unchanged. httpx/httpcore timeouts become "timed out after
    T s" (T = `timeout_s` when given); connect errors on a Unix socket (`socket_path`) that is
    missing or refused become "gpuctld is not running on this node: no socket at PATH"; other
    connection errors are described by their errno; anything else keeps its type name and text.
    """
    if isinstance(exc, TransportError):
        return exc
    after = f" after {timeout_s:g} s" if timeout_s is not None else ""
    if isinstance(exc, (httpx.TimeoutException, httpcore.TimeoutException, socket.timeout, TimeoutError)):
        what = "waiting for gpuctld's answer" if isinstance(exc, (httpx.ReadTimeout, httpcore.ReadTimeout)) else ""
        return TransportError(node, f"timed out{after} {what}".rstrip(), address=address, code="timeout")
    code_errno = _os_errno(exc)
    if socket_path is not None and code_errno in (errno.ENOENT, errno.ECONNREFUSED):
        return TransportError(
            node, f"gpuctld is not running on this node: no socket at {socket_path}", address=address, code="daemon"
        )
    if socket_path is not None and code_errno in (errno.EACCES, errno.EPERM):
        return TransportError(
            node,
            f"permission denied on {socket_path}: this account may not use gpuctld's socket",
            address=address,
            code="daemon",
        )
    if isinstance(exc, OSError):
        return TransportError(node, describe_os_error(exc), address=address)
    if isinstance(exc, (httpx.RemoteProtocolError, httpcore.RemoteProtocolError)):
        return TransportError(node, f"connection to gpuctld lost: {exc}", address=address)
    if isinstance(exc, (httpx.TransportError, httpcore.NetworkError, httpcore.ProtocolError)):
        if code_errno is not None:
            return TransportError(node, describe_os_error(OSError(code_errno, os.strerror(code_errno))), address=address)
        detail = str(exc) or type(exc).__name__
        return TransportError(node, f"connection to gpuctld failed: {detail}", address=address)
    return TransportError(node, f"{type(exc).__name__}: {exc}", address=address)
