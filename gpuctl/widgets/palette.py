"""Theme colors resolved for Rich text inside DataTable cells and Static widgets.

DataTable cells are Rich renderables, which cannot read CSS variables, so the console resolves
the theme's variables (gpuctl's own, see gpuctl.themes.GPUCTL_VARIABLES, and Textual's) to plain
colors once per theme change and formats cells with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from textual.color import Color, ColorParseError

from gpuctl import model
from gpuctl.themes import DEPARTMENT_COLORS

#: SM utilization / memory use thresholds (%) between the low, mid and high colors.
UTIL_MID_PCT = 30.0
UTIL_HIGH_PCT = 80.0


@dataclass(frozen=True)
class Palette:
    """Resolved colors ("#RRGGBB") by variable name, and a color for each department.

    colors: every theme variable that parsed as a color, alpha blended onto the background.
    departments: department name -> color, in fleet-config order (dept-0, dept-1, ... cycling;
    a Department.color naming a variable ("dept-3" or "$dept-3") or a color wins).
    """

    colors: Mapping[str, str]
    departments: Mapping[str, str]

    def get(self, name: str, default: str = "") -> str:
        """The color of variable `name` (without "$"), or `default`."""
        return self.colors.get(name, default)

    @property
    def error(self) -> str:
        return self.get("error", "red")

    @property
    def warning(self) -> str:
        return self.get("warning", "yellow")

    @property
    def muted(self) -> str:
        return self.get("foreground-muted", self.get("foreground", ""))

    def util(self, pct: float | None) -> str:
        """Color for a utilization percentage (low/mid/high); muted for N/A."""
        if pct is None:
            return self.muted
        if pct >= UTIL_HIGH_PCT:
            return self.get("gpu-util-high")
        if pct >= UTIL_MID_PCT:
            return self.get("gpu-util-mid")
        return self.get("gpu-util-low")

    def department(self, name: str) -> str:
        """Color of department `name` (dept-unassigned for "unassigned" and unknown names)."""
        return self.departments.get(name) or self.get("dept-unassigned", self.muted)


def build_palette(variables: Mapping[str, str], departments: Sequence[model.Department]) -> Palette:
    """Resolve `variables` (App.get_css_variables()) and color `departments` (see Palette)."""
    background = _parse(variables.get("background", "")) or Color(0, 0, 0)
    colors: dict[str, str] = {}
    for name, value in variables.items():
        color = _parse(value)
        if color is not None:
            colors[name] = (background + color).hex if color.a < 1 else color.hex
    dept_colors: dict[str, str] = {}
    for i, dept in enumerate(departments):
        chosen = None
        if dept.color:
            var = dept.color.removeprefix("$")
            chosen = colors.get(var)
            if chosen is None and (color := _parse(dept.color)) is not None:
                chosen = color.hex
        dept_colors[dept.name] = chosen or colors.get(f"dept-{i % DEPARTMENT_COLORS}", "")
    return Palette(colors=colors, departments=dept_colors)


def _parse(value: str) -> Color | None:
    try:
        return Color.parse(value)
    except (ColorParseError, ValueError, TypeError):
        return None
