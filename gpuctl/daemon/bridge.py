"""`gpuctld bridge`: join this process's stdin/stdout to the daemon's Unix socket.

The admin's machine runs this over an SSH exec channel (gpuctl.transport.ssh); the bytes it copies
are the control API's HTTP/1.1. Because the bridge runs as the SSH user, the socket's owner, group
and mode decide who may talk to the daemon, and the daemon sees the caller's uid (SO_PEERCRED).

Protocol with the client: once the socket is connected the bridge writes one line to stderr,
:data:`READY_LINE_PREFIX` followed by the path, then copies bytes both ways until one side closes.
When the socket cannot be reached it writes one line to stderr (starting "gpuctld is not running on
this node:" when no daemon listens) and exits with :data:`EXIT_UNREACHABLE` (2).

Stdlib only: it starts once per SSH channel and must start fast.
"""

from __future__ import annotations

import argparse
import errno
import os
import selectors
import socket
import sys

from gpuctl.daemon.paths import socket_candidates

#: What the bridge writes to stderr once connected: ``READY_LINE_PREFIX + path + "\n"``.
READY_LINE_PREFIX = "gpuctld bridge: connected to "

#: Exit status when the socket is missing, refuses connections or may not be opened.
EXIT_UNREACHABLE = 2

#: Seconds the bridge keeps relaying the daemon's answer after its stdin has closed.
DRAIN_IDLE_S = 30.0

_CHUNK_BYTES = 65536


class BridgeError(Exception):
    """The daemon's socket could not be reached; str() is the one-line message for stderr."""


def connect(paths: list[str]) -> tuple[socket.socket, str]:
    """Connect to the first of `paths` (Unix socket paths) that exists.

    Returns (connected socket, path). Raises BridgeError with a one-line message: "gpuctld is not
    running on this node: no socket at P" (none exists), "...: nothing listens on P (stale socket
    file)" (refused), or "permission denied on P: ..." (the socket's mode or group excludes us).
    """
    existing = [p for p in paths if os.path.exists(p)]
    if not existing:
        raise BridgeError(f"gpuctld is not running on this node: no socket at {' or '.join(paths)}")
    path = existing[0]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENOENT:
            raise BridgeError(f"gpuctld is not running on this node: no socket at {path}") from exc
        if exc.errno == errno.ECONNREFUSED:
            raise BridgeError(
                f"gpuctld is not running on this node: nothing listens on {path} (stale socket file)"
            ) from exc
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise BridgeError(
                f"permission denied on {path}: this account may not use gpuctld's socket "
                "(ask the node's admin to add it to the socket's group)"
            ) from exc
        raise BridgeError(f"cannot connect to gpuctld's socket {path}: {exc.strerror}") from exc
    return sock, path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def relay(sock: socket.socket, in_fd: int, out_fd: int) -> None:
    """Copy bytes in_fd -> sock and sock -> out_fd until the socket closes or out_fd breaks.

    When in_fd reaches end of file the socket's write side is shut down and the answer still in
    flight is relayed, up to :data:`DRAIN_IDLE_S` seconds of silence. Raises nothing on a closed
    peer (BrokenPipeError, ConnectionResetError end the relay).
    """
    sel = selectors.DefaultSelector()
    sel.register(in_fd, selectors.EVENT_READ, "in")
    sel.register(sock, selectors.EVENT_READ, "sock")
    input_open = True
    try:
        while True:
            events = sel.select(None if input_open else DRAIN_IDLE_S)
            if not events:
                return  # stdin closed and the daemon went quiet
            for key, _ in events:
                if key.data == "in":
                    data = os.read(in_fd, _CHUNK_BYTES)
                    if not data:
                        input_open = False
                        sel.unregister(in_fd)
                        try:
                            sock.shutdown(socket.SHUT_WR)
                        except OSError:
                            return
                    else:
                        sock.sendall(data)
                else:
                    data = sock.recv(_CHUNK_BYTES)
                    if not data:
                        return
                    _write_all(out_fd, data)
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        sel.close()


def main(argv: list[str]) -> int:
    """Run ``gpuctld bridge [--socket PATH]``; `argv` excludes the program and "bridge" words.

    Returns the exit status: 0 when a side closed normally, :data:`EXIT_UNREACHABLE` (2) with a
    one-line message on stderr when the socket cannot be reached (argparse also exits 2 on bad
    flags).
    """
    parser = argparse.ArgumentParser(
        prog="gpuctld bridge",
        description="Join stdin/stdout to gpuctld's control socket (used by gpuctl over SSH).",
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's Unix socket (default: the daemon's own default, then "
        "/run/gpuctld/gpuctld.sock)",
    )
    args = parser.parse_args(argv)
    paths = [args.socket] if args.socket else socket_candidates()
    try:
        sock, path = connect(paths)
    except BridgeError as exc:
        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        return EXIT_UNREACHABLE
    with sock:
        sys.stderr.write(f"{READY_LINE_PREFIX}{path}\n")
        sys.stderr.flush()
        relay(sock, sys.stdin.fileno(), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    # `python -m gpuctl.daemon.bridge [bridge] [--socket PATH]`: the optional "bridge" word lets
    # this module stand in for the `gpuctld` program (gpuctl runs `<gpuctld> bridge ...`).
    _args = sys.argv[1:]
    sys.exit(main(_args[1:] if _args[:1] == ["bridge"] else _args))
