"""A wait looks before it sleeps (Context.wait_spin), and publish() accepted at once is one
native offer.

The spin is seen from outside, in the log's metadata: a reader waiting in ``messages()``
counts itself among the log's sleepers (the word its writer checks before paying a wake-up)
only once its spin is over. Real processes on a real bus with its driver process.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

import pytest

import shmbus
from shmbus.shm.log_buffer import DATA_WAKE_OFFSET, PARTITION_COUNT
from tests.support.processes import Processes
from tests.support.sleepers import cpu_seconds, readers_asleep
from tests.support.waits import wait_until
from tests.support.workers.driver_workers import make_message
from tests.support.workers.waiting_workers import blocking_reader, waiting_reader

pytestmark = pytest.mark.timeout(120)


def _sleeping_within(publication: shmbus.Publication, seconds: float) -> float | None:
    """Seconds until a reader of ``publication`` counts as asleep, or None within ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if readers_asleep(publication.log):
            return time.monotonic() - start
        time.sleep(0.005)
    return None


def _start_waiting_reader(bus: shmbus.Client, procs: Processes, context: shmbus.Context,
                          stream: int) -> tuple[shmbus.Publication, Any]:
    """A publication on ``stream`` once a reader process (waiting_reader) subscribed with
    ``context`` is connected to it, and the reader process."""
    publication = bus.add_exclusive_publication("aeron:ipc", stream)
    reader = procs.start(waiting_reader, context, stream, procs.queue, 30.0)
    procs.wait("sub-ready")
    wait_until(lambda: publication.is_connected, 10, "the reader's image")
    return publication, reader


@pytest.mark.parametrize("wait_spin", [0.0, 0.6], ids=["no-spin", "spin-0.6s"])
def test_a_waiting_reader_spins_for_wait_spin_then_sleeps(bus_context, driver, procs,
                                                          wait_spin):
    stream = 71
    reader_context = dataclasses.replace(bus_context, wait_spin=wait_spin)
    with shmbus.connect(bus_context) as bus:
        publication, _ = _start_waiting_reader(bus, procs, reader_context, stream)
        asleep_after = _sleeping_within(publication, 10.0)
        assert asleep_after is not None, "the reader never went to sleep"
        if wait_spin:
            # it looked (not counted as a sleeper, so a writer would pay no wake-up) for about
            # its spin before it slept; the lower bound leaves the reader's start-up out
            assert asleep_after >= 0.5 * wait_spin
        else:
            assert asleep_after < wait_spin + 1.0
        publication.publish(b"wake up")
        (got,) = procs.wait("got", timeout=30)
    assert got["message"] == b"wake up"


def test_a_message_within_the_spin_is_taken_without_a_sleep(bus_context, driver, procs):
    stream = 72
    reader_context = dataclasses.replace(bus_context, wait_spin=5.0)
    with shmbus.connect(bus_context) as bus:
        publication, reader = _start_waiting_reader(bus, procs, reader_context, stream)
        # the reader is in messages(), spinning: past its start-up it runs on the CPU, and
        # nothing but the spin does (its 5 s leave room for a loaded machine)
        spun = cpu_seconds(reader.pid) + 0.1
        wait_until(lambda: cpu_seconds(reader.pid) >= spun, 4, "the reader to spin in messages()")
        assert readers_asleep(publication.log) == 0
        publication.publish(b"in the spin")
        (got,) = procs.wait("got", timeout=30)
        assert readers_asleep(publication.log) == 0
    assert got["message"] == b"in the spin"


def test_publish_accepted_at_once_never_enters_the_python_retry(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_exclusive_publication("aeron:ipc", 73)
        subscription = bus.add_subscription("aeron:ipc", 73)
        wait_until(lambda: publication.is_connected, 10, "the image")
        refused: list[tuple[object, ...]] = []
        retry = publication._publish_refused

        def recording(*args: object) -> int:
            refused.append(args)
            return retry(*args)  # type: ignore[arg-type]

        publication._publish_refused = recording  # type: ignore[method-assign]
        positions = [publication.publish(b"%d" % i, b"-tail", reserved_value=i)
                     for i in range(100)]
        assert positions == sorted(positions) and refused == []
        assert list(subscription.messages(timeout=0)) == [b"%d-tail" % i for i in range(100)]

        # a full window: the first offer is refused, the retry sleeps and then gives up
        with pytest.raises(shmbus.PublicationError, match="not accepted within 0.2 s"):
            for _ in range(publication.term_length // 64):  # a window is at most half a term
                publication.publish(bytes(32), timeout=0.2)
        assert len(refused) == 1
        buffers, result, timeout, reserved = refused[0]
        assert buffers == (bytes(32),) and result == shmbus.codes.BACK_PRESSURED
        assert (timeout, reserved) == (0.2, 0)


def test_publish_names_a_keyword_it_does_not_take(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_exclusive_publication("aeron:ipc", 74)
        with pytest.raises(TypeError, match="unexpected keyword argument 'timout'"):
            publication.publish(b"x", timout=1.0)
        with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
            publication.publish(b"x", reserved_value="seven")


def _data_word(publication: shmbus.Publication) -> int:
    """The log's data wake word: bumped by each reader that goes to sleep and each wake-up."""
    meta = publication.term_length * PARTITION_COUNT
    return publication.log.buffer.get_int32_acquire(meta + DATA_WAKE_OFFSET)


def test_a_sleeping_reader_costs_its_writer_one_wake_up_not_one_per_message(
        bus_context, driver, procs):
    """A reader woken but not yet running (stopped here) stays counted as a sleeper; its writer
    wakes it once and then publishes without a system call, and a later sleep is woken
    again: every message arrives, checked."""
    stream, burst = 75, 40  # within the test bus's window (64 KiB terms)
    reader_context = dataclasses.replace(bus_context, wait_spin=0.0)
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_exclusive_publication("aeron:ipc", stream)
        reader = procs.start(blocking_reader, reader_context, stream, burst + 1, procs.queue,
                             60.0, use_messages=True)
        procs.wait("sub-ready")
        wait_until(lambda: publication.is_connected, 10, "the reader's image")
        procs.wait("quiet", timeout=30)  # now in messages(), asleep once counted
        wait_until(lambda: readers_asleep(publication.log) == 1, 10, "the reader asleep")
        os.kill(reader.pid, signal.SIGSTOP)
        try:
            before = _data_word(publication)
            for seq in range(burst):
                publication.publish(make_message(1, seq))
            bumps = _data_word(publication) - before
            assert readers_asleep(publication.log) == 1  # stopped: woken, not yet running
        finally:
            os.kill(reader.pid, signal.SIGCONT)
        assert bumps == 1, f"{bumps} wake-ups for {burst} messages to one stopped sleeper"
        # it reads the burst, then sleeps again (a new arm): that sleep is woken too
        wait_until(lambda: readers_asleep(publication.log) == 1, 30, "the reader asleep again")
        publication.publish(make_message(1, burst))
        (report,) = procs.wait("sub", timeout=30)
    assert not report["timed_out"] and report["error_count"] == 0, report
    assert report["counts"] == {1: burst + 1}
