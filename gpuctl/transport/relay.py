"""The minimal relay: a few lines of Python run on the node as ``python3 -I -S -c SOURCE PATH``.

It stands between the direct-streamlocal channel (fastest, needs sshd's AllowStreamLocalForwarding)
and ``gpuctld bridge`` (needs gpuctl installed, imports it: ~200 ms): it imports nothing of gpuctl
nor site-packages (-I -S), so it starts in ~10-20 ms wherever the node has a python3. Its protocol
is the bridge's: once connected it writes :data:`READY_LINE_PREFIX` + path to stderr, then copies
stdin -> socket and socket -> stdout; when the socket cannot be reached it writes one line to
stderr and exits 2. Like the bridge it runs as the SSH login user, so SO_PEERCRED sees that user.
"""

from __future__ import annotations

import shlex

#: The line the relay writes to stderr once it is connected (followed by the socket path).
READY_LINE_PREFIX = "gpuctl relay: connected to "

#: Exit status when the socket cannot be reached.
EXIT_UNREACHABLE = 2

#: The relay's program text (stdlib only; argv[1] is the socket path). Stops when the socket closes,
#: or 30 s after stdin closed with the daemon silent.
SOURCE = """\
import os, select, socket, sys
p = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(p)
except OSError as e:
    sys.stderr.write("gpuctl relay: cannot connect to %s: %s\\n" % (p, e.strerror))
    sys.exit(2)
sys.stderr.write("gpuctl relay: connected to %s\\n" % p)
sys.stderr.flush()
src = [0, s]
try:
    while True:
        r = select.select(src, [], [], 30 if len(src) == 1 else None)[0]
        if not r:
            break
        if 0 in r:
            d = os.read(0, 65536)
            if d:
                s.sendall(d)
            else:
                src = [s]
                s.shutdown(socket.SHUT_WR)
        if s in r:
            d = s.recv(65536)
            if not d:
                break
            while d:
                d = d[os.write(1, d):]
except (BrokenPipeError, ConnectionResetError):
    pass
"""


#: Pythons tried on the node, in order: the system's first (a python3 found on PATH may be a
#: wrapper such as a pyenv shim, which costs ~200 ms a start).
PYTHONS = ("/usr/bin/python3", "python3")


def relay_command(socket_path: str) -> str:
    """The remote command line for the node's login shell (POSIX sh syntax):
    ``P=/usr/bin/python3; [ -x "$P" ] || P=python3; exec "$P" -I -S -c SOURCE PATH``."""
    first, fallback = PYTHONS
    return (f'P={shlex.quote(first)}; [ -x "$P" ] || P={shlex.quote(fallback)}; exec "$P" '
            + shlex.join(["-I", "-S", "-c", SOURCE, socket_path]))
