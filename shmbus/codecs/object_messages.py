"""Python objects as messages: pickle protocol 5 with its large buffers out of band.

A message is a header (magic ``SBOB``, version, buffer count, then the pickle's length and each
out-of-band buffer's length), the pickle, then each buffer, every part starting 64-byte
aligned. numpy arrays (and other objects exporting ``PickleBuffer``) inside the object travel
as those buffers, written once into the message and, on the large-message path, read in place.

Unpickling runs code the writer chose (any importable callable): only read objects from
writers you trust. A bus directory is private to its user (mode 0700), so on one bus these are
your own processes; across hosts, ``Subscription.objects()`` reads them only from a keyed channel
unless told to trust an unkeyed one (shmbus/codecs/source_trust.py).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

_PREFIX = struct.Struct("<4sHHI")
_MAGIC = b"SBOB"
_ALIGN = 64
_ZEROS = bytes(_ALIGN)


def _pad(length: int) -> int:
    return -length % _ALIGN


def object_parts(obj: Any) -> list[Any]:
    """The pieces of an object message, in order (their concatenation is the message)."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    lengths = [len(data), *(raw.nbytes for raw in raws)]
    header = _PREFIX.pack(_MAGIC, 1, 0, len(raws)) + struct.pack(f"<{len(lengths)}q", *lengths)
    parts: list[Any] = [header, _ZEROS[:_pad(len(header))]]
    for piece in (memoryview(data), *raws):
        parts.append(piece)
        parts.append(_ZEROS[:_pad(piece.nbytes)])
    return [part for part in parts if len(part)]


def decode_object(buffer: memoryview, copy: bool) -> Any:
    """The object in an object message. Its out-of-band buffers are read-only views of
    ``buffer`` (``copy`` False: valid as long as its memory is) or writable copies."""
    if len(buffer) < _PREFIX.size:
        raise ValueError(f"not an object message: {len(buffer)} bytes")
    magic, version, _, count = _PREFIX.unpack(bytes(buffer[:_PREFIX.size]))
    if magic != _MAGIC or version != 1:
        raise ValueError("not an object message (no SBOB header): was it sent with "
                         "publish_object?")
    end = _PREFIX.size + 8 * (count + 1)
    if end > len(buffer):
        raise ValueError("corrupt object message: truncated header")
    lengths = struct.unpack(f"<{count + 1}q", bytes(buffer[_PREFIX.size:end]))
    at = end + _pad(end)
    pieces = []
    for length in lengths:
        if length < 0 or at + length > len(buffer):
            raise ValueError("corrupt object message: a part runs past its end")
        pieces.append(buffer[at:at + length])
        at += length + _pad(length)
    data, *raws = pieces
    oob = [bytearray(raw) for raw in raws] if copy else raws
    return pickle.loads(data, buffers=oob)
