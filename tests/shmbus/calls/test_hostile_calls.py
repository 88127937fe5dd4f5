"""Hostile call headers against a requester and a responder (shmbus/shm/call_header.py,
shmbus/calls/requester.py, shmbus/calls/responder.py, shmbus/shm/native/calls.c).

* On a real bus (a driver process; requester and responder in this process, the responder
  serving on a thread): a raw publication on the request stream writes requests cut short, of
  an unknown kind, version or flags, with a reply-to on IPC, garbage (some past the log's max
  message length), and well-formed requests naming the requester's response stream with ids
  it has no call open for or a settled call's id again (duplicates); a raw publication on the
  response stream (the log the responder's replies share) writes replies of the same kinds,
  id 0 among them. Property: every real call gets its own reply, each malformed request is
  dropped and counted once (``rr-handler-errors``), and each message the requester reads for
  no open call (malformed, a request, an id never used, a second reply) is dropped and
  counted once (``rr-late``); nothing raises, nothing hangs.
* Without I/O: a UDP responder's parsing of requests with a reply-to extension cut short, of a
  bad length, not UTF-8 or not a reply-to channel: counted and dropped before the handler, or
  the handler gets exactly the caller's data and the reply goes to the channel named.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmbus
from shmbus.calls.remote_calls import check_reply_to
from shmbus.calls.responder import Responder
from shmbus.shm import block_ring as br
from shmbus.shm import call_header as ch
from shmbus.shm.counters import RR_HANDLER_ERRORS, RR_LATE, RR_REFLECTIONS_REFUSED
from tests.support.forged_references import forge_reference
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(180)
CHANNEL = "aeron:ipc"
STREAM = 7301

#: malformed headers: (kind, flags, version); None for one cut short
MALFORMED = [(ch.REPLY, 0, ch.VERSION), (ch.ERROR, 0, ch.VERSION), (0, 0, ch.VERSION),
             (5, 0, ch.VERSION), (255, 0, ch.VERSION), (ch.REQUEST, 0, 0),
             (ch.REQUEST, 0, 2), (ch.REQUEST, 0, 0xFFFF), (ch.REQUEST, ch.REPLY_TO, ch.VERSION),
             (ch.REQUEST, 0x04, ch.VERSION), (ch.REQUEST, 0x80 | ch.IDEMPOTENT, ch.VERSION),
             None]

#: payloads of large-message reference frames no writer made (shmbus/shm/block_ring.py)
REFERENCES = [b"", b"SHBL", bytes(24), br.encode_reference(1 << 40, 10),
              br.encode_reference(4097, 10), br.encode_reference(0, 2**62)]

hostile_requests = st.lists(st.one_of(
    st.tuples(st.just("malformed"), st.sampled_from(MALFORMED), st.binary(max_size=40)),
    st.tuples(st.just("garbage"), st.sampled_from([0, 5, 15, 9000, 20_000]), st.binary()),
    st.tuples(st.just("unknown-id"), st.sampled_from([0, ch.IDEMPOTENT]), st.binary(max_size=40)),
    st.tuples(st.just("corrupt-reference"), st.sampled_from(REFERENCES), st.just(b"")),
), max_size=6)
hostile_replies = st.lists(st.one_of(
    st.tuples(st.just("malformed"), st.sampled_from(MALFORMED), st.binary(max_size=40)),
    st.tuples(st.just("request"), st.sampled_from([0, ch.IDEMPOTENT]), st.binary(max_size=40)),
    st.tuples(st.just("unknown-id"), st.sampled_from([ch.REPLY, ch.ERROR, ch.LOST]),
              st.sampled_from([0, 2**40, 2**63 - 1, -1])),
    st.tuples(st.just("corrupt-reference"), st.sampled_from(REFERENCES), st.just(b"")),
), max_size=6)


@pytest.fixture
def bus_context(bus_context):
    """The shared test context, with a client liveness timeout that a loaded machine does not
    trip: a client timed out mid-example has its claimed requests handed on (answered again,
    counted twice), which is not what this test is about."""
    return bus_context.with_(client_liveness_timeout=10.0)


def malformed(shape: tuple[int, int, int] | None, rest: bytes, response_stream: int) -> bytes:
    if shape is None:
        return ch.encode_request(5, response_stream)[:len(rest) % ch.HEADER_LENGTH]
    kind, flags, version = shape
    return ch.HEADER.pack(kind, flags, version, response_stream, 2**41) + rest


def test_hostile_requests_and_replies_are_counted_and_real_calls_answered(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        responder = bus.add_responder(CHANNEL, STREAM, lambda request: b"re:" + request)
        requester = bus.add_requester(CHANNEL, STREAM)
        raw_requests = bus.add_publication(CHANNEL, STREAM)
        raw_replies = bus.add_publication(ch.RESPONSE_CHANNEL, requester.response_stream_id)
        stop = threading.Event()

        served: list[BaseException] = []

        def serve() -> None:
            try:
                while not stop.is_set():
                    responder.serve(timeout=0.05)
            except BaseException as e:  # a hostile request must not end the serve loop
                served.append(e)
                raise

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        wait_until(lambda: requester.request(b"hello", timeout=10) == b"re:hello", 20,
                   "the service to answer")
        wait_until(lambda: raw_requests.is_connected and raw_replies.is_connected, 10,
                   "raw publications connected")
        # the raw replies go into the log the responder's replies share: read in write order
        assert raw_replies.log.path == responder._replies[requester.response_stream_id].log.path
        response = requester.response_stream_id
        import traceback
        log: list[str] = []
        add = requester._counters.add

        def spy_add(type_id: int, delta: int = 1) -> None:
            if type_id == RR_LATE:
                log.append("".join(traceback.format_stack(limit=4)[:-1]))
            add(type_id, delta)
        requester._counters.add = spy_add
        original = requester._on_reply_message

        def spy(message: bytes) -> None:
            log.append(repr(bytes(message)[:20]))
            original(message)
        requester._on_reply_message = spy
        requester._on_reply = spy
        # a reply for id 0 (no call has it) read while no lone call waits: counted at once
        # (it was kept as a lone call's early reply, counted late only by a later lone call)
        late = requester._counters.get(RR_LATE)
        assert raw_replies.publish(ch.encode_reply(ch.REPLY, 0) + b"zero", timeout=5) > 0
        assert requester.submit(b"x", timeout=10).result(timeout=10) == b"re:x"
        assert requester._counters.get(RR_LATE) - late == 1
        calls = [0]
        settled: list[int] = []

        def call(lone: bool, body: bytes) -> None:
            if lone:
                assert requester.request(body, timeout=10) == b"re:" + body
                settled.append(next(requester._ids) - 1)  # (its id; one id skipped)
            else:
                pending = requester.submit(body, timeout=10)
                assert pending.result(timeout=10) == b"re:" + body
                settled.append(pending._pending.correlation_id)
            calls[0] += 1

        @given(requests=hostile_requests, replies=hostile_replies, lone=st.booleans(),
               duplicate=st.booleans())
        @settings(max_examples=25)
        def check(requests: list[tuple[str, Any, Any]], replies: list[tuple[str, Any, Any]],
                  lone: bool, duplicate: bool) -> None:
            log.clear()
            errors = responder._counters.get(RR_HANDLER_ERRORS)
            late = requester._counters.get(RR_LATE)
            want_errors = want_late = 0
            for kind, shape, rest in replies:
                if kind == "corrupt-reference":
                    forge_reference(raw_replies, shape)
                    want_late += 1
                    continue
                if kind == "malformed":
                    message = malformed(shape, rest, 0)
                elif kind == "request":
                    message = ch.encode_request(settled[-1], response, idempotent=bool(shape))
                else:
                    message = ch.encode_reply(shape, rest)
                assert raw_replies.publish(message, timeout=5) > 0
                want_late += 1
            for kind, shape, rest in requests:
                if kind == "corrupt-reference":
                    forge_reference(raw_requests, shape)
                    want_errors += 1
                    continue
                if kind == "malformed":
                    message = malformed(shape, rest, response)
                    want_errors += 1
                elif kind == "garbage":  # (kind 0: never a request by chance)
                    message = b"\0" * min(shape, 1) + (rest * shape)[:max(0, shape - 1)]
                    want_errors += 1
                else:  # well-formed, for an id never used: answered, the reply counted late
                    message = ch.encode_request(2**50 + len(rest), response,
                                                idempotent=bool(shape)) + rest
                    want_late += 1
                assert raw_requests.publish(message, timeout=5) > 0
            body = bytes(range(calls[0] % 256)) + b"!"
            call(lone, body)
            if duplicate:  # the same call again (its id, its body): answered, counted late
                raw_requests.publish(ch.encode_request(settled[-1], response) + body, timeout=5)
                raw_replies.publish(ch.encode_reply(ch.REPLY, settled[-1]) + body, timeout=5)
                want_late += 2
                call(not lone, b"after the duplicates")
            # every hostile message lies before the last real request or reply: all read
            assert responder._counters.get(RR_HANDLER_ERRORS) - errors == want_errors
            if requester._counters.get(RR_LATE) - late != want_late:
                print("LOG", lone, duplicate, replies, requests)
                print("\n".join(log))
            assert requester._counters.get(RR_LATE) - late == want_late
            assert requester.in_flight == 0
            assert not served, served

        try:
            check()
        finally:
            stop.set()
            server.join(10)
        assert not server.is_alive()


# -- a UDP responder's reply-to extension, without I/O ------------------------------------------

SOURCE = "127.0.0.1:40123"  # where requests come from (the image's source identity)
SERVICE = "aeron:udp?endpoint=127.0.0.1:40500"
CHANNELS = ["aeron:udp?endpoint=127.0.0.1:4000", "aeron:udp?endpoint=127.0.0.1:65535",
            "aeron:udp?endpoint=10.1.2.3:9",  # another host: a reflection, refused
            "aeron:udp?endpoint=127.0.0.1:0", "aeron:udp?endpoint=127.0.0.1",
            "aeron:udp?endpoint=127.0.0.1:4000|key=k", "aeron:ipc", "", "é" * 10,
            "aeron:udp?endpoint=224.0.0.1:4000"]


class Counts:
    def __init__(self) -> None:
        self.values: dict[int, int] = {}

    def add(self, type_id: int, delta: int = 1) -> None:
        self.values[type_id] = self.values.get(type_id, 0) + delta

    def adder(self, type_id: int) -> Any:
        return lambda delta: self.add(type_id, delta)

    def get(self, type_id: int) -> int:
        return self.values.get(type_id, 0)


@given(kind=st.sampled_from([ch.REQUEST, ch.REPLY, 7]),
       flags=st.sampled_from([ch.REPLY_TO, ch.REPLY_TO | ch.IDEMPOTENT, 0, 0x06]),
       channel=st.one_of(st.sampled_from(CHANNELS).map(str.encode), st.binary(max_size=30)),
       length=st.one_of(st.none(), st.integers(0, 0xFFFF)),
       cut=st.one_of(st.none(), st.integers(0, 60)),
       data=st.binary(max_size=20))
@settings(max_examples=400)
def test_a_udp_responder_answers_only_a_request_with_a_whole_reply_to_extension(
        kind: int, flags: int, channel: bytes, length: int | None, cut: int | None,
        data: bytes) -> None:
    counts = Counts()
    handled: list[bytes] = []
    replies: list[tuple[Any, int, int, bytes]] = []
    responder = Responder(SERVICE, 5, lambda request: handled.append(request) or b"ok",
                          requests=None,  # type: ignore[arg-type]
                          counters=counts,  # type: ignore[arg-type]
                          reply_publication=None,  # type: ignore[arg-type]
                          on_close=lambda: None, remote=True)
    responder._reply = lambda *reply: replies.append(reply)  # type: ignore[method-assign]
    responder._source = SOURCE
    named = len(channel) if length is None else length
    message = (ch.HEADER.pack(kind, flags, ch.VERSION, -77, 99)
               + named.to_bytes(2, "little") + channel + data)
    if cut is not None:
        message = message[:cut]
    responder._on_remote_request(memoryview(message), None)  # type: ignore[arg-type]

    # the model: what a responder may take from these bytes
    ok = (len(message) >= ch.HEADER_LENGTH + 2 and kind == ch.REQUEST
          and flags & ch.REPLY_TO and not flags & ~ch.KNOWN_FLAGS and named <= ch.MAX_REPLY_TO
          and len(message) >= ch.HEADER_LENGTH + 2 + named)
    if ok:
        try:
            reply_to = check_reply_to(message[ch.HEADER_LENGTH + 2:][:named].decode())
        except ValueError:  # UnicodeDecodeError among them
            ok = False
    if not ok:
        assert counts.values == {RR_HANDLER_ERRORS: 1} and not handled and not replies
        return
    if not reply_to.startswith("aeron:udp?endpoint=127.0.0.1:"):
        assert counts.values == {RR_REFLECTIONS_REFUSED: 1} and not handled and not replies
        return
    assert counts.values == {} and handled == [message[ch.HEADER_LENGTH + 2 + named:]]
    assert replies == [((reply_to, -77), ch.REPLY, 99, b"ok")]
