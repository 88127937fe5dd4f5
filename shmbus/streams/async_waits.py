"""Awaiting the bus from asyncio, woken by the bus's own futex words.

A subscriber's await is a file descriptor the event loop watches (``add_reader``), a log
watcher (``shmbus.shm.log_watchers``: an io_uring futex wait, or a thread), that turns
readable when the writer wakes the same futex words a blocking ``poll(timeout=)`` sleeps on
(the images' data words, and the subscription's own word, rung when its images change or its
client fails). The writer pays a syscall only while someone sleeps.

A back-pressured publisher's await is rarer and longer: its blocking wait for progress runs on
a small pool of sleeper threads, and the coroutine resumes when the thread returns.

Nothing polls on a timer and nothing is read off the event loop's thread: a cancelled await
leaves nothing half-read. Runs in the user's process; works with asyncio's own loop and
uvloop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shmbus.shm._native import FutexRing, LogWatcher
from shmbus.shm.log_watchers import new_log_watcher

MAX_SLEEPERS = 64
#: the longest one publisher sleep lasts; a wait longer than this sleeps again
SLICE_S = 1.0

_sleepers: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _sleepers
    if _sleepers is None:
        _sleepers = ThreadPoolExecutor(MAX_SLEEPERS, thread_name_prefix="shmbus-sleeper")
    return _sleepers


async def sleep_on(wait: Callable[[float], object], timeout: float) -> None:
    """Run ``wait(timeout)`` (a blocking wait that releases the GIL and ends within
    ``SLICE_S``) on a sleeper thread and return when it does; its exceptions propagate."""
    await asyncio.get_running_loop().run_in_executor(_pool(), wait, min(timeout, SLICE_S))


def _fire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ReadinessWatcher:
    """One subscription's asyncio wake-up: a FutexRing or LogWatcher (see the module docs),
    made on the first wait and watched by the event loop from then on (one registration per
    loop, not one per wait).

    One coroutine waits at a time. The subscription's methods are passed in, not kept, so
    that no cycle holds a closed subscription (and its client's files) alive.
    """

    def __init__(self) -> None:
        self._watcher: FutexRing | LogWatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where the watcher is watched
        self._future: asyncio.Future[None] | None = None  # the waiting coroutine's
        self._closed = False
        self._closing = threading.Lock()

    async def wait(self, arm: Callable[[FutexRing | LogWatcher], bool],
                   timeout: float | None) -> None:
        """Return once a poll may find something (or the images changed, or the client
        failed), or after ``timeout`` seconds (None: no limit). ``arm(watcher)`` (the
        subscription's ``_arm_watcher``) sets what to watch and returns False when there is
        something to read already. Raises RuntimeError when another coroutine is waiting
        already; ValueError once closed."""
        if self._future is not None:
            raise RuntimeError("another coroutine is awaiting this subscription")
        loop = asyncio.get_running_loop()
        # whether this waiter or close() frees the watcher is settled under the lock: close()
        # sees the future (and rings it) or the waiter sees the close (and frees it)
        with self._closing:
            if self._closed:
                raise ValueError("the subscription is closed")
            self._future = future = loop.create_future()
        timer = None
        try:
            watcher = self._watch_from(loop)
            if not arm(watcher) or self._closed:  # (a close may have rung before the arm)
                return
            if timeout is not None:
                timer = loop.call_later(timeout, _fire, future)
            await future
        finally:
            with self._closing:
                self._future = None
                closed = self._closed
            if timer is not None:
                timer.cancel()
            if self._watcher is not None:
                self._watcher.disarm()
            if closed:
                self._stop()

    def _watch_from(self, loop: asyncio.AbstractEventLoop) -> FutexRing | LogWatcher:
        """The watcher, watched by ``loop`` (made and registered on first use)."""
        if self._watcher is None:
            self._watcher = new_log_watcher()
        if self._loop is not loop:
            self._unregister()
            loop.add_reader(self._watcher.fileno(), self._on_readable)
            self._loop = loop
        return self._watcher

    def _on_readable(self) -> None:
        if self._watcher is not None:
            self._watcher.clear()
        if self._future is not None:
            _fire(self._future)

    def _unregister(self) -> None:
        """Stop the loop (if any) watching the fd, on the loop's own thread."""
        loop, self._loop = self._loop, None
        if loop is not None and self._watcher is not None:
            _on_loop(loop, loop.remove_reader, self._watcher.fileno())

    def close(self, ring: Callable[[], object]) -> None:
        """Stop watching and free the watcher; a coroutine waiting now is woken by ``ring()``
        (the subscription's ``_wake``), returns and frees it. Any thread may call it;
        idempotent."""
        with self._closing:
            self._closed = True
            waiting = self._future is not None
        if waiting:
            ring()
        else:
            self._stop()

    def _stop(self) -> None:
        with self._closing:
            watcher, self._watcher = self._watcher, None
            loop, self._loop = self._loop, None
        # the fd must not be closed (and its number reused) while a loop watches it
        if watcher is not None and (loop is None or not _on_loop(loop, _forget, loop, watcher)):
            watcher.close()


def _forget(loop: asyncio.AbstractEventLoop, watcher: FutexRing | LogWatcher) -> None:
    loop.remove_reader(watcher.fileno())
    watcher.close()


def _on_loop(loop: asyncio.AbstractEventLoop, call: Callable[..., object],
             *args: object) -> bool:
    """``call(*args)`` on ``loop``'s thread: now when this is that thread, else soon, through
    the loop. False (nothing done) when the loop is closed: it watches nothing any more."""
    if loop.is_closed():
        return False
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        call(*args)
        return True
    try:
        loop.call_soon_threadsafe(call, *args)
    except RuntimeError:  # closed meanwhile
        return False
    return True
