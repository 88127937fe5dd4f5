"""Checked messages made and checked a round at a time, so that the check costs the benchmark
loop a few tens of nanoseconds a message instead of several hundred.

Runs in the members of a throughput measurement (tools/bench/ipc.py, peers.py, pyaeron.py): the
writer in one process, the reader in another. Every transport is checked the same way.

The messages are exactly harness.Checked's (a fixed body, then the sequence number as int64 and
the CRC-32 of body and sequence number as uint32, little-endian), so a single message still
checks with Checked.check. What changes is where the work is done: a round is ``count``
consecutive messages (sequence numbers r * count ... r * count + count - 1), made with numpy for
the whole round at once. The CRC-32 of a fixed-length message is affine in its bits, and a
round's sequence numbers are its first one (a multiple of ``count``, a power of two) with the
low bits set to 0 ... count - 1, so each message's CRC is the round's constant XOR a CRC of
its low bits computed once (CRC(a | b) = CRC(a) ^ CRC(b) ^ CRC(0) when a and b share no bit). The
writer sends the round's messages, each its own bytes object; the reader collects one round of
copied messages and compares the list with the round it computes itself: equal lists mean
every message has the right length and every byte is right, sequence number and checksum
included. Only a round that differs is walked message by message (Checked.check) to count and
name the errors; the reader then checks the rest of the run one message at a time.

A run ends with a STOP message (sequence number harness.STOP) after a whole round.

:class:`RoundFormat` is what the user's reader loop (user_loop.Consumer) needs of a message
format made a round at a time; :class:`Rounds` is one, tools/bench/aeron_rounds.py another (the
messages of the C programs of tools/aeron_c/).
"""

from __future__ import annotations

import struct
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, Protocol

import numpy as np

from tools.bench.harness import STOP, Checked, Counter

ROUND_BYTES = 1 << 16  # a round's messages take at most this much memory (64 KiB: in cache)
MAX_ROUND = 4096  # messages per round at most
MIN_ROUND = 16  # and at least


class RoundFormat(Protocol):
    """Messages of ``size`` bytes, ``count`` (a power of two) a round, each carrying its
    sequence number (0, 1, 2, ...) as a little-endian int64 at ``seq_offset``."""

    size: int
    count: int
    seq_offset: int
    #: (sequence number, whether the message is intact: every byte right) of one message
    check: Callable[[bytes], tuple[int, bool]]

    def block(self, round_no: int) -> bytes:
        """Round ``round_no``'s messages end to end (``count * size`` bytes)."""
        ...

    def messages(self, round_no: int) -> list[bytes]:
        """Round ``round_no``'s messages, each a bytes object of ``size``."""
        ...


