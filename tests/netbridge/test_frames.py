"""Tests of the Aeron wire codec (netbridge.frames).

Golden bytes are written out by hand from the field offsets of Aeron's frame layouts (all
little-endian), never produced by the codec under test.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netbridge import frames as F

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def h(text: str) -> bytes:
    """Bytes from hex written with spaces and newlines; ``#`` starts a comment."""
    return bytes.fromhex("".join(line.split("#")[0] for line in text.splitlines()).replace(" ", ""))


def decode_one(datagram: bytes) -> F.Frame:
    frames = list(F.decode_frames(datagram))
    assert len(frames) == 1
    return frames[0]


# --- constants -------------------------------------------------------------------------------


def test_type_values_and_lengths_are_aerons() -> None:
    assert (F.HDR_TYPE_PAD, F.HDR_TYPE_DATA, F.HDR_TYPE_NAK, F.HDR_TYPE_SM) == (0, 1, 2, 3)
    assert (F.HDR_TYPE_ERR, F.HDR_TYPE_SETUP, F.HDR_TYPE_RTTM, F.HDR_TYPE_RES) == (4, 5, 6, 7)
    assert (F.HDR_TYPE_ATS_DATA, F.HDR_TYPE_ATS_SETUP, F.HDR_TYPE_ATS_SM) == (8, 9, 10)
    assert F.HDR_TYPE_RSP_SETUP == 11
    assert F.HDR_TYPE_EXT == 0xFFFF
    assert F.DATA_HEADER_LENGTH == 32
    assert F.SETUP_LENGTH == 40
    assert (F.SM_LENGTH, F.SM_LENGTH_WITH_GROUP_TAG) == (36, 44)
    assert F.NAK_LENGTH == 28
    assert F.RTTM_LENGTH == 40
    assert F.ERR_HEADER_LENGTH == 40
    assert F.ERR_MAX_MESSAGE_LENGTH == 1023
    assert (F.DATA_FLAG_BEGIN, F.DATA_FLAG_END, F.DATA_FLAG_EOS) == (0x80, 0x40, 0x20)
    assert (F.SETUP_FLAG_SEND_RESPONSE, F.SETUP_FLAG_GROUP) == (0x80, 0x40)
    assert (F.SM_FLAG_SETUP, F.SM_FLAG_EOS) == (0x80, 0x40)
    assert F.RTTM_FLAG_REPLY == 0x80
    assert F.ERR_FLAG_GROUP_TAG == 0x08


def test_align() -> None:
    assert [F.align(n) for n in (0, 1, 31, 32, 33, 46, 280, 1408)] == [
        0,
        32,
        32,
        32,
        64,
        64,
        288,
        1408,
    ]


# --- golden bytes ------------------------------------------------------------------------------

DATA_GOLDEN = h(
    """
    2e000000        # frame_length 46 @0
    00              # version @4
    c0              # flags B|E @5
    0100            # type DATA @6
    40000000        # term_offset 64 @8
    75 66 f3 ae     # session_id 0xaef36675 @12
    e9030000        # stream_id 1001 @16
    69 38 aa a3     # term_id 0xa3aa3869 @20
    0807060504030201  # reserved_value 0x0102030405060708 @24
    48656c6c6f20576f726c642120      # "Hello World! " @32
    30              # "0"
    """
)


DATA_FRAME = F.data_frame(term_offset=64, session_id=0xAEF36675 - 2**32, stream_id=1001,
                          term_id=0xA3AA3869 - 2**32, payload=b"Hello World! 0",
                          reserved_value=0x0102030405060708)


def test_data_frame_golden() -> None:
    frame = DATA_FRAME
    assert frame.frame_length == 46
    # On the wire the frame is padded to 64 bytes.
    assert F.encode_datagram([frame]) == DATA_GOLDEN + bytes(18)
    assert list(F.decode_frames(DATA_GOLDEN + bytes(18))) == [frame]


