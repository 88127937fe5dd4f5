"""The one way the tools (benchmarks, the nemesis) wait for another process's state: look at a
condition at a fixed interval until it holds or a deadline passes. Runs in whichever tool
process calls it; tests wait with tests/support/waits.py instead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(condition: Callable[[], T], timeout: float, interval: float) -> T | None:
    """Look at ``condition()`` every ``interval`` seconds until it returns a true value, and
    return that value; None once ``timeout`` seconds have passed without one. ``condition``
    may act when the state it waits for is there (kill a process in a phase, say): it is
    called no more after it returned a true value. What it raises goes to the caller."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)
