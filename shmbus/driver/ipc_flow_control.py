"""IPC flow control and term cleaning for one publication log (docs/protocol.md, IPC flow control).

The publication limit is the slowest counted position plus a window; before the limit is
raised, the bytes every counted reader has consumed are zeroed, so the term a publisher rotates
into again is clean (a reader relies on a zero frame length meaning "not written").

The limit moves at memory speed: the driver decides *which* position counters count
(tethering, liveness, the sender of a network publication) and publishes their ids in the log
metadata; a publisher that reaches its limit raises it itself from those counters, natively,
under the log's flow-control lock (see ``shmbus/shm/native/flow_control.c``). The driver's own
calls to :meth:`IpcFlowControl.update` cover what no publisher is there to do: the first limit,
pulling the limit back when nobody counts, and cleaning while publishers are idle.

The driver owns one :class:`IpcFlowControl` per IPC publication; tests stand in for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from shmbus.shm import _native
from shmbus.shm.log_buffer import (
    FC_CLEAN_LAG_OFFSET,
    FC_CLEAN_POSITION_OFFSET,
    FC_LOCK_OFFSET,
    FC_WINDOW_OFFSET,
    LogBuffer,
)
from shmbus.shm.position import Position

# modes of _native.flow_control_advance
_RAISE, _PULL_BACK, _CLEAN_ONLY = 0, 1, 2


def ipc_window(term_length: int, configured_window: int | None = None) -> int:
    """The IPC publication window: min(configured window, term length / 2)."""
    half = term_length // 2
    return half if not configured_window else min(configured_window, half)


class IpcFlowControl:
    """Sets one log's publication limit from its readers' positions, cleaning behind them.

    Only one process (the driver, or a test standing in for it) may own an instance per log;
    publishers raise the limit between the owner's calls.
    """

    def __init__(self, log: LogBuffer, limit: Position, window: int | None = None, *,
                 clean_lag: int = 0) -> None:
        self.log = log
        self.limit = limit
        self.window = ipc_window(log.term_length, window)
        #: bytes behind the slowest consumer kept uncleaned (a term for network retransmits)
        self.clean_lag = clean_lag
        self.trip_gain = self.window // 8
        #: the furthest any reader has been: where the limit goes back to when nobody counts
        self.consumer_position = log.producer_position()
        self._counted: tuple[int, ...] | None = None
        meta = log.meta_offset
        log.buffer.put_int32(meta + FC_WINDOW_OFFSET, self.window)
        log.buffer.put_int32(meta + FC_CLEAN_LAG_OFFSET, clean_lag)
        log.buffer.put_int64_release(meta + FC_CLEAN_POSITION_OFFSET, self.consumer_position)
        self._lock_seen = 0

    def set_counted(self, counter_ids: Sequence[int]) -> None:
        """Publish which position counters hold the limit back (publishers read them)."""
        counted = tuple(counter_ids)
        if counted != self._counted:
            _native.flow_control_set(self.log.buffer, self.log.term_length, counted)
            self._counted = counted

    def update(self, positions: Iterable[int]) -> int:
        """Recompute the limit from the counted readers' positions; returns the limit.

        With no reader the limit is pulled back to the consumer position, so the publisher
        sees NOT_CONNECTED / BACK_PRESSURED rather than filling the log unread. When a
        publisher holds the flow-control lock the move waits for the next call.
        """
        positions = list(positions)
        limit = self.limit.get()
        if positions:
            lowest = min(positions)
            self.consumer_position = max(self.consumer_position, max(positions))
            if lowest + self.window >= limit + self.trip_gain:
                self._advance(lowest, _RAISE)
        elif limit > self.consumer_position:
            self._advance(self.consumer_position, _PULL_BACK)
        return self.limit.get()

    def clean_to(self, position: int) -> None:
        """Zero the log up to ``position`` (consumed bytes only), leaving the limit alone."""
        self._advance(position + self.clean_lag, _CLEAN_ONLY)

    def _advance(self, slowest: int, mode: int) -> None:
        _native.flow_control_advance(self.log.buffer, self.log.term_length, self.limit.buffer,
                                     self.limit.offset, slowest, mode)

    def release_dead_lock(self, is_alive: Callable[[int], bool]) -> bool:
        """Free the flow-control lock if the process holding it died; True if freed.

        ``is_alive(pid) -> bool`` decides. A lock seen held by the same pid on two calls in a
        row, by a dead process, is released (a live holder finishes within microseconds).
        """
        buffer, offset = self.log.buffer, self.log.meta_offset + FC_LOCK_OFFSET
        holder = buffer.get_int64_acquire(offset)
        seen, self._lock_seen = self._lock_seen, holder
        if holder == 0 or holder != seen or is_alive(holder):
            return False
        return bool(buffer.compare_and_set_int64(offset, holder, 0))
