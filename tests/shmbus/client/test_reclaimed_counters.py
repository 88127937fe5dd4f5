"""A process stopped past its liveness holds counter ids the driver has freed and may have
handed to another reader. Resumed, it must neither read a log no longer held for it nor write
a counter that is no longer its own: its images stop, its heartbeat thread stops, and its next
poll (or the poll it was stopped in) raises ClientTimeoutError."""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path

import psutil
import pytest

import shmbus
from shmbus import AtomicBuffer, ExclusivePublication, Image
from shmbus.shm._native import Heartbeat, epoch_ms
from shmbus.shm.counters import (
    COUNTER_LENGTH,
    METADATA_LENGTH,
    RECORD_RECLAIMED,
    CountersManager,
)
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position
from tests.support.waits import holds_for, wait_until
from tests.support.workers import reclaim_workers as rw

STREAM = rw.STREAM


class Clock:
    now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def counters(clock: Clock) -> CountersManager:
    return CountersManager(AtomicBuffer(mmap.mmap(-1, 16 * METADATA_LENGTH)),
                           AtomicBuffer(mmap.mmap(-1, 16 * COUNTER_LENGTH)),
                           free_to_reuse_timeout_ms=1000, clock=clock)


def test_an_image_stops_once_its_counter_is_freed_and_never_writes_the_next_owners(
        tmp_path: Path) -> None:
    clock = Clock()
    manager = counters(clock)
    log = LogBuffer.create(tmp_path / "pub.log", term_length=65536, initial_term_id=0,
                           mtu=1408, session_id=1, stream_id=STREAM)
    limit = Position(manager.values, manager.counter_offset(manager.allocate("pub-lmt")))
    limit.set(1 << 20)
    publication = ExclusivePublication(log, limit)
    sub_pos = manager.allocate("sub-pos", registration_id=7, reference_id=8)
    image = Image(log, Position(manager.values, manager.counter_offset(sub_pos)), owned=True)
    got: list[bytes] = []
    for i in range(4):
        assert publication.offer(bytes([i]) * 8) > 0
    assert image.poll(lambda buffer, header: got.append(bytes(buffer)), 2) == 2
    assert manager.get_value(sub_pos) == image.position == 2 * 64
    assert not image.is_reclaimed

    manager.free(sub_pos)  # the driver timed the reader's client out
    assert image.is_reclaimed
    assert image.poll(lambda buffer, header: got.append(bytes(buffer)), 10) == 0
    assert got == [bytes([0]) * 8, bytes([1]) * 8]

    clock.now_ms += 1001
    assert manager.allocate("sub-pos of another reader", registration_id=9) == sub_pos
    manager.values.put_int64_release(manager.counter_offset(sub_pos), 4096)
    image.position = 3 * 64  # a store by the old image, as a poll would make
    assert manager.get_value(sub_pos) == 4096, "the new owner's position was overwritten"
    assert image.poll(lambda buffer, header: got.append(bytes(buffer)), 10) == 0


def test_an_image_whose_counter_is_reused_under_it_without_a_free_seen_stops(
        tmp_path: Path) -> None:
    """The ids match (same subscription, same reference) but the value is not what it stored:
    someone else writes the counter; the image lets it be."""
    manager = counters(Clock())
    log = LogBuffer.create(tmp_path / "pub.log", term_length=65536, initial_term_id=0,
                           mtu=1408, session_id=1, stream_id=STREAM)
    sub_pos = manager.allocate("sub-pos", registration_id=7, reference_id=8)
    image = Image(log, Position(manager.values, manager.counter_offset(sub_pos)), owned=True)
    manager.values.put_int64_release(manager.counter_offset(sub_pos), 640)
    image.position = 64
    assert image.is_reclaimed and manager.get_value(sub_pos) == 640


def test_a_heartbeat_stops_writing_a_counter_that_is_no_longer_its_own() -> None:
    clock = Clock()
    manager = counters(clock)
    counter_id = manager.allocate("client-heartbeat", registration_id=42)
    heartbeat = Heartbeat(manager.values, manager.counter_offset(counter_id), 0.01,
                          owner_id=42)
    try:
        first = manager.get_value(counter_id)
        wait_until(lambda: manager.get_value(counter_id) != first, 10, "the heartbeat to beat")
        manager.free(counter_id)
        clock.now_ms += 1001
        assert manager.allocate("someone's position", registration_id=43) == counter_id
        manager.values.put_int64_release(manager.counter_offset(counter_id), 12345)
        # a negative check, watched for ten heartbeat intervals: the counter is no longer its
        # own, so the heartbeat writes nothing (the thread leaves its loop; nothing shows when)
        holds_for(lambda: manager.get_value(counter_id) == 12345, 0.1,
                  "the new owner's value, untouched by the old heartbeat")
    finally:
        heartbeat.stop()