def round_count(size: int) -> int:
    """Messages in a round of ``size``-byte messages: a power of two."""
    fits = max(MIN_ROUND, min(MAX_ROUND, ROUND_BYTES // size))
    return 1 << (fits.bit_length() - 1)


class RoundRows(ABC):
    """A round's messages as the rows of one array (``_rows``, ``count`` of ``size`` bytes),
    which the subclass's ``_fill`` writes for a round: what Rounds and
    aeron_rounds.AeronRounds share."""

    count: int
    _rows: np.ndarray
    _split: Callable[[Any], tuple[bytes, ...]]  # struct's unpack, over the array's buffer

    def _count(self, size: int, count: int | None) -> int:
        """``count`` (default: round_count(size)); ValueError unless a power of two."""
        count = round_count(size) if count is None else count
        if count < 1 or count & (count - 1):
            raise ValueError(f"round of {count} messages: a power of two")
        return count

    @abstractmethod
    def _fill(self, round_no: int) -> None:
        """Write round ``round_no``'s messages into ``_rows``."""

    def messages(self, round_no: int) -> list[bytes]:
        """Round ``round_no`` (>= 0)'s messages, each a bytes object of ``size``."""
        self._fill(round_no)
        return list(self._split(self._rows))

    def block(self, round_no: int) -> bytes:
        """Round ``round_no``'s messages end to end, as one bytes object (``count * size``)."""
        self._fill(round_no)
        return self._rows.tobytes()


class Rounds(RoundRows):
    """The checked messages of ``size`` bytes (at least 16), a round of ``count`` at a time."""

    def __init__(self, size: int, count: int | None = None) -> None:
        self.checked = Checked(size)
        self.size = size
        self.seq_offset, self.check = self.checked.seq_offset, self.checked.check
        self.count = self._count(size, count)
        offset = self.checked.seq_offset
        self._rows = np.empty((self.count, size), np.uint8)
        self._rows[:] = np.frombuffer(self.checked.body + bytes(12), np.uint8)
        self._seq = self._rows[:, offset:offset + 8]
        self._crc = self._rows[:, offset + 8:offset + 12]
        self._body_crc = zlib.crc32(self.checked.body)
        self._crc_of_zero = zlib.crc32(bytes(8), self._body_crc)
        self._ramp = np.arange(self.count, dtype="<i8")
        # CRC of each low part (0 ... count - 1) with the high bits 0
        self._low_crc = np.array([self._crc_of(i) for i in range(self.count)], np.uint32)
        self._split = struct.Struct(f"{size}s" * self.count).unpack
        stop = self.checked.message()
        self.checked.write(stop, STOP)
        self.stop = bytes(stop)

    def _crc_of(self, seq: int) -> int:
        return zlib.crc32(seq.to_bytes(8, "little", signed=True), self._body_crc)

    def _fill(self, round_no: int) -> None:
        first = round_no * self.count
        self._seq[:] = (self._ramp + first).view(np.uint8).reshape(self.count, 8)
        crc = self._low_crc ^ np.uint32(self._crc_of(first) ^ self._crc_of_zero)
        self._crc[:] = crc.astype("<u4").view(np.uint8).reshape(self.count, 4)


class RoundCheck:
    """A reader's check of copied messages handed over in any number per call (take()): whole
    rounds compared at once; after a round that differs, one message at a time. ``tally`` is
    the harness.Counter (``stopped`` once STOP came)."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds
        self.tally = Counter()
        self._round_no = 0
        self._single = False  # after an error: message by message
        self._check = rounds.checked.check

    def take(self, got: list[bytes]) -> None:
        """Check the whole rounds at the head of ``got`` and remove them; once STOP is last,
        check what is left and set ``tally.stopped``. Messages of an unfinished round stay in
        ``got`` for the next call."""
        count, done = self.rounds.count, 0
        while not self._single and len(got) - done >= count:
            chunk = got[done:done + count]
            if chunk == self.rounds.messages(self._round_no):
                self.tally.expected += count
                self._round_no += 1
                done += count
            else:
                self._single = True
        if self._single or (len(got) > done and got[-1] == self.rounds.stop):
            self._one_by_one(got[done:])
            done = len(got)
        del got[:done]

    def finish(self, got: list[bytes]) -> None:
        """Check what is left in ``got`` (an unfinished round: the stream ended early)."""
        self._one_by_one(got)
        del got[:]

    def _one_by_one(self, messages: Iterable[bytes]) -> None:
        tally = self.tally
        for message in messages:
            seq, ok = self._check(message)
            if seq == tally.expected and ok:
                tally.expected += 1
            elif seq == STOP and ok:
                tally.stopped = True
                return
            else:
                tally.bad(seq, "bad checksum" if seq == tally.expected else "out of order")


def read_rounds(messages: Iterable[bytes], rounds: Rounds,
                check: RoundCheck | None = None) -> Counter:
    """Read copied messages from ``messages`` until STOP (or its end), checking each round
    (with ``check``, whose tally counts as it goes, if given): the tally, ``stopped`` set if
    STOP came. A round's messages after its first are taken with itertools.islice, so the
    iterator is drained at the speed it yields."""
    check = RoundCheck(rounds) if check is None else check
    iterator: Any = iter(messages)
    rest = rounds.count - 1
    got: list[bytes] = []
    for first in iterator:
        got.append(first)
        if first != rounds.stop:
            got.extend(islice(iterator, rest))
        check.take(got)
        if check.tally.stopped:
            break
    check.finish(got)
    return check.tally
