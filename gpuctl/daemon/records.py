"""gpuctld's audit log and schedule, opened together at start-up (one call from gpuctl.daemon.main).

:func:`open_records` reads the clock, opens the audit log (gpuctl.daemon.audit), hooks it into the
state manager's commits, records requests a killed daemon left without an outcome, and loads the
schedule (gpuctl.daemon.schedule). :meth:`NodeRecords.install` adds their routes to the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpuctl.daemon.audit import AuditLog, AuditWriteError
from gpuctl.daemon.clock import Clock
from gpuctl.daemon.schedule import ScheduleManager, ScheduleStore
from gpuctl.daemon.state import NodeStateManager, StateCorruptError
from gpuctl.exit_codes import ExitCode


class RecordsError(Exception):
    """The audit log or the schedule cannot be used; ``exit_code``: gpuctld's exit status."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class NodeRecords:
    """The node's clock, audit log and schedule."""

    clock: Clock
    audit: AuditLog
    schedule: ScheduleManager

    def install(self, api: Any, on_revoke: Callable[[], Any] | None = None) -> None:
        """Wrap the API with audit records; add /v1/audit and /v1/schedule routes."""
        from gpuctl.daemon import audit_api, schedule_api

        self.schedule.on_revoke = on_revoke
        schedule_api.install(api, self.schedule, self.audit)
        audit_api.install(api, self.audit)

    def start(self) -> None:
        """Start the schedule's executor."""
        self.schedule.start()

    def close(self) -> None:
        """Stop the executor, close the audit log."""
        self.schedule.close()
        self.audit.close()


def open_records(state_dir: Path, manager: NodeStateManager, *, hostname: str,
                 clock_offset_file: str | None = None, reset_state: bool = False,
                 say: Callable[[str], None] = print) -> NodeRecords:
    """Open the audit log and schedule of `state_dir` for `manager`'s node.

    Raises RecordsError: the audit log cannot be opened (exit FAILURE); the schedule file is
    unusable (exit CONFIG; with `reset_state` it is moved aside and the schedule starts empty).
    """
    clock = Clock(clock_offset_file, warn=say)
    audit = AuditLog(state_dir, hostname, clock=clock)
    try:
        audit.open()
    except AuditWriteError as e:
        raise RecordsError(f"{e}; refusing to start: every change must be audited", ExitCode.FAILURE) from e
    manager.on_commit = audit.on_commit
    for rec in audit.recover(manager.recorded, manager.generation):
        say(f"audit: request {rec.get('request_id')!r} ({rec.get('action')}) has no recorded outcome "
            f"(gpuctld stopped while it ran); marked incomplete")
    store = ScheduleStore(state_dir)
    try:
        schedule = ScheduleManager(store, manager, clock=clock, audit=audit)
    except StateCorruptError as e:
        if not reset_state:
            raise RecordsError(f"{e}; refusing to start: scheduled moves would be lost. Restore it, or run "
                               f"gpuctld --reset-state to move it aside", ExitCode.CONFIG) from e
        aside = store.move_aside()
        say(f"--reset-state: {e}; moved it to {aside}; the schedule starts empty")
        schedule = ScheduleManager(store, manager, clock=clock, audit=audit)
    return NodeRecords(clock=clock, audit=audit, schedule=schedule)
