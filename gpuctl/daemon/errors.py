"""gpuctld's one error family: every refusal the control API answers with ``{"error": {"code",
"message", "field"}}`` is a :class:`DaemonError` with an HTTP `status` and a stable `code`.

:class:`ApiError` is raised while reading a request (bad JSON, a bad field, unknown path);
:class:`StateError` and its kinds by the state manager and the lease manager (nothing was changed
when one is raised). :data:`ERROR_CODES` lists every code with its status: the admin side maps
the same codes to exit codes (gpuctl.cli.errors.NODE_CODE_EXIT).
"""

from __future__ import annotations

from typing import Any


class DaemonError(Exception):
    """A request the daemon refuses. ``status``: HTTP status; ``code``: stable error code;
    ``message``: what is wrong, in words; ``field``: the request field at fault, or None."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def to_json(self) -> dict[str, Any]:
        """The API's error body: ``{"error": {"code", "message", "field"}}``."""
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}


class ApiError(DaemonError):
    """A request the API refuses while reading it: HTTP `status`, stable `code`, `message` in words,
    `field` at fault."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(message, field=field, code=code, status=status)


class StateError(DaemonError):
    """A refused state or lease operation (409 unless the kind says otherwise). Nothing was
    changed when this is raised."""

    status = 409
    code = "conflict"


class StaleGeneration(StateError):
    """The request was based on generation ``based_on``; the node is at ``current``."""

    code = "stale_generation"

    def __init__(self, based_on: int, current: int):
        super().__init__(
            f"stale generation: the request is based on generation {based_on}, the node is at "
            f"generation {current}; re-read the node's state and plan again",
            field="generation",
        )
        self.based_on = based_on
        self.current = current

    def to_json(self) -> dict[str, Any]:
        """The error body with ``current_generation``, so a client can re-plan at once."""
        body = super().to_json()
        body["error"]["current_generation"] = self.current
        return body


class WrongOwner(StateError):
    """A move's "from" (or a lease's department) is not the slice's owner; the message names both."""

    code = "wrong_owner"


class SliceLeased(StateError):
    """A slice is leased and the request may not touch it (refuse mode, split, a second lease)."""

    code = "slice_leased"


class MixedOwners(StateError):
    """A split of a GPU whose slices have more than one owner."""

    code = "mixed_owners"


class GpuMissing(StateError):
    """A split of a GPU the backend no longer reports (its slices are kept)."""

    code = "gpu_missing"


class RequestIdReused(StateError):
    """A request id already recorded for another kind of operation."""

    code = "request_id_reused"


class MigReadOnly(StateError):
    """A split or merge of a MIG device, or of a GPU with MIG on: MIG slices are read-only in gpuctl."""

    code = "mig_read_only"


class SliceNotLeasable(StateError):
    """A lease on a slice that may not be leased (its memory quota is unknown); the message says why."""

    code = "slice_not_leasable"


class DeadlinePassed(StateError):
    """A change request reached its commit after the deadline its client set (``deadline_unix_s``):
    the client has given up on it and reports its outcome as unknown, so it is not applied."""

    code = "deadline_passed"


class LeaseExists(StateError):
    """add_lease with an id already in use."""

    code = "lease_exists"


class UnknownSlice(StateError):
    """No slice with that id on this node."""

    status = 404
    code = "unknown_slice"


class UnknownGpu(StateError):
    """No GPU with that UUID in the node's state."""

    status = 404
    code = "unknown_gpu"


class GpuPresent(StateError):
    """A forget of a GPU the backend still reports (only a missing, replaced GPU is forgotten)."""

    code = "gpu_present"


class UnknownLease(StateError):
    """No lease with that id on this node."""

    status = 404
    code = "unknown_lease"


class InvalidRequest(StateError):
    """A request that is malformed for the state (empty or duplicate moves, bad parts or mode)."""

    status = 400
    code = "invalid_field"


class StateWriteError(StateError):
    """The new state could not be written to disk; the change was not made."""

    status = 500
    code = "state_write_failed"


class InsufficientSlices(StateError):
    """No GPU of this node has idle slices of the department covering the request."""

    code = "insufficient_slices"


class LeaseEnded(StateError):
    """A heartbeat for a lease that has just ended (expired, or its worker is gone): 410."""

    status = 410
    code = "lease_ended"


class LeaseRevoked(StateError):
    """A heartbeat for a lease that a reassignment with ``--revoke`` ended: 410."""

    status = 410
    code = "lease_revoked"


class MpsUnavailable(StateError):
    """A fractional lease needs MPS on its GPU and cannot have it (``--mps required``, or the
    GPU's MPS server serves another user): nothing was granted."""

    status = 409
    code = "mps_unavailable"


class WorkerStartFailed(StateError):
    """The data-path worker of a new lease did not start; nothing was granted."""

    status = 500
    code = "worker_start_failed"


def _kinds(cls: type) -> list[type]:
    return [cls] + [k for sub in cls.__subclasses__() for k in _kinds(sub)]


#: Every error code of the family with its HTTP status (ApiError's codes are given where raised).
ERROR_CODES: dict[str, int] = {k.code: k.status for k in _kinds(StateError)}
