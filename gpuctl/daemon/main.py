"""`gpuctld`: the node daemon's command line.

``gpuctld [serve] [options]`` runs the daemon (``serve`` is the default); ``gpuctld bridge ...``
joins stdin/stdout to the daemon's socket (gpuctl.daemon.bridge, imported only for that), which is
how the fleet client reaches a node through SSH.

Exit status: 0 after a clean stop (SIGTERM/SIGINT); 1 when the backend cannot start, the socket or
state directory is taken by another gpuctld, or the socket cannot be bound; 2 for bad options; 3
when the state file is unusable (named in the message; ``--reset-state`` moves it aside).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from gpuctl.arg_types import seconds_arg
from gpuctl.daemon import paths
from gpuctl.exit_codes import ExitCode

SERVE_USAGE_EPILOG = """\
other commands:
  gpuctld bridge ...   join stdin/stdout to the daemon's Unix socket (used through SSH)

environment:
  GPUCTLD_STATE_DIR    default for --state-dir
  GPUCTLD_SOCKET       default for --socket
"""


def default_state_dir() -> Path:
    """$GPUCTLD_STATE_DIR, else /var/lib/gpuctld for root, else $XDG_STATE_HOME/gpuctld
    (~/.local/state/gpuctld)."""
    env = os.environ.get("GPUCTLD_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/gpuctld")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuctld"


def default_socket_path() -> Path:
    """The control socket's default path: the rule shared with the bridge and the CLI
    (:func:`gpuctl.daemon.paths.default_socket_path`: $GPUCTLD_SOCKET, else
    /run/gpuctld/gpuctld.sock for root, else $XDG_RUNTIME_DIR/gpuctld.sock)."""
    return Path(paths.default_socket_path())


_positive_float = seconds_arg(0, 3600, low_exclusive=True)


def _gpu_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be 1..64, got {value}")
    return value


def _cap_bytes(text: str) -> int:
    from gpuctl.daemon.host_memory import MIN_CAP_BYTES

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r}") from None
    if value < MIN_CAP_BYTES:
        raise argparse.ArgumentTypeError(f"must be >= {MIN_CAP_BYTES} bytes, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``gpuctld [serve]``."""
    p = argparse.ArgumentParser(
        prog="gpuctld",
        description="gpuctl node daemon: GPU telemetry, slice ownership and leases, served on a Unix socket.",
        epilog=SERVE_USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backend", choices=("auto", "nvml", "simulated"), default="auto",
                   help="GPU backend; auto = nvml, and exit with the reason when NVML cannot start (default: auto)")
    p.add_argument("--gpus", type=_gpu_count, default=8, help="simulated backend: number of GPUs (default 8)")
    p.add_argument("--seed", type=int, default=0, help="simulated backend: seed of UUIDs and load (default 0)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help=f"where the state file lives (default {default_state_dir()})")
    p.add_argument("--socket", type=Path, default=None, help=f"control socket path (default {default_socket_path()})")
    p.add_argument("--socket-group", default=None, help="group given to the socket file (mode 0660)")
    p.add_argument("--interval", type=_positive_float, default=1.0, help="telemetry sampling interval, seconds (default 1)")
    p.add_argument("--telemetry-history", type=_positive_float, default=600.0,
                   help="telemetry history kept in memory, seconds (default 600)")
    p.add_argument("--reset-state", action="store_true",
                   help="if the state file is unusable, move it aside (state.json.corrupt-<time>) and start fresh")
    p.add_argument("--datapath-bind", metavar="ADDR", default="127.0.0.1",
                   help="address the lease workers (remote attach data path) listen on (default 127.0.0.1)")
    p.add_argument("--datapath-advertise", metavar="HOST", default=None,
                   help="host put in lease endpoints (default: --datapath-bind, or the hostname when that is 0.0.0.0/::)")
    p.add_argument("--worker-user", metavar="USER", default=None,
                   help="when gpuctld runs as root, run lease workers as this unprivileged user")
    p.add_argument("--executor", choices=("auto", "numpy", "cupy"), default="auto",
                   help="lease workers' executor; auto = cupy with the nvml backend, numpy with simulated")
    p.add_argument("--numpy-quota-cap-bytes", type=_cap_bytes, default=None, metavar="BYTES",
                   help="most memory quota of one lease served by the NumPy executor, which holds arrays in "
                        "host memory (default: half of MemAvailable when gpuctld starts)")
    from gpuctl.daemon import observability

    p.add_argument("--log-level", choices=("debug", "info", "warning"), default="info",
                   help="stderr log level (default info: changes and refusals; debug adds every read, "
                        "e.g. each GET /v1/status poll)")
    observability.add_arguments(p)  # --history, --no-usage, --metrics-listen, --metrics-node
    p.add_argument("--clock-offset-file", metavar="FILE", default=None,
                   help="tests: seconds added to the clock of schedules and audit records, read from FILE")
    p.add_argument("--mps", choices=("default", "auto", "off", "required"), default="default",
                   help="CUDA MPS for fractional leases: auto = start one MPS control daemon per GPU holding "
                        "fractional leases, time-sliced with a warning when it cannot start; required = refuse "
                        "those leases then; off = never (default: auto with the nvml backend, off with simulated)")
    p.add_argument("--native-grace", type=_positive_float, default=5.0, metavar="SECONDS",
                   help="seconds between SIGTERM and SIGKILL when a native lease's processes are ended by a revoke, "
                        "an expiry or shutdown (default 5)")
    p.add_argument("--mps-dir", type=Path, default=None, metavar="DIR",
                   help="where MPS pipe/log directories are made (default: DIR-OF-SOCKET/mps)")
    return p


def mps_mode(args: argparse.Namespace, backend_name: str) -> str:
    """--mps as one of gpuctl.daemon.mps.MPS_MODES: "default" is auto on nvml, off on simulated."""
    if args.mps != "default":
        return args.mps
    return "auto" if backend_name == "nvml" else "off"


def datapath_options(args: argparse.Namespace, backend_name: str) -> dict:
    """The LeaseManager options from the command line: executor, bind, advertise, worker_user.

    Raises ValueError naming the option: --worker-user without root (unless it is gpuctld's own
    user), an unknown user, or a user with uid 0.
    """
    import pwd
    import socket

    executor = args.executor if args.executor != "auto" else ("cupy" if backend_name == "nvml" else "numpy")
    bind = args.datapath_bind
    advertise = args.datapath_advertise or (socket.gethostname() if bind in ("0.0.0.0", "::", "") else bind)
    user = args.worker_user
    if user is not None:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"--worker-user: no user {user!r} on this node") from None
        if pw.pw_uid == 0:
            raise ValueError(f"--worker-user: {user!r} is root; workers must run as an unprivileged user")
        if os.geteuid() != 0:
            if pw.pw_uid != os.geteuid():
                raise ValueError(f"--worker-user {user}: gpuctld must run as root to start workers as another user")
            user = None
    return {"executor": executor, "bind": bind, "advertise": advertise, "worker_user": user}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gpuctld``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bridge":
        from gpuctl.daemon.bridge import main as bridge_main

        return bridge_main(argv[1:])
    if argv and argv[0] == "serve":
        argv = argv[1:]
    elif argv and not argv[0].startswith("-"):
        print(f"gpuctld: unknown command {argv[0]!r}: use 'serve' (default) or 'bridge'", file=sys.stderr)
        return ExitCode.USAGE
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        datapath_options(args, "simulated" if args.backend == "simulated" else "nvml")
    except ValueError as e:
        parser.error(str(e))
    return serve_main(args)


