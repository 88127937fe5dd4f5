"""The log as history: where a subscriber that asks for a ``join-position`` starts reading an
IPC publication's log, and pinning that position against cleaning (docs/protocol.md, IPC flow
control).

A log keeps what lies between its clean position (everything before it was zeroed for reuse)
and its producer position. A subscriber may join anywhere in that range where a message (its
first frame) or padding starts, or at its end: not at a later fragment of a message, whose
rest the reader would drop.
Publishers clean the log themselves, natively, under the log's flow-control lock and only
from the counted set they read under its seqlock, so the driver pins a join in three steps:
set the new reader's counter, publish the counted set that includes it (a publisher's clean
computed from the old set aborts), then take the lock once to read the clean position as
every finished clean left it. If that passed the join, the data is gone: a strict join is
refused, an ``earliest`` join moves up to it.

Runs in the driver; pure rules over the mapped log, no I/O.
"""

from __future__ import annotations

import os
import time

from shmbus.shm.log_buffer import (
    BEGIN_FLAG,
    FC_CLEAN_POSITION_OFFSET,
    FC_LOCK_OFFSET,
    FRAME_ALIGNMENT,
    HDR_TYPE_PAD,
    HEADER_LENGTH,
    PARTITION_COUNT,
    LogBuffer,
)
from shmbus.shm.position import Position

#: ``join-position=earliest``: start at the oldest position the log still holds
EARLIEST = "earliest"
#: how long the driver waits for a publisher to finish a clean (microseconds of work)
_LOCK_WAIT_S = 0.5


class JoinPositionGone(Exception):
    """The requested position is not in the log (cleaned, or beyond its end); the message
    says which range the log holds."""


def clean_position(log: LogBuffer) -> int:
    """Where the log's cleaning has got to: bytes before it are zeroed."""
    return log.buffer.get_int64_acquire(log.meta_offset + FC_CLEAN_POSITION_OFFSET)


def retained_range(log: LogBuffer) -> tuple[int, int]:
    """(earliest, end): the positions a new reader may start at, both frame boundaries."""
    producer = log.producer_position()
    # the three partitions hold at most three terms; the clean position is the binding bound
    floor = producer - (PARTITION_COUNT - 1) * log.term_length - (producer % log.term_length)
    return min(max(clean_position(log), floor, 0), producer), producer


def check_join(log: LogBuffer, position: int) -> int:
    """Return ``position`` if a reader may start there now: within the retained range and at
    the start of a message's first frame or of padding (its header names this very position,
    session and stream), or at the end.

    Raises JoinPositionGone otherwise, naming the range the log holds.
    """
    earliest, end = retained_range(log)
    d = log.descriptor
    where = (f"session {d.session_id} stream {d.stream_id} holds positions {earliest} to "
             f"{end}")
    if position < earliest:
        raise JoinPositionGone(f"join-position {position} is gone: {where} (recorded history "
                               f"is the way further back)")
    if position > end:
        raise JoinPositionGone(f"join-position {position} is past the end of the stream: "
                               f"{where}")
    if position % FRAME_ALIGNMENT:
        raise JoinPositionGone(f"join-position {position} is not a frame boundary (a multiple "
                               f"of {FRAME_ALIGNMENT}); {where}")
    if position < end and not _message_starts_at(log, position):
        clean = settled_clean_position(log)
        if clean > position:  # a clean was zeroing it as we looked
            raise _cleaned_while_joining(log, position, clean)
        if _frame_starts_at(log, position):
            raise JoinPositionGone(f"join-position {position} is inside a message (a later "
                                   f"fragment of one that starts before it); {where}")
        raise JoinPositionGone(f"join-position {position} is not the start of a frame of "
                               f"the stream; {where}")
    return position


def _cleaned_while_joining(log: LogBuffer, position: int, clean: int) -> JoinPositionGone:
    d = log.descriptor
    return JoinPositionGone(f"join-position {position} is gone (cleaned while joining): session "
                            f"{d.session_id} stream {d.stream_id} holds positions {clean} to "
                            f"{log.producer_position()}")


def _message_starts_at(log: LogBuffer, position: int) -> bool:
    """A frame starts at ``position`` and it is a message's first (flag B) or padding."""
    if not _frame_starts_at(log, position):
        return False
    term_length = log.term_length
    offset = (position // term_length) % PARTITION_COUNT * term_length + position % term_length
    word = log.buffer.get_int32(offset + 4)  # version, flags, type (u16)
    return bool(word >> 8 & BEGIN_FLAG) or (word >> 16 & 0xFFFF) == HDR_TYPE_PAD


def _frame_starts_at(log: LogBuffer, position: int) -> bool:
    term_length = log.term_length
    index = (position // term_length) % PARTITION_COUNT
    offset = index * term_length + position % term_length
    buffer = log.buffer
    frame_length = buffer.get_int32_acquire(offset)
    d = log.descriptor
    term_id = ((d.initial_term_id + position // term_length + 2**31) % 2**32) - 2**31
    return (frame_length >= HEADER_LENGTH
            and buffer.get_int32(offset + 8) == position % term_length
            and buffer.get_int32(offset + 12) == d.session_id
            and buffer.get_int32(offset + 16) == d.stream_id
            and buffer.get_int32(offset + 20) == term_id)


def settled_clean_position(log: LogBuffer) -> int:
    """The clean position once no clean is under way: reads it holding the flow-control lock
    (or, when a holder keeps it longer than a clean takes, as it stands)."""
    buffer, offset = log.buffer, log.meta_offset + FC_LOCK_OFFSET
    pid = os.getpid()
    deadline = time.monotonic() + _LOCK_WAIT_S
    while not buffer.compare_and_set_int64(offset, 0, pid):
        if time.monotonic() > deadline:  # a dead holder: the driver's timer frees it
            return clean_position(log)
        time.sleep(0)
    try:
        return clean_position(log)
    finally:
        buffer.put_int64_release(offset, 0)


def pin_join(log: LogBuffer, counter: Position, join: int, strict: bool) -> int:
    """After ``counter`` (set to ``join``) joined the log's counted set: make sure no clean
    passed it meanwhile. Returns the join (an ``earliest`` join moved up to the clean
    position); raises JoinPositionGone for a strict join whose data was cleaned."""
    clean = settled_clean_position(log)
    if clean <= join:
        return join
    if strict:
        raise _cleaned_while_joining(log, join, clean)
    counter.set(clean)
    return clean
