"""IpcFlowControl against a real log and counters, the driver's side of the native limit.

The publisher's own raise is exercised with real processes in tests/shmbus/test_waiting.py;
here the owner's calls are checked, including positions no honest reader would write.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.publication import ExclusivePublication
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.counters import COUNTER_LENGTH
from shmbus.shm.log_buffer import FC_CLEAN_POSITION_OFFSET, FC_LOCK_OFFSET, LogBuffer
from shmbus.shm.position import Position

TERM = 65536


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
