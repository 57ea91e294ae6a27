"""HTTP/1.1 over a byte channel (a paramiko Channel): an httpcore network backend and an httpx transport.

httpx -> ChannelHttpTransport (httpx.BaseTransport) -> httpcore.ConnectionPool(network_backend=
ChannelBackend) -> ChannelStream (httpcore.NetworkStream over one channel). The pool keeps channels
alive between requests and opens a new one (through the `open_channel` callable) when it needs
one; the host and port of the URL are ignored. Every httpcore response is read fully and closed
before the httpx.Response is returned, so the pool never runs dry.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpcore
import httpx
import paramiko

from gpuctl.transport.errors import TransportError
from gpuctl.transport.uds_http import send_via_pool

#: Methods retried once on a fresh channel when the kept-alive one turned out dead.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class ChannelStream(httpcore.NetworkStream):
    """An httpcore NetworkStream over a paramiko Channel (or anything with recv/sendall/settimeout/close).

    read() returns b"" at end of stream; timeouts raise httpcore.ReadTimeout/WriteTimeout, channel
    failures httpcore.ReadError/WriteError.
    """

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            self.channel.settimeout(timeout)
            return self.channel.recv(max_bytes)
        except socket.timeout as exc:
            raise httpcore.ReadTimeout(f"no answer within {timeout} s") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self.channel.settimeout(timeout)
            self.channel.sendall(buffer)
        except socket.timeout as exc:
            raise httpcore.WriteTimeout(f"could not send within {timeout} s") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    def close(self) -> None:
        self.channel.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        raise httpcore.UnsupportedProtocol("TLS is not used inside the SSH channel")

    def get_extra_info(self, info: str) -> Any:
        """"is_readable": True when an idle channel has data, EOF or is closed (httpcore then drops it)."""
        if info == "is_readable":
            ch = self.channel
            return bool(ch.closed or ch.eof_received or ch.recv_ready() or ch.exit_status_ready())
        return None


class ChannelBackend(httpcore.NetworkBackend):
    """httpcore NetworkBackend whose every "connection" is a new channel from `open_channel(timeout)`."""

    def __init__(self, open_channel: Callable[[float | None], paramiko.Channel]):
        self._open_channel = open_channel

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        return ChannelStream(self._open_channel(timeout))

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> httpcore.NetworkStream:
        return ChannelStream(self._open_channel(timeout))


class ChannelHttpTransport(httpx.BaseTransport):
    """httpx transport sending each request through a pool of channels.

    open_channel(timeout_s) -> a channel already joined to the daemon (raises TransportError).
    to_error(exc) -> TransportError for an httpcore failure. max_channels: channels kept at once.
    A GET/HEAD/OPTIONS that fails because its kept-alive channel died is sent once more on a new
    channel; other methods are not resent (the error says the change may or may not have applied).
    """

    def __init__(
        self,
        open_channel: Callable[[float | None], paramiko.Channel],
        to_error: Callable[[BaseException], TransportError],
        *,
        max_channels: int = 4,
        keepalive_expiry_s: float = 300.0,
    ):
        self._to_error = to_error
        self._pool = httpcore.ConnectionPool(
            network_backend=ChannelBackend(open_channel),
            max_connections=max_channels,
            max_keepalive_connections=max_channels,
            keepalive_expiry=keepalive_expiry_s,
        )

    def _send_once(self, request: httpx.Request) -> httpx.Response:
        return send_via_pool(self._pool, request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        retryable = request.method in IDEMPOTENT_METHODS
        for attempt in (1, 2):
            try:
                return self._send_once(request)
            except TransportError:
                raise
            except (httpcore.ReadError, httpcore.WriteError, httpcore.RemoteProtocolError) as exc:
                if retryable and attempt == 1:
                    continue
                err = self._to_error(exc)
                if not retryable:
                    err = TransportError(
                        err.node,
                        f"{err.message}; the {request.method} may or may not have been applied "
                        "(send it again with the same request_id to find out)",
                        address=err.address,
                        code=err.code,
                    )
                raise err from exc
            except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, OSError) as exc:
                raise self._to_error(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self._pool.close()
