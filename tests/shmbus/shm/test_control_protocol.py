"""The control protocol's messages (shmbus/shm/control_protocol.py): Aeron's flyweights byte for
byte (aeron_control_protocol.h, Aeron 1.48 to 1.53), shmbus's own clear of Aeron's type ids,
and every message's bytes decoding to the message they encode."""

from __future__ import annotations

import struct
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmbus.shm import control_protocol as cp

#: Aeron's command and response type ids (ControlProtocolEvents)
AERON_TYPE_IDS = {
    cp.AddPublication: 0x01, cp.RemovePublication: 0x02, cp.AddExclusivePublication: 0x03,
    cp.AddSubscription: 0x04, cp.RemoveSubscription: 0x05, cp.ClientKeepalive: 0x06,
    cp.AddDestination: 0x07, cp.RemoveDestination: 0x08, cp.AddCounter: 0x09,
    cp.RemoveCounter: 0x0A, cp.ClientClose: 0x0B,
    cp.OnError: 0x0F01, cp.OnAvailableImage: 0x0F02, cp.OnPublicationReady: 0x0F03,
    cp.OnOperationSuccess: 0x0F04, cp.OnUnavailableImage: 0x0F05,
    cp.OnExclusivePublicationReady: 0x0F06, cp.OnSubscriptionReady: 0x0F07,
    cp.OnCounterReady: 0x0F08, cp.OnUnavailableCounter: 0x0F09, cp.OnClientTimeout: 0x0F0A,
}


def test_aerons_messages_have_aerons_type_ids() -> None:
    for cls, type_id in AERON_TYPE_IDS.items():
        assert cls.TYPE_ID == type_id, cls.__name__
    responses = {cls.TYPE_ID for cls in AERON_TYPE_IDS if cls.TYPE_ID >= 0x0F01}
    assert cp.AERON_RESPONSES == responses


def test_shmbus_own_messages_are_clear_of_aerons_ranges() -> None:
    """Aeron's commands are 0x01..0x12 and its responses 0x0F01..0x0F0D (1.53)."""
    own = set(cp.MESSAGES.values()) - set(AERON_TYPE_IDS)
    assert own
    for cls in own:
        assert cls.TYPE_ID >= 0x100 and not 0x0F00 <= cls.TYPE_ID <= 0x0FFF, cls.__name__


def test_add_subscription_is_aerons_subscription_command() -> None:
    """client id @0, correlation id @8, registration correlation id @16, stream @24, channel
    length @28, channel @32."""
    data = cp.AddSubscription(1, 2, 0, 1001, "aeron:ipc").encode()
    assert data == struct.pack("<qqqii", 1, 2, 0, 1001, 9) + b"aeron:ipc"


def test_publication_ready_is_aerons_buffers_ready() -> None:
    """correlation @0, registration @8, session @16, stream @20, pub-lmt id @24, channel status
    id @28, log file length @32, log file @36."""
    data = cp.OnPublicationReady(5, 4, -7, 1001, 12, -1, "/x/1.log").encode()
    assert data == struct.pack("<qqiiiii", 5, 4, -7, 1001, 12, -1, 8) + b"/x/1.log"


def test_available_image_pads_the_log_file_to_4_bytes() -> None:
    """correlation @0, session @8, stream @12, subscription registration @16, sub-pos id @24,
    log file length @28, log file padded to 4, source identity length, source identity."""
    data = cp.OnAvailableImage(9, -7, 1001, 3, 14, "/x/1.log2", "ipc").encode()
    assert data == (struct.pack("<qiiqii", 9, -7, 1001, 3, 14, 9) + b"/x/1.log2" + bytes(3)
                    + struct.pack("<i", 3) + b"ipc")
    assert cp.decode(0x0F02, data) == cp.OnAvailableImage(9, -7, 1001, 3, 14, "/x/1.log2",
                                                          "ipc")


def test_unavailable_image_and_counter_and_add_counter_layouts() -> None:
    assert cp.OnUnavailableImage(9, 3, 1001, "aeron:ipc").encode() == (
        struct.pack("<qqii", 9, 3, 1001, 9) + b"aeron:ipc")
    assert cp.OnUnavailableCounter(4, 17).encode() == struct.pack("<qi", 4, 17)
    assert cp.OnSubscriptionReady(3, -1).encode() == struct.pack("<qi", 3, -1)
    key = b"\x01\x02\x03\x04\x05"
    assert cp.AddCounter(1, 2, 1101, key, "lbl").encode() == (
        struct.pack("<qqii", 1, 2, 1101, 5) + key + bytes(3) + struct.pack("<i", 3) + b"lbl")


def test_remove_publication_reads_aerons_flags_word_as_trailing() -> None:
    """Aeron's client sends 32 bytes (a flags word after the registration id)."""
    data = struct.pack("<qqqq", 1, 2, 3, 0)
    assert cp.decode(0x02, data) == cp.RemovePublication(1, 2, 3)


def test_aerons_error_codes() -> None:
    assert (cp.INVALID_CHANNEL, cp.UNKNOWN_SUBSCRIPTION, cp.UNKNOWN_PUBLICATION,
            cp.CHANNEL_ENDPOINT_ERROR, cp.UNKNOWN_COUNTER, cp.UNKNOWN_COMMAND_TYPE_ID,
            cp.MALFORMED_COMMAND, cp.NOT_SUPPORTED, cp.GENERIC_ERROR, cp.STORAGE_SPACE) == (
        1, 2, 3, 4, 5, 6, 7, 8, 11, 12)


def test_an_unknown_type_and_an_overrunning_length_are_refused() -> None:
    with pytest.raises(cp.UnknownMessageType, match="0x10"):
        cp.decode(0x10, bytes(40))
    with pytest.raises(cp.MalformedMessage, match="overruns"):
        cp.decode(0x01, struct.pack("<qqii", 1, 2, 3, 100) + b"short")
    with pytest.raises(cp.MalformedMessage, match="OnAvailableImage"):
        cp.decode(0x0F02, bytes(10))


def _value(kind: str) -> st.SearchStrategy[Any]:
    if kind == "str":
        return st.text(max_size=40)
    if kind == "bytes":
        return st.binary(max_size=40)
    return st.integers(-(2**31), 2**31 - 1)


@st.composite
def messages(draw: Any) -> cp.Message:
    cls = draw(st.sampled_from(sorted(cp.MESSAGES.values(), key=lambda c: c.TYPE_ID)))
    codes = cls.FORMAT.format.lstrip("<")
    values = []
    for index, f in enumerate(fields(cls)):
        if f.type in ("str", "bytes"):
            values.append(draw(_value(f.type)))
        elif codes[index] == "q":
            values.append(draw(st.integers(-(2**63), 2**63 - 1)))
        else:
            values.append(draw(_value("int")))
    message: cp.Message = cls(*values)
    return message


@given(messages())
def test_every_message_decodes_to_what_it_encodes(message: cp.Message) -> None:
    assert cp.decode(message.TYPE_ID, message.encode()) == message
