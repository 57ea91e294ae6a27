"""One gpuctld of a bench's own on this machine, and the fleet config that reaches it (shared by
bench/ddp.py and bench/native.py; they run as `python bench/NAME.py`, so this imports as `_gpuctld`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class LocalGpuctld:
    """`python -m gpuctl.daemon serve --backend BACKEND ... SERVE_ARGS` with its state, socket, log
    (gpuctld.log) and a one-node fleet config (fleet.toml, node "gpu-node", local transport) under
    `tmp`. `env` is this environment with the checkout first on PYTHONPATH, for gpuctl commands too.
    Waits up to 60 s for the socket; raises SystemExit with the daemon's log when it does not come."""

    def __init__(self, tmp: Path, backend: str, serve_args: list[str]):
        self.tmp = tmp
        self.socket = tmp / "gpuctld.sock"
        self.config = tmp / "fleet.toml"
        self.config.write_text(f'[[node]]\nname = "gpu-node"\ntransport = "local"\nsocket = "{self.socket}"\n')
        self.env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.log = open(tmp / "gpuctld.log", "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuctl.daemon", "serve", "--backend", backend, *serve_args,
             "--state-dir", str(tmp / "state"), "--socket", str(self.socket), "--interval", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env, cwd=tmp)
        deadline = time.monotonic() + 60
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gpuctld did not start:\n{self.log_text()}")
            time.sleep(0.1)

    def log_text(self) -> str:
        """The daemon's stdout and stderr so far."""
        if not self.log.closed:
            self.log.flush()
        return (self.tmp / "gpuctld.log").read_text(errors="replace")

    def client(self):
        """An httpx client on the daemon's control socket (timeout 30 s); httpx is imported here,
        so a bench's worker processes do not need it."""
        import httpx

        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://gpuctld",
                            timeout=30)

    def stop(self) -> None:
        """SIGTERM, up to 60 s to exit, then SIGKILL; closes the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
