"""A one-to-many broadcast buffer in shared memory: the to-clients channel of cnc.dat.

Modelled on Agrona's ``BroadcastTransmitter`` / ``BroadcastReceiver`` / ``CopyBroadcastReceiver``
(``BroadcastBufferDescriptor``, ``RecordDescriptor``). One transmitter (the driver) writes
records without ever waiting; any number of receivers, each in its own process, follow at their
own pace. A receiver that falls more than the capacity behind is *lapped*: the records it had
not read are overwritten and lost. Loss is not an error condition: the receiver detects it,
counts it in ``lapped_count`` and resumes at the latest record.

Region layout (``capacity`` is a power of two; only the transmitter writes the trailer, so its
three fields share one 128-byte line)::

    0                                                             capacity
    +-------------------------------------------------------------+
    |                  records (capacity bytes)                   |
    +-------------------------------------------------------------+
    capacity + 0    tail intent counter (i64)  position the record being written will end at
    capacity + 8    tail counter (i64)         position after the last complete record
    capacity + 16   latest counter (i64)       position of the last complete record
    capacity + 128  end of trailer (TRAILER_LENGTH)

Record layout (8-byte aligned; a record never wraps, a padding record fills the end)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                   length (i32, header included)               |
    +---------------------------------------------------------------+
    |                   message type (i32, >= 1; -1 = padding)      |
    +---------------------------------------------------------------+
    |                   payload (length - 8 bytes) ...              |
    +---------------------------------------------------------------+

Protocol. The transmitter first raises the tail intent to the position its record will end at
(an atomic, so the store is visible before any byte of the record changes), writes the record,
sets latest, then release-stores the tail. A receiver acquire-loads the tail to see whether a
record is complete, copies it, then acquire-loads the tail intent: if ``cursor + capacity <=
tail intent`` no byte of the copy can have been overwritten. Otherwise it was lapped.
"""

from __future__ import annotations

from collections.abc import Callable

from shmbus.shm._native import AtomicBuffer, acquire_fence
from shmbus.shm.record_region import (
    HEADER_LENGTH,
    PADDING_MSG_TYPE_ID,
    RecordRegion,
    align,
    check_capacity,
)

TAIL_INTENT_COUNTER_OFFSET = 0
TAIL_COUNTER_OFFSET = 8
LATEST_COUNTER_OFFSET = 16
#: Bytes after the data region, holding the counters above (offsets relative to its start).
TRAILER_LENGTH = 128

#: ``handler(msg_type, payload)``; the payload is a copy the handler may keep.
BroadcastHandler = Callable[[int, bytes], object]


def broadcast_buffer_length(capacity: int) -> int:
    """Total bytes a broadcast buffer of ``capacity`` data bytes occupies (data plus trailer)."""
    check_capacity(capacity, _Region.NAME)
    return capacity + TRAILER_LENGTH


class _Region(RecordRegion):
    """The geometry and trailer shared by the transmitter and receivers."""

    __slots__ = ("_tail_intent", "_tail", "_latest")

    NAME = "broadcast buffer"
    TRAILER_LENGTH = TRAILER_LENGTH

    def __init__(self, buffer: AtomicBuffer, offset: int = 0, length: int | None = None) -> None:
        super().__init__(buffer, offset, length)
        trailer = self._trailer
        self._tail_intent = trailer + TAIL_INTENT_COUNTER_OFFSET
        self._tail = trailer + TAIL_COUNTER_OFFSET
        self._latest = trailer + LATEST_COUNTER_OFFSET


class BroadcastTransmitter(_Region):
    """The single writer of a broadcast buffer (``length`` bytes of ``buffer`` from ``offset``).

    Not thread-safe and not shareable: exactly one transmitter, in one thread of one process,
    may exist for a region. The region must start zeroed. :meth:`transmit` never blocks and
    never fails for lack of space; slow receivers lose messages instead.
    """

    __slots__ = ()

    def transmit(self, msg_type: int, payload: bytes | bytearray | memoryview) -> None:
        """Write one record, overwriting the oldest ones if needed.

        Raises ValueError for ``msg_type < 1`` or a payload over :attr:`max_msg_length`.
        """
        length = self._payload_length(msg_type, payload)
        buffer = self._buffer
        tail = buffer.get_int64(self._tail)
        record_offset = tail & self._mask
        record_length = HEADER_LENGTH + length
        aligned = align(record_length)
        to_end = self._capacity - record_offset
        if to_end < aligned:
            self._signal_tail_intent(tail + to_end + aligned)
            at = self._base + record_offset
            buffer.put_int32(at, to_end)
            buffer.put_int32(at + 4, PADDING_MSG_TYPE_ID)
            tail += to_end
            record_offset = 0
        else:
            self._signal_tail_intent(tail + aligned)
        at = self._base + record_offset
        buffer.put_int32(at, record_length)
        buffer.put_int32(at + 4, msg_type)
        if length:
            buffer.put_bytes(at + HEADER_LENGTH, payload)
        buffer.put_int64_release(self._latest, tail)
        buffer.put_int64_release(self._tail, tail + aligned)

    def _signal_tail_intent(self, new_intent: int) -> None:
        # A read-modify-write rather than a release store: it is a full barrier, so receivers
        # see the raised intent before any of the record bytes that follow it change.
        buffer = self._buffer
        current = buffer.get_int64(self._tail_intent)
        buffer.get_and_add_int64(self._tail_intent, new_intent - current)


