"""IPC flow control and term cleaning for one publication log (seed 001, "IPC Operation").

The publication limit is the slowest tethered subscriber's position plus a window; before the
limit is raised, the bytes every subscriber has consumed are zeroed, so the term the publisher
rotates into again is clean (a reader relies on a zero frame length meaning "not written").

The driver owns one :class:`IpcFlowControl` per IPC publication. It is pure logic over the log
and the limit position, with no clock and no I/O, so tests drive it directly.
"""

from __future__ import annotations

from collections.abc import Iterable

from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position


def ipc_window(term_length: int, configured_window: int | None = None) -> int:
    """The IPC publication window: min(configured window, term length / 2)."""
    half = term_length // 2
    return half if not configured_window else min(configured_window, half)


class IpcFlowControl:
    """Sets one log's publication limit from its subscribers' positions, cleaning behind them.

    Only one process (the driver, or a test standing in for it) may own an instance per log.
    """

    def __init__(self, log: LogBuffer, limit: Position, window: int | None = None, *,
                 clean_lag: int = 0) -> None:
        self.log = log
        self.limit = limit
        self.window = ipc_window(log.term_length, window)
        #: bytes behind the slowest consumer kept uncleaned (a term for network retransmits)
        self.clean_lag = clean_lag
        self.trip_gain = self.window // 8
        self.clean_position = self._start_position()
        self.consumer_position = self.clean_position
        self._trip_limit = 0

    def _start_position(self) -> int:
        return self.log.producer_position()

    def update(self, subscriber_positions: Iterable[int]) -> int:
        """Recompute the limit from the tethered subscribers' positions; returns the limit.

        With no subscriber the limit is pulled back to the consumer position, so the
        publisher sees NOT_CONNECTED / BACK_PRESSURED rather than filling the log unread.
        """
        positions = list(subscriber_positions)
        if positions:
            lowest = min(positions)
            # a reader behind where cleaning would start (flow control taken over mid-stream)
            # must not find stale frames three terms on: clean from it instead
            self.clean_position = min(self.clean_position, lowest)
            self.consumer_position = max(self.consumer_position, max(positions))
            proposed = lowest + self.window
            if proposed >= self._trip_limit:
                self.clean_to(lowest - self.clean_lag)
                self.limit.set(proposed)
                self._trip_limit = proposed + self.trip_gain
        elif self.limit.get() > self.consumer_position:
            self.limit.set(self.consumer_position)
            self._trip_limit = self.consumer_position
            self.clean_to(self.consumer_position - self.clean_lag)
        return self.limit.get()

    def clean_to(self, position: int) -> None:
        """Zero the log from the clean position up to ``position`` (consumed bytes only).

        The first 8 bytes of each cleaned span are zeroed last with a release store.
        """
        term_length = self.log.term_length
        buffer = self.log.buffer
        while position > self.clean_position:
            index = (self.clean_position // term_length) % 3
            term_offset = self.clean_position % term_length
            length = min(position - self.clean_position, term_length - term_offset)
            start = index * term_length + term_offset
            buffer.set_memory(start + 8, length - 8, 0)
            buffer.put_int64_release(start, 0)
            self.clean_position += length