# -- real processes ------------------------------------------------------------------------------

def test_a_reader_stopped_past_its_liveness_leaves_the_next_owner_of_its_counters_alone(
        bus_context: shmbus.Context, driver) -> None:
    """The stopped reader's client is timed out; a new reader's client gets its counter ids;
    the writer laps the stopped reader's log. Resumed, the stopped reader delivers nothing in
    a later poll and its poll raises ClientTimeoutError; the new reader loses nothing."""
    spawn = mp.get_context("spawn")
    stopped_report, steady_report = spawn.Queue(), spawn.Queue()
    total, stop_at = 100_000, 100
    processes = []
    try:
        with shmbus.connect(bus_context) as bus:
            publication = bus.add_exclusive_publication("aeron:ipc", rw.STREAM)
            processes.append(spawn.Process(target=rw.stopping_reader,
                                           args=(bus_context, stop_at, stopped_report)))
            processes[0].start()
            stopped_ids = stopped_report.get(timeout=30)
            seq = 0

            def offer_next() -> bool:
                nonlocal seq
                taken = publication.offer(rw.message(seq)) > 0
                seq += taken
                return taken

            wait_until(lambda: psutil.Process(processes[0].pid).status()
                       == psutil.STATUS_STOPPED, 60, "the reader to stop itself",
                       poll=offer_next)
            # the driver times the stopped reader out and frees its counters; once their reuse
            # deadline passes, the next client may be given them
            wait_until(lambda: all(bus.counters.counter(c).state == RECORD_RECLAIMED
                                   and bus.counters.get_free_for_reuse_deadline(c) < epoch_ms()
                                   for c in stopped_ids), 30,
                       "the stopped reader dropped and its counters free for reuse")
            processes.append(spawn.Process(target=rw.steady_reader,
                                           args=(bus_context, total, steady_report)))
            processes[1].start()
            steady_ids = steady_report.get(timeout=30)
            assert stopped_ids & steady_ids, "the new reader did not get a reclaimed counter id"
            while seq < total:
                publication.publish(rw.message(seq), timeout=10)
                seq += 1
                if seq == total // 2:
                    os.kill(processes[0].pid, signal.SIGCONT)
            outcome, in_order, stop_poll, polls, after_stop = stopped_report.get(timeout=30)
            got = steady_report.get(timeout=60)
    finally:
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGCONT)
            process.join(10)
            if process.is_alive():
                process.kill()
    assert outcome == "ClientTimeoutError"
    assert in_order, "the stopped reader read out of order before it stopped"
    assert stop_poll == polls, "it polled again after it was resumed"
    assert all(poll == stop_poll for poll, _ in after_stop)
    assert got and got == list(range(got[0], total)), "the new reader lost or reordered"


def test_a_poll_whose_client_failed_while_its_handler_ran_raises(
        bus_context: shmbus.Context, driver) -> None:
    """Resumed after a stop, the client's conductor thread may fail the client (dropping the
    subscription's lease) while the poll's handler lets go of the GIL: that poll must still
    raise, since what its handler was given may have been reused meanwhile."""
    with shmbus.connect(bus_context) as bus:
        subscription = bus.add_subscription("aeron:ipc", STREAM)
        publication = bus.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: publication.offer(b"handed over") >= 0, 10,
                   "the publication to connect and take a message")

        def fail_the_client_meanwhile(_buffer: memoryview, _header: object) -> None:
            def conductor() -> None:  # what the client's conductor thread does on a timeout
                with contextlib.suppress(shmbus.ClientTimeoutError):
                    bus._timed_out()
            thread = threading.Thread(target=conductor)
            thread.start()
            thread.join()  # the handler lets go of the GIL here, as a slow one would

        wait_until(lambda: subscription.images, 10, "the subscription's image")
        with pytest.raises(shmbus.ClientTimeoutError):  # this poll, not the next one
            subscription.poll(fail_the_client_meanwhile, 10, timeout=5)
