"""Doorbells: a 32-bit word that wakes whoever sleeps on it (a futex; docs/protocol.md, Wake-ups).

A ringer bumps the word and wakes its sleepers; a sleeper reads the word *before* it looks
for work, and sleeps only while the word still holds what it read, so a ring between the look
and the sleep is never lost. Both sides may live in different processes (the word is in a
shared mapping) or in threads of one process. Ringing is a syscall: doorbells are for rare
events (commands to the driver, broadcasts to clients, image changes); the log's own data and
progress words only signal while someone sleeps (see shmbus.shm.log_buffer).

Who rings which bell is said where each word is laid out (cnc.dat's header for the driver's
and the clients' bells).
"""

from __future__ import annotations

from shmbus.shm._native import AtomicBuffer, signal_word, wait_word


class Doorbell:
    """The word at ``offset`` of ``buffer`` (4-byte aligned)."""

    __slots__ = ("buffer", "offset")

    def __init__(self, buffer: AtomicBuffer, offset: int) -> None:
        self.buffer = buffer
        self.offset = offset

    @classmethod
    def private(cls) -> Doorbell:
        """A bell in this process's own memory, for its threads."""
        return cls(AtomicBuffer(bytearray(64)), 0)

    def value(self) -> int:
        """The word now (acquire): read it before looking for work, then :meth:`wait` on it."""
        return self.buffer.get_int32_acquire(self.offset)

    def ring(self) -> None:
        """Bump the word and wake every sleeper."""
        signal_word(self.buffer, self.offset)

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep, without the GIL, while the word holds ``seen``, at most ``timeout`` seconds.

        Returns early on a ring (or a signal); the caller looks for work again either way.
        """
        wait_word(self.buffer, self.offset, seen, timeout)
