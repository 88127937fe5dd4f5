"""What every Aeron frame shares: the protocol's type values, lengths and flags, the 8-byte
common header (frame_length int32, version uint8, flags uint8, type uint16), the error a
malformed frame raises, and :class:`FrameLayout`, the one struct-driven encoder and decoder of
a frame's fixed part (docs/protocol.md, Frames on the wire).

Sans-IO and pure Python. Callers import these names from :mod:`netbridge.frames`, the codec's
face; the codec's parts import them from here.
"""

from __future__ import annotations

import operator
import struct
from typing import Final

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

#: Types Aeron defines that the codec decodes to :class:`~netbridge.frames.UnknownFrame`.
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

#: frame_length, version, flags, type
COMMON_HEADER: Final = struct.Struct("<iBBH")
assert COMMON_HEADER.size == FRAME_HEADER_LENGTH

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


def require_room(buffer: Buffer, offset: int, length: int) -> None:
    """ValueError unless ``length`` bytes fit in ``buffer`` at ``offset``."""
    if offset < 0 or len(buffer) - offset < length:
        raise ValueError(f"buffer too small: need {length} bytes at offset {offset}")


def check_control_length(
    name: str, minimum: int, offset: int, remaining: int, frame_length: int
) -> None:
    """MalformedFrame unless a control frame of at least ``minimum`` bytes (its fixed part)
    is in the ``remaining`` bytes of the datagram and its frame_length covers that part
    without running past them."""
    if remaining < minimum:
        raise MalformedFrame("short", f"{name} needs {minimum} bytes, {remaining} left", offset)
    if frame_length < minimum or frame_length > remaining:
        raise MalformedFrame(
            "length", f"{name} frame_length {frame_length} with {remaining} bytes", offset
        )


class FrameLayout:
    """The fixed part of one frame type on the wire: the common header, then ``fields``
    packed by ``body`` (a struct format without byte order), little-endian with no gaps.

    :meth:`encode_into` reads every value from the frame's attribute of the same name (the
    header's frame_length, version, flags and type too); :meth:`decode` gives version, flags
    and the fields by name, as the frame class takes them. Lengths beyond the fixed part
    (payloads, messages) are the frame's to check and write.
    """

    __slots__ = ("_decoded", "_names", "_values", "fields", "size", "struct")

    def __init__(self, body: str, *fields: str) -> None:
        self.struct = struct.Struct(COMMON_HEADER.format + body)
        self.size = self.struct.size
        self.fields = fields
        self._values = operator.attrgetter("frame_length", "version", "flags", "type", *fields)
        # what decode() keeps of the unpacked values (all but frame_length and type), by name
        self._names = ("version", "flags", *fields)
        self._decoded = operator.itemgetter(1, 2, *range(4, 4 + len(fields)))

    def encode_into(
        self, frame: object, buffer: Buffer, offset: int, length: int | None = None
    ) -> int:
        """Write ``frame``'s fixed part at ``offset`` once ``length`` bytes (default: the fixed
        part's size) are known to fit there; return ``length``. Out-of-range values and short
        buffers raise ValueError."""
        length = self.size if length is None else length
        require_room(buffer, offset, length)
        try:
            self.struct.pack_into(buffer, offset, *self._values(frame))
        except struct.error as exc:
            raise ValueError(f"cannot encode frame: {exc}") from exc
        return length

    def decode(self, view: memoryview, offset: int) -> dict[str, int]:
        """Version, flags and the fields of the fixed part at ``offset``, which the caller has
        checked lies in ``view``."""
        return dict(zip(self._names, self._decoded(self.struct.unpack_from(view, offset)),
                        strict=True))
