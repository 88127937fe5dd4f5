"""Watching logs from a poll loop: a file descriptor that turns readable when a writer (or
reader) wakes the futex words of the logs watched.

Two kinds, with one interface (``arm``/``disarm``/``clear``/``fileno``/``close``; a
subscription arms either with ``_arm_watcher``):

* ``FutexRing`` (Linux 6.7+): an io_uring futex wait; the waker's FUTEX_WAKE makes the fd
  readable itself, so the poll loop wakes one hop after the writer, as a blocking wait does.
* ``LogWatcher``: a native thread asleep on the words that makes an eventfd readable; one
  thread hop later. Used where io_uring is missing or refused (older kernels, container
  seccomp profiles).

Either is used by the thread that polls it (an asyncio subscriber's event loop, the
netbridge's loop).
"""

from __future__ import annotations

from shmbus.shm._native import FutexRing, LogWatcher


def new_log_watcher() -> FutexRing | LogWatcher:
    """A FutexRing where this kernel allows it, else a LogWatcher thread."""
    try:
        return FutexRing()
    except OSError:
        return LogWatcher()
