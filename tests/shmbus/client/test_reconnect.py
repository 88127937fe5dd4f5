"""Clients that outlive their driver (``reconnect=True``): real processes, a real bus directory.

The driver process is SIGKILLed while a publisher process streams sequenced, crc'd messages to
a subscriber process; a new driver takes the directory over (started by the test, or by a
client itself with ``embedded_driver``). Both clients must report the reconnection, and the
subscriber must see the stream resume on the new session with nothing corrupt or out of order
and no loss but the rule's: the messages the old log held that the subscriber had not read.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import shmbus
from shmbus.client.driver_launch import try_open as _try_open
from shmbus.shm.log_buffer import align
from tests.support.drivers import start_driver, stop_driver
from tests.support.processes import CTX, assert_clean
from tests.support.waits import holds_for, wait_until
from tests.support.workers import driver_workers as dw
from tests.support.workers import reconnect_workers as rw

pytestmark = pytest.mark.timeout(120)

WRITER = 3


def log_positions(count: int, term_length: int) -> list[tuple[int, int]]:
    """Where writer WRITER's messages 0..count-1 start and end in a log of its own (a message
    that does not fit in the rest of a term starts the next; the rest is padding)."""
    spans, position = [], 0
    for seq in range(count):
        length = align(32 + dw.HEAD.size + dw.body_length(WRITER, seq), 32)
        if position % term_length + length > term_length:
            position += term_length - position % term_length
        spans.append((position, position + length))
        position += length
    return spans


def where_it_stopped(position: int, spans: list[tuple[int, int]]) -> int:
    """The last message wholly before ``position``, which must be just after it (or after
    the padding that follows it, at the start of the next term): a position between two of
    ``spans``, the last of which is the message that did not go in."""
    for seq in range(len(spans) - 1):
        if position in (spans[seq][1], spans[seq + 1][0]):
            return seq
    raise AssertionError(f"position {position} is not between two messages")


def test_where_it_stopped_reads_a_position_after_padding_at_a_term_end():
    # the old session ended where a message did not fit its term: padding, then the next term
    spans = [(0, 64), (64, 96), (128, 192)]  # a 128-byte term: 32 bytes of padding at 96
    assert [where_it_stopped(p, spans) for p in (64, 96, 128)] == [0, 1, 1]
    with pytest.raises(AssertionError, match="not between two messages"):
        where_it_stopped(80, spans)


def driver_pid(context: shmbus.Context) -> int | None:
    cnc = _try_open(Path(context.dir), context)
    if cnc is None:
        return None
    pid = cnc.pid
    cnc.close()
    return pid


@pytest.mark.parametrize("embedded", [False, True], ids=["test-starts-driver", "embedded"])
def test_a_stream_resumes_on_a_new_driver_losing_only_what_the_old_log_held(
        bus_context, driver, procs, embedded):
    stream = 71
    context = bus_context.with_(reconnect=True, driver_timeout=2.0, embedded_driver=embedded,
                                driver_idle_timeout=10.0)
    # with its own driver, the subscriber notices first and stops reading the old log while
    # the publisher still fills it: a loss the rule allows, which must then be exactly that
    sub_context = context if embedded else context.with_(driver_timeout=1.0)
    stop = CTX.Event()
    procs.start(rw.reconnecting_subscriber, sub_context, stream, 2000, procs.queue, 60.0)
    procs.wait("sub-ready")
    procs.start(rw.reconnecting_publisher, context, stream, WRITER, stop, procs.queue, 60.0)
    (ready,) = procs.wait("pub-ready")
    procs.wait("sub-streaming", timeout=30)

    old_pid = driver.pid
    driver.kill()
    driver.wait(10)
    new_driver = None if embedded else start_driver(context)
    try:
        (pub_event,) = procs.wait("pub-reconnected", timeout=30)
        (sub_event,) = procs.wait("sub-reconnected", timeout=30)
        new_pid = driver_pid(context)
        procs.wait("sub-resumed", timeout=30)
        stop.set()
        (pub,) = procs.wait("pub", timeout=30)
        (sub,) = procs.wait("sub", timeout=30)
    finally:
        if new_driver is not None:
            stop_driver(new_driver)
        elif (pid := driver_pid(context)) is not None:  # the one a client started
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: not os.path.exists(Path(context.dir) / "cnc.dat"), 10,
                       "the embedded driver to stop")

    # both report it, on their conductor threads: the old driver, the new one, what was lost
    assert new_pid is not None and new_pid != old_pid
    if new_driver is not None:
        assert new_pid == new_driver.pid
    for event in (pub_event, sub_event):
        assert event["thread"].startswith("shmbus-conductor")
        assert (event["report"]["old_driver_pid"], event["report"]["new_driver_pid"]) == (
            old_pid, new_pid)
    (renewed,) = pub_event["report"]["publications"]
    assert pub_event["report"]["subscriptions"] == ()
    old_session = ready["session_id"]
    new_session = renewed["new_session_id"]
    assert (renewed["channel"], renewed["stream_id"], renewed["old_session_id"],
            renewed["error"]) == ("aeron:ipc", stream, old_session, None)
    assert new_session is not None and new_session != old_session
    assert sub_event["report"]["publications"] == ()
    (lost,) = sub_event["report"]["subscriptions"]
    assert (lost["channel"], lost["stream_id"], lost["error"]) == ("aeron:ipc", stream, None)
    (lost_image,) = lost["lost_images"]
    assert lost_image["session_id"] == old_session
    assert sub["unavailable"] == [(old_session, lost_image["position"])]

    # the publisher: one old session, then the new one, without a sequence number lost between
    assert pub["reconnects"] == 1 and pub["ambiguous"] == 0
    assert set(pub["sessions"]) == {old_session, new_session}
    first_old, last_old = pub["sessions"][old_session]
    first_new, last_new = pub["sessions"][new_session]
    assert (first_old, first_new, last_new) == (0, last_old + 1, pub["sent"] - 1)
    spans = log_positions(last_old + 2, context.ipc_term_length)
    assert where_it_stopped(renewed["old_position"], spans) == last_old

    # the subscriber: nothing corrupt or reordered, every message of the new session, and on
    # the old one everything up to where it had read when the driver was noticed dead
    assert_clean(sub)
    assert sub["reconnects"] == 1 and sub["finished"] == [WRITER]
    read_first, read_last, read_count = sub["by_session"][old_session]
    assert (read_first, read_count) == (0, read_last + 1)
    assert sub["by_session"][new_session] == [first_new, last_new, last_new - first_new + 1]
    # the only loss: what the old log held past the subscriber's position
    assert where_it_stopped(lost_image["position"], spans) == read_last
    lost_count = last_old - read_last
    assert embedded or lost_count > 0
    assert sub["gaps"] == ([(WRITER, read_last + 1, first_new)] if lost_count else [])
    print(f"\nsent {pub['sent']}, read {sub['count']}, lost {lost_count} (unread in the old "
          f"log), refused offers {pub['refused']}")


def test_requests_while_reconnecting_wait_for_the_new_driver_or_time_out(bus_context, driver):
    stream = 72
    context = bus_context.with_(reconnect=True, driver_timeout=1.5)
    with shmbus.connect(context) as bus:
        reports: list[tuple[str, shmbus.Reconnected]] = []
        bus.on_reconnect = lambda r: reports.append((threading.current_thread().name, r))
        kept = bus.add_publication("aeron:ipc", stream)
        dropped = bus.add_publication("aeron:ipc", stream + 1)
        sub = bus.add_subscription("aeron:ipc", stream)
        wait_until(lambda: sub.images, 5, "the image")
        got: list[bytes] = []

        def read() -> None:
            sub.poll(lambda b, h: got.append(bytes(b)), 10)

        assert kept.publish(b"before") > 0
        wait_until(lambda: got, 5, "the first message", poll=read)
        reached = kept.position
        driver.kill()
        driver.wait(10)
        wait_until(lambda: not sub.images, 10, "the client to notice the driver died")
        assert kept.offer(b"x") == shmbus.codes.NOT_CONNECTED and kept.position == reached
        assert not kept.is_closed and bus.reconnects == 0

        began = time.monotonic()
        with pytest.raises(shmbus.DriverTimeoutError, match="reconnecting"):
            bus.add_subscription("aeron:ipc", stream)
        assert time.monotonic() - began >= 1.4  # it waited driver_timeout for a new driver
        dropped.close()  # closing works at once while reconnecting
        assert dropped.is_closed and dropped.offer(b"x") == shmbus.codes.CLOSED

        new_driver = start_driver(context)
        try:
            late = bus.add_publication("aeron:ipc", stream)  # waits for the reconnection
            assert bus.reconnects == 1 and late.session_id == kept.session_id
            wait_until(lambda: sub.images, 5, "the image from the new driver")
            assert kept.publish(b"after") > 0
            wait_until(lambda: len(got) == 2, 5, "the message", poll=read)
            assert got == [b"before", b"after"]
        finally:
            bus.close()
            stop_driver(new_driver)
    ((thread, report),) = reports
    assert thread.startswith("shmbus-conductor")
    (renewed,) = report.publications  # the closed one is not re-added
    assert (renewed.stream_id, renewed.new_session_id, renewed.old_position) == (
        stream, kept.session_id, reached)
    (lost,) = report.subscriptions
    assert [i.position for i in lost.lost_images] == [reached]


def test_a_client_without_reconnect_still_fails_for_good(bus_context, driver):
    context = bus_context.with_(driver_timeout=1.5)
    assert context.reconnect is False
    with shmbus.connect(context) as bus:
        reports: list[shmbus.Reconnected] = []
        bus.on_reconnect = reports.append
        pub = bus.add_publication("aeron:ipc", 73)
        driver.kill()
        driver.wait(10)
        new_driver = start_driver(context)
        try:
            wait_until(lambda: pub.offer(b"x") == shmbus.codes.CLOSED, 10, "the publication closed")
            with pytest.raises(shmbus.DriverTimeoutError, match="heartbeated"):
                bus.add_publication("aeron:ipc", 73)
            # a negative check, watched for three keepalive intervals of the client: the new
            # driver is there, and this client stays failed
            holds_for(lambda: pub.is_closed and bus.reconnects == 0 and reports == [],
                      3 * context.keepalive_interval, "the client failed for good")
        finally:
            stop_driver(new_driver)
