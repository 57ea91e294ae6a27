"""gpuctl's console themes: TOML files turned into textual.theme.Theme objects.

A theme file (themes/*.toml in the repository, or $XDG_CONFIG_HOME/gpuctl/themes/*.toml; a file in
the user's directory replaces a repository theme of the same name)::

    name = "gpuctl-dark"          # optional: defaults to the file's stem
    dark = true                   # optional: default true
    [colors]                      # Textual's base colors; `primary` is required
    primary = "#56B4E9"
    background = "#101418"        # also: secondary warning error success accent foreground
                                  #       surface panel boost
    [variables]                   # gpuctl's own variables (see GPUCTL_VARIABLES) and any of
    gpu-util-high = "#D55E00"     # Textual's CSS variables (e.g. footer-key-foreground)

A file that cannot be read or is invalid is reported (the message names the file, the line when
known, and the field) and skipped; the console then uses the default theme. The CSS of the console
uses only variables; the defaults below are the one place with color codes, so a theme that leaves
a gpuctl variable out still works.
"""

from __future__ import annotations

import os
import sys
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

#: The theme used when none is asked for.
DEFAULT_THEME = "gpuctl-dark"
#: Textual's built-in theme used when gpuctl-dark itself cannot be loaded.
FALLBACK_THEME = "textual-dark"

#: The repository's themes directory.
REPO_THEMES_DIR = Path(__file__).resolve().parent.parent / "themes"

#: Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008): distinguishable under the
#: common color-vision deficiencies (protanopia, deuteranopia, tritanopia).
OKABE_ITO = {
    "orange": "#E69F00",
    "sky-blue": "#56B4E9",
    "bluish-green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish-purple": "#CC79A7",
    "grey": "#999999",
}

#: gpuctl's own theme variables and their defaults (used where a theme leaves one out).
#: gpu-util-low/mid/high: bars and sparklines below 30 %, 30..80 %, above 80 % (SM utilization
#: and memory use). slice-idle/slice-busy: unleased/leased slices. dept-0..dept-7: department
#: colors, given to departments in fleet-config order. dept-unassigned: slices owned by nobody.
GPUCTL_VARIABLES: dict[str, str] = {
    "gpu-util-low": OKABE_ITO["bluish-green"],
    "gpu-util-mid": OKABE_ITO["yellow"],
    "gpu-util-high": OKABE_ITO["vermillion"],
    "gpu-sparkline": OKABE_ITO["sky-blue"],
    "slice-idle": OKABE_ITO["bluish-green"],
    "slice-busy": OKABE_ITO["orange"],
    "dept-0": OKABE_ITO["sky-blue"],
    "dept-1": OKABE_ITO["orange"],
    "dept-2": OKABE_ITO["bluish-green"],
    "dept-3": OKABE_ITO["reddish-purple"],
    "dept-4": OKABE_ITO["yellow"],
    "dept-5": OKABE_ITO["blue"],
    "dept-6": OKABE_ITO["vermillion"],
    "dept-7": OKABE_ITO["grey"],
    "dept-unassigned": OKABE_ITO["grey"],
}

#: Number of department colors (dept-0 .. dept-7); departments past the 8th reuse them.
DEPARTMENT_COLORS = 8

_COLOR_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)
_TOP_KEYS = {"name", "dark", "luminosity_spread", "text_alpha", "colors", "variables"}


class ThemeFileError(Exception):
    """A theme file that cannot be used; the message names the file, line (when known) and field."""


