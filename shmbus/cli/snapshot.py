"""One snapshot of a bus, read without disturbing it, with positions that agree.

:func:`read_snapshot` is what every look at a bus starts from (``shmbus stat``, ``streams``,
their ``--json``, ``shmbus export``): they compute their views from one :class:`BusSnapshot`,
so what they show agrees.

Where the positions come from
-----------------------------

* Most counters: a copy of cnc.dat's counters sections, taken with one ``memcpy`` each.
* A publication's positions are read again, live and in a fixed order, after that copy, from
  the counter values (acquire loads through :meth:`CncFile.load_view`) and from the metadata
  of its log file (acquire loads over a private, read-only-opened map of the file's metadata
  page). See :func:`read_publication` for the order and why it makes the positions agree.
* A network image's rcv-pos is read live too: the netbridge's rcv-pos counter is a mirror of
  its receiver's state, copied once per bridge cycle, while subscribers read each frame as it
  lands, so under load the counter trails them by hundreds of KiB. :func:`read_image` reads
  the subscribers, then scans the image's log for the contiguous data from there (the rebuild
  position: what a subscriber can read next is below it).
* **pub-pos is the log's tail**, not the pub-pos counter. The counter is the driver's sample
  of the tail, taken when the driver's duty cycle runs; since publishers raise their own
  limit the driver sleeps under load, and its sample can be megabytes old (a subscriber then
  looks ahead of its publisher). The tail is what the publisher itself writes with each claim,
  so it is as fresh as a read can be. It is read rather than kept current in a counter by the
  publisher: that would cost every offer a second store, and would still need a reader to
  order its loads, as here. The snapshot's pub-pos counter carries the tail too, so ``stat``
  shows the same pub-pos as ``streams``.

Nothing here writes to the bus directory: cnc.dat and the logs are opened ``O_RDONLY`` and
mapped private (``ACCESS_COPY``), so even a store through the maps could not reach the files.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shmbus.driver.ipc_flow_control import ipc_window
from shmbus.settings.errors import ShmbusError
from shmbus.shm._native import AtomicBuffer, epoch_ms
from shmbus.shm.block_ring import ring_usage
from shmbus.shm.cnc import (
    CNC_FILE,
    COUNTERS_METADATA,
    COUNTERS_VALUES,
    ERROR_LOG,
    CncCorruptError,
    CncError,
    CncFile,
    CncLayoutError,
)
from shmbus.shm.counters import (
    COUNTER_LENGTH,
    FC_RCV_POS,
    GROUP_CLAIM,
    GROUP_ORPHAN,
    GROUP_POS,
    PUB_LIMIT,
    PUB_POS,
    RCV_POS,
    SND_POS,
    SUB_POS,
    Counter,
    CountersReader,
)
from shmbus.shm.error_log import ErrorObservation, read_error_log
from shmbus.shm.log_buffer import (
    ACTIVE_TERM_COUNT_OFFSET,
    FC_COUNT_OFFSET,
    FC_COUNTER_IDS_OFFSET,
    FC_MAX_COUNTED,
    FC_VERSION_OFFSET,
    FC_WINDOW_OFFSET,
    FRAME_ALIGNMENT,
    INITIAL_TERM_ID_OFFSET,
    IS_CONNECTED_OFFSET,
    LOG_META_DATA_LENGTH,
    MTU_OFFSET,
    PARTITION_COUNT,
    PUBLICATION_WINDOW_OFFSET,
    REGISTRATION_ID_OFFSET,
    SESSION_ID_OFFSET,
    STREAM_ID_OFFSET,
    TAIL_COUNTERS_OFFSET,
    TERM_LENGTH_OFFSET,
    align,
    log_length,
)

LOGS_DIR = "logs"
#: Counters that read a publication's log: reference id = the log's registration id.
_READERS_BY_REFERENCE = frozenset({SUB_POS, GROUP_CLAIM})
#: Counters of a publication's log that move behind its readers (a group's claim and orphan
#: records, the sender and the receivers it hears): registration id = the log's.
_READERS_BY_REGISTRATION = frozenset({GROUP_POS, GROUP_ORPHAN, SND_POS, FC_RCV_POS})
#: Attempts at a consistent read of a log's counted set before giving up on it (the driver
#: writes it only when a subscriber comes, goes or rests, so one retry nearly always does).
_COUNTED_ATTEMPTS = 3
#: Where a frame header holds its term id (see shmbus.shm.log_buffer.encode_data_header).
_TERM_ID_IN_HEADER = 20


class BusNotFoundError(ShmbusError):
    """No bus to look at: no directory, no cnc.dat, or one that cannot be read."""

    def __init__(self, directory: Path, problem: str, *, hint: bool = True) -> None:
        self.directory = directory
        message = f"no bus at {directory}: {problem}"
        if hint:
            message += f"\nstart a driver with: shmbus driver --dir {directory}"
        super().__init__(message)


@dataclass(frozen=True)
class DriverInfo:
    """The cnc.dat header and the driver's heartbeat."""

    cnc_path: str
    layout_version: int
    pid: int
    start_time_ms: int
    heartbeat_ms: int
    client_liveness_timeout_ms: int


