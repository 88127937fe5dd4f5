"""Broadcast buffer: transmitter layout, receivers, lapping (in process, model, real processes)."""

from __future__ import annotations

import mmap
import multiprocessing
import struct
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus import AtomicBuffer
from shmbus.shm.broadcast import (
    HEADER_LENGTH,
    LATEST_COUNTER_OFFSET,
    PADDING_MSG_TYPE_ID,
    TAIL_COUNTER_OFFSET,
    TAIL_INTENT_COUNTER_OFFSET,
    TRAILER_LENGTH,
    BroadcastReceiver,
    BroadcastTransmitter,
    CopyBroadcastReceiver,
    broadcast_buffer_length,
)
from tests.support.workers import broadcast_workers as bw

CAPACITY = 1024
MSG_TYPE = 7


def make(capacity: int = CAPACITY) -> tuple[BroadcastTransmitter, AtomicBuffer]:
    buffer = AtomicBuffer(mmap.mmap(-1, broadcast_buffer_length(capacity)))
    return BroadcastTransmitter(buffer), buffer


def counters(buffer: AtomicBuffer, capacity: int = CAPACITY) -> tuple[int, int, int]:
    return (buffer.get_int64(capacity + TAIL_INTENT_COUNTER_OFFSET),
            buffer.get_int64(capacity + TAIL_COUNTER_OFFSET),
            buffer.get_int64(capacity + LATEST_COUNTER_OFFSET))


def receive_all(receiver: BroadcastReceiver) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    receiver.receive(lambda t, b: out.append((t, b)), limit=10_000)
    return out


def test_trailer_layout() -> None:
    assert (TAIL_INTENT_COUNTER_OFFSET, TAIL_COUNTER_OFFSET, LATEST_COUNTER_OFFSET) == (0, 8, 16)
    assert TRAILER_LENGTH == 128


