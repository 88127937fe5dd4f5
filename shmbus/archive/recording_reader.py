"""Reading recordings straight from their files, without a bus.

Frames are found with a vectorized scan (numpy, no Python loop per frame): every 32-byte slot
of a block is read as a frame header, the slots whose header is consistent with their own
position (term offset, term id, session, stream, type, length within the term) are the
candidates, and the candidates are checked to form one chain ``next = slot + aligned length``
from the first frame. Payload bytes that happen to look like a header at the right place are
detected by the chain check and dropped (a slower path that walks only across them).

Messages are reassembled from fragments (B ... E flags) the same way: vectorized. A message
belongs to the range that holds the position of its first fragment: reading ``[from, to)``
gives the messages that begin at ``from <= position < to``, completed from the frames after
``to`` when they straddle it, so consecutive ranges read every message exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from shmbus.archive.catalog import (
    RecordingDescriptor,
    RecordingError,
    find_recording,
    live_position,
    read_catalog,
    record_times,
)
from shmbus.archive.large_payloads import large_path, resolve_large
from shmbus.shm.block_ring import REFERENCE_FLAGS
from shmbus.shm.log_buffer import (
    BEGIN_FLAG,
    END_FLAG,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    HEADER_LENGTH,
    UNFRAGMENTED,
    max_message_length,
)

HEADER_DTYPE = np.dtype([
    ("frame_length", "<i4"), ("version", "u1"), ("flags", "u1"), ("type", "<u2"),
    ("term_offset", "<i4"), ("session_id", "<i4"), ("stream_id", "<i4"), ("term_id", "<i4"),
    ("reserved_value", "<i8"),
])
assert HEADER_DTYPE.itemsize == HEADER_LENGTH
#: bytes read from the files at a time (more when the largest message needs it)
CHUNK_LENGTH = 4 * 1024 * 1024
#: payload bytes a batch holds at most once large messages are read back (unless one message
#: alone is longer): Arrow's binary columns (the Spark source) take up to 2 GiB a batch
BATCH_DATA_LIMIT = 256 * 1024 * 1024


@dataclass
class FrameScan:
    """The frames of a block, in order: ``slots`` are byte offsets / 32 into the block."""

    slots: np.ndarray          # int64
    frame_lengths: np.ndarray  # int64
    types: np.ndarray          # uint16
    flags: np.ndarray          # uint8
    end: int                   # byte offset in the block where the chain of frames stops


def scan_frames(block: np.ndarray, position: int, descriptor: RecordingDescriptor) -> FrameScan:
    """Find the chain of frames in ``block`` (uint8), which starts with a frame at ``position``.

    The chain stops at the first slot that is not a whole, valid frame of this recording
    (zeros past the written data, a torn frame, the end of the block).
    """
    n = len(block) // HEADER_LENGTH
    if n == 0:
        return _empty_scan()
    # each 32-byte slot as 8 int32: length, version|flags|type, term offset, session, stream,
    # term id, reserved value (2)
    words = block[:n * HEADER_LENGTH].view(np.int32).reshape(n, 8)
    term_mask = descriptor.term_length - 1
    first_offset = position & term_mask
    # the term offset each slot has: a block never spans more than a segment, so int64 is
    # enough, and the result fits int32 (offsets are below the term length)
    slot_offsets = ((first_offset + HEADER_LENGTH * np.arange(n, dtype=np.int64))
                    & term_mask).astype(np.int32)
    idx = np.flatnonzero(words[:, 2] == slot_offsets)
    if idx.size == 0 or idx[0] != 0:
        return _empty_scan()
    h = words[idx]
    lengths = h[:, 0].astype(np.int64)
    steps = (lengths + (HEADER_LENGTH - 1)) >> 5
    types = (h[:, 1] >> 16) & 0xFFFF
    # expected term id of each candidate slot; astype(int32) wraps like the int32 term id
    term_ids = (descriptor.initial_term_id
                + ((position + HEADER_LENGTH * idx) >> descriptor.position_bits)).astype(np.int32)
    ok = ((lengths >= HEADER_LENGTH) & ((types == HDR_TYPE_DATA) | (types == HDR_TYPE_PAD))
          & (h[:, 5] == term_ids) & (h[:, 3] == np.int32(descriptor.session_id))
          & (h[:, 4] == np.int32(descriptor.stream_id))
          & (slot_offsets[idx] + HEADER_LENGTH * steps <= descriptor.term_length)
          # a DATA frame must be whole in the block; a PAD's body is only zeros, so a long
          # PAD (up to a term) may end past the block: the chain then ends past it too
          & ((idx + steps <= n) | (types == HDR_TYPE_PAD)))
    if not ok[0]:
        return _empty_scan()
    if not ok.all():
        keep = np.flatnonzero(ok)
        idx, steps, h, lengths, types = idx[keep], steps[keep], h[keep], lengths[keep], \
            types[keep]
    chain = _chain(idx, idx + steps)
    if chain is None:
        end_slot = int(idx[-1] + steps[-1])
    else:
        chosen, end_slot = chain
        idx, h, lengths, types = idx[chosen], h[chosen], lengths[chosen], types[chosen]
    flags = ((h[:, 1] >> 8) & 0xFF).astype(np.uint8)
    return FrameScan(idx, lengths, types.astype(np.uint16), flags, end_slot * HEADER_LENGTH)


def _empty_scan() -> FrameScan:
    return FrameScan(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.uint16),
                     np.empty(0, np.uint8), 0)


def _chain(idx: np.ndarray, nxt: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Which candidates form the chain from idx[0]; None when all of them do (common case)."""
    breaks = np.flatnonzero(nxt[:-1] != idx[1:])
    if breaks.size == 0:
        return None
    runs: list[np.ndarray] = []
    pos = 0
    while True:
        b = np.searchsorted(breaks, pos)
        if b == breaks.size:
            runs.append(np.arange(pos, len(idx)))
            end = int(nxt[-1])
            break
        k = int(breaks[b])
        runs.append(np.arange(pos, k + 1))
        target = nxt[k]
        j = int(np.searchsorted(idx, target))
        if j < len(idx) and idx[j] == target:
            pos = j
        else:
            end = int(target)
            break
    return np.concatenate(runs), end


