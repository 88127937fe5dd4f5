"""Aeron wire codec: the frames of Aeron's transport protocol, encoded and decoded
(docs/protocol.md, Frames on the wire).

Sans-IO and pure Python: nothing here touches a socket or a clock. Every layout, type value,
flag and length is the one Aeron's media driver puts on the wire (little-endian, no gaps):

=========  ======  =====================================================================
frame      length  fields after the 8-byte common header (frame_length, version, flags, type)
=========  ======  =====================================================================
DATA, PAD  32 (+)  term_offset, session_id, stream_id, term_id, reserved_value (int64)
SETUP      40      term_offset, session_id, stream_id, initial_term_id, active_term_id,
                   term_length, mtu, ttl
SM         36/44   session_id, stream_id, consumption_term_id, consumption_term_offset,
                   receiver_window, receiver_id (int64) [, group_tag (int64)]
NAK        28      session_id, stream_id, term_id, term_offset, length
RTTM       40      session_id, stream_id, echo_timestamp, reception_delta, receiver_id (int64s)
ERR        40 (+)  session_id, stream_id, receiver_id, group_tag (int64s), error_code,
                   error_length, then error_length bytes of text (at most 1023)
=========  ======  =====================================================================

Representation choices (the contract callers rely on):

* All 32-bit fields are decoded as signed ``int32`` and all 64-bit fields as signed ``int64``,
  as Aeron declares them; encoders accept the same ranges. The ``type`` field is decoded as an
  unsigned 16-bit value, so the extension type is ``HDR_TYPE_EXT == 0xFFFF`` (Aeron's C code
  declares the field int16 and writes -1: the same two bytes).
* ``flags`` is always the raw wire byte, so a decode/encode round trip is exact; helpers such as
  ``DataHeader.is_end_of_stream`` read the bits.
* DATA and PAD share :class:`DataHeader`. A DATA frame's payload is a ``memoryview`` slice of the
  datagram (no copy): it is valid only while the datagram's buffer is. A heartbeat is a DATA
  frame with frame_length 0 (32 bytes on the wire, empty payload). A PAD frame is sent as its
  32-byte header only while its frame_length covers the rest of the term.
* RES, ATS_DATA, ATS_SETUP, ATS_SM, RSP_SETUP and EXT are valid Aeron types this codec does not
  interpret: they decode to :class:`UnknownFrame` (type, flags and raw bytes) so a caller can
  count and drop them without treating the datagram as malformed. Any other type value is
  malformed.

Walking a datagram (:func:`decode_frames`) follows how Aeron's sender packs frames: DATA frames
one after another, each starting at the previous one's frame_length aligned up to 32 bytes
(the alignment padding is on the wire; a missing pad after the last frame is tolerated); a
heartbeat occupies 32 bytes; a PAD frame ends the walk (the sender sends it last, header only).
Control frames (SETUP, SM, NAK, RTTM, ERR) and unknown types are sent one per datagram: the
walk ends after them and bytes past their frame_length are ignored, as Aeron's driver does.

Every length is checked against the datagram before it is read, so any byte string either
decodes or raises :class:`MalformedFrame` (never ``struct.error`` or ``IndexError``). The
checks are structural only (lengths, version, type); whether a term offset, session or window
makes sense is for the sender and receiver state machines to judge.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CURRENT_VERSION",
    "DATA_FLAG_BEGIN",
    "DATA_FLAG_END",
    "DATA_FLAG_EOS",
    "DATA_FLAGS_UNFRAGMENTED",
    "DATA_HEADER_LENGTH",
    "ERR_FLAG_GROUP_TAG",
    "ERR_HEADER_LENGTH",
    "ERR_MAX_MESSAGE_LENGTH",
    "FRAME_ALIGNMENT",
    "FRAME_HEADER_LENGTH",
    "HDR_TYPE_ATS_DATA",
    "HDR_TYPE_ATS_SETUP",
    "HDR_TYPE_ATS_SM",
    "HDR_TYPE_DATA",
    "HDR_TYPE_ERR",
    "HDR_TYPE_EXT",
    "HDR_TYPE_NAK",
    "HDR_TYPE_PAD",
    "HDR_TYPE_RES",
    "HDR_TYPE_RSP_SETUP",
    "HDR_TYPE_RTTM",
    "HDR_TYPE_SETUP",
    "HDR_TYPE_SM",
    "KNOWN_TYPES",
    "NAK_LENGTH",
    "RTTM_FLAG_REPLY",
    "RTTM_LENGTH",
    "SETUP_FLAG_GROUP",
    "SETUP_FLAG_SEND_RESPONSE",
    "SETUP_LENGTH",
    "SM_FLAG_EOS",
    "SM_FLAG_SETUP",
    "SM_LENGTH",
    "SM_LENGTH_WITH_GROUP_TAG",
    "UNINTERPRETED_TYPES",
    "DataHeader",
    "ErrorFrame",
    "Frame",
    "MalformedFrame",
    "Nak",
    "RttMeasurement",
    "SetupFrame",
    "StatusMessage",
    "UnknownFrame",
    "align",
    "data_frame",
    "decode_frames",
    "encode_datagram",
    "heartbeat",
    "is_end_of_stream",
    "is_heartbeat",
    "pad_frame",
]

# --- protocol constants ------------------------------------------------------------------------

CURRENT_VERSION: Final = 0
FRAME_ALIGNMENT: Final = 32

HDR_TYPE_PAD: Final = 0x00
HDR_TYPE_DATA: Final = 0x01
HDR_TYPE_NAK: Final = 0x02
HDR_TYPE_SM: Final = 0x03
HDR_TYPE_ERR: Final = 0x04
HDR_TYPE_SETUP: Final = 0x05
HDR_TYPE_RTTM: Final = 0x06
HDR_TYPE_RES: Final = 0x07
HDR_TYPE_ATS_DATA: Final = 0x08
HDR_TYPE_ATS_SETUP: Final = 0x09
HDR_TYPE_ATS_SM: Final = 0x0A
HDR_TYPE_RSP_SETUP: Final = 0x0B
HDR_TYPE_EXT: Final = 0xFFFF  # int16 -1 in Aeron's C structs; read here as uint16

#: Types Aeron defines that this codec decodes to :class:`UnknownFrame`.
UNINTERPRETED_TYPES: Final = frozenset(
    {
        HDR_TYPE_RES,
        HDR_TYPE_ATS_DATA,
        HDR_TYPE_ATS_SETUP,
        HDR_TYPE_ATS_SM,
        HDR_TYPE_RSP_SETUP,
        HDR_TYPE_EXT,
    }
)
#: Every type value Aeron defines; anything else is malformed.
KNOWN_TYPES: Final = frozenset(range(HDR_TYPE_PAD, HDR_TYPE_RTTM + 1)) | UNINTERPRETED_TYPES

FRAME_HEADER_LENGTH: Final = 8
DATA_HEADER_LENGTH: Final = 32
SETUP_LENGTH: Final = 40
SM_LENGTH: Final = 36
SM_LENGTH_WITH_GROUP_TAG: Final = 44
NAK_LENGTH: Final = 28
RTTM_LENGTH: Final = 40
ERR_HEADER_LENGTH: Final = 40
ERR_MAX_MESSAGE_LENGTH: Final = 1023

DATA_FLAG_BEGIN: Final = 0x80
DATA_FLAG_END: Final = 0x40
DATA_FLAG_EOS: Final = 0x20
DATA_FLAGS_UNFRAGMENTED: Final = DATA_FLAG_BEGIN | DATA_FLAG_END

SETUP_FLAG_SEND_RESPONSE: Final = 0x80
SETUP_FLAG_GROUP: Final = 0x40

SM_FLAG_SETUP: Final = 0x80
SM_FLAG_EOS: Final = 0x40

#: Set on the RTTM a side sends to ask for an echo; the echo goes back with flags 0.
RTTM_FLAG_REPLY: Final = 0x80

ERR_FLAG_GROUP_TAG: Final = 0x08

# --- precompiled layouts -----------------------------------------------------------------------

_COMMON = struct.Struct("<iBBH")
_DATA = struct.Struct("<iBBHiiiiq")
_SETUP = struct.Struct("<iBBHiiiiiiii")
_SM = struct.Struct("<iBBHiiiiiq")
_INT64 = struct.Struct("<q")
_NAK = struct.Struct("<iBBHiiiii")
_RTTM = struct.Struct("<iBBHiiqqq")
_ERR = struct.Struct("<iBBHiiqqii")

assert _COMMON.size == FRAME_HEADER_LENGTH
assert _DATA.size == DATA_HEADER_LENGTH
assert _SETUP.size == SETUP_LENGTH
assert _SM.size == SM_LENGTH
assert _NAK.size == NAK_LENGTH
assert _RTTM.size == RTTM_LENGTH
assert _ERR.size == ERR_HEADER_LENGTH

Buffer = bytes | bytearray | memoryview


class MalformedFrame(ValueError):
    """A datagram that is not valid Aeron: callers count it by ``reason`` and drop it.

    ``reason`` is one of the stable strings ``"short"`` (fewer bytes than the frame type's
    header), ``"version"`` (version is not 0), ``"type"`` (a type value Aeron does not define)
    and ``"length"`` (a frame_length or error_length that is too small, negative or runs past
    the datagram). ``offset`` is where in the datagram the offending frame starts.
    """

    def __init__(self, reason: str, detail: str, offset: int = 0) -> None:
        super().__init__(f"{reason}: {detail} (frame at offset {offset})")
        self.reason = reason
        self.detail = detail
        self.offset = offset


def align(length: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round ``length`` up to a multiple of ``alignment`` (a power of two)."""
    return (length + alignment - 1) & ~(alignment - 1)


