"""`shmbus streams` shows the shared memory large messages hold per stream, and who holds it."""

from __future__ import annotations

import numpy as np

import shmbus
from shmbus.cli.snapshot import read_snapshot
from shmbus.cli.stat import analyse_streams
from tests.shmbus.driver.test_driver_processes import wait_until


def publication_view(context: shmbus.Context, stream_id: int):
    views = [v for v in analyse_streams(read_snapshot(context.dir))
             if v.kind == "publication" and v.stream_id == stream_id]
    assert len(views) == 1, views
    return views[0]


def test_streams_show_large_message_memory_while_a_view_holds_it(bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 31)
        sub = bus.add_subscription("aeron:ipc", 31)
        wait_until(lambda: pub.is_connected, 10, "the subscriber")
        assert publication_view(bus_context, 31).large_message_bytes == 0
        pub.publish_array(np.ones(1 << 20))  # 8 MiB
        view = sub.take_view()
        assert view is not None and view.zero_copy
        held = publication_view(bus_context, 31)
        assert held.large_message_bytes >= 8 << 20
        assert 8 << 20 <= held.large_message_in_use <= held.large_message_bytes
        assert held.to_json()["large_message_in_use"] == held.large_message_in_use
        assert "large messages 8" in held.line() and "held by" in held.line()
        view.release()
        wait_until(lambda: publication_view(bus_context, 31).large_message_in_use == 0, 5,
                   "the block freed")
        # past the ring's warm beginning, freed blocks give their memory back
        for _ in range(10):
            pub.publish_array(np.ones(1 << 21))  # 16 MiB each
            for array in sub.arrays(timeout=1.0):
                assert array[0] == 1
                break
        wait_until(lambda: publication_view(bus_context, 31).large_message_in_use == 0, 5,
                   "every block freed")
        assert publication_view(bus_context, 31).large_message_bytes <= (64 << 20) + 4096
