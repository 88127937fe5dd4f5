"""An image whose writer lapped it (the driver stopped counting the reader: it timed out, or
was untethered and resting, or its process was stopped in the middle of a poll) delivers none of
the rewritten frames: the term ids in their headers are a later term's. Padding, which carries
no term id when the driver wrote it, is read past as ever."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from shmbus import ConcurrentPublication, ExclusivePublication, Image
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.driver.log_unblocker import unblock
from shmbus.shm._native import AtomicBuffer, SubscriptionCore
from shmbus.shm.log_buffer import PARTITION_COUNT, TAIL_COUNTERS_OFFSET, LogBuffer
from shmbus.shm.position import Position

TERM = 64 * 1024
FRAME = 1024
PAYLOAD = b"p" * (FRAME - 32)


def lapped_image(directory: Path, laps: int) -> tuple[Image, ExclusivePublication]:
    """An image left at position 0 while its writer went ``laps`` times round the log, the
    terms cleaned behind the writer as the driver does once it no longer counts the reader."""
    log = LogBuffer.create(directory / "pub.log", term_length=TERM, initial_term_id=-5,
                           mtu=1408, session_id=3, stream_id=1)
    positions = AtomicBuffer(mmap.mmap(-1, 4096))
    limit, reader = Position(positions, 0), Position(positions, 64)
    flow = IpcFlowControl(log, limit)
    log.is_connected = True
    publication = ExclusivePublication(log, limit)
    image = Image(log, reader)
    target = laps * PARTITION_COUNT * TERM + 8 * FRAME
    while publication.position < target:
        flow.clean_to(publication.position - TERM)
        limit.set(publication.position + TERM // 2)
        assert publication.offer(PAYLOAD) > 0 or publication.offer(PAYLOAD) > 0
    return image, publication


@pytest.mark.parametrize("laps", [0, 1, 2])
def test_a_lapped_image_delivers_no_frame_of_a_later_term(tmp_path: Path, laps: int) -> None:
    image, _ = lapped_image(tmp_path, laps)
    got: list[int] = []
    polled = image.poll(lambda buffer, header: got.append(header.term_id), 100)
    if laps == 0:  # not lapped: the first term, as written
        assert polled == 8 and got == [-5] * 8
        return
    assert (polled, got, image.position) == (0, [], 0)
    assert image.controlled_poll(lambda buffer, header: got.append(header.term_id), 100) == 0
    assert image.poll_batch(lambda batch: got.append(len(batch)), 100) == 0
    subscription = SubscriptionCore()
    subscription.images = (image,)
    assert list(subscription.messages(timeout=0)) == []
    assert got == [] and image.position == 0


def test_padding_the_driver_wrote_over_a_dead_writers_gap_is_read_past(tmp_path: Path) -> None:
    """The unblocker pads a reservation a dead writer never wrote (a zero gap) with a header of
    type and length only, its term id left zero: readers skip it as any padding."""
    log = LogBuffer.create(tmp_path / "pub.log", term_length=TERM, initial_term_id=-5,
                           mtu=1408, session_id=3, stream_id=1)
    positions = AtomicBuffer(mmap.mmap(-1, 4096))
    limit, reader = Position(positions, 0), Position(positions, 64)
    limit.set(TERM // 2)
    log.is_connected = True
    publication = ConcurrentPublication(log, limit)
    assert publication.offer(PAYLOAD) == FRAME
    tail = log.meta_offset + TAIL_COUNTERS_OFFSET
    log.buffer.put_int64_release(tail, log.buffer.get_int64_acquire(tail) + FRAME)  # reserved
    assert publication.offer(PAYLOAD) == 3 * FRAME  # and never written: a zero gap before it
    assert unblock(log, FRAME, 3 * FRAME)
    image = Image(log, reader)
    offsets: list[int] = []
    assert image.poll(lambda buffer, header: offsets.append(header.term_offset), 10) == 2
    assert offsets == [0, 2 * FRAME] and image.position == 3 * FRAME


def test_a_lapped_image_left_inside_a_later_frame_stops_without_an_error(
        tmp_path: Path) -> None:
    """Lapped by frames of another size, the reader's offset falls inside a later frame: what it
    finds there is payload, not a length. It stops there as at any lapped frame (it used to
    raise 'corrupt log', which killed a reader paused past its liveness)."""
    log = LogBuffer.create(tmp_path / "pub.log", term_length=TERM, initial_term_id=-5,
                           mtu=1408, session_id=3, stream_id=1)
    positions = AtomicBuffer(mmap.mmap(-1, 4096))
    limit, reader = Position(positions, 0), Position(positions, 64)
    flow = IpcFlowControl(log, limit)
    limit.set(TERM // 2)
    log.is_connected = True
    publication = ExclusivePublication(log, limit)
    image = Image(log, reader)
    for _ in range(8):
        assert publication.offer(PAYLOAD) > 0
    assert image.poll(lambda buffer, header: None, 3) == 3 and image.position == 3 * FRAME
    larger = b"\x7f" * (1280 - 32)  # 1280-byte frames: offset 3 * 1024 is inside one
    while publication.position < PARTITION_COUNT * TERM + 8 * 1280:
        flow.clean_to(publication.position - TERM)
        limit.set(publication.position + TERM // 2)
        assert publication.offer(larger) > 0 or publication.offer(larger) > 0
    got: list[int] = []
    assert image.poll(lambda buffer, header: got.append(header.term_id), 100) == 0
    assert image.poll_batch(lambda batch: got.append(len(batch)), 100) == 0
    assert image.controlled_poll(lambda buffer, header: got.append(header.term_id), 100) == 0
    assert got == [] and image.position == 3 * FRAME
