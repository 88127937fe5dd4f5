"""Hostile large-message references against the block ring, compared with a model
(shmbus/shm/block_ring.py: encode_reference / decode_reference / BlockRing.view).

A reference frame's payload names a ring position and a length. Whatever a writer puts there,
a reader's ``view`` of it is exactly one of:

* the bytes of the live block that starts at that position with that length, for the frame
  its writer bound it to (the stream position after it: a reference a writer made);
* None when the block was freed (the position is before the ring's free head: the reader was
  no longer counted; it stops there, as at a lapped frame);
* ValueError naming the reference and what is wrong with it: not a reference, not at a block
  start, longer than the ring takes, past the end of the ring, past what writers reserved,
  not a block of that length, a ring no writer used, a ring file whose size is not its
  header's, a block bound to another frame or still being filled.

Never a crash, never a slice of another block or of part of one, never a stall (None) for a
reference no writer could have made.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus.shm import block_ring as br

KIB = 1 << 10
#: a ring of about 530 KiB: small, so wrapping and padding happen within a few blocks
MAX_MESSAGE = 256 * KIB
SIZES = [1, 100, 4 * KIB - br.BLOCK_HEADER, 4 * KIB, 20 * KIB, 100 * KIB, MAX_MESSAGE]
PID = os.getpid()


def fill(ring: br.BlockRing, start: int, length: int, tag: int) -> None:
    payload = ring.payload(start, length)
    pattern = bytes((tag + i) % 251 for i in range(251))
    payload[:] = (pattern * (length // 251 + 1))[:length]
    payload.release()


def expected(length: int, tag: int) -> bytes:
    pattern = bytes((tag + i) % 251 for i in range(251))
    return (pattern * (length // 251 + 1))[:length]


def outcome(ring: br.BlockRing, reference: bytes, end: int) -> bytes | str | None:
    """What view() makes of ``reference`` in a frame ending at stream position ``end``: the
    bytes, None, or 'error' (a named ValueError)."""
    try:
        view = ring.view(reference, end)
    except ValueError as e:
        assert "large-message reference" in str(e), str(e)
        return "error"
    if view is None:
        return None
    try:
        return bytes(view)
    finally:
        view.release()


@given(st.binary(max_size=48))
@settings(max_examples=300)
def test_decode_takes_only_references_and_names_the_rest(payload: bytes) -> None:
    try:
        position, length = br.decode_reference(payload)
    except ValueError as e:
        assert "large-message reference" in str(e)
        return
    assert len(payload) == br.REFERENCE_LENGTH and payload[:4] == b"SHBL"
    assert position >= 0 and length >= 0


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
@settings(max_examples=100)
def test_a_reference_round_trips(position: int, length: int) -> None:
    assert br.decode_reference(br.encode_reference(position, length)) == (position, length)


@st.composite
def hostile_references(draw: st.DrawFn, live: list[tuple[int, int, int]],
                       freed: list[tuple[int, int, int]], tail: int,
                       capacity: int) -> tuple[int, int]:
    """A (ring position, length) near what the ring holds: exact blocks, their neighbours,
    wrong lengths, pages inside blocks, past the tail, past the ring's end, anything."""
    blocks = live + freed
    kind = draw(st.sampled_from(["exact", "length", "inside", "offset", "tail", "end",
                                 "any"]))
    if kind in ("exact", "length", "inside", "offset") and blocks:
        start, length, _ = draw(st.sampled_from(blocks))
        if kind == "exact":
            return start, length
        if kind == "length":
            return start, max(0, length + draw(st.sampled_from([-1, 1, -4096, 4096, 2**40])))
        if kind == "inside":
            pages = max(1, (br.BLOCK_HEADER + length) // br.PAGE)
            return start + br.PAGE * draw(st.integers(1, pages)), draw(st.sampled_from(
                [0, 1, length, max(0, length - br.PAGE)]))
        return start + draw(st.integers(1, br.PAGE - 1)), length
    if kind == "tail":
        return tail + draw(st.sampled_from([0, br.PAGE, capacity])), draw(
            st.sampled_from([0, 1, 100]))
    if kind == "end":
        at = draw(st.integers(0, capacity // br.PAGE - 1)) * br.PAGE
        return tail - tail % capacity + at, capacity - at - br.BLOCK_HEADER + draw(
            st.integers(1, br.PAGE))
    return draw(st.integers(0, 2**63 - 1)), draw(st.integers(0, 2**63 - 1))


@given(st.data())
@settings(max_examples=60)
def test_view_gives_the_block_a_writer_made_none_once_freed_else_a_named_error(
        data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        ring = br.BlockRing.create(Path(tmp) / "x.blocks", MAX_MESSAGE)
        try:
            # before any writer: nothing refers to this ring
            for position, length in [(0, 0), (0, 1), (br.PAGE, 100)]:
                assert outcome(ring, br.encode_reference(position, length), 64) == "error"
            live: list[tuple[int, int, int]] = []  # (start, length, tag)
            freed: list[tuple[int, int, int]] = []
            stream = 0
            releases: dict[int, int] = {}
            for tag in range(data.draw(st.integers(1, 12), label="blocks")):
                length = data.draw(st.sampled_from(SIZES))
                try:
                    start = ring.reserve(length, PID)
                except br.BlockRingFullError:
                    # readers move past everything: all freed
                    ring.reclaim(stream, stream)
                    freed += live
                    live = []
                    start = ring.reserve(length, PID)
                fill(ring, start, length, tag)
                stream += 64
                ring.commit(start, stream)
                releases[start] = stream
                live.append((start, length, tag))
                done = data.draw(st.integers(0, len(live) - 1))
                if done:
                    ring.reclaim(releases[live[done - 1][0]], stream)
                    freed += live[:done]
                    live = live[done:]
            head = ring.buffer.get_int64_acquire(br._HEAD)
            tail = ring.buffer.get_int64_acquire(br._TAIL)
            for _ in range(20):
                position, length = data.draw(
                    hostile_references(live, freed, tail, ring.capacity))
                # the frame the block was made for, or one at another stream position
                end = releases.get(position, 64) + data.draw(st.sampled_from([0, 0, 64, -64]))
                got = outcome(ring, br.encode_reference(position, length), end)
                match = [tag for start, n, tag in live if (start, n) == (position, length)]
                if match and end == releases[position]:
                    assert got == expected(length, match[0]), "not the block's bytes"
                elif match:
                    assert got == "error", "a live block read through another frame"
                elif position < head:
                    assert got in (None, "error"), "a freed block's bytes"
                    if any((s, n) == (position, length) for s, n, _ in freed):
                        assert got is None, "a freed block is gone, not an error"
                else:
                    assert got == "error", f"({position}, {length}): {got!r:.60}"
        finally:
            ring.close()


def ring_file(directory: Path, size: int, capacity_field: int | None) -> Path:
    """A ring file of ``size`` bytes whose header is a used ring's, saying ``capacity_field``
    (None: a hole, never used)."""
    path = directory / "y.blocks"
    with open(path, "wb") as f:
        f.truncate(size)
        if capacity_field is not None:
            f.write(struct.pack("<qqq", br.MAGIC, capacity_field,
                                capacity_field // 2 - br.BLOCK_HEADER))
    return path


@pytest.mark.parametrize("size", [0, 100, br.HEADER_PAGE, br.HEADER_PAGE + br.PAGE,
                                  br.HEADER_PAGE + 3 * br.PAGE + 17])
def test_a_ring_file_too_short_or_not_of_whole_pages_is_refused_naming_its_size(
        shm_dir: Path, size: int) -> None:
    path = ring_file(shm_dir, size, None)
    with pytest.raises(ValueError, match=f"block ring {path}: {size} bytes"):
        br.BlockRing.open(path)


@given(capacity=st.sampled_from([8 * br.PAGE, 64 * br.PAGE]),
       header=st.sampled_from([0, 4 * br.PAGE, 16 * br.PAGE, 2**40]),
       position=st.integers(0, 80).map(lambda page: page * br.PAGE),
       length=st.sampled_from([0, 1, 4 * br.PAGE]))
@settings(max_examples=40)
def test_a_ring_file_whose_header_is_not_its_size_refuses_every_reference(
        capacity: int, header: int, position: int, length: int) -> None:
    """A ring file truncated or grown after its writers began (its header names another
    capacity): positions modulo the mapped size would be other bytes, so nothing is read."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        path = ring_file(Path(tmp), br.HEADER_PAGE + capacity, header or None)
        ring = br.BlockRing.open(path)
        try:
            with pytest.raises(ValueError, match="large-message reference"):
                ring.view(br.encode_reference(position, length), 64)
        finally:
            ring.close()


def test_a_view_held_across_close_and_frees_stays_readable(shm_dir: Path) -> None:
    """A reader holds a view: the ring closed under it (its image closed) keeps the mapping
    while the view lives; the driver frees nothing the reader's position holds, and once the reader
    is no longer counted and the block is freed, a new view of it is None."""
    writer = br.BlockRing.create(shm_dir / "z.blocks", MAX_MESSAGE)
    reader = br.BlockRing.open(shm_dir / "z.blocks")
    try:
        start = writer.reserve(100 * KIB, PID)
        fill(writer, start, 100 * KIB, 7)
        writer.commit(start, 64)
        reference = br.encode_reference(start, 100 * KIB)
        view = reader.view(reference, 64)
        assert view is not None
        writer.reclaim(0, 64)  # the reader is at 0, before the reference: held
        assert bytes(view) == expected(100 * KIB, 7)
        reader.close()  # the view keeps the mapping
        assert bytes(view) == expected(100 * KIB, 7)
        assert reader.view(reference, 64) is None, "a closed ring gives nothing"
        view.release()
        writer.reclaim(64, 64)  # the reader moved on (or was dropped): freed
        again = br.BlockRing.open(shm_dir / "z.blocks")
        try:
            assert again.view(reference, 64) is None
        finally:
            again.close()
    finally:
        reader.close()
        writer.close()


def test_a_reader_dropped_holding_a_view_reads_on_without_a_fault(shm_dir: Path) -> None:
    """The driver may free (MADV_REMOVE) a block a dropped reader still has a view of: the
    view reads on (zeroes once the pages went back; whatever a writer puts there next), it
    does not fault. That reader's frame is then no longer delivered (view() gives None)."""
    writer = br.BlockRing.create(shm_dir / "w.blocks", MAX_MESSAGE)
    reader = br.BlockRing.open(shm_dir / "w.blocks")
    try:
        start = writer.reserve(MAX_MESSAGE, PID)
        fill(writer, start, MAX_MESSAGE, 3)
        writer.commit(start, 64)
        view = reader.view(br.encode_reference(start, MAX_MESSAGE), 64)
        assert view is not None
        writer.reclaim(64, 64)
        # as the driver frees past the warm beginning: the pages go back to /dev/shm
        writer._mmap.madvise(mmap.MADV_REMOVE, br.HEADER_PAGE, writer.capacity)
        assert len(bytes(view)) == MAX_MESSAGE
        assert reader.view(br.encode_reference(start, MAX_MESSAGE), 64) is None
        view.release()
    finally:
        reader.close()
        writer.close()


def test_a_block_is_read_only_through_the_frame_its_writer_bound_it_to(shm_dir: Path) -> None:
    """A block still being filled is refused to any reference (its payload is half written);
    once its writer has claimed its reference frame and bound the block to it (before the
    frame is committed), only a reference in that frame (ending at that stream position) gets
    it; a reference elsewhere in the log (forged, replayed, duplicated) is refused, named,
    before and after the block is committed."""
    writer = br.BlockRing.create(shm_dir / "b.blocks", MAX_MESSAGE)
    reader = br.BlockRing.open(shm_dir / "b.blocks")
    try:
        start = writer.reserve(100 * KIB, PID)
        reference = br.encode_reference(start, 100 * KIB)
        fill(writer, start, 50 * KIB, 4)
        with pytest.raises(br.CorruptReferenceError, match="still being filled"):
            reader.view(reference, 128)
        fill(writer, start, 100 * KIB, 4)
        writer.bind(start, 128)
        for commit in (False, True):
            if commit:
                writer.commit(start, 128)
            assert outcome(reader, reference, 128) == expected(100 * KIB, 4)
            for elsewhere in (64, 192, 1 << 40):
                with pytest.raises(br.CorruptReferenceError,
                                   match=f"bound to the reference frame ending at stream "
                                         f"position 128, not to this one ending at {elsewhere}"):
                    reader.view(reference, elsewhere)
    finally:
        reader.close()
        writer.close()


def test_a_dead_writers_bound_block_keeps_its_frame(shm_dir: Path) -> None:
    """A writer that bound its block and committed the frame dies before it commits the block:
    the driver commits it where the writer bound it, so its frame still gets it, and frees it
    once readers pass that frame."""
    ring = br.BlockRing.create(shm_dir / "d.blocks", MAX_MESSAGE)
    try:
        dead = 2**22 + 1
        start = ring.reserve(1000, dead)
        fill(ring, start, 1000, 9)
        ring.bind(start, 128)
        assert ring.reclaim(64, 4096, is_alive=lambda pid: pid != dead) == 0
        assert outcome(ring, br.encode_reference(start, 1000), 128) == expected(1000, 9)
        assert ring.reclaim(128, 4096, is_alive=lambda pid: pid != dead) > 0
    finally:
        ring.close()
