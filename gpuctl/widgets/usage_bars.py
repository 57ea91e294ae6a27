"""Bars of owned vs used GPU-hours per department (the report screen), with textual-plotext.

`bar_series` turns a report by department (gpuctl.usage_report.build_report) into the labels and
the two series the plot draws; `UsageBars` draws them as grouped bars (owned, used) and rebuilds
only when the data, size or theme changed.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual_plotext import PlotextPlot

from gpuctl.model import UNASSIGNED


def bar_series(report: dict[str, Any]) -> tuple[list[str], list[float], list[float]]:
    """(department names, owned GPU-hours, used GPU-hours) of a report by department, departments
    in the report's order with ``unassigned`` left out (it is nobody's to use)."""
    rows = [r for r in report.get("rows", []) if r.get("department") not in (None, UNASSIGNED)]
    return ([r["department"] for r in rows], [float(r["owned_gpu_h"] or 0.0) for r in rows],
            [float(r["used_gpu_h"] or 0.0) for r in rows])


class UsageBars(PlotextPlot):
    """Grouped bars: owned and used GPU-hours per department."""

    DEFAULT_CSS = """
    UsageBars { width: 1fr; height: 1fr; min-height: 8; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.series: tuple[list[str], list[float], list[float]] = ([], [], [])
        self.plot_title = "owned vs used GPU-hours"
        self.bar_colors: tuple[str, str] = ("blue", "green")
        self._version = 0
        self._built: tuple[tuple, Text] | None = None

    def show(self, series: tuple[list[str], list[float], list[float]], *, title: str,
             colors: tuple[str, str] = ("blue", "green")) -> None:
        """Draw `series` (see bar_series) under `title`; colors for (owned, used), plotext names."""
        if (series, title, colors) == (self.series, self.plot_title, self.bar_colors):
            return
        self.series, self.plot_title, self.bar_colors = series, title, colors
        self._version += 1
        self.refresh()

    def render(self) -> Text:
        key = (self._version, self.size.width, self.size.height, self.app.theme)
        if self._built is not None and self._built[0] == key:
            return self._built[1]
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.plot_title[: max(0, self.size.width - 2)])
        names, owned, used = self.series
        if names:
            plt.multiple_bar(names, [owned, used], labels=["owned", "used"], color=list(self.bar_colors))
        text = super().render()
        assert isinstance(text, Text)
        self._built = (key, text)
        return text
