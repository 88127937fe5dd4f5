"""What the driver does for the streams of Aeron's clients, which run none of shmbus's native
wake-ups: it wakes by time, not only by doorbell, while one is attached.

shmbus's readers and writers sleep on a log's wake-up words (docs/protocol.md, Wake-ups), which
shmbus's publishers and subscribers bump. An Aeron client never rings the driver's doorbell
and never bumps those words: its publication only appends, its image only moves its position
counter, and its publication only reads pub-lmt, raising nothing. So while an Aeron client is
attached the driver runs its duty cycle by the clock, as Aeron's conductor does: each cycle
raises the limits (the conductor's update_limits), and here, for every log an Aeron client
writes, wakes the log's sleeping readers when the log's tail moved, and for every log an Aeron
client reads, wakes the sleeping writers when that reader moved. Between cycles, shmbus's
readers of a log an Aeron client writes raise its limit themselves as they store their
positions (the driver marks the log: LogBuffer.raised_by_readers).

The cycle is short while such a stream moves and backs off while it rests, so an attached Aeron
client costs an idle driver a wake-up every BACKED_OFF_MS. Runs in the driver, on the
conductor's thread.
"""

from __future__ import annotations

from collections.abc import Iterable

from shmbus.driver.ipc_publication import IpcPublication
from shmbus.shm import _native

#: the cycle while a stream of an Aeron client moves (a pub-lmt raised, a reader woken)
MOVING_MS = 1
#: the longest cycle, reached by doubling while nothing moves
BACKED_OFF_MS = 16


class AeronClientStreams:
    """Wakes shmbus's sleepers on the logs Aeron's clients write or read, and says when the
    driver must look next. Single-threaded: the conductor's."""

    def __init__(self) -> None:
        #: the last position seen of each watched log tail and reader, by (log, counter) key
        self._seen: dict[tuple[int, int], int] = {}
        self._interval_ms = MOVING_MS
        self._next_ms: int | None = None

    def on_cycle(self, publications: Iterable[IpcPublication], aeron_clients: set[int],
                 now_ms: int) -> None:
        """One look at every log with an Aeron writer or reader (``aeron_clients``: the ids
        of the attached Aeron clients)."""
        if not aeron_clients:
            self._seen.clear()
            self._next_ms = None
            return
        moved = False
        seen: dict[tuple[int, int], int] = {}
        for publication in publications:
            log = publication.log
            if any(owner.client_id in aeron_clients for owner in publication.owners):
                key = (publication.registration_id, -1)
                seen[key] = publication.producer_position()
                if seen[key] != self._seen.get(key):
                    _native.wake_log_readers(log.buffer)
                    moved = True
            for link in publication.subscribers.values():
                if link.client_id in aeron_clients:
                    key = (publication.registration_id, link.counter_id)
                    seen[key] = link.position.get()
                    if seen[key] != self._seen.get(key):
                        _native.wake_log_writers(log.buffer)
                        moved = True
        self._seen = seen
        if moved:
            self._interval_ms = MOVING_MS
        else:
            self._interval_ms = min(self._interval_ms * 2, BACKED_OFF_MS)
        self._next_ms = now_ms + self._interval_ms

    def ms_until_due(self, now_ms: int) -> int | None:
        """How long the driver may sleep before the next look (None: no Aeron client, so
        only the doorbell and the timers wake it)."""
        return None if self._next_ms is None else max(0, self._next_ms - now_ms)
