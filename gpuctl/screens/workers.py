"""Blocking work off the console's event loop, without making quitting wait for it.

No textual import: screens and the app both use it (a screen never imports the app).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def run_in_daemon_thread(fn: Callable[[], T], *, name: str = "gpuctl-io") -> T:
    """Run the blocking `fn()` on a new daemon thread and await its result (its exception is
    raised here). Unlike loop.run_in_executor (Textual's thread workers), nothing waits for the
    thread when the app exits: a cancelled await abandons it, and the thread ends with the
    process. For calls that may block for seconds and whose result is useless after quitting
    (fleet polls)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():  # the awaiting task was cancelled (app exiting, poll replaced)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def runner() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: the app has exited, nobody waits
            pass

    threading.Thread(target=runner, name=name, daemon=True).start()
    return await future
