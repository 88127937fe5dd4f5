"""Two buses joined by their netbridges over loopback UDP: real drivers, bridges, processes."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

import shmbus
from tests.conftest import start_driver, stop_driver
from tests.netbridge import bridge_workers

MESSAGES = 1_000_000


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bus_pair(shm_dir, loss: str = ""):
    contexts = [shmbus.Context(dir=str(shm_dir / name), embedded_driver=False,
                               driver_idle_timeout=600, netbridge_loss=loss,
                               ipc_term_length=1 << 20) for name in ("a", "b")]
    drivers = [start_driver(context) for context in contexts]
    return contexts, drivers


def channel_counters(context: shmbus.Context) -> dict[str, int]:
    with shmbus.connect(context) as bus:
        return {c.label.split(":")[0]: c.value for c in bus.counters.counters()
                if c.type_id >= 100}


@pytest.mark.parametrize("loss", ["", "drop=0.05,dup=0.05,reorder=0.05,seed=11"],
                         ids=["clean", "5%-loss-dup-reorder"])
def test_a_million_messages_cross_exactly_once_in_order(shm_dir, loss: str) -> None:
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, loss)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    spawn = mp.get_context("spawn")
    try:
        with spawn.Pool(2) as pool:
            ready = spawn.Manager().Event()
            sub = pool.apply_async(bridge_workers.subscribe,
                                   (ctx_b, channel, 7, MESSAGES, 150, ready))
            assert ready.wait(30)
            pub = pool.apply_async(bridge_workers.publish, (ctx_a, channel, 7, MESSAGES, 150))
            summary = sub.get(170)
            assert pub.get(170) == MESSAGES
        assert summary == {"received": MESSAGES, "out_of_order": 0, "bad_checksum": 0,
                           "images": 1}
        sent, received = channel_counters(ctx_a), channel_counters(ctx_b)
        assert sent["datagrams sent"] > 0 and received["datagrams received"] > 0
        if loss:
            assert received["naks sent"] > 0 and received["gaps"] > 0
            assert sent["naks received"] > 0 and sent["retransmits"] > 0
        else:
            assert sent["retransmits"] == 0
    finally:
        for process in drivers:
            stop_driver(process)
