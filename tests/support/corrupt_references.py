"""What a reader makes of a stream holding corrupt large-message references: each message it
takes, and in place of each frame it drops, the CorruptReferenceError it raised once."""

from __future__ import annotations

import time
from typing import Any

from shmbus.shm.block_ring import CorruptReferenceError


def messages_and_errors(subscription: Any, count: int, timeout: float
                        ) -> list[bytes | CorruptReferenceError]:
    """The first ``count`` things ``subscription.messages()`` gives, in order: whole messages,
    and each CorruptReferenceError it raised (the frame dropped, the reader going on).
    AssertionError after ``timeout`` seconds."""
    got: list[bytes | CorruptReferenceError] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, got
        try:
            for message in subscription.messages(timeout=0.1):
                got.append(message)
        except CorruptReferenceError as e:
            got.append(e)
    return got
