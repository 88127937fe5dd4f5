"""The claim logic of subscription groups, in one process: the native members over one log
(no driver; the test stands in for it with the driver's own SubscriptionGroup), and the
driver's rule for a member that leaves checked against a model of the member's claim steps.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus import FragmentAssembler, Header
from shmbus.driver.group_claims import (
    IDLE,
    Departure,
    SubscriptionGroup,
    count_messages,
    resolve_departure,
)
from shmbus.shm._native import GroupMemberCore
from shmbus.shm.counters import SECOND_WORD_OFFSET
from shmbus.shm.position import Position
from tests.support.standalone_stream import StandaloneStream

TERM_LENGTH = 65536
GROUP_SLOT, ORPHAN_SLOT, MEMBERS_SLOT, REDELIVERED_SLOT, FIRST_CLAIM_SLOT = 10, 11, 12, 13, 16


class GroupOnStream:
    """A group of native members on a standalone stream, with the driver's group state."""

    def __init__(self, directory: Path, members: int) -> None:
        self.stream = StandaloneStream(directory, create=True, term_length=TERM_LENGTH)
        self.publication = self.stream.publication(exclusive=True)
        buffer = self.stream.positions

        def slot(index: int) -> Position:
            return Position(buffer, 64 * index)

        self.group = SubscriptionGroup("g", GROUP_SLOT, slot(GROUP_SLOT), ORPHAN_SLOT,
                                       slot(ORPHAN_SLOT), MEMBERS_SLOT, slot(MEMBERS_SLOT),
                                       REDELIVERED_SLOT, slot(REDELIVERED_SLOT))
        self.group.start(0)
        self.members: list[GroupMemberCore] = []
        for i in range(members):
            self.group.add_member(FIRST_CLAIM_SLOT + i, slot(FIRST_CLAIM_SLOT + i))
            self.members.append(self._member(i))

    def _member(self, i: int) -> GroupMemberCore:
        log = self.stream.log
        return GroupMemberCore(log.buffer, log.term_length, log.descriptor.initial_term_id,
                               self.stream.positions, 64 * GROUP_SLOT,
                               64 * (FIRST_CLAIM_SLOT + i), 64 * ORPHAN_SLOT, token(i))

    def update_limit(self) -> None:
        """The driver's part: the limit follows the group's slowest counted position."""
        positions = [p.get() for _, p in self.group.flow_counters() if p.get() != IDLE]
        self.stream.update_limit([min(positions)])

    def close(self) -> None:
        for member in self.members:
            member._close_core()
        self.publication.close()
        self.stream.close()


def token(member: int) -> int:
    return 1000 + member


def message(seq: int, length: int) -> bytes:
    body = bytes((seq * 7 + i) % 251 for i in range(length - 8))
    return seq.to_bytes(4, "little") + zlib.crc32(body).to_bytes(4, "little") + body


def decode(buffer: memoryview) -> int:
    seq = int.from_bytes(buffer[:4], "little")
    assert int.from_bytes(buffer[4:8], "little") == zlib.crc32(buffer[8:]), seq
    return seq


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(8, 3000), min_size=1, max_size=80),
       turns=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), min_size=1,
                      max_size=400))
