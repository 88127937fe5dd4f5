"""The fixed header of request/reply messages (docs/protocol.md, Request/reply).

Every request and every reply a requester and a responder exchange starts with these 16 bytes,
little-endian, before the caller's data:

====== ====== ===================================================================
offset length field
====== ====== ===================================================================
0      1      kind: 1 request, 2 reply, 3 error (the body is the remote error, UTF-8),
              4 lost (the responder holding the request left before answering)
1      1      flags: bit 0 idempotent (a request that may run again elsewhere);
              bit 1 reply-to (a request over UDP: the extension below follows);
              any other bit makes the message malformed (dropped and counted)
2      2      version (1)
4      4      the requester's response stream id (requests; 0 in replies)
8      8      the requester's correlation id for the call
====== ====== ===================================================================

The reply-to extension, in a request with flag bit 1 only (a requester on another host,
shmbus/calls/remote_calls.py): at offset 16 a u16 length n, then n bytes of UTF-8, the channel to
answer on (``aeron:udp?endpoint=host:port``, nothing else), then the caller's data. IPC
requests never carry it, so their layout and cost are unchanged.

Pure encoding and decoding; no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("<BBHiq")
#: Bytes before the caller's data in every request and reply.
HEADER_LENGTH = HEADER.size
VERSION = 1

REQUEST = 1
REPLY = 2
ERROR = 3
LOST = 4
KINDS = frozenset({REQUEST, REPLY, ERROR, LOST})

IDEMPOTENT = 0x01
REPLY_TO = 0x02
#: The flags of version 1; a header with any other bit set is malformed.
KNOWN_FLAGS = IDEMPOTENT | REPLY_TO
_REPLY_TO_LENGTH = struct.Struct("<H")
#: The longest reply-to channel a request may carry, bytes.
MAX_REPLY_TO = 255

#: The channel of every IPC response stream.
RESPONSE_CHANNEL = "aeron:ipc"
#: Response stream ids are negative, below this: stream ids a service should not use.
RESPONSE_STREAM_BASE = -(1 << 30)


def response_stream_for(unique_id: int) -> int:
    """A requester's response stream id from an id the driver made unique (a correlation
    id): in [-2**31, -2**30)."""
    return RESPONSE_STREAM_BASE - 1 - (unique_id % ((1 << 30) - 1))


class MalformedCall(ValueError):
    """A message on a request or response stream that is not a call of this version."""


@dataclass(frozen=True)
class CallHeader:
    """A decoded header: what kind of message, and for which call."""

    kind: int
    flags: int
    response_stream_id: int
    correlation_id: int

    @property
    def idempotent(self) -> bool:
        """The requester allowed the request to run again on another responder."""
        return bool(self.flags & IDEMPOTENT)


def encode_request(correlation_id: int, response_stream_id: int, *,
                   idempotent: bool = False, reply_to: str | None = None) -> bytes:
    """The header of a request: answer on ``response_stream_id``, quoting ``correlation_id``;
    with ``reply_to``, the REPLY_TO flag and the extension naming that channel (ValueError
    as :func:`encode_reply_to`)."""
    flags = IDEMPOTENT if idempotent else 0
    if reply_to is None:
        return HEADER.pack(REQUEST, flags, VERSION, response_stream_id, correlation_id)
    return HEADER.pack(REQUEST, flags | REPLY_TO, VERSION, response_stream_id,
                       correlation_id) + encode_reply_to(reply_to)


def encode_reply(kind: int, correlation_id: int) -> bytes:
    """The header of a reply of ``kind`` (REPLY, ERROR or LOST) to call ``correlation_id``."""
    if kind not in (REPLY, ERROR, LOST):
        raise ValueError(f"a reply's kind is REPLY, ERROR or LOST, not {kind}")
    return HEADER.pack(kind, 0, VERSION, 0, correlation_id)


_unpack_from = HEADER.unpack_from


def unpack(message: bytes | memoryview) -> tuple[int, int, int, int]:
    """(kind, flags, response stream id, correlation id) of ``message``'s header, as
    :func:`decode` without making an object (the calls' hot path); MalformedCall as decode."""
    if len(message) >= HEADER_LENGTH:
        kind, flags, version, stream_id, correlation_id = _unpack_from(message)
        if version == VERSION and kind in KINDS and not flags & ~KNOWN_FLAGS:
            return kind, flags, stream_id, correlation_id
    header = decode(message)  # raises, naming what is wrong
    return header.kind, header.flags, header.response_stream_id, header.correlation_id


def decode(message: bytes | memoryview) -> CallHeader:
    """The header at the start of ``message``; MalformedCall names what is wrong."""
    if len(message) < HEADER_LENGTH:
        raise MalformedCall(f"a call message has at least {HEADER_LENGTH} bytes, "
                            f"this one {len(message)}")
    kind, flags, version, stream_id, correlation_id = HEADER.unpack_from(message)
    if version != VERSION:
        raise MalformedCall(f"call header version {version}, expected {VERSION}")
    if kind not in KINDS:
        raise MalformedCall(f"unknown call kind {kind}")
    if flags & ~KNOWN_FLAGS:
        raise MalformedCall(f"unknown call flags 0x{flags & ~KNOWN_FLAGS:02x} (version {VERSION} "
                            f"has 0x{KNOWN_FLAGS:02x})")
    return CallHeader(kind, flags, stream_id, correlation_id)


def encode_reply_to(channel: str) -> bytes:
    """The reply-to extension naming ``channel`` (goes right after a REPLY_TO request's
    header); ValueError if it is longer than MAX_REPLY_TO bytes."""
    encoded = channel.encode()
    if len(encoded) > MAX_REPLY_TO:
        raise ValueError(f"reply-to channel of {len(encoded)} bytes; at most {MAX_REPLY_TO}")
    return _REPLY_TO_LENGTH.pack(len(encoded)) + encoded


def read_reply_to(message: bytes | memoryview) -> tuple[str, int]:
    """(the reply-to channel, the offset of the caller's data) of a REPLY_TO request;
    MalformedCall names what is wrong (short, too long, not UTF-8)."""
    at = HEADER_LENGTH + _REPLY_TO_LENGTH.size
    if len(message) < at:
        raise MalformedCall(f"a reply-to request has at least {at} bytes, this one "
                            f"{len(message)}")
    (length,) = _REPLY_TO_LENGTH.unpack_from(message, HEADER_LENGTH)
    if length > MAX_REPLY_TO or len(message) < at + length:
        raise MalformedCall(f"reply-to length {length} does not fit the request "
                            f"({len(message)} bytes, at most {MAX_REPLY_TO})")
    try:
        channel = bytes(message[at:at + length]).decode()
    except UnicodeDecodeError:
        raise MalformedCall("reply-to channel is not UTF-8") from None
    return channel, at + length
