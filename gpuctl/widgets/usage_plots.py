"""Usage plots with textual-plotext: owned vs used GPU-hours per department as bars (report
screen) and one GPU's usage history over hours or days (history screen).

`bar_series` turns a report by department (gpuctl.fleet.usage_report.build_report) into the labels and
the two series the plot draws; `UsageBars` draws them as grouped bars (owned, used).
`history_runs` turns GET /v1/usage/history points into runs (gaps kept); `HistoryPlot` draws them
with x in hours before now. Both rebuild only when the data, size or theme changed.
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


def history_runs(points: list[dict[str, Any]], key: str, step_s: int, until_s: float,
                 scale: float = 1.0) -> list[tuple[list[float], list[float]]]:
    """Runs of figure `key` (``sm_util_pct``, ``memory_used_bytes``) x `scale` over the points of
    a usage history (oldest first), x in hours before `until_s`. A step with no figure (daemon
    down, N/A) or missing from the points ends a run: a gap stays a gap, never a drawn zero."""
    runs: list[tuple[list[float], list[float]]] = []
    xs: list[float] = []
    ys: list[float] = []
    last_ts: float | None = None
    for p in points:
        value = p.get(key)
        gap = last_ts is not None and p["ts"] - last_ts > step_s
        if (value is None or gap) and xs:
            runs.append((xs, ys))
            xs, ys = [], []
        if value is not None:
            xs.append((p["ts"] + step_s / 2 - until_s) / 3600.0)
            ys.append(float(value) * scale)
        last_ts = p["ts"]
    if xs:
        runs.append((xs, ys))
    return runs


class HistoryPlot(PlotextPlot):
    """One figure of one GPU over the last hours or days (x in hours before now). Focusable, so a
    screen of plots has somewhere to keep the focus."""

    can_focus = True

    DEFAULT_CSS = """
    HistoryPlot { width: 1fr; height: 1fr; min-height: 6; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.runs: list[tuple[list[float], list[float]]] = []
        self.window_h = 24.0
        self.ylim: tuple[float, float] | None = None
        self.plot_title = ""
        self._version = 0
        self._built: tuple[tuple, Text] | None = None

    def show(self, runs: list[tuple[list[float], list[float]]], *, window_h: float, title: str,
             ylim: tuple[float, float] | None = None) -> None:
        """Draw `runs` (see history_runs) over the last `window_h` hours."""
        if (runs, window_h, title, ylim) == (self.runs, self.window_h, self.plot_title, self.ylim):
            return
        self.runs, self.window_h, self.plot_title, self.ylim = runs, window_h, title, ylim
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
        for xs, ys in self.runs:
            if len(xs) == 1:
                plt.scatter(xs, ys, marker="braille")
            else:
                plt.plot(xs, ys, marker="braille")
        plt.xlim(-self.window_h, 0.0)
        ticks = [-self.window_h * k / 4 for k in range(4, -1, -1)]
        unit, div = ("d", 24.0) if self.window_h > 48 else ("h", 1.0)
        plt.xticks(ticks, [f"{t / div:g}{unit}" if t else "now" for t in ticks])
        if self.ylim is not None:
            plt.ylim(*self.ylim)
        text = super().render()
        assert isinstance(text, Text)
        self._built = (key, text)
        return text
