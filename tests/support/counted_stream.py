"""A stream of counted messages through a bus: each message is its sequence number (4 bytes,
little-endian), so what arrives can be checked for exactly-once, in-order delivery."""

from __future__ import annotations

import time
from typing import Any


def stream_counted(publication: Any, subscription: Any, count: int, what: str,
                   fragment_limit: int, timeout: float = 30.0) -> None:
    """Offer messages 0 to ``count - 1`` on ``publication`` while polling ``subscription``
    (``fragment_limit`` fragments a poll) in this thread, until ``count`` messages arrived;
    assert that they are exactly those, in order. Past ``timeout`` seconds the test fails,
    saying ``what`` stream it was and how many arrived."""
    got: list[int] = []
    sent = 0
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"{what}: {len(got)} arrived"
        if sent < count and publication.offer(sent.to_bytes(4, "little")) > 0:
            sent += 1
        subscription.poll(lambda buffer, _header: got.append(int.from_bytes(buffer, "little")),
                          fragment_limit)
    assert got == list(range(count))
