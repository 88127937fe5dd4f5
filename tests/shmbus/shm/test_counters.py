"""Counters: allocation, values, reuse after the timeout, labels and keys, readers."""

from __future__ import annotations

import mmap

import pytest

from shmbus import AtomicBuffer
from shmbus.shm.counters import (
    CLIENT_HEARTBEAT,
    COUNTER_LENGTH,
    FC_RCV_POS,
    FC_RECEIVERS,
    FREE_FOR_REUSE_DEADLINE_OFFSET,
    GROUP_CLAIM,
    GROUP_MEMBERS,
    GROUP_ORPHAN,
    GROUP_POS,
    GROUP_REDELIVERED,
    KEY_OFFSET,
    LABEL_LENGTH_OFFSET,
    LABEL_OFFSET,
    MAX_KEY_LENGTH,
    MAX_LABEL_LENGTH,
    METADATA_LENGTH,
    NOT_FREE_TO_REUSE,
    OWNER_ID_OFFSET,
    PUB_LIMIT,
    PUB_POS,
    RCV_CC_WINDOW,
    RCV_HWM,
    RCV_POS,
    RECORD_ALLOCATED,
    RECORD_RECLAIMED,
    RECORD_UNUSED,
    REFERENCE_ID_OFFSET,
    REGISTRATION_ID_OFFSET,
    REQUESTER_COUNTERS,
    RESPONDER_COUNTERS,
    RR_IN_FLIGHT,
    RR_REFLECTIONS_REFUSED,
    RR_REPLIES_DROPPED,
    SECOND_WORD_OFFSET,
    SND_BPE,
    SND_LMT,
    SND_POS,
    STATE_OFFSET,
    SUB_POS,
    SYSTEM,
    TYPE_ID_OFFSET,
    TYPE_NAMES,
    Counter,
    CountersFullError,
    CountersManager,
    CountersReader,
    type_name,
)
from shmbus.shm.position import Position

MAX = 8


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def buffers(count: int = MAX) -> tuple[AtomicBuffer, AtomicBuffer]:
    return (AtomicBuffer(mmap.mmap(-1, count * METADATA_LENGTH)),
            AtomicBuffer(mmap.mmap(-1, count * COUNTER_LENGTH)))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def manager(clock: FakeClock) -> CountersManager:
    metadata, values = buffers()
    return CountersManager(metadata, values, free_to_reuse_timeout_ms=1000, clock=clock)


def test_layout_offsets() -> None:
    assert (REGISTRATION_ID_OFFSET, OWNER_ID_OFFSET, REFERENCE_ID_OFFSET) == (8, 16, 24)
    assert COUNTER_LENGTH == 128 and METADATA_LENGTH == 512  # Aeron's record sizes
    assert (STATE_OFFSET, TYPE_ID_OFFSET, FREE_FOR_REUSE_DEADLINE_OFFSET, KEY_OFFSET) == (
        0, 4, 8, 16)
    assert (LABEL_LENGTH_OFFSET, LABEL_OFFSET) == (128, 132)
    assert KEY_OFFSET + MAX_KEY_LENGTH == LABEL_LENGTH_OFFSET
    assert LABEL_OFFSET + MAX_LABEL_LENGTH == METADATA_LENGTH


def test_type_ids_are_aerons_and_named() -> None:
    assert (SYSTEM, PUB_LIMIT, SND_POS, RCV_HWM, SUB_POS, RCV_POS) == (0, 1, 2, 3, 4, 5)
    assert (SND_LMT, CLIENT_HEARTBEAT, PUB_POS, SND_BPE, FC_RECEIVERS) == (9, 11, 12, 13, 17)
    assert (FC_RCV_POS, RCV_CC_WINDOW) == (1019, 1020)  # shmbus's own, clear of Aeron's
    assert type_name(PUB_LIMIT) == "pub-lmt"
    assert type_name(SND_BPE) == "snd-bpe"
    assert type_name(FC_RCV_POS) == "fc-rcv-pos"
    assert type_name(RCV_CC_WINDOW) == "rcv-cc-window"
    assert type_name(99) == "type-99"
    # subscription groups (shmbus's own)
    assert (GROUP_POS, GROUP_CLAIM, GROUP_ORPHAN, GROUP_MEMBERS, GROUP_REDELIVERED) == (
        1030, 1031, 1032, 1033, 1034)
    assert type_name(GROUP_CLAIM) == "grp-claim"
    # request/reply (shmbus's own): a requester's five, a responder's four
    assert (*REQUESTER_COUNTERS, *RESPONDER_COUNTERS) == tuple(range(1040, 1049))
    assert type_name(RR_IN_FLIGHT) == "rr-in-flight"
    assert type_name(RR_REPLIES_DROPPED) == "rr-replies-dropped"
    assert type_name(RR_REFLECTIONS_REFUSED) == "rr-reflections-refused"
    assert len(set(TYPE_NAMES.values())) == len(TYPE_NAMES) == 27


