"""A many-to-one ring buffer in shared memory: the to-driver command channel of cnc.dat.

Modelled on Agrona's ``ManyToOneRingBuffer`` (``RingBufferDescriptor``, ``RecordDescriptor``).
Any number of producers, in any number of threads and processes, ``write`` records; exactly one
consumer (the driver's conductor) ``read`` s them in the order their space was claimed.

Region layout, Aeron's ``aeron_rb_descriptor_t`` (``capacity`` is a power of two; each trailer
field owns a 128-byte line, and a first empty line keeps the records' last bytes off the tail's,
so producers spinning on the tail never share a line with the consumer's head)::

    0                                                             capacity
    +-------------------------------------------------------------+
    |                  records (capacity bytes)                   |
    +-------------------------------------------------------------+
    capacity + 0    (padding)
    capacity + 128  tail position (i64)        producers: compare-and-set
    capacity + 256  head cache position (i64)  producers: a stale copy of head (release)
    capacity + 384  head position (i64)        consumer: release store after each read
    capacity + 512  correlation counter (i64)  anyone: atomic fetch-add
    capacity + 640  consumer heartbeat (i64)   consumer: ms since the Unix epoch (release); the
                                               driver's liveness, as clients of every language
                                               read it; -1 once the driver closed
    capacity + 768  end of trailer (TRAILER_LENGTH)

Positions (tail, head) grow forever; the byte index of a position is ``position & (capacity-1)``.

Record layout (records are 8-byte aligned; a record never wraps)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                   length (i32, header included)             |
    +-+-------------------------------------------------------------+
    |                   message type (i32, >= 1; -1 = padding)      |
    +---------------------------------------------------------------+
    |                   payload (length - 8 bytes) ...              |
    +---------------------------------------------------------------+

    R: the length is negative while the producer is still writing the record.

Protocol. A producer claims ``align(8 + len, 8)`` bytes by compare-and-set on the tail (plus a
padding record to the end of the region when the record would not fit before the wrap), stores
``-length`` with a full-barrier atomic, copies the payload and type, then release-stores
``+length``. The consumer acquire-loads each length and stops at the first one that is not
positive; after a batch it zeroes what it read and release-stores the new head, which frees the
space for producers. Because the consumer zeroes, a length of 0 means "claimed or free, nothing
written yet".

Failure semantics. A full buffer is not an error: ``write`` returns False and the caller retries
or gives up. A producer that dies between claiming and committing leaves a record the consumer
cannot pass; after a timeout of no progress, the consumer (the driver) calls :meth:`unblock`,
which turns that record, or the zeroed gap it left, into padding (the driver counts these).
"""

from __future__ import annotations

from collections.abc import Callable

from shmbus.shm._native import AtomicBuffer
from shmbus.shm.record_region import (
    ALIGNMENT,
    HEADER_LENGTH,
    PADDING_MSG_TYPE_ID,
    RecordRegion,
    align,
    check_capacity,
)

LINE_LENGTH = 128
TAIL_POSITION_OFFSET = LINE_LENGTH
HEAD_CACHE_POSITION_OFFSET = LINE_LENGTH * 2
HEAD_POSITION_OFFSET = LINE_LENGTH * 3
CORRELATION_COUNTER_OFFSET = LINE_LENGTH * 4
CONSUMER_HEARTBEAT_OFFSET = LINE_LENGTH * 5
#: Bytes after the data region, holding the fields above (offsets relative to its start).
TRAILER_LENGTH = LINE_LENGTH * 6

class RingBufferCorruptError(ValueError):
    """A record's length does not frame a record (see :meth:`ManyToOneRingBuffer.read`)."""


#: ``handler(msg_type, payload)``; the payload view is valid only during the call.
MessageHandler = Callable[[int, memoryview], object]


def ring_buffer_length(capacity: int) -> int:
    """Total bytes a ring buffer of ``capacity`` data bytes occupies (data plus trailer)."""
    check_capacity(capacity, ManyToOneRingBuffer.NAME)
    return capacity + TRAILER_LENGTH