def _pack_into(layout: struct.Struct, buffer: Buffer, offset: int, *values: int) -> None:
    """``layout.pack_into`` with out-of-range values and short buffers reported as ValueError."""
    try:
        layout.pack_into(buffer, offset, *values)
    except struct.error as exc:
        raise ValueError(f"cannot encode frame: {exc}") from exc


def _require_room(buffer: Buffer, offset: int, length: int) -> None:
    if offset < 0 or len(buffer) - offset < length:
        raise ValueError(f"buffer too small: need {length} bytes at offset {offset}")


# --- frames ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DataHeader:
    """A DATA or PAD frame (``type`` HDR_TYPE_DATA or HDR_TYPE_PAD): the 32-byte header that is
    also the log buffer's frame header, plus the DATA payload.

    ``frame_length`` is the header plus payload length for DATA, 0 for a heartbeat, and for PAD
    the length of the padding it stands for (only its 32-byte header is ever sent). ``payload``
    is empty for PAD and heartbeats; when decoded it is a zero-copy view into the datagram.
    Use :func:`data_frame`, :func:`heartbeat` and :func:`pad_frame` to build consistent frames.
    """

    frame_length: int
    version: int = CURRENT_VERSION
    flags: int = DATA_FLAGS_UNFRAGMENTED
    type: int = HDR_TYPE_DATA
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int = 0
    payload: bytes | memoryview = b""

    @property
    def is_padding(self) -> bool:
        return self.type == HDR_TYPE_PAD

    @property
    def is_heartbeat(self) -> bool:
        """A DATA frame with frame_length 0 (sent as exactly 32 bytes). Aeron's receiver only
        counts a whole 32-byte datagram as a heartbeat: see the module's :func:`is_heartbeat`."""
        return self.type == HDR_TYPE_DATA and self.frame_length == 0

    @property
    def is_end_of_stream(self) -> bool:
        return bool(self.flags & DATA_FLAG_EOS)

    @property
    def is_begin(self) -> bool:
        return bool(self.flags & DATA_FLAG_BEGIN)

    @property
    def is_end(self) -> bool:
        return bool(self.flags & DATA_FLAG_END)

    @property
    def wire_length(self) -> int:
        """Bytes this frame occupies when encoded, without alignment padding."""
        if self.type == HDR_TYPE_DATA and self.frame_length:
            return self.frame_length
        return DATA_HEADER_LENGTH

    def _check(self) -> None:
        if self.type == HDR_TYPE_DATA:
            if self.frame_length == 0:
                if len(self.payload):
                    raise ValueError("a heartbeat (frame_length 0) carries no payload")
            elif self.frame_length != DATA_HEADER_LENGTH + len(self.payload):
                raise ValueError(
                    f"DATA frame_length {self.frame_length} != 32 + payload {len(self.payload)}"
                )
        elif self.type == HDR_TYPE_PAD:
            if self.frame_length < DATA_HEADER_LENGTH:
                raise ValueError(f"PAD frame_length {self.frame_length} < 32")
            if len(self.payload):
                raise ValueError("a PAD frame carries no payload on the wire")
        else:
            raise ValueError(f"DataHeader type must be PAD or DATA, not {self.type}")

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write header and payload (no alignment padding) at ``offset``; return bytes written."""
        self._check()
        size = self.wire_length
        _require_room(buffer, offset, size)
        _pack_into(
            _DATA,
            buffer,
            offset,
            self.frame_length,
            self.version,
            self.flags,
            self.type,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.reserved_value,
        )
        if size > DATA_HEADER_LENGTH:
            start = offset + DATA_HEADER_LENGTH
            memoryview(buffer)[start : start + len(self.payload)] = self.payload
        return size

    def encode(self) -> bytes:
        """The frame as sent: header and payload, or the 32-byte header for PAD/heartbeat."""
        out = bytearray(self.wire_length)
        self.encode_into(out)
        return bytes(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetupFrame:
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

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the 40-byte frame at ``offset``; return 40."""
        _require_room(buffer, offset, SETUP_LENGTH)
        _pack_into(
            _SETUP,
            buffer,
            offset,
            SETUP_LENGTH,
            self.version,
            self.flags,
            HDR_TYPE_SETUP,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            self.active_term_id,
            self.term_length,
            self.mtu,
            self.ttl,
        )
        return SETUP_LENGTH

    def encode(self) -> bytes:
        out = bytearray(SETUP_LENGTH)
        self.encode_into(out)
        return bytes(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusMessage:
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
        length = self.frame_length
        _require_room(buffer, offset, length)
        _pack_into(
            _SM,
            buffer,
            offset,
            length,
            self.version,
            self.flags,
            HDR_TYPE_SM,
            self.session_id,
            self.stream_id,
            self.consumption_term_id,
            self.consumption_term_offset,
            self.receiver_window,
            self.receiver_id,
        )
        if self.group_tag is not None:
            _pack_into(_INT64, buffer, offset + SM_LENGTH, self.group_tag)
        return length

    def encode(self) -> bytes:
        out = bytearray(self.frame_length)
        self.encode_into(out)
        return bytes(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nak:
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

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the 28-byte frame at ``offset``; return 28."""
        _require_room(buffer, offset, NAK_LENGTH)
        _pack_into(
            _NAK,
            buffer,
            offset,
            NAK_LENGTH,
            self.version,
            self.flags,
            HDR_TYPE_NAK,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.term_offset,
            self.length,
        )
        return NAK_LENGTH

    def encode(self) -> bytes:
        out = bytearray(NAK_LENGTH)
        self.encode_into(out)
        return bytes(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class RttMeasurement:
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

    @property
    def wants_reply(self) -> bool:
        return bool(self.flags & RTTM_FLAG_REPLY)

    def encode_into(self, buffer: Buffer, offset: int = 0) -> int:
        """Write the 40-byte frame at ``offset``; return 40."""
        _require_room(buffer, offset, RTTM_LENGTH)
        _pack_into(
            _RTTM,
            buffer,
            offset,
            RTTM_LENGTH,
            self.version,
            self.flags,
            HDR_TYPE_RTTM,
            self.session_id,
            self.stream_id,
            self.echo_timestamp,
            self.reception_delta,
            self.receiver_id,
        )
        return RTTM_LENGTH

    def encode(self) -> bytes:
        out = bytearray(RTTM_LENGTH)
        self.encode_into(out)
        return bytes(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorFrame:
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
        length = ERR_HEADER_LENGTH + size
        _require_room(buffer, offset, length)
        _pack_into(
            _ERR,
            buffer,
            offset,
            length,
            self.version,
            self.flags,
            HDR_TYPE_ERR,
            self.session_id,
            self.stream_id,
            self.receiver_id,
            self.group_tag,
            self.error_code,
            size,
        )
        start = offset + ERR_HEADER_LENGTH
        memoryview(buffer)[start : start + size] = self.message
        return length

    def encode(self) -> bytes:
        out = bytearray(self.frame_length)
        self.encode_into(out)
        return bytes(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownFrame:
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
        _require_room(buffer, offset, size)
        memoryview(buffer)[offset : offset + size] = self.raw
        return size

    def encode(self) -> bytes:
        return bytes(self.raw)


Frame = DataHeader | SetupFrame | StatusMessage | Nak | RttMeasurement | ErrorFrame | UnknownFrame


# --- builders and datagram-level helpers ---------------------------------------------------------


def data_frame(
    *,
    term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
    payload: bytes | memoryview,
    flags: int = DATA_FLAGS_UNFRAGMENTED,
    reserved_value: int = 0,
) -> DataHeader:
    """A DATA frame carrying ``payload``, its frame_length computed (32 + len(payload))."""
    return DataHeader(
        frame_length=DATA_HEADER_LENGTH + len(payload),
        flags=flags,
        type=HDR_TYPE_DATA,
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
        reserved_value=reserved_value,
        payload=payload,
    )


def heartbeat(
    *, term_offset: int, session_id: int, stream_id: int, term_id: int, end_of_stream: bool = False
) -> DataHeader:
    """A heartbeat at the sender's position: DATA, frame_length 0, flags 0xC0 (0xE0 at end of
    stream); it encodes to exactly 32 bytes."""
    flags = DATA_FLAGS_UNFRAGMENTED | (DATA_FLAG_EOS if end_of_stream else 0)
    return DataHeader(
        frame_length=0,
        flags=flags,
        type=HDR_TYPE_DATA,
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
    )


def pad_frame(
    *, frame_length: int, term_offset: int, session_id: int, stream_id: int, term_id: int
) -> DataHeader:
    """A PAD frame covering ``frame_length`` bytes of the term from ``term_offset`` (flags 0xC0,
    as Aeron writes them); it encodes to its 32-byte header."""
    return DataHeader(
        frame_length=frame_length,
        flags=DATA_FLAGS_UNFRAGMENTED,
        type=HDR_TYPE_PAD,
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
    )


def is_heartbeat(datagram: Buffer) -> bool:
    """Aeron's receiver test: a 32-byte datagram holding a DATA header with frame_length 0."""
    if len(datagram) != DATA_HEADER_LENGTH:
        return False
    frame_length, _version, _flags, frame_type = _COMMON.unpack_from(datagram, 0)
    return bool(frame_length == 0 and frame_type == HDR_TYPE_DATA)


def is_end_of_stream(datagram: Buffer) -> bool:
    """True when the datagram's first frame is a DATA header with the EOS flag (0x20)."""
    if len(datagram) < DATA_HEADER_LENGTH:
        return False
    _length, _version, flags, frame_type = _COMMON.unpack_from(datagram, 0)
    return frame_type == HDR_TYPE_DATA and bool(flags & DATA_FLAG_EOS)


def encode_datagram(frames: Iterable[Frame]) -> bytes:
    """Pack frames into one datagram as Aeron's sender does: each DATA frame zero-padded to
    32-byte alignment, a PAD frame as its 32-byte header (it must come last), a control frame
    on its own. The inverse of :func:`decode_frames` for the datagrams Aeron sends."""
    out = bytearray()
    closed = False
    for frame in frames:
        if closed:
            raise ValueError("nothing may follow a PAD or control frame in a datagram")
        start = len(out)
        if isinstance(frame, DataHeader):
            out.extend(bytes(align(frame.wire_length)))
            closed = frame.type == HDR_TYPE_PAD
        else:
            out.extend(bytes(frame.frame_length))
            closed = True
        frame.encode_into(out, start)
    return bytes(out)


# --- decoding -----------------------------------------------------------------------------------


def decode_frames(datagram: Buffer) -> Iterator[Frame]:
    """Yield the frames of one datagram, in order, validating each before it is yielded.

    Raises :class:`MalformedFrame` at the first invalid frame; frames yielded before it were
    valid (a caller that must drop the whole datagram should consume the iterator first, e.g.
    with ``list``). DATA payloads and unknown frames' bytes are views into ``datagram``.
    """
    view = datagram if isinstance(datagram, memoryview) else memoryview(datagram)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    end = len(view)
    offset = 0
    if end == 0:
        raise MalformedFrame("short", "empty datagram", 0)
    while offset < end:
        remaining = end - offset
        if remaining < FRAME_HEADER_LENGTH:
            raise MalformedFrame("short", f"{remaining} bytes left, need 8", offset)
        frame_length, version, flags, frame_type = _COMMON.unpack_from(view, offset)
        if version != CURRENT_VERSION:
            raise MalformedFrame("version", f"version {version}", offset)

        if frame_type == HDR_TYPE_DATA or frame_type == HDR_TYPE_PAD:
            frame = _decode_data(view, offset, remaining, frame_length, frame_type)
            yield frame
            if frame_type == HDR_TYPE_PAD:
                return
            offset += align(frame.wire_length)
            continue

        decoder = _CONTROL_DECODERS.get(frame_type)
        if decoder is not None:
            yield decoder(view, offset, remaining, frame_length)
            return
        if frame_type in UNINTERPRETED_TYPES:
            if frame_length < FRAME_HEADER_LENGTH or frame_length > remaining:
                raise MalformedFrame(
                    "length", f"type {frame_type} frame_length {frame_length}", offset
                )
            raw = view[offset : offset + frame_length]
            yield UnknownFrame(version=version, flags=flags, type=frame_type, raw=raw)
            return
        raise MalformedFrame("type", f"unknown type {frame_type:#06x}", offset)


def _decode_data(
    view: memoryview, offset: int, remaining: int, frame_length: int, frame_type: int
) -> DataHeader:
    if remaining < DATA_HEADER_LENGTH:
        raise MalformedFrame("short", f"{remaining} bytes left for a 32-byte header", offset)
    (
        frame_length,
        version,
        flags,
        frame_type,
        term_offset,
        session_id,
        stream_id,
        term_id,
        reserved_value,
    ) = _DATA.unpack_from(view, offset)
    if frame_type == HDR_TYPE_PAD:
        if frame_length < DATA_HEADER_LENGTH:
            raise MalformedFrame("length", f"PAD frame_length {frame_length}", offset)
        payload: memoryview = view[0:0]
    elif frame_length == 0:
        payload = view[0:0]
    elif frame_length < DATA_HEADER_LENGTH or frame_length > remaining:
        raise MalformedFrame(
            "length", f"DATA frame_length {frame_length} with {remaining} bytes left", offset
        )
    else:
        payload = view[offset + DATA_HEADER_LENGTH : offset + frame_length]
    return DataHeader(
        frame_length=frame_length,
        version=version,
        flags=flags,
        type=frame_type,
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
        reserved_value=reserved_value,
        payload=payload,
    )


def _check_control_length(
    name: str, minimum: int, offset: int, remaining: int, frame_length: int
) -> None:
    if remaining < minimum:
        raise MalformedFrame("short", f"{name} needs {minimum} bytes, {remaining} left", offset)
    if frame_length < minimum or frame_length > remaining:
        raise MalformedFrame(
            "length", f"{name} frame_length {frame_length} with {remaining} bytes", offset
        )


def _decode_setup(view: memoryview, offset: int, remaining: int, frame_length: int) -> SetupFrame:
    _check_control_length("SETUP", SETUP_LENGTH, offset, remaining, frame_length)
    (
        _,
        version,
        flags,
        _,
        term_offset,
        session_id,
        stream_id,
        initial_term_id,
        active_term_id,
        term_length,
        mtu,
        ttl,
    ) = _SETUP.unpack_from(view, offset)
    return SetupFrame(
        version=version,
        flags=flags,
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        initial_term_id=initial_term_id,
        active_term_id=active_term_id,
        term_length=term_length,
        mtu=mtu,
        ttl=ttl,
    )


def _decode_sm(view: memoryview, offset: int, remaining: int, frame_length: int) -> StatusMessage:
    _check_control_length("SM", SM_LENGTH, offset, remaining, frame_length)
    (_, version, flags, _, session_id, stream_id, term_id, term_offset, window, receiver_id) = (
        _SM.unpack_from(view, offset)
    )
    group_tag = None
    if frame_length == SM_LENGTH_WITH_GROUP_TAG:
        (group_tag,) = _INT64.unpack_from(view, offset + SM_LENGTH)
    return StatusMessage(
        version=version,
        flags=flags,
        session_id=session_id,
        stream_id=stream_id,
        consumption_term_id=term_id,
        consumption_term_offset=term_offset,
        receiver_window=window,
        receiver_id=receiver_id,
        group_tag=group_tag,
    )


def _decode_nak(view: memoryview, offset: int, remaining: int, frame_length: int) -> Nak:
    _check_control_length("NAK", NAK_LENGTH, offset, remaining, frame_length)
    (_, version, flags, _, session_id, stream_id, term_id, term_offset, length) = _NAK.unpack_from(
        view, offset
    )
    return Nak(
        version=version,
        flags=flags,
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
        term_offset=term_offset,
        length=length,
    )


def _decode_rttm(
    view: memoryview, offset: int, remaining: int, frame_length: int
) -> RttMeasurement:
    _check_control_length("RTTM", RTTM_LENGTH, offset, remaining, frame_length)
    (_, version, flags, _, session_id, stream_id, echo_timestamp, reception_delta, receiver_id) = (
        _RTTM.unpack_from(view, offset)
    )
    return RttMeasurement(
        version=version,
        flags=flags,
        session_id=session_id,
        stream_id=stream_id,
        echo_timestamp=echo_timestamp,
        reception_delta=reception_delta,
        receiver_id=receiver_id,
    )


def _decode_err(view: memoryview, offset: int, remaining: int, frame_length: int) -> ErrorFrame:
    _check_control_length("ERR", ERR_HEADER_LENGTH, offset, remaining, frame_length)
    (
        _,
        version,
        flags,
        _,
        session_id,
        stream_id,
        receiver_id,
        group_tag,
        error_code,
        error_length,
    ) = _ERR.unpack_from(view, offset)
    if error_length < 0 or ERR_HEADER_LENGTH + error_length > frame_length:
        raise MalformedFrame(
            "length", f"ERR error_length {error_length} in frame_length {frame_length}", offset
        )
    start = offset + ERR_HEADER_LENGTH
    return ErrorFrame(
        version=version,
        flags=flags,
        session_id=session_id,
        stream_id=stream_id,
        receiver_id=receiver_id,
        group_tag=group_tag,
        error_code=error_code,
        message=view[start : start + error_length],
    )


_CONTROL_DECODERS: dict[int, Callable[[memoryview, int, int, int], Frame]] = {
    HDR_TYPE_SETUP: _decode_setup,
    HDR_TYPE_SM: _decode_sm,
    HDR_TYPE_NAK: _decode_nak,
    HDR_TYPE_RTTM: _decode_rttm,
    HDR_TYPE_ERR: _decode_err,
}
