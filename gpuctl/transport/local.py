"""LocalTransport: reach a gpuctld on this machine through its Unix socket (no SSH)."""

from __future__ import annotations

import logging

import httpx

from gpuctl.transport.errors import TransportError, transport_error
from gpuctl.transport.uds_http import BASE_URL, UnixSocketTransport

__all__ = ["BASE_URL", "LocalTransport"]

log = logging.getLogger(__name__)


class _NodeErrors(httpx.BaseTransport):
    """Wraps an httpx transport so that its failures are TransportErrors naming the node."""

    def __init__(self, inner: httpx.BaseTransport, node: str, socket_path: str, timeout_s: float):
        self._inner = inner
        self._node = node
        self._socket_path = socket_path
        self._timeout_s = timeout_s

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return self._inner.handle_request(request)
        except (httpx.TransportError, OSError) as exc:
            raise transport_error(
                self._node, exc, timeout_s=self._timeout_s, socket_path=self._socket_path
            ) from exc

    def close(self) -> None:
        self._inner.close()


class LocalTransport:
    """HTTP to gpuctld over a Unix socket on this machine.

    node: the node's name (for error messages). socket_path: the daemon's socket (None: the
    daemon's default, gpuctl.daemon.paths.default_socket_path()). timeout_s: connect/read/write
    timeout of each request, seconds. Failures raise TransportError, e.g. "node n1: gpuctld is not
    running on this node: no socket at /run/gpuctld/gpuctld.sock".
    """

    def __init__(self, node: str, socket_path: str | None = None, timeout_s: float = 5.0):
        if socket_path is None:
            from gpuctl.daemon.paths import default_socket_path

            socket_path = default_socket_path()
        self.node = node
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._client: httpx.Client | None = None

    def http_client(self) -> httpx.Client:
        """The node's httpx.Client (base_url "http://gpuctld", keep-alive); the same one each call."""
        if self._client is None:
            log.info("node %s: control channel: Unix socket %s", self.node, self.socket_path)
            inner = UnixSocketTransport(self.socket_path)  # no TLS context: nothing here is encrypted
            self._client = httpx.Client(
                transport=_NodeErrors(inner, self.node, self.socket_path, self.timeout_s),
                base_url=BASE_URL,
                timeout=self.timeout_s,
                trust_env=False,
            )
        return self._client

    def error(self, exc: BaseException) -> TransportError:
        """`exc` (from a request on this node) as a TransportError naming the node."""
        return transport_error(self.node, exc, timeout_s=self.timeout_s, socket_path=self.socket_path)

    def close(self) -> None:
        """Close the client and its connections; safe to call twice."""
        if self._client is not None:
            self._client.close()
            self._client = None
