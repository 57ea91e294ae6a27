"""Plots of one GPU's telemetry over the last 10 minutes (node detail), with textual-plotext.

`metric_runs` turns a GPU's history (GpuSample list from the daemon's ring, oldest first) into
the runs of one figure that a plot draws as separate lines: a sample whose figure is N/A (None),
or a gap in time longer than `max_gap_s` (the daemon or the node was down), ends a run, so a gap
stays a gap and is never drawn as a zero or bridged by a line. x is minutes relative to the newest
sample (-10 .. 0), y is in the metric's unit.

`MetricPlot` is a PlotextPlot that draws such runs with a title naming the unit, an x axis in
minutes and fixed y limits where the figure has them (SM utilization 0..100 %, memory
0..total GiB). It rebuilds its plot only when its data, size or theme changed (plotext takes
~10 ms a build).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual_plotext import PlotextPlot

from gpuctl import model
from gpuctl import format as fmt

#: How far back the plots reach, seconds.
WINDOW_S = 600.0


@dataclass(frozen=True)
class Metric:
    """A plotted figure: key, title (with its unit) and the unit alone."""

    key: str
    title: str
    unit: str


#: The four plots of a GPU, in display order.
METRICS = (
    Metric("sm", "SM util", "%"),
    Metric("memory", "memory", "GiB"),
    Metric("power", "power", "W"),
    Metric("temperature", "temp", "°C"),
)


def metric_value(sample: model.GpuSample, metric: str) -> float | None:
    """The plotted figure of `metric` in `sample`: SM utilization %, memory used GiB (bytes /
    2**30), power W, temperature °C; None when N/A or the GPU did not answer (sample.error)."""
    if sample.error:
        return None
    if metric == "sm":
        return sample.sm_util_pct
    if metric == "memory":
        return None if sample.memory_used_bytes is None else sample.memory_used_bytes / fmt.GIB
    if metric == "power":
        return sample.power_w
    if metric == "temperature":
        return sample.temperature_c
    raise ValueError(f"unknown metric {metric!r} (known: {', '.join(m.key for m in METRICS)})")


def metric_runs(
    samples: Sequence[model.GpuSample], metric: str, *, max_gap_s: float = 5.0
) -> list[tuple[list[float], list[float]]]:
    """The runs of `metric` over `samples` (oldest first) as (x minutes before the newest sample,
    y) lists; a None figure or more than `max_gap_s` seconds between samples ends a run."""
    if not samples:
        return []
    newest = samples[-1].timestamp_s
    runs: list[tuple[list[float], list[float]]] = []
    xs: list[float] = []
    ys: list[float] = []
    last_t: float | None = None
    for s in samples:
        value = metric_value(s, metric)
        gap = last_t is not None and s.timestamp_s - last_t > max_gap_s
        if (value is None or gap) and xs:
            runs.append((xs, ys))
            xs, ys = [], []
        if value is not None:
            xs.append((s.timestamp_s - newest) / 60.0)
            ys.append(float(value))
        last_t = s.timestamp_s
    if xs:
        runs.append((xs, ys))
    return runs


def nice_ticks(low: float, high: float, count: int = 3) -> list[float]:
    """At most `count` + 1 round tick values (steps of 1, 2, 2.5, 4 or 5 x 10**k) from `low` to
    `high`."""
    span = high - low
    if not span > 0:
        return [low]
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    steps = [m * magnitude for m in (1, 2, 2.5, 4, 5, 10) if m * magnitude >= raw * (1 - 1e-9)]

    def on_grid(value: float, step: float) -> bool:
        return abs(value / step - round(value / step)) < 1e-6

    # prefer a step whose ticks land on both ends (0, 50, 100 rather than 0, 40, 80)
    step = next((st for st in steps if on_grid(low, st) and on_grid(high, st)), steps[0])
    first = math.ceil(low / step) * step
    ticks = []
    t = first
    while t <= high + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def auto_limits(values: Sequence[float], *, from_zero: bool = True) -> tuple[float, float]:
    """Y limits for `values`: from 0 (or a round number below the minimum) to a round number
    above the maximum; (0, 1) for no values."""
    if not values:
        return (0.0, 1.0)
    top, bottom = max(values), min(values)
    low = 0.0 if from_zero or bottom <= 0 else bottom
    if top <= low:
        return (float(low), float(low) + 1.0)
    span = top - low
    magnitude = 10 ** math.floor(math.log10(span))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude * 4 >= span)
    high = math.ceil(top / step) * step
    if not from_zero:
        low = math.floor(low / step) * step
    if high <= low:
        high = low + step
    return (float(low), float(high))


def _rgb(color: str) -> tuple[int, int, int] | str:
    """"#RRGGBB" -> (r, g, b) for plotext; anything else is passed as a plotext color name."""
    if len(color) == 7 and color.startswith("#"):
        try:
            return (int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16))
        except ValueError:
            pass
    return color or "default"


class MetricPlot(PlotextPlot):
    """One metric of one GPU over the last WINDOW_S seconds (see the module doc)."""

    DEFAULT_CSS = """
    MetricPlot { width: 1fr; height: 1fr; min-height: 5; }
    """

    def __init__(self, metric: Metric, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.metric = metric
        self.runs: list[tuple[list[float], list[float]]] = []
        self.ylim: tuple[float, float] | None = None
        self.color = "default"
        self.note = ""
        self.yticks: list[float] | None = None
        self._version = 0
        self._built: tuple[tuple, Text] | None = None

    def show(
        self,
        runs: list[tuple[list[float], list[float]]],
        *,
        color: str,
        ylim: tuple[float, float] | None = None,
        note: str = "",
    ) -> None:
        """Plot `runs` (see metric_runs) in `color` ("#RRGGBB"), y limits `ylim` (None: 0 .. a
        round number above the data, or below it too for temperature), `note` after the title
        (e.g. "93% (max 99%)" or why there is no history)."""
        if ylim is None:
            ylim = auto_limits([y for _, ys in runs for y in ys], from_zero=self.metric.key != "temperature")
        if runs == self.runs and ylim == self.ylim and color == self.color and note == self.note:
            return
        self.runs, self.ylim, self.color, self.note = runs, ylim, color, note
        self.yticks = nice_ticks(*ylim)
        self._version += 1
        self.refresh()

    @property
    def title(self) -> str:
        """The plot's title: the metric, its unit, and the note."""
        head = f"{self.metric.title} ({self.metric.unit})"
        return f"{head} {self.note}" if self.note else head

    def render(self) -> Text:
        key = (self._version, self.size.width, self.size.height, self.app.theme)
        if self._built is not None and self._built[0] == key:
            return self._built[1]
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        title = self.title
        if len(title) > self.size.width - 2:  # plotext leaves out a title that does not fit
            title = title[: max(0, self.size.width - 3)] + "…"
        plt.title(title)
        color = _rgb(self.color)
        for xs, ys in self.runs:
            if len(xs) == 1:
                plt.scatter(xs, ys, color=color, marker="braille")
            else:
                plt.plot(xs, ys, color=color, marker="braille")
        plt.xlim(-WINDOW_S / 60.0, 0.0)
        plt.xticks([-10, -8, -6, -4, -2, 0], ["-10m", "-8m", "-6m", "-4m", "-2m", "now"])
        if self.ylim is not None:
            plt.ylim(*self.ylim)
        if self.yticks:
            plt.yticks(self.yticks, [f"{t:g}" for t in self.yticks])
        text = super().render()
        assert isinstance(text, Text)
        self._built = (key, text)
        return text
