"""Screens of the gpuctl console.

base.GpuctlScreen: header + body + footer, re-rendered from the app's snapshot (subclass it).
fleet.FleetScreen (`:nodes`, the default), node_detail.NodeDetailScreen (`:node NAME`, Enter),
leases.LeasesScreen (`:leases`), help.HelpScreen (`?`), too_small.TooSmallScreen.
board.BoardScreen (`:depts`, department board with drag and drop) is optional: when
gpuctl/screens/board.py exists and defines BoardScreen, the app installs it under the name "board".
schedule.ScheduleScreen (`:schedule`: scheduled moves, add form, cancel) and audit.AuditScreen
(`:audit`: audit records with a filter) take their source (gpuctl.fleet.schedule.FleetSchedule)
in the constructor.
"""