# -- messages ---------------------------------------------------------------------------------


@dataclass
class MessageBatch:
    """Whole messages of one recording, as numpy arrays (Arrow-like layout).

    Message ``i`` starts at stream position ``positions[i]``; its payload is
    ``data[offsets[i]:offsets[i + 1]]`` (``lengths[i]`` bytes). ``term_ids``, ``term_offsets``
    and ``reserved_values`` come from its first fragment's header. ``record_times`` are ns since
    the epoch when the recorder had written the message (-1 when unknown).
    """

    recording_id: int
    session_id: int
    stream_id: int
    positions: np.ndarray       # int64
    lengths: np.ndarray         # int32
    offsets: np.ndarray         # int64, len + 1
    data: np.ndarray            # uint8
    term_ids: np.ndarray        # int32
    term_offsets: np.ndarray    # int32
    reserved_values: np.ndarray  # int64
    record_times: np.ndarray    # int64
    #: bool per message: it went through shared memory (a large message); its frame is a
    #: reference frame, its payload came from the side file. None: no message was large
    large: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def payload(self, i: int) -> bytes:
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes()

    def payloads(self) -> list[bytes]:
        data = self.data.tobytes()
        o = self.offsets.tolist()
        return [data[o[i]:o[i + 1]] for i in range(len(self))]

    def records(self, dtype: np.dtype | str) -> np.ndarray:
        """Payloads as an array of fixed-size records (every message must be itemsize long)."""
        dtype = np.dtype(dtype)
        if len(self) and not np.all(self.lengths == dtype.itemsize):
            bad = int(np.flatnonzero(self.lengths != dtype.itemsize)[0])
            raise ValueError(f"message at position {int(self.positions[bad])} has "
                             f"{int(self.lengths[bad])} bytes; records of {dtype} need "
                             f"{dtype.itemsize}")
        return self.data.view(dtype) if len(self) else np.empty(0, dtype)

    @classmethod
    def empty(cls, descriptor: RecordingDescriptor) -> MessageBatch:
        return cls(descriptor.recording_id, descriptor.session_id, descriptor.stream_id,
                   np.empty(0, np.int64), np.empty(0, np.int32), np.zeros(1, np.int64),
                   np.empty(0, np.uint8), np.empty(0, np.int32), np.empty(0, np.int32),
                   np.empty(0, np.int64), np.empty(0, np.int64))

    @classmethod
    def concat(cls, batches: list[MessageBatch]) -> MessageBatch:
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        offsets = [np.zeros(1, np.int64)]
        base = 0
        for b in batches:
            offsets.append(b.offsets[1:] + base)
            base += int(b.offsets[-1])
        return cls(first.recording_id, first.session_id, first.stream_id,
                   np.concatenate([b.positions for b in batches]),
                   np.concatenate([b.lengths for b in batches]),
                   np.concatenate(offsets),
                   np.concatenate([b.data for b in batches]),
                   np.concatenate([b.term_ids for b in batches]),
                   np.concatenate([b.term_offsets for b in batches]),
                   np.concatenate([b.reserved_values for b in batches]),
                   np.concatenate([b.record_times for b in batches]),
                   None if all(b.large is None for b in batches) else np.concatenate(
                       [np.zeros(len(b), bool) if b.large is None else b.large
                        for b in batches]))


