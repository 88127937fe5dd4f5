"""DATA and PAD frames: the 32-byte header that is also the log buffer's frame header, the
DATA payload, heartbeats, and the builders and datagram tests the sender and receiver use
(docs/protocol.md, Frames on the wire).

A DATA frame's decoded payload is a ``memoryview`` slice of the datagram (no copy): it is
valid only while the datagram's buffer is. A heartbeat is a DATA frame with frame_length 0 (32
bytes on the wire, empty payload). A PAD frame is sent as its 32-byte header only while its
frame_length covers the rest of the term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from netbridge.frame_header import (
    COMMON_HEADER,
    CURRENT_VERSION,
    DATA_FLAG_BEGIN,
    DATA_FLAG_END,
    DATA_FLAG_EOS,
    DATA_FLAGS_UNFRAGMENTED,
    DATA_HEADER_LENGTH,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    Buffer,
    FrameLayout,
    MalformedFrame,
)

__all__ = [
    "DataHeader",
    "data_frame",
    "decode_data",
    "heartbeat",
    "is_end_of_stream",
    "is_heartbeat",
    "pad_frame",
]

_DATA: Final = FrameLayout(
    "iiiiq", "term_offset", "session_id", "stream_id", "term_id", "reserved_value"
)
assert _DATA.size == DATA_HEADER_LENGTH


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
        size = _DATA.encode_into(self, buffer, offset, self.wire_length)
        if size > DATA_HEADER_LENGTH:
            start = offset + DATA_HEADER_LENGTH
            memoryview(buffer)[start : start + len(self.payload)] = self.payload
        return size

    def encode(self) -> bytes:
        """The frame as sent: header and payload, or the 32-byte header for PAD/heartbeat."""
        out = bytearray(self.wire_length)
        self.encode_into(out)
        return bytes(out)


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
    return DataHeader(frame_length=0, flags=flags, type=HDR_TYPE_DATA, term_offset=term_offset,
                      session_id=session_id, stream_id=stream_id, term_id=term_id)


def pad_frame(
    *, frame_length: int, term_offset: int, session_id: int, stream_id: int, term_id: int
) -> DataHeader:
    """A PAD frame covering ``frame_length`` bytes of the term from ``term_offset`` (flags 0xC0,
    as Aeron writes them); it encodes to its 32-byte header."""
    return DataHeader(frame_length=frame_length, flags=DATA_FLAGS_UNFRAGMENTED, type=HDR_TYPE_PAD,
                      term_offset=term_offset, session_id=session_id, stream_id=stream_id,
                      term_id=term_id)


def is_heartbeat(datagram: Buffer) -> bool:
    """Aeron's receiver test: a 32-byte datagram holding a DATA header with frame_length 0."""
    if len(datagram) != DATA_HEADER_LENGTH:
        return False
    frame_length, _version, _flags, frame_type = COMMON_HEADER.unpack_from(datagram, 0)
    return bool(frame_length == 0 and frame_type == HDR_TYPE_DATA)


def is_end_of_stream(datagram: Buffer) -> bool:
    """True when the datagram's first frame is a DATA header with the EOS flag (0x20)."""
    if len(datagram) < DATA_HEADER_LENGTH:
        return False
    _length, _version, flags, frame_type = COMMON_HEADER.unpack_from(datagram, 0)
    return frame_type == HDR_TYPE_DATA and bool(flags & DATA_FLAG_EOS)


def decode_data(
    view: memoryview, offset: int, remaining: int, frame_length: int, frame_type: int
) -> DataHeader:
    """The DATA or PAD frame at ``offset`` (``remaining`` bytes left in the datagram), whose
    common header said ``frame_length`` and ``frame_type``; MalformedFrame when its header is
    short or its frame_length does not fit."""
    if remaining < DATA_HEADER_LENGTH:
        raise MalformedFrame("short", f"{remaining} bytes left for a 32-byte header", offset)
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
        type=frame_type,
        payload=payload,
        **_DATA.decode(view, offset),
    )