class ManyToOneRingBuffer(RecordRegion):
    """Many producers, one consumer, over ``length`` bytes of ``buffer`` from ``offset``.

    ``length`` (default: the rest of the buffer) must be a power-of-two capacity plus
    :data:`TRAILER_LENGTH`; ``offset`` must be 8-byte aligned (128 recommended). The memory
    must start zeroed (a fresh file); this object keeps no state of its own besides the
    geometry, so any number of processes may wrap the same region at once.

    Who may call what: :meth:`write`, :meth:`next_correlation_id`, :meth:`size` and reading
    :attr:`consumer_heartbeat_time` from any thread of any process; :meth:`read`,
    :meth:`unblock` and setting the heartbeat only from the single consumer.
    """

    __slots__ = ("_tail", "_head_cache", "_head", "_correlation", "_heartbeat")

    NAME = "ring buffer"
    TRAILER_LENGTH = TRAILER_LENGTH

    def __init__(self, buffer: AtomicBuffer, offset: int = 0, length: int | None = None) -> None:
        super().__init__(buffer, offset, length)
        trailer = self._trailer
        self._tail = trailer + TAIL_POSITION_OFFSET
        self._head_cache = trailer + HEAD_CACHE_POSITION_OFFSET
        self._head = trailer + HEAD_POSITION_OFFSET
        self._correlation = trailer + CORRELATION_COUNTER_OFFSET
        self._heartbeat = trailer + CONSUMER_HEARTBEAT_OFFSET

    # -- producers ----------------------------------------------------------------------------

    def write(self, msg_type: int, payload: bytes | bytearray | memoryview) -> bool:
        """Append one record; True once it is committed, False if there was no room.

        Safe from any number of threads and processes. Raises ValueError for ``msg_type < 1``
        or a payload over :attr:`max_msg_length` bytes. False also results, exceptionally, when
        the consumer unblocked this very claim because the producer stalled past the unblock
        timeout between claiming and writing; the record is then not delivered.
        """
        length = self._payload_length(msg_type, payload)
        record_length = HEADER_LENGTH + length
        index = self._claim(align(record_length))
        if index is None:
            return False
        buffer = self._buffer
        at = self._base + index
        # Mark the record as being written; the atomic is a full barrier, so the negative
        # length is visible before any payload byte (unblock's scan relies on that).
        if not buffer.compare_and_set_int32(at, 0, -record_length):
            return False
        if length:
            buffer.put_bytes(at + HEADER_LENGTH, payload)
        buffer.put_int32(at + 4, msg_type)
        buffer.put_int32_release(at, record_length)
        return True

    def _claim(self, required: int) -> int | None:
        """Reserve ``required`` aligned bytes; the record's byte index, or None when full.

        When the record does not fit before the end of the region, the rest of the region is
        claimed too and filled with a padding record, and the record starts at index 0.
        """
        buffer = self._buffer
        capacity = self._capacity
        mask = self._mask
        head = buffer.get_int64_acquire(self._head_cache)
        while True:
            tail = buffer.get_int64_acquire(self._tail)
            if required > capacity - (tail - head):
                head = buffer.get_int64_acquire(self._head)
                if required > capacity - (tail - head):
                    return None
                buffer.put_int64_release(self._head_cache, head)
            padding = 0
            tail_index = tail & mask
            to_end = capacity - tail_index
            if required > to_end:
                head_index = head & mask
                if required > head_index:
                    head = buffer.get_int64_acquire(self._head)
                    head_index = head & mask
                    if required > head_index or required > capacity - (tail - head) - to_end:
                        return None
                    buffer.put_int64_release(self._head_cache, head)
                padding = to_end
            if buffer.compare_and_set_int64(self._tail, tail, tail + required + padding):
                if padding:
                    at = self._base + tail_index
                    buffer.put_int32(at + 4, PADDING_MSG_TYPE_ID)
                    buffer.put_int32_release(at, padding)
                    return 0
                return tail_index

    def next_correlation_id(self) -> int:
        """A number unique among all callers of this ring buffer (atomic fetch-add, from 0)."""
        return self._buffer.get_and_add_int64(self._correlation, 1)

    # -- consumer -----------------------------------------------------------------------------

    def read(self, handler: MessageHandler, limit: int = 2**31 - 1) -> int:
        """Deliver up to ``limit`` committed records to ``handler(msg_type, payload)``.

        Consumer only. Returns the number of messages delivered (padding is skipped and not
        counted). Reads at most up to the end of the region per call. ``payload`` is a
        read-only view of a copy, valid for the call. If the handler raises, the records read
        so far, including the failing one, are consumed, and the exception propagates.

        A record whose length is too short for its header, or reaches past the tail or the
        end of the region, was not written by :meth:`write`: something scribbled on the
        records. The consumer then never reads or clears outside the claimed space: it skips
        every claimed byte from that record up to the tail (or the region's end), losing the
        records there, and raises RingBufferCorruptError once they are consumed; the next
        read goes on from there.
        """
        buffer = self._buffer
        head = buffer.get_int64(self._head)
        head_index = head & self._mask
        contiguous = self._capacity - head_index
        base = self._base + head_index
        bytes_read = 0
        messages = 0
        claimed = 0  # bytes from head to the tail, read again when a record seems to pass it
        try:
            while bytes_read < contiguous and messages < limit:
                at = base + bytes_read
                record_length = buffer.get_int32_acquire(at)
                if record_length <= 0:
                    break
                end = bytes_read + align(record_length)
                if end > claimed:
                    claimed = buffer.get_int64_acquire(self._tail) - head
                if record_length < HEADER_LENGTH or end > min(contiguous, claimed):
                    skipped = max(min(contiguous, claimed) - bytes_read, 0)
                    bytes_read += skipped
                    raise RingBufferCorruptError(
                        f"record at position {head + bytes_read - skipped} has length "
                        f"{record_length}, which does not frame a record between the head "
                        f"and the tail; skipped the {skipped} bytes from there")
                bytes_read = end
                msg_type = buffer.get_int32(at + 4)
                if msg_type == PADDING_MSG_TYPE_ID:
                    continue
                messages += 1
                payload = buffer.get_bytes(at + HEADER_LENGTH, record_length - HEADER_LENGTH)
                handler(msg_type, memoryview(payload))
        finally:
            if bytes_read:
                buffer.set_memory(base, bytes_read, 0)
                buffer.put_int64_release(self._head, head + bytes_read)
        return messages

    def unblock(self) -> bool:
        """Let the consumer pass a record a dead producer claimed but never committed.

        Consumer only (the driver calls it after a timeout in which the head did not move while
        the tail was ahead). True if a record was turned into padding:

        * the record at the head has a negative length (producer died while writing): it
          becomes padding of that length (or, when no write could have stored that length,
          of all the claimed space up to the tail or the end of the region);
        * the length at the head is 0 (producer died right after claiming): the zeroed gap up
          to the next record that has begun, or up to the tail or the end of the region when
          nothing follows, becomes one padding record.

        A producer that is merely slow (stalled for longer than the timeout) may lose its
        record; that is the price of liveness, as in Agrona.
        """
        buffer = self._buffer
        head = buffer.get_int64_acquire(self._head)
        tail = buffer.get_int64_acquire(self._tail)
        if head == tail:
            return False
        mask = self._mask
        consumer_index = head & mask
        producer_index = tail & mask
        at = self._base + consumer_index
        length = buffer.get_int32_acquire(at)
        if length < 0:
            size = -length
            claimed_to_end = min(tail - head, self._capacity - consumer_index)
            if not HEADER_LENGTH <= size <= claimed_to_end:  # not a length write() stored
                size = claimed_to_end
            buffer.put_int32(at + 4, PADDING_MSG_TYPE_ID)
            return buffer.compare_and_set_int32(at, length, size)
        if length > 0:
            return False
        limit = producer_index if producer_index > consumer_index else self._capacity
        gap_end = limit
        i = consumer_index + ALIGNMENT
        while i < limit:
            if buffer.get_int32_acquire(self._base + i) != 0:
                gap_end = i
                break
            i += ALIGNMENT
        # Confirm the gap is still untouched: a slow producer may have begun meanwhile.
        for j in range(consumer_index, gap_end, ALIGNMENT):
            if buffer.get_int32_acquire(self._base + j) != 0:
                return False
        buffer.put_int32(at + 4, PADDING_MSG_TYPE_ID)
        return buffer.compare_and_set_int32(at, 0, gap_end - consumer_index)

    @property
    def consumer_heartbeat_time(self) -> int:
        """When the consumer last showed it was alive, in ms since the Unix epoch (0: never).

        Anyone may read it (acquire load); only the consumer sets it (release store).
        """
        return self._buffer.get_int64_acquire(self._heartbeat)

    @consumer_heartbeat_time.setter
    def consumer_heartbeat_time(self, time_ms: int) -> None:
        self._buffer.put_int64_release(self._heartbeat, time_ms)

    # -- anyone -------------------------------------------------------------------------------

    def size(self) -> int:
        """Bytes claimed but not yet consumed (padding included), from a consistent snapshot."""
        buffer = self._buffer
        head_after = buffer.get_int64_acquire(self._head)
        while True:
            head_before = head_after
            tail = buffer.get_int64_acquire(self._tail)
            head_after = buffer.get_int64_acquire(self._head)
            if head_after == head_before:
                break
        return min(max(tail - head_after, 0), self._capacity)

    def producer_position(self) -> int:
        """The tail position: total bytes ever claimed."""
        return self._buffer.get_int64_acquire(self._tail)

    def consumer_position(self) -> int:
        """The head position: total bytes ever consumed."""
        return self._buffer.get_int64_acquire(self._head)

    def __repr__(self) -> str:
        return (f"ManyToOneRingBuffer(capacity={self._capacity}, "
                f"head={self.consumer_position()}, tail={self.producer_position()})")