def test_should_allocate_counters_from_zero(manager: CountersManager) -> None:
    assert manager.allocate("a") == 0
    assert manager.allocate("b") == 1
    assert manager.allocate("c") == 2
    assert [manager.get_label(i) for i in range(3)] == ["a", "b", "c"]


def test_should_store_every_field_of_an_allocated_counter(manager: CountersManager) -> None:
    counter_id = manager.allocate("pub-pos: 1001 aeron:ipc", type_id=PUB_POS, key=b"\x01\x02",
                                  registration_id=42, owner_id=7, reference_id=41)
    reader = CountersReader(manager.metadata, manager.values)
    assert reader.get_state(counter_id) == RECORD_ALLOCATED
    assert reader.get_type_id(counter_id) == PUB_POS
    assert reader.get_key(counter_id) == b"\x01\x02" + bytes(MAX_KEY_LENGTH - 2)
    assert reader.get_registration_id(counter_id) == 42
    assert reader.get_owner_id(counter_id) == 7
    assert reader.get_reference_id(counter_id) == 41
    assert reader.get_free_for_reuse_deadline(counter_id) == NOT_FREE_TO_REUSE
    assert reader.counters() == [Counter(counter_id=0, type_id=PUB_POS,
                                         label="pub-pos: 1001 aeron:ipc", value=0,
                                         registration_id=42, owner_id=7, reference_id=41,
                                         key=b"\x01\x02" + bytes(MAX_KEY_LENGTH - 2))]
    assert reader.counters()[0].type_name == "pub-pos"
    assert reader.find(PUB_POS, 42) == counter_id
    assert reader.find(PUB_POS, 43) is None


def test_set_get_and_add_values(manager: CountersManager) -> None:
    counter_id = manager.allocate("bytes sent")
    manager.set_value(counter_id, 100)
    assert manager.get_value(counter_id) == 100
    assert manager.add(counter_id, 5) == 100
    assert manager.add(counter_id) == 105
    assert CountersReader(manager.metadata, manager.values).get_value(counter_id) == 106


def test_counter_offset_builds_a_position(manager: CountersManager) -> None:
    manager.allocate("first")
    counter_id = manager.allocate("sub-pos", type_id=SUB_POS)
    assert manager.counter_offset(counter_id) == COUNTER_LENGTH
    position = Position(manager.values, manager.counter_offset(counter_id))
    position.set(4096)
    assert manager.get_value(counter_id) == 4096
    assert manager.get_value(0) == 0


def test_for_each_visits_allocated_counters_only(manager: CountersManager) -> None:
    for i in range(4):
        manager.allocate(f"c{i}", type_id=i, key=bytes([i]))
    manager.free(1)
    seen = []
    CountersReader(manager.metadata, manager.values).for_each(
        lambda cid, tid, key, label: seen.append((cid, tid, key[0], label)))
    assert seen == [(0, 0, 0, "c0"), (2, 2, 2, "c2"), (3, 3, 3, "c3")]


def test_should_free_and_reuse_only_after_the_timeout(manager: CountersManager,
                                                     clock: FakeClock) -> None:
    first = manager.allocate("one", registration_id=1)
    manager.allocate("two")
    manager.set_value(first, 99)
    second_word = manager.counter_offset(first) + SECOND_WORD_OFFSET
    manager.values.put_int64(second_word, 77)  # a group counter's second word
    manager.free(first)
    assert manager.get_state(first) == RECORD_RECLAIMED
    assert manager.get_free_for_reuse_deadline(first) == clock.now_ms + 1000
    assert manager.allocate("three") == 2                  # too early: a fresh id
    clock.now_ms += 999
    assert manager.allocate("four") == 3
    clock.now_ms += 1
    reused = manager.allocate("five", type_id=RCV_POS, registration_id=5)
    assert reused == first
    assert manager.get_value(reused) == 0
    assert manager.values.get_int64(second_word) == 0
    assert manager.get_label(reused) == "five"
    assert manager.get_registration_id(reused) == 5
    assert manager.get_key(reused) == bytes(MAX_KEY_LENGTH)