class Message(NamedTuple):
    """One reassembled message of a recording."""

    position: int
    payload: bytes
    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    reserved_value: int
    record_time_ns: int


def _assemble(block: np.ndarray, scan: FrameScan, position: int, lo: int, hi: int,
              descriptor: RecordingDescriptor) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                        np.ndarray, int | None]:
    """Messages of the scanned block that start in [lo, hi).

    Returns (columns, payload offsets, payload data, position of an unfinished last message).
    """
    is_data = scan.types == HDR_TYPE_DATA
    if is_data.all():
        slots, flags, frame_lengths = scan.slots, scan.flags, scan.frame_lengths
    else:
        data_frames = np.flatnonzero(is_data)
        slots = scan.slots[data_frames]
        flags = scan.flags[data_frames]
        frame_lengths = scan.frame_lengths[data_frames]
    plen = frame_lengths - HEADER_LENGTH
    pending = None
    whole = (flags & UNFRAGMENTED) == UNFRAGMENTED
    if whole.all():  # no fragments: every frame is a message
        starts = stops = np.arange(len(slots))
    else:
        starts = np.flatnonzero(flags & BEGIN_FLAG)
        ends = np.flatnonzero(flags & END_FLAG)
        at = np.searchsorted(ends, starts)
        matched = at < len(ends)
        if len(starts) and not matched[-1]:
            pending = position + HEADER_LENGTH * int(slots[starts[-1]])
        starts, at = starts[matched], at[matched]
        stops = ends[at]
        next_starts = np.append(starts[1:], np.iinfo(np.int64).max)
        valid = stops < next_starts  # a B with no E before the next B: a broken message
        starts, stops = starts[valid], stops[valid]
    first = slots[starts]
    msg_positions = position + HEADER_LENGTH * first
    owned = (msg_positions >= lo) & (msg_positions < hi)
    if not owned.all():
        starts, stops, first, msg_positions = (starts[owned], stops[owned], first[owned],
                                               msg_positions[owned])
    if starts is stops or np.array_equal(starts, stops):
        lengths = plen[starts].astype(np.int32)
    else:
        cumulative = np.concatenate(([0], np.cumsum(plen)))
        lengths = (cumulative[stops + 1] - cumulative[starts]).astype(np.int32)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = _gather(block, slots, plen, starts, stops, int(offsets[-1]))
    reserved = block[:(len(block) // HEADER_LENGTH) * HEADER_LENGTH].view(np.int64).reshape(
        -1, 4)[first, 3]
    columns = {
        "positions": msg_positions,
        "lengths": lengths,
        # checked against the headers by the scan: computed, not read
        "term_ids": (descriptor.initial_term_id
                     + (msg_positions >> descriptor.position_bits)).astype(np.int32),
        "term_offsets": (msg_positions & (descriptor.term_length - 1)).astype(np.int32),
        "reserved_values": reserved,
        # (whole-message frames with the large flag: on a fragment it means nothing)
        "large": (flags[starts] & REFERENCE_FLAGS) == REFERENCE_FLAGS,
    }
    return columns, offsets, data, pending


def _gather(block: np.ndarray, slots: np.ndarray, plen: np.ndarray, starts: np.ndarray,
            stops: np.ndarray, total: int) -> np.ndarray:
    """The payload bytes of the messages (frames starts[k]..stops[k]) in order, copied."""
    if len(starts) == 0:
        return np.empty(0, np.uint8)
    if np.array_equal(starts, stops):
        frames = starts
    else:
        marks = (np.bincount(starts, minlength=len(slots) + 1)
                 - np.bincount(stops + 1, minlength=len(slots) + 1))
        frames = np.flatnonzero(np.cumsum(marks[:len(slots)]) > 0)
    frame_bytes = HEADER_LENGTH * slots[frames]
    lengths = plen[frames]
    # fast path: equal frames one after the other (fixed-size messages)
    if len(frames) > 1:
        stride = int(frame_bytes[1] - frame_bytes[0])
        length = int(lengths[0])
        if (stride > 0 and np.all(lengths == length)
                and np.all(np.diff(frame_bytes) == stride)):
            first = int(frame_bytes[0])
            rows = block[first:first + stride * len(frames)]
            if len(rows) == stride * len(frames):
                return np.ascontiguousarray(
                    rows.reshape(len(frames), stride)[:, HEADER_LENGTH:HEADER_LENGTH + length]
                ).reshape(-1)
    nonempty = lengths > 0
    begin = frame_bytes[nonempty] + HEADER_LENGTH
    end = begin + lengths[nonempty]
    marks = np.zeros(len(block) + 1, np.int8)
    marks[begin] = 1
    marks[end] = -1
    mask = np.cumsum(marks[:len(block)], dtype=np.int8).view(bool)
    data: np.ndarray = block[mask]
    assert len(data) == total
    return data


class RecordingReader:
    """Reads one recording from its files: whole messages between two positions.

    ``directory`` is the recording directory (the one with catalog.json). The reader works on
    a finished recording and on one a recorder is still writing (it reads up to the live
    position). It holds no file open between calls, so it can be pickled.
    """

    def __init__(self, directory: str | os.PathLike[str],
                 recording: int | RecordingDescriptor) -> None:
        self.directory = Path(directory)
        if isinstance(recording, RecordingDescriptor):
            self.descriptor = recording
        else:
            self.descriptor = find_recording(self.directory, recording)

    def refresh(self) -> RecordingDescriptor:
        """Re-read the catalog entry (a live recording may have stopped since)."""
        self.descriptor = find_recording(self.directory, self.descriptor.recording_id)
        return self.descriptor

    @property
    def start_position(self) -> int:
        """The stream position the recording starts at (bytes)."""
        return self.descriptor.start_position

    @property
    def stop_position(self) -> int:
        """How far the recording can be read now (see ``catalog.live_position``)."""
        return live_position(self.directory, self.refresh())

    def read_batches(self, from_position: int | None = None, to_position: int | None = None,
                     *, limit: int | None = None,
                     chunk_length: int = CHUNK_LENGTH) -> Iterator[MessageBatch]:
        """Yield :class:`MessageBatch` es of the messages that begin in [from, to).

        ``from`` defaults to the start, ``to`` to the live position; ``limit`` (default: the
        live position) is how far frames may be read to complete a message that straddles
        ``to``. A message not complete by ``limit`` (the end of a recording whose publisher
        died mid-message) is not returned.
        """
        if limit is None:
            limit = self.stop_position  # refreshes the descriptor too
        d = self.descriptor
        start = d.start_position if from_position is None else max(from_position,
                                                                    d.start_position)
        end = limit if to_position is None else min(to_position, limit)
        if start >= end:
            return
        # frames can only be found from a frame boundary: the start of the term (or of the
        # recording); messages never span terms, so nothing before is needed
        pos = max(start - (start & (d.term_length - 1)), d.start_position)
        read_end = min(limit, _term_ceiling(end, d.term_length))
        chunk_length = max(chunk_length, 2 * max_message_length(d.term_length) + 2 * d.mtu)
        while pos < read_end:
            base = d.segment_base(pos)
            chunk_end = min(read_end, base + d.segment_length, pos + chunk_length)
            path = d.segment_path(self.directory, base)
            block = _read_block(path, pos - base, chunk_end - pos)
            scan = scan_frames(block, pos, d)
            columns, offsets, data, pending = _assemble(block, scan, pos, start, end, d)
            if len(offsets) > 1:
                times = record_times(self.directory, d, base, columns["positions"])
                lengths = columns["lengths"]
                if columns["large"].any():
                    offsets, data = resolve_large(columns["positions"], offsets, data,
                                                  columns["large"],
                                                  large_path(d, self.directory, base))
                    lengths = np.diff(offsets).astype(np.int32)
                large = columns["large"]
                batch = MessageBatch(d.recording_id, d.session_id, d.stream_id,
                                     columns["positions"], lengths, offsets, data,
                                     columns["term_ids"], columns["term_offsets"],
                                     columns["reserved_values"], times,
                                     large if large.any() else None)
                yield from _split(batch, BATCH_DATA_LIMIT)
            chain_end = pos + scan.end
            if chain_end >= read_end:
                return
            if chain_end == pos:
                if _frame_straddles(block, pos, d, read_end):
                    return  # ``limit`` cuts the last frame: it is not readable yet
                raise RecordingError(
                    f"recording {d.recording_id} in {self.directory}: no valid frame at "
                    f"position {pos}, before the readable end {read_end}: {path} is damaged")
            # an unfinished message at the end of a chunk is read again with what follows
            pos = pending if pending is not None and pending > pos else chain_end

    def read_batch(self, from_position: int | None = None,
                   to_position: int | None = None) -> MessageBatch:
        """All messages that begin in [from, to) in one :class:`MessageBatch`."""
        batches = list(self.read_batches(from_position, to_position))
        return MessageBatch.concat(batches) if batches else MessageBatch.empty(self.descriptor)

    def messages(self, from_position: int | None = None,
                 to_position: int | None = None) -> Iterator[Message]:
        """Iterate the whole messages that begin in [from, to), in position order."""
        for batch in self.read_batches(from_position, to_position):
            data = batch.data.tobytes()
            o = batch.offsets.tolist()
            for i, (p, t, to, rv, rt) in enumerate(zip(
                    batch.positions.tolist(), batch.term_ids.tolist(),
                    batch.term_offsets.tolist(), batch.reserved_values.tolist(),
                    batch.record_times.tolist(), strict=True)):
                yield Message(p, data[o[i]:o[i + 1]], batch.session_id, batch.stream_id, t, to,
                              rv, rt)


def _split(batch: MessageBatch, limit: int) -> Iterator[MessageBatch]:
    """``batch`` in pieces of at most ``limit`` payload bytes (or one message each)."""
    if int(batch.offsets[-1]) <= limit:
        yield batch
        return
    n = len(batch)
    first = 0
    while first < n:
        base = int(batch.offsets[first])
        last = max(first + 1, int(np.searchsorted(batch.offsets, base + limit, "right")) - 1)
        last = min(last, n)
        offsets = batch.offsets[first:last + 1] - base
        yield MessageBatch(batch.recording_id, batch.session_id, batch.stream_id,
                           batch.positions[first:last], batch.lengths[first:last], offsets,
                           batch.data[base:int(batch.offsets[last])],
                           batch.term_ids[first:last], batch.term_offsets[first:last],
                           batch.reserved_values[first:last], batch.record_times[first:last],
                           None if batch.large is None else batch.large[first:last])
        first = last


def _term_ceiling(position: int, term_length: int) -> int:
    return -(-position // term_length) * term_length


def _frame_straddles(block: np.ndarray, position: int, d: RecordingDescriptor,
                     read_end: int) -> bool:
    """True if ``block`` starts with a valid frame header whose frame ends past read_end."""
    if len(block) < HEADER_LENGTH:
        return len(block) == read_end - position
    h = block[:HEADER_LENGTH].view(HEADER_DTYPE)[0]
    length = int(h["frame_length"])
    return (length >= HEADER_LENGTH and int(h["term_offset"]) == position % d.term_length
            and int(h["term_id"]) == d.term_id_at(position)
            and int(h["session_id"]) == d.session_id and int(h["stream_id"]) == d.stream_id
            and position + ((length + HEADER_LENGTH - 1) & -HEADER_LENGTH) > read_end)


def _read_block(path: Path, offset: int, length: int) -> np.ndarray:
    """Bytes [offset, offset + length) of a segment file; shorter if the file is."""
    block = np.zeros(length, np.uint8)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise RecordingError(f"segment file {path} is missing") from None
    try:
        done = 0
        view = block.data
        while done < length:
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                break
            done += n
    finally:
        os.close(fd)
    return block[:done]


def open_recording(directory: str | os.PathLike[str], recording_id: int) -> RecordingReader:
    """A reader of one recording of ``directory``."""
    return RecordingReader(directory, recording_id)


def list_recordings(directory: str | os.PathLike[str]) -> list[RecordingDescriptor]:
    """The catalog of ``directory`` (see :func:`shmbus.archive.catalog.read_catalog`)."""
    return read_catalog(directory)


def replay(reader: RecordingReader, publication: object, from_position: int | None = None,
           to_position: int | None = None, *, timeout: float = 10.0) -> int:
    """Republish the messages of a recording that begin in [from, to) on ``publication``.

    Each message keeps its reserved value; positions are those of the new publication. Waits
    up to ``timeout`` seconds per message (back-pressure, no subscriber) before raising
    :class:`shmbus.PublicationError`. Returns the number of messages published.
    """
    publish = publication.publish  # type: ignore[attr-defined]
    count = 0
    for batch in reader.read_batches(from_position, to_position):
        data = batch.data.data  # the ndarray's memoryview: slices are zero copy
        offsets = batch.offsets.tolist()
        for i, reserved in enumerate(batch.reserved_values.tolist()):
            publish(data[offsets[i]:offsets[i + 1]], timeout=timeout, reserved_value=reserved)
        count += len(batch)
    return count