def test_fragment_flags_golden() -> None:
    middle = F.data_frame(
        term_offset=1408, session_id=1, stream_id=2, term_id=3, payload=b"", flags=0
    )
    assert middle.encode() == h("20000000 00 00 0100 80050000 01000000 02000000 03000000") + bytes(
        8
    )
    assert not middle.is_begin and not middle.is_end


HEARTBEAT_GOLDEN = h(
    """
    00000000 00 c0 0100   # frame_length 0, version 0, flags 0xc0, type DATA
    00010000              # term_offset 256
    07000000              # session_id 7
    0a000000              # stream_id 10
    ffffffff              # term_id -1
    0000000000000000      # reserved_value
    """
)


HEARTBEAT = F.heartbeat(term_offset=256, session_id=7, stream_id=10, term_id=-1)


def test_heartbeat_golden() -> None:
    beat = HEARTBEAT
    assert len(beat.encode()) == 32
    assert beat.is_heartbeat and not beat.is_end_of_stream
    assert F.is_heartbeat(HEARTBEAT_GOLDEN)
    assert not F.is_end_of_stream(HEARTBEAT_GOLDEN)
    decoded = decode_one(HEARTBEAT_GOLDEN)
    assert isinstance(decoded, F.DataHeader) and decoded.is_heartbeat and len(decoded.payload) == 0


def test_end_of_stream_heartbeat_golden() -> None:
    eos = F.heartbeat(term_offset=256, session_id=7, stream_id=10, term_id=-1, end_of_stream=True)
    expected = HEARTBEAT_GOLDEN[:5] + b"\xe0" + HEARTBEAT_GOLDEN[6:]
    assert eos.encode() == expected
    assert eos.is_end_of_stream and eos.is_heartbeat
    assert F.is_heartbeat(expected) and F.is_end_of_stream(expected)
    assert decode_one(expected) == eos


def test_is_heartbeat_needs_exactly_32_bytes_and_frame_length_0() -> None:
    assert not F.is_heartbeat(HEARTBEAT_GOLDEN + bytes(32))
    assert not F.is_heartbeat(HEARTBEAT_GOLDEN[:31])
    assert not F.is_heartbeat(b"\x20" + HEARTBEAT_GOLDEN[1:])  # frame_length 32
    assert not F.is_heartbeat(DATA_GOLDEN[:32])
    assert not F.is_end_of_stream(b"")


PAD_GOLDEN = h(
    """
    60010000 00 c0 0000   # frame_length 352, flags 0xc0, type PAD
    a0fe0000              # term_offset 65184
    01000000 e9030000     # session_id 1, stream_id 1001
    05000000              # term_id 5
    0000000000000000      # reserved_value
    """
)


PAD = F.pad_frame(frame_length=352, term_offset=65184, session_id=1, stream_id=1001, term_id=5)


def test_pad_frame_golden() -> None:
    # only the header goes on the wire (the golden round trip)
    assert PAD.is_padding and PAD.wire_length == 32
    assert decode_one(PAD_GOLDEN).frame_length == 352


SETUP_GOLDEN = h(
    """
    28000000 00 40 0500   # frame_length 40, flags GROUP, type SETUP
    c0010000              # term_offset 448 @8
    75 66 f3 ae           # session_id @12
    e9030000              # stream_id 1001 @16
    69 38 aa a3           # initial_term_id @20
    6a 38 aa a3           # active_term_id @24
    00000100              # term_length 65536 @28
    80050000              # mtu 1408 @32
    08000000              # ttl 8 @36
    """
)


SETUP = F.SetupFrame(flags=F.SETUP_FLAG_GROUP, term_offset=448, session_id=0xAEF36675 - 2**32,
                   stream_id=1001, initial_term_id=0xA3AA3869 - 2**32,
                   active_term_id=0xA3AA386A - 2**32, term_length=65536, mtu=1408, ttl=8)


def test_setup_golden() -> None:
    assert SETUP.frame_length == 40 and SETUP.type == 5


SM_GOLDEN = h(
    """
    24000000 00 40 0300   # frame_length 36, flags EOS, type SM
    75 66 f3 ae           # session_id @8
    e9030000              # stream_id 1001 @12
    69 38 aa a3           # consumption_term_id @16
    a0a80000              # consumption_term_offset 43168 @20
    00370000              # receiver_window 14080 @24
    37 a8 9d 6c 3e b0 e7 db   # receiver_id 0xdbe7b03e6c9da837 @28
    """
)


SM = F.StatusMessage(flags=F.SM_FLAG_EOS, session_id=0xAEF36675 - 2**32, stream_id=1001,
                   consumption_term_id=0xA3AA3869 - 2**32, consumption_term_offset=43168,
                   receiver_window=14080, receiver_id=0xDBE7B03E6C9DA837 - 2**64)


def test_status_message_golden() -> None:
    assert SM.frame_length == 36


SM_WITH_GROUP_TAG_GOLDEN = h(
    """
    2c000000 00 80 0300   # frame_length 44, flags SETUP, type SM
    00000000 00000000 00000000 00000000 00000000
    0200000000000000      # receiver_id 2 @28
    feffffffffffffff      # group_tag -2 @36
    """
)
SM_WITH_GROUP_TAG = F.StatusMessage(flags=F.SM_FLAG_SETUP, session_id=0, stream_id=0,
                                  consumption_term_id=0, consumption_term_offset=0,
                                  receiver_window=0, receiver_id=2, group_tag=-2)


def test_status_message_extra_bytes_not_44_are_not_a_group_tag() -> None:
    # frame_length 40 (application feedback): accepted, no group tag, as Aeron's sender does.
    datagram = b"\x28" + SM_GOLDEN[1:] + b"\x01\x02\x03\x04"
    sm = decode_one(datagram)
    assert isinstance(sm, F.StatusMessage) and sm.group_tag is None
    # Bytes past frame_length are ignored (Aeron accepts length >= frame_length).
    assert decode_one(SM_GOLDEN + b"\xff" * 8) == decode_one(SM_GOLDEN)


NAK_GOLDEN = h(
    """
    1c000000 00 00 0200   # frame_length 28, type NAK
    75 66 f3 ae           # session_id @8
    e9030000              # stream_id @12
    69 38 aa a3           # term_id @16
    00b00000              # term_offset 45056 @20
    000b0000              # length 2816 @24
    """
)


NAK = F.Nak(session_id=0xAEF36675 - 2**32, stream_id=1001, term_id=0xA3AA3869 - 2**32,
          term_offset=45056, length=2816)


RTTM_GOLDEN = h(
    """
    28000000 00 80 0600   # frame_length 40, flags REPLY (request), type RTTM
    01000000 02000000     # session_id 1 @8, stream_id 2 @12
    efcdab8967452301      # echo_timestamp 0x0123456789abcdef @16
    0000000000000000      # reception_delta 0 @24
    ffffffffffffff7f      # receiver_id 2**63-1 @32
    """
)


RTTM = F.RttMeasurement(flags=F.RTTM_FLAG_REPLY, session_id=1, stream_id=2,
                      echo_timestamp=0x0123456789ABCDEF, reception_delta=0,
                      receiver_id=2**63 - 1)


def test_rttm_golden() -> None:
    rttm = RTTM
    assert rttm.wants_reply
    echo = F.RttMeasurement(
        session_id=1, stream_id=2, echo_timestamp=rttm.echo_timestamp, receiver_id=rttm.receiver_id
    )
    assert not echo.wants_reply
    assert echo.encode()[5] == 0


ERR_GOLDEN = h(
    """
    2d000000 00 08 0400   # frame_length 45, flags GROUP_TAG, type ERR
    01000000 02000000     # session_id 1 @8, stream_id 2 @12
    0300000000000000      # receiver_id 3 @16
    0400000000000000      # group_tag 4 @24
    05000000              # error_code 5 @32
    05000000              # error_length 5 @36
    6f6f707321            # "oops!" @40
    """
)


ERR = F.ErrorFrame(flags=F.ERR_FLAG_GROUP_TAG, session_id=1, stream_id=2, receiver_id=3,
                 group_tag=4, error_code=5, message=b"oops!")


def test_error_frame_golden() -> None:
    assert ERR.frame_length == 45 and ERR.has_group_tag
    decoded = decode_one(ERR_GOLDEN)
    assert isinstance(decoded, F.ErrorFrame) and decoded.text == "oops!"


#: each frame above and the bytes written out by hand for it
GOLDEN_FRAMES = {
    "data": (DATA_FRAME, DATA_GOLDEN),
    "heartbeat": (HEARTBEAT, HEARTBEAT_GOLDEN),
    "pad": (PAD, PAD_GOLDEN),
    "setup": (SETUP, SETUP_GOLDEN),
    "status message": (SM, SM_GOLDEN),
    "status message with group tag": (SM_WITH_GROUP_TAG, SM_WITH_GROUP_TAG_GOLDEN),
    "nak": (NAK, NAK_GOLDEN),
    "rttm": (RTTM, RTTM_GOLDEN),
    "error": (ERR, ERR_GOLDEN),
}


@pytest.mark.parametrize("name", GOLDEN_FRAMES)
def test_golden_frames_encode_to_their_bytes_and_decode_from_them(name: str) -> None:
    frame, golden = GOLDEN_FRAMES[name]
    assert frame.encode() == golden
    assert decode_one(golden) == frame


def test_error_frame_message_limit() -> None:
    fields = dict(session_id=1, stream_id=2, receiver_id=3, error_code=1)
    assert len(F.ErrorFrame(**fields, message=b"x" * 1023).encode()) == 40 + 1023
    with pytest.raises(ValueError):
        F.ErrorFrame(**fields, message=b"x" * 1024).encode()


# --- unknown-but-valid types -------------------------------------------------------------------


@pytest.mark.parametrize("frame_type", sorted(F.UNINTERPRETED_TYPES))
def test_uninterpreted_types_decode_to_unknown_frame(frame_type: int) -> None:
    datagram = h("14000000 00 01") + frame_type.to_bytes(2, "little") + bytes(range(12))
    frame = decode_one(datagram)
    assert isinstance(frame, F.UnknownFrame)
    assert (frame.type, frame.flags, frame.frame_length) == (frame_type, 1, 20)
    assert frame.encode() == datagram
    assert F.encode_datagram([frame]) == datagram


def test_ext_type_is_0xffff() -> None:
    frame = decode_one(h("08000000 00 00 ffff"))
    assert isinstance(frame, F.UnknownFrame) and frame.type == 0xFFFF == F.HDR_TYPE_EXT


# --- walking datagrams -------------------------------------------------------------------------


def _frame(term_offset: int, payload: bytes, flags: int = 0xC0) -> F.DataHeader:
    return F.data_frame(
        term_offset=term_offset, session_id=5, stream_id=6, term_id=7, payload=payload, flags=flags
    )


def test_walk_packed_frames_with_alignment_and_final_pad() -> None:
    first = _frame(0, b"a" * 14)  # frame_length 46 -> 64 on the wire
    second = _frame(64, b"b" * 32, flags=F.DATA_FLAG_BEGIN)  # 64
    third = _frame(128, b"c" * 248, flags=F.DATA_FLAG_END)  # 280 -> 288
    pad = F.pad_frame(frame_length=352, term_offset=416, session_id=5, stream_id=6, term_id=7)
    datagram = F.encode_datagram([first, second, third, pad])
    assert len(datagram) == 64 + 64 + 288 + 32
    assert datagram[46:64] == bytes(18)
    decoded = list(F.decode_frames(datagram))
    assert decoded == [first, second, third, pad]
    assert F.encode_datagram(decoded) == datagram


def test_walk_tolerates_missing_alignment_after_last_frame() -> None:
    frame = _frame(0, b"xyz")
    assert list(F.decode_frames(frame.encode())) == [frame]


def test_pad_ends_the_walk() -> None:
    pad = F.pad_frame(frame_length=64, term_offset=0, session_id=1, stream_id=1, term_id=1)
    # The 32 bytes after the header are inside the PAD's frame_length: never read as a frame.
    assert list(F.decode_frames(pad.encode() + b"\xff" * 32)) == [pad]


def test_control_frame_ends_the_walk() -> None:
    assert list(F.decode_frames(NAK_GOLDEN + DATA_GOLDEN)) == [decode_one(NAK_GOLDEN)]


def test_heartbeat_followed_by_data() -> None:
    datagram = HEARTBEAT_GOLDEN + DATA_GOLDEN
    decoded = list(F.decode_frames(datagram))
    assert [f.frame_length for f in decoded] == [0, 46]


def test_data_payload_is_a_zero_copy_view() -> None:
    buffer = bytearray(DATA_GOLDEN)
    (frame,) = F.decode_frames(buffer)
    assert isinstance(frame, F.DataHeader) and isinstance(frame.payload, memoryview)
    assert frame.payload == b"Hello World! 0"
    buffer[32] = ord("J")
    assert bytes(frame.payload[:5]) == b"Jello"


def test_decode_accepts_memoryview_of_a_larger_buffer() -> None:
    buffer = bytearray(100) + bytearray(DATA_GOLDEN) + bytearray(50)
    view = memoryview(buffer)[100 : 100 + len(DATA_GOLDEN)]
    (frame,) = F.decode_frames(view)
    assert frame == decode_one(DATA_GOLDEN)


def test_encode_into_writes_at_offset() -> None:
    buffer = bytearray(b"\xee" * 100)
    nak = decode_one(NAK_GOLDEN)
    assert nak.encode_into(buffer, 10) == 28
    assert buffer[10:38] == NAK_GOLDEN and buffer[:10] == b"\xee" * 10 and buffer[38] == 0xEE
    with pytest.raises(ValueError):
        nak.encode_into(bytearray(27))
    with pytest.raises(ValueError):
        nak.encode_into(buffer, 80)


# --- errors ------------------------------------------------------------------------------------


def reason_of(datagram: bytes) -> str:
    with pytest.raises(F.MalformedFrame) as info:
        list(F.decode_frames(datagram))
    assert isinstance(info.value, ValueError)
    return info.value.reason


def test_decode_datagram_is_all_frames_or_none() -> None:
    """decode_datagram gives every frame of a valid datagram and None for a malformed one,
    even when frames before the malformed one were valid."""
    first, second = _frame(0, b"a" * 8), _frame(64, b"b" * 8)
    datagram = F.encode_datagram([first, second])
    assert F.decode_datagram(datagram) == [first, second]
    assert F.decode_datagram(datagram[:64] + bytes([0xFF]) + datagram[65:]) is None  # length
    assert F.decode_datagram(b"") is None


def with_frame_length(datagram: bytes, frame_length: int) -> bytes:
    return frame_length.to_bytes(4, "little", signed=True) + datagram[4:]


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [
        (b"", "short"),
        (b"\x00" * 7, "short"),
        (DATA_GOLDEN[:31], "short"),
        (SETUP_GOLDEN[:39], "short"),
        (SM_GOLDEN[:35], "short"),
        (NAK_GOLDEN[:27], "short"),
        (RTTM_GOLDEN[:39], "short"),
        (ERR_GOLDEN[:39], "short"),
        (DATA_GOLDEN[:4] + b"\x01" + DATA_GOLDEN[5:], "version"),
        (SM_GOLDEN[:4] + b"\xff" + SM_GOLDEN[5:], "version"),
        (DATA_GOLDEN[:6] + b"\x0c\x00" + DATA_GOLDEN[8:], "type"),
        (DATA_GOLDEN[:6] + b"\x34\x12" + DATA_GOLDEN[8:], "type"),
        (DATA_GOLDEN[:45], "length"),  # frame_length 46 runs past the datagram
        (with_frame_length(DATA_GOLDEN, 31), "length"),
        (with_frame_length(DATA_GOLDEN, -46), "length"),
        (with_frame_length(PAD_GOLDEN, 16), "length"),
        (with_frame_length(PAD_GOLDEN, -1), "length"),
        (with_frame_length(SETUP_GOLDEN, 39), "length"),
        (with_frame_length(SETUP_GOLDEN, 41), "length"),
        (with_frame_length(SM_GOLDEN, 35), "length"),
        (with_frame_length(SM_GOLDEN, 44), "length"),
        (with_frame_length(NAK_GOLDEN, 27), "length"),
        (with_frame_length(RTTM_GOLDEN, 2**31 - 1), "length"),
        (with_frame_length(ERR_GOLDEN, 44), "length"),  # error_length 5 does not fit
        (ERR_GOLDEN[:36] + (-1).to_bytes(4, "little", signed=True) + ERR_GOLDEN[40:], "length"),
        (h("07000000 00 00 0700") + bytes(8), "length"),  # RES shorter than a header
        (h("20000000 00 00 0b00") + bytes(8), "length"),  # RSP_SETUP past the datagram
    ],
)
def test_malformed_reasons(datagram: bytes, reason: str) -> None:
    assert reason_of(datagram) == reason


def test_malformed_frame_in_second_position_reports_its_offset() -> None:
    datagram = F.encode_datagram([_frame(0, b"x" * 32)]) + b"\x00" * 8
    with pytest.raises(F.MalformedFrame) as info:
        list(F.decode_frames(datagram))
    assert info.value.reason == "short" and info.value.offset == 64


def test_encode_rejects_inconsistent_frames() -> None:
    good = _frame(0, b"abc")
    bad_length = F.DataHeader(
        frame_length=40, term_offset=0, session_id=0, stream_id=0, term_id=0, payload=b"abc"
    )
    bad_heartbeat = F.DataHeader(
        frame_length=0, term_offset=0, session_id=0, stream_id=0, term_id=0, payload=b"abc"
    )
    bad_pad = F.DataHeader(
        frame_length=16, type=F.HDR_TYPE_PAD, term_offset=0, session_id=0, stream_id=0, term_id=0
    )
    bad_type = F.DataHeader(
        frame_length=32, type=F.HDR_TYPE_NAK, term_offset=0, session_id=0, stream_id=0, term_id=0
    )
    out_of_range = F.Nak(session_id=2**31, stream_id=0, term_id=0, term_offset=0, length=0)
    for frame in (bad_length, bad_heartbeat, bad_pad, bad_type, out_of_range):
        with pytest.raises(ValueError):
            frame.encode()
    with pytest.raises(ValueError):
        F.encode_datagram([decode_one(PAD_GOLDEN), good])
    with pytest.raises(ValueError):
        F.encode_datagram([decode_one(NAK_GOLDEN), good])


# --- property tests ----------------------------------------------------------------------------

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u8 = st.integers(0, 255)


def data_frames() -> st.SearchStrategy[F.DataHeader]:
    return st.builds(
        F.data_frame,
        term_offset=i32,
        session_id=i32,
        stream_id=i32,
        term_id=i32,
        payload=st.binary(max_size=200),
        flags=u8,
        reserved_value=i64,
    )


#: the strategy of a frame's field by its name; any other field is a 32-bit integer
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "flags": u8, "echo_timestamp": i64, "reception_delta": i64, "receiver_id": i64,
    "reserved_value": i64, "message": st.binary(max_size=F.ERR_MAX_MESSAGE_LENGTH)}


def frames_of(kind: type, defaults: tuple[str, ...] = ("version",),
              **values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Frames of the dataclass ``kind``, the fields named in ``defaults`` left at their default
    and every other drawn from ``values``, else from FIELD_VALUES, else any 32-bit integer."""
    return st.builds(kind, **{
        field.name: values.get(field.name, FIELD_VALUES.get(field.name, i32))
        for field in dataclasses.fields(kind)
        if field.name not in defaults or field.name in values})


def heartbeats() -> st.SearchStrategy[F.DataHeader]:
    return frames_of(F.DataHeader, ("version", "type", "payload"), frame_length=st.just(0))


def pads() -> st.SearchStrategy[F.DataHeader]:
    return frames_of(F.DataHeader, ("version", "payload"), frame_length=st.integers(32, 2**31 - 1),
                     type=st.just(F.HDR_TYPE_PAD))


def control_frames() -> st.SearchStrategy[F.Frame]:
    return st.one_of(
        frames_of(F.SetupFrame),
        frames_of(F.StatusMessage, group_tag=st.none() | i64),
        frames_of(F.Nak),
        frames_of(F.RttMeasurement),
        frames_of(F.ErrorFrame, group_tag=i64),
        st.builds(
            lambda frame_type, flags, body: F.UnknownFrame(
                flags=flags,
                type=frame_type,
                raw=(8 + len(body)).to_bytes(4, "little")
                + bytes([0, flags])
                + frame_type.to_bytes(2, "little")
                + body,
            ),
            st.sampled_from(sorted(F.UNINTERPRETED_TYPES)),
            u8,
            st.binary(max_size=64),
        ),
    )


def any_frame() -> st.SearchStrategy[F.Frame]:
    return st.one_of(data_frames(), heartbeats(), pads(), control_frames())


@FAST
@given(any_frame())
def test_round_trip_single_frame(frame: F.Frame) -> None:
    encoded = frame.encode()
    decoded = decode_one(encoded)
    assert decoded == frame
    assert type(decoded) is type(frame)
    assert decoded.encode() == encoded


def datagrams() -> st.SearchStrategy[list[F.Frame]]:
    """Frame lists as Aeron's sender packs them: DATA frames (and heartbeats), maybe a final
    PAD; or one control frame alone."""
    packed = st.tuples(
        st.lists(st.one_of(data_frames(), heartbeats()), min_size=1, max_size=6),
        st.none() | pads(),
    ).map(lambda parts: parts[0] + ([parts[1]] if parts[1] is not None else []))
    return packed | control_frames().map(lambda frame: [frame])


@FAST
@given(datagrams())
def test_round_trip_datagram(frames: list[F.Frame]) -> None:
    datagram = F.encode_datagram(frames)
    decoded = list(F.decode_frames(datagram))
    assert decoded == frames
    assert F.encode_datagram(decoded) == datagram


def decode_or_malformed(datagram: bytes) -> None:
    """Decoding either succeeds or raises MalformedFrame: nothing else may escape."""
    try:
        frames = list(F.decode_frames(datagram))
    except F.MalformedFrame as exc:
        assert exc.reason in {"short", "version", "type", "length"}
        return
    for frame in frames:
        frame.encode()  # anything decoded can be encoded again


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=128))
def test_random_bytes_only_raise_malformed(datagram: bytes) -> None:
    decode_or_malformed(datagram)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(sorted(F.KNOWN_TYPES | {12, 0x100})),
    st.integers(-4, 120),
    u8,
    st.binary(max_size=120),
)
def test_random_bodies_behind_plausible_headers_only_raise_malformed(
    frame_type: int, frame_length: int, flags: int, body: bytes
) -> None:
    header = frame_length.to_bytes(4, "little", signed=True) + bytes([0, flags])
    decode_or_malformed(header + frame_type.to_bytes(2, "little") + body)


@FAST
@given(datagrams(), st.data())
def test_every_truncation_and_byte_flip_only_raises_malformed(
    frames: list[F.Frame], data: st.DataObject
) -> None:
    datagram = F.encode_datagram(frames)
    for cut in range(len(datagram)):
        decode_or_malformed(datagram[:cut])
    position = data.draw(st.integers(0, len(datagram) - 1))
    value = data.draw(u8)
    decode_or_malformed(datagram[:position] + bytes([value]) + datagram[position + 1 :])


GOLDEN = [DATA_GOLDEN, HEARTBEAT_GOLDEN, PAD_GOLDEN, SETUP_GOLDEN, SM_GOLDEN, NAK_GOLDEN]


@pytest.mark.parametrize("datagram", [*GOLDEN, RTTM_GOLDEN, ERR_GOLDEN])
def test_every_truncation_of_golden_frames(datagram: bytes) -> None:
    for cut in range(len(datagram)):
        decode_or_malformed(datagram[:cut])
