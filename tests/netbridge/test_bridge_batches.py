"""The bridges' batch path end to end: two buses joined over loopback UDP by their netbridges
(real drivers, bridges and processes), streams checked message by message per publisher; and
an idle netbridge sleeps."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

import shmbus
from tests.support.counted_stream import stream_counted
from tests.support.drivers import stop_driver
from tests.support.networks import bridge_pid, bus_pair, free_udp_port, stop_drivers
from tests.support.processes import subscribe_then_publish
from tests.support.waits import wait_until
from tests.support.workers import bridge_workers

PER_PUBLISHER = 100_000
#: the message of the windowed tests: 1056 bytes as a frame, aligned
PAYLOAD = bytes(1000)


def mapped_logs(pid: int, directory: str) -> list[str]:
    """The logs of the bus in ``directory`` that process ``pid`` maps."""
    logs = os.path.join(directory, "logs") + os.sep
    return [m.path for m in psutil.Process(pid).memory_maps() if m.path.startswith(logs)]


def cpu_seconds(process: psutil.Process, seconds: float) -> float:
    """The CPU time (user and system) ``process`` uses over the next ``seconds``."""
    before = sum(process.cpu_times()[:2])
    time.sleep(seconds)  # the window measured: what runs meanwhile is the point
    return sum(process.cpu_times()[:2]) - before


@pytest.mark.parametrize(("loss", "busy_window"), [
    ("", 100e-6), ("", 0.0), ("drop=0.05,dup=0.05,reorder=0.05,seed=5", 100e-6)],
    ids=["clean", "clean-bridges-sleep-at-once", "5%-loss-dup-reorder"])
def test_two_publishers_stream_200k_messages_exactly_through_the_batch_path(
        shm_dir, loss: str, busy_window: float) -> None:
    """The bridges poll on for busy_window after work (0: sleep at once, woken by sockets and
    their log watcher)."""
    # the receive endpoint's counters are read after its subscriber left: it lingers that long
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, loss, netbridge_busy_window=busy_window,
                                       netbridge_endpoint_linger=60.0)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    try:
        summaries, published = subscribe_then_publish(
            bridge_workers.subscribe_sessions, (ctx_b, channel, 7, 2 * PER_PUBLISHER, 150),
            bridge_workers.publish, (ctx_a, channel, 7, PER_PUBLISHER, 150), publishers=2)
        assert published == [PER_PUBLISHER] * 2
        assert len(summaries) == 2, summaries  # two sessions, each exact
        for summary in summaries.values():
            assert summary == {"received": PER_PUBLISHER, "out_of_order": 0, "bad_checksum": 0}
        sent = bridge_workers.channel_stats(ctx_a)
        received = bridge_workers.channel_stats(ctx_b)
        in_order, datagrams = received["datagrams in order"], received["datagrams received"]
        if loss:  # between losses data takes the native path, around them the state machine's
            assert received["gaps"] > 0 and received["naks sent"] > 0
            assert sent["retransmits"] > 0
            assert 0 < in_order < datagrams
        else:  # most data takes the native path
            assert in_order > datagrams // 2, (received, sent)
    finally:
        for driver in drivers:
            stop_driver(driver)


@pytest.mark.parametrize("busy_window", [100e-6, 0.0])
def test_an_idle_bridge_sleeps(shm_dir, busy_window: float) -> None:
    """With a stream connected but nothing published, each netbridge only runs its timers
    (status messages, heartbeats, driver events): a correctness check that nothing spins,
    whether or not it polls on for a while after work."""
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, netbridge_busy_window=busy_window)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    try:
        with shmbus.connect(ctx_a) as bus_a, shmbus.connect(ctx_b) as bus_b:
            subscription = bus_b.add_subscription(channel, 3)
            publication = bus_a.add_publication(channel, 3)
            got: list[bytes] = []
            published = False

            def offer_once_and_poll() -> int:
                nonlocal published
                published = published or publication.offer(b"hello") > 0
                return subscription.poll(lambda buffer, _header: got.append(bytes(buffer)), 10)

            wait_until(lambda: got, 30, "the stream to connect", poll=offer_once_and_poll)
            assert got == [b"hello"]
            bridges = [psutil.Process(bridge_pid(driver)) for driver in drivers]
            before = [sum(bridge.cpu_times()[:2]) for bridge in bridges]
            time.sleep(2)  # the window measured: what the idle bridges use meanwhile
            used = [sum(bridge.cpu_times()[:2]) - b for bridge, b in zip(bridges, before,
                                                                           strict=True)]
            assert all(u < 0.2 for u in used), used
            assert publication.is_connected  # and the stream is still up
    finally:
        for driver in drivers:
            stop_driver(driver)


@dataclasses.dataclass
class Windowed:
    """Buses a and b joined by their netbridges (``drivers``: a's, b's), a client of each,
    and a ``channel`` whose receivers' window is 512 KiB."""

    bus_a: shmbus.Client
    bus_b: shmbus.Client
    drivers: list[subprocess.Popen[bytes]]
    channel: str


