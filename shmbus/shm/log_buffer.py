"""Log buffer files: three terms followed by a metadata section
(docs/protocol.md, Log buffer layout and Log buffer metadata).

Layout of a log file of term length T::

    0        T        2T       3T                     3T + 4096
    | term 0 | term 1 | term 2 | metadata (4096 bytes) |

Metadata fields, at offsets relative to the start of the metadata section: up to 508, Aeron's
``LogBufferDescriptor`` (``aeron_logbuffer_metadata_t``, Aeron 1.48 to 1.53), so Aeron's clients
map shmbus's logs; from 508, shmbus's own, which Aeron never reads. Each group that is written
concurrently sits on its own cache lines; the owner of each field is named.

    0    tail counter 0..2 (3 x i64)   publishers: term id << 32 | term offset
    24   active term count (i32)       publishers (rotation, compare-and-set)
    128  end-of-stream position (i64)  driver
    136  is connected (i32)            driver: 1 while a subscriber is linked
    140  active transport count (i32)  netbridge: receivers its sender hears
    256  registration id (i64)         set at creation, then read-only
    264  initial term id (i32)            "
    268  default frame header length     "  (32)
    272  mtu (i32)                         "
    276  term length (i32)                 "
    280  page size (i32)                   "
    284  publication window (i32)       driver, before the log is announced (0: unset)
    320  default frame header (32 bytes)   "
    508  layout version (i32)           set at creation, then read-only
    512  flow-control lock (i64)        whoever raises pub-lmt: its pid while it cleans/raises
    520  clean position (i64)           the lock holder: the log is zero from here on
    528  session id (i32)               set at creation, then read-only
    532  stream id (i32)                   "
    536  readers raise (i32)            driver: pub-lmt's counter id + 1 while a writer that
                                        does not raise its own limit (an Aeron client's
                                        publication) writes the log; its readers raise it
    576  data wake-up word (i32)        publishers bump it (futex) when readers sleep
    580  data waiters (i32)             readers asleep on the data word
    640  progress wake-up word (i32)    readers and the limit's raiser bump it when writers sleep
    644  progress waiters (i32)         publishers asleep at their limit
    704  counted-set version (i32)      driver: seqlock, odd while the set is written
    708  counted-set size (i32)         driver: position counters that hold the limit back
    712  window (i32)                   driver: pub-lmt = slowest counted position + window
    716  clean lag (i32)                driver: bytes left uncleaned behind the slowest
    1024 counted counter ids (768 x i32)  driver

Only the native module (through :class:`AtomicBuffer`) reads or writes the concurrently
written fields; the creation-time fields are written before the file is shared. The native
sources have their own copy of these offsets (shmbus/shm/native/shmbus_native.h), exported as
``_native.LAYOUT``; tests/shmbus/shm/test_log_buffer.py checks that the two agree.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from shmbus.shm._native import AtomicBuffer, wake_sleepers

PARTITION_COUNT = 3
LOG_META_DATA_LENGTH = 4096
HEADER_LENGTH = 32
FRAME_ALIGNMENT = 32
TERM_MIN_LENGTH = 64 * 1024
TERM_MAX_LENGTH = 1024 * 1024 * 1024
PAGE_SIZE = 4096
MTU_DEFAULT = 1408
#: Default term length: 1 MiB, so a stream's log is about 3 MiB and twenty streams fit in a
#: default Docker /dev/shm of 64 MiB.
TERM_LENGTH_DEFAULT = 1024 * 1024
#: Default term length of udp publications: 4 MiB (Aeron's: 16 MiB); see Context.udp_term_length.
UDP_TERM_LENGTH_DEFAULT = 4 * 1024 * 1024
LAYOUT_VERSION = 2

TAIL_COUNTERS_OFFSET = 0
ACTIVE_TERM_COUNT_OFFSET = 24
END_OF_STREAM_POSITION_OFFSET = 128
IS_CONNECTED_OFFSET = 136
ACTIVE_TRANSPORT_COUNT_OFFSET = 140
REGISTRATION_ID_OFFSET = 256
INITIAL_TERM_ID_OFFSET = 264
DEFAULT_FRAME_HEADER_LENGTH_OFFSET = 268
MTU_OFFSET = 272
TERM_LENGTH_OFFSET = 276
PAGE_SIZE_OFFSET = 280
PUBLICATION_WINDOW_OFFSET = 284
DEFAULT_FRAME_HEADER_OFFSET = 320
LAYOUT_VERSION_OFFSET = 508
FC_LOCK_OFFSET = 512
FC_CLEAN_POSITION_OFFSET = 520
READERS_RAISE_OFFSET = 536
SESSION_ID_OFFSET = 528
STREAM_ID_OFFSET = 532
DATA_WAKE_OFFSET = 576
DATA_WAITERS_OFFSET = 580
PROGRESS_WAKE_OFFSET = 640
PROGRESS_WAITERS_OFFSET = 644
FC_VERSION_OFFSET = 704
FC_COUNT_OFFSET = 708
FC_WINDOW_OFFSET = 712
FC_CLEAN_LAG_OFFSET = 716
FC_COUNTER_IDS_OFFSET = 1024
FC_MAX_COUNTED = 768

HDR_TYPE_PAD = 0
HDR_TYPE_DATA = 1
BEGIN_FLAG = 0x80
END_FLAG = 0x40
END_OF_STREAM_FLAG = 0x20
UNFRAGMENTED = BEGIN_FLAG | END_FLAG

_DATA_HEADER = struct.Struct("<iBBHiiiiq")
_INT64_MAX = (1 << 63) - 1


class LogBufferError(ValueError):
    """A log file that cannot be used: its message names the field that is wrong."""


def check_term_length(term_length: int) -> None:
    """Raise LogBufferError unless term_length is a power of two in 64 KiB..1 GiB."""
    if not isinstance(term_length, int) or not (
        TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH
        and term_length & (term_length - 1) == 0
    ):
        raise LogBufferError(
            f"term length {term_length!r} must be a power of two from 64 KiB to 1 GiB"
        )


def check_mtu(mtu: int, term_length: int) -> None:
    """Raise LogBufferError unless mtu is a multiple of 32 in 64..min(65504, term length / 8)."""
    if not isinstance(mtu, int) or mtu % FRAME_ALIGNMENT or not 64 <= mtu <= 65504:
        raise LogBufferError(f"mtu {mtu!r} must be a multiple of 32 from 64 to 65504")
    if mtu > term_length // 8:
        raise LogBufferError(f"mtu {mtu} exceeds term length / 8 ({term_length // 8})")


def log_length(term_length: int) -> int:
    """Bytes in a log file of this term length."""
    return term_length * PARTITION_COUNT + LOG_META_DATA_LENGTH


def max_message_length(term_length: int) -> int:
    """The largest message a log of this term length takes: min(term length / 8, 16 MiB)."""
    return min(term_length // 8, 16 * 1024 * 1024)


def align(value: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round value up to a multiple of alignment (a power of two)."""
    return (value + alignment - 1) & -alignment


