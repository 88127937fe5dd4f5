"""Spawn targets for tests/shmbus/cli/test_stat.py: bus clients that stop at known positions.

Each worker connects with the test's pickled :class:`shmbus.Context`, names itself through
``sys.argv[0]`` (the name the driver puts in its counter labels), reports through a queue and
then stays alive, its heartbeat running, until the test sets ``stop`` or kills it. Every loop
is bounded by ``timeout`` seconds; a worker that cannot do its part reports ("failed", ...).

The flags the test sets (``go``, ``fill``, ``stop``) are lock-free shared bytes
(``multiprocessing.RawValue``), polled: a multiprocessing Event would deadlock the test's
``set()`` once a worker waiting on it is killed.

Reports are tuples whose first item says what happened:

* ``("ready", name, pid, registration_id)``: connected and registered;
* ``("stopped", name, pid, position)``: a subscriber read its messages and stopped polling at
  ``position`` (its Image.position);
* ``("full", name, pid, position, limit)``: the publisher is back-pressured at ``position``
  with the limit ``limit``, and the limit has stayed put for ``settle`` seconds.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import shmbus


def wait_flag(flag: Any, deadline: float) -> bool:
    """Poll ``flag.value`` until it is set (True) or the deadline passes (False)."""
    while not flag.value:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def subscriber(context: shmbus.Context, name: str, stream_id: int, stop_after: int,
               reports: Any, stop: Any, timeout: float) -> None:
    """Read ``stop_after`` messages, report the image's position, then stop polling."""
    sys.argv[0] = name
    deadline = time.monotonic() + timeout
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription("aeron:ipc", stream_id)
        reports.put(("ready", name, os.getpid(), subscription.registration_id))
        count = 0

        def count_fragment(buffer: memoryview, header: Any) -> None:
            nonlocal count
            count += 1

        while count < stop_after:
            if time.monotonic() > deadline:
                reports.put(("failed", name, os.getpid(), f"read {count} of {stop_after}"))
                return
            if subscription.poll(count_fragment, stop_after - count) == 0:
                time.sleep(0.0005)
        reports.put(("stopped", name, os.getpid(), subscription.images[0].position))
        wait_flag(stop, deadline)


def publisher(context: shmbus.Context, name: str, stream_id: int, length: int,
              reports: Any, go: Any, fill: Any, stop: Any, timeout: float,
              settle: float = 0.1) -> None:
    """Once ``go`` is set, publish ``length``-byte messages as the window allows; once
    ``fill`` is set (the subscribers have stopped), offer until back-pressured at a limit
    that no longer moves."""
    sys.argv[0] = name
    deadline = time.monotonic() + timeout
    message = bytes(length)
    with shmbus.connect(context) as bus:
        if not wait_flag(go, deadline):
            reports.put(("failed", name, os.getpid(), "never told to go"))
            return
        publication = bus.add_exclusive_publication("aeron:ipc", stream_id)
        reports.put(("ready", name, os.getpid(), publication.registration_id))
        while not fill.value:
            if time.monotonic() > deadline:
                reports.put(("failed", name, os.getpid(), "never told to fill"))
                return
            if publication.offer(message) < 0:
                time.sleep(0.0005)
        while True:
            while (result := publication.offer(message)) != shmbus.codes.BACK_PRESSURED:
                if time.monotonic() > deadline:
                    reports.put(("failed", name, os.getpid(), f"offer gave {result}"))
                    return
                if result < 0:
                    time.sleep(0.0005)
            limit = publication.position_limit
            time.sleep(settle)
            if publication.position_limit == limit:
                break
        reports.put(("full", name, os.getpid(), publication.position,
                     publication.position_limit))
        wait_flag(stop, deadline)
