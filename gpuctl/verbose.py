"""`gpuctl -v`: diagnostics of how each node was reached, on stderr (never stdout, which carries data).

The transports log one INFO line per node and channel kind on the "gpuctl" logger (e.g. ``node gpu01
(10.0.0.5:22): control channel: streamlocal (direct-streamlocal@openssh.com to
/run/gpuctld/gpuctld.sock), opened in 0.6 ms``); :func:`enable_verbose` shows them.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO


def enable_verbose(stream: TextIO | None = None) -> logging.Handler:
    """Show the "gpuctl" logger's INFO lines on `stream` (default stderr) as ``gpuctl: MESSAGE``;
    returns the handler added (other libraries' loggers stay quiet)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("gpuctl: %(message)s"))
    logger = logging.getLogger("gpuctl")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler
