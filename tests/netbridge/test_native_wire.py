"""The native netbridge wire helpers (netbridge._io.term_scan, validate_datagram,
insert_frames) against plain-Python reference versions of the loops they replace, on random
and hostile input: same answers, and bad arguments raise instead of touching memory outside a
buffer."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netbridge import _io
from shmbus import AtomicBuffer

term_scan = _io.term_scan
validate_datagram = _io.validate_datagram
insert_frames = _io.insert_frames

HEADER = struct.Struct("<iBBHiiiiq")
DATA, PAD = 1, 0
TERM = 64 * 1024
SESSION, STREAM, TERM_ID = 0x1234, 1001, -7


def align(length: int) -> int:
    return (length + 31) & ~31


# --- reference versions: the Python loops of netbridge's sender and receiver --------------------


def scan_reference(buffer: AtomicBuffer, base: int, term_offset: int, max_length: int,
                   stop: int) -> tuple[int, int]:
    """NetworkSender._scan as it was in Python, plus the native scan's one addition: a
    (corrupt) frame that would end past the term is not sent."""
    available = 0
    while available < max_length:
        offset = term_offset + available
        if offset >= stop:
            break
        frame_length = buffer.get_int32_acquire(base + offset)
        if frame_length <= 0 or offset + align(frame_length) > TERM:
            break
        if (buffer.get_int32(base + offset + 4) >> 16) & 0xFFFF == PAD:
            if available + 32 > max_length:
                break
            return available + 32, align(frame_length) - 32
        aligned = align(frame_length)
        if available + aligned > max_length:
            break
        available += aligned
    return available, 0


def validate_reference(datagram: bytes, term_offset: int, session_id: int, stream_id: int,
                       term_id: int, term_length: int, below: int) -> tuple[int, int, int] | int:
    """The header walk of ReceiverImage.on_data as it was in Python (first header included)."""
    size = len(datagram)
    if (size < 32 or term_offset < 0 or term_offset >= term_length or term_offset % 32):
        return -1
    frame_length, version, _, frame_type, f_offset, f_session, f_stream, f_term, _ = (
        HEADER.unpack_from(datagram, 0))
    if (version != 0 or f_offset != term_offset or f_session != session_id
            or f_stream != stream_id or f_term != term_id):
        return -1
    offset = skip = span = 0
    while True:
        if frame_type == DATA:
            if frame_length < 32 or offset + frame_length > size:
                return -1
            aligned = align(frame_length)
            if skip == offset and offset + aligned <= below:
                skip = offset + aligned
            offset += aligned
            span = offset
        elif frame_type == PAD:
            if frame_length < 32:
                return -1
            aligned = align(frame_length)
            if skip == offset and offset + aligned <= below:
                skip = offset + 32
            span = offset + aligned
            offset += 32
            break
        else:
            return -1
        if offset >= size:
            break
        if size - offset < 32:
            return -1
        frame_length, version, _, frame_type, f_offset, f_session, f_stream, f_term, _ = (
            HEADER.unpack_from(datagram, offset))
        if (version != 0 or f_offset != term_offset + offset or f_session != session_id
                or f_stream != stream_id or f_term != term_id):
            return -1
    if term_offset + span > term_length:
        return -1
    return min(offset, size), span, skip


# --- builders ------------------------------------------------------------------------------------


def frame(term_offset: int, payload: int, frame_type: int = DATA, *, session: int = SESSION,
          stream: int = STREAM, term_id: int = TERM_ID, length: int | None = None) -> bytes:
    """One frame as the sender puts it on the wire (padded to 32 bytes, unless a PAD)."""
    length = 32 + payload if length is None else length
    header = HEADER.pack(length, 0, 0xC0, frame_type, term_offset, session, stream, term_id, 0)
    if frame_type == PAD:
        return header
    body = bytes((term_offset + i) & 0xFF for i in range(payload))
    return (header + body).ljust(align(32 + payload), b"\0")


def datagram(term_offset: int, payloads: list[int], pad: int | None = None) -> bytes:
    out = b""
    for payload in payloads:
        out += frame(term_offset + len(out), payload)
    if pad is not None:
        out += frame(term_offset + len(out), 0, PAD, length=pad)
    return out


def term_log(frames: list[tuple[int, int]], committed: int) -> AtomicBuffer:
    """A 3-term log buffer whose term 1 holds frames (payload, type), the first ``committed``
    of them with their length set (the rest still being written: length 0)."""
    buffer = AtomicBuffer(bytearray(3 * TERM))
    offset = 0
    for i, (payload, frame_type) in enumerate(frames):
        length = 32 + payload if frame_type == DATA else payload
        data = frame(offset, payload, frame_type, length=length)
        buffer.put_bytes(TERM + offset + 4, data[4:])
        if i < committed:
            buffer.put_int32_release(TERM + offset, length)
        offset += align(length)
        if offset >= TERM:
            break
    return buffer


# --- term_scan -----------------------------------------------------------------------------------


frames_strategy = st.lists(
    st.one_of(st.tuples(st.integers(0, 1500), st.just(DATA)),
              st.tuples(st.integers(32, 4096), st.just(PAD))),
    max_size=40)


@settings(max_examples=300, deadline=None)
@given(frames_strategy, st.integers(0, 40), st.integers(0, 60), st.integers(0, 4096),
       st.integers(0, TERM + 64))
def test_term_scan_matches_the_python_scan(frames: list[tuple[int, int]], committed: int,
                                           start_frame: int, max_length: int,
                                           stop: int) -> None:
    buffer = term_log(frames, committed)
    offsets = [0]
    for payload, frame_type in frames:
        offsets.append(offsets[-1] + align(32 + payload if frame_type == DATA else payload))
    term_offset = min(offsets[min(start_frame, len(offsets) - 1)], TERM)
    stop = min(stop, TERM)
    assert term_scan(buffer, TERM, TERM, term_offset, max_length, stop) == scan_reference(
        buffer, TERM, term_offset, max_length, stop)


def test_term_scan_packs_whole_frames_up_to_the_mtu_and_stops_after_a_pad() -> None:
    buffer = term_log([(32, DATA)] * 30 + [(8192, PAD), (32, DATA)], committed=32)
    assert term_scan(buffer, TERM, TERM, 0, 1408, TERM) == (1408, 0)  # 22 whole frames of 64
    assert term_scan(buffer, TERM, TERM, 1408, 1408, TERM) == (8 * 64 + 32, 8192 - 32)
    assert term_scan(buffer, TERM, TERM, 0, 1408, 640) == (640, 0)  # frames from 640 on wait
    assert term_scan(buffer, TERM, TERM, 0, 63, TERM) == (0, 0)  # not one whole frame fits


def test_term_scan_stops_at_an_uncommitted_frame() -> None:
    buffer = term_log([(100, DATA)] * 4, committed=2)
    assert term_scan(buffer, TERM, TERM, 0, 4096, TERM) == (2 * 160, 0)
    assert term_scan(buffer, TERM, TERM, 2 * 160, 4096, TERM) == (0, 0)


def test_term_scan_never_steps_past_the_term() -> None:
    buffer = AtomicBuffer(bytearray(3 * TERM))
    buffer.put_int32_release(TERM + TERM - 64, 1 << 20)  # a corrupt length past the term end
    buffer.put_int32(TERM + TERM - 64 + 4, DATA << 16)
    assert term_scan(buffer, TERM, TERM, TERM - 64, 1 << 30, TERM) == (0, 0)
    assert term_scan(buffer, TERM, TERM, TERM, 4096, TERM) == (0, 0)  # at the end: nothing


@pytest.mark.parametrize("args", [
    (2 * TERM + 32, TERM, 0, 1408, TERM),  # the term is not inside the buffer
    (-32, TERM, 0, 1408, TERM),
    (TERM, TERM, TERM + 32, 1408, TERM),  # the offset is not inside the term
    (TERM, TERM, -32, 1408, TERM),
    (TERM, TERM, 16, 1408, TERM),  # not frame-aligned
    (TERM, 0, 0, 1408, TERM),  # no term
    (TERM, 100, 0, 1408, TERM),
])
def test_term_scan_rejects_arguments_outside_the_buffer(args: tuple[int, ...]) -> None:
    buffer = term_log([(32, DATA)] * 4, committed=4)
    with pytest.raises((IndexError, ValueError)):
        term_scan(buffer, *args)
    with pytest.raises(TypeError):
        term_scan(bytearray(3 * TERM), TERM, TERM, 0, 1408, TERM)


# --- validate_datagram ---------------------------------------------------------------------------


@st.composite
def datagrams(draw: st.DrawFn) -> tuple[bytes, int]:
    term_offset = draw(st.integers(0, TERM // 32 - 1)) * 32
    payloads = draw(st.lists(st.integers(0, 300), min_size=1, max_size=8))
    pad = draw(st.one_of(st.none(), st.integers(0, 4096)))
    data = bytearray(datagram(term_offset, payloads, pad))
    for _ in range(draw(st.integers(0, 3))):  # corrupt a few bytes, often in a header
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return bytes(data if cut is None else data[:cut]), term_offset


@settings(max_examples=500, deadline=None)
@given(datagrams(), st.integers(-2000, 4000), st.sampled_from([TERM, 128 * 1024]))
def test_validate_datagram_matches_the_python_walk(case: tuple[bytes, int], below: int,
                                                   term_length: int) -> None:
    data, term_offset = case
    args = (term_offset, SESSION, STREAM, TERM_ID, term_length, below)
    assert validate_datagram(data, *args) == validate_reference(data, *args)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(-64, TERM + 64), st.integers(-5000, 5000))
def test_validate_datagram_takes_garbage(data: bytes, term_offset: int, below: int) -> None:
    args = (term_offset, SESSION, STREAM, TERM_ID, TERM, below)
    assert validate_datagram(data, *args) == validate_reference(data, *args)


def test_validate_datagram_reports_end_span_and_skip() -> None:
    data = datagram(1024, [32, 100, 0])  # frames of 64, 160 and 32 bytes
    assert validate_datagram(data, 1024, SESSION, STREAM, TERM_ID, TERM, 0) == (256, 256, 0)
    assert validate_datagram(data, 1024, SESSION, STREAM, TERM_ID, TERM, 64) == (256, 256, 64)
    assert validate_datagram(data, 1024, SESSION, STREAM, TERM_ID, TERM, 300) == (256, 256, 256)
    padded = datagram(TERM - 96, [32], pad=32)  # a frame, then a PAD header to the term end
    assert validate_datagram(padded, TERM - 96, SESSION, STREAM, TERM_ID, TERM, 0) == (96, 96, 0)
    over = datagram(TERM - 64, [32], pad=64)  # the PAD would end past the term
    assert validate_datagram(over, TERM - 64, SESSION, STREAM, TERM_ID, TERM, 0) == -1
    assert validate_datagram(data, 1056, SESSION, STREAM, TERM_ID, TERM, 0) == -1  # offset
    assert validate_datagram(data, 1024, SESSION + 1, STREAM, TERM_ID, TERM, 0) == -1
    assert validate_datagram(data, 1024, SESSION, STREAM, TERM_ID + 1, TERM, 0) == -1
    assert validate_datagram(data[:100], 1024, SESSION, STREAM, TERM_ID, TERM, 0) == -1
    assert validate_datagram(frame(0, 0, length=0), 0, SESSION, STREAM, TERM_ID, TERM, 0) == -1
    with pytest.raises(TypeError):
        validate_datagram("text", 0, SESSION, STREAM, TERM_ID, TERM, 0)


# --- insert_frames -------------------------------------------------------------------------------


def test_insert_frames_copies_and_writes_the_first_length_last() -> None:
    data = datagram(64, [32, 100])
    buffer = AtomicBuffer(bytearray(TERM))
    assert insert_frames(buffer, 64, data, 0, len(data)) == len(data)
    assert buffer.get_bytes(64, len(data)) == data
    assert insert_frames(buffer, 1024, memoryview(data), 64, len(data)) == len(data) - 64
    assert buffer.get_bytes(1024, len(data) - 64) == data[64:]


@pytest.mark.parametrize(("at", "start", "end"), [
    (TERM - 32, 0, 64),  # past the end of the buffer
    (-32, 0, 64),
    (2, 0, 64),  # the length would be stored unaligned
    (0, -1, 64),  # not inside the datagram
    (0, 0, 1000),
    (0, 64, 32),
    (0, 0, 3),  # shorter than a frame length
])
def test_insert_frames_rejects_what_is_outside_a_buffer(at: int, start: int, end: int) -> None:
    data = datagram(0, [32, 100])
    buffer = AtomicBuffer(bytearray(TERM))
    with pytest.raises((IndexError, ValueError)):
        insert_frames(buffer, at, data, start, end)
    assert buffer.get_bytes(0, TERM) == bytes(TERM)  # nothing written
