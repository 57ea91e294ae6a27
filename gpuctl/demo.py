"""`gpuctl demo`: a simulated fleet of real gpuctld processes on this machine, and the console on it.

Starts N `gpuctld --backend simulated` processes (one per simulated node, each with its own state
directory and Unix socket under a temporary directory), gives their GPUs to the departments
research, training and inference (some split into 1/2 and 1/4 slices, some left unassigned),
writes a fleet config for them, opens the console, and stops the daemons on exit, on Ctrl-C, on
SIGTERM, and (through PR_SET_PDEATHSIG) when this process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx

from gpuctl.exit_codes import ExitCode
from gpuctl.transport.uds_http import uds_client

#: Departments of the demo fleet: (name, priority, color theme variable).
DEMO_DEPARTMENTS = (("research", 10, None), ("training", 20, None), ("inference", 30, None))

#: Per node, per GPU index: owner plan. "x" = whole GPU to department x; "a,b" = halves;
#: "a,b,c,d" = quarters; None = left unassigned. Node k uses row k % len(_LAYOUT).
_LAYOUT = (
    ("research", "research", "research", "training", "training", "inference", "research,training", None),
    ("training", "training", "training", "training", "inference", "inference",
     "inference,research,training,unassigned", None),
    ("research", "research", "inference", "inference", "inference", "training", "research,inference", None),
    ("inference", "training", "research", "research", None, None, "training,training,research,inference", None),
)


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM this child when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


@dataclass
class DemoNode:
    """One simulated node: its name, daemon process, socket and state directory."""

    name: str
    socket: Path
    state_dir: Path
    proc: subprocess.Popen
    log: Path


@dataclass
class DemoFleet:
    """The running demo: its temporary directory, config file and nodes."""

    root: Path
    config_path: Path
    nodes: list[DemoNode] = field(default_factory=list)
    #: copies of the config written elsewhere (--write-config), removed by stop()
    extra_files: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        """SIGTERM every daemon, wait up to 5 s, then SIGKILL what is left; remove the directory."""
        for n in self.nodes:
            if n.proc.poll() is None:
                n.proc.terminate()
        deadline = time.monotonic() + 5
        for n in self.nodes:
            try:
                n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
        for extra in self.extra_files:
            extra.unlink(missing_ok=True)


def _wait_ready(node: DemoNode, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"simulated node {node.name}: gpuctld exited with {node.proc.returncode}: "
                               f"{node.log.read_text(errors='replace')[-2000:]}")
        if node.socket.exists():
            try:
                with uds_client(str(node.socket), timeout_s=2) as c:
                    if c.get("/v1/health").status_code == 200:
                        return
            except httpx.HTTPError as exc:
                last = str(exc)
        time.sleep(0.05)
    raise RuntimeError(f"simulated node {node.name}: gpuctld not ready after {timeout_s:g} s ({last})")


def _layout_moves(status: dict, row: tuple) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """(splits, moves) for one node: splits as (gpu_uuid, parts), moves as (slice_id, department)."""
    splits, moves = [], []
    gpus = sorted(status["gpus"], key=lambda g: g["identity"]["index"])
    for g, plan in zip(gpus, row):
        uuid = g["identity"]["uuid"]
        if plan is None:
            continue
        owners = plan.split(",")
        if len(owners) > 1:
            splits.append((uuid, len(owners)))
        for k, dept in enumerate(owners):
            if dept != "unassigned":
                moves.append((f"{uuid}/{k}", dept))
    return splits, moves


def _assign_layout(node: DemoNode, row: tuple) -> None:
    """Split and assign one node's GPUs through its control API (the same calls an admin makes)."""
    with uds_client(str(node.socket), timeout_s=10) as c:
        status = c.get("/v1/status").raise_for_status().json()
        gen = status["generation"]
        if any(s["department"] != "unassigned" for g in status["gpus"] for s in g["slices"]):
            return  # state restored from disk: keep it
        splits, moves = _layout_moves(status, row)
        for i, (uuid, parts) in enumerate(splits):
            r = c.post("/v1/split", json={"request_id": f"demo-split-{i}", "generation": gen,
                                          "gpu_uuid": uuid, "parts": parts}).raise_for_status()
            gen = r.json()["generation"]
        if moves:
            r = c.post("/v1/assign", json={
                "request_id": "demo-layout", "generation": gen, "leased": "refuse",
                "moves": [{"slice_id": sid, "from": "unassigned", "to": d} for sid, d in moves]})
            r.raise_for_status()


