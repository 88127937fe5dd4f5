"""The recorder: a subscriber that appends a stream's frames to segment files (Aeron Archive).

One :class:`Recorder` subscribes to a channel and stream and records every session (or one)
into a recording directory (see :mod:`shmbus.archive.catalog` for the layout): one recording per
image, its frames copied exactly as they are in the log, headers included, so a position in
a recording is the stream position. Frames are copied as blocks from ``Image.poll_batch``
(one ``pwrite`` per run of frames, no Python work per message).

Crash safety. A block is written in two steps: everything but the first 4 bytes (the first
frame's length), then those 4 bytes, exactly as a publisher commits a frame in a log. Until
the length is written, the block is unreachable (the byte there is still the zero of a
preallocated segment), so a recorder killed at any point leaves whole frames followed by
zeros or unreachable bytes. On restart the recorder recovers every recording left active: the
stop position is found by scanning the last segment (frame lengths, checked against the
recording's term ids, offsets and session), the rest of that segment (a torn frame) is cut
off and the catalog is completed. Nothing that was written is lost.

fsync policy: ``"none"`` (the page cache; survives a killed process, not a power cut),
``"segment"`` (a segment and its index are fsynced when complete and at stop),
``"write"`` (each block is fdatasynced before and after its commit: durable once written).
The catalog is always fsynced.

Large messages (past the log's max message length, their payload in a shared-memory block the
log's frame refers to) are recorded with their payload: while the recorder reads the frame the
block is still held (the recorder is a counted subscriber), so the payload is copied into the
segment's side file first, then the frame is committed at its stream position with a recorded
reference to it (see :mod:`shmbus.archive.large_payloads`).

A full file system (ENOSPC or EDQUOT) stops every recording cleanly: what was committed stays,
each last segment is cut at its stop position, the catalog says ``stopped`` with the reason
(written in space the recorder reserved for it) and :class:`~shmbus.archive.catalog.DiskFullError`
is raised.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shmbus.archive.catalog import (
    ACTIVE,
    INDEX_DTYPE,
    POSITION_FILE,
    SEGMENT_SUFFIX,
    STOPPED,
    CatalogWriter,
    DiskFullError,
    RecordingDescriptor,
    RecordingError,
    check_segment_length,
    default_segment_length,
    encode_position,
    is_disk_full,
    read_index,
)
from shmbus.archive.large_payloads import (
    encode_recorded_reference,
    large_path,
)
from shmbus.archive.recording_reader import CHUNK_LENGTH, _read_block, scan_frames
from shmbus.settings.idle_strategy import BackoffIdleStrategy
from shmbus.shm.block_ring import REFERENCE_FLAGS
from shmbus.shm.log_buffer import (
    END_FLAG,
    HDR_TYPE_PAD,
    HEADER_LENGTH,
    UNFRAGMENTED,
    encode_data_header,
)
from shmbus.streams.context_managers import Closeable
from shmbus.streams.image import FragmentBatch, Image

if TYPE_CHECKING:
    from shmbus.streams.subscription import Subscription

FSYNC_POLICIES = ("none", "segment", "write")


@dataclass
class _Segment:
    base: int
    fd: int
    index_fd: int
    index_length: int = 0
    large_fd: int | None = None   # the side file of large payloads, opened on first use
    large_length: int = 0         # its bytes that committed frames refer to


class _RecordingWriter:
    """Appends one image's frames to its recording."""

    def __init__(self, root: Path, descriptor: RecordingDescriptor, fsync: str,
                 time_resolution_ns: int) -> None:
        self.root = root
        self.descriptor = descriptor
        self.directory = descriptor.directory(root)
        self.directory.mkdir(exist_ok=True)
        self.fsync = fsync
        self.time_resolution_ns = time_resolution_ns
        self.stop = descriptor.start_position
        self.safe = descriptor.start_position  # end of the last whole message written
        self.end_of_stream = False
        self._segment: _Segment | None = None
        self._retired: list[_Segment] = []
        self._last_index_ns = 0
        self._last_indexed = self.stop
        self._term_mask = descriptor.term_length - 1
        self._position_fd = os.open(self.directory / POSITION_FILE,
                                    os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._write_position(time.time_ns())

    # -- writing -----------------------------------------------------------------------------

    def on_batch(self, batch: FragmentBatch, image: Image | None = None,
                 large: dict[int, memoryview] | None = None) -> None:
        """Append the frames of a ``poll_batch`` batch (and the padding around them), unless
        ``image`` lost its hold on the log while they were copied (see _commit).

        ``large`` maps the index of each large message's frame in the batch to its payload
        (the block the frame refers to): the payload goes to the segment's side file and the
        frame is recorded with a reference to it."""
        p0 = batch.position
        if p0 != self.stop:
            self.pad_to(p0)
        offsets = batch.offsets
        frame_starts = offsets - HEADER_LENGTH
        frame_ends = frame_starts + ((batch.lengths.astype(np.int64) + (2 * HEADER_LENGTH - 1))
                                     & -HEADER_LENGTH)
        term_base = p0 - (p0 & self._term_mask)
        cursor = p0 - term_base
        breaks = (np.flatnonzero(frame_starts[1:] != frame_ends[:-1]) + 1).tolist()
        firsts = [0, *breaks]
        lasts = [*breaks, len(offsets)]
        pieces: list[tuple[int, Any]] = []
        term = batch.term
        for first, last in zip(firsts, lasts, strict=True):
            start, end = int(frame_starts[first]), int(frame_ends[last - 1])
            if start > cursor:
                pieces.append((term_base + cursor, self._pad_header(term_base + cursor,
                                                                    start - cursor)))
            pieces.append((term_base + start, term[start:end]))
            cursor = end
        side: tuple[_Segment, int] | None = None
        if large:
            side = self._write_large(large, term_base, frame_starts, pieces)
        if not self._commit(pieces, image):
            return
        if side is not None:
            side[0].large_length = side[1]
        new_stop = term_base + cursor
        flags = batch.flags
        if flags[-1] & END_FLAG:
            self.safe = new_stop
        else:
            whole = np.flatnonzero(flags & END_FLAG)
            if whole.size:
                self.safe = term_base + int(frame_ends[whole[-1]])
        self.stop = new_stop
        self._after_commit()

    def _write_large(self, large: dict[int, memoryview], term_base: int,
                     frame_starts: np.ndarray, pieces: list[tuple[int, Any]]
                     ) -> tuple[_Segment, int]:
        """Append the payloads to the side file of the batch's segment (one term: one segment)
        and add the recorded references to ``pieces``; returns the segment and the side file's
        length once they are committed."""
        segment = self._segment_for(term_base + int(frame_starts[min(large)]))
        if segment.large_fd is None:
            segment.large_fd = os.open(large_path(self.descriptor, self.root, segment.base),
                                       os.O_RDWR | os.O_CREAT, 0o644)
        length = segment.large_length
        for k in sorted(large):
            payload = large[k]
            _pwrite_all(segment.large_fd, payload, length)
            pieces.append((term_base + int(frame_starts[k]) + HEADER_LENGTH,
                           encode_recorded_reference(length, payload.nbytes)))
            length += payload.nbytes
        return segment, length

    def pad_to(self, target: int) -> None:
        """Record [stop, target) as padding: the image skipped only PAD frames there."""
        if target < self.stop:
            raise RecordingError(f"recording {self.descriptor.recording_id}: the image moved "
                                 f"back from {self.stop} to {target}")
        pieces = []
        position = self.stop
        while position < target:
            end = min(target, (position | self._term_mask) + 1)
            pieces.append((position, self._pad_header(position, end - position)))
            position = end
        self._commit(pieces)
        if self.safe == self.stop:
            self.safe = target
        self.stop = target
        self._after_commit()

    def _pad_header(self, position: int, length: int) -> bytes:
        d = self.descriptor
        return encode_data_header(length, UNFRAGMENTED, HDR_TYPE_PAD, position & self._term_mask,
                                  d.session_id, d.stream_id, d.term_id_at(position))

    def _commit(self, pieces: list[tuple[int, Any]], image: Image | None = None) -> bool:
        """Write the pieces, the first 4 bytes (first frame length) last. When the bytes come
        from ``image``'s log and the driver dropped the image meanwhile (this process was
        stopped past its liveness: a writer may have reused them), the block is left
        uncommitted, unreachable as a torn frame is, and False returned."""
        if not pieces:
            return True
        first_position, first = pieces[0]
        first = memoryview(first).cast("B")
        self._pwrite(first_position + 4, first[4:])
        for position, data in pieces[1:]:
            self._pwrite(position, memoryview(data).cast("B"))
        if image is not None and image.is_reclaimed:
            return False
        if self.fsync == "write":
            self._sync_segments()
        self._pwrite(first_position, first[:4])
        if self.fsync == "write":
            self._sync_segments()
        return True

    def _pwrite(self, position: int, data: memoryview) -> None:
        segment = self._segment_for(position)
        _pwrite_all(segment.fd, data, position - segment.base)

    def _segment_for(self, position: int) -> _Segment:
        base = self.descriptor.segment_base(position)
        current = self._segment
        if current is not None and current.base == base:
            return current
        for segment in self._retired:
            if segment.base == base:
                return segment
        segment = self._create_segment(base)
        if current is not None:
            self._retired.append(current)
        self._segment = segment
        return segment

    def _create_segment(self, base: int) -> _Segment:
        d = self.descriptor
        path = d.segment_path(self.root, base)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, d.segment_length)
            index_fd = os.open(d.index_path(self.root, base), os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return _Segment(base, fd, index_fd, os.fstat(index_fd).st_size)

    def _sync_segments(self) -> None:
        for segment in (*self._retired, self._segment):
            if segment is not None:
                os.fdatasync(segment.fd)
                if segment.large_fd is not None:
                    os.fdatasync(segment.large_fd)

    def _after_commit(self) -> None:
        now = time.time_ns()
        for retired in self._retired:
            # a full segment: its index ends with an entry at its end
            self._append_index(retired, retired.base + self.descriptor.segment_length, now)
            self._close_segment(retired, sync=self.fsync != "none")
        self._retired.clear()
        segment = self._segment
        if (segment is not None and self.safe > max(self._last_indexed, segment.base)
                and now - self._last_index_ns >= self.time_resolution_ns):
            self._append_index(segment, self.safe, now)
        self._write_position(now)

    def _append_index(self, segment: _Segment, position: int, now: int) -> None:
        entry = np.array([(position, now)], INDEX_DTYPE).tobytes()
        os.pwrite(segment.index_fd, entry, segment.index_length)
        segment.index_length += len(entry)
        self._last_index_ns = now
        self._last_indexed = position

    def _write_position(self, now: int) -> None:
        os.pwrite(self._position_fd, encode_position(self.safe, now), 0)

    def _close_segment(self, segment: _Segment, *, sync: bool) -> None:
        try:
            if segment.large_fd is not None:
                # bytes past the referenced payloads (a disk that filled up mid-payload)
                os.ftruncate(segment.large_fd, segment.large_length)
                if sync:
                    os.fsync(segment.large_fd)
            if sync:
                os.fsync(segment.fd)
                os.fsync(segment.index_fd)
        finally:
            os.close(segment.fd)
            os.close(segment.index_fd)
            if segment.large_fd is not None:
                os.close(segment.large_fd)

    # -- stopping ----------------------------------------------------------------------------

    def finish(self, reason: str) -> RecordingDescriptor:
        """Close the files: the last segment is cut at the stop position. Returns the entry."""
        now = time.time_ns()
        segments = [*self._retired, *([self._segment] if self._segment is not None else [])]
        self._retired.clear()
        self._segment = None
        errors: list[BaseException] = []
        for segment in segments:
            try:
                if segment.base < self.stop:
                    with contextlib.suppress(OSError):
                        self._append_index(segment, min(self.stop, segment.base
                                                        + self.descriptor.segment_length), now)
                self._close_segment(segment, sync=self.fsync != "none")
            except OSError as e:
                errors.append(e)
        with contextlib.suppress(OSError):
            self._write_position(now)
        os.close(self._position_fd)
        trim_segments(self.root, self.descriptor, self.stop, sync=self.fsync != "none")
        return self.descriptor.with_(stop_position=self.stop, stop_time_ns=now, state=STOPPED,
                                     stop_reason=reason)


def trim_segments(root: Path, descriptor: RecordingDescriptor, stop: int, *,
                  sync: bool) -> None:
    """Cut the segment holding ``stop`` at it and delete the segments after it."""
    directory = descriptor.directory(root)
    for path in directory.glob(f"*{SEGMENT_SUFFIX}"):
        try:
            base = int(path.stem)
        except ValueError:
            continue
        if base >= stop:
            path.unlink(missing_ok=True)
            descriptor.index_path(root, base).unlink(missing_ok=True)
            large_path(descriptor, root, base).unlink(missing_ok=True)
        elif base + descriptor.segment_length > stop:
            fd = os.open(path, os.O_RDWR)
            try:
                os.ftruncate(fd, stop - base)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def recover_recording(root: str | os.PathLike[str],
                      descriptor: RecordingDescriptor) -> RecordingDescriptor:
    """Finish a recording left active by a recorder that died: returns the stopped entry.

    The stop position is the end of the last whole, valid frame of the last segment (scanned
    with the frame lengths); what follows it (a torn frame) is cut off.
    """
    root = Path(root)
    directory = descriptor.directory(root)
    bases = sorted(int(p.stem) for p in directory.glob(f"*{SEGMENT_SUFFIX}")
                   if p.stem.isdigit())
    stop = descriptor.start_position
    stop_time = descriptor.start_time_ns
    for base in reversed(bases):
        path = descriptor.segment_path(root, base)
        end = _scan_segment(path, descriptor, max(base, descriptor.start_position), base)
        if end > max(base, descriptor.start_position):
            stop = end
            stop_time = os.stat(path).st_mtime_ns
            break
    trim_segments(root, descriptor, stop, sync=True)
    if stop > descriptor.start_position:
        # the time index keeps its whole entries up to the stop, and ends with one at the stop
        index_path = descriptor.index_path(root, descriptor.segment_base(stop - 1))
        index = read_index(index_path)
        index = index[index["position"] < stop]
        with open(index_path, "wb") as f:
            f.write(index.tobytes())
            f.write(np.array([(stop, stop_time)], INDEX_DTYPE).tobytes())
            os.fsync(f.fileno())
    with open(directory / POSITION_FILE, "wb") as f:
        f.write(encode_position(stop, stop_time))
    return descriptor.with_(stop_position=stop, stop_time_ns=stop_time, state=STOPPED,
                            stop_reason="recovered: the recorder ended without stopping it")


def recover_directory(directory: str | os.PathLike[str]) -> list[RecordingDescriptor]:
    """Recover the recordings a killed recorder left active in ``directory`` (no bus needed).

    Takes the directory's lock (RecordingError if a recorder is running there), completes the
    catalog and returns the recovered entries. A Recorder opening the directory does the same.
    """
    catalog = CatalogWriter(directory)
    try:
        return _recover_all(catalog)
    finally:
        catalog.close()


def _recover_all(catalog: CatalogWriter) -> list[RecordingDescriptor]:
    recovered = []
    for descriptor in list(catalog.recordings.values()):
        if descriptor.state == ACTIVE:
            entry = recover_recording(catalog.directory, descriptor)
            catalog.put(entry)
            recovered.append(entry)
    return recovered


def _scan_segment(path: Path, d: RecordingDescriptor, first: int, base: int) -> int:
    position = first
    segment_end = base + d.segment_length
    while position < segment_end:
        chunk_end = min(segment_end, position + CHUNK_LENGTH)
        block = _read_block(path, position - base, chunk_end - position)
        scan = scan_frames(block, position, d)
        if scan.end == 0:
            break
        position += scan.end
    return position


class Recorder(Closeable):
    """Records a channel and stream (every session, or ``session_id``) into ``directory``.

    Made by :meth:`shmbus.Client.add_recorder`, whose ``add_subscription`` it is given as
    ``subscribe``; closing it leaves the client open. Drive it with :meth:`poll` in your loop, or
    :meth:`run`; :meth:`close` stops every recording (catalog: ``stopped``). Only one recorder
    writes a directory at a time; opening one recovers what a killed recorder left.

    ``segment_length`` (default 32 MiB, at least the term length) is a power of two;
    ``fsync`` is ``"none"``, ``"segment"`` or ``"write"``; ``time_resolution`` (seconds) is
    how often the time index gets an entry (the precision of the record time).
    """

    def __init__(self, subscribe: Callable[..., Subscription],
                 directory: str | os.PathLike[str], channel: str, stream_id: int, *,
                 session_id: int | None = None, segment_length: int | None = None,
                 fsync: str = "none", fragment_limit: int = 65536,
                 time_resolution: float = 0.001) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy {fsync!r} must be one of {FSYNC_POLICIES}")
        self.directory = Path(directory)
        self.channel = channel
        self.stream_id = stream_id
        self.session_id = session_id
        self.segment_length = segment_length
        self.fsync = fsync
        self.fragment_limit = fragment_limit
        self.time_resolution_ns = int(time_resolution * 1e9)
        self._writers: dict[int, _RecordingWriter] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._catalog = CatalogWriter(self.directory)
        try:
            try:
                #: entries of the recordings a previous recorder left active, now recovered
                self.recovered = _recover_all(self._catalog)
                self._catalog.ensure_reserve()
            except OSError as e:
                if is_disk_full(e):
                    raise DiskFullError(f"cannot record into {self.directory}: the file "
                                        f"system is full ({e.strerror})") from None
                raise
            self._subscription = subscribe(
                channel, stream_id, on_available_image=self._on_available_image,
                on_unavailable_image=self._on_unavailable_image)
        except BaseException:
            self._catalog.close()
            raise

    # -- images --------------------------------------------------------------------------------

    # The image callbacks run on the client's conductor thread: they take the recorder's lock.

    def _on_available_image(self, image: Image) -> None:
        with self._lock:
            if not self._closed:
                self._start_recording(image)

    def _start_recording(self, image: Image) -> None:
        if self._error is not None or (self.session_id is not None
                                       and image.session_id != self.session_id):
            return
        log = image.log.descriptor
        segment_length = self.segment_length or default_segment_length(log.term_length)
        descriptor = None
        try:
            previous = self._writers.pop(image.session_id, None)
            if previous is not None:  # the session's earlier image went without a word
                self._catalog.put(previous.finish("image replaced"))
            check_segment_length(segment_length, log.term_length)
            descriptor = RecordingDescriptor(
                recording_id=self._catalog.allocate_id(), channel=self.channel,
                stream_id=image.stream_id, session_id=image.session_id,
                initial_term_id=log.initial_term_id, term_length=log.term_length, mtu=log.mtu,
                segment_length=segment_length, start_position=image.position,
                stop_position=None, start_time_ns=time.time_ns(), stop_time_ns=None,
                state=ACTIVE, source_identity=image.source_identity)
            self._catalog.recordings[descriptor.recording_id] = descriptor
            self._catalog.ensure_reserve()
            self._catalog.write()
            writer = _RecordingWriter(self.directory, descriptor, self.fsync,
                                      self.time_resolution_ns)
        except BaseException as e:  # reported by the poll that called us
            if descriptor is not None:
                self._catalog.recordings[descriptor.recording_id] = descriptor.with_(
                    stop_position=descriptor.start_position, stop_time_ns=time.time_ns(),
                    state=STOPPED, stop_reason=f"could not start: {e}")
            self._error = e
            return
        self._writers[image.session_id] = writer

    def _on_unavailable_image(self, image: Image) -> None:
        with self._lock:
            self._stop_recording(image)

    def _stop_recording(self, image: Image) -> None:
        writer = self._writers.pop(image.session_id, None)
        if writer is None:
            return
        reason = "end of stream" if writer.end_of_stream else "image unavailable"
        try:
            self._catalog.put(writer.finish(reason))
        except BaseException as e:
            self._error = e

    def _on_batch(self, batch: FragmentBatch) -> None:
        writer = self._writers.get(batch.session_id)
        image = self._subscription.image_by_session_id(batch.session_id)
        if writer is None or image is None:
            return
        large: dict[int, memoryview] = {}
        term_base = batch.position & ~writer._term_mask
        try:
            # (reference frames: whole-message frames with the large flag; on a fragment
            # the flag means nothing, see shmbus/streams/large_messages.py)
            for k in np.flatnonzero((batch.flags & REFERENCE_FLAGS) == REFERENCE_FLAGS
                                    ).tolist():
                # the block is held while this recorder's position is before its frame
                start = term_base + int(batch.offsets[k]) - HEADER_LENGTH
                end = start + ((int(batch.lengths[k]) + 2 * HEADER_LENGTH - 1) & -HEADER_LENGTH)
                try:
                    block = image._large_view(bytes(batch.payload(k)), end)
                    why = ("was freed before the recorder copied it (the driver stopped "
                           "counting this recorder)")
                except ValueError as e:  # a reference no writer of the ring made
                    block, why = None, f"is not one: {e}"
                if block is None:
                    # freed: the driver no longer counted this recorder (it stalled past the
                    # liveness timeout), or corrupt; what came before the message is recorded
                    self._error = RecordingError(
                        f"session {batch.session_id}: the large message at position "
                        f"{start} {why}; the recording stops before it")
                    if k == 0:
                        return
                    batch = FragmentBatch(batch.term, batch.offsets[:k], batch.lengths[:k],
                                          batch.flags[:k], batch.position, batch.session_id)
                    break
                large[k] = block
            writer.on_batch(batch, image, large)
        finally:
            for block in large.values():
                block.release()

    # -- duty cycle ------------------------------------------------------------------------------

    @property
    def recordings(self) -> list[RecordingDescriptor]:
        """The catalog entries of the recordings in progress."""
        with self._lock:  # image callbacks change them on the client's conductor thread
            return [w.descriptor for w in self._writers.values()]

    @property
    def positions(self) -> dict[int, int]:
        """Recording id -> position recorded so far, for the recordings in progress."""
        with self._lock:
            return {w.descriptor.recording_id: w.stop for w in self._writers.values()}

    def poll(self) -> int:
        """Record what the images have: returns the number of fragments recorded.

        Raises :class:`DiskFullError` (every recording stopped cleanly first) when the file
        system is full, and RecordingError for other failures.
        """
        if self._closed:
            raise RecordingError("the recorder is closed")
        with self._lock:
            try:
                if self._error is not None:
                    raise self._error
                fragments = self._subscription.poll_batch(self._on_batch, self.fragment_limit)
                if self._error is not None:
                    raise self._error
                for session_id, writer in self._writers.items():
                    image = self._subscription.image_by_session_id(session_id)
                    if image is None:
                        continue
                    position = image.position
                    if position > writer.stop:
                        writer.pad_to(position)
                    if not writer.end_of_stream and image.is_end_of_stream:
                        writer.end_of_stream = True
                return fragments
            except OSError as e:
                if is_disk_full(e):
                    self._stop_all(f"disk full: {e.strerror}")
                    raise DiskFullError(
                        f"recording into {self.directory} stopped: the file system is full "
                        f"({e.strerror}); every recording was stopped cleanly at its last "
                        f"whole frame") from None
                self._stop_all(f"error: {e}")
                raise RecordingError(f"recording into {self.directory} stopped: {e}") from e

    def run(self, duration: float | None = None, stop: threading.Event | None = None,
            idle: Any = None) -> None:
        """Poll until ``stop`` is set or ``duration`` seconds passed (forever if neither)."""
        idle = idle or BackoffIdleStrategy()
        deadline = None if duration is None else time.monotonic() + duration
        while not (stop is not None and stop.is_set()):
            if deadline is not None and time.monotonic() >= deadline:
                return
            idle.idle(self.poll())

    def _stop_all(self, reason: str) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            try:
                entry = writer.finish(reason)
            except OSError:
                entry = writer.descriptor.with_(stop_position=writer.stop,
                                                stop_time_ns=time.time_ns(), state=STOPPED,
                                                stop_reason=reason)
            self._catalog.recordings[entry.recording_id] = entry
        self._catalog.write()

    def close(self) -> None:
        """Stop every recording (catalog: stopped) and close the subscription. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            with self._lock:
                if self._writers:
                    self._stop_all("recorder closed")
        finally:
            # outside the lock: closing takes the client's lock, which image callbacks hold
            with contextlib.suppress(Exception):
                self._subscription.close()
            self._catalog.close()

    def __repr__(self) -> str:
        return (f"Recorder({str(self.directory)!r}, channel={self.channel!r}, "
                f"stream_id={self.stream_id}, recordings={len(self._writers)})")
