"""asyncio: awaiting the bus without blocking the event loop, on asyncio's loop and uvloop.

Real processes (spawn) on a real bus with its driver process, messages checked by writer,
sequence and crc32. A ticker task beside every await shows the loop keeps running; the
cancellation tests show a cancelled await has read (or written) nothing.
"""

from __future__ import annotations

import asyncio

import pytest

import shmbus
from tests.shmbus.driver import driver_workers as dw
from tests.shmbus.driver.test_driver_processes import (
    CTX,
    Processes,
    assert_clean,
    wait_until,
)
from tests.shmbus.waiting_workers import async_publisher, async_reader

pytestmark = pytest.mark.timeout(120)
LOOPS = ["asyncio", "uvloop"]


@pytest.fixture
def procs():
    processes = Processes()
    try:
        yield processes
    finally:
        processes.close()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_async_for_reads_a_stream_while_the_loop_runs(bus_context, driver, procs, loop_kind):
    stream, count = 71, 3000
    procs.start(async_reader, bus_context, stream, count, procs.queue, 60.0, loop_kind)
    procs.wait("sub-ready")
    (quiet,) = procs.wait("quiet", timeout=30)
    assert quiet["got"] == 0 and quiet["wall"] >= 0.95
    assert quiet["ticks"] >= 20, "the event loop did not run while poll_async waited"
    assert quiet["cpu"] < 0.2, f"awaiting 1 s of nothing used {quiet['cpu']:.3f} s CPU"
    start = CTX.Event()
    procs.start(dw.publisher, bus_context, "aeron:ipc", stream, 1, count, start, procs.queue,
                60.0, pace_every=50, pace_sleep=0.002)
    procs.wait("pub-ready")
    start.set()
    procs.wait("pub", timeout=60)
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

            waiting = asyncio.ensure_future(sub.poll_async(handler, 10))
            await asyncio.sleep(0.05)
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
