"""The request/reply call header: round trips, and malformed headers named (hostile ones too:
cut short, unknown kind, version or flags, a reply-to extension of a bad length)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
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


# -- hostile headers: anything a writer of the stream may put there ------------------------------

KNOWN_FLAGS = ch.IDEMPOTENT | ch.REPLY_TO


def header_bytes() -> st.SearchStrategy[bytes]:
    """Headers near the valid ones (each field valid or not, cut short or not) and garbage."""
    fields = st.tuples(st.sampled_from([0, *sorted(ch.KINDS), 5, 255]),
                       st.sampled_from([0, ch.IDEMPOTENT, ch.REPLY_TO, KNOWN_FLAGS, 0x04, 0x80,
                                        0xFF]),
                       st.sampled_from([ch.VERSION, 0, 2, 0xFFFF]),
                       st.integers(-2**31, 2**31 - 1), st.integers(-2**63, 2**63 - 1))
    whole = fields.map(lambda f: ch.HEADER.pack(*f))
    return st.one_of(
        st.tuples(whole, st.one_of(st.just(ch.HEADER_LENGTH), st.integers(0, ch.HEADER_LENGTH)),
                  st.binary(max_size=8)).map(
            lambda t: t[0][:t[1]] + (t[2] if t[1] == ch.HEADER_LENGTH else b"")),
        st.binary(max_size=40))


@given(header_bytes())
@settings(max_examples=500)
def test_a_header_is_taken_only_whole_of_this_version_and_a_known_kind_and_flags(message):
    """decode and unpack agree: a header of 16 bytes or more, version 1, a known kind, only
    known flags is taken as written; anything else is MalformedCall naming what is wrong."""
    valid = (len(message) >= ch.HEADER_LENGTH and message[2:4] == b"\x01\x00"
             and message[0] in ch.KINDS and not message[1] & ~KNOWN_FLAGS)
    try:
        header = ch.decode(message)
    except ch.MalformedCall as e:
        assert not valid
        assert any(word in str(e) for word in ("at least 16 bytes", "version", "kind",
                                               "flags")), str(e)
        try:
            ch.unpack(message)
        except ch.MalformedCall as again:
            assert str(again) == str(e)
        else:
            raise AssertionError("unpack took what decode refused")
        return
    assert valid
    kind, flags, _, stream_id, correlation_id = ch.HEADER.unpack_from(message)
    assert header == ch.CallHeader(kind, flags, stream_id, correlation_id)
    assert ch.unpack(message) == (kind, flags, stream_id, correlation_id)


@given(st.binary(max_size=4), st.integers(0, 0xFFFF), st.binary(max_size=300))
@settings(max_examples=300)
def test_a_reply_to_extension_is_read_within_its_request_or_named(cut, length, rest):
    """Whatever follows a REPLY_TO header, read_reply_to gives the channel its length names and
    where the caller's data starts, within the message; or MalformedCall: cut short, a length
    past the message or past 255, not UTF-8."""
    head = ch.encode_request(9, -9, reply_to="aeron:udp?endpoint=h:1")[:ch.HEADER_LENGTH]
    message = head + (length.to_bytes(2, "little") + rest if len(cut) % 2 else cut[:1])
    try:
        channel, at = ch.read_reply_to(message)
    except ch.MalformedCall as e:
        assert any(word in str(e) for word in ("at least 18 bytes", "does not fit",
                                               "not UTF-8")), str(e)
        return
    assert len(cut) % 2 and length <= ch.MAX_REPLY_TO and at == ch.HEADER_LENGTH + 2 + length
    assert at <= len(message) and channel.encode() == rest[:length]
