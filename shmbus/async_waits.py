"""Awaiting the bus from asyncio: the blocking waits, run on sleeper threads.

A subscriber's ``wait`` and a publisher's wait for progress sleep on futex words that the
writer (or reader) rings; asyncio cannot watch a futex, so the sleep runs on a small pool of
threads that hold no GIL while asleep, and the awaiting coroutine resumes when the thread
returns. Nothing polls on a timer and nothing is read off the event loop's thread: a cancelled
await leaves nothing half-read, and its sleeper is woken so the thread returns at once.

Runs in the user's process; works with any event loop that has ``run_in_executor`` (asyncio's
own, uvloop). Up to ``MAX_SLEEPERS`` awaits sleep at once; more wait their turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

MAX_SLEEPERS = 64
#: the longest one sleep lasts; a wait longer than this sleeps again
SLICE_S = 1.0

_sleepers: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _sleepers
    if _sleepers is None:
        _sleepers = ThreadPoolExecutor(MAX_SLEEPERS, thread_name_prefix="shmbus-sleeper")
    return _sleepers


async def sleep_on(wait: Callable[[float], object], timeout: float,
                   wake: Callable[[], object] | None = None) -> None:
    """Run ``wait(timeout)`` (a blocking wait that releases the GIL) on a sleeper thread and
    return when it does; its exceptions propagate. On cancellation ``wake()`` (when given)
    cuts the thread's sleep short before CancelledError goes on."""
    future = asyncio.get_running_loop().run_in_executor(_pool(), wait, min(timeout, SLICE_S))
    try:
        await future
    except asyncio.CancelledError:
        if wake is not None:
            wake()
        raise