def test_should_raise_when_full(clock: FakeClock) -> None:
    metadata, values = buffers(3)
    manager = CountersManager(metadata, values, clock=clock)
    for i in range(3):
        manager.allocate(f"c{i}")
    with pytest.raises(CountersFullError, match="all 3 are in use"):
        manager.allocate("one too many")
    manager.free(1)
    with pytest.raises(CountersFullError, match="1 freed, waiting"):
        manager.allocate("still too early")
    clock.now_ms += 1000
    assert manager.allocate("now") == 1


def test_capacity_is_what_both_buffers_hold() -> None:
    metadata = AtomicBuffer(mmap.mmap(-1, 4 * METADATA_LENGTH))
    values = AtomicBuffer(mmap.mmap(-1, 10 * COUNTER_LENGTH))
    assert CountersReader(metadata, values).max_counters == 4


def test_should_reject_double_free_and_bad_ids(manager: CountersManager) -> None:
    counter_id = manager.allocate("x")
    manager.free(counter_id)
    with pytest.raises(ValueError, match="reclaimed, not allocated"):
        manager.free(counter_id)
    with pytest.raises(ValueError, match="unused"):
        manager.free(5)
    with pytest.raises(IndexError):
        manager.get_value(MAX)
    with pytest.raises(IndexError):
        manager.counter_offset(-1)


def test_label_is_truncated_on_a_utf8_boundary(manager: CountersManager) -> None:
    label = "é" * 300                                     # 600 bytes of utf-8
    counter_id = manager.allocate(label)
    assert manager.get_label(counter_id) == "é" * (MAX_LABEL_LENGTH // 2)
    assert manager.metadata.get_int32(LABEL_LENGTH_OFFSET) == MAX_LABEL_LENGTH


def test_should_reject_a_key_that_is_too_long(manager: CountersManager) -> None:
    with pytest.raises(ValueError, match="key"):
        manager.allocate("x", key=bytes(MAX_KEY_LENGTH + 1))
    assert manager.allocate("x", key=bytes(range(MAX_KEY_LENGTH))) == 0


def test_reader_over_another_mapping_sees_the_managers_writes(shm_dir) -> None:
    path = shm_dir / "counters.dat"
    with open(path, "wb") as f:
        f.truncate(MAX * (METADATA_LENGTH + COUNTER_LENGTH))

    def open_buffers() -> tuple[AtomicBuffer, AtomicBuffer, mmap.mmap]:
        with open(path, "r+b") as f:
            memory = mmap.mmap(f.fileno(), 0)
        view = memoryview(memory)
        split = MAX * METADATA_LENGTH
        return AtomicBuffer(view[:split]), AtomicBuffer(view[split:]), memory

    m_meta, m_values, _ = open_buffers()
    manager = CountersManager(m_meta, m_values)
    counter_id = manager.allocate("client heartbeat", type_id=CLIENT_HEARTBEAT, owner_id=3)
    manager.set_value(counter_id, 123456)
    r_meta, r_values, _ = open_buffers()
    (counter,) = CountersReader(r_meta, r_values).counters()
    assert (counter.label, counter.type_name, counter.value, counter.owner_id) == (
        "client heartbeat", "client-heartbeat", 123456, 3)


def test_manager_resumes_over_buffers_in_use(clock: FakeClock) -> None:
    metadata, values = buffers()
    first = CountersManager(metadata, values, clock=clock)
    for i in range(3):
        first.allocate(f"c{i}")
    first.free(1)
    second = CountersManager(metadata, values, clock=clock)
    assert second.allocate("fresh") == 3
    clock.now_ms += 1000
    assert second.allocate("reused") == 1
    assert second.available_counters == MAX - 4


def test_unused_records_are_zero() -> None:
    metadata, values = buffers()
    reader = CountersReader(metadata, values)
    assert reader.get_state(0) == RECORD_UNUSED
    assert reader.counters() == []
