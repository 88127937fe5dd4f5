"""Spawn targets of tests/shmbus/streams/test_client_failure.py: readers the driver times out
in the middle of a loop over their messages."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import shmbus

STREAM = 31


def _loop(subscription: Any, kind: str) -> Iterator[Any]:
    if kind == "views":
        return subscription.views(timeout=None)
    if kind == "arrays":
        return subscription.arrays(timeout=None)
    return subscription.messages(timeout=None)  # a group member's


def stopped_mid_loop(context: shmbus.Context, kind: str, results: Any) -> None:
    """Loop over the stream's messages (``kind``: views, arrays, group or views_async), stop
    itself (SIGSTOP) after the first, and once resumed go on looping; reports how the loop
    ended: the exception's name, or "ended" when it ended without one."""
    with shmbus.connect(context) as bus:
        group = "workers" if kind == "group" else None
        subscription = bus.add_subscription("aeron:ipc", STREAM, group=group)
        results.put({"kind": "ready", "pid": os.getpid()})
        outcome = "ended"
        try:
            if kind == "views_async":
                asyncio.run(_async_loop(subscription.views_async(timeout=None)))
            else:
                for count, _ in enumerate(_loop(subscription, kind)):
                    if count == 0:
                        os.kill(os.getpid(), signal.SIGSTOP)
        except shmbus.ShmbusError as e:
            outcome = type(e).__name__
        results.put({"kind": "outcome", "outcome": outcome})


async def _async_loop(views: AsyncIterator[Any]) -> None:
    count = 0
    async for _ in views:
        if count == 0:
            os.kill(os.getpid(), signal.SIGSTOP)
        count += 1
