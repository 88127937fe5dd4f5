"""The end-to-end run between two hosts: network namespaces joined by a bridge.

Each host runs its own driver (and the netbridge that driver starts) inside its namespace;
the publisher and subscriber processes only touch shared memory, so they run outside. This
kernel has no netem, so loss comes from the project's loss filter, on both hosts.
"""

from __future__ import annotations

import multiprocessing as mp

from tests.support.networks import channel_counters, host_buses
from tests.support.workers import bridge_workers

MESSAGES = 300_000


def test_two_hosts_with_loss(shm_dir) -> None:
    loss = "drop=0.05,dup=0.02,reorder=0.05,seed=5"
    with host_buses(shm_dir, 2, subnet=213,
                    settings={i: {"netbridge_loss": loss} for i in range(2)}) as buses:
        (_, host_b), contexts = buses.hosts, buses.contexts
        channel = f"aeron:udp?endpoint={host_b.address}:40777"
        spawn = mp.get_context("spawn")
        with spawn.Pool(2) as pool:
            ready = spawn.Manager().Event()
            sub = pool.apply_async(bridge_workers.subscribe,
                                   (contexts[1], channel, 9, MESSAGES, 120, ready))
            assert ready.wait(30)
            pub = pool.apply_async(bridge_workers.publish,
                                   (contexts[0], channel, 9, MESSAGES, 120))
            summary = sub.get(150)
            assert pub.get(150) == MESSAGES
        assert summary == {"received": MESSAGES, "out_of_order": 0, "bad_checksum": 0,
                           "images": 1}
        stats = channel_counters(contexts[1])
        assert stats["naks sent"] > 0 and stats["datagrams received"] > 0
