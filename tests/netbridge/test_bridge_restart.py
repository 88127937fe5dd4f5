"""A netbridge that dies while udp channels are in use is replaced by the driver: the new one
takes every channel over, the publication reconnects and the subscription gets a new image."""

from __future__ import annotations

import time

import psutil

import shmbus
from shmbus.cli.snapshot import read_snapshot
from shmbus.driver.bridge_link import BRIDGE_COMMAND
from tests.support.networks import Reader, free_udp_port
from tests.support.waits import wait_until
from tests.support.workers.bridge_workers import message

STREAM = 11
COUNT = 4_000


def bridges(directory: str) -> list[psutil.Process]:
    """The netbridge processes serving ``directory``."""
    return [p for p in psutil.process_iter(["cmdline"])
            if BRIDGE_COMMAND in (p.info["cmdline"] or ()) and any(
                directory in arg for arg in p.info["cmdline"])]


def test_a_killed_netbridge_is_replaced_and_the_stream_goes_on(bus_context, driver) -> None:
    # a window of a quarter of the stream: most of it is still to be sent when the bridge dies
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|rcv-wnd=131072"
    events: list[str] = []
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_exclusive_publication(channel, STREAM)
        reader = Reader(bus.add_subscription(
            channel, STREAM, on_available_image=lambda image: events.append("available"),
            on_unavailable_image=lambda image: events.append("unavailable")))
        deadline = time.monotonic() + 60
        sequence = 0

        def stream_until(condition) -> None:  # noqa: ANN001
            """Offer the next messages and read, until ``condition()`` (or the deadline)."""
            nonlocal sequence
            while not condition():
                assert time.monotonic() < deadline, (sequence, events)
                if sequence < COUNT and publication.offer(message(sequence)) > 0:
                    sequence += 1
                elif not reader.poll():
                    time.sleep(0.001)

        stream_until(lambda: len(reader.sequences) >= COUNT // 2)
        (first,) = bridges(bus_context.dir)
        first.kill()
        first.wait(10)
        stream_until(lambda: reader.sequences and reader.sequences[-1] == COUNT - 1)

        (second,) = bridges(bus_context.dir)
        assert second.pid != first.pid
        assert events == ["available", "unavailable", "available"], events
        received = reader.sequences
        assert received[: COUNT // 2] == list(range(COUNT // 2)) and reader.bad == 0
        assert all(a < b for a, b in zip(received, received[1:], strict=False))  # in order
        errors = [e.text for e in read_snapshot(bus_context.dir, errors=True).errors]
        assert any("went away with udp channels in use" in text for text in errors), errors


def test_a_netbridge_that_dies_before_it_registers_is_replaced(bus_context, driver) -> None:
    """Killed while starting up (before it is a client, so no client timeout reports it), the
    netbridge is started again by the driver's timer, and the stream flows."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with shmbus.connect(bus_context) as bus:
        reader = Reader(bus.add_subscription(channel, STREAM))
        (first,) = wait_until(lambda: bridges(bus_context.dir), 20,
                              "the driver to start a netbridge")
        first.kill()
        first.wait(10)
        publication = bus.add_exclusive_publication(channel, STREAM)
        deadline = time.monotonic() + 60
        sequence = 0
        while len(reader.sequences) < 100:
            assert time.monotonic() < deadline, (sequence, bridges(bus_context.dir))
            if sequence < 100 and publication.offer(message(sequence)) > 0:
                sequence += 1
            elif not reader.poll():
                time.sleep(0.001)
        assert reader.sequences == list(range(100)) and reader.bad == 0
        assert [p.pid for p in bridges(bus_context.dir)] != [first.pid]
