"""`gpuctl demo`: a simulated fleet of real gpuctld processes on this machine, and the console on it.

Starts N `gpuctld --backend simulated` processes (one per simulated node, each with its own state
directory and Unix socket under a temporary directory), gives their GPUs to the departments
research, training and inference (some split into 1/2 and 1/4 slices, some left unassigned),
writes a fleet config for them, opens the console, and stops the daemons on exit, on Ctrl-C, on
SIGTERM, and (through PR_SET_PDEATHSIG) when this process dies.

Failure handling can be tried on it: a daemon that dies (kill it) leaves the demo running with
that node shown down; :meth:`DemoFleet.restart_dead` (SIGUSR1 to the `gpuctl demo` process, the
console's restart command, or `--no-console --restart-after SECONDS`) starts it again on its state
directory. Everything the demo creates lives under its temporary directory (config, sockets, state,
and, through TMPDIR, the lease workers' run directories) and is removed on exit.

Every daemon is started as ``python -P -m gpuctl.daemon`` with the demo's directory as working
directory: a folder named ``gpuctl`` where `gpuctl demo` was run (e.g. the parent of a clone)
never shadows the installed package.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import shutil
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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


def spawn_daemon(command: list[str], log: Path, root: Path) -> subprocess.Popen:
    """Start one demo gpuctld: `command` (argv, see :func:`daemon_command`), output appended to
    `log`, working directory `root` and TMPDIR `root`/tmp (lease run directories stay in the demo's
    directory), SIGTERM'd when this process dies."""
    tmp = root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmp))
    with open(log, "ab") as logf:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=str(root),
                                env=env, preexec_fn=_pdeathsig)


def _without_history(command: list[str]) -> list[str]:
    """`command` less ``--history VALUE``: a restarted node keeps the past already in its database."""
    out, skip = [], False
    for tok in command:
        if skip:
            skip = False
        elif tok == "--history":
            skip = True
        else:
            out.append(tok)
    return out


#: The demo fleet this process runs (set by :func:`demo_fleet`), for the console's restart command.
_current: "DemoFleet | None" = None


def current_demo() -> "DemoFleet | None":
    """The DemoFleet that `gpuctl demo` runs in this process, or None (not a demo). The console's
    `:node NAME restart` calls ``current_demo().restart(NAME)`` (blocking: from a worker thread)."""
    return _current


def daemon_command(*, gpus: int, seed: int, state: Path, sock: Path) -> list[str]:
    """argv of one demo gpuctld: ``python -P -m gpuctl.daemon serve --backend simulated ...`` (-P:
    the working directory is never on sys.path, so only the installed gpuctl is imported)."""
    return [sys.executable, "-P", "-m", "gpuctl.daemon", "serve", "--backend", "simulated",
            "--gpus", str(gpus), "--seed", str(seed), "--state-dir", str(state),
            "--socket", str(sock), "--interval", "1"]


@dataclass
class DemoNode:
    """One simulated node: its name, daemon process, socket and state directory."""

    name: str
    socket: Path
    state_dir: Path
    proc: subprocess.Popen
    log: Path

    @property
    def alive(self) -> bool:
        """True while its gpuctld process runs."""
        return self.proc.poll() is None


