"""Large messages in recordings: their payloads kept out of line, in a side file per segment.

On the bus a large message (longer than the log's max message length, see docs/protocol.md,
Large messages) is a 64-byte reference frame in the log (flags B, E and 0x01) whose payload
refers to a shared-memory block that is freed once every reader moved past it. A recording
keeps the frame where it was, so every message keeps its stream position, but the frame's
24-byte payload becomes a *recorded reference* to the payload's bytes copied into the side
file of the segment that holds the frame::

    <dir>/<id>/<base>.seg      the frames (the large message's frame at its stream position)
    <dir>/<id>/<base>.large    the payloads of the large messages of that segment, one after
                               the other, in stream order (no header, no alignment)

A recorded reference is ``<4sHHqq``: magic ``SHRL``, version 1, 0, the payload's offset in
the side file, its length. The recorder appends the payload to the side file before it commits
the frame, so a reader that can see the frame can read its payload. A recorder killed between
the two, or a disk that filled up during the payload, leaves bytes past the last referenced
payload: they are never read (the recorder cuts them off when it stops a recording).

Readers (``RecordingReader``, hence replay and the Spark source) resolve recorded references
at read time: what they hand out is the original message's bytes.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from shmbus.archive.catalog import RecordingDescriptor, RecordingError

LARGE_SUFFIX = ".large"

_RECORDED_REFERENCE = struct.Struct("<4sHHqq")
_RECORDED_MAGIC = b"SHRL"
RECORDED_REFERENCE_LENGTH = _RECORDED_REFERENCE.size


def large_path(descriptor: RecordingDescriptor, root: str | os.PathLike[str],
               base: int) -> Path:
    """The side file of the segment that starts at ``base``."""
    return descriptor.directory(root) / f"{base:020d}{LARGE_SUFFIX}"


def encode_recorded_reference(offset: int, length: int) -> bytes:
    """The payload a recorded large message's frame carries: where its bytes are."""
    return _RECORDED_REFERENCE.pack(_RECORDED_MAGIC, 1, 0, offset, length)


def decode_recorded_reference(payload: bytes | memoryview) -> tuple[int, int]:
    """(offset in the side file, length) of a recorded reference; RecordingError if the payload
    is not one."""
    if len(payload) != RECORDED_REFERENCE_LENGTH:
        raise RecordingError(f"a recorded large-message reference has "
                             f"{RECORDED_REFERENCE_LENGTH} bytes, not {len(payload)}")
    magic, version, _, offset, length = _RECORDED_REFERENCE.unpack(payload)
    if magic != _RECORDED_MAGIC or version != 1 or offset < 0 or length < 0:
        raise RecordingError(f"not a recorded large-message reference: {bytes(payload)!r}")
    return offset, length


def read_payload(path: Path, offset: int, length: int, position: int) -> np.ndarray:
    """The ``length`` bytes at ``offset`` of side file ``path`` (uint8); RecordingError naming
    the file and the message's ``position`` when they are not all there."""
    out = np.empty(length, np.uint8)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise RecordingError(f"the large message at position {position} is missing: side "
                             f"file {path} does not exist") from None
    try:
        view = out.data
        done = 0
        while done < length:
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                raise RecordingError(
                    f"the large message at position {position} ({length} bytes at offset "
                    f"{offset}) is cut short in {path}: the file ends at {offset + done}")
            done += n
    finally:
        os.close(fd)
    return out


def resolve_large(positions: np.ndarray, offsets: np.ndarray, data: np.ndarray,
                  large: np.ndarray, side_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Replace the recorded references among the messages (``large``: bool per message) by
    the payloads they refer to; returns the new (offsets, data)."""
    bounds = offsets.tolist()
    lengths = np.diff(offsets)
    pieces: list[np.ndarray] = []
    last = 0
    for i in np.flatnonzero(large).tolist():
        pieces.append(data[bounds[last]:bounds[i]])
        offset, length = decode_recorded_reference(data[bounds[i]:bounds[i + 1]].tobytes())
        pieces.append(read_payload(side_file, offset, length, int(positions[i])))
        lengths[i] = length
        last = i + 1
    pieces.append(data[bounds[last]:])
    new_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    return new_offsets, np.concatenate(pieces)
