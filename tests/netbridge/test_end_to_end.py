"""Two buses joined by their netbridges over loopback UDP: real drivers, bridges, processes."""

from __future__ import annotations

import socket

import pytest

import shmbus
from tests.support.drivers import stop_driver
from tests.support.networks import bus_pair, channel_counters, free_udp_port
from tests.support.processes import subscribe_then_publish
from tests.support.waits import wait_until
from tests.support.workers import bridge_workers

MESSAGES = 1_000_000


@pytest.mark.parametrize("loss", ["", "drop=0.05,dup=0.05,reorder=0.05,seed=11"],
                         ids=["clean", "5%-loss-dup-reorder"])
def test_a_million_messages_cross_exactly_once_in_order(shm_dir, loss: str) -> None:
    # the endpoint's counters are read after its subscriber left: it lingers that long
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, loss, netbridge_endpoint_linger=60.0)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    try:
        summary, published = subscribe_then_publish(
            bridge_workers.subscribe, (ctx_b, channel, 7, MESSAGES, 150),
            bridge_workers.publish, (ctx_a, channel, 7, MESSAGES, 150))
        assert published == [MESSAGES]
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


def test_hostile_datagrams_are_counted_and_dropped(shm_dir) -> None:
    import random
    import struct
    import time

    (ctx_a, ctx_b), drivers = bus_pair(shm_dir)
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    rng = random.Random(3)
    try:
        with shmbus.connect(ctx_b) as bus_b, shmbus.connect(ctx_a) as bus_a:
            sub = bus_b.add_subscription(channel, 4)
            pub = bus_a.add_publication(channel, 4)
            got: list[bytes] = []
            assembler = shmbus.FragmentAssembler(lambda b, h: got.append(bytes(b)))
            wait_until(lambda: sub.images, 30, "the subscription's image",
                       poll=lambda: sub.poll(assembler, 10))
            deadline = time.monotonic() + 30
            session = pub.session_id
            hostile = [
                b"",                                             # empty
                bytes(rng.getrandbits(8) for _ in range(100)),   # garbage
                b"\x20\x00\x00\x00\x07\xc0\x01\x00",             # wrong version, short
                struct.pack("<iBBHiiiiq", 5000, 0, 0xC0, 1, 0, session, 4, 0, 0) + bytes(64),
                struct.pack("<iBBHiiiiq", 64, 0, 0xC0, 1, 1 << 30, session, 4, 0, 0)
                + bytes(32),                                     # term offset outside the term
                struct.pack("<iBBHiiiiq", 64, 0, 0xC0, 1, 0, 12345, 4, 0, 0) + bytes(32),
                struct.pack("<iBBHii", 36, 0, 0, 3, session, 4),  # truncated SM
            ]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
                sent = 0
                while sent < 2000 or len(got) < 2000:
                    assert time.monotonic() < deadline, f"stuck at {len(got)} messages"
                    if sent < 2000 and pub.offer(bridge_workers.message(sent)) > 0:
                        sent += 1
                        attacker.sendto(hostile[sent % len(hostile)], ("127.0.0.1", port))
                    sub.poll(assembler, 50)
            assert got == [bridge_workers.message(i) for i in range(2000)]
            # the bridge mirrors its counters every duty cycle
            wait_until(lambda: any(c.label.startswith("invalid datagrams:") and c.value > 0
                                   for c in bus_b.counters.counters() if c.type_id >= 100),
                       10, "the hostile datagrams counted as invalid")
            assert bus_b.cnc.pid == drivers[1].pid and drivers[1].poll() is None
    finally:
        for process in drivers:
            stop_driver(process)
