"""The control frames, sent one per datagram: SETUP, SM, NAK, RTTM and ERR, and the frames of
types Aeron defines that the codec does not interpret (RES, ATS_*, RSP_SETUP, EXT), kept as
raw bytes (docs/protocol.md, Frames on the wire).

Each frame's fixed part is a :class:`~netbridge.frame_header.FrameLayout`; :data:`DECODERS`
maps every control type to the decoder the datagram walk (:func:`netbridge.frames.decode_frames`)
calls with the frame's offset, the bytes left in the datagram and its frame_length. A decoder
ignores bytes past the fixed part (and past ERR's text) up to frame_length, as Aeron's driver
does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Final, TypeVar

from netbridge.frame_header import (
    COMMON_HEADER,
    CURRENT_VERSION,
    ERR_FLAG_GROUP_TAG,
    ERR_HEADER_LENGTH,
    ERR_MAX_MESSAGE_LENGTH,
    FRAME_HEADER_LENGTH,
    HDR_TYPE_ERR,
    HDR_TYPE_NAK,
    HDR_TYPE_RTTM,
    HDR_TYPE_SETUP,
    HDR_TYPE_SM,
    NAK_LENGTH,
    RTTM_FLAG_REPLY,
    RTTM_LENGTH,
    SETUP_LENGTH,
    SM_LENGTH,
    SM_LENGTH_WITH_GROUP_TAG,
    UNINTERPRETED_TYPES,
    Buffer,
    FrameLayout,
    MalformedFrame,
    check_control_length,
    require_room,
)

__all__ = [
    "DECODERS",
    "ControlFrame",
    "ErrorFrame",
    "Nak",
    "RttMeasurement",
    "SetupFrame",
    "StatusMessage",
    "UnknownFrame",
]

_SETUP: Final = FrameLayout(
    "iiiiiiii", "term_offset", "session_id", "stream_id", "initial_term_id", "active_term_id",
    "term_length", "mtu", "ttl",
)
_SM_FIELDS: Final = ("session_id", "stream_id", "consumption_term_id",
                     "consumption_term_offset", "receiver_window", "receiver_id")
_SM: Final = FrameLayout("iiiiiq", *_SM_FIELDS)
_SM_WITH_GROUP_TAG: Final = FrameLayout("iiiiiqq", *_SM_FIELDS, "group_tag")
_NAK: Final = FrameLayout("iiiii", "session_id", "stream_id", "term_id", "term_offset", "length")
_RTTM: Final = FrameLayout(
    "iiqqq", "session_id", "stream_id", "echo_timestamp", "reception_delta", "receiver_id"
)
_ERR: Final = FrameLayout(
    "iiqqii", "session_id", "stream_id", "receiver_id", "group_tag", "error_code", "error_length"
)

assert _SETUP.size == SETUP_LENGTH
assert _SM.size == SM_LENGTH
assert _SM_WITH_GROUP_TAG.size == SM_LENGTH_WITH_GROUP_TAG
assert _NAK.size == NAK_LENGTH
assert _RTTM.size == RTTM_LENGTH
assert _ERR.size == ERR_HEADER_LENGTH


class _Encoded(ABC):
    """What every control frame class has: :meth:`encode`, by its own ``encode_into``."""

    __slots__ = ()

    @property
    @abstractmethod
    def frame_length(self) -> int:
        """The frame's length in bytes, header included."""

    @abstractmethod
    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the frame at ``offset``; return its length."""

    def encode(self) -> bytes:
        """The frame alone, ``frame_length`` bytes."""
        out = bytearray(self.frame_length)
        self.encode_into(out)
        return bytes(out)


class _FixedSize(_Encoded):
    """A control frame that is its fixed part (``_layout``) and nothing else."""

    __slots__ = ()

    _layout: ClassVar[FrameLayout]

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the frame (``frame_length`` bytes) at ``offset``; return its length."""
        return self._layout.encode_into(self, buffer, offset)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetupFrame(_FixedSize):
    """SETUP (40 bytes): announces a stream's session, initial and active term, term length,
    MTU and TTL. Flags: SETUP_FLAG_GROUP (MDC/multicast), SETUP_FLAG_SEND_RESPONSE."""

    version: int = CURRENT_VERSION
    flags: int = 0
    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu: int
    ttl: int = 0

    frame_length = SETUP_LENGTH
    type = HDR_TYPE_SETUP
    _layout = _SETUP



