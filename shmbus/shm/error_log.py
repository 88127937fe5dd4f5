"""The distinct error log in shared memory: the last section of cnc.dat.

Modelled on Agrona's ``DistinctErrorLog`` / ``ErrorLogReader``. The driver records each distinct
error once and afterwards only counts it and moves its last-seen time, so an error that repeats
in a tight loop costs no space. The log survives the driver: ``shmbus errors`` reads it from
another process, during the run or after a crash.

Records are appended from offset 0, each 8-byte aligned::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+  0
    |  length (i32, header included; written last, release)         |
    +---------------------------------------------------------------+  4
    |  observation count (i32, atomic add)                          |
    +---------------------------------------------------------------+  8
    |  last observation timestamp (i64, ms since epoch, release)    |
    |                                                               |
    +---------------------------------------------------------------+  16
    |  first observation timestamp (i64, ms since epoch)            |
    |                                                               |
    +---------------------------------------------------------------+  24
    |  error text (utf-8: "type: message", then the stack)       ...|
    +---------------------------------------------------------------+

A record's text, count 1 and timestamps are written before its length is release-stored, so a
reader that acquire-loads a non-zero length sees a complete record. The first record with
length 0 ends the log.

Failure semantics: when the next distinct error does not fit, :meth:`DistinctErrorLog.record`
returns False and the error is not logged (repeats of errors already in the log are still
counted). Nothing here raises for a full log.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shmbus.shm._native import AtomicBuffer, epoch_ms

LENGTH_OFFSET = 0
OBSERVATION_COUNT_OFFSET = 4
LAST_OBSERVATION_TIMESTAMP_OFFSET = 8
FIRST_OBSERVATION_TIMESTAMP_OFFSET = 16
ENCODED_ERROR_OFFSET = 24
RECORD_ALIGNMENT = 8


def _align(value: int) -> int:
    return (value + RECORD_ALIGNMENT - 1) & ~(RECORD_ALIGNMENT - 1)


def _records(buffer: AtomicBuffer) -> Iterator[tuple[int, int]]:
    """(offset, length) of each complete record in log order, up to the first length that
    does not frame a record (0: the end of the log)."""
    capacity = buffer.capacity
    offset = 0
    while offset + ENCODED_ERROR_OFFSET <= capacity:
        length = buffer.get_int32_acquire(offset + LENGTH_OFFSET)
        if length < ENCODED_ERROR_OFFSET or offset + length > capacity:
            return
        yield offset, length
        offset += _align(length)


def _text(buffer: AtomicBuffer, offset: int, length: int) -> str:
    """The error text of the record at ``offset``."""
    return buffer.get_bytes(offset + ENCODED_ERROR_OFFSET,
                            length - ENCODED_ERROR_OFFSET).decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class ErrorObservation:
    """One distinct error as read from the log."""

    observation_count: int
    first_observation_ms: int
    last_observation_ms: int
    text: str


def error_text(error: BaseException | str) -> str:
    """The text an error is logged (and told apart) by: ``type: message`` plus its stack."""
    if isinstance(error, str):
        return error
    head = f"{type(error).__qualname__}: {error}"
    if error.__traceback__ is None:
        return head
    stack = "".join(traceback.format_tb(error.__traceback__))
    return f"{head}\n{stack}".rstrip("\n")


class DistinctErrorLog:
    """Appends distinct errors to ``buffer``; one writing process only (the driver).

    Thread-safe within that process (a lock guards new records). ``clock`` returns ms since
    the Unix epoch. Built over a buffer that already holds records, it continues after them
    and counts repeats of them.
    """

    def __init__(self, buffer: AtomicBuffer,
                 clock: Callable[[], int] = epoch_ms) -> None:
        self.buffer = buffer
        self.clock = clock
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}
        self._next_offset = 0
        for offset, length in _records(buffer):
            self._offsets.setdefault(_text(buffer, offset, length), offset)
            self._next_offset = _align(offset + length)

    def record(self, error: BaseException | str) -> bool:
        """Log one observation of ``error``; False if it is new and the log has no room."""
        text = error_text(error)
        timestamp = self.clock()
        buffer = self.buffer
        with self._lock:
            offset = self._offsets.get(text)
            if offset is None:
                encoded = text.encode("utf-8", "replace")
                length = ENCODED_ERROR_OFFSET + len(encoded)
                offset = self._next_offset
                if offset + length > buffer.capacity:
                    return False
                buffer.put_bytes(offset + ENCODED_ERROR_OFFSET, encoded)
                buffer.put_int64(offset + FIRST_OBSERVATION_TIMESTAMP_OFFSET, timestamp)
                buffer.put_int64(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET, timestamp)
                buffer.put_int32(offset + OBSERVATION_COUNT_OFFSET, 1)
                buffer.put_int32_release(offset + LENGTH_OFFSET, length)
                self._offsets[text] = offset
                self._next_offset = _align(offset + length)
                return True
            buffer.get_and_add_int32(offset + OBSERVATION_COUNT_OFFSET, 1)
            buffer.put_int64_release(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET, timestamp)
            return True

    @property
    def distinct_errors(self) -> int:
        """How many distinct errors the log holds."""
        return len(self._offsets)


def read_error_log(buffer: AtomicBuffer, since_ms: int = 0) -> list[ErrorObservation]:
    """Every error in the log last observed at or after ``since_ms``, oldest record first.

    Anyone may call it, from any process, while the driver writes or after it died; it never
    writes. A count or last timestamp may be one observation behind a concurrent ``record``.
    """
    observations = []
    for offset, length in _records(buffer):
        last = buffer.get_int64_acquire(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET)
        if last >= since_ms:
            observations.append(ErrorObservation(
                observation_count=buffer.get_int32_acquire(offset + OBSERVATION_COUNT_OFFSET),
                first_observation_ms=buffer.get_int64(offset + FIRST_OBSERVATION_TIMESTAMP_OFFSET),
                last_observation_ms=last,
                text=_text(buffer, offset, length),
            ))
    return observations