@dataclass
class ThemeLoad:
    """The result of :func:`load_themes`: themes by name, and one message per bad file."""

    themes: dict[str, Theme] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def default_theme_dirs() -> list[Path]:
    """Where themes are looked for, in order (later ones win on equal names): the repository's
    themes/ (editable install) or <prefix>/share/gpuctl/themes (wheel install, pyproject's
    data-files), then $XDG_CONFIG_HOME/gpuctl/themes (XDG_CONFIG_HOME defaults to ~/.config)."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    shipped = REPO_THEMES_DIR if REPO_THEMES_DIR.is_dir() else Path(sys.prefix) / "share" / "gpuctl" / "themes"
    return [shipped, Path(xdg) / "gpuctl" / "themes"]


def _where(path: Path, text: str, key: str) -> str:
    """`path:line` of the first line assigning `key` (a bare or quoted key), else `path`."""
    pattern = re.compile(rf'^\s*(?:"{re.escape(key)}"|{re.escape(key)})\s*=', re.MULTILINE)
    m = pattern.search(text)
    if m is None:
        return str(path)
    return f"{path}:{text.count(chr(10), 0, m.start()) + 1}"


def _check_color(path: Path, text: str, section: str, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ThemeFileError(
            f"{_where(path, text, key)}: {section}.{key}: expected a color string, got {value!r}"
        )
    try:
        Color.parse(value)
    except ColorParseError as e:
        raise ThemeFileError(f"{_where(path, text, key)}: {section}.{key}: {e}") from None
    return value


def load_theme_file(path: Path) -> Theme:
    """Read one theme file (format in the module doc) into a Theme.

    Raises ThemeFileError when the file cannot be read, is not UTF-8, is not valid TOML (the
    message keeps tomllib's line and column), has an unknown key, lacks colors.primary, or has a
    value that is not a color where one is needed.
    """
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ThemeFileError(f"{path}: cannot read theme file: {e.strerror or e}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ThemeFileError(f"{path}: theme file must be UTF-8 (byte {e.start} is not)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ThemeFileError(f"{path}: invalid TOML: {e}") from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ThemeFileError(
            f"{_where(path, text, unknown[0])}: unknown key {unknown[0]!r} "
            f"(known: {', '.join(sorted(_TOP_KEYS))})"
        )
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise ThemeFileError(f"{_where(path, text, 'name')}: name: expected a non-empty string, got {name!r}")
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeFileError(f"{_where(path, text, 'dark')}: dark: expected true or false, got {dark!r}")
    extra: dict[str, float] = {}
    for key in ("luminosity_spread", "text_alpha"):
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ThemeFileError(
                    f"{_where(path, text, key)}: {key}: expected a number in 0..1, got {value!r}"
                )
            extra[key] = float(value)
    colors = data.get("colors", {})
    if not isinstance(colors, dict):
        raise ThemeFileError(f"{_where(path, text, 'colors')}: colors: expected a table")
    for key in colors:
        if key not in _COLOR_FIELDS:
            raise ThemeFileError(
                f"{_where(path, text, key)}: colors.{key}: unknown color (known: {', '.join(_COLOR_FIELDS)})"
            )
    if "primary" not in colors:
        raise ThemeFileError(f"{path}: colors.primary is required")
    checked = {key: _check_color(path, text, "colors", key, v) for key, v in colors.items()}
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ThemeFileError(f"{_where(path, text, 'variables')}: variables: expected a table")
    out_vars: dict[str, str] = {}
    for key, value in variables.items():
        if key in GPUCTL_VARIABLES:
            out_vars[key] = _check_color(path, text, "variables", key, value)
        elif isinstance(value, str):
            out_vars[key] = value
        else:
            raise ThemeFileError(
                f"{_where(path, text, key)}: variables.{key}: expected a string, got {value!r}"
            )
    return Theme(name=name, dark=dark, variables=out_vars, **checked, **extra)


def load_themes(dirs: list[Path] | None = None) -> ThemeLoad:
    """Every *.toml theme in `dirs` (default :func:`default_theme_dirs`), files in name order;
    a missing directory is skipped silently, a bad file adds one message to `errors`."""
    result = ThemeLoad()
    for directory in default_theme_dirs() if dirs is None else dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            try:
                theme = load_theme_file(path)
            except ThemeFileError as e:
                result.errors.append(str(e))
                continue
            result.themes[theme.name] = theme
    return result


class UnknownThemeError(ValueError):
    """A theme name that is not registered; the message lists the known names."""

    def __init__(self, name: str, known: list[str]):
        super().__init__(f"unknown theme {name!r}; known themes: {', '.join(known)}")
        self.name = name
        self.known = known
