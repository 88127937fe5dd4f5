"""Idle strategies: what a loop does when a call did no work (Agrona's IdleStrategy).

Every strategy has ``idle(work_count)``: it idles only when work_count is 0, and ``reset()``
after work was done. The default is :class:`BackoffIdleStrategy`: a few spins, then yields,
then sleeps growing from 50 us to 1 ms, so an idle bus costs almost no CPU on a small machine.
(Linux rounds short sleeps up by the thread's timer slack, 50 us by default, so shorter
sleeps would not be shorter.)
"""

from __future__ import annotations

import os
import time


class BusySpinIdleStrategy:
    """Never gives up the CPU: lowest latency, a whole core per waiting loop."""

    name = "busy-spin"

    def idle(self, work_count: int = 0) -> None:
        """Idle if ``work_count`` is 0 (the last call did nothing); any thread may call."""
        pass

    def reset(self) -> None:
        """Start over after work was done (a back-off begins again from its shortest idle)."""
        pass


class NoOpIdleStrategy(BusySpinIdleStrategy):
    """Does nothing at all (for loops that pace themselves)."""

    name = "no-op"


class YieldingIdleStrategy:
    """Yields the CPU (sched_yield) whenever idle."""

    name = "yielding"

    def idle(self, work_count: int = 0) -> None:
        """Idle if ``work_count`` is 0 (the last call did nothing); any thread may call."""
        if work_count <= 0:
            os.sched_yield()

    def reset(self) -> None:
        """Start over after work was done (a back-off begins again from its shortest idle)."""
        pass


class SleepingIdleStrategy:
    """Sleeps a fixed period whenever idle."""

    name = "sleeping"

    def __init__(self, period_s: float = 0.001) -> None:
        self.period_s = period_s

    def idle(self, work_count: int = 0) -> None:
        """Idle if ``work_count`` is 0 (the last call did nothing); any thread may call."""
        if work_count <= 0:
            time.sleep(self.period_s)

    def reset(self) -> None:
        """Start over after work was done (a back-off begins again from its shortest idle)."""
        pass


class BackoffIdleStrategy:
    """Spins, then yields, then sleeps with exponential back-off up to ``max_sleep_s``."""

    name = "back-off"
    _spins: int
    _yields: int
    _sleep_s: float

    def __init__(
        self,
        max_spins: int = 10,
        max_yields: int = 50,
        min_sleep_s: float = 50e-6,
        max_sleep_s: float = 1e-3,
    ) -> None:
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.min_sleep_s = min_sleep_s
        self.max_sleep_s = max_sleep_s
        self.reset()

    def idle(self, work_count: int = 0) -> None:
        """Idle if ``work_count`` is 0 (the last call did nothing); any thread may call."""
        if work_count > 0:
            self.reset()
            return
        if self._spins < self.max_spins:
            self._spins += 1
        elif self._yields < self.max_yields:
            self._yields += 1
            os.sched_yield()
        else:
            time.sleep(self._sleep_s)
            self._sleep_s = min(self._sleep_s * 2, self.max_sleep_s)

    def reset(self) -> None:
        """Start over after work was done (a back-off begins again from its shortest idle)."""
        self._spins = 0
        self._yields = 0
        self._sleep_s = self.min_sleep_s


IdleStrategy = (
    BusySpinIdleStrategy | NoOpIdleStrategy | YieldingIdleStrategy | SleepingIdleStrategy
    | BackoffIdleStrategy
)
