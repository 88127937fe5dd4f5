"""Unblocking a log whose writer died mid-append (Aeron's TermUnblocker).

A concurrent writer reserves space with fetch-add, writes the header with a negative length,
then the payload, then the positive length. If it dies in between, readers stop at its frame
forever. The driver, after the unblock timeout, turns that frame into padding:

* a negative length: the frame was claimed; it becomes a PAD of that length;
* a zero length: the writer died before writing the header; scan forward in 32-byte steps to
  the next non-zero frame (or the term end) and pad the gap, after checking it is still zero.

Compare-and-set on the length word keeps a writer that was merely slow from being overwritten.
"""

from __future__ import annotations

from shmbus.shm.log_buffer import (
    FRAME_ALIGNMENT,
    HDR_TYPE_PAD,
    PARTITION_COUNT,
    UNFRAGMENTED,
    LogBuffer,
)

_TYPE_FIELD = 4  # the int32 at +4 holds version (u8), flags (u8) and type (u16)
_TAKEN = -(2**31)


def unblock(log: LogBuffer, blocked_position: int, producer_position: int) -> bool:
    """Pad over the blocked frame at ``blocked_position``; True if something was unblocked.

    ``producer_position`` bounds the zero-gap scan. Only the driver may call this, and only
    after the consumers have not moved for the unblock timeout.
    """
    if producer_position <= blocked_position:
        return False
    term_length = log.term_length
    buffer = log.buffer
    index = (blocked_position // term_length) % PARTITION_COUNT
    term_start = index * term_length
    offset = blocked_position % term_length
    frame = term_start + offset
    length = buffer.get_int32_acquire(frame)
    if length < 0:
        return _pad(log, frame, length, -length)
    if length > 0:
        return False
    term_end = term_length
    limit = min(term_end, offset + (producer_position - blocked_position))
    scan = offset + FRAME_ALIGNMENT
    while scan < limit and buffer.get_int32_acquire(term_start + scan) == 0:
        scan += FRAME_ALIGNMENT
    if scan < limit or limit == term_end:
        gap = scan - offset
        # the gap must still be zero: a slow writer may have filled it meanwhile
        for probe in range(offset, scan, FRAME_ALIGNMENT):
            if buffer.get_int32_acquire(term_start + probe) != 0:
                return False
        return _pad(log, frame, 0, gap)
    return False


def _pad(log: LogBuffer, frame: int, expected_length: int, pad_length: int) -> bool:
    buffer = log.buffer
    # Take the frame first (a reader still sees a negative length and waits), so that a writer
    # that commits just now wins and nothing is padded; then write the PAD header, then its
    # length with release.
    if not buffer.compare_and_set_int32(frame, expected_length, _TAKEN):
        return False
    buffer.put_int32(frame + _TYPE_FIELD, (HDR_TYPE_PAD << 16) | (UNFRAGMENTED << 8))
    buffer.put_int32_release(frame, pad_length)
    return True
