"""Fixtures of the codec tests: a connected IPC stream of a test bus."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import shmbus
from tests.support.ipc_stream import connected_ipc


@pytest.fixture
def stream(bus_context, driver,
           ) -> Iterator[tuple[shmbus.ExclusivePublication, shmbus.Subscription]]:
    """An exclusive publication and a subscription of one IPC stream (21) of the test bus,
    connected: what a codec writes there a test reads back in the same process."""
    with connected_ipc(bus_context, 21) as (pub, sub):
        yield pub, sub