@dataclass(frozen=True, slots=True, kw_only=True)
class StatusMessage(_Encoded):
    """SM: the receiver's consumption position and window. 36 bytes, or 44 when ``group_tag``
    is not None. Flags: SM_FLAG_SETUP (asks for a SETUP), SM_FLAG_EOS.

    When decoding, the group tag is read only from a frame whose frame_length is exactly 44
    (as Aeron's sender does); extra bytes of any other length are ignored.
    """

    version: int = CURRENT_VERSION
    flags: int = 0
    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int
    group_tag: int | None = None

    type = HDR_TYPE_SM

    @property
    def frame_length(self) -> int:
        return SM_LENGTH if self.group_tag is None else SM_LENGTH_WITH_GROUP_TAG

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the 36- or 44-byte frame at ``offset``; return its length."""
        layout = _SM if self.group_tag is None else _SM_WITH_GROUP_TAG
        return layout.encode_into(self, buffer, offset)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nak(_FixedSize):
    """NAK (28 bytes): asks the sender to resend ``length`` bytes at (term_id, term_offset)."""

    version: int = CURRENT_VERSION
    flags: int = 0
    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int

    frame_length = NAK_LENGTH
    type = HDR_TYPE_NAK
    _layout = _NAK



@dataclass(frozen=True, slots=True, kw_only=True)
class RttMeasurement(_FixedSize):
    """RTTM (40 bytes). With RTTM_FLAG_REPLY (0x80) it is a request that wants an echo; the echo
    is sent with flags 0, the same echo_timestamp and receiver_id. (Wireshark labels 0x80
    "Reply", but in Aeron's driver it marks the request.)"""

    version: int = CURRENT_VERSION
    flags: int = 0
    session_id: int
    stream_id: int
    echo_timestamp: int
    reception_delta: int = 0
    receiver_id: int

    frame_length = RTTM_LENGTH
    type = HDR_TYPE_RTTM
    _layout = _RTTM

    @property
    def wants_reply(self) -> bool:
        return bool(self.flags & RTTM_FLAG_REPLY)

    def echo(self) -> RttMeasurement:
        """The echo of this request, as Aeron sends it: flags 0, reception_delta 0, and this
        request's session, stream, echo_timestamp and receiver_id."""
        return RttMeasurement(
            flags=0,
            session_id=self.session_id,
            stream_id=self.stream_id,
            echo_timestamp=self.echo_timestamp,
            reception_delta=0,
            receiver_id=self.receiver_id,
        )



@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorFrame(_Encoded):
    """ERR (40 bytes + message): an error the receiver reports for a stream.

    ``group_tag`` is the raw field; it is meaningful only when ``flags`` has ERR_FLAG_GROUP_TAG
    (see :attr:`has_group_tag`). ``message`` is the raw text (UTF-8 by convention, at most
    ERR_MAX_MESSAGE_LENGTH bytes when encoding); :attr:`text` decodes it. Decoding requires
    40 + error_length <= frame_length and ignores any bytes between the text and frame_length.
    """

    version: int = CURRENT_VERSION
    flags: int = 0
    session_id: int
    stream_id: int
    receiver_id: int
    group_tag: int = 0
    error_code: int
    message: bytes | memoryview = b""

    type = HDR_TYPE_ERR

    @property
    def frame_length(self) -> int:
        return ERR_HEADER_LENGTH + len(self.message)

    @property
    def error_length(self) -> int:
        """The message's length in bytes, as the error_length field carries it."""
        return len(self.message)

    @property
    def has_group_tag(self) -> bool:
        return bool(self.flags & ERR_FLAG_GROUP_TAG)

    @property
    def text(self) -> str:
        return bytes(self.message).decode("utf-8", errors="replace")

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the frame (header then message) at ``offset``; return its length."""
        size = len(self.message)
        if size > ERR_MAX_MESSAGE_LENGTH:
            raise ValueError(f"error message of {size} bytes exceeds {ERR_MAX_MESSAGE_LENGTH}")
        length = _ERR.encode_into(self, buffer, offset, ERR_HEADER_LENGTH + size)
        start = offset + ERR_HEADER_LENGTH
        memoryview(buffer)[start : start + size] = self.message
        return length


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownFrame(_Encoded):
    """A frame of a type Aeron defines but this codec does not interpret (RES, ATS_*, RSP_SETUP,
    EXT): its header fields and its ``frame_length`` raw bytes, header included."""

    version: int = CURRENT_VERSION
    flags: int = 0
    type: int
    raw: bytes | memoryview

    @property
    def frame_length(self) -> int:
        return len(self.raw)

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the raw bytes at ``offset`` (the common header is taken from them); return
        their length."""
        size = len(self.raw)
        require_room(buffer, offset, size)
        memoryview(buffer)[offset : offset + size] = self.raw
        return size


ControlFrame = SetupFrame | StatusMessage | Nak | RttMeasurement | ErrorFrame | UnknownFrame

#: A decoder: (datagram, the frame's offset, bytes left from there, its frame_length) to the
#: frame, or MalformedFrame.
Decoder = Callable[[memoryview, int, int, int], ControlFrame]

_Fixed = TypeVar("_Fixed", SetupFrame, Nak, RttMeasurement)


def _fixed_size(name: str, layout: FrameLayout, frame_class: Callable[..., _Fixed]) -> Decoder:
    """The decoder of a frame that is its fixed part and nothing else."""
    def decode(view: memoryview, offset: int, remaining: int, frame_length: int) -> _Fixed:
        check_control_length(name, layout.size, offset, remaining, frame_length)
        return frame_class(**layout.decode(view, offset))
    return decode


def _decode_sm(view: memoryview, offset: int, remaining: int, frame_length: int) -> StatusMessage:
    check_control_length("SM", SM_LENGTH, offset, remaining, frame_length)
    layout = _SM_WITH_GROUP_TAG if frame_length == SM_LENGTH_WITH_GROUP_TAG else _SM
    return StatusMessage(**layout.decode(view, offset))


def _decode_err(view: memoryview, offset: int, remaining: int, frame_length: int) -> ErrorFrame:
    check_control_length("ERR", ERR_HEADER_LENGTH, offset, remaining, frame_length)
    fields = _ERR.decode(view, offset)
    error_length = fields.pop("error_length")
    if error_length < 0 or ERR_HEADER_LENGTH + error_length > frame_length:
        raise MalformedFrame(
            "length", f"ERR error_length {error_length} in frame_length {frame_length}", offset
        )
    start = offset + ERR_HEADER_LENGTH
    return ErrorFrame(message=view[start : start + error_length], **fields)


def _decode_unknown(
    view: memoryview, offset: int, remaining: int, frame_length: int
) -> UnknownFrame:
    _length, version, flags, frame_type = COMMON_HEADER.unpack_from(view, offset)
    if frame_length < FRAME_HEADER_LENGTH or frame_length > remaining:
        raise MalformedFrame("length", f"type {frame_type} frame_length {frame_length}", offset)
    raw = view[offset : offset + frame_length]
    return UnknownFrame(version=version, flags=flags, type=frame_type, raw=raw)


#: Every control type's decoder, the uninterpreted types' included.
DECODERS: Final[dict[int, Decoder]] = {
    HDR_TYPE_SETUP: _fixed_size("SETUP", _SETUP, SetupFrame),
    HDR_TYPE_SM: _decode_sm,
    HDR_TYPE_NAK: _fixed_size("NAK", _NAK, Nak),
    HDR_TYPE_RTTM: _fixed_size("RTTM", _RTTM, RttMeasurement),
    HDR_TYPE_ERR: _decode_err,
    **dict.fromkeys(UNINTERPRETED_TYPES, _decode_unknown),
}
