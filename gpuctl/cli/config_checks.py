"""What `gpuctl config check` adds to the config's own validation: the console's theme names and
department colors checked against what the console will accept (its theme files and Textual's
built-in themes, Textual's color parser), and, with `--connect`, every node reached and reported.

Textual is imported here only when `config check` runs (like the console verb); gpuctl.config
itself stays headless and takes these checks as gpuctl.config.ValueChecks.
"""

from __future__ import annotations

import time
from typing import Any


def console_checks() -> tuple[Any, list[str]]:
    """(gpuctl.config.ValueChecks for theme names and colors, messages about theme files that
    will be skipped). A theme is known when a theme file defines it (gpuctl.themes.
    default_theme_dirs) or Textual has it built in; a color is what Textual's CSS accepts
    (#rrggbb, names like dodgerblue) or a ``$variable``."""
    from textual.color import Color, ColorParseError
    from textual.theme import BUILTIN_THEMES

    from gpuctl.config import ValueChecks
    from gpuctl.themes import load_themes

    loaded = load_themes()
    own = sorted(loaded.themes)
    known = own + sorted(n for n in BUILTIN_THEMES if n not in loaded.themes)

    def theme(name: str) -> str | None:
        if name in loaded.themes or name in BUILTIN_THEMES:
            return None
        return f"unknown theme {name!r}; known themes: {', '.join(known)}"

    def color(value: str) -> str | None:
        if value.startswith("$"):
            return None  # a theme variable, resolved by the console's theme
        try:
            Color.parse(value)
        except ColorParseError:
            return f"unknown color {value!r}: use '#rrggbb' or a CSS color name like 'dodgerblue'"
        return None

    return ValueChecks(theme=theme, color=color), [f"theme file skipped by the console: {e}" for e in loaded.errors]


def connect_all(args: Any, cfg: Any) -> list[dict[str, Any]]:
    """Reach every node of `cfg` (GET /v1/health through its transport, in parallel, each within
    its timeout) and report each: ``{"name", "ok", "seconds", "version", "error"}`` in config order.
    Never raises for a node that cannot be reached: its row says why."""
    from gpuctl.cli.context import open_fleet

    fleet = open_fleet(args, cfg)
    started: dict[str, float] = {}
    took: dict[str, float] = {}

    def health(client: Any) -> dict[str, Any]:
        started[client.name] = time.monotonic()
        try:
            return client.request("GET", "/v1/health")
        finally:
            took[client.name] = time.monotonic() - started[client.name]

    try:
        res = fleet.fan_out(health)
    finally:
        fleet.close()
    rows = []
    for n in cfg.nodes:
        answer = res.values.get(n.name)
        error = res.errors.get(n.name)
        rows.append({"name": n.name, "ok": error is None and answer is not None,
                     "seconds": round(took.get(n.name, 0.0), 3),
                     "version": (answer or {}).get("version") if isinstance(answer, dict) else None,
                     "error": None if error is None else str(error)})
    return rows
