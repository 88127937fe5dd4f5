"""The request/reply call header: round trips, and malformed headers named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmbus.shm import call_header as ch


@given(st.integers(0, 2 ** 63 - 1), st.integers(-2 ** 31, 2 ** 31 - 1), st.booleans())
def test_a_request_header_round_trips(correlation_id, stream_id, idempotent):
    header = ch.decode(ch.encode_request(correlation_id, stream_id, idempotent=idempotent)
                       + b"payload")
    assert (header.kind, header.correlation_id, header.response_stream_id,
            header.idempotent) == (ch.REQUEST, correlation_id, stream_id, idempotent)


@pytest.mark.parametrize("kind", [ch.REPLY, ch.ERROR, ch.LOST])
def test_a_reply_header_round_trips(kind):
    header = ch.decode(ch.encode_reply(kind, 42))
    assert (header.kind, header.correlation_id, header.response_stream_id) == (kind, 42, 0)


def test_malformed_headers_are_named():
    with pytest.raises(ch.MalformedCall, match="at least 16 bytes, this one 3"):
        ch.decode(b"abc")
    with pytest.raises(ch.MalformedCall, match="version 9, expected 1"):
        ch.decode(ch.HEADER.pack(ch.REQUEST, 0, 9, 0, 1))
    with pytest.raises(ch.MalformedCall, match="unknown call kind 7"):
        ch.decode(ch.HEADER.pack(7, 0, ch.VERSION, 0, 1))
    with pytest.raises(ValueError, match="REPLY, ERROR or LOST, not 1"):
        ch.encode_reply(ch.REQUEST, 1)


def test_response_stream_ids_are_in_the_reserved_negative_range():
    for unique in (0, 1, 2 ** 30 - 2, 2 ** 30 - 1, 2 ** 40 + 17):
        stream_id = ch.response_stream_for(unique)
        assert -2 ** 31 <= stream_id < ch.RESPONSE_STREAM_BASE


@given(st.text(max_size=80), st.binary(max_size=64))
def test_the_reply_to_extension_round_trips(channel, data):
    if len(channel.encode()) > ch.MAX_REPLY_TO:
        return
    message = ch.encode_request(5, -7) + ch.encode_reply_to(channel) + data
    got, at = ch.read_reply_to(message)
    assert (got, message[at:]) == (channel, data)


def test_malformed_reply_to_extensions_are_named():
    head = ch.encode_request(5, -7)
    with pytest.raises(ch.MalformedCall, match="at least 18 bytes, this one 17"):
        ch.read_reply_to(head + b"x")
    with pytest.raises(ch.MalformedCall, match="reply-to length 40 does not fit"):
        ch.read_reply_to(head + (40).to_bytes(2, "little") + b"aeron:udp")
    with pytest.raises(ch.MalformedCall, match="reply-to length 300"):
        ch.read_reply_to(head + (300).to_bytes(2, "little") + bytes(300))
    with pytest.raises(ch.MalformedCall, match="not UTF-8"):
        ch.read_reply_to(head + (2).to_bytes(2, "little") + b"\xff\xfe")
    with pytest.raises(ValueError, match="at most 255"):
        ch.encode_reply_to("aeron:udp?endpoint=" + "h" * 250 + ":1")
