"""gpuctld's one error family (gpuctl.daemon.errors), routes added once (no swapping at run time),
and constants defined once for the daemon and the admin side."""

from __future__ import annotations

import pytest

from gpuctl import model
from gpuctl.backends.simulated import SimulatedBackend
from gpuctl.cli.errors import NODE_CODE_EXIT
from gpuctl.daemon import errors, leases, state
from gpuctl.daemon.api import ApiRequest, ControlApi
from gpuctl.daemon.state import NodeState, NodeStateManager
from gpuctl.daemon.telemetry import Sampler
from gpuctl.fleet import reassign


class _Store:
    path = "(memory)"

    def save(self, state):
        pass


def _api() -> ControlApi:
    backend = SimulatedBackend(gpus=2, seed=1)
    manager = NodeStateManager(_Store(), NodeState())
    manager.reconcile(backend.gpus())
    sampler = Sampler(backend)
    sampler.sample_once()
    return ControlApi(backend_name="simulated", gpus=backend.gpus(), sampler=sampler, state=manager, hostname="n1")


def test_every_refusal_is_one_family_with_a_code_and_status():
    kinds = [state.StaleGeneration, state.WrongOwner, state.SliceLeased, state.MixedOwners, state.GpuMissing,
             state.RequestIdReused, state.LeaseExists, state.UnknownSlice, state.UnknownGpu, state.UnknownLease,
             state.InvalidRequest, state.StateWriteError, leases.InsufficientSlices, leases.LeaseEnded,
             leases.WorkerStartFailed, errors.ApiError]
    for kind in kinds:
        assert issubclass(kind, errors.DaemonError), kind
    assert errors.ERROR_CODES["stale_generation"] == 409
    assert errors.ERROR_CODES["unknown_lease"] == 404 and errors.ERROR_CODES["lease_ended"] == 410
    assert errors.ERROR_CODES["insufficient_slices"] == 409 and errors.ERROR_CODES["state_write_failed"] == 500
    # every daemon code the CLI maps to an exit code is one the daemon can answer
    api_codes = {"invalid_field", "missing_field", "unknown_field", "bad_json"}
    client_codes = {"unreachable", "timeout"}
    assert set(NODE_CODE_EXIT) - client_codes <= set(errors.ERROR_CODES) | api_codes


def test_stale_generation_answer_carries_the_current_generation():
    api = _api()
    body = b'{"request_id": "r1", "generation": 7, "moves": [{"slice_id": "x", "from": "unassigned", "to": "a"}]}'
    status, answer = api.handle(ApiRequest("POST", "/v1/assign", body=body))
    assert status == 409
    assert api.state.generation == 1  # reconcile gave each GPU its first slice
    assert answer["error"]["code"] == "stale_generation" and answer["error"]["current_generation"] == 1
    assert answer["error"]["field"] == "generation"


def test_a_route_is_added_once_never_swapped():
    api = _api()
    before = api.routes[("GET", "/v1/status")]
    with pytest.raises(ValueError, match="route GET /v1/status is already served"):
        api.add_route("GET", "/v1/status", lambda r: (200, {}))
    with pytest.raises(ValueError, match=r"route GET /v1/requests/\* is already served"):
        api.add_route("GET", "/v1/requests/", lambda r: (200, {}), prefix=True)
    assert api.routes[("GET", "/v1/status")] is before


def test_lease_manager_registers_routes_and_hooks_without_replacing_any():
    api = _api()
    routes_before = dict(api.routes)
    manager = leases.LeaseManager(api.state, api.gpus, hostname="n1", executor="numpy",
                                    start_worker=lambda *a, **k: None)
    manager.install(api)
    for key, handler in routes_before.items():
        assert api.routes[key] is handler  # status and assign are still the API's own
    assert ("POST", "/v1/leases") in api.routes and ("GET", "/v1/leases") in api.routes
    assert api.status_hooks == [manager.add_to_status] and api.assign_hooks == [manager.sync]
    status, body = api.handle(ApiRequest("GET", "/v1/status"))
    assert status == 200
    assert all("usage" in s for g in body["gpus"] for s in g["slices"])  # added by the hook


def test_constants_are_defined_once():
    assert reassign.LEASED_MODES is model.LEASED_MODES is state.LEASED_MODES
    assert reassign.MAX_REQUEST_ID_CHARS is model.MAX_REQUEST_ID_CHARS
    from gpuctl.daemon import api, fields

    assert api.MAX_REQUEST_ID_CHARS is model.MAX_REQUEST_ID_CHARS and api.MAX_STRING_CHARS is fields.MAX_STRING_CHARS
