"""`gpuctl demo --history 30d`: restart the demo's simulated daemons with ``--history`` once their
slices have owners, so the simulated past is the demo departments' past (headless)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuctl.daemon.usage_db import DB_NAME


def restart_with_history(nodes: Sequence[Any], history: str, spawn: Callable[[list[str], Path], Any],
                         wait_ready: Callable[[Any], None]) -> None:
    """SIGTERM each node's gpuctld (gpuctl.fleet.demo.DemoNode), drop the seconds of usage it recorded
    before its slices had owners (the simulated past takes their place, so the past and the live
    recording meet without a gap), start it again with the same command plus ``--history
    HISTORY`` (``spawn(command, log)`` starts it: gpuctl.fleet.demo.spawn_daemon), and wait until it
    answers. Raises RuntimeError (from wait_ready) naming the node
    when one does not come back."""
    for n in nodes:
        n.proc.terminate()
    for n in nodes:
        n.proc.wait(timeout=10)
        for f in Path(n.state_dir).glob(f"{DB_NAME}*"):
            f.unlink()
        n.proc = spawn(list(n.proc.args) + ["--history", history], n.log)
    for n in nodes:
        wait_ready(n)
