"""Spawn targets for tests/shmbus/streams/test_waiting.py and test_asyncio.py: clients that sleep
(or await) instead of polling.

Each function runs in a process of its own (multiprocessing "spawn"), connects with
``shmbus.connect(context)`` and reports through a queue as dicts (``kind`` says which report).
Messages and their checks are driver_workers' (writer, sequence, crc32). CPU figures are the
process's own (``time.process_time``, every thread): they show that a waiting process sleeps.
"""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

import shmbus
from shmbus.shm._native import LogWatcher
from shmbus.shm.log_buffer import UNFRAGMENTED
from shmbus.streams import async_waits
from tests.support.workers.driver_workers import Checker, _report_errors, make_message


def blocking_reader(context: shmbus.Context, stream_id: int, expected: int, results: Any,
                    timeout: float, *, use_messages: bool = False) -> None:
    """Waits one quiet second (``wait``), then reads ``expected`` messages by blocking polls
    (or by ``messages()``), never calling a non-blocking poll; reports the CPU of each part."""
    name = "blocking-reader"
    deadline = time.monotonic() + timeout

    def run() -> None:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream_id)
            results.put({"kind": "sub-ready", "name": name})
            cpu, wall = time.process_time(), time.monotonic()
            quiet = sub.wait(1.0)
            quiet_cpu, quiet_wall = time.process_time() - cpu, time.monotonic() - wall
            results.put({"kind": "quiet", "name": name, "ready": quiet, "cpu": quiet_cpu,
                         "wall": quiet_wall})
            checker = Checker(stream_id=stream_id)
            cpu = time.process_time()
            if use_messages:
                header = types.SimpleNamespace(session_id=0, flags=UNFRAGMENTED, position=0,
                                               stream_id=stream_id)
                for message in sub.messages(timeout=max(0.0, deadline - time.monotonic())):
                    checker(memoryview(message), header)
                    if checker.count >= expected:
                        break
            else:
                while checker.count < expected and time.monotonic() < deadline:
                    sub.poll(checker, 100, timeout=max(0.0, deadline - time.monotonic()))
            results.put({"kind": "sub", "name": name, "cpu": time.process_time() - cpu,
                         "timed_out": checker.count < expected, **checker.summary()})

    _report_errors(results, "sub", name, run)


def hands_off_subscriber(context: shmbus.Context, stream_id: int, results: Any,
                         timeout: float) -> None:
    """Subscribes and never polls: watches ``is_connected`` and the image callbacks, as the
    first program a user writes does (``while not sub.is_connected: time.sleep(0.01)``)."""
    name = "hands-off"
    deadline = time.monotonic() + timeout

    def run() -> None:
        events: list[tuple[str, int]] = []
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription(
                "aeron:ipc", stream_id,
                on_available_image=lambda image: events.append(("available", image.session_id)),
                on_unavailable_image=lambda image: events.append(("unavailable",
                                                                  image.session_id)))
            results.put({"kind": "sub-ready", "name": name})
            while not sub.is_connected and time.monotonic() < deadline:
                time.sleep(0.01)
            results.put({"kind": "connected", "name": name, "connected": sub.is_connected,
                         "sessions": [image.session_id for image in sub.images]})
            while sub.is_connected and time.monotonic() < deadline:
                time.sleep(0.01)
            results.put({"kind": "disconnected", "name": name, "connected": sub.is_connected,
                         "events": list(events)})

    _report_errors(results, "disconnected", name, run)


def _run_loop(main: Any, loop_kind: str) -> Any:
    if loop_kind == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


async def _tick(ticks: list[int]) -> None:
    """Proves the event loop runs while others await the bus."""
    while True:
        await asyncio.sleep(0.01)
        ticks[0] += 1


def async_reader(context: shmbus.Context, stream_id: int, expected: int, results: Any,
                 timeout: float, loop_kind: str, waker: str = "default") -> None:
    """Awaits one quiet second (``poll_async``), then reads ``expected`` messages with
    ``async for ... in sub.messages_async()``, a ticker task running beside it. ``waker``
    "thread" makes the awaits use the LogWatcher thread even where io_uring is there."""
    name = f"async-reader-{loop_kind}-{waker}"
    if waker == "thread":
        async_waits.new_log_watcher = LogWatcher

    async def main() -> None:
        ticks = [0]
        ticker = asyncio.ensure_future(_tick(ticks))
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream_id)
            results.put({"kind": "sub-ready", "name": name})
            cpu, wall = time.process_time(), time.monotonic()
            got = await sub.poll_async(lambda buffer, header: None, 10, timeout=1.0)
            results.put({"kind": "quiet", "name": name, "got": got, "ticks": ticks[0],
                         "cpu": time.process_time() - cpu, "wall": time.monotonic() - wall,
                         "waker": type(sub._readiness._watcher).__name__})
            checker = Checker(stream_id=stream_id)
            header = types.SimpleNamespace(session_id=0, flags=UNFRAGMENTED, position=0,
                                           stream_id=stream_id)
            async for message in sub.messages_async(timeout=timeout):
                checker(memoryview(message), header)
                if checker.count >= expected:
                    break
            ticker.cancel()
            results.put({"kind": "sub", "name": name, "timed_out": checker.count < expected,
                         "ticks": ticks[0], **checker.summary()})

    _report_errors(results, "sub", name, lambda: _run_loop(main(), loop_kind))


def async_publisher(context: shmbus.Context, stream_id: int, count: int, results: Any,
                    loop_kind: str) -> None:
    """Publishes ``count`` messages with ``publish_async`` (held back by a slow reader), a
    ticker task running beside it; reports how often the loop ran meanwhile."""
    name = f"async-publisher-{loop_kind}"

    async def main() -> None:
        ticks = [0]
        ticker = asyncio.ensure_future(_tick(ticks))
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", stream_id)
            connect_by = time.monotonic() + 30
            while not pub.is_connected:
                if time.monotonic() > connect_by:
                    raise TimeoutError("no subscriber within 30 s")
                await asyncio.sleep(0.01)
            began = time.monotonic()
            for seq in range(count):
                await pub.publish_async(make_message(1, seq), timeout=30)
            ticker.cancel()
            results.put({"kind": "pub", "name": name, "sent": count, "ticks": ticks[0],
                         "elapsed": time.monotonic() - began})

    _report_errors(results, "pub", name, lambda: _run_loop(main(), loop_kind))


def waiting_reader(context: shmbus.Context, stream_id: int, results: Any,
                   timeout: float) -> None:
    """Subscribes, says "sub-ready", then waits in ``messages()`` for one message and reports
    it (as ``got``)."""
    name = "waiting-reader"

    def run() -> None:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream_id)
            results.put({"kind": "sub-ready", "name": name})
            got = next(iter(sub.messages(timeout=timeout)), None)
            results.put({"kind": "got", "name": name, "message": got})

    _report_errors(results, "got", name, run)
