"""Transport helpers for the SSH tests."""

from __future__ import annotations

import pytest

from gpuctl.transport import TransportError


def expect_transport_error(transport) -> TransportError:
    """The TransportError that GET /v1/health through `transport` raises (fails the test if none)."""
    with pytest.raises(TransportError) as info:
        transport.http_client().get("/v1/health")
    return info.value
