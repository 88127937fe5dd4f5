"""One IPC stream of a test bus, connected in this process: a client, an exclusive publication
and a subscription of one stream id, for the tests that write and read back themselves."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import shmbus
from tests.support.waits import wait_until


@contextmanager
def connected_ipc(context: shmbus.Context, stream_id: int
                  ) -> Iterator[tuple[shmbus.ExclusivePublication, shmbus.Subscription]]:
    """(publication, subscription) of IPC stream ``stream_id`` on the bus of ``context``, once
    each sees the other (10 s at most); the client closes after the ``with`` block."""
    with shmbus.connect(context) as bus:
        sub = bus.add_subscription("aeron:ipc", stream_id)
        pub = bus.add_exclusive_publication("aeron:ipc", stream_id)
        wait_until(lambda: pub.is_connected and sub.is_connected, 10, "the stream to connect")
        yield pub, sub