@dataclass(frozen=True)
class LogInfo:
    """What a log file says about itself (read from its metadata section)."""

    registration_id: int
    session_id: int
    stream_id: int
    term_length: int
    mtu: int
    is_connected: bool  # a subscriber (or, on the network, a receiver) is there
    #: the window flow control raises pub-lmt by (the log's flow-control window, else the
    #: publication window the driver announced, else term length / 2)
    window: int
    initial_term_id: int = 0
    path: str | None = None  # the file, to read its tail live
    #: shared memory its block ring holds for large messages (the file's allocated bytes)
    large_message_bytes: int = 0
    #: of which blocks not yet freed (not yet read by every counted subscriber)
    large_message_in_use: int = 0
    #: the bound of its warm beginning (the ring bytes it may keep for reuse; 0: not measured
    #: yet), and the bytes of it the ring keeps allocated
    large_message_warm_bound: int = 0
    large_message_warm_bytes: int = 0


@dataclass(frozen=True)
class LivePositions:
    """A publication's positions as :func:`read_publication` read them, in order.

    ``readers`` maps the counter id of each reader position (sub-pos, a group's records,
    snd-pos, fc-rcv-pos) to its value; ``counted`` holds the counter ids the log's flow
    control counts (None: the set was being rewritten on every attempt).
    """

    readers: Mapping[int, int]
    pub_pos: int
    pub_lmt: int
    counted: frozenset[int] | None


@dataclass(frozen=True)
class LiveImage:
    """A network image's positions as :func:`read_image` read them, in order: its
    subscribers' positions (by counter id), then ``rcv_pos``, the end of the contiguous data
    in its log."""

    readers: Mapping[int, int]
    rcv_pos: int


@dataclass(frozen=True)
class BusSnapshot:
    """Copies of what a bus holds at one moment; every view is computed from it.

    ``counters`` carry the live values of :attr:`live` (pub-pos: the log's tail) and of
    :attr:`live_images` (rcv-pos: the contiguous data); both have, by registration id, the
    logs that could be read.
    """

    directory: str
    time_ms: int
    monotonic_s: float
    driver: DriverInfo
    counters: tuple[Counter, ...]
    logs: Mapping[int, LogInfo] = field(default_factory=dict)
    errors: tuple[ErrorObservation, ...] = ()
    live: Mapping[int, LivePositions] = field(default_factory=dict)
    live_images: Mapping[int, LiveImage] = field(default_factory=dict)


# -- pure: positions from what was read ---------------------------------------------------------


def tail_position(term_count: int, raw_tail: int, term_length: int,
                  initial_term_id: int) -> int:
    """The position of a log's tail from the active term count and that term's raw tail
    (term id << 32 | term offset), as the native core computes it: the offset is capped at
    the term's end (a claim that trips the end goes past it), and a tail that does not yet
    hold the active term's id (a rotation half done) reads as that term's start."""
    begin = term_count * term_length
    term_id = ((raw_tail >> 32) + 2**31) % 2**32 - 2**31
    if ((term_id - initial_term_id + 2**31) % 2**32) - 2**31 != term_count:
        return begin
    return begin + min(raw_tail & 0xFFFFFFFF, term_length)


def reader_counters(counters: Iterable[Counter], registration_id: int) -> list[int]:
    """The ids of the counters that read (or send) the log ``registration_id``."""
    return [c.counter_id for c in counters
            if (c.type_id in _READERS_BY_REFERENCE and c.reference_id == registration_id)
            or (c.type_id in _READERS_BY_REGISTRATION and c.registration_id == registration_id)]