@dataclass
class DemoFleet:
    """The running demo: its temporary directory, config file and nodes."""

    root: Path
    config_path: Path
    nodes: list[DemoNode] = field(default_factory=list)
    #: copies of the config written elsewhere (--write-config), removed by stop()
    extra_files: list[Path] = field(default_factory=list)
    _restart_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: the one thread that starts restarted daemons: PR_SET_PDEATHSIG fires when the *thread* that
    #: forked the child ends, so a daemon started from a short-lived thread (a console worker, a
    #: signal's helper thread) would be SIGTERM'd at once; this thread lives as long as the demo
    _spawner: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-spawn"), repr=False)

    def node(self, name: str) -> DemoNode:
        """The node called `name`; KeyError (naming the known ones) for another name."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no demo node {name!r} (nodes: {', '.join(n.name for n in self.nodes)})")

    def dead(self) -> list[DemoNode]:
        """Nodes whose gpuctld is not running (killed, crashed)."""
        return [n for n in self.nodes if not n.alive]

    def restart(self, name: str, timeout_s: float = 20.0) -> bool:
        """Start node `name`'s gpuctld again (same command, same state directory: slices, owners
        and schedule are restored; leases found at start-up are ended) and wait until it answers.
        A node still running is SIGTERM'd first. Returns True when it answers; raises KeyError for
        an unknown node, RuntimeError (with the log's tail) when it does not come back."""
        n = self.node(name)
        with self._restart_lock:
            if n.alive:
                n.proc.terminate()
                try:
                    n.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    n.proc.kill()
                    n.proc.wait()
            n.proc = self._spawner.submit(spawn_daemon, _without_history(list(n.proc.args)), n.log,
                                          self.root).result()
            _wait_ready(n, timeout_s)
        return True

    def restart_dead(self) -> list[str]:
        """Restart every node whose gpuctld is not running; returns their names (restarted).
        Raises RuntimeError for one that does not come back (the others are still restarted first)."""
        names, failed = [], []
        for n in self.dead():
            try:
                self.restart(n.name)
                names.append(n.name)
            except RuntimeError as e:
                failed.append(str(e))
        if failed:
            raise RuntimeError("; ".join(failed))
        return names

    def stop(self) -> None:
        """SIGTERM every daemon, wait up to 5 s, then SIGKILL what is left; remove the directory
        (config, sockets, state, lease run directories) and the --write-config copy."""
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
        self._spawner.shutdown(wait=False)
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


def start_demo_fleet(nodes: int = 4, gpus: int = 8, seed: int = 0, root: Path | None = None,
                     history: str | None = None) -> DemoFleet:
    """Start `nodes` simulated gpuctld processes with `gpus` GPUs each and write their fleet config.

    history: a duration (``30d``): once the demo layout is assigned, each daemon is restarted with
    ``--history`` so its usage database holds a simulated past of the demo's departments.

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
            proc = spawn_daemon(daemon_command(gpus=gpus, seed=seed + k, state=state, sock=sock), log, root)
            fleet.nodes.append(DemoNode(name, sock, state, proc, log))
        for i, n in enumerate(fleet.nodes):
            _wait_ready(n)
            _assign_layout(n, _LAYOUT[i % len(_LAYOUT)])
        if history:
            from gpuctl.fleet.demo_history import restart_with_history

            restart_with_history(fleet.nodes, history, lambda command, log: spawn_daemon(command, log, root),
                                 _wait_ready)
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
def demo_fleet(nodes: int = 4, gpus: int = 8, seed: int = 0, *,
               write_config: str | None = None, history: str | None = None) -> Iterator[DemoFleet]:
    """Context manager around start_demo_fleet that always stops the daemons (also on SIGTERM,
    turned into KeyboardInterrupt). write_config: also copy the fleet config there (removed again
    when the demo stops). history: a usage past of that length (e.g. "30d") for each node."""
    print(f"gpuctl demo: starting {nodes} simulated nodes x {gpus} GPUs ...", file=sys.stderr)
    fleet = start_demo_fleet(nodes, gpus, seed, history=history)

    def on_term(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    global _current
    old = signal.signal(signal.SIGTERM, on_term)
    old_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: restart_dead_in_background(fleet))
    _current = fleet
    try:
        if write_config:
            Path(write_config).write_text(fleet.config_path.read_text(encoding="utf-8"), encoding="utf-8")
            fleet.extra_files.append(Path(write_config))
        yield fleet
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGUSR1, old_usr1)
        _current = None
        fleet.stop()


def restart_dead_in_background(fleet: DemoFleet) -> threading.Thread:
    """Restart the fleet's dead nodes in a thread (what SIGUSR1 does: a signal handler must not
    block the console); each restart, or why it failed, is one line on stderr."""
    def run() -> None:
        try:
            names = fleet.restart_dead()
        except RuntimeError as e:
            print(f"gpuctl demo: restart failed: {e}", file=sys.stderr, flush=True)
            return
        if names:
            print(f"gpuctl demo: restarted {', '.join(names)}", file=sys.stderr, flush=True)

    t = threading.Thread(target=run, name="demo-restart", daemon=True)
    t.start()
    return t


def serve_without_console(fleet: DemoFleet, *, json_out: bool = False, restart_after_s: float | None = None) -> int:
    """`gpuctl demo --no-console`: print the config path (stdout; JSON with the node names and pids
    when json_out), then wait until Ctrl-C/SIGTERM. A daemon that dies is said once on stderr and
    the demo keeps running with that node down (SIGUSR1 restarts dead nodes); with
    `restart_after_s`, a dead node is restarted that many seconds after it was seen down.
    Returns ExitCode.OK."""
    info = {"config": str(fleet.config_path), "nodes": [n.name for n in fleet.nodes],
            "pids": [n.proc.pid for n in fleet.nodes], "pid": os.getpid()}
    if json_out:
        print(json.dumps(info), flush=True)
    else:
        print(f"demo fleet running; config: {fleet.config_path}", flush=True)
        pids = ", ".join(f"{n.name} {n.proc.pid}" for n in fleet.nodes)
        print(f"try: gpuctl --config {fleet.config_path} status    (Ctrl-C stops the demo; kill a node's "
              f"gpuctld to see it down (pids: {pids}), `kill -USR1 {os.getpid()}` restarts it)",
              file=sys.stderr, flush=True)
    down_since: dict[str, float] = {}
    try:
        while True:
            now = time.monotonic()
            for n in fleet.nodes:
                if n.alive:
                    if n.name in down_since:
                        print(f"gpuctl demo: node {n.name} is back (pid {n.proc.pid})", file=sys.stderr, flush=True)
                        del down_since[n.name]
                    continue
                if n.name not in down_since:
                    down_since[n.name] = now
                    print(f"gpuctl demo: node {n.name} is down (gpuctld exited with {n.proc.returncode}); the demo "
                          f"goes on without it" + (f", restart in {restart_after_s:g} s" if restart_after_s is not None
                                                   else f"; `kill -USR1 {os.getpid()}` restarts it"),
                          file=sys.stderr, flush=True)
                elif restart_after_s is not None and now - down_since[n.name] >= restart_after_s:
                    try:
                        fleet.restart(n.name)
                    except RuntimeError as e:
                        print(f"gpuctl demo: restart of {n.name} failed: {e}", file=sys.stderr, flush=True)
                        down_since[n.name] = now
                    else:  # said at once: it answers already, and a stop right now must not lose the line
                        print(f"gpuctl demo: node {n.name} is back (pid {n.proc.pid})", file=sys.stderr, flush=True)
                        del down_since[n.name]
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    return ExitCode.OK