@pytest.fixture
def windowed(shm_dir) -> Iterator[Windowed]:
    """A :class:`Windowed`; the drivers stopped after the test."""
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|rcv-wnd=524288"
    try:
        with shmbus.connect(ctx_a) as bus_a, shmbus.connect(ctx_b) as bus_b:
            yield Windowed(bus_a, bus_b, drivers, channel)
    finally:
        stop_drivers(drivers)


def test_a_bridge_sleeps_while_a_slow_subscriber_holds_the_status_message_back(
        windowed: Windowed) -> None:
    """Two subscribers on one image, one reading everything, one nothing: the fast one is past
    where a status message would fall due, but status messages follow the slowest, so there
    is nothing to do, and the receiving bridge must sleep rather than spin on that watch."""
    fast = windowed.bus_b.add_subscription(windowed.channel, 4)
    slow = windowed.bus_b.add_subscription(windowed.channel, 4)
    publication = windowed.bus_a.add_publication(windowed.channel, 4)
    deadline = time.monotonic() + 30
    sent = received = 0
    # 300 kB: past a quarter of the channel's window (512 KiB), which the slow one holds
    while received < 300:
        assert time.monotonic() < deadline, f"{received} of 300 arrived"
        if sent < 300 and publication.offer(PAYLOAD) > 0:
            sent += 1
        received += fast.poll(lambda _buffer, _header: None, 100, timeout=0.01)
    assert slow.images and fast.images  # the slow one holds its place, unread
    assert cpu_seconds(psutil.Process(bridge_pid(windowed.drivers[1])), 2) < 0.2


def test_a_sender_held_at_the_end_of_its_window_sleeps(windowed: Windowed) -> None:
    """A subscriber that reads nothing holds the sender at the end of the receiver's window,
    which the frames (1056 bytes aligned) do not divide: the next frame is committed but does
    not fit, so the sending bridge waits for a status message and must sleep rather than spin
    on that frame."""
    subscription = windowed.bus_b.add_subscription(windowed.channel, 6)
    publication = windowed.bus_a.add_publication(windowed.channel, 6)
    wait_until(lambda: publication.is_connected and subscription.images, 30,
               "the stream to connect")
    sent = 0
    with pytest.raises(shmbus.PublicationError):
        while sent < 10_000:  # publish() waits 0.5 s for room, then raises
            publication.publish(PAYLOAD, timeout=0.5)
            sent += 1
    assert sent * 1056 > 524288  # the window is full: the sender waits at its end
    assert cpu_seconds(psutil.Process(bridge_pid(windowed.drivers[0])), 2) < 0.2


def test_bridges_let_logs_they_sleep_on_go_and_serve_the_next_stream(shm_dir) -> None:
    """Each bridge's log watcher sleeps on the logs of its senders and images; when a stream
    ends and its logs are closed the bridges go on (same processes) and carry the next one."""
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir)
    pids: list[int] = []
    try:
        with shmbus.connect(ctx_a) as bus_a, shmbus.connect(ctx_b) as bus_b:
            for stream in range(1, 4):
                channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
                subscription = bus_b.add_subscription(channel, stream)
                publication = bus_a.add_exclusive_publication(channel, stream)
                stream_counted(publication, subscription, 2000, f"stream {stream}", 256)
                pids = pids or [bridge_pid(driver) for driver in drivers]
                publication.close()
                subscription.close()
                # the image ends and B's bridge lets its log go (A's sender lingers)
                wait_until(lambda b=pids[1]: not mapped_logs(b, ctx_b.dir), 30,
                           "B's netbridge to let the ended image's log go")
        assert [bridge_pid(driver) for driver in drivers] == pids
    finally:
        for driver in drivers:
            stop_driver(driver)
