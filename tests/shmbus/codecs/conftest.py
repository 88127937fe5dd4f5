"""Fixtures of the codec tests: a connected IPC stream of a test bus."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import shmbus
from tests.support.waits import wait_until


@pytest.fixture
def stream(bus_context, driver,
           ) -> Iterator[tuple[shmbus.ExclusivePublication, shmbus.Subscription]]:
    """An exclusive publication and a subscription of one IPC stream (21) of the test bus,
    connected: what a codec writes there a test reads back in the same process."""
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 21)
        sub = bus.add_subscription("aeron:ipc", 21)
        wait_until(lambda: pub.is_connected, 10, "the subscriber")
        yield pub, sub
