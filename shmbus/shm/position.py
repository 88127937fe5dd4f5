"""A position: one 64-bit value in shared memory (a counter slot), read and written atomically."""

from __future__ import annotations

from shmbus.shm._native import AtomicBuffer


class Position:
    """A 64-bit position at ``offset`` in ``buffer``, 8-byte aligned.

    One process owns (writes) each position; any process may read it. Writes are release
    stores and reads acquire loads, so what was written before a position moved is visible to
    whoever sees it move.
    """

    __slots__ = ("buffer", "offset")

    def __init__(self, buffer: AtomicBuffer, offset: int) -> None:
        buffer.get_int64_acquire(offset)  # validates bounds and alignment now, not on first use
        self.buffer = buffer
        self.offset = offset

    def get(self) -> int:
        """The current value (acquire load)."""
        return self.buffer.get_int64_acquire(self.offset)

    def set(self, value: int) -> None:
        """Store a new value (release store). Only the owner may call this."""
        self.buffer.put_int64_release(self.offset, value)

    def __repr__(self) -> str:
        return f"Position(offset={self.offset}, value={self.get()})"
