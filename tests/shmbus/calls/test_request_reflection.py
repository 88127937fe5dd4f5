"""A responder on aeron:udp is no reflector (shmbus/calls/remote_calls.py): on an unkeyed service a
request whose reply-to names another host than the one it came from is dropped, counted
(``rr-reflections-refused``) and nothing goes to that host; a request naming its own host is
answered; on a keyed service every reply-to is answered, and the replies carry the key.

The forged requests come from plain UDP sockets speaking Aeron's wire protocol by hand
(tests/support/forged_peer.py) to a real driver and netbridge; the third host is a socket
bound to 127.0.0.2, listening. Then real requesters on a second bus, whose response endpoint
is on 127.0.0.2 while their requests leave from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import shmbus
from shmbus.shm import call_header
from shmbus.shm.counters import RR_REFLECTIONS_REFUSED, RR_SERVED
from tests.support.calls import bus_pair_serving, counter_total
from tests.support.forged_peer import ForgedPeer, ForgedReceiver, udp_socket
from tests.support.keyrings import write_keyring
from tests.support.networks import free_udp_port
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(180)
STREAM = 4201
#: the response stream a forged request names
RESPONSE_STREAM = -4201
#: how long the third host listens for anything a refused request could have sent it
THIRD_HOST_WAIT_S = 2.0


def echo(request: bytes) -> bytes:
    return b"echo:" + request


@contextlib.contextmanager
def serving(bus: shmbus.Client, channel: str) -> Iterator[shmbus.Responder]:
    """A responder on ``channel`` serving on a thread of its own, closed after."""
    responder = bus.add_responder(channel, STREAM, echo)
    thread = threading.Thread(target=responder.serve, kwargs={"timeout": 120}, daemon=True)
    thread.start()
    try:
        yield responder
    finally:
        responder.close()
        thread.join(10)


def forged_request(correlation_id: int, reply_to: str, body: bytes) -> bytes:
    return call_header.encode_request(correlation_id, RESPONSE_STREAM, reply_to=reply_to) + body


def channels_of(bus: shmbus.Client) -> str:
    """Every counter label of the bus, one text: the channels of its publications are there."""
    return "\n".join(c.label for c in bus.counters.counters())


def assert_silent(sock: socket.socket, seconds: float) -> None:
    """Nothing reaches ``sock`` within ``seconds``."""
    sock.settimeout(seconds)
    with pytest.raises(TimeoutError):
        data, source = sock.recvfrom(65536)
        pytest.fail(f"the third host got {len(data)} bytes from {source}")


def test_a_forged_request_naming_a_third_host_is_refused_and_one_naming_its_own_answered(
        bus_context, driver) -> None:
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    with shmbus.connect(bus_context) as bus, serving(bus, channel) as responder, \
            udp_socket() as sock, udp_socket("127.0.0.2") as third, udp_socket() as own:
        peer = ForgedPeer(sock, ("127.0.0.1", port), STREAM)
        peer.setup()
        wait_until(lambda: bool(responder._requests.images), 20, "the request image")
        third_port = third.getsockname()[1]
        peer.send(forged_request(1, f"aeron:udp?endpoint=127.0.0.2:{third_port}", b"reflect"))
        wait_until(lambda: counter_total(bus, RR_REFLECTIONS_REFUSED, STREAM) == 1, 20,
                   "the refused request to be counted")
        assert_silent(third, THIRD_HOST_WAIT_S)
        assert counter_total(bus, RR_SERVED, STREAM) == 0
        assert f"127.0.0.2:{third_port}" not in channels_of(bus)  # no publication toward it

        # the same host, another port: answered, the reply on the stream the request named
        own_port = own.getsockname()[1]
        peer.send(forged_request(2, f"aeron:udp?endpoint=127.0.0.1:{own_port}", b"legit"))
        [reply] = ForgedReceiver(own).receive(20)
        kind, _, _, correlation_id = call_header.unpack(reply)
        assert (kind, correlation_id) == (call_header.REPLY, 2)
        assert reply[call_header.HEADER_LENGTH:] == b"echo:legit"
        assert counter_total(bus, RR_SERVED, STREAM) == 1
        assert counter_total(bus, RR_REFLECTIONS_REFUSED, STREAM) == 1


def requester_and_response_port(bus: shmbus.Client, channel: str) -> tuple[Any, int]:
    """A requester whose replies come back to 127.0.0.2 (its requests leave from 127.0.0.1:
    the route to the service)."""
    port = free_udp_port()
    return bus.add_requester(f"{channel}|response-endpoint=127.0.0.2:{port}", STREAM), port


def test_an_unkeyed_service_refuses_a_requester_replying_elsewhere_and_a_keyed_one_answers(
        shm_dir, tmp_path) -> None:
    keyring = write_keyring(tmp_path, "rr-reflection")
    with bus_pair_serving(shm_dir, keyring=keyring) as (ctx_a, ctx_b, channel, _), \
            shmbus.connect(ctx_a) as bus_a, shmbus.connect(ctx_b) as bus_b:
        # unkeyed: the reply-to host (127.0.0.2) is not the requests' source (127.0.0.1)
        with serving(bus_b, channel):
            requester, _ = requester_and_response_port(bus_a, channel)
            # connected first: a call finding no connection after CONNECT_WAIT_S fails with
            # NoResponderError, and this one must reach the service to be refused
            wait_until(lambda: requester._publication.is_connected, 20, "the connection")
            with requester, pytest.raises(shmbus.RequestTimeoutError):
                requester.request(b"elsewhere", timeout=3)
            wait_until(lambda: counter_total(bus_b, RR_REFLECTIONS_REFUSED, STREAM) == 1, 20,
                       "the refused request to be counted")
            assert counter_total(bus_b, RR_SERVED, STREAM) == 0

        keyed = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|key=rr-reflection"
        with serving(bus_b, keyed) as responder:
            requester, port = requester_and_response_port(bus_a, keyed)
            with requester:
                assert requester.request(b"anywhere", timeout=10) == b"echo:anywhere"
                reply_channel = f"aeron:udp?endpoint=127.0.0.2:{port}|key=rr-reflection"
                assert reply_channel in channels_of(bus_a)  # the requester's subscription
                assert reply_channel in channels_of(bus_b)  # the responder's publication
                assert list(responder._replies) == [(reply_channel, requester.response_stream_id)]