def _say(message: str) -> None:
    print(f"gpuctld: {message}", file=sys.stderr, flush=True)


def serve_main(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit status (see the module docstring)."""
    from gpuctl.backends import BackendError, make_backend
    from gpuctl.daemon.api import ControlApi
    from gpuctl.daemon.server import SocketInUseError, serve, serve_in_thread
    from gpuctl.daemon.state import (NodeState, NodeStateManager, StateCorruptError, StateLockedError,
                                     StateStore, StateWriteError)
    from gpuctl.daemon.telemetry import Sampler

    logging.basicConfig(stream=sys.stderr, level=getattr(logging, str(args.log_level).upper()),
                        format="%(asctime)s gpuctld: %(message)s", force=True)
    state_dir = args.state_dir or default_state_dir()
    socket_path = args.socket or default_socket_path()

    store = StateStore(state_dir)
    try:
        store.lock()
    except StateLockedError as e:
        _say(str(e))
        return ExitCode.FAILURE
    except OSError as e:
        _say(f"cannot use the state directory {state_dir}: {e.strerror or e}")
        return ExitCode.FAILURE
    try:
        try:
            state = store.load()
            if args.reset_state:
                _say(f"--reset-state: the state file {store.path} is fine; kept as it is")
        except StateCorruptError as e:
            if not args.reset_state:
                _say(f"{e}")
                _say("refusing to start: slice ownership would be lost. Restore the file from a backup, "
                     "or run gpuctld --reset-state to move it aside and start with every GPU unassigned.")
                return ExitCode.CONFIG
            aside = store.move_aside()
            _say(f"--reset-state: {e}")
            _say(f"--reset-state: moved it to {aside}; starting with fresh state (every GPU unassigned)")
            state = NodeState()

        try:
            if args.backend == "simulated":
                from gpuctl.backends.simulated import SimulatedBackend

                backend = SimulatedBackend(gpus=args.gpus, seed=args.seed, tick_s=args.interval)
            else:
                backend = make_backend(args.backend)
            gpus = backend.gpus()
        except BackendError as e:
            _say(f"backend {args.backend} cannot start: {e} (error code {e.code})")
            if e.fix and e.fix not in str(e):
                _say(f"fix: {e.fix}")
            if args.backend == "auto":
                _say("auto never falls back to the simulated backend; use --backend simulated for a demo node")
            return ExitCode.FAILURE
        except ImportError as e:
            _say(f"backend {args.backend} is not available: {e}")
            return ExitCode.FAILURE

        try:
            manager = NodeStateManager(store, state)
            from gpuctl.daemon.records import RecordsError, open_records

            try:
                records = open_records(state_dir, manager, hostname=socket.gethostname(), say=_say,
                                       clock_offset_file=args.clock_offset_file, reset_state=args.reset_state)
            except RecordsError as e:
                _say(str(e))
                backend.close()
                return e.exit_code
            added = manager.reconcile(gpus)
        except StateWriteError as e:
            _say(str(e))
            backend.close()
            return ExitCode.FAILURE
        for sid in added:
            logging.info("new GPU: slice %s created, owned by nobody (unassigned)", sid)
        for sid in manager.retired_slices:
            logging.warning("slice %s removed: its GPU has MIG on, so its MIG devices are the slices", sid)
        for uuid in sorted(manager.missing_gpus):
            logging.warning("GPU %s is in the state file but the backend did not report it; "
                            "its slices and owners are kept and shown as missing", uuid)

        sampler = Sampler(backend, interval_s=args.interval, history_s=args.telemetry_history)
        sampler.sample_once()
        sampler.start()
        api = ControlApi(backend_name=backend.name, gpus=gpus, sampler=sampler, state=manager)
        from gpuctl.daemon.leases import LeaseManager

        dp = datapath_options(args, backend.name)
        if dp["worker_user"] is None and os.geteuid() == 0:
            logging.warning("gpuctld runs as root and no --worker-user is set: lease workers run as root")
        from gpuctl.daemon.host_memory import HostMemoryCap

        quota_cap = HostMemoryCap.from_options(args.numpy_quota_cap_bytes)
        if dp["executor"] == "numpy":
            logging.info("NumPy lease quotas are capped at %d bytes (%s)", quota_cap.cap_bytes, quota_cap.source)
        from gpuctl.daemon.mps import MpsManager

        mps = MpsManager(mps_mode(args, backend.name), args.mps_dir or Path(socket_path).parent / "mps")
        leases = LeaseManager(manager, gpus, hostname=api.hostname, quota_cap=quota_cap, mps=mps,
                              simulated=backend.name == "simulated", native_grace_s=args.native_grace,
                              gpu_processes=lambda: {u: s.processes for u, s in sampler.latest().items()}, **dp)
        try:
            leases.restore()
        except StateWriteError as e:
            _say(str(e))
            sampler.stop()
            backend.close()
            return ExitCode.FAILURE
        leases.install(api)
        from gpuctl.daemon import observability

        try:
            extras = observability.start(args, api=api, state=manager, sampler=sampler, state_dir=state_dir,
                                         backend=backend, gpus=gpus)
        except ValueError as e:
            _say(str(e))
            sampler.stop()
            backend.close()
            return ExitCode.FAILURE
        for note in extras.notes:
            _say(note)
        records.install(api, on_revoke=leases.sync)
        try:
            server = serve(api, socket_path, group=args.socket_group)
        except SocketInUseError as e:
            _say(str(e))
            extras.stop()
            sampler.stop()
            backend.close()
            return ExitCode.FAILURE
        except (OSError, ValueError) as e:
            _say(f"cannot serve on {socket_path}: {e}")
            extras.stop()
            sampler.stop()
            backend.close()
            return ExitCode.FAILURE

        stop = threading.Event()
        received: list[int] = []

        def on_signal(signum: int, frame: object) -> None:
            received.append(signum)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        serve_in_thread(server)
        leases.start()
        records.start()
        print(f"gpuctld ready: socket={socket_path} backend={backend.name} gpus={len(gpus)} "
              f"executor={dp['executor']} datapath={dp['bind']} mps={mps.mode}", file=sys.stderr, flush=True)
        while not stop.wait(0.2):
            pass
        name = signal.Signals(received[0]).name if received else "signal"
        _say(f"{name}: stopping")
        server.shutdown()
        server.close()
        ended = leases.close()
        records.close()
        if ended:
            _say(f"ended {len(ended)} lease(s) and stopped their workers: {', '.join(ended)}")
        extras.stop()
        mps.close()
        sampler.stop()
        backend.close()
        _say(f"stopped (generation {manager.generation}, socket {socket_path} removed)")
        return ExitCode.OK
    finally:
        store.unlock()
