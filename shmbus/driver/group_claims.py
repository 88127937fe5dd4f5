"""A subscription group on one log (an IPC publication's, or a network image's: see
network_image.py), the driver's side: competing consumers.

The members of a group (subscriptions with ``consumer-group=<name>`` on one channel and stream)
share the log: each message goes to exactly one member. The driver allocates, per group and
log, the counters the members claim with (see ``shmbus/shm/native/group_member.c``):

* ``grp-pos``: the claim position; members move it on under the group's claim lock (its
  second word). Everything before it has been claimed.
* ``grp-claim``, one per member: the member's claim record (start; end in the second word).
  Its start is idle (INT64_MAX) between claims and moves past each message as it is done.
* ``grp-orphan``: a claim the driver hands on from a member that left, for the next member
  that polls to take.
* ``grp-members`` and ``grp-redelivered``: how many members, how many messages handed on.

Flow control counts grp-pos, grp-orphan and every claim record (idle ones do not hold the
limit back), so the log is never cleaned under a claim that is not done.

The rule is at least once: a member that leaves (closes its subscription, or its client is
timed out, e.g. after SIGKILL) gives up the part of its claim not yet done, and that part is
handed to another member. A message is done once its handler returns, so a member that dies
leaves at most one message unfinished (the one in its handler, or just done before the record
moved): only that one can be delivered twice. A member's client heartbeats from a native
thread, so a long handler does not get it timed out; a process stopped for longer than the
client liveness timeout (SIGSTOP, a debugger) is taken for dead, and if it wakes it may finish
the message in its hand after another member got it.

Pure state and rules over counters and the log; the conductor frees what is returned to free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shmbus.shm import _native
from shmbus.shm.counters import SECOND_WORD_OFFSET
from shmbus.shm.log_buffer import (
    END_FLAG,
    FRAME_ALIGNMENT,
    HDR_TYPE_PAD,
    PARTITION_COUNT,
    LogBuffer,
    align,
)
from shmbus.shm.position import Position

#: The start of an idle claim record (and of an empty orphan record).
IDLE = (1 << 63) - 1


@dataclass(frozen=True)
class Departure:
    """What becomes of the claim record of a member that left."""

    #: the part of its claim not done, to hand to another member (None: nothing)
    unfinished: tuple[int, int] | None
    #: it left inside the claim lock after claiming at the group position: move grp-pos here
    group_position: int | None = None
    #: it left inside the claim lock after taking the orphan: the orphan record is now empty
    orphan_taken: bool = False
    #: it held the claim lock: free it
    unlock: bool = False


def resolve_departure(start: int, end: int, lock: int, token: int, group_position: int,
                      orphan_start: int) -> Departure:
    """Decide, from a departed member's claim record (``start``, ``end``), the claim lock's
    holder and the group's claim and orphan positions, what the driver must complete and hand
    on. Pure; the caller reads the values after the member stopped writing.

    A record owns [start, end) when start < end (start IDLE: nothing). A member inside the
    lock (``lock == token``) that owns its record had claimed: if the source it claimed from
    has not been moved on yet, the driver moves it (grp-pos to the end, or the orphan to idle).
    """
    owned = start != IDLE and start < end
    inside = lock == token
    if not (inside and owned):
        return Departure((start, end) if owned else None, unlock=inside)
    if group_position == start:
        return Departure((start, end), group_position=end, unlock=True)
    return Departure((start, end), orphan_taken=orphan_start == start, unlock=True)


def count_messages(log: LogBuffer, start: int, end: int) -> int:
    """Whole messages (frames with the E flag) committed in ``[start, end)`` of ``log``."""
    term_length = log.term_length
    buffer = log.buffer
    messages = 0
    position = start
    while position < end:
        index = (position // term_length) % PARTITION_COUNT
        at = index * term_length + position % term_length
        length = buffer.get_int32_acquire(at)
        if length <= 0:
            break
        word = buffer.get_int32(at + 4)  # version, flags, type
        if (word >> 16) & 0xFFFF != HDR_TYPE_PAD and (word >> 8) & END_FLAG:
            messages += 1
        position += align(length, FRAME_ALIGNMENT)
    return messages


@dataclass
class SubscriptionGroup:
    """One group's counters on one log, its members' claim records and the claims to hand on.

    ``position``, ``orphan``, ``members_count`` and ``redelivered`` are the group's counters;
    ``members`` maps each member's claim counter id to its record's Position.
    """

    name: str
    position_counter_id: int
    position: Position
    orphan_counter_id: int
    orphan: Position
    members_counter_id: int
    members_count: Position
    redelivered_counter_id: int
    redelivered: Position
    members: dict[int, Position] = field(default_factory=dict)
    #: departed members' unfinished claims (counter id, record, start, end): their records
    #: stay counted until the claim is handed on
    pending: list[tuple[int, Position, int, int]] = field(default_factory=list)

    def start(self, join_position: int) -> None:
        """Set the counters of a new group (freshly allocated: second words zero): claims start
        at ``join_position``."""
        self.position.set(join_position)
        self.orphan.set(IDLE)

    def add_member(self, counter_id: int, record: Position) -> None:
        """A new member with an idle claim record (a freshly allocated counter)."""
        record.set(IDLE)
        self.members[counter_id] = record
        self.members_count.set(len(self.members))

    def remove_member(self, counter_id: int, token: int) -> bool:
        """A member (claim-lock ``token``) left: resolve its record. True when its counter
        may be freed now; False when it holds an unfinished claim (the counter keeps it
        counted until handed on)."""
        record = self.members.pop(counter_id)
        self.members_count.set(len(self.members))
        lock_offset = self.position.offset + SECOND_WORD_OFFSET
        departure = resolve_departure(
            record.get(), self._second(record), self.position.buffer.get_int64_acquire(
                lock_offset), token, self.position.get(), self.orphan.get())
        if departure.group_position is not None:
            self.position.set(departure.group_position)
        if departure.orphan_taken:
            self.orphan.set(IDLE)
        if departure.unlock:
            self.position.buffer.compare_and_set_int64(lock_offset, token, 0)
        if departure.unfinished is None:
            return True
        self.pending.append((counter_id, record, *departure.unfinished))
        return False

    def hand_on(self, log: LogBuffer) -> list[int]:
        """Put the next unfinished claim into the empty orphan record, for a member to take,
        and wake sleeping members. Returns the counter ids now free (its departed record)."""
        if not self.pending or not self.members or self.orphan.get() != IDLE:
            return []
        counter_id, _, start, end = self.pending.pop(0)
        self._put_second(self.orphan, end)
        self.orphan.set(start)
        self.redelivered.set(self.redelivered.get() + count_messages(log, start, end))
        _native.wake_log_readers(log.buffer)
        return [counter_id]

    def flow_counters(self) -> list[tuple[int, Position]]:
        """The counters that hold the publication limit back: grp-pos, grp-orphan and every
        claim record (idle records and an empty orphan read IDLE, above any position)."""
        counted = [(self.position_counter_id, self.position),
                   (self.orphan_counter_id, self.orphan)]
        counted.extend(self.members.items())
        counted.extend((counter_id, record) for counter_id, record, _, _ in self.pending)
        return counted

    def counter_ids(self) -> list[int]:
        """Every counter the group holds (to free when it ends), members' records included."""
        return [self.position_counter_id, self.orphan_counter_id, self.members_counter_id,
                self.redelivered_counter_id, *self.members,
                *(counter_id for counter_id, _, _, _ in self.pending)]

    @staticmethod
    def _second(position: Position) -> int:
        return position.buffer.get_int64_acquire(position.offset + SECOND_WORD_OFFSET)

    @staticmethod
    def _put_second(position: Position, value: int) -> None:
        position.buffer.put_int64_release(position.offset + SECOND_WORD_OFFSET, value)
