"""Unblocking a log whose writer died mid-append (Aeron's TermUnblocker).

A concurrent writer reserves space with fetch-add, writes the header with a negative length,
then the payload, then the positive length. If it dies in between, readers stop at its frame
forever. The driver, after the unblock timeout, turns that frame into padding:

* a negative length: the frame was claimed; it becomes a PAD of that length;
* a zero length: the writer died before writing the header; scan forward in 32-byte steps to
  the next non-zero frame (or the term end) and pad the gap.

The driver cannot tell a dead writer from one only descheduled past the timeout, which goes on
later. Aeron's writers store their header and commit over the padding and lose the message
silently; here a writer learns that its reservation was padded over, and is never told a
message was accepted that no reader will see (shmbus/shm/native/term_appender.c):

* the unblocker takes a length word only with a compare-and-set (negative length, or zero, to
  ``_TAKEN``), then writes the PAD type, then the padding's length with release;
* a writer puts its header in with a compare-and-set from zero (length and type in one 8-byte
  word) and commits with a compare-and-set from its negative length, so exactly one of the two
  wins each word. A writer whose header or commit loses stops: ``offer``/``publish`` get
  ADMIN_ACTION (publish tries again: a new reservation, so the message is appended once; the
  padded copy is never read), ``offer_many`` the number appended before the padding (or
  ADMIN_ACTION), ``try_claim`` fails with ADMIN_ACTION, and ``BufferClaim.commit`` raises
  ValueError (nothing published). A writer whose commit lost pads the rest of its own
  reservation, if any (the later fragments or batch messages it never wrote).
* a zero gap is the stalled writer's reservation and possibly those of writers behind it whose
  headers were not written either: the gap is taken slot by slot (every 32-byte slot a header
  could start at, from its start, each compare-and-set from zero to ``_TAKEN``). A writer that
  puts its header into a slot first keeps its frame: the padding stops there. Any writer whose
  header would go to a slot taken finds it non-zero and learns, as above. The slots inside the
  gap are then left as padding to its end, so the gap reads as padding from any of them.
"""

from __future__ import annotations

import numpy as np

from shmbus.shm.log_buffer import (
    FRAME_ALIGNMENT,
    HDR_TYPE_PAD,
    PARTITION_COUNT,
    UNFRAGMENTED,
    LogBuffer,
)

_TYPE_FIELD = 4  # the int32 at +4 holds version (u8), flags (u8) and type (u16)
_PAD_TYPE_WORD = (HDR_TYPE_PAD << 16) | (UNFRAGMENTED << 8)
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
        if length == _TAKEN:  # never left so (the unblocker finishes what it takes)
            return False
        return _pad(log, frame, length, -length)
    if length > 0:
        return False
    term_end = term_length
    limit = min(term_end, offset + (producer_position - blocked_position))
    scan = offset + FRAME_ALIGNMENT
    while scan < limit and buffer.get_int32_acquire(term_start + scan) == 0:
        scan += FRAME_ALIGNMENT
    if scan >= limit and limit != term_end:
        return False  # no frame behind the gap yet: its writers may all be on their way
    # Take the gap from its start, slot by slot: a writer that got its header into a slot
    # first (a slow one, not dead) keeps its frame, and the padding stops there.
    end = offset
    while end < scan and buffer.compare_and_set_int32(term_start + end, 0, _TAKEN):
        end += FRAME_ALIGNMENT
    if end == offset:
        return False  # the stalled writer wrote its header just now
    if end > offset + FRAME_ALIGNMENT:  # the inner slots: padding to the end of the gap
        slots = np.zeros(((end - offset) // FRAME_ALIGNMENT - 1, FRAME_ALIGNMENT // 4), np.int32)
        slots[:, 0] = np.arange(end - offset - FRAME_ALIGNMENT, 0, -FRAME_ALIGNMENT)
        slots[:, 1] = _PAD_TYPE_WORD
        buffer.put_bytes(frame + FRAME_ALIGNMENT, slots.tobytes())
    _write_pad(log, frame, end - offset)
    return True


def _pad(log: LogBuffer, frame: int, expected_length: int, pad_length: int) -> bool:
    # Take the frame first (a reader still sees a negative length and waits), so that a writer
    # that commits just now wins and nothing is padded, and one that commits later fails.
    if not log.buffer.compare_and_set_int32(frame, expected_length, _TAKEN):
        return False
    _write_pad(log, frame, pad_length)
    return True


def _write_pad(log: LogBuffer, frame: int, pad_length: int) -> None:
    """The PAD header of a frame this unblocker took: its type, then its length with release."""
    log.buffer.put_int32(frame + _TYPE_FIELD, _PAD_TYPE_WORD)
    log.buffer.put_int32_release(frame, pad_length)
