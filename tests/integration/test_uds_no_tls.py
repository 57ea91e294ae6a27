"""Issue 15 item 4: Unix-socket HTTP clients never build a TLS context (nor load the CA bundle)."""

from __future__ import annotations

import ssl

import httpx
import pytest

from daemon_proc import start_daemon

from gpuctl.transport import LocalTransport, TransportError
from gpuctl.transport.uds_http import UnixSocketTransport, uds_client


@pytest.fixture
def no_tls(monkeypatch):
    """Counts every TLS context built (ssl.create_default_context, ssl.SSLContext, CA loading)."""
    calls: list[str] = []
    real_default = ssl.create_default_context

    def counting_default(*a, **kw):
        calls.append("create_default_context")
        return real_default(*a, **kw)

    real_load = ssl.SSLContext.load_verify_locations

    def counting_load(self, *a, **kw):
        calls.append("load_verify_locations")
        return real_load(self, *a, **kw)

    monkeypatch.setattr(ssl, "create_default_context", counting_default)
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting_load)
    real_new = ssl.SSLContext.__new__

    def counting_new(cls, *a, **kw):
        calls.append("SSLContext")
        return real_new(cls, *a, **kw)

    monkeypatch.setattr(ssl.SSLContext, "__new__", counting_new)
    return calls


def test_the_counter_sees_httpx_default_transport(no_tls, tmp_path):
    # the fixture would see what the issue measured: httpx's own uds transport builds a context
    httpx.HTTPTransport(uds=str(tmp_path / "x.sock")).close()
    assert "create_default_context" in no_tls and "load_verify_locations" in no_tls
    del no_tls[:]
    httpx.HTTPTransport(uds=str(tmp_path / "x.sock"), verify=False).close()
    assert no_tls == ["SSLContext"], "verify=False still builds a context; the fixture must see it"


def test_local_transport_builds_no_tls_context(no_tls, tmp_path, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")  # env proxies would add TLS transports
    monkeypatch.setenv("ALL_PROXY", "http://proxy.invalid:3128")
    with start_daemon(tmp_path, gpus=2) as d:
        del no_tls[:]  # start_daemon's own polling is counted too; only count from here
        t = LocalTransport("n1", str(d.socket_path), timeout_s=5.0)
        try:
            body = t.http_client().get("/v1/status").json()
            assert len(body["gpus"]) == 2
            assert t.http_client().get("/v1/health").json()["pid"] == d.pid
        finally:
            t.close()
        with uds_client(str(d.socket_path)) as c:
            assert c.get("/v1/health").status_code == 200
    assert no_tls == []


def test_uds_transport_errors_are_httpx_errors_naming_the_socket(tmp_path):
    missing = str(tmp_path / "gone.sock")
    with httpx.Client(transport=UnixSocketTransport(missing), base_url="http://gpuctld") as c:
        with pytest.raises(httpx.ConnectError):
            c.get("/v1/health")
    t = LocalTransport("n7", missing, timeout_s=1.0)
    with pytest.raises(TransportError) as info:
        t.http_client().get("/v1/health")
    assert str(info.value) == f"node n7: gpuctld is not running on this node: no socket at {missing}"
    t.close()
