"""`gpuctl demo --history 30d`: restart the demo's simulated daemons with ``--history`` once their
slices have owners, so the simulated past is the demo departments' past (headless)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Any


def restart_with_history(nodes: Sequence[Any], history: str, preexec: Callable[[], None],
                         wait_ready: Callable[[Any], None]) -> None:
    """SIGTERM each node's gpuctld (gpuctl.demo.DemoNode), start it again with the same command
    plus ``--history HISTORY``, and wait until it answers. Raises RuntimeError (from wait_ready)
    naming the node when one does not come back."""
    for n in nodes:
        n.proc.terminate()
    for n in nodes:
        n.proc.wait(timeout=10)
        command = list(n.proc.args) + ["--history", history]
        with open(n.log, "ab") as logf:
            n.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                      preexec_fn=preexec)
    for n in nodes:
        wait_ready(n)
