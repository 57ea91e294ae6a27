"""httpx over a Unix socket with no TLS machinery: an httpx transport on httpcore's connection pool.

httpx's own ``HTTPTransport(uds=...)`` builds an ``ssl.SSLContext`` and loads the CA bundle when it
is made (~38 ms of CPU each), although nothing sent over a Unix socket is ever encrypted.
:class:`UnixSocketTransport` hands httpcore no SSL context (httpcore builds one only for an https
URL, which never happens here), and :func:`uds_client` turns off the environment's proxy settings
(a proxy would mean another transport, with TLS). Headless; imports no paramiko.
"""

from __future__ import annotations

import httpcore
import httpx

#: base_url of every client the transports hand out; the host part is never resolved.
BASE_URL = "http://gpuctld"


def send_via_pool(pool: httpcore.ConnectionPool, request: httpx.Request) -> httpx.Response:
    """Send an httpx request through an httpcore pool; the answer is read whole and the httpcore
    response closed before returning (so the pool never runs dry). Raises httpcore's errors."""
    core_request = httpcore.Request(
        method=request.method,
        url=httpcore.URL(
            scheme=request.url.raw_scheme,
            host=request.url.raw_host,
            port=request.url.port,
            target=request.url.raw_path,
        ),
        headers=request.headers.raw,
        content=request.stream,
        extensions=request.extensions,
    )
    core_response = pool.handle_request(core_request)
    try:
        content = core_response.read()
    finally:
        core_response.close()
    return httpx.Response(
        status_code=core_response.status,
        headers=core_response.headers,
        content=content,
        extensions={k: v for k, v in core_response.extensions.items() if k != "network_stream"},
    )


_CORE_TO_HTTPX: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


class UnixSocketTransport(httpx.BaseTransport):
    """httpx transport to a Unix socket; keeps up to `max_connections` connections alive.

    socket_path: the server's socket. Never builds an SSL context. Failures raise httpx's
    TransportError family (httpx.ConnectError for a missing socket, httpx.ReadTimeout, ...), the
    same as ``httpx.HTTPTransport(uds=...)`` would.
    """

    def __init__(self, socket_path: str, *, max_connections: int = 4, keepalive_expiry_s: float = 300.0):
        self.socket_path = str(socket_path)
        self._pool = httpcore.ConnectionPool(
            ssl_context=None,
            uds=self.socket_path,
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=keepalive_expiry_s,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return send_via_pool(self._pool, request)
        except Exception as exc:  # noqa: BLE001 - map httpcore's errors to httpx's, like HTTPTransport
            for core_type, httpx_type in _CORE_TO_HTTPX:
                if isinstance(exc, core_type):
                    raise httpx_type(str(exc), request=request) from exc
            raise

    def close(self) -> None:
        self._pool.close()


def uds_client(socket_path: str, timeout_s: float = 5.0, *, base_url: str = BASE_URL) -> httpx.Client:
    """An httpx.Client on a Unix socket (base URL http://gpuctld), no TLS context, no env proxies."""
    return httpx.Client(transport=UnixSocketTransport(str(socket_path)), base_url=base_url,
                        timeout=timeout_s, trust_env=False)