def start_demo_fleet(nodes: int = 4, gpus: int = 8, seed: int = 0, root: Path | None = None) -> DemoFleet:
    """Start `nodes` simulated gpuctld processes with `gpus` GPUs each and write their fleet config.

    Node k (1-based, named "sim-01"...) runs with seed `seed + k`. Raises RuntimeError naming the
    node (and its log's tail) when a daemon fails to start; daemons already started are stopped.
    """
    from gpuctl.config import DepartmentConfig, FleetConfig, Location, NodeConfig, render_config

    root = Path(root or tempfile.mkdtemp(prefix="gpuctl-demo-"))
    fleet = DemoFleet(root=root, config_path=root / "fleet.toml")
    try:
        for k in range(1, nodes + 1):
            name = f"sim-{k:02d}"
            ndir = root / name
            ndir.mkdir(parents=True, exist_ok=True)
            sock, state, log = ndir / "gpuctld.sock", ndir / "state", ndir / "gpuctld.log"
            with open(log, "wb") as logf:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gpuctl.daemon", "serve", "--backend", "simulated",
                     "--gpus", str(gpus), "--seed", str(seed + k), "--state-dir", str(state),
                     "--socket", str(sock), "--interval", "1"],
                    stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, preexec_fn=_pdeathsig)
            fleet.nodes.append(DemoNode(name, sock, state, proc, log))
        for i, n in enumerate(fleet.nodes):
            _wait_ready(n)
            _assign_layout(n, _LAYOUT[i % len(_LAYOUT)])
        loc = Location(str(fleet.config_path), 0)
        cfg = FleetConfig(
            path=fleet.config_path,
            nodes=tuple(NodeConfig(name=n.name, host=None, transport="local", socket=str(n.socket),
                                   source=loc) for n in fleet.nodes),
            departments=tuple(DepartmentConfig(name=d, priority=p, color=c, source=loc)
                              for d, p, c in DEMO_DEPARTMENTS))
        fleet.config_path.write_text(render_config(cfg), encoding="utf-8")
    except BaseException:
        fleet.stop()
        raise
    return fleet


@contextlib.contextmanager
def demo_fleet(nodes: int = 4, gpus: int = 8, seed: int = 0) -> Iterator[DemoFleet]:
    """Context manager around start_demo_fleet that always stops the daemons (also on SIGTERM)."""
    fleet = start_demo_fleet(nodes, gpus, seed)

    def on_term(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield fleet
    finally:
        signal.signal(signal.SIGTERM, old)
        fleet.stop()


def run_demo(*, nodes: int = 4, gpus: int = 8, seed: int = 0, console: bool = True,
             readonly: bool = False, theme: str | None = None, json_out: bool = False,
             write_config: str | None = None) -> int:
    """The `gpuctl demo` verb. write_config: also copy the fleet config there (removed again when
    the demo stops). Returns an ExitCode."""
    from gpuctl.client import FleetClient, default_transport_factory
    from gpuctl.config import load_config

    print(f"gpuctl demo: starting {nodes} simulated nodes x {gpus} GPUs ...", file=sys.stderr)
    with demo_fleet(nodes, gpus, seed) as fleet:
        cfg = load_config(fleet.config_path)
        if write_config:
            Path(write_config).write_text(fleet.config_path.read_text(encoding="utf-8"), encoding="utf-8")
            fleet.extra_files.append(Path(write_config))
        if not console:
            info = {"config": str(fleet.config_path), "nodes": [n.name for n in fleet.nodes],
                    "pids": [n.proc.pid for n in fleet.nodes]}
            if json_out:
                print(json.dumps(info), flush=True)
            else:
                print(f"demo fleet running; config: {fleet.config_path}", flush=True)
                print(f"try: gpuctl --config {fleet.config_path} status    (Ctrl-C stops the demo)",
                      file=sys.stderr, flush=True)
            try:
                while all(n.proc.poll() is None for n in fleet.nodes):
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
            return ExitCode.OK
        client = FleetClient(cfg, default_transport_factory())
        try:
            from gpuctl.cli import run_console

            os.environ.setdefault("GPUCTL_DEMO_CONFIG", str(fleet.config_path))
            return run_console(client, readonly=readonly, theme=theme, refresh_s=cfg.refresh_s)
        finally:
            client.close()
