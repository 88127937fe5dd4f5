"""Spawn targets for the authenticated-channel tests (top-level, importable functions)."""

from __future__ import annotations

import time
from typing import Any

import shmbus
from tests.support.workers import bridge_workers


def read_objects(context: shmbus.Context, channel: str, stream_id: int, count: int,
                 timeout: float, ready: Any) -> list[Any]:  # noqa: ANN401
    """The first ``count`` objects ``sub.objects()`` yields within ``timeout`` seconds."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(channel, stream_id)
        ready.set()
        while len(got) < count and time.monotonic() < deadline:
            for obj in subscription.objects(timeout=0.2):
                got.append(obj)
                if len(got) == count:
                    break
    return got


def publish_objects(context: shmbus.Context, channel: str, stream_id: int,
                    objects: list[Any], timeout: float) -> int:
    """Publish each object once connected; stay until the netbridge has sent them."""
    deadline = time.monotonic() + timeout
    with shmbus.connect(context) as bus:
        publication = bus.add_publication(channel, stream_id)
        while not publication.is_connected and time.monotonic() < deadline:
            time.sleep(0.01)
        for obj in objects:
            publication.publish_object(obj)
        assert bridge_workers.wait_sent(bus, publication, max(0.0, deadline - time.monotonic()))
        return len(objects)
