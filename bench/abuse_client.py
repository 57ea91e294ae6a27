"""A hostile peer of gpuctld's control socket, run as its own process (its own SO_PEERCRED pid).

    python bench/abuse_client.py --socket PATH --mode idle|slowloris|headers --count N --duration-s S

Keeps `count` connections open for `duration_s` seconds, opening a new one whenever the daemon
closes one:

- ``idle``: connects and sends nothing;
- ``slowloris``: sends a request one byte per second per connection (never finishing it);
- ``headers``: sends a request line, then header lines as fast as the socket takes them, up to
  ``--header-bytes`` (6 MB) per connection.

Prints one JSON line at the end: connections opened, connect failures, connections closed by the
daemon, answers seen by HTTP status (e.g. {"431": 40, "503": 12}), bytes sent. Used by
tests/integration/test_control_api_limits.py and bench/torture.py.
"""

from __future__ import annotations

import argparse
import json
import re
import selectors
import socket
import sys
import time

_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


class _Conn:
    def __init__(self, sock: socket.socket, first: bytes):
        self.sock = sock
        self.out = bytearray(first)
        self.sent = 0
        self.seen = bytearray()
        self.last_byte_s = 0.0


def run(path: str, mode: str, count: int, duration_s: float, header_bytes: int) -> dict:
    """Abuse the socket at `path` for `duration_s` seconds; returns the counts (see module doc)."""
    sel = selectors.DefaultSelector()
    conns: dict[int, _Conn] = {}
    stats = {"mode": mode, "count": count, "opened": 0, "connect_failed": 0, "closed_by_daemon": 0,
             "answers": {}, "bytes_sent": 0}
    pad_line = b"X-Pad: " + b"a" * 8000 + b"\r\n"

    def open_one() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            stats["connect_failed"] += 1
            s.close()
            return
        first = b"" if mode == "idle" else b"POST /v1/assign HTTP/1.1\r\n"
        if mode == "headers":
            first = first + pad_line * 8
        c = _Conn(s, first)
        conns[s.fileno()] = c
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
        stats["opened"] += 1

    def close(c: _Conn, by_daemon: bool) -> None:
        for m in _STATUS.findall(bytes(c.seen)):
            stats["answers"][m.decode()] = stats["answers"].get(m.decode(), 0) + 1
        if by_daemon:
            stats["closed_by_daemon"] += 1
        sel.unregister(c.sock)
        conns.pop(c.sock.fileno(), None)
        c.sock.close()

    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        while len(conns) < count and time.monotonic() < end:
            before = stats["connect_failed"]
            open_one()
            if stats["connect_failed"] > before:
                time.sleep(0.01)
                break
        now = time.monotonic()
        for key, events in sel.select(timeout=0.05):
            c: _Conn = key.data
            if events & selectors.EVENT_READ:
                try:
                    data = c.sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    close(c, True)
                    continue
                if data:
                    c.seen += data[:4096]
            if events & selectors.EVENT_WRITE:
                if mode == "slowloris":
                    if now - c.last_byte_s < 1.0 or not c.out:
                        continue
                    chunk = bytes(c.out[:1])
                elif mode == "headers":
                    if c.sent >= header_bytes:
                        continue
                    while len(c.out) < 65536:
                        c.out += pad_line
                    chunk = bytes(c.out[:65536])
                else:
                    continue
                try:
                    n = c.sock.send(chunk)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    close(c, True)
                    continue
                del c.out[:n]
                c.sent += n
                c.last_byte_s = now
                stats["bytes_sent"] += n
                if mode == "slowloris" and not c.out:
                    c.out += b"X-Slow: 1\r\n"
        if mode in ("slowloris", "idle"):
            # no busy loop on sockets that are always writable
            for c in list(conns.values()):
                if mode == "idle" or now - c.last_byte_s < 1.0:
                    sel.modify(c.sock, selectors.EVENT_READ, c)
                else:
                    sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
    for c in list(conns.values()):
        try:
            data = c.sock.recv(65536)
            if data:
                c.seen += data[:4096]
        except OSError:
            pass
        close(c, False)
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="abuse_client.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--mode", choices=("idle", "slowloris", "headers"), required=True)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--header-bytes", type=int, default=6_000_000)
    args = p.parse_args(argv)
    print(json.dumps(run(args.socket, args.mode, args.count, args.duration_s, args.header_bytes)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