def compute_position(term_id: int, term_offset: int, term_length: int, initial_term_id: int) -> int:
    """Stream position of (term_id, term_offset): Aeron's formula, correct across the int32 wrap."""
    term_count = ((term_id - initial_term_id + 2**31) % 2**32) - 2**31
    return term_count * term_length + term_offset


def encode_data_header(
    frame_length: int,
    flags: int,
    frame_type: int,
    term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
    reserved_value: int = 0,
) -> bytes:
    """The 32-byte DATA/PAD frame header, little-endian, as on the wire (docs/protocol.md, Frame
    header)."""
    return _DATA_HEADER.pack(
        frame_length, 0, flags, frame_type, term_offset, session_id, stream_id, term_id,
        reserved_value,
    )


@dataclass(frozen=True)
class LogDescriptor:
    """The creation-time fields of a log buffer."""

    term_length: int
    initial_term_id: int
    mtu: int
    session_id: int
    stream_id: int
    registration_id: int


class LogBuffer:
    """A mapped log file. Create with :meth:`create`, map an existing one with :meth:`open`.

    ``buffer`` is the :class:`AtomicBuffer` over the whole file; ``close()`` unmaps it (any
    publication or image built over it must be closed first).
    """

    def __init__(self, path: Path, mapping: mmap.mmap, descriptor: LogDescriptor) -> None:
        self.path = path
        self._mmap = mapping
        self.descriptor = descriptor
        self.buffer = AtomicBuffer(mapping)
        self.term_length = descriptor.term_length
        self.meta_offset = descriptor.term_length * PARTITION_COUNT

    # -- creation and opening ---------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        term_length: int = TERM_LENGTH_DEFAULT,
        initial_term_id: int = 0,
        mtu: int = MTU_DEFAULT,
        session_id: int = 0,
        stream_id: int = 0,
        registration_id: int = 0,
    ) -> LogBuffer:
        """Create, size and initialise a new log file (mode 0600); raise if it exists.

        A failure (bad arguments, a full file system) leaves no file behind.
        """
        check_term_length(term_length)
        check_mtu(mtu, term_length)
        for name, value in (("initial_term_id", initial_term_id), ("session_id", session_id),
                            ("stream_id", stream_id)):
            if not -(2**31) <= value < 2**31:
                raise LogBufferError(f"{name} {value} is not a 32-bit signed integer")
        path = Path(path)
        length = log_length(term_length)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, length)
            except OSError as e:
                free = _free_bytes(path.parent)
                raise OSError(
                    e.errno,
                    f"cannot create log {path}: {length} bytes needed, {free} bytes free on "
                    f"{path.parent} ({e.strerror})",
                ) from e
            mapping = mmap.mmap(fd, length)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        descriptor = LogDescriptor(term_length, initial_term_id, mtu, session_id, stream_id,
                                   registration_id)
        log = cls(path, mapping, descriptor)
        log._initialise()
        return log

    def _initialise(self) -> None:
        d = self.descriptor
        b, m = self.buffer, self.meta_offset
        b.put_int64(m + REGISTRATION_ID_OFFSET, d.registration_id)
        b.put_int32(m + INITIAL_TERM_ID_OFFSET, d.initial_term_id)
        b.put_int32(m + DEFAULT_FRAME_HEADER_LENGTH_OFFSET, HEADER_LENGTH)
        b.put_int32(m + MTU_OFFSET, d.mtu)
        b.put_int32(m + TERM_LENGTH_OFFSET, d.term_length)
        b.put_int32(m + PAGE_SIZE_OFFSET, PAGE_SIZE)
        b.put_int32(m + SESSION_ID_OFFSET, d.session_id)
        b.put_int32(m + STREAM_ID_OFFSET, d.stream_id)
        b.put_bytes(
            m + DEFAULT_FRAME_HEADER_OFFSET,
            encode_data_header(0, UNFRAGMENTED, HDR_TYPE_DATA, 0, d.session_id, d.stream_id,
                               d.initial_term_id),
        )
        b.put_int64_release(m + END_OF_STREAM_POSITION_OFFSET, _INT64_MAX)
        # Term 0 starts at the initial term id; terms 1 and 2 hold the ids that precede it, so
        # the first rotations find the term id they expect (Aeron's initialiseTailWithTermId).
        for index in range(PARTITION_COUNT):
            term_id = d.initial_term_id if index == 0 else d.initial_term_id + index - 3
            term_id = ((term_id + 2**31) % 2**32) - 2**31
            b.put_int64_release(m + TAIL_COUNTERS_OFFSET + 8 * index, _pack_tail(term_id, 0))
        b.put_int32_release(m + ACTIVE_TERM_COUNT_OFFSET, 0)
        # written last: a reader that sees the version sees the rest
        b.put_int32_release(m + LAYOUT_VERSION_OFFSET, LAYOUT_VERSION)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LogBuffer:
        """Map an existing log file, checking its size, term length and layout version."""
        path = Path(path)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < LOG_META_DATA_LENGTH + 3 * TERM_MIN_LENGTH:
                raise LogBufferError(f"log {path}: size {size} is too small for a log buffer")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        try:
            meta = size - LOG_META_DATA_LENGTH
            fields = struct.unpack_from("<qiiiii", mapping, meta + REGISTRATION_ID_OFFSET)
            registration_id, initial_term_id, _hdr_len, mtu, term_length, _page = fields
            (version,) = struct.unpack_from("<i", mapping, meta + LAYOUT_VERSION_OFFSET)
            session_id, stream_id = struct.unpack_from("<ii", mapping, meta + SESSION_ID_OFFSET)
            if version != LAYOUT_VERSION:
                raise LogBufferError(
                    f"log {path}: layout version {version}, this shmbus reads {LAYOUT_VERSION}"
                )
            try:
                check_term_length(term_length)
            except LogBufferError as e:
                raise LogBufferError(f"log {path}: {e}") from None
            if size != log_length(term_length):
                raise LogBufferError(
                    f"log {path}: size {size} does not match term length {term_length} "
                    f"(expected {log_length(term_length)})"
                )
            try:
                check_mtu(mtu, term_length)
            except LogBufferError as e:
                raise LogBufferError(f"log {path}: {e}") from None
        except BaseException:
            mapping.close()
            raise
        descriptor = LogDescriptor(term_length, initial_term_id, mtu, session_id, stream_id,
                                   registration_id)
        return cls(path, mapping, descriptor)

    # -- concurrently written fields (through the AtomicBuffer) -------------------------------

    def raw_tail(self, index: int) -> int:
        """The tail counter of term ``index`` (0..2): term id << 32 | term offset."""
        return self.buffer.get_int64_acquire(self.meta_offset + TAIL_COUNTERS_OFFSET + 8 * index)

    def active_term_count(self) -> int:
        """How many times the log has rotated."""
        return self.buffer.get_int32_acquire(self.meta_offset + ACTIVE_TERM_COUNT_OFFSET)

    def producer_position(self) -> int:
        """The position of the tail of the active term (space claimed, maybe not committed)."""
        count = self.active_term_count()
        raw = self.raw_tail(count % PARTITION_COUNT)
        term_id = ((raw >> 32) + 2**31) % 2**32 - 2**31
        offset = min(raw & 0xFFFFFFFF, self.term_length)
        return compute_position(term_id, offset, self.term_length, self.descriptor.initial_term_id)

    @property
    def is_connected(self) -> bool:
        """Whether a subscriber is connected (the driver sets it; publishers report it)."""
        return self.buffer.get_int32_acquire(self.meta_offset + IS_CONNECTED_OFFSET) == 1

    @is_connected.setter
    def is_connected(self, value: bool) -> None:
        offset = self.meta_offset + IS_CONNECTED_OFFSET
        self.buffer.put_int32_release(offset, 1 if value else 0)
        # requesters sleep on this word while it is 1 (a call's wait ends when the last
        # responder leaves, see Requester): its writer always wakes them
        wake_sleepers(self.buffer, offset)

    @property
    def publication_window(self) -> int:
        """The window the driver holds the publisher to (0 until the driver sets it)."""
        return self.buffer.get_int32(self.meta_offset + PUBLICATION_WINDOW_OFFSET)

    @publication_window.setter
    def publication_window(self, window: int) -> None:
        self.buffer.put_int32_release(self.meta_offset + PUBLICATION_WINDOW_OFFSET, window)

    def raised_by_readers(self, limit_counter_id: int) -> None:
        """The driver's: the limit (counter ``limit_counter_id``) of this log is raised by its
        readers too, as they store their positions, because one of its writers does not raise
        it (an Aeron client's publication only reads it)."""
        self.buffer.put_int32_release(self.meta_offset + READERS_RAISE_OFFSET,
                                      limit_counter_id + 1)

    @property
    def active_transport_count(self) -> int:
        """Receivers a network publication's sender hears (written by the netbridge)."""
        return self.buffer.get_int32_acquire(self.meta_offset + ACTIVE_TRANSPORT_COUNT_OFFSET)

    @active_transport_count.setter
    def active_transport_count(self, count: int) -> None:
        self.buffer.put_int32_release(self.meta_offset + ACTIVE_TRANSPORT_COUNT_OFFSET, count)

    @property
    def end_of_stream_position(self) -> int:
        """Where the publisher ended the stream (bytes); the largest int64 until it does."""
        return self.buffer.get_int64_acquire(self.meta_offset + END_OF_STREAM_POSITION_OFFSET)

    @end_of_stream_position.setter
    def end_of_stream_position(self, position: int) -> None:
        self.buffer.put_int64_release(self.meta_offset + END_OF_STREAM_POSITION_OFFSET, position)

    def metadata_view(self) -> memoryview:
        """A memoryview of the metadata section; while one is held, close() leaves the mapping
        in place (it goes with the last view)."""
        return memoryview(self._mmap)[self.meta_offset:]

    def term_view(self, index: int) -> memoryview:
        """A memoryview of term ``index``; valid until close()."""
        start = index * self.term_length
        return memoryview(self._mmap)[start:start + self.term_length]

    def close(self) -> None:
        """Unmap the file. Idempotent."""
        if self._mmap.closed:
            return
        self.buffer.release()
        try:
            self._mmap.close()
        except BufferError:
            # a view is still exported (for example a FragmentBatch the caller kept); the
            # mapping goes away with the last reference instead
            pass

    def __enter__(self) -> LogBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pack_tail(term_id: int, offset: int) -> int:
    raw = ((term_id & 0xFFFFFFFF) << 32) | offset
    return raw - 2**64 if raw >= 2**63 else raw


def _free_bytes(directory: Path) -> int:
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize
