"""The native call path (shmbus/shm/native/calls.c) on a real bus, in one process: the header
offer_call writes, await_reply's hand-off of other messages, answer_request's outcomes for a
malformed request and a reply that is not a buffer, a fragmented request answered natively, and
the watched word that ends a wait.

Across processes, the same paths run in tests/shmbus/calls/test_request_reply.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import shmbus
from shmbus.shm import call_header
from shmbus.shm._native import answer_request, await_reply, offer_call
from shmbus.shm.log_buffer import IS_CONNECTED_OFFSET
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(120)
CHANNEL = "aeron:ipc"


def connected(publication: Any, subscription: Any) -> None:
    wait_until(lambda: publication.is_connected and subscription.images, 10, "connected")


def test_offer_call_writes_the_documented_header(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        sub = bus.add_subscription(CHANNEL, 7)
        pub = bus.add_publication(CHANNEL, 7)
        connected(pub, sub)
        assert offer_call(pub, call_header.REQUEST, call_header.IDEMPOTENT, -5, 2**40,
                          b"body") > 0
        message = next(sub.messages(timeout=5))
        assert message[call_header.HEADER_LENGTH:] == b"body"
        assert call_header.decode(message) == call_header.CallHeader(
            call_header.REQUEST, call_header.IDEMPOTENT, -5, 2**40)
        with pytest.raises(ValueError, match="kind 300"):
            offer_call(pub, 300, 0, 0, 1, b"")
        with pytest.raises(TypeError, match="on a Publication, not str"):
            offer_call("pub", call_header.REPLY, 0, 0, 1, b"")
        with pytest.raises(TypeError, match="buffer protocol"):
            offer_call(pub, call_header.REPLY, 0, 0, 1, 42)


def test_await_reply_hands_other_messages_on_and_returns_its_own(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        replies = bus.add_subscription(CHANNEL, 8)
        pub = bus.add_publication(CHANNEL, 8)
        connected(pub, replies)
        others: list[bytes] = []
        assert await_reply(replies, 3, 0.0, others.append) is None  # nothing there
        offer_call(pub, call_header.REPLY, 0, 0, 2, b"not yours")
        offer_call(pub, call_header.ERROR, 0, 0, 3, b"yours, but an error")
        offer_call(pub, call_header.REPLY, 0, 0, 3, b"yours")
        assert await_reply(replies, 3, 5.0, others.append) is None
        assert await_reply(replies, 3, 5.0, others.append) is None
        assert await_reply(replies, 3, 5.0, others.append) == b"yours"
        assert [call_header.decode(m).kind for m in others] == [call_header.REPLY,
                                                                call_header.ERROR]
        with pytest.raises(TypeError, match="await_reply"):
            await_reply(pub, 3, 0.0, others.append)


def test_answer_request_drops_a_malformed_request_and_answers_the_next(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        responder = bus.add_responder(CHANNEL, 9, lambda request: request[::-1])
        client = bus.add_requester(CHANNEL, 9)
        raw = bus.add_publication(CHANNEL, 9)
        wait_until(lambda: responder._requests.images and raw.is_connected, 10, "connected")
        member = responder._requests.images[0]._member
        assert raw.offer(b"short") > 0  # not a call: dropped, done
        assert answer_request(member, responder.handler, responder._replies, responder) == 3
        assert answer_request(member, responder.handler, responder._replies, responder) == 0
        call = client.submit(b"abc", timeout=10)
        wait_until(lambda: responder.poll() == 1, 10, "answered")
        assert call.result(timeout=10) == b"cba"
        with pytest.raises(TypeError, match="answer_request"):
            answer_request(member, responder.handler, [], responder)


def test_a_fragmented_request_is_answered_natively_whole(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        responder = bus.add_responder(CHANNEL, 12, lambda request: request[::-1])
        client = bus.add_requester(CHANNEL, 12)
        wait_until(lambda: responder._requests.images, 10, "connected")
        member = responder._requests.images[0]._member
        first = client.submit(b"first", timeout=10)  # makes the reply publication (Python)
        wait_until(lambda: responder.poll() == 1, 10, "answered")
        assert first.result(timeout=10) == b"tsrif"
        request = bytes(range(256)) * 16 + b"tail"  # 4 KiB: three fragments at mtu 1408
        calls = [client.submit(request[:n], timeout=10) for n in (len(request), 1500, 7)]
        for _ in calls:  # 1: replied in C, not 2 (handed to poll(handler, 1))
            wait_until(lambda: answer_request(member, responder.handler, responder._replies,
                                              responder) == 1, 10, "answered")
        assert [call.result(timeout=10) for call in calls] == [
            request[:n][::-1] for n in (len(request), 1500, 7)]


def test_a_reply_that_is_not_a_buffer_is_a_remote_type_error(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        responder = bus.add_responder(CHANNEL, 10, lambda request: 42)
        client = bus.add_requester(CHANNEL, 10)
        wait_until(lambda: responder._requests.images, 10, "connected")
        call = client.submit(b"x", timeout=10)
        wait_until(lambda: responder.poll() == 1, 10, "answered")
        with pytest.raises(shmbus.RemoteError, match="TypeError: .*int"):
            call.result(timeout=10)


def test_a_watched_word_that_moved_ends_a_wait_at_once(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        sub = bus.add_subscription(CHANNEL, 11)
        pub = bus.add_publication(CHANNEL, 11)
        connected(pub, sub)
        view = pub.log.metadata_view()
        sub._watch_word(view, IS_CONNECTED_OFFSET, 0)  # it holds 1: moved already
        started = time.monotonic()
        assert sub.wait(30) is False
        assert await_reply(sub, 1, 30.0, print) is None
        assert time.monotonic() - started < 10  # not the 30 s timeouts
        sub._watch_word(None)
        with pytest.raises(ValueError, match="offset 4094 does not fit"):
            sub._watch_word(view, 4094, 1)
        with pytest.raises(ValueError, match="offset 4096 does not fit its 4096 bytes"):
            sub._watch_word(view, 4096, 1)
        with pytest.raises(TypeError):
            sub._watch_word(42, 0, 1)
