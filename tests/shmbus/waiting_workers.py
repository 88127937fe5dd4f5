"""Spawn targets for tests/shmbus/test_waiting.py: clients that sleep instead of polling.

Each function runs in a process of its own (multiprocessing "spawn"), connects with
``shmbus.connect(context)`` and reports through a queue as dicts (``kind`` says which report).
Messages and their checks are driver_workers' (writer, sequence, crc32). CPU figures are the
process's own (``time.process_time``, every thread): they show that a waiting process sleeps.
"""

from __future__ import annotations

import time
import types
from typing import Any

import shmbus
from shmbus.shm.log_buffer import UNFRAGMENTED
from tests.shmbus.driver.driver_workers import Checker, _report_errors


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
