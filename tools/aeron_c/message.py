"""The checked message of the C programs (tools/aeron_c/c/message.h is the C side), in Python,
so shmbus's own publishers and subscribers can speak it too. Little-endian::

    @0   u32  publisher id
    @4   u32  length of the whole message (>= 20)
    @8   u64  sequence number within its publisher: 0, 1, 2, ...
    @16  u32  zlib.crc32 of bytes [20, length)
    @20  payload: byte i (counted from the start of the message) is
         (sequence * 31 + i + publisher id) & 0xFF

Pure code, no IO.
"""

from __future__ import annotations

import struct
import zlib

#: publisher id, length, sequence number, CRC-32 of the payload
MESSAGE_HEADER = struct.Struct("<IIQI")
HEADER_LENGTH = MESSAGE_HEADER.size
#: where the u64 sequence number sits in a message
SEQUENCE_OFFSET = 8
_RAMP = bytes(range(256))


class MessageError(ValueError):
    """A message that is not intact, or not the one its publisher was to send next."""


def message_payload(publisher_id: int, sequence: int, length: int) -> bytes:
    """Bytes [20, ``length``) of message ``sequence`` of ``publisher_id``."""
    start = (sequence * 31 + publisher_id + HEADER_LENGTH) & 0xFF
    size = length - HEADER_LENGTH
    return (_RAMP * ((start + size) // 256 + 1))[start:start + size]


def encode_message(publisher_id: int, sequence: int, length: int) -> bytes:
    """Message ``sequence`` of ``publisher_id``, ``length`` bytes (at least 20), as
    aeron_publish writes it."""
    if length < HEADER_LENGTH:
        raise ValueError(f"a message is at least {HEADER_LENGTH} bytes, not {length}")
    payload = message_payload(publisher_id, sequence, length)
    return MESSAGE_HEADER.pack(publisher_id, length, sequence, zlib.crc32(payload)) + payload


def message_problem(data: bytes | bytearray | memoryview) -> str | None:
    """What is wrong with ``data`` as a whole message (too short, length field, CRC, payload
    pattern), or None when it is intact."""
    if len(data) < HEADER_LENGTH:
        return f"message of {len(data)} bytes: shorter than the 20-byte header"
    publisher_id, length, sequence, crc = MESSAGE_HEADER.unpack_from(data)
    where = f"publisher {publisher_id}: message of {len(data)} bytes with sequence {sequence}"
    if length != len(data):
        return f"{where}: length field {length} differs from the length received"
    if crc != zlib.crc32(data[HEADER_LENGTH:]):
        return f"{where}: CRC-32 of the payload differs from the CRC field"
    if data[HEADER_LENGTH:] != message_payload(publisher_id, sequence, length):
        return f"{where}: payload differs from the pattern of its publisher id and sequence"
    return None


def check_message(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """The publisher id and sequence number of an intact message; MessageError saying what is
    wrong otherwise (too short, length field, CRC, payload pattern)."""
    problem = message_problem(data)
    if problem is not None:
        raise MessageError(problem)
    publisher_id, _, sequence, _ = MESSAGE_HEADER.unpack_from(data)
    return publisher_id, sequence
