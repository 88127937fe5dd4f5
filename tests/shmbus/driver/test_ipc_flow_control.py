"""IpcFlowControl against a real log and counters, the driver's side of the native limit.

The publisher's own raise is exercised with real processes in tests/shmbus/streams/test_waiting.py;
here the owner's calls are checked, including positions no honest reader would write.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.driver.log_history import JoinPositionGone, pin_join
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.counters import COUNTER_LENGTH
from shmbus.shm.log_buffer import FC_CLEAN_POSITION_OFFSET, FC_LOCK_OFFSET, LogBuffer
from shmbus.shm.position import Position
from shmbus.streams.image import Image
from shmbus.streams.publication import ExclusivePublication

TERM = 65536
WINDOW = TERM // 2
PAYLOAD = b"m" * 992  # 1024-byte frames


@pytest.fixture
def setup(tmp_path: Path):
    log = LogBuffer.create(tmp_path / "pub.log", term_length=TERM, initial_term_id=-7, mtu=1408,
                           session_id=1, stream_id=2)
    log.is_connected = True
    values = AtomicBuffer(mmap.mmap(-1, 16 * COUNTER_LENGTH))
    limit = Position(values, 0)
    reader = Position(values, COUNTER_LENGTH)  # counter id 1
    flow = IpcFlowControl(log, limit)
    flow.set_counted([1])
    flow.update([0])
    publication = ExclusivePublication(log, limit, counters=values)
    yield log, flow, limit, reader, publication
    publication.close()
    log.close()


def clean_position(log: LogBuffer) -> int:
    return log.buffer.get_int64_acquire(log.meta_offset + FC_CLEAN_POSITION_OFFSET)


def test_the_limit_is_the_reader_plus_the_window_and_the_publisher_raises_it(setup) -> None:
    log, flow, limit, reader, publication = setup
    assert limit.get() == flow.window == TERM // 2
    while publication.offer(b"m" * 100) > 0:
        pass
    assert publication.position >= flow.window - 160
    reader.set(publication.position)
    # no owner call: the publisher raises its own limit from the counted reader
    assert publication.offer(b"m" * 100) > 0
    assert limit.get() == reader.get() + flow.window
    assert clean_position(log) == reader.get()


def test_positions_nobody_wrote_are_held_between_zero_and_the_producer(setup) -> None:
    log, flow, limit, reader, publication = setup
    for _ in range(10):
        assert publication.offer(b"m" * 100) > 0
    produced = publication.position
    flow.clean_to(-5 * TERM)  # before the stream began: nothing to clean, nothing touched
    assert clean_position(log) == 0
    flow.update([2**62])  # a scribbled reader position: cleaning stops at what was written
    assert clean_position(log) == produced
    assert limit.get() == produced + flow.window
    reader.set(2**62)
    assert publication.offer(b"m" * 100) > 0  # the publisher's own raise is held the same way
    assert limit.get() <= publication.position + flow.window


def test_a_dead_lock_holder_is_released_on_the_second_look(setup) -> None:
    log, flow, limit, reader, publication = setup
    lock = log.meta_offset + FC_LOCK_OFFSET
    while publication.offer(b"m" * 100) > 0:
        pass
    read = publication.position  # past the trip gain: worth a move
    assert log.buffer.compare_and_set_int64(lock, 0, 424242)
    before = limit.get()
    reader.set(read)
    flow.update([read])  # the lock is busy: the move waits
    assert limit.get() == before
    assert not flow.release_dead_lock(lambda pid: pid != 424242)  # first sight: wait
    assert not flow.release_dead_lock(lambda pid: True)  # a live holder keeps it
    assert flow.release_dead_lock(lambda pid: False)  # seen twice, dead: released
    flow.update([read])
    assert limit.get() == read + flow.window



def make_log(directory: Path) -> tuple[LogBuffer, Position, Position, AtomicBuffer]:
    """A log, its limit, and a reader's position counter (id 1) in a counter values buffer."""
    log = LogBuffer.create(directory / "pub.log", term_length=TERM, initial_term_id=0,
                           mtu=1408, session_id=7, stream_id=1)
    values = AtomicBuffer(mmap.mmap(-1, 4 * COUNTER_LENGTH))
    limit = Position(values, 0)
    reader = Position(values, COUNTER_LENGTH)
    return log, limit, reader, values


