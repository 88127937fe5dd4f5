"""The end-to-end run between two hosts: network namespaces joined by a bridge.

Each host runs its own driver (and the netbridge that driver starts) inside its namespace;
the publisher and subscriber processes only touch shared memory, so they run outside. This
kernel has no netem, so loss comes from the project's loss filter, on both hosts.
"""

from __future__ import annotations

import multiprocessing as mp

import shmbus
from tests.support.drivers import start_driver, stop_driver
from tests.support.workers import bridge_workers
from tools.bench.network import hosts

MESSAGES = 300_000


def test_two_hosts_with_loss(shm_dir) -> None:
    loss = "drop=0.05,dup=0.02,reorder=0.05,seed=5"
    with hosts(2, subnet=213) as (host_a, host_b):
        contexts = [shmbus.Context(dir=str(shm_dir / host.name), embedded_driver=False,
                                   driver_idle_timeout=600, netbridge_loss=loss)
                    for host in (host_a, host_b)]
        drivers = [start_driver(c, h.exec_prefix) for c, h in zip(contexts, (host_a, host_b),
                                                                   strict=True)]
        try:
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
            with shmbus.connect(contexts[1]) as bus:
                stats = {c.label.split(":")[0]: c.value for c in bus.counters.counters()
                         if c.type_id >= 100}
            assert stats["naks sent"] > 0 and stats["datagrams received"] > 0
        finally:
            for process in drivers:
                stop_driver(process)
