"""ManyToOneRingBuffer: behaviour (Agrona's test names), a model test, and real processes."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import struct
import time
import zlib
from collections import deque
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus import AtomicBuffer
from shmbus.shm.ring_buffer import (
    CONSUMER_HEARTBEAT_OFFSET,
    CORRELATION_COUNTER_OFFSET,
    HEAD_CACHE_POSITION_OFFSET,
    HEAD_POSITION_OFFSET,
    HEADER_LENGTH,
    PADDING_MSG_TYPE_ID,
    TAIL_POSITION_OFFSET,
    TRAILER_LENGTH,
    ManyToOneRingBuffer,
    align,
    ring_buffer_length,
)
from tests.support.workers import ring_buffer_workers as rw

CAPACITY = 1024
MSG_TYPE = 7


def make(capacity: int = CAPACITY, offset: int = 0) -> tuple[ManyToOneRingBuffer, AtomicBuffer]:
    memory = mmap.mmap(-1, offset + ring_buffer_length(capacity))
    buffer = AtomicBuffer(memory)
    return ManyToOneRingBuffer(buffer, offset, ring_buffer_length(capacity)), buffer


def drain(ring: ManyToOneRingBuffer) -> list[tuple[int, bytes]]:
    """Read until a call neither delivers a message nor moves the head (past padding)."""
    out: list[tuple[int, bytes]] = []
    while True:
        before = ring.consumer_position()
        if not ring.read(lambda t, b: out.append((t, bytes(b)))) and (
                ring.consumer_position() == before):
            return out


def set_positions(buffer: AtomicBuffer, head: int, tail: int, capacity: int = CAPACITY) -> None:
    buffer.put_int64(capacity + HEAD_POSITION_OFFSET, head)
    buffer.put_int64(capacity + HEAD_CACHE_POSITION_OFFSET, head)
    buffer.put_int64(capacity + TAIL_POSITION_OFFSET, tail)


# -- geometry ----------------------------------------------------------------------------------


def test_trailer_is_aerons_each_field_on_its_own_128_byte_line() -> None:
    offsets = [TAIL_POSITION_OFFSET, HEAD_CACHE_POSITION_OFFSET, HEAD_POSITION_OFFSET,
               CORRELATION_COUNTER_OFFSET, CONSUMER_HEARTBEAT_OFFSET]
    assert offsets == [128, 256, 384, 512, 640]  # aeron_rb_descriptor_t
    assert TRAILER_LENGTH == 768


@pytest.mark.parametrize("capacity", [0, 63, 100, 1000])
def test_should_reject_capacity_that_is_not_a_power_of_two(capacity: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        ManyToOneRingBuffer(AtomicBuffer(bytearray(capacity + TRAILER_LENGTH)))


def test_should_work_at_an_offset_inside_a_larger_buffer() -> None:
    ring, buffer = make(offset=4096)
    assert ring.capacity == CAPACITY
    assert ring.write(MSG_TYPE, b"abc")
    assert buffer.get_int32(4096) == HEADER_LENGTH + 3
    assert buffer.get_int64(4096 + CAPACITY + TAIL_POSITION_OFFSET) == 16
    assert drain(ring) == [(MSG_TYPE, b"abc")]


# -- write -------------------------------------------------------------------------------------


def test_should_write_to_empty_buffer() -> None:
    ring, buffer = make()
    payload = b"x" * 13
    assert ring.write(MSG_TYPE, payload)
    record_length = HEADER_LENGTH + len(payload)
    assert buffer.get_int32(0) == record_length
    assert buffer.get_int32(4) == MSG_TYPE
    assert buffer.get_bytes(HEADER_LENGTH, len(payload)) == payload
    assert ring.producer_position() == align(record_length)
    assert ring.size() == align(record_length)


def test_should_write_empty_payload() -> None:
    ring, _ = make()
    assert ring.write(MSG_TYPE, b"")
    assert drain(ring) == [(MSG_TYPE, b"")]


def test_should_accept_memoryview_and_max_msg_length() -> None:
    ring, _ = make()
    assert ring.max_msg_length == CAPACITY // 8
    payload = bytes(range(CAPACITY // 8))
    assert ring.write(MSG_TYPE, memoryview(payload))
    assert drain(ring) == [(MSG_TYPE, payload)]


def test_should_reject_message_over_max_msg_length() -> None:
    ring, _ = make()
    with pytest.raises(ValueError, match="max_msg_length"):
        ring.write(MSG_TYPE, bytes(CAPACITY // 8 + 1))


@pytest.mark.parametrize("msg_type", [0, -1, -5])
def test_should_reject_invalid_message_type(msg_type: int) -> None:
    ring, _ = make()
    with pytest.raises(ValueError, match="message type"):
        ring.write(msg_type, b"a")


def test_should_reject_write_when_insufficient_capacity() -> None:
    ring, buffer = make()
    set_positions(buffer, head=0, tail=CAPACITY - 8)
    assert not ring.write(MSG_TYPE, b"12345678")
    assert ring.producer_position() == CAPACITY - 8


def test_should_reject_write_when_buffer_full() -> None:
    ring, _ = make()
    payload = bytes(CAPACITY // 8 - HEADER_LENGTH)  # exactly capacity / 8 per record
    for _ in range(8):
        assert ring.write(MSG_TYPE, payload)
    assert ring.size() == CAPACITY
    assert not ring.write(MSG_TYPE, b"")
    assert ring.read(lambda t, b: None, 1) == 1
    assert ring.write(MSG_TYPE, b"")


def test_should_insert_padding_record_plus_message_on_buffer_wrap() -> None:
    ring, buffer = make()
    tail = CAPACITY - HEADER_LENGTH          # room for a header only before the end
    set_positions(buffer, head=tail, tail=tail)
    assert ring.write(MSG_TYPE, b"wrapped!")
    assert buffer.get_int32(tail) == HEADER_LENGTH
    assert buffer.get_int32(tail + 4) == PADDING_MSG_TYPE_ID
    assert buffer.get_int32(0) == HEADER_LENGTH + 8
    assert buffer.get_int32(4) == MSG_TYPE
    assert ring.producer_position() == tail + HEADER_LENGTH + 16
    assert ring.read(lambda t, b: None, 10) == 0     # the padding, up to the end of the region
    assert ring.consumer_position() == CAPACITY
    assert drain(ring) == [(MSG_TYPE, b"wrapped!")]


def test_should_insert_padding_record_plus_message_on_buffer_wrap_with_head_equal_to_tail() -> None:
    ring, buffer = make()
    tail = CAPACITY - 16
    set_positions(buffer, head=tail, tail=tail)
    assert ring.write(MSG_TYPE, bytes(24))
    assert buffer.get_int32(tail) == 16
    assert buffer.get_int32(tail + 4) == PADDING_MSG_TYPE_ID
    assert ring.size() == 16 + 32


def test_should_reject_wrap_when_the_start_of_the_region_is_not_yet_free() -> None:
    ring, buffer = make()
    head = 16                                 # the consumer has freed only 16 bytes at index 0
    tail = CAPACITY - 16
    set_positions(buffer, head=head, tail=tail)
    assert not ring.write(MSG_TYPE, bytes(24))  # needs 32 at index 0
    assert ring.producer_position() == tail
    assert ring.write(MSG_TYPE, bytes(8))       # fits before the end
    assert ring.producer_position() == CAPACITY


# -- read --------------------------------------------------------------------------------------


def test_should_read_nothing_from_empty_buffer() -> None:
    ring, _ = make()
    assert ring.read(lambda t, b: pytest.fail("no message expected"), 10) == 0


def test_should_read_two_messages_and_zero_what_was_read() -> None:
    ring, buffer = make()
    assert ring.write(1, b"one")
    assert ring.write(2, b"two two")
    got = []
    assert ring.read(lambda t, b: got.append((t, bytes(b))), 10) == 2
    assert got == [(1, b"one"), (2, b"two two")]
    assert ring.consumer_position() == 16 + 16
    assert buffer.get_bytes(0, 32) == bytes(32)
    assert ring.size() == 0


def test_should_limit_messages_read() -> None:
    ring, _ = make()
    for i in range(5):
        assert ring.write(MSG_TYPE, bytes([i]))
    got = []
    assert ring.read(lambda t, b: got.append(bytes(b)), 2) == 2
    assert ring.read(lambda t, b: got.append(bytes(b)), 10) == 3
    assert got == [bytes([i]) for i in range(5)]


def test_should_not_read_a_record_still_being_written() -> None:
    ring, buffer = make()
    index = ring._claim(16)
    buffer.put_int32(index, -12)               # a producer is mid-write
    assert ring.write(MSG_TYPE, b"later")
    assert ring.read(lambda t, b: pytest.fail("blocked"), 10) == 0
    buffer.put_bytes(index + HEADER_LENGTH, b"abcd")
    buffer.put_int32(index + 4, MSG_TYPE)
    buffer.put_int32_release(index, 12)        # ... and commits
    assert drain(ring) == [(MSG_TYPE, b"abcd"), (MSG_TYPE, b"later")]


def test_should_consume_records_up_to_a_handler_that_raises() -> None:
    ring, _ = make()
    for i in range(3):
        assert ring.write(MSG_TYPE, bytes([i]))

    def handler(msg_type: int, payload: memoryview) -> None:
        if payload[0] == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        ring.read(handler, 10)
    assert ring.consumer_position() == 32
    assert drain(ring) == [(MSG_TYPE, b"\x02")]


# -- unblock -----------------------------------------------------------------------------------


def test_should_not_unblock_an_empty_buffer() -> None:
    ring, _ = make()
    assert not ring.unblock()


def test_should_not_unblock_a_committed_record() -> None:
    ring, _ = make()
    assert ring.write(MSG_TYPE, b"fine")
    assert not ring.unblock()
    assert drain(ring) == [(MSG_TYPE, b"fine")]


def test_should_unblock_a_claimed_but_uncommitted_record() -> None:
    ring, buffer = make()
    index = ring._claim(align(HEADER_LENGTH + 20))
    buffer.put_int32(index, -(HEADER_LENGTH + 20))   # producer died mid-write
    buffer.put_bytes(index + HEADER_LENGTH, b"half")
    assert ring.write(MSG_TYPE, b"after")
    assert ring.read(lambda t, b: None, 10) == 0
    assert ring.unblock()
    assert buffer.get_int32(index) == HEADER_LENGTH + 20
    assert buffer.get_int32(index + 4) == PADDING_MSG_TYPE_ID
    assert drain(ring) == [(MSG_TYPE, b"after")]
    assert ring.size() == 0


def test_should_unblock_gap_with_zeros() -> None:
    ring, buffer = make()
    assert ring.write(MSG_TYPE, b"before")
    index = ring._claim(64)                    # producer died right after claiming
    assert ring.write(MSG_TYPE, b"after")
    assert drain(ring) == [(MSG_TYPE, b"before")]
    assert ring.unblock()
    assert buffer.get_int32(index) == 64
    assert buffer.get_int32(index + 4) == PADDING_MSG_TYPE_ID
    assert drain(ring) == [(MSG_TYPE, b"after")]


def assert_empty_and_writable(ring: ManyToOneRingBuffer) -> None:
    """Nothing is left to read, and a message written now is the one read next."""
    assert drain(ring) == []
    assert ring.size() == 0
    assert ring.write(MSG_TYPE, b"ok")
    assert drain(ring) == [(MSG_TYPE, b"ok")]


def test_should_unblock_a_gap_up_to_the_tail_when_nothing_follows() -> None:
    ring, _ = make()
    ring._claim(32)
    ring._claim(48)
    assert ring.unblock()
    assert_empty_and_writable(ring)


def test_should_unblock_a_claim_that_died_before_writing_its_wrap_padding() -> None:
    ring, buffer = make()
    start = CAPACITY - 16
    set_positions(buffer, head=start, tail=start)
    # Claim 32 bytes that need the wrap, as a producer that dies before the padding header.
    assert buffer.compare_and_set_int64(CAPACITY + TAIL_POSITION_OFFSET, start, start + 16 + 32)
    assert ring.write(MSG_TYPE, b"next")
    assert ring.unblock()                       # padding to the end of the region
    assert ring.read(lambda t, b: None, 10) == 0
    assert ring.consumer_position() == CAPACITY
    assert ring.unblock()                       # then the record at index 0
    assert drain(ring) == [(MSG_TYPE, b"next")]


class _RacingBuffer:
    """An AtomicBuffer stand-in that runs ``action`` when ``offset`` is first loaded."""

    def __init__(self, real: AtomicBuffer, offset: int, action) -> None:
        self._real, self._offset, self._action = real, offset, action

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def get_int32_acquire(self, offset: int) -> int:
        if offset == self._offset and self._action is not None:
            action, self._action = self._action, None
            action()
        return self._real.get_int32_acquire(offset)


def test_should_not_unblock_gap_with_message_race_when_scan_forward_takes_an_interrupt() -> None:
    ring, buffer = make()
    index = ring._claim(16)                    # a slow producer, not yet started
    assert ring.write(MSG_TYPE, b"next")      # record at 16
    # While unblock scans forward, the slow producer begins its record at the head.
    racing = _RacingBuffer(buffer, 16, lambda: buffer.put_int32_release(index, -12))
    assert not ManyToOneRingBuffer(racing).unblock()
    assert buffer.get_int32(index) == -12      # untouched: the producer still owns it
    buffer.put_bytes(index + HEADER_LENGTH, b"slow")
    buffer.put_int32(index + 4, MSG_TYPE)
    buffer.put_int32_release(index, 12)
    assert drain(ring) == [(MSG_TYPE, b"slow"), (MSG_TYPE, b"next")]


class _StallingRing(ManyToOneRingBuffer):
    """A producer that stalls between claiming and writing for longer than the timeout."""

    def _claim(self, required: int) -> int | None:
        index = super()._claim(required)
        assert self.unblock()                   # the driver gives up on it meanwhile
        return index


def test_a_producer_whose_claim_was_unblocked_does_not_commit() -> None:
    ring, buffer = make()
    assert not _StallingRing(buffer).write(MSG_TYPE, b"too late")
    assert_empty_and_writable(ring)


# -- trailer fields ----------------------------------------------------------------------------


def test_should_hand_out_unique_correlation_ids() -> None:
    ring, _ = make()
    assert [ring.next_correlation_id() for _ in range(3)] == [0, 1, 2]


def test_consumer_heartbeat_time_round_trips() -> None:
    ring, buffer = make()
    assert ring.consumer_heartbeat_time == 0
    now_ms = time.time_ns() // 1_000_000
    ring.consumer_heartbeat_time = now_ms
    assert ring.consumer_heartbeat_time == now_ms
    assert buffer.get_int64(CAPACITY + CONSUMER_HEARTBEAT_OFFSET) == now_ms


# -- model test --------------------------------------------------------------------------------


def _expect_fits(head: int, tail: int, size: int, capacity: int) -> bool:
    """The acceptance rule, stated on positions: free space, and a record never wraps."""
    required = align(HEADER_LENGTH + size)
    available = capacity - (tail - head)
    if required > available:
        return False
    to_end = capacity - tail % capacity
    if required > to_end:
        return required + to_end <= available and required <= head % capacity
    return True


def _assert_free_space_is_zero(ring: ManyToOneRingBuffer, buffer: AtomicBuffer) -> None:
    head, tail, capacity = ring.consumer_position(), ring.producer_position(), ring.capacity
    assert 0 <= tail - head <= capacity
    assert ring.size() == tail - head
    data = buffer.get_bytes(0, capacity) * 2
    start = tail % capacity
    free = capacity - (tail - head)
    assert data[start:start + free] == bytes(free)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 128)),
        st.tuples(st.just("read"), st.integers(1, 6)),
    ),
    max_size=150,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_writes_and_reads_match_a_fifo_model_across_wraps(ops: list[tuple[str, int]]) -> None:
    ring, buffer = make(CAPACITY)
    model: deque[tuple[int, bytes]] = deque()
    seq = 0
    got: list[tuple[int, bytes]] = []
    for op, arg in ops:
        if op == "write":
            seq += 1
            payload = (seq.to_bytes(4, "little") * 33)[:arg]
            msg_type = seq % 1000 + 1
            expected = _expect_fits(ring.consumer_position(), ring.producer_position(), arg,
                                    CAPACITY)
            assert ring.write(msg_type, payload) is expected
            if expected:
                model.append((msg_type, payload))
        else:
            got.clear()
            n = ring.read(lambda t, b: got.append((t, bytes(b))), arg)
            assert n == len(got) <= arg
            assert got == [model.popleft() for _ in range(n)]
            if n < min(arg, len(model) + n):
                assert ring.consumer_position() % CAPACITY == 0   # stopped at the wrap
        _assert_free_space_is_zero(ring, buffer)
    assert drain(ring) == list(model)
    assert ring.size() == 0


GUARD = 256


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=30), st.data(),
       st.integers(-(2**31), 2**31 - 1), st.integers(0, 200))
def test_scribbled_record_lengths_cost_records_never_memory_or_liveness(
        sizes: list[int], data: st.DataObject, garbage: int, skip: int) -> None:
    """A client of the same user overwrites the length of an unread record with garbage.
    The consumer (the driver) then loses records, but never reads or clears a byte outside
    the records' region nor moves the head past the tail; read (with unblock, as the driver
    calls it) always moves on to the tail, and then the ring works as new."""
    memory = mmap.mmap(-1, GUARD + ring_buffer_length(CAPACITY) + GUARD)
    buffer = AtomicBuffer(memory)
    buffer.put_bytes(0, b"\xa5" * GUARD)
    buffer.put_bytes(GUARD + ring_buffer_length(CAPACITY), b"\xa5" * GUARD)
    ring = ManyToOneRingBuffer(buffer, GUARD, ring_buffer_length(CAPACITY))
    for _ in range(skip):  # start somewhere else than position 0, to cross the wrap
        assert ring.write(MSG_TYPE, b"x" * 20)
        drain(ring)
    written = [bytes([i + 1]) * size for i, size in enumerate(sizes)]
    starts = []
    for payload in written:
        starts.append(ring.producer_position())
        if not ring.write(MSG_TYPE, payload):
            starts.pop()
            break
    victim = data.draw(st.integers(0, len(starts) - 1))
    at = GUARD + (starts[victim] & (CAPACITY - 1))
    if buffer.get_int32(at + 4) == PADDING_MSG_TYPE_ID:  # the wrap's padding, then the record
        at = GUARD
    buffer.put_int32(at, garbage)
    trailer = buffer.get_bytes(GUARD + CAPACITY, TRAILER_LENGTH)
    tail = ring.producer_position()
    got: list[bytes] = []
    corruptions = 0
    for _ in range(4 * len(written) + 8):
        if ring.consumer_position() == tail:
            break
        before = ring.consumer_position()
        try:
            ring.read(lambda t, b: got.append(bytes(b)))
        except ValueError:
            corruptions += 1
        assert before <= ring.consumer_position() <= tail
        if ring.consumer_position() == before:
            ring.unblock()
    assert ring.consumer_position() == tail, "the consumer stopped before the tail"
    assert got[:victim] == written[:victim], "records before the scribbled one are intact"
    assert buffer.get_bytes(0, GUARD) == b"\xa5" * GUARD
    assert buffer.get_bytes(GUARD + ring_buffer_length(CAPACITY), GUARD) == b"\xa5" * GUARD
    after = buffer.get_bytes(GUARD + CAPACITY, TRAILER_LENGTH)  # only the head lines move
    for line in (TAIL_POSITION_OFFSET, CORRELATION_COUNTER_OFFSET, CONSUMER_HEARTBEAT_OFFSET):
        assert after[line:line + 128] == trailer[line:line + 128]
    assert buffer.get_bytes(GUARD, CAPACITY) == bytes(CAPACITY), "read space is cleared"
    if not 8 <= garbage <= CAPACITY:
        assert corruptions or garbage <= 0
    for i in range(40):  # the ring works as new
        assert ring.write(MSG_TYPE, bytes([i]) * 30)
        assert drain(ring) == [(MSG_TYPE, bytes([i]) * 30)]


# -- real processes ----------------------------------------------------------------------------

PRODUCERS = 3
MESSAGES = 20_000


def test_three_producer_processes_one_consumer(shm_dir: Path) -> None:
    path = shm_dir / "ring.dat"
    with open(path, "wb") as f:
        f.truncate(ring_buffer_length(rw.MP_CAPACITY))
    with open(path, "r+b") as f:
        memory = mmap.mmap(f.fileno(), 0)
    buffer = AtomicBuffer(memory)
    ring = ManyToOneRingBuffer(buffer)

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rw.produce, args=(str(path), i, MESSAGES, 40.0), daemon=True)
             for i in range(PRODUCERS)]
    next_seq = [0] * PRODUCERS
    errors: list[str] = []

    def on_message(msg_type: int, payload: memoryview) -> None:
        producer_id, seq, crc = rw.PREFIX.unpack_from(payload)
        body = bytes(payload[rw.PREFIX.size:])
        if msg_type != producer_id + 1 or seq != next_seq[producer_id]:
            errors.append(f"producer {producer_id}: got seq {seq}, expected "
                          f"{next_seq[producer_id]} (type {msg_type})")
        elif zlib.crc32(struct.pack("<ii", producer_id, seq) + body) != crc:
            errors.append(f"producer {producer_id} seq {seq}: checksum mismatch")
        next_seq[producer_id] = seq + 1

    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 45.0
        total = PRODUCERS * MESSAGES
        received = 0
        idle = 0
        while received < total and not errors:
            n = ring.read(on_message, 256)
            received += n
            if n:
                idle = 0
                continue
            idle += 1
            if time.monotonic() > deadline:
                pytest.fail(f"timed out with {received}/{total} messages, seqs {next_seq}")
            if idle < 20:
                os.sched_yield()
            else:
                time.sleep(0.0002)
        assert errors == []
        assert next_seq == [MESSAGES] * PRODUCERS
        for p in procs:
            p.join(timeout=10)
            assert p.exitcode == 0
        assert ring.size() == 0
        assert ring.read(on_message, 10) == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        buffer.release()
        memory.close()
