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

The parts: :mod:`netbridge.frame_header` (type values, lengths, flags, the common header and
:class:`~netbridge.frame_header.FrameLayout`, the struct-driven codec of every frame's fixed
part), :mod:`netbridge.data_frames` (DATA, PAD, heartbeats) and :mod:`netbridge.control_frames`
(SETUP, SM, NAK, RTTM, ERR, uninterpreted types). This module walks datagrams and is where
callers import the codec from.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from netbridge.control_frames import (
    DECODERS,
    ErrorFrame,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    UnknownFrame,
)
from netbridge.data_frames import (
    DataHeader,
    data_frame,
    decode_data,
    heartbeat,
    is_end_of_stream,
    is_heartbeat,
    pad_frame,
)
from netbridge.frame_header import (
    COMMON_HEADER,
    CURRENT_VERSION,
    DATA_FLAG_BEGIN,
    DATA_FLAG_END,
    DATA_FLAG_EOS,
    DATA_FLAGS_UNFRAGMENTED,
    DATA_HEADER_LENGTH,
    ERR_FLAG_GROUP_TAG,
    ERR_HEADER_LENGTH,
    ERR_MAX_MESSAGE_LENGTH,
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    HDR_TYPE_ATS_DATA,
    HDR_TYPE_ATS_SETUP,
    HDR_TYPE_ATS_SM,
    HDR_TYPE_DATA,
    HDR_TYPE_ERR,
    HDR_TYPE_EXT,
    HDR_TYPE_NAK,
    HDR_TYPE_PAD,
    HDR_TYPE_RES,
    HDR_TYPE_RSP_SETUP,
    HDR_TYPE_RTTM,
    HDR_TYPE_SETUP,
    HDR_TYPE_SM,
    KNOWN_TYPES,
    NAK_LENGTH,
    RTTM_FLAG_REPLY,
    RTTM_LENGTH,
    SETUP_FLAG_GROUP,
    SETUP_FLAG_SEND_RESPONSE,
    SETUP_LENGTH,
    SM_FLAG_EOS,
    SM_FLAG_SETUP,
    SM_LENGTH,
    SM_LENGTH_WITH_GROUP_TAG,
    UNINTERPRETED_TYPES,
    Buffer,
    MalformedFrame,
    align,
)

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
    "decode_datagram",
    "decode_frames",
    "encode_datagram",
    "heartbeat",
    "is_end_of_stream",
    "is_heartbeat",
    "pad_frame",
]

Frame = DataHeader | SetupFrame | StatusMessage | Nak | RttMeasurement | ErrorFrame | UnknownFrame


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
        frame_length, version, _flags, frame_type = COMMON_HEADER.unpack_from(view, offset)
        if version != CURRENT_VERSION:
            raise MalformedFrame("version", f"version {version}", offset)

        if frame_type == HDR_TYPE_DATA or frame_type == HDR_TYPE_PAD:
            frame = decode_data(view, offset, remaining, frame_length, frame_type)
            yield frame
            if frame_type == HDR_TYPE_PAD:
                return
            offset += align(frame.wire_length)
            continue

        decoder = DECODERS.get(frame_type)
        if decoder is None:
            raise MalformedFrame("type", f"unknown type {frame_type:#06x}", offset)
        yield decoder(view, offset, remaining, frame_length)
        return


def decode_datagram(datagram: Buffer) -> list[Frame] | None:
    """Every frame of one datagram (:func:`decode_frames`), or None when any of it is
    malformed: for a caller that takes or drops a datagram whole."""
    try:
        return list(decode_frames(datagram))
    except MalformedFrame:
        return None
