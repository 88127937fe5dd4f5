"""The driver's unblocker (shmbus/driver/log_unblocker.py) against a writer that was only slow.

The unblocker pads over a frame whose writer has not moved for publication_unblock_timeout,
presumed dead. A writer that was merely descheduled that long must learn that its reservation
was padded over, never be told a message was accepted that no reader will see, and append it
again when it retries. These tests take the log directly (a LogBuffer, a ConcurrentPublication
on it, an Image reading it) and call ``unblock`` as the driver would, the steps in the order a
stall makes them run: a writer's tail fetch-add (its reservation) is made by the test before
the unblock, and the writer's own append replays it afterwards (the tail rewound to the
reservation, so the writer's fetch-add lands on it again, then put back), which is what a
writer descheduled between its fetch-add and its header write does. An interleaving inside
``unblock`` is made with a buffer whose compare-and-set runs the writer's step first or after.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from shmbus import ConcurrentPublication, FragmentAssembler, Image
from shmbus.driver.log_unblocker import unblock
from shmbus.settings.codes import ADMIN_ACTION
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.log_buffer import HDR_TYPE_PAD, TAIL_COUNTERS_OFFSET, LogBuffer
from shmbus.shm.position import Position

TERM = 64 * 1024
FRAME = 1024
PAYLOAD = FRAME - 32
LONG = 2000  # two fragments at mtu 1408: 1408 + 672 bytes in the log


class Bus:
    """One log, a concurrent publication on it and a reader."""

    def __init__(self, directory: Path) -> None:
        self.log = LogBuffer.create(directory / "pub.log", term_length=TERM,
                                    initial_term_id=-5, mtu=1408, session_id=3, stream_id=1)
        positions = AtomicBuffer(mmap.mmap(-1, 4096))
        limit, reader = Position(positions, 0), Position(positions, 64)
        limit.set(TERM // 2)
        self.log.is_connected = True
        self.pub = ConcurrentPublication(self.log, limit)
        self.image = Image(self.log, reader)
        self.read: list[bytes] = []
        self._assembler = FragmentAssembler(lambda buffer, header: self.read.append(bytes(buffer)))
        self._tail = self.log.meta_offset + TAIL_COUNTERS_OFFSET  # term 0's

    def poll(self) -> list[bytes]:
        while self.image.poll(self._assembler, 100):
            pass
        return self.read

    @property
    def tail(self) -> int:
        return self.log.buffer.get_int64_acquire(self._tail)

    def reserve(self, length: int) -> int:
        """A writer's fetch-add on the tail, its frames not written: the stall. Returns where
        the reservation starts."""
        raw = self.tail
        self.log.buffer.put_int64_release(self._tail, raw + length)
        return raw & 0xFFFFFFFF

    def resume(self, at: int, append: Callable[[], Any]) -> Any:
        """The stalled writer goes on: its fetch-add (already made, at ``at``) is replayed so
        that ``append`` writes its frames into its own reservation."""
        raw = self.tail
        self.log.buffer.put_int64_release(self._tail, (raw & ~0xFFFFFFFF) | at)
        try:
            return append()
        finally:
            self.log.buffer.put_int64_release(self._tail, raw)


class Interleaved:
    """The log's buffer as ``unblock`` sees it, running ``step`` once at the unblocker's first
    compare-and-set of a length word: before it (``before=True``) or just after it succeeded."""

    def __init__(self, buffer: AtomicBuffer, step: Callable[[], None], before: bool) -> None:
        self._buffer, self._step, self._before = buffer, step, before

    def compare_and_set_int32(self, offset: int, expected: int, desired: int) -> bool:
        step, self._step = self._step, lambda: None
        if self._before:
            step()
        done = self._buffer.compare_and_set_int32(offset, expected, desired)
        if not self._before and done:
            step()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)


def interleaved(log: LogBuffer, step: Callable[[], None], before: bool = False) -> LogBuffer:
    buffer = Interleaved(log.buffer, step, before)
    return cast(LogBuffer, SimpleNamespace(term_length=log.term_length, buffer=buffer))


def message(tag: bytes, length: int = PAYLOAD) -> bytes:
    return tag * length


# -- a claim padded over while it is committed ----------------------------------------------------


def test_a_claim_committed_while_the_unblocker_takes_it_is_not_told_it_was_published(
        tmp_path: Path) -> None:
    """The unblocker takes a claimed frame (compare-and-set of its negative length) and only
    then writes the padding header; a writer that commits in between must lose, and learn it."""
    bus = Bus(tmp_path)
    assert bus.pub.offer(message(b"a")) == FRAME
    claim = bus.pub.try_claim(PAYLOAD)
    assert claim and claim.buffer is not None
    claim.buffer[:] = message(b"c")
    outcome: list[str] = []

    def commit() -> None:
        try:
            claim.commit()
            outcome.append("committed")
        except ValueError as e:
            outcome.append(f"refused: {e}")

    assert unblock(interleaved(bus.log, commit), FRAME, 2 * FRAME)
    assert bus.pub.offer(message(b"z")) == 3 * FRAME
    read = bus.poll()
    assert message(b"a") in read and message(b"z") in read
    assert outcome != ["committed"] or message(b"c") in read, \
        "commit() returned, so the message was accepted, but no reader will see it"
    assert message(b"c") not in read and outcome[0].startswith("refused")
    assert "padded" in outcome[0]
    assert bus.image.position == 3 * FRAME


def test_a_claim_committed_after_the_unblocker_padded_it_raises(tmp_path: Path) -> None:
    bus = Bus(tmp_path)
    claim = bus.pub.try_claim(PAYLOAD)
    assert claim and claim.buffer is not None
    assert unblock(bus.log, 0, FRAME)
    with pytest.raises(ValueError, match="padded"):
        claim.commit()
    assert bus.poll() == [] and bus.image.position == FRAME


def test_a_claim_aborted_after_the_unblocker_took_it_is_padding(tmp_path: Path) -> None:
    bus = Bus(tmp_path)
    claim = bus.pub.try_claim(PAYLOAD)
    assert claim
    assert unblock(interleaved(bus.log, claim.abort), 0, FRAME)
    assert bus.pub.offer(message(b"z")) == 2 * FRAME
    assert bus.poll() == [message(b"z")]


# -- a writer stalled between its reservation and its header --------------------------------------

# (the bytes the append reserves, the append, whether it was accepted)
APPENDS: dict[str, tuple[int, Callable[[ConcurrentPublication, bytes], Any],
                         Callable[[Any], bool]]] = {
    "offer": (FRAME, lambda pub, tag: pub.offer(message(tag)), lambda r: r > 0),
    "fragmented offer": (2080, lambda pub, tag: pub.offer(message(tag, LONG)), lambda r: r > 0),
    "offer_many": (3 * FRAME, lambda pub, tag: pub.offer_many([message(tag)] * 3),
                   lambda r: r > 0),
    "try_claim": (FRAME, lambda pub, tag: claim_and_commit(pub, message(tag)), lambda r: r),
}


def claim_and_commit(pub: ConcurrentPublication, payload: bytes) -> bool:
    """As tools/nemesis/workers.py does: a refused claim or a commit that raises ValueError is
    a message not sent."""
    claim = pub.try_claim(len(payload))
    if not claim:
        return False
    assert claim.buffer is not None
    claim.buffer[:] = payload
    try:
        claim.commit()
    except ValueError:
        return False
    return True


def sent(kind: str, tag: bytes) -> list[bytes]:
    length = LONG if kind == "fragmented offer" else PAYLOAD
    return [message(tag, length)] * (3 if kind == "offer_many" else 1)


@pytest.mark.parametrize("kind", list(APPENDS))
def test_a_writer_stalled_past_the_unblock_learns_its_reservation_was_padded(
        tmp_path: Path, kind: str) -> None:
    """Reserved (tail fetch-add), descheduled before its header, padded over as a zero gap by
    the unblocker, the reader reads past the padding; then the writer goes on. It must not be
    told its message was accepted; its retry appends it, once."""
    length, append, accepted = APPENDS[kind]
    bus = Bus(tmp_path)
    assert bus.pub.offer(message(b"a")) == FRAME
    start = bus.reserve(length)
    assert bus.pub.offer(message(b"b")) == FRAME + length + FRAME  # another writer, behind it
    assert unblock(bus.log, FRAME, FRAME + length + FRAME)
    assert bus.poll() == [message(b"a"), message(b"b")]  # read past the padding

    result = bus.resume(start, lambda: append(bus.pub, b"s"))
    read = bus.poll()
    assert not accepted(result) or sent(kind, b"s")[0] in read, \
        f"{kind} was accepted ({result}) but no reader will see it: it went under the padding"
    assert not accepted(result)
    if kind != "try_claim":
        assert result == ADMIN_ACTION
    assert read == [message(b"a"), message(b"b")]

    # the retry appends it behind the other writer's message, and it is read once
    assert accepted(append(bus.pub, b"s"))
    assert bus.poll() == [message(b"a"), message(b"b"), *sent(kind, b"s")]
    assert bus.image.position == bus.pub.position


@pytest.mark.parametrize("kind", ["offer", "try_claim"])
def test_the_zero_gap_padding_reaches_no_writer_behind_the_stalled_one(
        tmp_path: Path, kind: str) -> None:
    """Two writers reserved one after the other, neither header written when the unblocker
    pads the zero gap from the first: the second's reservation is in that gap. It must not be
    told its message was accepted either."""
    length, append, accepted = APPENDS[kind]
    bus = Bus(tmp_path)
    assert bus.pub.offer(message(b"a")) == FRAME
    first = bus.reserve(length)
    second = bus.reserve(length)
    end = FRAME + 2 * length
    assert bus.pub.offer(message(b"b")) == end + FRAME
    assert unblock(bus.log, FRAME, end + FRAME)
    assert bus.poll() == [message(b"a"), message(b"b")]

    result = bus.resume(second, lambda: append(bus.pub, b"t"))
    assert not accepted(result) or message(b"t") in bus.poll(), \
        f"the second writer's {kind} was accepted ({result}) but it went under the padding"
    assert not accepted(bus.resume(first, lambda: append(bus.pub, b"s")))
    assert bus.poll() == [message(b"a"), message(b"b")]
    assert accepted(append(bus.pub, b"t"))
    assert bus.poll() == [message(b"a"), message(b"b"), message(b"t")]


def test_a_writer_filling_the_gap_while_the_unblocker_pads_it_keeps_its_frame(
        tmp_path: Path) -> None:
    """The second writer writes its frame after the unblocker's scan found the gap zero but
    before it took it: the padding stops at that frame, which is read."""
    bus = Bus(tmp_path)
    assert bus.pub.offer(message(b"a")) == FRAME
    bus.reserve(FRAME)  # the first writer, stalled for good
    second = bus.reserve(FRAME)
    assert bus.pub.offer(message(b"b")) == 4 * FRAME
    results: list[int] = []

    def second_writes() -> None:
        results.append(bus.resume(second, lambda: bus.pub.offer(message(b"t"))))

    assert unblock(interleaved(bus.log, second_writes, before=True), FRAME, 4 * FRAME)
    assert results == [3 * FRAME]
    assert bus.poll() == [message(b"a"), message(b"t"), message(b"b")]
    assert bus.image.position == 4 * FRAME


def test_every_frame_slot_of_a_padded_zero_gap_is_padding_to_its_end(tmp_path: Path) -> None:
    """Whatever 32-byte slot of the gap a writer's header would go to holds a non-zero length
    (so its compare-and-set from zero fails), and reads as padding to the end of the gap."""
    bus = Bus(tmp_path)
    start = bus.reserve(3 * FRAME)
    assert bus.pub.offer(message(b"b")) == 4 * FRAME
    assert unblock(bus.log, 0, 4 * FRAME)
    buffer = bus.log.buffer
    for slot in range(start, 3 * FRAME, 32):
        assert buffer.get_int32_acquire(slot) == 3 * FRAME - slot
        assert buffer.get_int32_acquire(slot + 4) >> 16 == HDR_TYPE_PAD
    assert bus.poll() == [message(b"b")]
