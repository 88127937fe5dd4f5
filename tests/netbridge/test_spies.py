"""Spies on a network publication (``aeron-spy:``): they read the publication's log locally and
take part in its flow control; only with ``ssc=true`` does a spy count as a connection.

One bus with a driver (and the netbridge it starts) on loopback; the publication's endpoint
has no receiver, so the only readers are the spies.
"""

from __future__ import annotations

import time

import shmbus
from tests.support.networks import Reader, free_udp_port
from tests.support.waits import holds_for, wait_until
from tests.support.workers.bridge_workers import publish_range

STREAM = 9
COUNT = 5_000


def test_a_spy_counts_as_a_connection_only_with_ssc(bus_context, driver) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"  # nobody receives there
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_exclusive_publication(channel, STREAM)
        plain = Reader(bus.add_subscription(f"aeron-spy:{channel}", STREAM))
        wait_until(lambda: plain.subscription.images, 10, "the spy's image", poll=plain.poll)
        # a spy alone: not connected (a negative check, watched for 1 s)
        holds_for(lambda: not publication.is_connected
                  and publication.offer(b"nobody is there") == shmbus.codes.NOT_CONNECTED, 1.0,
                  "the publication not connected with a spy alone", poll=plain.poll, pause=0.05)

        counted = Reader(bus.add_subscription(f"aeron-spy:{channel}|ssc=true", STREAM))
        wait_until(lambda: publication.is_connected, 20,
                   "ssc=true to connect the publication", poll=counted.poll)
        sequence = 0
        deadline = time.monotonic() + 30
        while sequence < COUNT or min(len(plain.sequences), len(counted.sequences)) < COUNT:
            assert time.monotonic() < deadline, (sequence, len(plain.sequences),
                                                 len(counted.sequences))
            # both spies hold the publisher back (its window): publish what fits, then read
            sequence = publish_range(publication, sequence, min(COUNT, sequence + 100),
                                     time.monotonic() + 0.05)
            plain.poll()
            counted.poll()
        for reader in (plain, counted):
            assert reader.sequences == list(range(COUNT)) and reader.bad == 0
