"""asyncio: awaiting the bus without blocking the event loop, on asyncio's loop and uvloop.

Real processes (spawn) on a real bus with its driver process, messages checked by writer,
sequence and crc32. A ticker task beside every await shows the loop keeps running; the
cancellation tests show a cancelled await has read (or written) nothing.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import shmbus
from shmbus.shm._native import FutexRing, LogWatcher
from shmbus.streams import async_waits
from tests.support.ipc_stream import connected_ipc
from tests.support.paced_publisher import publish_in_bursts
from tests.support.processes import assert_clean
from tests.support.sleepers import readers_asleep
from tests.support.system import io_uring_futex_waits
from tests.support.waits import await_until, wait_until
from tests.support.workers import driver_workers as dw
from tests.support.workers.waiting_workers import async_publisher, async_reader

pytestmark = pytest.mark.timeout(120)
LOOPS = ["asyncio", "uvloop"]


# the io_uring waker where the kernel has it (else its fallback), and the fallback thread
WAKERS = [("asyncio", "default"), ("uvloop", "default"), ("asyncio", "thread")]


@pytest.mark.parametrize(("loop_kind", "waker"), WAKERS)
def test_async_for_reads_a_stream_while_the_loop_runs(bus_context, driver, procs, loop_kind,
                                                      waker):
    stream, count = 71, 3000
    procs.start(async_reader, bus_context, stream, count, procs.queue, 60.0, loop_kind, waker)
    procs.wait("sub-ready")
    (quiet,) = procs.wait("quiet", timeout=30)
    ring = waker == "default" and io_uring_futex_waits()
    assert quiet["waker"] == ("FutexRing" if ring else "LogWatcher")
    assert quiet["got"] == 0 and quiet["wall"] >= 0.95
    assert quiet["ticks"] >= 20, "the event loop did not run while poll_async waited"
    assert quiet["cpu"] < 0.2, f"awaiting 1 s of nothing used {quiet['cpu']:.3f} s CPU"
    publish_in_bursts(procs, bus_context, stream, count, 50)
    (sub,) = procs.wait("sub", timeout=60)
    assert_clean(sub)
    assert sub["counts"] == {1: count}


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_publish_async_awaits_back_pressure(bus_context, driver, procs, loop_kind):
    stream, count = 72, 2000
    procs.start(dw.subscriber, bus_context, "aeron:ipc", stream, "slow", count, procs.queue,
                60.0, sleep_per_batch=0.01, batch=50)
    procs.wait("sub-ready")
    procs.start(async_publisher, bus_context, stream, count, procs.queue, loop_kind)
    (pub,) = procs.wait("pub", timeout=60)
    (sub,) = procs.wait("sub", timeout=60)
    assert_clean(sub)
    assert sub["counts"] == {1: count}
    # held back for most of the stream (50 messages per 10 ms), the loop still ran
    assert pub["ticks"] >= 0.5 * pub["elapsed"] / 0.01


def test_a_cancelled_await_reads_nothing(bus_context, driver):
    async def main() -> None:
        with shmbus.connect(bus_context) as bus:
            sub = bus.add_subscription("aeron:ipc", 73)
            pub = bus.add_exclusive_publication("aeron:ipc", 73)
            wait_until(lambda: sub.is_connected, 10, "the image")
            got: list[bytes] = []

            def handler(buffer: memoryview, header: object) -> None:
                got.append(bytes(buffer))

            waiting = asyncio.ensure_future(sub.poll_async(handler, 10, timeout=None))
            (image,) = sub.images
            await await_until(lambda: readers_asleep(image.log) == 1, 10, "the await asleep")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            for seq in range(10):
                pub.publish(dw.make_message(1, seq))
            # an async for left after three messages has read exactly three
            async for message in sub.messages_async(timeout=5):
                got.append(message)
                if len(got) == 3:
                    break
            # the rest are all still there, in order, for the next reader
            while len(got) < 10:
                assert await sub.poll_async(handler, 10, timeout=5)
            assert got == [dw.make_message(1, seq) for seq in range(10)]
            assert await sub.poll_async(handler, 10, timeout=0.05) == 0

    asyncio.run(main())


def test_an_awaiting_reader_learns_that_the_driver_died(bus_context, driver):
    async def main() -> None:
        with shmbus.connect(bus_context) as bus:
            sub = bus.add_subscription("aeron:ipc", 74)
            driver.kill()
            driver.wait(10)
            with pytest.raises(shmbus.DriverTimeoutError):
                await sub.poll_async(lambda buffer, header: None, 10, timeout=60)

    asyncio.run(main())


@pytest.fixture(params=["default", "thread"])
def waker(request, monkeypatch):
    """The awaits of this process use the default waker, or the LogWatcher thread."""
    if request.param == "thread":
        monkeypatch.setattr(async_waits, "new_log_watcher", LogWatcher)
    return request.param


def test_an_await_counts_itself_asleep_only_while_it_waits(bus_context, driver, waker):
    async def main() -> None:
        with connected_ipc(bus_context, 75) as (pub, sub):
            (image,) = sub.images
            waiting = asyncio.ensure_future(sub.poll_async(lambda b, h: None, 10, timeout=2.0))
            # (the thread waker counts itself, and uncounts itself, on its own thread)
            await await_until(lambda: readers_asleep(image.log) == 1, 5.0,
                              "the await to count itself asleep")
            assert await waiting == 0
            await await_until(lambda: readers_asleep(image.log) == 0, 2.0,
                              "the timed-out await to uncount itself")
            waiting = asyncio.ensure_future(sub.poll_async(lambda b, h: None, 10, timeout=5))
            await await_until(lambda: readers_asleep(image.log) == 1, 2.0, "the await asleep")
            pub.publish(dw.make_message(1, 0))
            assert await waiting == 1
            await await_until(lambda: readers_asleep(image.log) == 0, 2.0,
                              "the woken await to uncount itself")

    asyncio.run(main())


def test_closing_a_subscription_ends_the_await_on_it(bus_context, driver, waker):
    async def main() -> None:
        with connected_ipc(bus_context, 76) as (pub, sub):
            (image,) = sub.images
            waiting = asyncio.ensure_future(asyncio.wait_for(
                sub.poll_async(lambda b, h: None, 10, timeout=None), timeout=10))
            await await_until(lambda: readers_asleep(image.log) == 1, 2.0, "the await asleep")
            closing = threading.Thread(target=sub.close)  # closed under the sleeping await
            closing.start()
            got = await waiting
            assert got == 0 and sub.is_closed
            closing.join(10)  # the await may end as soon as close() began
            assert sub._readiness._watcher is None, "the closed subscription kept its waker"

    asyncio.run(main())


def test_a_futex_ring_is_closed_once():
    if not io_uring_futex_waits():  # no io_uring, or no futex waits in it (before Linux 6.7)
        with pytest.raises(OSError):
            FutexRing()
        return
    ring = FutexRing()
    fd = ring.fileno()
    assert fd >= 0 and ring.clear() is False
    ring.close()
    ring.close()
    with pytest.raises(ValueError, match="closed"):
        ring.fileno()
