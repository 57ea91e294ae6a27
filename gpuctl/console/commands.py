"""The `:` interpreter and screen navigation (a mixin of gpuctl.app.GpuctlApp).

`run_command(text)`: nodes, depts (board), leases, report, history, schedule, audit, node NAME,
theme NAME, help, q/quit; an unknown or malformed command flashes a message naming it. Going to the
screen already on top does nothing; going to an installed screen already in the stack pops back
down to it; otherwise the stack is popped to the fleet screen and the screen pushed.
"""

from __future__ import annotations

from typing import Any

from gpuctl.screens.fleet import FleetScreen
from gpuctl.screens.help import HelpScreen
from gpuctl.screens.leases import LeasesScreen
from gpuctl.screens.node_detail import NodeDetailScreen
from gpuctl.screens.too_small import TooSmallScreen


class CommandsMixin:
    """`:` commands and navigation of GpuctlApp (see the module doc)."""

    def _to_base(self) -> None:
        while len(self.screen_stack) > 1 and not isinstance(self.screen, TooSmallScreen):
            self.pop_screen()

    def show_screen(self, name: str) -> None:
        """Make the installed screen `name` ("leases", "board") the top of the stack: nothing when
        it already is (shown, or pushed and still mounting); pop down to it when it is lower in
        the stack; else pop to the fleet screen and push it by name."""
        screen = self.get_screen(name)
        if self.screen is screen:
            return
        if screen in self.screen_stack:
            while self.screen is not screen and len(self.screen_stack) > 1:
                if isinstance(self.screen, TooSmallScreen):
                    return
                self.pop_screen()
            return
        self._to_base()
        self.push_screen(name)

    def open_node(self, name: str, gpu_uuid: str | None = None) -> bool:
        """Show the detail of node `name` (with GPU `gpu_uuid` selected when given): nothing when
        it is already the top screen, replacing the top screen when that is another node's detail,
        else pushed. Flashes and returns False when the fleet has no such node."""
        snapshot = self.snapshot
        if snapshot is not None and snapshot.node(name) is None:
            known = ", ".join(n.name for n in snapshot.nodes[:8])
            more = " …" if len(snapshot.nodes) > 8 else ""
            self.flash(f"unknown node {name!r} (nodes: {known}{more})", severity="error")
            return False
        top = self.screen
        if isinstance(top, NodeDetailScreen):
            if top.node_name != name:
                self.switch_screen(NodeDetailScreen(name))
        else:
            self.push_screen(NodeDetailScreen(name))
        detail = self.screen_stack[-1]
        if gpu_uuid is not None and isinstance(detail, NodeDetailScreen) and detail.node_name == name:
            if detail.is_mounted:
                detail.select_gpu(gpu_uuid)
            else:
                detail.selected_uuid = gpu_uuid
        return True

    def action_back(self) -> None:
        if len(self.screen_stack) > 1:
            self.pop_screen()

    def _help_screen_classes(self) -> list[type]:
        """The screen classes whose keys the help lists, in order: fleet, the board when
        installed, node detail, leases."""
        classes: list[type] = [FleetScreen]
        if self.is_screen_installed("board"):
            classes.append(type(self.get_screen("board")))
        return classes + [NodeDetailScreen, LeasesScreen]

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen, screen_classes=self._help_screen_classes()))

    def action_refresh(self) -> None:
        self.poll()

    def action_leases(self) -> None:
        self.run_command("leases")

    def action_depts(self) -> None:
        self.run_command("depts")

    def run_command(self, text: str) -> bool:
        """Run a `:` command: nodes, depts (board), leases, report, history, schedule, audit,
        node NAME, theme NAME, help, q/quit.
        Returns False (and flashes a message naming it) for an unknown or malformed command."""
        words = text.strip().removeprefix(":").split()
        if not words:
            return False
        verb, args = words[0].lower(), words[1:]
        if verb in ("q", "quit", "q!"):
            self.exit()
        elif verb in ("nodes", "no", "fleet"):
            self._to_base()
        elif verb == "node":
            if len(args) != 1:
                self.flash("usage: :node NAME", severity="error")
                return False
            return self.open_node(args[0])
        elif verb in ("depts", "dept", "departments", "board"):
            if not self.is_screen_installed("board"):
                self.flash("board not available", severity="warning")
                return False
            self.show_screen("board")
        elif verb in ("leases", "lease"):
            self.show_screen("leases")
        elif verb in ("report", "usage"):
            self.show_screen("report")
        elif verb == "history":
            from gpuctl.screens.usage_history import screen_for_command

            screen = screen_for_command(self.screen, self.snapshot, args)
            if isinstance(screen, str):
                self.flash(screen, severity="error")
                return False
            self.push_screen(screen)
        elif verb in ("schedule", "sched"):
            return self._open_schedule_screen("schedule")
        elif verb == "audit":
            return self._open_schedule_screen("audit")
        elif verb == "help":
            self.action_help()
        elif verb == "theme":
            if len(args) != 1 or args[0] not in self.available_themes:
                self.flash(
                    f"unknown theme {' '.join(args)!r}; known: {', '.join(self.known_themes())}",
                    severity="error",
                )
                return False
            self.theme = args[0]
        else:
            self.flash(f"unknown command: {text.strip()!r} (try :nodes :depts :leases :schedule :audit "
                       f":node NAME :q)", severity="error")
            return False
        return True

    def schedule_service(self) -> Any | None:
        """The fleet's schedule and audit service (gpuctl.fleet.schedule.FleetSchedule over the
        source's FleetClient, the CLI's services), or None when the source has no client (then
        `:schedule` and `:audit` say so)."""
        client = getattr(self.source, "client", None)
        if client is None:
            return None
        from gpuctl.fleet.schedule import FleetSchedule

        return FleetSchedule(client)

    def _open_schedule_screen(self, which: str) -> bool:
        """`:schedule` / `:audit`: push the screen over the fleet screen (a second `:schedule`
        while it is on top does nothing)."""
        from gpuctl.screens.audit import AuditScreen
        from gpuctl.screens.schedule import ScheduleScreen

        kind = ScheduleScreen if which == "schedule" else AuditScreen
        if isinstance(self.screen, kind):
            return True
        service = self.schedule_service()
        if service is None:
            self.flash(f":{which}: this fleet source keeps no schedule (no node connections)", severity="warning")
            return False
        self._to_base()
        if which == "schedule":
            self.push_screen(ScheduleScreen(service, readonly=self.readonly))
        else:
            self.push_screen(AuditScreen(service.audit))
        return True
