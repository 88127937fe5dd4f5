"""The region and records both channels of cnc.dat are made of: the to-driver ring buffer
(:mod:`shmbus.shm.ring_buffer`) and the to-clients broadcast buffer
(:mod:`shmbus.shm.broadcast`), after Agrona's ``RecordDescriptor``.

A region is ``capacity`` bytes of records (a power of two, at least 64) followed by a trailer
that each channel lays out itself. A record is an 8-byte header (length i32, header included;
message type i32, >= 1, or -1 for padding) and its payload; records are 8-byte aligned, never
wrap, and carry at most ``capacity / 8`` bytes of payload.
"""

from __future__ import annotations

from typing import ClassVar

from shmbus.shm._native import AtomicBuffer

#: Length of the record header (length i32, type i32) in bytes.
HEADER_LENGTH = 8
#: Records start on multiples of this many bytes.
ALIGNMENT = 8
#: The message type of a padding record, skipped by readers.
PADDING_MSG_TYPE_ID = -1


def align(value: int, alignment: int = ALIGNMENT) -> int:
    """``value`` rounded up to a multiple of ``alignment`` (a power of two)."""
    return (value + alignment - 1) & ~(alignment - 1)


def check_capacity(capacity: int, name: str) -> None:
    """Raise ValueError, naming the ``name`` region, unless ``capacity`` is a power of two of
    at least 64 bytes."""
    if capacity < 64 or capacity & (capacity - 1):
        raise ValueError(f"{name} capacity {capacity} is not a power of two >= 64")


class RecordRegion:
    """The geometry of a region over ``length`` bytes of ``buffer`` from ``offset`` (default:
    the rest of the buffer): ``length`` is a power-of-two capacity plus the subclass's
    ``TRAILER_LENGTH``; the region's start and its trailer must be 8-byte aligned.

    Raises ValueError for a capacity that is not a power of two >= 64 or a region outside
    ``buffer``. Keeps no state besides the geometry.
    """

    __slots__ = ("_buffer", "_base", "_capacity", "_mask", "_max_msg_length")

    #: what error messages call the region ("ring buffer")
    NAME: ClassVar[str]
    #: bytes after the records, laid out by the subclass
    TRAILER_LENGTH: ClassVar[int]

    def __init__(self, buffer: AtomicBuffer, offset: int = 0, length: int | None = None) -> None:
        if length is None:
            length = buffer.capacity - offset
        capacity = length - self.TRAILER_LENGTH
        check_capacity(capacity, self.NAME)
        if offset < 0 or offset + length > buffer.capacity:
            raise ValueError(
                f"{self.NAME} [{offset}, {offset + length}) is outside a buffer of "
                f"{buffer.capacity} bytes")
        self._buffer = buffer
        self._base = offset
        self._capacity = capacity
        self._mask = capacity - 1
        self._max_msg_length = capacity // 8
        buffer.get_int64_acquire(self._trailer)  # alignment is checked now, not on first use
        buffer.get_int32_acquire(offset)

    @property
    def _trailer(self) -> int:
        """Where the trailer starts in the buffer."""
        return self._base + self._capacity

    @property
    def capacity(self) -> int:
        """Bytes available for records (a power of two)."""
        return self._capacity

    @property
    def max_msg_length(self) -> int:
        """Largest payload a record may carry, in bytes: capacity / 8."""
        return self._max_msg_length

    def _payload_length(self, msg_type: int, payload: bytes | bytearray | memoryview) -> int:
        """The length of a payload to write as a ``msg_type`` record; ValueError for
        ``msg_type < 1`` or a payload over :attr:`max_msg_length`."""
        if msg_type < 1:
            raise ValueError(f"message type {msg_type} must be >= 1")
        length = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
        if length > self._max_msg_length:
            raise ValueError(
                f"message of {length} bytes exceeds max_msg_length {self._max_msg_length}")
        return length