def test_members_polling_and_taking_in_any_order_get_each_whole_message_once(
        tmp_path_factory: pytest.TempPathFactory, lengths: list[int],
        turns: list[tuple[int, int]]) -> None:
    group = GroupOnStream(tmp_path_factory.mktemp("g"), 3)
    got: list[list[int]] = [[], [], []]
    assemblers = [FragmentAssembler(lambda b, h, m=m: got[m].append(decode(b)))
                  for m in range(3)]
    fragment_counts = [0, 0, 0]
    try:
        published = 0
        for member, limit in [*turns, *[(m, 64) for m in range(3)] * 200]:
            group.update_limit()
            while published < len(lengths) and group.publication.offer(
                    message(published, lengths[published])) > 0:
                published += 1
            if limit == 0:  # take() instead of poll()
                taken = group.members[member].take()
                if taken is not None:
                    got[member].append(decode(memoryview(taken)))
                    fragment_counts[member] += -(-len(taken) // (1408 - 32))
            else:
                fragment_counts[member] += group.members[member].poll(assemblers[member],
                                                                      limit)
            if published == len(lengths) and sum(map(len, got)) == len(lengths):
                break
        delivered = sorted(got[0] + got[1] + got[2])
        assert delivered == list(range(len(lengths)))
        for seqs in got:
            assert seqs == sorted(seqs)  # claims are taken in order
        assert all(m.claim[0] == IDLE for m in group.members)
        assert group.members[0].position == group.publication.position
        assert sum(fragment_counts) == sum(-(-(n) // (1408 - 32)) for n in lengths)
    finally:
        group.close()


def test_a_claim_is_whole_messages_even_past_the_fragment_limit(tmp_path: Path) -> None:
    group = GroupOnStream(tmp_path, 2)
    try:
        group.publication.offer(message(0, 5000))  # 4 fragments
        group.publication.offer(message(1, 100))
        headers: list[Header] = []
        assert group.members[0].poll(lambda b, h: headers.append(h), 1) == 4
        assert [h.flags & 0xC0 for h in headers] == [0x80, 0, 0, 0x40]
        assert group.members[1].poll(lambda b, h: None, 1) == 1
        assert group.members[0].poll(lambda b, h: None, 10) == 0
    finally:
        group.close()


def test_a_handler_that_raises_keeps_the_rest_of_the_claim_for_its_member(
        tmp_path: Path) -> None:
    group = GroupOnStream(tmp_path, 2)
    try:
        for seq in range(5):
            group.publication.offer(message(seq, 40))
        seen: list[int] = []

        def fail_on_one(buffer: memoryview, header: Header) -> None:
            seen.append(decode(buffer))
            if seen[-1] == 1:
                raise KeyError("task 1")

        with pytest.raises(KeyError):
            group.members[0].poll(fail_on_one, 5)
        start, end = group.members[0].claim
        assert seen == [0, 1] and start < end  # tasks 2..4 are still this member's
        assert group.members[1].poll(lambda b, h: pytest.fail("claimed by member 0"), 5) == 0
        assert group.members[0].poll(fail_on_one, 5) == 3
        assert seen == [0, 1, 2, 3, 4] and group.members[0].claim[0] == IDLE
    finally:
        group.close()


def test_a_departed_members_unfinished_claim_goes_to_another_and_holds_the_limit(
        tmp_path: Path) -> None:
    group = GroupOnStream(tmp_path, 2)
    try:
        for seq in range(6):
            group.publication.offer(message(seq, 100))
        seen: list[tuple[int, int]] = []

        def stop_at_two(buffer: memoryview, header: Header) -> None:
            seen.append((0, decode(buffer)))
            if seen[-1][1] == 2:
                raise RuntimeError("member 0 stops here")

        with pytest.raises(RuntimeError):
            group.members[0].poll(stop_at_two, 6)
        unfinished = group.members[0].claim
        # the member leaves: its record stays counted until its claim is handed on
        assert not group.group.remove_member(FIRST_CLAIM_SLOT, token(0))
        counted = [p.get() for _, p in group.group.flow_counters()]
        assert min(counted) == unfinished[0] < group.members[1].position
        assert group.group.hand_on(group.stream.log) == [FIRST_CLAIM_SLOT]
        assert group.group.redelivered.get() == 3
        assert min(p.get() for _, p in group.group.flow_counters()) == unfinished[0]
        taken = group.members[1].take()  # a take picks up the orphan, one message at a time
        assert taken is not None and decode(memoryview(taken)) == 3
        assert group.members[1].poll(lambda b, h: seen.append((1, decode(b))), 10) == 2
        assert seen == [(0, 0), (0, 1), (0, 2), (1, 4), (1, 5)]
        assert group.group.orphan.get() == IDLE
        assert count_messages(group.stream.log, 0, group.publication.position) == 6
    finally:
        group.close()


def test_a_group_member_refuses_controlled_and_batch_polls(tmp_path: Path) -> None:
    group = GroupOnStream(tmp_path, 1)
    try:
        with pytest.raises(TypeError, match="poll"):
            group.members[0].controlled_poll(lambda b, h: None, 1)
        with pytest.raises(AttributeError):
            group.members[0].position = 64  # type: ignore[misc]
    finally:
        group.close()


# -- the driver's rule for a member that left, against a model of the claim steps ---------

#: The member's steps (see shmbus/shm/native/group_member.c): announce (end, then start), lock,
#: check the source and store the end (owned from here), move the source on, unlock.
STEPS = ("announce_end", "announce_start", "lock", "store_end", "move_source", "unlock")


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 10_000).map(lambda n: n * 32),
       length=st.integers(1, 100).map(lambda n: n * 32),
       from_orphan=st.booleans(), crash_after=st.integers(0, len(STEPS)),
       other_holds_lock=st.booleans())
def test_the_driver_completes_or_drops_a_claim_whatever_step_its_member_died_at(
        start: int, length: int, from_orphan: bool, crash_after: int,
        other_holds_lock: bool) -> None:
    end = start + length
    me, other = 7, 9
    # the source the member claims from: the orphan record [start, end), or grp-pos at start
    group_position = end + 4096 if from_orphan else start
    orphan_start = start if from_orphan else IDLE
    lock = other if other_holds_lock else 0
    record = (IDLE, 0)
    owned = False
    for step in STEPS[:crash_after]:
        if step == "announce_end":
            record = (record[0], start)
        elif step == "announce_start":
            record = (start, start)
        elif step == "lock":
            if lock != 0:
                break  # the lock is busy: the member gives up (and would go idle)
            lock = me
        elif step == "store_end":
            record, owned = (start, end), True
        elif step == "move_source":
            if from_orphan:
                orphan_start = IDLE
            else:
                group_position = end
        else:
            lock = 0
    departure = resolve_departure(*record, lock, me, group_position, orphan_start)
    if departure.group_position is not None:
        group_position = departure.group_position
    if departure.orphan_taken:
        orphan_start = IDLE
    if departure.unlock:
        assert lock == me
        lock = 0
    assert lock == (other if other_holds_lock else 0)
    if owned:
        # it owned [start, end): handed on whole, and the source moved past it
        assert departure.unfinished == (start, end)
        assert orphan_start == IDLE if from_orphan else group_position == end
    else:
        # it never owned anything: nothing to hand on, the source as it was
        assert departure.unfinished is None
        assert (orphan_start == start) if from_orphan else group_position == start


def test_a_member_that_left_idle_or_mid_delivery_is_resolved_from_its_record() -> None:
    assert resolve_departure(IDLE, 640, 0, 7, 6400, IDLE) == Departure(None)
    assert resolve_departure(320, 640, 0, 7, 6400, IDLE) == Departure((320, 640))
    assert resolve_departure(640, 640, 7, 7, 6400, IDLE) == Departure(None, unlock=True)


def test_a_member_record_second_word_is_its_end(tmp_path: Path) -> None:
    group = GroupOnStream(tmp_path, 1)
    try:
        group.publication.offer(message(0, 64))
        group.members[0].poll(lambda b, h: None, 1)
        buffer = group.stream.positions
        assert buffer.get_int64(64 * FIRST_CLAIM_SLOT + SECOND_WORD_OFFSET) == \
            group.publication.position == group.members[0].claim[1]
    finally:
        group.close()
