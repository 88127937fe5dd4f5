"""Waiting without spinning, and a client that sees the driver without being polled.

Real processes (spawn) on a real bus with its driver process. Readers that block in
``poll(..., timeout=)``, ``wait()`` and ``messages()`` are woken by the writer; a
back-pressured ``publish()`` sleeps until the reader moves; a subscriber that never polls still
sees publishers come and go; the publication limit follows the reader with the driver stopped
(publishers raise it themselves). CPU bounds here are generous correctness checks (a waiting
process sleeps), not performance figures: those are tools/bench/ipc.py's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import shmbus
from shmbus.shm.log_buffer import FC_LOCK_OFFSET
from tests.support.paced_publisher import publish_in_bursts
from tests.support.processes import assert_clean
from tests.support.waits import wait_until
from tests.support.workers import driver_workers as dw
from tests.support.workers.waiting_workers import blocking_reader, hands_off_subscriber

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("use_messages", [False, True], ids=["poll-timeout", "messages"])
def test_a_blocked_reader_sleeps_until_the_writer_wakes_it(bus_context, driver, procs,
                                                           use_messages):
    stream, count = 61, 4000
    procs.start(blocking_reader, bus_context, stream, count, procs.queue, 60.0,
                use_messages=use_messages)
    procs.wait("sub-ready")
    (quiet,) = procs.wait("quiet", timeout=30)
    assert quiet["ready"] is False and quiet["wall"] >= 0.95
    assert quiet["cpu"] < 0.2, f"a reader waiting 1 s on nothing used {quiet['cpu']:.3f} s CPU"
    # paced: the reader catches up and sleeps between bursts, and is woken for each
    pub = publish_in_bursts(procs, bus_context, stream, count, 40)
    (sub,) = procs.wait("sub", timeout=60)
    assert_clean(sub)
    assert pub["sent"] == count and sub["counts"] == {1: count}


def test_a_back_pressured_publish_sleeps_until_the_subscriber_moves(bus_context, driver, procs):
    stream, count = 62, 3000
    procs.start(dw.subscriber, bus_context, "aeron:ipc", stream, "slow", count, procs.queue,
                60.0, sleep_per_batch=0.01, batch=50)
    procs.wait("sub-ready")
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", stream)
        wait_until(lambda: pub.is_connected, 10, "the subscriber's image")
        cpu, wall = time.process_time(), time.monotonic()
        for seq in range(count):
            pub.publish(dw.make_message(1, seq), timeout=30)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    (sub,) = procs.wait("sub", timeout=60)
    assert_clean(sub)
    assert sub["counts"] == {1: count}
    # ~1.2 MB through a 32 KiB window to a reader taking 50 messages per 10 ms: held back
    # most of the time, and asleep while held back
    assert wall > 0.4
    assert cpu < 0.5 * wall, f"publish() used {cpu:.2f} s CPU in {wall:.2f} s held back"


def test_a_subscriber_that_never_polls_sees_publishers_come_and_go(bus_context, driver, procs):
    stream = 63
    procs.start(hands_off_subscriber, bus_context, stream, procs.queue, 60.0)
    procs.wait("sub-ready")
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", stream)
        (connected,) = procs.wait("connected", timeout=30)
        assert connected["connected"] and connected["sessions"] == [pub.session_id]
        assert pub.is_connected  # nobody polled here either
        pub.close()
        (gone,) = procs.wait("disconnected", timeout=30)
    assert gone["connected"] is False
    assert gone["events"] == [("available", pub.session_id), ("unavailable", pub.session_id)]


def test_the_limit_follows_the_reader_with_the_driver_stopped(bus_context, driver, procs):
    stream = 64
    window = bus_context.ipc_term_length // 2
    count = 8 * window // 128  # eight windows of 128-byte frames (and more: bodies vary)
    procs.start(dw.subscriber, bus_context, "aeron:ipc", stream, "reader", count, procs.queue,
                60.0)
    procs.wait("sub-ready")
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", stream)
        wait_until(lambda: pub.is_connected, 10, "the subscriber's image")
        pub.publish(dw.make_message(1, 0))
        os.kill(driver.pid, signal.SIGSTOP)
        try:
            # well within driver_timeout: nobody may notice the driver is stopped
            for seq in range(1, count):
                pub.publish(dw.make_message(1, seq), timeout=3)
            assert pub.position > 4 * window
        finally:
            os.kill(driver.pid, signal.SIGCONT)
    (sub,) = procs.wait("sub", timeout=60)
    assert_clean(sub)
    assert sub["counts"] == {1: count}


def test_a_client_that_only_waits_learns_that_the_driver_died(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        sub = bus.add_subscription("aeron:ipc", 65)
        driver.kill()
        driver.wait(10)
        killed = time.monotonic()
        with pytest.raises(shmbus.DriverTimeoutError, match="heartbeated"):
            sub.wait(60)
        # the conductor thread noticed, no call of ours did: within the timeout and a tick
        assert time.monotonic() - killed < bus_context.driver_timeout + 2
        with pytest.raises(shmbus.DriverTimeoutError):
            sub.poll(lambda buffer, header: None, 10)
        with pytest.raises(shmbus.DriverTimeoutError):
            bus.add_subscription("aeron:ipc", 66)


def test_waits_and_polls_check_their_arguments_and_time_out(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        sub = bus.add_subscription("aeron:ipc", 67)
        handler = lambda buffer, header: None  # noqa: E731
        began = time.monotonic()
        assert sub.poll(handler, 10, timeout=0.05) == 0
        assert sub.wait(0.05) is False
        assert time.monotonic() - began >= 0.1
        with pytest.raises(ValueError, match="timeout"):
            sub.poll(handler, 10, timeout=-1)
        with pytest.raises(ValueError, match="fragment_limit"):
            sub.poll(handler, -1)
        with pytest.raises(ValueError, match="timeout"):
            sub.wait(-0.5)
        with pytest.raises(TypeError, match="poll"):
            sub.poll(handler, 10, wait=1)
        pub = bus.add_exclusive_publication("aeron:ipc", 67)
        wait_until(lambda: sub.is_connected, 10, "the image")
        pub.publish(b"x" * 40)
        assert sub.wait(5) is True
        got = []
        assert sub.poll(lambda buffer, header: got.append(bytes(buffer)), timeout=5) == 1
        assert got == [b"x" * 40]


def test_a_dead_holder_of_the_flow_control_lock_is_released(bus_context, driver, procs):
    stream, count = 68, 2000
    procs.start(dw.subscriber, bus_context, "aeron:ipc", stream, "reader", count, procs.queue,
                60.0)
    procs.wait("sub-ready")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", stream)
        wait_until(lambda: pub.is_connected, 10, "the subscriber's image")
        lock = pub.log.meta_offset + FC_LOCK_OFFSET
        # a publisher killed while it held the lock: nobody may raise the limit until the
        # driver sees the holder is dead and frees it
        assert pub.log.buffer.compare_and_set_int64(lock, 0, dead.pid)
        for seq in range(count):
            pub.publish(dw.make_message(1, seq), timeout=10)
        assert pub.log.buffer.get_int64_acquire(lock) == 0
    (sub,) = procs.wait("sub", timeout=60)
    assert_clean(sub)
    assert sub["counts"] == {1: count}