def with_live_values(counters: Iterable[Counter], live: Mapping[int, LivePositions],
                     live_images: Mapping[int, LiveImage] | None = None
                     ) -> tuple[Counter, ...]:
    """``counters`` with the live values put in: readers, pub-lmt, pub-pos (the tail) and
    rcv-pos (the contiguous data)."""
    images = live_images or {}
    readers: dict[int, int] = {}
    for p in live.values():
        readers.update(p.readers)
    for live_image in images.values():
        readers.update(live_image.readers)
    out = []
    for c in counters:
        positions = live.get(c.registration_id)
        image = images.get(c.registration_id)
        value = readers.get(c.counter_id, c.value)
        if positions is not None and c.type_id == PUB_POS:
            value = positions.pub_pos
        elif positions is not None and c.type_id == PUB_LIMIT:
            value = positions.pub_lmt
        elif image is not None and c.type_id == RCV_POS:
            value = image.rcv_pos
        out.append(c if value == c.value else dataclasses.replace(c, value=value))
    return tuple(out)


def contiguous_end(log: AtomicBuffer, start: int, term_length: int, initial_term_id: int,
                   limit: int) -> int:
    """Where the contiguous frames from ``start`` end in a log (at most ``limit``): the scan
    steps over every frame whose length is set (an acquire load, as a subscriber's) and whose
    header holds the term id its position expects (a frame left from three terms before does
    not), and stops at the first that is not. ``start`` must be a frame's start."""
    position = start
    while position < limit:
        offset = (position // term_length) % PARTITION_COUNT * term_length + position % term_length
        length = log.get_int32_acquire(offset)
        expected = (initial_term_id + position // term_length + 2**31) % 2**32 - 2**31
        if length <= 0 or log.get_int32(offset + _TERM_ID_IN_HEADER) != expected:
            break
        position += align(length, FRAME_ALIGNMENT)
    return position


# -- reading ------------------------------------------------------------------------------------


def read_counted(meta: AtomicBuffer) -> frozenset[int] | None:
    """The counter ids a log's flow control counts, read under the driver's seqlock (None
    if the driver was rewriting the set on every attempt).

    The loads are acquire loads, so the set's ids are read before the version is read again;
    an unchanged, even version means the set was not written meanwhile.
    """
    for _ in range(_COUNTED_ATTEMPTS):
        version = meta.get_int32_acquire(FC_VERSION_OFFSET)
        if version & 1:
            continue
        size = meta.get_int32_acquire(FC_COUNT_OFFSET)
        if not 0 <= size <= FC_MAX_COUNTED:
            return None
        ids = frozenset(meta.get_int32_acquire(FC_COUNTER_IDS_OFFSET + 4 * i)
                        for i in range(size))
        if meta.get_int32_acquire(FC_VERSION_OFFSET) == version:
            return ids
    return None


def read_publication(values: AtomicBuffer, meta: AtomicBuffer, limit_counter_id: int,
                     readers: Iterable[int], info: LogInfo) -> LivePositions:
    """Read one publication's positions in the order that makes them agree.

    ``values`` is the counter values section, ``meta`` the log's metadata section. The order:

    1. the counted set (which readers hold the publisher);
    2. every reader position (sub-pos, group records, snd-pos, fc-rcv-pos);
    3. the tail (active term count, then that term's raw tail) = pub-pos;
    4. pub-lmt.

    Every load is an acquire load, so none of them is done before the one above it.

    **lag >= 0.** A reader stores its position (release) only after it read the frames below
    it (acquire on each frame's length), which their publisher stored (release) after it
    claimed them by moving the tail (an atomic add, or the exclusive publisher's release
    store, before the frame is written). So the tail's move past a reader position happens
    before that position can be loaded in step 2, and the tail load in step 3, later in this
    thread, returns that tail or a later one (coherence): pub-pos >= every reader position.
    The same chain through the active term count (its release by the rotating publisher
    precedes any frame of the new term) makes step 3 find the term or a later one.

    **pub-pos vs pub-lmt.** A publisher claims only when its position is below the limit it
    loaded; that limit load precedes its tail move, which precedes the tail load of step 3,
    so step 4 returns that limit or a later one (pub-lmt only rises while anyone counts).
    Hence every claim *starts* below pub-lmt: pub-pos - pub-lmt is less than one claim (one
    message's frames; with concurrent publishers on one log, one claim each). A message may
    end past the limit, as in Aeron: a publisher at pub-pos >= pub-lmt is at its limit.
    Nothing is clamped. With nobody counted the driver pulls pub-lmt back below pub-pos (the
    publisher is not connected); that is not a disagreement.

    **free <= window.** The room left is measured against the readers of step 2: the
    publisher can write up to the slowest counted position + window before it is held (it
    raises pub-lmt itself up to there), and as that position is <= pub-pos, the room is at
    most the window.
    """
    counted = read_counted(meta)
    positions = {counter_id: values.get_int64_acquire(counter_id * COUNTER_LENGTH)
                 for counter_id in readers}
    term_count = meta.get_int32_acquire(ACTIVE_TERM_COUNT_OFFSET)
    raw_tail = meta.get_int64_acquire(TAIL_COUNTERS_OFFSET + 8 * (term_count % PARTITION_COUNT))
    pub_pos = tail_position(term_count, raw_tail, info.term_length, info.initial_term_id)
    pub_lmt = values.get_int64_acquire(limit_counter_id * COUNTER_LENGTH)
    return LivePositions(positions, pub_pos, pub_lmt, counted)


def read_image(values: AtomicBuffer, log: AtomicBuffer, rcv_pos_counter_id: int,
               readers: Iterable[int], info: LogInfo) -> LiveImage:
    """Read a network image's positions in the order that keeps its subscribers' lag >= 0.

    1. every subscriber position (acquire loads);
    2. the rcv-pos counter (the netbridge's mirror of its receiver: everything below it is
       in the log);
    3. the log from max(rcv-pos, the subscriber positions) on, scanned for contiguous frames
       (at most a term).

    Everything below a subscriber's position was in the log when it read it, and the scan
    starts at or past every subscriber, so the rcv-pos it returns is >= each of them: the lag
    is >= 0 by construction, and rcv-pos is what a subscriber can read up to now.
    """
    positions = {counter_id: values.get_int64_acquire(counter_id * COUNTER_LENGTH)
                 for counter_id in readers}
    start = max([values.get_int64_acquire(rcv_pos_counter_id * COUNTER_LENGTH),
                 *positions.values()])
    return LiveImage(positions, contiguous_end(log, start, info.term_length,
                                               info.initial_term_id, start + info.term_length))


def _map_log(path: str, term_length: int) -> mmap.mmap | None:
    """A private map of a whole log file, opened read-only (None: it is gone or resized)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != log_length(term_length):
            return None
        return mmap.mmap(fd, log_length(term_length), access=mmap.ACCESS_COPY)
    except OSError:
        return None
    finally:
        os.close(fd)


def _map_metadata(path: str) -> mmap.mmap | None:
    """A private map of a log file's metadata page, opened read-only (None: it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < LOG_META_DATA_LENGTH or size % mmap.ALLOCATIONGRANULARITY:
            return None
        return mmap.mmap(fd, LOG_META_DATA_LENGTH, access=mmap.ACCESS_COPY,
                         offset=size - LOG_META_DATA_LENGTH)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_live_images(values: AtomicBuffer, counters: tuple[Counter, ...],
                     logs: Mapping[int, LogInfo]) -> dict[int, LiveImage]:
    """The live positions of every network image whose log file can be read, by
    registration id (each in :func:`read_image`'s order)."""
    live: dict[int, LiveImage] = {}
    for c in counters:
        info = logs.get(c.registration_id)
        if c.type_id != RCV_POS or info is None or info.path is None:
            continue
        mapping = _map_log(info.path, info.term_length)
        if mapping is None:
            continue
        log = AtomicBuffer(mapping)
        try:
            readers = [r.counter_id for r in counters
                       if r.type_id == SUB_POS and r.reference_id == c.registration_id]
            live[c.registration_id] = read_image(values, log, c.counter_id, readers, info)
        finally:
            log.release()
            mapping.close()
    return live


def read_live(values: AtomicBuffer, counters: tuple[Counter, ...],
              logs: Mapping[int, LogInfo]) -> dict[int, LivePositions]:
    """The live positions of every publication whose log file can be read, by registration
    id (one after the other, each in :func:`read_publication`'s order)."""
    live: dict[int, LivePositions] = {}
    for c in counters:
        info = logs.get(c.registration_id)
        if c.type_id != PUB_LIMIT or info is None or info.path is None:
            continue
        mapping = _map_metadata(info.path)
        if mapping is None:
            continue
        meta = AtomicBuffer(mapping)
        try:
            if meta.get_int64_acquire(REGISTRATION_ID_OFFSET) == c.registration_id:
                live[c.registration_id] = read_publication(
                    values, meta, c.counter_id, reader_counters(counters, c.registration_id),
                    info)
        finally:
            meta.release()
            mapping.close()
    return live


def _buffer(data: bytes) -> AtomicBuffer:
    return AtomicBuffer(bytearray(data))


def read_snapshot(directory: str | os.PathLike[str], *, errors: bool = False) -> BusSnapshot:
    """A snapshot of the bus in ``directory``: the counters (and with ``errors`` the error
    log) copied, the logs' metadata read, and every publication's positions read live (see
    :func:`read_publication`).

    Raises :class:`BusNotFoundError` for a missing directory or cnc.dat, or a cnc.dat that is
    not ready or of another layout version.
    """
    path = Path(directory)
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "the directory does not exist"
        raise BusNotFoundError(path, problem)
    try:
        cnc = CncFile.open(path, writable=False)
    except CncError as e:
        if not (path / CNC_FILE).exists():
            raise BusNotFoundError(path, f"{path / CNC_FILE} does not exist (no driver has run "
                                         f"here, or it stopped and removed its files)") from None
        hint = not isinstance(e, CncCorruptError | CncLayoutError)
        raise BusNotFoundError(path, str(e), hint=hint) from None
    except OSError as e:
        raise BusNotFoundError(path, f"cannot read {path / CNC_FILE}: {e.strerror}",
                               hint=False) from None
    values = None
    try:
        heartbeat_ms = cnc.driver_heartbeat_ms()
        metadata = cnc.snapshot(COUNTERS_METADATA)  # metadata first: see shmbus.shm.counters
        copied = cnc.snapshot(COUNTERS_VALUES)
        error_log = cnc.snapshot(ERROR_LOG) if errors else b""
        driver = DriverInfo(
            cnc_path=str(cnc.path), layout_version=cnc.layout_version, pid=cnc.pid,
            start_time_ms=cnc.start_time_ms, heartbeat_ms=heartbeat_ms,
            client_liveness_timeout_ms=cnc.client_liveness_timeout_ns // 1_000_000)
        counters = tuple(CountersReader(_buffer(metadata), _buffer(copied)).counters())
        logs = read_log_infos(path / LOGS_DIR)
        values = cnc.load_view(COUNTERS_VALUES)
        live = read_live(values, counters, logs)
        live_images = read_live_images(values, counters, logs)
    finally:
        if values is not None:
            values.release()
        cnc.close()
    time_ms = epoch_ms()
    monotonic_s = time.monotonic()
    observations = tuple(read_error_log(_buffer(error_log))) if errors else ()
    return BusSnapshot(str(path), time_ms, monotonic_s, driver,
                       with_live_values(counters, live, live_images), logs, observations, live,
                       live_images)


def read_log_infos(logs_dir: Path) -> dict[int, LogInfo]:
    """The metadata of every log file in ``logs_dir``, by registration id (plain reads of
    the fields written before the log was announced)."""
    infos: dict[int, LogInfo] = {}
    try:
        names = sorted(os.listdir(logs_dir))
    except OSError:
        return infos
    for name in names:
        if not name.endswith(".log"):
            continue  # a block ring (<id>.blocks): read beside its log
        try:
            fd = os.open(logs_dir / name, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile
        try:
            size = os.fstat(fd).st_size
            if size < LOG_META_DATA_LENGTH:
                continue
            meta = os.pread(fd, LOG_META_DATA_LENGTH, size - LOG_META_DATA_LENGTH)
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(meta) < LOG_META_DATA_LENGTH:
            continue
        (registration_id,) = struct.unpack_from("<q", meta, REGISTRATION_ID_OFFSET)
        (term_length, mtu, session_id, stream_id, connected, window, fc_window,
         initial_term_id) = (
            struct.unpack_from("<i", meta, offset)[0]
            for offset in (TERM_LENGTH_OFFSET, MTU_OFFSET, SESSION_ID_OFFSET, STREAM_ID_OFFSET,
                           IS_CONNECTED_OFFSET, PUBLICATION_WINDOW_OFFSET, FC_WINDOW_OFFSET,
                           INITIAL_TERM_ID_OFFSET))
        if term_length > 0:
            ring = logs_dir / (name[:-4] + ".blocks")
            usage = ring_usage(ring)
            infos[registration_id] = LogInfo(registration_id, session_id, stream_id,
                                             term_length, mtu, connected == 1,
                                             fc_window or window or ipc_window(term_length),
                                             initial_term_id, str(logs_dir / name),
                                             _allocated(ring), usage.in_use, usage.warm_bound,
                                             usage.warm_bytes)
    return infos


def _allocated(path: Path) -> int:
    """Bytes of memory a (sparse) file holds; 0 when it is not there."""
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def samples(directory: str | os.PathLike[str], interval: float, count: int = 0,
            *, errors: bool = False) -> Iterator[BusSnapshot]:
    """Snapshots every ``interval`` seconds (``count`` of them; 0: until the caller stops).

    cnc.dat is opened afresh each time, so a restarted driver is followed; a bus that goes
    away raises :class:`BusNotFoundError` from the next sample.
    """
    taken = 0
    next_at = time.monotonic()
    while count <= 0 or taken < count:
        yield read_snapshot(directory, errors=errors)
        taken += 1
        if count > 0 and taken >= count:
            return
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
