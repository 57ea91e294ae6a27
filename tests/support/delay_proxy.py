"""A delaying proxy for tests and benchmarks: many Unix-socket listeners, each relaying to one
upstream Unix socket (a real gpuctld) after holding every request `delay_s` seconds.

Usage::

    with DelayProxy(upstream=daemon.socket_path, delay_s=2.5) as proxy:
        paths = [proxy.listen(tmp / f"n{i}.sock") for i in range(48)]

Each node of a fleet config can point at its own listener: they all reach the same daemon, but
each answers only after `delay_s` (a slow node, within its timeout). Runs one asyncio loop on a
daemon thread; ``close()`` stops it and removes the sockets.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path


class DelayProxy:
    """Listeners relaying to `upstream` (a Unix socket path), each client->daemon chunk held
    `delay_s` seconds before it is sent on (so every request is answered `delay_s` late)."""

    def __init__(self, upstream: str | os.PathLike, delay_s: float):
        self.upstream = str(upstream)
        self.delay_s = float(delay_s)
        self.loop = asyncio.new_event_loop()
        self._servers: list[asyncio.base_events.Server] = []
        self._paths: list[Path] = []
        self.requests_delayed = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="delay-proxy")
        self._thread.start()

    def listen(self, path: str | os.PathLike, delay_s: float | None = None) -> str:
        """Start a listener at `path` (its own delay if given); returns the path."""
        delay = self.delay_s if delay_s is None else float(delay_s)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
            except OSError:
                writer.close()
                return

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, hold: float) -> None:
                try:
                    while data := await src.read(65536):
                        if hold:
                            self.requests_delayed += 1
                            await asyncio.sleep(hold)
                        dst.write(data)
                        await dst.drain()
                except (ConnectionError, OSError):
                    pass
                finally:
                    dst.close()

            await asyncio.gather(pipe(reader, up_writer, delay), pipe(up_reader, writer, 0.0))

        async def start() -> asyncio.base_events.Server:
            return await asyncio.start_unix_server(handle, path=str(path))

        server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self._servers.append(server)
        self._paths.append(Path(path))
        return str(path)

    def close(self) -> None:
        """Stop every listener and the loop; remove the socket files."""
        async def stop() -> None:
            for s in self._servers:
                s.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        for p in self._paths:
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> "DelayProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