class BroadcastReceiver(_Region):
    """One reader of a broadcast buffer; create one per process (or thread) that listens.

    Starts at the current tail: it sees the records transmitted after it was created. Not
    thread-safe (one thread per receiver). After :meth:`receive_next` returns True,
    :attr:`msg_type` and :attr:`buffer` describe a record that was copied and then validated,
    so it is never torn. :attr:`lapped_count` counts the times records were lost.
    """

    __slots__ = ("_next_record", "_msg_type", "_payload", "_lapped_count")

    #: How many times one :meth:`receive_next` may restart after being lapped mid-copy.
    MAX_RETRIES = 16

    def __init__(self, buffer: AtomicBuffer, offset: int = 0, length: int | None = None) -> None:
        super().__init__(buffer, offset, length)
        self._next_record = buffer.get_int64_acquire(self._tail)
        self._msg_type = 0
        self._payload = b""
        self._lapped_count = 0

    @property
    def lapped_count(self) -> int:
        """How many times this receiver was overtaken by the transmitter and skipped ahead."""
        return self._lapped_count

    @property
    def msg_type(self) -> int:
        """Type of the record last received (0 before the first)."""
        return self._msg_type

    @property
    def buffer(self) -> bytes:
        """Payload of the record last received: a validated copy, safe to keep."""
        return self._payload

    def receive_next(self) -> bool:
        """Move to the next record; True if one was received, False if there is none yet.

        Lapping (before or during the copy) is detected and recovered from here: the receiver
        jumps to the latest complete record and ``lapped_count`` grows. Never raises for loss.
        """
        buffer = self._buffer
        for _ in range(self.MAX_RETRIES):
            tail = buffer.get_int64_acquire(self._tail)
            cursor = self._next_record
            if tail <= cursor:
                return False
            if self._is_intact(cursor):
                record = self._copy(cursor)
                if record is not None:
                    self._next_record, self._msg_type, self._payload = record
                    return True
            self._lapped_count += 1
            self._next_record = buffer.get_int64_acquire(self._latest)
        return False

    def _copy(self, cursor: int) -> tuple[int, int, bytes] | None:
        """Copy the record at ``cursor`` (skipping padding); None if it was overwritten."""
        buffer = self._buffer
        capacity = self._capacity
        offset = cursor & self._mask
        at = self._base + offset
        length = buffer.get_int32(at)
        msg_type = buffer.get_int32(at + 4)
        if msg_type == PADDING_MSG_TYPE_ID:
            if length != capacity - offset or not self._is_intact(cursor):
                return None
            cursor += length
            offset = 0
            at = self._base
            length = buffer.get_int32(at)
            msg_type = buffer.get_int32(at + 4)
        # A torn or overwritten header can hold anything: check before using it.
        if length < HEADER_LENGTH or offset + length > capacity:
            return None
        payload = buffer.get_bytes(at + HEADER_LENGTH, length - HEADER_LENGTH)
        acquire_fence()  # the copy's loads complete before the tail intent is checked
        if not self._is_intact(cursor):
            return None
        return cursor + align(length), msg_type, payload

    def _is_intact(self, cursor: int) -> bool:
        """True if no record from ``cursor`` on can have been overwritten so far."""
        return cursor + self._capacity > self._buffer.get_int64_acquire(self._tail_intent)

    def receive(self, handler: BroadcastHandler, limit: int = 64) -> int:
        """Deliver up to ``limit`` available messages to ``handler(msg_type, payload)``.

        The ``CopyBroadcastReceiver`` convenience: each payload is copied and validated before
        the handler sees it, so the handler may keep it. Returns the number delivered. Loss is
        counted in :attr:`lapped_count`, never raised.
        """
        delivered = 0
        while delivered < limit and self.receive_next():
            handler(self._msg_type, self._payload)
            delivered += 1
        return delivered


class CopyBroadcastReceiver(BroadcastReceiver):
    """Agrona's name for a receiver used through :meth:`BroadcastReceiver.receive`."""

    __slots__ = ()
