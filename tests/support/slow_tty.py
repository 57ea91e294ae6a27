"""A slow terminal for tests: run a command on a pty whose output reaches this terminal at most
RATE bytes per second (a loaded machine's terminal, a slow SSH link); input goes through at once.

Usage: python slow_tty.py RATE_BYTES_PER_S COLUMNS ROWS COMMAND [ARGS...]; exits with the
command's status. tests/integration/test_tmux_console.py runs the console in tmux through it.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time
import tty

CHUNK = 512  # bytes relayed at a time


def main(argv: list[str]) -> int:
    rate, cols, rows, cmd = float(argv[0]), int(argv[1]), int(argv[2]), argv[3:]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the pty's slave side
        os.execvp(cmd[0], cmd)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    if os.isatty(0):
        tty.setraw(0)
    budget, last = 0.0, time.monotonic()
    while True:
        ready, _, _ = select.select([0, fd], [], [], 0.05)
        if 0 in ready:
            data = os.read(0, 4096)
            if data:
                os.write(fd, data)
        now = time.monotonic()
        budget, last = min(budget + (now - last) * rate, CHUNK * 4), now
        if budget < CHUNK:
            time.sleep((CHUNK - budget) / rate)
            continue
        if fd in ready:
            try:
                data = os.read(fd, CHUNK)
            except OSError:  # the command exited (EIO on the master)
                break
            if not data:
                break
            os.write(1, data)
            budget -= len(data)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
