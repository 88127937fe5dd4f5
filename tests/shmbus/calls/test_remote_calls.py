"""Which channels request/reply runs on, and the reply-to channels a responder accepts from a
request (shmbus/calls/remote_calls.py): every refusal names what is wrong."""

from __future__ import annotations

import socket

import pytest

from shmbus.calls import remote_calls as rc


def test_ipc_and_unicast_udp_services_are_taken():
    assert rc.service_channel("aeron:ipc", requester=True) == ("aeron:ipc", None)
    assert rc.service_channel("aeron:ipc?term-length=64k", requester=False) == (
        "aeron:ipc?term-length=64k", None)
    udp = "aeron:udp?endpoint=10.0.0.2:40123"
    assert rc.service_channel(udp, requester=False) == (udp, None)
    assert rc.service_channel(f"{udp}|response-endpoint=10.0.0.1:40124", requester=True) == (
        udp, "10.0.0.1:40124")
    assert rc.service_channel("aeron:udp?response-endpoint=h:1|endpoint=h2:2|mtu=1408",
                              requester=True) == ("aeron:udp?endpoint=h2:2|mtu=1408", "h:1")


@pytest.mark.parametrize("channel,requester,message", [
    ("aeron:tcp?endpoint=h:1", True, "unknown media 'tcp'"),
    ("ipc", True, "must start with 'aeron:'"),
    ("aeron:udp", True, "udp needs an endpoint"),
    ("aeron:udp?control=h:1|interface=127.0.0.1", False, "needs endpoint=host:port"),
    ("aeron-spy:aeron:udp?endpoint=h:1", False, "not run on spies"),
    ("aeron:udp?endpoint=224.0.1.1:40456", True, "multicast or multi-destination-cast"),
    ("aeron:udp?endpoint=h:2|control=h:1|control-mode=dynamic", True, "multi-destination"),
    ("aeron:ipc?response-endpoint=h:1", True, "for aeron:udp services"),
    ("aeron:udp?endpoint=h:1|response-endpoint=h:2", False, "a requester's parameter"),
    ("aeron:udp?endpoint=h:1|response-endpoint=h", True, "'h' is not host:port"),
    ("aeron:udp?endpoint=h:1|response-endpoint=h:0", True, "needs a port"),
    ("aeron:udp?endpoint=h:1|response-endpoint=239.1.1.1:5", True, "multicast address"),
    ("aeron:udp?endpoint=h:1|response-endpoint=a:1|response-endpoint=b:2", True,
     "given twice"),
    ("aeron:udp?endpoint=h:1|bogus=2", True, "unknown parameter 'bogus'"),
])
def test_other_channels_are_refused_naming_why(channel, requester, message):
    with pytest.raises(ValueError, match=message):
        rc.service_channel(channel, requester=requester)
    with pytest.raises(ValueError):
        rc.service_channel(42, requester=requester)  # type: ignore[arg-type]


def test_a_reply_to_is_exactly_a_unicast_udp_endpoint():
    assert rc.check_reply_to("aeron:udp?endpoint=10.1.2.3:999") == (
        "aeron:udp?endpoint=10.1.2.3:999")
    for foreign in ("aeron:ipc", "aeron:udp?endpoint=h:1|ttl=4", "aeron:udp?endpoint=h:0",
                    "aeron:udp?endpoint=224.0.0.1:5", "aeron:udp?endpoint=nohost",
                    "aeron:udp?control=h:1", ""):
        with pytest.raises(ValueError, match="reply-to"):
            rc.check_reply_to(foreign)


def test_a_requester_without_a_response_endpoint_gets_a_free_port_toward_the_service():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as service:
        service.bind(("127.0.0.1", 0))
        port = service.getsockname()[1]
        channel, reply_to = rc.requester_route(f"aeron:udp?endpoint=127.0.0.1:{port}")
    assert channel == f"aeron:udp?endpoint=127.0.0.1:{port}"
    assert reply_to is not None and reply_to.startswith("aeron:udp?endpoint=127.0.0.1:")
    rc.check_reply_to(reply_to)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # it is free
        probe.bind(("127.0.0.1", int(reply_to.rpartition(":")[2])))
    assert rc.requester_route("aeron:ipc") == ("aeron:ipc", None)
    assert rc.requester_route("aeron:udp?endpoint=h:1|response-endpoint=10.0.0.9:77") == (
        "aeron:udp?endpoint=h:1", "aeron:udp?endpoint=10.0.0.9:77")


@pytest.mark.parametrize("reply_to, source, answered", [
    ("aeron:udp?endpoint=10.0.0.1:40124", "10.0.0.1:51234", True),  # the ports may differ
    ("aeron:udp?endpoint=10.0.0.1:40124", "10.0.0.9:51234", False),  # a third host
    ("aeron:udp?endpoint=127.0.0.2:40124", "127.0.0.1:51234", False),
    ("aeron:udp?endpoint=localhost:40124", "127.0.0.1:51234", False),  # names, not addresses
    ("aeron:udp?endpoint=[::1]:40124", "::1:51234", True),
    ("aeron:udp?endpoint=[::1]:40124", "[::1]:51234", True),
    ("aeron:udp?endpoint=10.0.0.1:40124", "::ffff:10.0.0.1:51234", True),  # IPv4-mapped
    ("aeron:udp?endpoint=[::ffff:10.0.0.1]:40124", "10.0.0.1:51234", True),
    ("aeron:udp?endpoint=10.0.0.1:40124", "ipc", False),
    ("aeron:udp?endpoint=10.0.0.1:40124", "", False),
])
def test_an_unkeyed_service_answers_only_the_host_a_request_came_from(reply_to, source,
                                                                      answered):
    service = "aeron:udp?endpoint=10.0.0.2:40123"
    assert rc.may_answer(reply_to, source, service) is answered
    # a keyed service answers every reply-to: the key authenticated the request
    assert rc.may_answer(reply_to, source, f"{service}|key=prod-a") is True


def test_replies_carry_the_key_of_the_service_channel_and_nothing_else():
    reply_to = "aeron:udp?endpoint=10.0.0.1:40124"
    assert rc.keyed_reply_channel(reply_to, "aeron:udp?endpoint=10.0.0.2:40123") == reply_to
    assert rc.keyed_reply_channel(
        reply_to, "aeron:udp?endpoint=10.0.0.2:40123|mtu=1408|key=prod-a") == (
        f"{reply_to}|key=prod-a")
    # the reply-to a request carries stays exactly aeron:udp?endpoint=host:port
    with pytest.raises(ValueError, match="reply-to"):
        rc.check_reply_to(f"{reply_to}|key=prod-a")
    keyed = "aeron:udp?endpoint=127.0.0.1:40123|key=prod-a|response-endpoint=127.0.0.1:7"
    service, requester_reply_to = rc.requester_route(keyed)
    assert service == "aeron:udp?endpoint=127.0.0.1:40123|key=prod-a"
    assert requester_reply_to == "aeron:udp?endpoint=127.0.0.1:7"
    assert rc.keyed_reply_channel(requester_reply_to, service) == (
        "aeron:udp?endpoint=127.0.0.1:7|key=prod-a")
