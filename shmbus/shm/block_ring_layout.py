"""The block ring's file, as every process that maps it sees it, and the reference frames that
point into it (see :mod:`shmbus.shm.block_ring` for the rules its writers, readers and driver
follow).

Layout: a header page, then ``capacity`` bytes of ring. Positions in the ring are monotonic
byte counts (``% capacity`` gives the place); every block starts on a page and spans whole
pages: a 64-byte block header (its span, state, the stream position after its reference frame,
the payload length, the writer's pid) then the payload. The position after the reference frame
is written when the writer has claimed the frame, before it commits it (0 until then): a reader
compares it with the position after the frame it reads, so a block is read only through the
frame made for it. A block that would not fit before the
end of the ring is preceded by a free padding block up to the end.

A reference frame is a whole-message log frame with ``LARGE_FLAG`` whose payload names a block
(:func:`encode_reference`): its ring position and payload length.

Every field another process writes is read and written through :class:`AtomicBuffer`; who
writes each header field is said where it is defined (the reserve tail, the warm limit and
the allocated mark only under the reserve lock, the free head and the warm generation only
by the driver). The underscored names are for the ring (shmbus/shm/block_ring.py) only.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from shmbus.shm._native import AtomicBuffer

PAGE = mmap.PAGESIZE
HEADER_PAGE = 4096
BLOCK_HEADER = 64
MAGIC = 0x314B4C4253424D53  # "SMBSBLK1"

# ring header fields (each on its own cache line)
_MAGIC, _CAPACITY, _MAX_MESSAGE = 0, 8, 16
_LOCK, _TAIL, _HEAD = 64, 128, 192
#: ring bytes from 0 known allocated (at most the warm limit): writers skip fallocate there.
#: Written under the reserve lock only: writers raise it as they allocate from it, the driver
#: lowers it before it gives pages below it back
_WARM_ALLOCATED = 256
#: 1 while a writer found no room (readers then wake the driver as they move); the driver
#: clears it when it frees
_WRITER_WAITING = 320
#: the size of the warm beginning (0: not measured yet). Written under the reserve lock only:
#: writers set it from warm_bound where the ring grows (never below two of the longest block
#: reserved, nor below the pages known allocated), the driver sets it back to 0 when it gives
#: warm pages back (idle, or another file of the bus needs the room)
_WARM_LIMIT = 384
#: how many times the driver gave warm pages back (writers' populated marks are stale then)
_WARM_GENERATION = 448
#: a wake-up word (int32) the driver bumps after freeing blocks while a writer was waiting:
#: a writer back-pressured by the ring sleeps on it, so it goes on as soon as there is room
_ROOM_WAKE = 512
#: the longest block (its span) writers reserved in the ring: the warm limit is never set below
#: room for two of it. Writers raise it under the reserve lock
_LONGEST_SPAN = 576

# block header fields
_SPAN, _STATE, _RELEASE_POSITION, _LENGTH, _PID = 0, 8, 16, 24, 32
FILLING, COMMITTED, FREE = 1, 2, 3

#: the frame flags of a reference frame: a whole message (B, E) that refers to a block. On a
#: fragment (not both B and E) the large flag means nothing and is ignored, as unknown flags are
LARGE_FLAG = 0x01
REFERENCE_FLAGS = 0x80 | 0x40 | LARGE_FLAG

#: the reference frame's payload: magic, version, ring position of the block, payload length
_REFERENCE = struct.Struct("<4sHHqq")
REFERENCE_LENGTH = _REFERENCE.size
_REFERENCE_MAGIC = b"SHBL"


class CorruptReferenceError(ValueError):
    """A large-message reference no writer of the ring made; the message names what is wrong.
    Readers drop its frame (poll and take alike) and raise this once."""


def encode_reference(ring_position: int, length: int) -> bytes:
    """The payload of the log frame that refers to a block."""
    return _REFERENCE.pack(_REFERENCE_MAGIC, 1, 0, ring_position, length)


def decode_reference(payload: bytes | memoryview) -> tuple[int, int]:
    """(ring position, payload length) of a reference frame's payload; CorruptReferenceError
    (a ValueError) if it is not one."""
    if len(payload) != REFERENCE_LENGTH:
        raise CorruptReferenceError(f"a large-message reference has {REFERENCE_LENGTH} bytes, "
                                    f"not {len(payload)}")
    magic, version, _, ring_position, length = _REFERENCE.unpack(payload)
    if magic != _REFERENCE_MAGIC or version != 1 or ring_position < 0 or length < 0:
        raise CorruptReferenceError(f"not a large-message reference: {bytes(payload)!r}")
    return ring_position, length


def ring_capacity(max_message_length: int) -> int:
    """Ring bytes for messages up to ``max_message_length``: room for two of the longest."""
    return 2 * _span(max_message_length)


def _span(length: int) -> int:
    """The ring bytes a block of ``length`` payload bytes spans: its header and payload, in
    whole pages."""
    return -(-(BLOCK_HEADER + length) // PAGE) * PAGE


@dataclass(frozen=True)
class RingUsage:
    """What a block ring's header says of its memory (monitoring: ``shmbus streams``)."""

    #: ring bytes held by blocks not yet freed
    in_use: int = 0
    #: the size of its warm beginning now (0: not measured yet, no block placed since the
    #: driver last gave its warm pages back)
    warm_bound: int = 0
    #: ring bytes from its start known allocated and kept for reuse
    warm_bytes: int = 0


def ring_usage(path: str | os.PathLike[str]) -> RingUsage:
    """The usage of a ring, read through a private read-only map of the header; all 0 for a
    ring never used or gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return RingUsage()
    try:
        if os.fstat(fd).st_blocks == 0:
            return RingUsage()  # never used: its header is a hole (looking would allocate it)
        mapping = mmap.mmap(fd, HEADER_PAGE, access=mmap.ACCESS_COPY)
    except OSError:
        return RingUsage()
    finally:
        os.close(fd)
    header = AtomicBuffer(mapping)
    try:
        if header.get_int64_acquire(_MAGIC) != MAGIC:
            return RingUsage()
        head = header.get_int64_acquire(_HEAD)
        return RingUsage(max(0, header.get_int64_acquire(_TAIL) - head),
                         header.get_int64_acquire(_WARM_LIMIT),
                         header.get_int64_acquire(_WARM_ALLOCATED))
    finally:
        header.release()
        mapping.close()


def ring_path(log_path: str | os.PathLike[str]) -> Path:
    """The block ring file beside a publication's log file."""
    return Path(log_path).with_suffix(".blocks")
