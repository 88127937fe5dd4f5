"""Spawn targets for tests/shmbus/cli/test_monitor_load.py: a publisher that keeps its stream
saturated and subscribers that read at a chosen pace.

Each worker connects with the test's pickled :class:`shmbus.Context`, names itself through
``sys.argv[0]`` (the name the driver puts in its counter labels), reports ``("ready", name,
pid)`` on ``reports`` once registered, and runs until ``stop`` (a ``multiprocessing.RawValue``)
is set or ``timeout`` seconds pass. No loop spins: a back-pressured publisher sleeps until a
reader moves (``publish``), and a subscriber with nothing to read sleeps 0.2 ms.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

import shmbus


def saturate(context: shmbus.Context, channel: str, stream_id: int, length: int,
             reports: Any, stop: Any, timeout: float, name: str = "load-pub") -> None:
    """Publish ``length``-byte messages as fast as the window allows."""
    sys.argv[0] = name
    deadline = time.monotonic() + timeout
    message = bytes(length)
    with shmbus.connect(context) as bus:
        publication = bus.add_exclusive_publication(channel, stream_id)
        reports.put(("ready", name, os.getpid()))
        while not stop.value and time.monotonic() < deadline:
            # held for 0.2 s (a stopped subscriber) or not connected yet: look again
            with contextlib.suppress(shmbus.PublicationError):
                publication.publish(message, timeout=0.2)


def subscribe(context: shmbus.Context, channel: str, stream_id: int, reports: Any, stop: Any,
              timeout: float, name: str, fragments: int = 4096, pause: float = 0.0) -> None:
    """Read up to ``fragments`` fragments per poll, then sleep ``pause`` seconds (a slow
    reader) or, with nothing read, 0.2 ms."""
    sys.argv[0] = name
    deadline = time.monotonic() + timeout
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(channel, stream_id)
        reports.put(("ready", name, os.getpid()))
        while not stop.value and time.monotonic() < deadline:
            read = subscription.poll_batch(lambda batch: None, fragments)
            if pause:
                time.sleep(pause)
            elif not read:
                time.sleep(0.0002)
