"""`shmbus streams` shows the shared memory large messages hold per stream, who holds it, and
how much of it the block ring keeps warm within its bound."""

from __future__ import annotations

import os

import numpy as np

import shmbus
from shmbus.cli.snapshot import read_snapshot
from shmbus.cli.stream_analysis import analyse_streams
from shmbus.shm import block_ring as br
from tests.support.drivers import TINY_LENGTHS, driver_serves
from tests.support.system import mounted_tmpfs
from tests.support.waits import wait_until
from tests.support.workers import driver_workers as dw


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
        done = publication_view(bus_context, 31)
        assert done.large_message_bytes <= (64 << 20) + 4096
        # (/dev/shm has far more than 4 x 64 MiB free: the bound is WARM_BYTES)
        assert done.large_message_warm_bound == br.WARM_BYTES
        assert 32 << 20 < done.large_message_warm_bytes <= done.large_message_warm_bound
        document = done.to_json()
        assert document["large_message_warm_bound"] == br.WARM_BYTES
        assert document["large_message_warm_bytes"] == done.large_message_warm_bytes
        assert "kept warm of at most 64 MiB" in done.line()


def test_streams_show_the_warm_bound_of_a_small_tmpfs(bus_context, procs, tmp_path) -> None:
    """On a 32 MiB tmpfs the ring's warm beginning is bounded by a quarter of what is free."""
    with mounted_tmpfs(tmp_path / "small", "32m") as mount:
        context = bus_context.with_(dir=str(mount / "bus"), max_large_message_length=4 << 20)
        driver = procs.start(dw.run_driver, context, TINY_LENGTHS)
        wait_until(lambda: driver_serves(context, driver.pid) or not driver.is_alive(), 20,
                   "the driver on the small tmpfs")
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", 32)
            sub = bus.add_subscription("aeron:ipc", 32)
            wait_until(lambda: pub.is_connected, 10, "the subscriber")
            for i in range(20):
                pub.publish(bytes([i]) * 500_000)
                assert [m[0] for m in sub.messages(timeout=1.0)] == [i]
            wait_until(lambda: publication_view(context, 32).large_message_in_use == 0, 5,
                       "every block freed")
            view = publication_view(context, 32)
            st = os.statvfs(mount)
            quarter = br.warm_bound(st.f_bavail * st.f_frsize + view.large_message_bytes, 0.25,
                                    0)
            span = br._span(500_000)
            assert quarter - span <= view.large_message_warm_bound <= quarter + span
            assert 0 < view.large_message_warm_bytes <= view.large_message_warm_bound
            assert view.large_message_bytes <= br.HEADER_PAGE + view.large_message_warm_bound
        driver.terminate()
        driver.join(10)
