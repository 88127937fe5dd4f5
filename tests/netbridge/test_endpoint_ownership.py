"""Receive endpoints are owned by one process: a second bus on this host that subscribes to a
unicast endpoint another bus's netbridge holds is refused with the address and the process; a
netbridge lets an endpoint go shortly after its last subscription, so another bus gets it.
Real drivers, netbridges and sockets on loopback."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
import zlib

import psutil
import pytest

import shmbus
from netbridge.transport import open_receive
from shmbus.settings.channel_uri import ChannelUri
from shmbus.shm import control_protocol as cp
from tests.support.counted_stream import stream_counted
from tests.support.drivers import stop_driver
from tests.support.networks import bridge_pid, bus_pair, channel_counters, free_udp_port
from tests.support.waits import wait_until
from tests.support.workers import bridge_workers

MESSAGES = 20_000
LINGER = 0.3


def test_unicast_receive_sockets_do_not_share_their_address() -> None:
    port = free_udp_port()
    unicast = open_receive(ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:{port}"), 0)
    try:
        assert unicast.sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 0
        with pytest.raises(OSError, match=f"udp endpoint 127.0.0.1:{port} is already bound by "
                                          f"pid {os.getpid()} "):
            open_receive(ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:{port}"), 0)
    finally:
        unicast.sock.close()
    # closed, the address is free at once
    open_receive(ChannelUri.parse(f"aeron:udp?endpoint=127.0.0.1:{port}"), 0).sock.close()
    multicast = open_receive(ChannelUri.parse(
        f"aeron:udp?endpoint=224.1.30.3:{port}|interface=127.0.0.1"), 0)
    try:  # many receivers on a host share a group
        assert multicast.sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
    finally:
        for sock in multicast.sockets():
            sock.close()


def test_an_endpoint_held_by_another_bus_is_refused_until_it_lets_go(shm_dir) -> None:
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, netbridge_endpoint_linger=LINGER)
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    spawn = mp.get_context("spawn")
    try:
        with shmbus.connect(ctx_a) as bus_a, shmbus.connect(ctx_b) as bus_b:
            first = bus_a.add_subscription(channel, 5)  # answered once A's bridge bound it
            holder = bridge_pid(drivers[0])

            # B's netbridge cannot bind it: B's subscriber hears why, at once
            with pytest.raises(shmbus.RegistrationError) as refused:
                bus_b.add_subscription(channel, 5)
            message = str(refused.value)
            assert refused.value.code == cp.CHANNEL_ENDPOINT_ERROR
            assert f"udp endpoint 127.0.0.1:{port} is already bound by pid {holder}" in message
            assert "netbridge" in message and channel in message
            # so does another stream on that endpoint
            with pytest.raises(shmbus.RegistrationError, match=f"127.0.0.1:{port}"):
                bus_b.add_subscription(channel, 6)

            # A's last subscription goes: after the linger, B gets the endpoint
            first.close()
            deadline = time.monotonic() + 20
            while True:
                try:
                    second = bus_b.add_subscription(channel, 5)
                    break
                except shmbus.RegistrationError as e:
                    # still A's, for the linger (unless A let go between B's bind and its
                    # look-up of who holds the endpoint: then no process is named)
                    assert f"127.0.0.1:{port} is already bound by" in str(e)
                    assert "by pid" not in str(e) or f"by pid {holder}" in str(e)
                    assert time.monotonic() < deadline, "A's netbridge never let it go"
                    time.sleep(0.05)

            # and B receives a whole stream exactly (sent by A's netbridge)
            with spawn.Pool(1) as pool:
                pub = pool.apply_async(bridge_workers.publish,
                                       (ctx_a, channel, 5, MESSAGES, 90))
                got: list[int] = []

                def on_message(buffer: memoryview, header: shmbus.Header) -> None:
                    data = bytes(buffer)
                    assert zlib.crc32(data[12:]) == int.from_bytes(data[8:12], "little")
                    assert data == bridge_workers.message(len(got))
                    got.append(int.from_bytes(data[:8], "little"))

                assembler = shmbus.FragmentAssembler(on_message)
                deadline = time.monotonic() + 90
                while len(got) < MESSAGES:
                    assert time.monotonic() < deadline, f"stuck at {len(got)} messages"
                    if not second.poll(assembler, 256):
                        time.sleep(0.001)
                assert pub.get(60) == MESSAGES
            assert got == list(range(MESSAGES)) and len(second.images) == 1
    finally:
        for process in drivers:
            stop_driver(process)


def udp_sockets(pid: int) -> int:
    return len(psutil.Process(pid).net_connections(kind="udp"))


def test_a_send_channel_is_closed_with_its_last_publication_and_opened_again(shm_dir) -> None:
    """A netbridge closes a channel's send socket (and frees its counters) once the channel's
    last publication has gone and lingered; a later publication on it opens it again and its
    stream arrives whole."""
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    try:
        with shmbus.connect(ctx_a) as bus_a, shmbus.connect(ctx_b) as bus_b:
            subscription = bus_b.add_subscription(channel, 3)
            for round_ in range(2):
                publication = bus_a.add_exclusive_publication(channel, 3)
                bridge = bridge_pid(drivers[0])
                stream_counted(publication, subscription, 500, f"round {round_}", 64)
                assert "bytes sent" in channel_counters(ctx_a)
                with_publication = udp_sockets(bridge)
                publication.close()
                # the sender lingers 2 s after its end
                closed = with_publication - 1
                wait_until(lambda pid=bridge, closed=closed: udp_sockets(pid) == closed, 20,
                           "the send socket to close")
                assert "bytes sent" not in channel_counters(ctx_a)  # its counters are freed
    finally:
        for driver in drivers:
            stop_driver(driver)
