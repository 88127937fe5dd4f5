"""The counters a requester or responder keeps in cnc.dat, so ``shmbus stat`` and ``shmbus
streams`` show each service (types ``rr-*`` in shmbus/shm/counters.py).

Each counter is owned by the client that allocated it (the driver frees it when that client
goes away) and is written by that process only, with atomic adds (threads of one requester
share it); other processes only read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from shmbus.shm._native import AtomicBuffer


class CallCounters:
    """Named counters of one requester or responder: ``add(type_id, delta)``, ``close()``."""

    def __init__(self, values: AtomicBuffer, offsets: Mapping[int, int],
                 remove: Callable[[list[int]], None], ids: list[int]) -> None:
        self._values = values
        self._offsets = dict(offsets)
        self._remove = remove
        self._ids = ids

    def add(self, type_id: int, delta: int = 1) -> None:
        """Add ``delta`` to the counter of ``type_id``."""
        self._values.get_and_add_int64(self._offsets[type_id], delta)

    def adder(self, type_id: int) -> Callable[[int], int]:
        """A callable adding its argument to the counter of ``type_id`` (returns the value
        before): :meth:`add` without its lookups, for a call path's per-call counts."""
        return partial(self._values.get_and_add_int64, self._offsets[type_id])

    def get(self, type_id: int) -> int:
        """The counter's value."""
        return self._values.get_int64_acquire(self._offsets[type_id])

    def close(self) -> None:
        """Free the counters. Idempotent."""
        ids, self._ids = self._ids, []
        if ids:
            self._remove(ids)


def label(type_name: str, channel: str, stream_id: int, role: str) -> str:
    """A stream counter's label, as ``shmbus stat`` reads them: registration and session 0."""
    return f"{type_name}: 0 0 {stream_id} {channel} {role}"
