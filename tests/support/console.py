"""The one factory of console apps for tests: gpuctl.app.build_app (the CLI's factory too) with
polling only when told and the repository's themes only."""

from __future__ import annotations

from typing import Any

from gpuctl.app import GpuctlApp, build_app
from gpuctl.themes import REPO_THEMES_DIR


def make_app(source: Any, **kw: Any) -> GpuctlApp:
    """An app on `source` (a FleetSource) that polls only when told (refresh_s is an hour unless
    given) and reads only the repo's themes; other keyword arguments go to build_app."""
    kw.setdefault("refresh_s", 3600.0)
    return build_app(source, theme_dirs=[REPO_THEMES_DIR], **kw)
