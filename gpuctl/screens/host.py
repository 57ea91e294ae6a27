"""What a gpuctl screen may ask of the app it runs in: one typed protocol, so that screens never
import the app (gpuctl.app.GpuctlApp implements it; a screen reaches it as ``self.host``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpuctl import model
    from gpuctl.fleet.source import FleetSource
    from gpuctl.widgets.fleet_view import FleetView, FleetViewSpec
    from gpuctl.widgets.palette import Palette


class ConsoleHost(Protocol):
    """The console app as its screens see it.

    source: the FleetSource polled (departments, history, reassign). snapshot: the last fleet
    snapshot (None before the first poll). palette: the theme's resolved colors (None before the
    app is mounted). readonly: no reassignment possible.
    """

    source: FleetSource
    snapshot: model.FleetSnapshot | None
    palette: Palette | None
    readonly: bool
    #: What the fleet screen shows (set by it; the poll worker builds each poll's view for it).
    fleet_view_spec: FleetViewSpec | None

    def fleet_view_for(self, snapshot: model.FleetSnapshot) -> FleetView | None:
        """The fleet table's view the poll worker built for `snapshot` (gpuctl.widgets.fleet_view),
        None when it built none for that snapshot; check its spec and palette before use."""

    def poll(self) -> None:
        """Poll the fleet now (the next poll is scheduled when it finished)."""

    def open_node(self, name: str, gpu_uuid: str | None = None) -> bool:
        """Show node `name`'s detail (GPU `gpu_uuid` selected); False for an unknown node."""

    def flash(self, message: str, severity: str = "information") -> None:
        """A message that clears itself."""

    def action_back(self) -> None:
        """Close the top screen (back to the one below)."""

    def schedule_service(self) -> Any | None:
        """The fleet's schedule and audit service (gpuctl.fleet.schedule.FleetSchedule; its calls
        block: call them from a worker), or None when the source has no node connections."""
