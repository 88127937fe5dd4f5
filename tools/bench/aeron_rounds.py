"""The checked message of the C programs of tools/aeron_c/ (tools/aeron_c/message.py: publisher
id, length, sequence number, CRC-32 of the payload, a payload pattern) made and checked a round
at a time, as rounds.Rounds does for harness.Checked, so that the user's loop
(user_loop.Consumer) checks every byte of every message at the same cost whoever wrote it.

A message's payload depends on its sequence number only through ``sequence & 0xFF`` (it is
``(sequence * 31 + i + publisher id) & 0xFF`` at byte i), so the 256 messages of sequence 0 to
255 are made once; a round of ``count`` messages (a power of two) is those rows picked by the
low byte of each sequence number, the sequence numbers written in. Runs in a benchmark's
writer and reader members.
"""

from __future__ import annotations

import struct

import numpy as np

from tools.aeron_c.message import (
    HEADER_LENGTH,
    SEQUENCE_OFFSET,
    MessageError,
    check_message,
    encode_message,
)
from tools.bench.rounds import RoundRows

_SEQUENCE = struct.Struct("<q")


class AeronRounds(RoundRows):
    """The messages of publisher ``publisher_id``, ``size`` bytes each (at least 20), a round
    of ``count`` at a time (a rounds.RoundFormat)."""

    def __init__(self, size: int, publisher_id: int, count: int | None = None) -> None:
        if size < HEADER_LENGTH:
            raise ValueError(f"message size {size}: at least {HEADER_LENGTH} bytes")
        self.size = size
        self.publisher_id = publisher_id
        self.count = self._count(size, count)
        self.seq_offset = SEQUENCE_OFFSET
        self._templates = np.frombuffer(
            b"".join(encode_message(publisher_id, low, size) for low in range(256)),
            np.uint8).reshape(256, size)
        self._ramp = np.arange(self.count, dtype="<i8")
        self._rows = np.empty((self.count, size), np.uint8)
        self._split = struct.Struct(f"{size}s" * self.count).unpack

    def check(self, message: bytes) -> tuple[int, bool]:
        """(sequence number, whether the message is intact and this publisher's) of one
        copied message; -2 as the sequence number for a message of the wrong length."""
        if len(message) != self.size:
            return -2, False
        try:
            publisher_id, sequence = check_message(message)
        except MessageError:
            return _SEQUENCE.unpack_from(message, SEQUENCE_OFFSET)[0], False
        return sequence, publisher_id == self.publisher_id

    def _fill(self, round_no: int) -> None:
        sequences = self._ramp + round_no * self.count
        np.take(self._templates, sequences & 0xFF, axis=0, out=self._rows)
        self._rows[:, SEQUENCE_OFFSET:SEQUENCE_OFFSET + 8] = (
            sequences.view(np.uint8).reshape(self.count, 8))
