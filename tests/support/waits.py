"""The one way a test waits for a state: :func:`wait_until`, bounded in time, failing with what
it waited for. A test never sleeps a fixed time to let something happen; it waits for the
state that thing leaves (a counter, a position, a file, a process's report). A negative check
(nothing happens) is :func:`holds_for`: the state looked at throughout a window the check
names, never once after a sleep."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

#: looks that only yield the CPU before the wait starts to sleep
_YIELDS = 20
_SHORTEST_PAUSE = 50e-6


def wait_until(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str], *,
               poll: Callable[[], Any] | None = None, longest_pause: float = 0.01) -> T:
    """Wait until ``predicate()`` is true and return its value; after ``timeout`` seconds fail
    the test with "timed out after ... s waiting for ``what``" (a string, or a function that
    says it when the wait fails: the state of the processes then, say).

    ``poll()``, when given, runs between looks: the work this thread must do for the state to
    come (a subscription's poll, a recorder's duty cycle). Between looks the wait yields the
    CPU a few times, then sleeps, twice as long each time up to ``longest_pause`` seconds; a
    ``poll()`` that returns a true value (work done) starts the back-off over.
    """
    deadline = time.monotonic() + timeout
    idle = 0
    pause = _SHORTEST_PAUSE
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            pytest.fail(f"timed out after {timeout:g} s waiting for {said}")
        if poll is not None and poll():
            idle, pause = 0, _SHORTEST_PAUSE
            continue
        idle += 1
        if idle <= _YIELDS:
            os.sched_yield()
        else:
            time.sleep(pause)
            pause = min(pause * 2, longest_pause)


def holds_for(predicate: Callable[[], Any], window: float, what: str | Callable[[], str], *,
              poll: Callable[[], Any] | None = None, pause: float = 0.01) -> None:
    """A negative check: ``predicate()`` stays true for ``window`` seconds (the check's window:
    what it watches must have had the time to go wrong by then), looked at every ``pause``
    seconds and once more at the end; the first look that finds it false fails the test with
    "``what`` stopped holding". ``poll()``, when given, runs before each look: the work this
    thread must do meanwhile (a subscription's poll)."""
    deadline = time.monotonic() + window
    while True:
        if poll is not None:
            poll()
        if not predicate():
            said = what if isinstance(what, str) else what()
            pytest.fail(f"{said} stopped holding within the {window:g} s window")
        if time.monotonic() >= deadline:
            return
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))


def time_left(deadline: float) -> float:
    """The seconds from now to the monotonic ``deadline`` (0 once it passed): a timeout for
    one of several waits that share a deadline."""
    return max(0.0, deadline - time.monotonic())


async def await_until(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """:func:`wait_until` for a coroutine: the event loop runs between looks (every 5 ms)."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.005)