@pytest.mark.parametrize("capacity", [0, 100, 1000])
def test_should_reject_capacity_that_is_not_a_power_of_two(capacity: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        BroadcastTransmitter(AtomicBuffer(bytearray(capacity + TRAILER_LENGTH)))


def test_should_transmit_into_empty_buffer() -> None:
    transmitter, buffer = make()
    transmitter.transmit(MSG_TYPE, b"hello")
    assert buffer.get_int32(0) == HEADER_LENGTH + 5
    assert buffer.get_int32(4) == MSG_TYPE
    assert buffer.get_bytes(HEADER_LENGTH, 5) == b"hello"
    assert counters(buffer) == (16, 16, 0)


def test_should_transmit_into_used_buffer() -> None:
    transmitter, buffer = make()
    transmitter.transmit(MSG_TYPE, b"a" * 8)
    transmitter.transmit(MSG_TYPE + 1, b"b" * 3)
    assert buffer.get_int32(16) == HEADER_LENGTH + 3
    assert buffer.get_int32(20) == MSG_TYPE + 1
    assert counters(buffer) == (32, 32, 16)


def test_should_insert_padding_at_wrap() -> None:
    transmitter, buffer = make()
    start = CAPACITY - 16
    for offset in (TAIL_INTENT_COUNTER_OFFSET, TAIL_COUNTER_OFFSET):
        buffer.put_int64(CAPACITY + offset, start)
    transmitter.transmit(MSG_TYPE, bytes(20))          # 32 bytes: does not fit in 16
    assert buffer.get_int32(start) == 16
    assert buffer.get_int32(start + 4) == PADDING_MSG_TYPE_ID
    assert buffer.get_int32(0) == HEADER_LENGTH + 20
    assert counters(buffer) == (CAPACITY + 32, CAPACITY + 32, CAPACITY)


def test_should_reject_invalid_type_and_oversized_message() -> None:
    transmitter, _ = make()
    with pytest.raises(ValueError, match="message type"):
        transmitter.transmit(0, b"")
    with pytest.raises(ValueError, match="max_msg_length"):
        transmitter.transmit(MSG_TYPE, bytes(CAPACITY // 8 + 1))
    transmitter.transmit(MSG_TYPE, bytes(CAPACITY // 8))


def test_should_not_receive_from_empty_buffer() -> None:
    _, buffer = make()
    receiver = BroadcastReceiver(buffer)
    assert not receiver.receive_next()
    assert receiver.lapped_count == 0


def test_should_receive_messages_in_order() -> None:
    transmitter, buffer = make()
    receiver = BroadcastReceiver(buffer)
    transmitter.transmit(1, b"one")
    transmitter.transmit(2, b"")
    assert receiver.receive_next()
    assert (receiver.msg_type, receiver.buffer) == (1, b"one")
    assert receiver.receive_next()
    assert (receiver.msg_type, receiver.buffer) == (2, b"")
    assert not receiver.receive_next()


def test_receiver_sees_only_what_is_transmitted_after_it_was_created() -> None:
    transmitter, buffer = make()
    transmitter.transmit(1, b"before")
    receiver = BroadcastReceiver(buffer)
    transmitter.transmit(2, b"after")
    assert receive_all(receiver) == [(2, b"after")]


def test_should_receive_across_the_wrap_skipping_padding() -> None:
    transmitter, buffer = make()
    receiver = BroadcastReceiver(buffer)
    sent = []
    for i in range(40):                        # 40 x 40 bytes: wraps with padding
        payload = bytes([i]) * 30
        transmitter.transmit(MSG_TYPE, payload)
        sent.append((MSG_TYPE, payload))
        assert receive_all(receiver) == sent[-1:]
    assert receiver.lapped_count == 0


def test_every_receiver_gets_every_message() -> None:
    transmitter, buffer = make()
    receivers = [CopyBroadcastReceiver(buffer) for _ in range(3)]
    for i in range(5):
        transmitter.transmit(MSG_TYPE, bytes([i]))
    for receiver in receivers:
        assert receive_all(receiver) == [(MSG_TYPE, bytes([i])) for i in range(5)]


def test_receive_honours_its_limit() -> None:
    transmitter, buffer = make()
    receiver = CopyBroadcastReceiver(buffer)
    for i in range(5):
        transmitter.transmit(MSG_TYPE, bytes([i]))
    got: list[bytes] = []
    assert receiver.receive(lambda t, b: got.append(b), limit=2) == 2
    assert receiver.receive(lambda t, b: got.append(b)) == 3
    assert got == [bytes([i]) for i in range(5)]


def test_should_detect_lapping_and_recover() -> None:
    transmitter, buffer = make()
    receiver = BroadcastReceiver(buffer)
    for i in range(100):                       # 100 x 16 bytes > 1024: lapped
        transmitter.transmit(MSG_TYPE, struct.pack("<q", i))
    assert receiver.receive_next()
    assert receiver.lapped_count == 1
    assert receiver.buffer == struct.pack("<q", 99)   # resumed at the latest record
    assert not receiver.receive_next()
    transmitter.transmit(MSG_TYPE, struct.pack("<q", 100))
    assert receive_all(receiver) == [(MSG_TYPE, struct.pack("<q", 100))]
    assert receiver.lapped_count == 1


class _LappingBuffer:
    """An AtomicBuffer stand-in whose first copy is overtaken by the transmitter."""

    def __init__(self, real: AtomicBuffer, overtake) -> None:
        self._real, self._overtake = real, overtake

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def get_bytes(self, offset: int, length: int) -> bytes:
        data = self._real.get_bytes(offset, length)
        if self._overtake is not None:
            overtake, self._overtake = self._overtake, None
            overtake()
        return data


def test_should_detect_being_overwritten_during_the_copy() -> None:
    transmitter, buffer = make()

    def overtake() -> None:
        for i in range(1, 80):
            transmitter.transmit(MSG_TYPE, struct.pack("<q", i))

    receiver = BroadcastReceiver(_LappingBuffer(buffer, overtake))
    transmitter.transmit(MSG_TYPE, struct.pack("<q", 0))
    assert receiver.receive_next()
    assert receiver.lapped_count == 1
    assert receiver.buffer == struct.pack("<q", 79)     # never the torn copy of record 0


# -- model: receivers at random paces ---------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 120), max_size=30), st.integers(0, 40)),
                max_size=25))
def test_received_messages_are_intact_in_order_and_lost_only_when_lapped(
        rounds: list[tuple[list[int], int]]) -> None:
    transmitter, buffer = make()
    receiver = BroadcastReceiver(buffer)
    seq = 0
    last = -1
    lapped = 0
    for sizes, reads in rounds:
        for size in sizes:
            body = (seq.to_bytes(4, "little") * 31)[:size]
            transmitter.transmit(MSG_TYPE, seq.to_bytes(4, "little") + body)
            seq += 1
        for _ in range(reads):
            if not receiver.receive_next():
                break
            got = int.from_bytes(receiver.buffer[:4], "little")
            assert receiver.buffer[4:] == (receiver.buffer[:4] * 31)[:len(receiver.buffer) - 4]
            assert got > last
            if got != last + 1:
                assert receiver.lapped_count > lapped
            last, lapped = got, receiver.lapped_count
    while receiver.receive_next():
        last = int.from_bytes(receiver.buffer[:4], "little")
    assert last == seq - 1


# -- real processes ----------------------------------------------------------------------------

MP_MESSAGES = 20_000


def test_slow_receiver_in_another_process_is_lapped_detects_it_and_resumes(
        shm_dir: Path) -> None:
    path = shm_dir / "broadcast.dat"
    flag = broadcast_buffer_length(bw.MP_CAPACITY)
    with open(path, "wb") as f:
        f.truncate(flag + 64)
    with open(path, "r+b") as f:
        memory = mmap.mmap(f.fileno(), 0)
    buffer = AtomicBuffer(memory)
    receiver = BroadcastReceiver(buffer, 0, broadcast_buffer_length(bw.MP_CAPACITY))
    proc = multiprocessing.get_context("spawn").Process(
        target=bw.transmit, args=(str(path), MP_MESSAGES, flag), daemon=True)
    seqs: list[int] = []
    laps_at_gaps: list[tuple[int, int, int]] = []
    try:
        proc.start()
        buffer.put_int64_release(flag, 1)
        deadline = time.monotonic() + 30
        last = -1
        lapped = 0                             # lapped_count when `last` was received
        while last != MP_MESSAGES - 1:
            assert time.monotonic() < deadline, f"timed out at {last}"
            if not receiver.receive_next():
                time.sleep(0.0005)
                continue
            seq, crc = bw.PREFIX.unpack_from(receiver.buffer)
            body = receiver.buffer[bw.PREFIX.size:]
            assert body == bytes([seq % 251]) * (seq % 97) and zlib.crc32(body) == crc
            assert seq > last
            if seq != last + 1:
                laps_at_gaps.append((last, seq, receiver.lapped_count - lapped))
            last = seq
            lapped = receiver.lapped_count
            seqs.append(seq)
            if len(seqs) % 16 == 0:
                time.sleep(0.001)              # the slow part: fall behind the transmitter
        proc.join(timeout=10)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        buffer.release()
        memory.close()
    assert receiver.lapped_count > 0
    assert len(laps_at_gaps) > 1, "the receiver was expected to be lapped and resume, twice"
    assert all(laps > 0 for _, _, laps in laps_at_gaps), laps_at_gaps
    assert len(seqs) < MP_MESSAGES
