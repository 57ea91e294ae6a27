"""The one factory of console apps for tests: gpuctl.app.build_app (the CLI's factory too) with
polling only when told and the repository's themes only."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable

from gpuctl.app import GpuctlApp, build_app
from gpuctl.themes import REPO_THEMES_DIR

SIZE = (120, 40)
#: Wide enough for the full layout (every column of the fleet table).
WIDE = (200, 60)


def make_app(source: Any, **kw: Any) -> GpuctlApp:
    """An app on `source` (a FleetSource) that polls only when told (refresh_s is an hour unless
    given) and reads only the repo's themes; other keyword arguments go to build_app."""
    kw.setdefault("refresh_s", 3600.0)
    return build_app(source, theme_dirs=[REPO_THEMES_DIR], **kw)


async def settle(app: GpuctlApp, pilot) -> None:
    """Wait for running workers (poll, history) and for the messages they posted."""
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def poll(app: GpuctlApp, pilot) -> None:
    """Poll now and wait for the snapshot to be shown."""
    app.poll()
    await settle(app, pilot)


def table(app: GpuctlApp) -> DataTable:
    """The fleet screen's table."""
    return app.screen.query_one("#fleet-table", DataTable)


def cell(app: GpuctlApp, row_key: str, column: str) -> str:
    """The plain text of one fleet-table cell."""
    return str(table(app).get_cell(row_key, column))


def styles_of(text) -> str:
    """Every style of a Rich Text cell (its own and its spans'), as one string."""
    return " ".join([str(text.style)] + [str(span.style) for span in text.spans])


async def type_text(pilot, text: str) -> None:
    """Press the keys of `text` one by one."""
    for ch in text:
        await pilot.press({" ": "space", "-": "minus", ":": "colon", "/": "slash"}.get(ch, ch))


def screen_lines(app: GpuctlApp) -> list[str]:
    """The whole terminal as plain text lines (what a terminal shows, modal backdrops included)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def post_keys(app: GpuctlApp, *keys: str) -> None:
    """Queue key events on the app all at once, as a fast typist or tmux send-keys delivers them
    (Pilot.press waits for idle between keys, which hides focus races)."""
    from textual import events

    chars = {"colon": ":", "space": " ", "minus": "-", "enter": "\r", "slash": "/"}
    for key in keys:
        app.post_message(events.Key(key, chars.get(key, key if len(key) == 1 else None)))


def stack_names(app: GpuctlApp) -> list[str]:
    """The class names of the screen stack, bottom first."""
    return [type(s).__name__ for s in app.screen_stack]
