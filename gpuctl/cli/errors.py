"""The CLI's one exception family and the one table that turns any exception into an exit code.

`CliError(message, exit_code)` is what a verb raises to stop with a message for stderr;
`UsageError` is the kind for bad command-line input (the message names the flag). Errors raised by
the layers below (config, fleet client, reassignment, lease acquisition, bootstrap) are not wrapped:
:func:`exit_code_for` maps them, and only `gpuctl.cli.main` calls it. A daemon's error code (the
``code`` of its JSON error answer, carried by ``NodeError.code``) is a row of :data:`NODE_CODE_EXIT`.
"""

from __future__ import annotations

import sys

from gpuctl.exit_codes import ExitCode


class CliError(Exception):
    """A verb stops: ``str()`` goes to stderr, `exit_code` (ExitCode) is the process status."""

    def __init__(self, message: str, exit_code: int = ExitCode.FAILURE):
        super().__init__(message)
        self.exit_code = ExitCode(exit_code)


class UsageError(CliError):
    """Bad command-line input (exit 2); the message names the flag."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.USAGE)


#: A node's error code (NodeError.code: the daemon's JSON ``code``, or the client's "unreachable"
#: and "timeout") -> exit code. A code not listed is FAILURE.
NODE_CODE_EXIT: dict[str, ExitCode] = {
    "unreachable": ExitCode.UNREACHABLE,
    "timeout": ExitCode.UNREACHABLE,
    "insufficient_slices": ExitCode.NOTHING_TO_DO,
    "unknown_lease": ExitCode.NOTHING_TO_DO,
    "lease_ended": ExitCode.NOTHING_TO_DO,
    "wrong_owner": ExitCode.CONFLICT,
    "slice_leased": ExitCode.CONFLICT,
    "request_id_reused": ExitCode.CONFLICT,
    "stale_generation": ExitCode.CONFLICT,
    "gpu_missing": ExitCode.CONFLICT,
    "mps_unavailable": ExitCode.CONFLICT,
    "mixed_owners": ExitCode.CONFLICT,
    "gpu_present": ExitCode.CONFLICT,
    "unknown_gpu": ExitCode.USAGE,
    "mig_read_only": ExitCode.CONFLICT,
    "slice_not_leasable": ExitCode.CONFLICT,
    "deadline_passed": ExitCode.UNREACHABLE,
    "lease_revoked": ExitCode.LEASE_REVOKED,
    "invalid_field": ExitCode.USAGE,
    "missing_field": ExitCode.USAGE,
    "unknown_field": ExitCode.USAGE,
    "bad_json": ExitCode.USAGE,
}


def exit_code_for_node_code(code: str | None) -> ExitCode:
    """The exit code for a node's error code (a row of NODE_CODE_EXIT, else FAILURE)."""
    return NODE_CODE_EXIT.get(code or "", ExitCode.FAILURE)


def _loaded(module: str, name: str) -> type | None:
    """The class `module.name` when that module is already imported (an exception of a module that
    was never imported cannot have been raised: no import just to compare)."""
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


#: Codes of gpuctl.fleet.split.SplitError that are the service's own (the others are node codes).
_SPLIT_ONLY = {"unknown_node": ExitCode.USAGE, "nothing_to_do": ExitCode.NOTHING_TO_DO,
               "invalid_field": ExitCode.USAGE}

#: The errors of the layers below, as (module, class, exit code of an instance); the CLI says their
#: message alone. Any other exception is an internal error (FAILURE, with its type named).
_ROWS = (("gpuctl.config", "ConfigError", lambda e: ExitCode.CONFIG),
         ("gpuctl.fleet.reassign", "ReassignError", lambda e: ExitCode.USAGE),
         ("gpuctl.fleet.bootstrap", "BootstrapError", lambda e: ExitCode(e.exit_code)),
         ("gpuctl.fleet.leases", "AcquireError", lambda e: exit_code_for_node_code(e.code)),
         ("gpuctl.fleet.job", "JobError", lambda e: exit_code_for_node_code(e.code)),
         ("gpuctl.fleet.split", "SplitError", lambda e: _SPLIT_ONLY.get(e.code) or exit_code_for_node_code(e.code)),
         ("gpuctl.fleet.client", "NodeError", lambda e: exit_code_for_node_code(e.code)))


def known_exit_code(exc: BaseException) -> ExitCode | None:
    """The exit code of an error the CLI knows (see exit_code_for); None for any other exception."""
    if isinstance(exc, CliError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    for module, name, code in _ROWS:
        cls = _loaded(module, name)
        if cls is not None and isinstance(exc, cls):
            return code(exc)
    return None


def exit_code_for(exc: BaseException) -> ExitCode:
    """The process exit code for an exception that ended a verb (the one table; README lists codes).

    CliError: its own code. KeyboardInterrupt: INTERRUPTED. gpuctl.config.ConfigError: CONFIG.
    gpuctl.fleet.reassign.ReassignError: USAGE (an invalid request). gpuctl.fleet.bootstrap.
    BootstrapError: its own code. gpuctl.fleet.client.NodeError and gpuctl.fleet.leases.
    AcquireError: their node error code through NODE_CODE_EXIT. Anything else: FAILURE.
    """
    code = known_exit_code(exc)
    return ExitCode.FAILURE if code is None else code


def error_document(code: int, message: str) -> dict:
    """The ``--json`` answer of a verb that failed: ``{"error": {"code": <exit code>, "name":
    <ExitCode name>, "message": <the stderr message, without the "gpuctl: " prefix>}}``."""
    try:
        name = ExitCode(code).name
    except ValueError:
        name = None
    return {"error": {"code": int(code), "name": name, "message": message}}
