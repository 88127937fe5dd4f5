"""IPC flow control (shmbus.driver.ipc_flow_control and the C core's publisher self-raise) on
positions no well-behaved reader writes: below the start of the log, and beyond the writer."""

from __future__ import annotations

import mmap
from pathlib import Path

from shmbus import ExclusivePublication
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.counters import COUNTER_LENGTH
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position

TERM = 64 * 1024
WINDOW = TERM // 2
PAYLOAD = b"m" * 992  # 1024-byte frames


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
