"""shmbus's side of the Aeron interop tests (tests/shmbus/driver/test_aeron_clients.py), run in
spawned processes: a publisher and a subscriber of the checked messages Aeron's C test
programs exchange (tools/aeron_c/message.py)."""

from __future__ import annotations

import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import shmbus
from tests.support.aeron_c import MessageError, SequenceChecker, encode_message


def publish_checked(context: Any, channel: str, stream_id: int, publisher_id: int, count: int,
                    length: int, exclusive: bool, results: Queue, done: Event) -> None:
    """Publish ``count`` checked messages of ``length`` bytes (waiting while not connected or
    back-pressured); report {"kind": "published", "session_id", "count"} on ``results``, then
    keep the publication until ``done`` is set, so its readers drain it."""
    with shmbus.connect(context) as bus:
        if exclusive:
            publication: Any = bus.add_exclusive_publication(channel, stream_id)
        else:
            publication = bus.add_publication(channel, stream_id)
        for sequence in range(count):
            publication.publish(encode_message(publisher_id, sequence, length), timeout=60)
        results.put({"kind": "published", "publisher_id": publisher_id,
                     "session_id": publication.session_id, "count": count})
        done.wait(120)


def subscribe_checked(context: Any, channel: str, stream_id: int, expected: dict[int, int],
                      results: Queue, ready: Event, timeout: float = 60.0) -> None:
    """Read checked messages until every expected publisher's count arrived intact and in
    order; report {"kind": "received", "received": {publisher: count}, "sessions": the
    sessions of its images, "error": what broke a rule, or None} on ``results``. Sets
    ``ready`` once the subscription is added."""
    checker = SequenceChecker(expected)
    sessions: set[int] = set()
    error = None
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(channel, stream_id)
        ready.set()
        deadline = time.monotonic() + timeout
        try:
            while not checker.complete and time.monotonic() < deadline:
                for message in subscription.messages(timeout=0.5):
                    checker.check(message)
                    if checker.complete:
                        break
                sessions.update(image.session_id for image in subscription.images)
        except MessageError as e:
            error = str(e)
        if error is None and not checker.complete:
            error = f"timed out after {timeout:g} s with {checker.received} of {expected}"
    results.put({"kind": "received", "received": checker.received,
                 "sessions": sorted(sessions), "error": error})