def test_cleaning_to_a_position_below_the_log_start_does_nothing(tmp_path: Path) -> None:
    """A network publication's owner cleans a term behind the sender: before the sender is a
    term in, that is below 0. It used to move the clean position negative, and the next clean
    indexed a term before the first (a segfault)."""
    log, limit, _, _ = make_log(tmp_path)
    flow = IpcFlowControl(log, limit)
    limit.set(WINDOW)
    log.is_connected = True
    publication = ExclusivePublication(log, limit)
    for _ in range(8):
        assert publication.offer(PAYLOAD) > 0
    flow.clean_to(8 * 1024 - TERM)
    flow.clean_to(4 * 1024)
    terms = log.buffer
    assert terms.get_int32(0) == 0 and terms.get_int32(3 * 1024) == 0  # consumed: cleaned
    assert terms.get_int32(4 * 1024) == 1024 and terms.get_int32(7 * 1024) == 1024  # kept


def test_a_reader_counter_beyond_the_writer_moves_the_limit_one_window(tmp_path: Path) -> None:
    """A publisher raises its own limit from the counted readers' positions. A reader counter
    scribbled beyond the writer (a buggy or hostile client) counts as the writer's position:
    the limit goes one window past the writer, and cleaning stops at the writer (at 2**63 - 1
    it used to zero the log for ever, holding the flow-control lock)."""
    log, limit, reader, values = make_log(tmp_path)
    flow = IpcFlowControl(log, limit)
    flow.set_counted([1])
    flow.update([0])
    log.is_connected = True
    publication = ExclusivePublication(log, limit, counters=values)

    while (position := publication.offer(PAYLOAD)) > 0:
        assert position <= WINDOW
    reader.set(2 * TERM)
    assert publication.offer(PAYLOAD) == WINDOW + 1024
    assert limit.get() == 2 * WINDOW
    assert log.buffer.get_int32(WINDOW) == 1024  # the frame written after the raise is intact


def test_a_publisher_does_not_raise_a_limit_counter_that_is_no_longer_its_own(setup) -> None:
    """A publisher stopped past its liveness may find its pub-lmt freed (registration id
    cleared) and reused: it must not write someone else's counter."""
    _, _, limit, reader, publication = setup
    while publication.offer(PAYLOAD) > 0:
        pass
    limit.buffer.put_int64_release(limit.offset + 8, 99)  # freed, then another registration's
    limit.set(7)  # the new owner's value
    reader.set(publication.position)
    assert publication.offer(PAYLOAD) < 0
    assert limit.get() == 7


def test_a_joiner_counted_behind_the_clean_position_finds_its_start_gone(setup) -> None:
    """A subscriber joining with a join-position is counted only after the driver checked its
    start; a clean may pass that start meanwhile. The clean position must not move back to the
    joiner (it once did, hiding the zeroed start: the joiner read zeros for ever), so pinning
    the join refuses a strict position and moves an 'earliest' join up to the clean."""
    log, flow, limit, reader, publication = setup
    for _ in range(30):
        assert publication.offer(PAYLOAD) > 0
    reader.set(publication.position)
    flow.clean_to(24 * 1024)
    assert clean_position(log) == 24 * 1024
    joiner = Position(limit.buffer, 2 * COUNTER_LENGTH)  # counter id 2, checked at 8 KiB
    joiner.set(8 * 1024)
    flow.set_counted([1, 2])
    flow.update([reader.get(), joiner.get()])
    flow.clean_to(joiner.get())
    assert clean_position(log) == 24 * 1024
    with pytest.raises(JoinPositionGone, match=r"join-position 8192 is gone \(cleaned while "
                                               r"joining\): .* holds positions 24576 to"):
        pin_join(log, joiner, 8 * 1024, strict=True)
    assert pin_join(log, joiner, 8 * 1024, strict=False) == 24 * 1024
    assert joiner.get() == 24 * 1024
    assert log.buffer.get_int32(24 * 1024) == 1024  # a frame starts where it now reads


@pytest.mark.parametrize("marked", [True, False])
def test_the_readers_of_a_log_marked_raised_by_readers_raise_its_limit(setup,
                                                                       marked: bool) -> None:
    """An Aeron client's publication only reads its limit: the driver marks its log, and a
    shmbus reader storing its position raises the limit from the counted set (an unmarked
    log's readers leave it to the publisher)."""
    log, flow, limit, reader, publication = setup
    if marked:
        log.raised_by_readers(0)  # the limit is counter 0
    offers = 0
    while offers < TERM and publication.offer(PAYLOAD) > 0:  # to its limit (a window)
        offers += 1
    written = publication.position
    assert limit.get() == flow.window and written > flow.window - len(PAYLOAD) - 64
    image = Image(log, reader, owned=True)
    delivered = image.poll(lambda buffer, header: None, offers)
    assert delivered == offers and reader.get() == written
    assert limit.get() == (written + flow.window if marked else flow.window)
    if marked:
        assert clean_position(log) == written
    image.close()
