"""Counters in shared memory: the counters metadata and values sections of cnc.dat.

Modelled on Agrona's ``CountersManager`` / ``CountersReader``. The driver owns allocation; every
counter's value is a 64-bit slot any process can read (``shmbus stat``) and its one owner can
write (a publisher's position, the driver's limits, a client's heartbeat).

Values buffer: one 128-byte slot per counter id (Aeron's ``AERON_COUNTER_VALUE_LENGTH``), at
``counter_id * 128``::

    0    value (i64)            the counter's owner: release store or atomic add
    8    registration id (i64)  set at allocation: the registration it belongs to
    16   owner id (i64)         set at allocation: the client that owns it
    24   reference id (i64)     set at allocation: a related registration
    32   second word (i64)      grp-pos, grp-claim, grp-orphan only (see
                                shmbus/shm/native/group_member.c); padding for the rest
    40   (padding to 128 bytes)

Metadata buffer: one 512-byte record per counter id, at ``counter_id * 512``::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+  0
    |  state (i32): UNUSED 0, ALLOCATED 1, RECLAIMED -1             |
    +---------------------------------------------------------------+  4
    |  type id (i32)                                                |
    +---------------------------------------------------------------+  8
    |  free-for-reuse deadline (i64, ms since the Unix epoch)       |
    |                                                               |
    +---------------------------------------------------------------+  16
    |  key (112 bytes, meaning set by the type id, zero padded)  ...|
    +---------------------------------------------------------------+  128
    |  label length (i32, bytes)                                    |
    +---------------------------------------------------------------+  132
    |  label (up to 380 bytes of utf-8)                          ...|
    +---------------------------------------------------------------+  512

Ordering: the manager writes the value slot and every metadata field first, then release-stores
the state; readers acquire-load the state and read the rest only for ALLOCATED records. Ids are
handed out from 0 upwards, so readers stop at the first UNUSED record. A freed id is RECLAIMED
and reused only after ``free_to_reuse_timeout_ms``, so a reader that still holds the id does
not at once see someone else's counter under it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shmbus.shm._native import AtomicBuffer, epoch_ms

# -- type ids (Aeron's values, AeronCounters) --------------------------------------------------

SYSTEM = 0
PUB_LIMIT = 1
SND_POS = 2
RCV_HWM = 3
SUB_POS = 4
RCV_POS = 5
SND_LMT = 9
CLIENT_HEARTBEAT = 11
PUB_POS = 12
SND_BPE = 13
#: a network publication's flow control: how many receivers take part in its limit
FC_RECEIVERS = 17
#: shmbus's own types are numbered from 1000, clear of every range Aeron assigns (0-21, 50-95,
#: 100-117, 200-239, 300-303, 500-562), so Aeron's tools never misname them.
#: a network publication's flow control: one receiver's position, from its status messages
#: (Aeron has no such counter)
FC_RCV_POS = 1019
#: a network image's receiver window as its congestion control sets it, in bytes (Aeron's
#: cubic congestion control has rcv-cc-cubic-wnd, in MTUs, under type 10)
RCV_CC_WINDOW = 1020
#: a subscription group on one log (shmbus's own): the claim position (everything before it
#: was claimed by a member), one member's claim record, the claim the driver hands on from a
#: member that left, the number of members, and the messages handed on that way
GROUP_POS = 1030
GROUP_CLAIM = 1031
GROUP_ORPHAN = 1032
GROUP_MEMBERS = 1033
GROUP_REDELIVERED = 1034
#: request/reply (shmbus's own): a requester's calls in flight, answered, failed, timed out and
#: the late replies it dropped; a responder's requests served, handler errors, the replies it
#: dropped because their requester was gone, and the requests it refused to answer because
#: their reply-to named another host than theirs on an unkeyed channel
#: (shmbus/calls/remote_calls.py).
#: Labels: ``<type>: 0 0 <stream> <channel> ...``
RR_IN_FLIGHT = 1040
RR_ANSWERED = 1041
RR_FAILED = 1042
RR_TIMED_OUT = 1043
RR_LATE = 1044
RR_SERVED = 1045
RR_HANDLER_ERRORS = 1046
RR_REPLIES_DROPPED = 1047
RR_REFLECTIONS_REFUSED = 1048
REQUESTER_COUNTERS = (RR_IN_FLIGHT, RR_ANSWERED, RR_FAILED, RR_TIMED_OUT, RR_LATE)
RESPONDER_COUNTERS = (RR_SERVED, RR_HANDLER_ERRORS, RR_REPLIES_DROPPED, RR_REFLECTIONS_REFUSED)
#: The key of a grp-claim counter: the ids of its group's grp-pos and grp-orphan counters, and
#: the member's token for the group's claim lock.
GROUP_CLAIM_KEY = struct.Struct("<iiq")

#: Short readable name of each type id, as ``shmbus stat`` prints it.
TYPE_NAMES: dict[int, str] = {
    SYSTEM: "system",
    PUB_LIMIT: "pub-lmt",
    SND_POS: "snd-pos",
    RCV_HWM: "rcv-hwm",
    SUB_POS: "sub-pos",
    RCV_POS: "rcv-pos",
    SND_LMT: "snd-lmt",
    CLIENT_HEARTBEAT: "client-heartbeat",
    PUB_POS: "pub-pos",
    SND_BPE: "snd-bpe",
    FC_RECEIVERS: "fc-receivers",
    FC_RCV_POS: "fc-rcv-pos",
    RCV_CC_WINDOW: "rcv-cc-window",
    GROUP_POS: "grp-pos",
    GROUP_CLAIM: "grp-claim",
    GROUP_ORPHAN: "grp-orphan",
    GROUP_MEMBERS: "grp-members",
    GROUP_REDELIVERED: "grp-redelivered",
    RR_IN_FLIGHT: "rr-in-flight",
    RR_ANSWERED: "rr-answered",
    RR_FAILED: "rr-failed",
    RR_TIMED_OUT: "rr-timed-out",
    RR_LATE: "rr-late",
    RR_SERVED: "rr-served",
    RR_HANDLER_ERRORS: "rr-handler-errors",
    RR_REPLIES_DROPPED: "rr-replies-dropped",
    RR_REFLECTIONS_REFUSED: "rr-reflections-refused",
}


def type_name(type_id: int) -> str:
    """The readable name of ``type_id`` (``type-<n>`` for ids this module does not define)."""
    return TYPE_NAMES.get(type_id, f"type-{type_id}")


# -- layout -------------------------------------------------------------------------------------

#: Bytes per counter in the values buffer.
COUNTER_LENGTH = 128
VALUE_OFFSET = 0
REGISTRATION_ID_OFFSET = 8
OWNER_ID_OFFSET = 16
REFERENCE_ID_OFFSET = 24
SECOND_WORD_OFFSET = 32

#: Bytes per counter in the metadata buffer.
METADATA_LENGTH = 512
STATE_OFFSET = 0
TYPE_ID_OFFSET = 4
FREE_FOR_REUSE_DEADLINE_OFFSET = 8
KEY_OFFSET = 16
MAX_KEY_LENGTH = 112
LABEL_LENGTH_OFFSET = 128
LABEL_OFFSET = 132
MAX_LABEL_LENGTH = 380

RECORD_UNUSED = 0
RECORD_ALLOCATED = 1
RECORD_RECLAIMED = -1

#: Deadline of an allocated counter: never free for reuse.
NOT_FREE_TO_REUSE = (1 << 63) - 1
#: The value of registration, owner and reference ids when there is none.
NULL_ID = 0

STATE_NAMES = {RECORD_UNUSED: "unused", RECORD_ALLOCATED: "allocated",
               RECORD_RECLAIMED: "reclaimed"}


class CountersFullError(RuntimeError):
    """Every counter slot is allocated or still waiting out its free-for-reuse timeout."""


@dataclass(frozen=True, slots=True)
class Counter:
    """A snapshot of one allocated counter, as :meth:`CountersReader.counters` returns it."""

    counter_id: int
    type_id: int
    label: str
    value: int
    registration_id: int
    owner_id: int
    reference_id: int
    key: bytes
    state: int = RECORD_ALLOCATED

    @property
    def type_name(self) -> str:
        return type_name(self.type_id)


class CountersReader:
    """Reads counters; any thread of any process may use it, nothing here writes.

    ``metadata`` and ``values`` are the two sections; the number of counters is what both can
    hold. Fields other than the value are read as they are; a counter freed and reused during
    a read may show a mix of the two, which a caller that cares detects by re-reading the
    registration id.
    """

    def __init__(self, metadata: AtomicBuffer, values: AtomicBuffer) -> None:
        self.metadata = metadata
        self.values = values
        self.max_counters = min(values.capacity // COUNTER_LENGTH,
                                metadata.capacity // METADATA_LENGTH)

    @property
    def max_counter_id(self) -> int:
        """The highest id a counter can have."""
        return self.max_counters - 1

    def _check_id(self, counter_id: int) -> None:
        if not 0 <= counter_id < self.max_counters:
            raise IndexError(f"counter id {counter_id} is outside 0..{self.max_counters - 1}")

    @staticmethod
    def metadata_offset(counter_id: int) -> int:
        """Byte offset of the counter's record in the metadata buffer."""
        return counter_id * METADATA_LENGTH

    def counter_offset(self, counter_id: int) -> int:
        """Byte offset of the counter's value in the values buffer (for a ``Position``)."""
        self._check_id(counter_id)
        return counter_id * COUNTER_LENGTH + VALUE_OFFSET

    def get_value(self, counter_id: int) -> int:
        """The counter's current value (acquire load)."""
        return self.values.get_int64_acquire(self.counter_offset(counter_id))

    def get_state(self, counter_id: int) -> int:
        """RECORD_UNUSED, RECORD_ALLOCATED or RECORD_RECLAIMED (acquire load)."""
        self._check_id(counter_id)
        return self.metadata.get_int32_acquire(self.metadata_offset(counter_id) + STATE_OFFSET)

    def get_type_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self.metadata.get_int32(self.metadata_offset(counter_id) + TYPE_ID_OFFSET)

    def get_label(self, counter_id: int) -> str:
        """The counter's label (utf-8, undecodable bytes replaced)."""
        self._check_id(counter_id)
        at = self.metadata_offset(counter_id)
        length = self.metadata.get_int32(at + LABEL_LENGTH_OFFSET)
        length = min(max(length, 0), MAX_LABEL_LENGTH)
        return self.metadata.get_bytes(at + LABEL_OFFSET, length).decode("utf-8", "replace")

    def get_key(self, counter_id: int) -> bytes:
        """The counter's key: all MAX_KEY_LENGTH bytes, zero padded after what was set."""
        self._check_id(counter_id)
        return self.metadata.get_bytes(self.metadata_offset(counter_id) + KEY_OFFSET,
                                       MAX_KEY_LENGTH)

    def get_free_for_reuse_deadline(self, counter_id: int) -> int:
        """Ms since the epoch after which a reclaimed id may be reused (NOT_FREE_TO_REUSE)."""
        self._check_id(counter_id)
        return self.metadata.get_int64(
            self.metadata_offset(counter_id) + FREE_FOR_REUSE_DEADLINE_OFFSET)

    def _get_id_field(self, counter_id: int, field: int) -> int:
        return self.values.get_int64_acquire(counter_id * COUNTER_LENGTH + field)

    def get_registration_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._get_id_field(counter_id, REGISTRATION_ID_OFFSET)

    def get_owner_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._get_id_field(counter_id, OWNER_ID_OFFSET)

    def get_reference_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._get_id_field(counter_id, REFERENCE_ID_OFFSET)

    def _allocated_ids(self) -> Iterator[int]:
        for counter_id in range(self.max_counters):
            state = self.get_state(counter_id)
            if state == RECORD_UNUSED:
                return
            if state == RECORD_ALLOCATED:
                yield counter_id

    def for_each(self, callback: Callable[[int, int, bytes, str], object]) -> None:
        """Call ``callback(counter_id, type_id, key, label)`` for every allocated counter."""
        for counter_id in self._allocated_ids():
            callback(counter_id, self.get_type_id(counter_id), self.get_key(counter_id),
                     self.get_label(counter_id))

    def counters(self) -> list[Counter]:
        """A snapshot of every allocated counter, with its current value, in id order."""
        return [self.counter(counter_id) for counter_id in self._allocated_ids()]

    def counter(self, counter_id: int) -> Counter:
        """A snapshot of one counter, whatever its state."""
        return Counter(
            counter_id=counter_id,
            type_id=self.get_type_id(counter_id),
            label=self.get_label(counter_id),
            value=self.get_value(counter_id),
            registration_id=self.get_registration_id(counter_id),
            owner_id=self.get_owner_id(counter_id),
            reference_id=self.get_reference_id(counter_id),
            key=self.get_key(counter_id),
            state=self.get_state(counter_id),
        )

    def find(self, type_id: int, registration_id: int) -> int | None:
        """Id of the allocated counter with this type and registration id, or None."""
        for counter_id in self._allocated_ids():
            if (self.get_type_id(counter_id) == type_id
                    and self.get_registration_id(counter_id) == registration_id):
                return counter_id
        return None


class CountersManager(CountersReader):
    """Allocates and frees counters; one owner only (the driver's conductor thread).

    Not thread-safe, and only one process may manage a pair of buffers; anyone may read them
    with a :class:`CountersReader` meanwhile. Built over buffers already in use, it resumes
    from what they hold. ``clock`` returns ms since the Unix epoch; freed ids become reusable
    ``free_to_reuse_timeout_ms`` after :meth:`free`.

    Writing a counter's value (:meth:`set_value`, :meth:`add`) is allowed from any process
    that owns that counter; the manager does not check ownership.
    """

    def __init__(self, metadata: AtomicBuffer, values: AtomicBuffer,
                 free_to_reuse_timeout_ms: int = 1000,
                 clock: Callable[[], int] = epoch_ms) -> None:
        super().__init__(metadata, values)
        if free_to_reuse_timeout_ms < 0:
            raise ValueError("free_to_reuse_timeout_ms must be >= 0")
        self.free_to_reuse_timeout_ms = free_to_reuse_timeout_ms
        self.clock = clock
        self._high_water_mark = -1
        # The manager's own record of states and reuse deadlines: any process of the user can
        # scribble on the shared metadata, and the driver must not be misled by it.
        self._allocated: set[int] = set()
        self._free_list: list[tuple[int, int]] = []  # (counter id, free-for-reuse deadline)
        for counter_id in range(self.max_counters):
            state = self.get_state(counter_id)
            if state == RECORD_UNUSED:
                break
            self._high_water_mark = counter_id
            if state == RECORD_RECLAIMED:
                self._free_list.append(
                    (counter_id, self.get_free_for_reuse_deadline(counter_id)))
            else:
                self._allocated.add(counter_id)

    def allocate(self, label: str, type_id: int = 0, key: bytes = b"",
                 registration_id: int = NULL_ID, owner_id: int = NULL_ID,
                 reference_id: int = NULL_ID) -> int:
        """Allocate a counter with value 0; returns its id.

        ``label`` is truncated to MAX_LABEL_LENGTH bytes of utf-8 (on a character boundary).
        Raises ValueError for a key over MAX_KEY_LENGTH bytes and :class:`CountersFullError`
        when no id is free (all allocated or still in their free-for-reuse timeout).
        """
        key = bytes(key)
        if len(key) > MAX_KEY_LENGTH:
            raise ValueError(f"counter key of {len(key)} bytes exceeds {MAX_KEY_LENGTH}")
        encoded = _truncate_utf8(label, MAX_LABEL_LENGTH)
        counter_id = self._next_counter_id()

        values = self.values
        slot = counter_id * COUNTER_LENGTH
        values.put_int64_release(slot + REGISTRATION_ID_OFFSET, registration_id)
        values.put_int64_release(slot + OWNER_ID_OFFSET, owner_id)
        values.put_int64_release(slot + REFERENCE_ID_OFFSET, reference_id)
        values.set_memory(slot + SECOND_WORD_OFFSET, COUNTER_LENGTH - SECOND_WORD_OFFSET, 0)
        values.put_int64_release(slot + VALUE_OFFSET, 0)

        metadata = self.metadata
        at = self.metadata_offset(counter_id)
        metadata.put_int32(at + TYPE_ID_OFFSET, type_id)
        metadata.put_int64(at + FREE_FOR_REUSE_DEADLINE_OFFSET, NOT_FREE_TO_REUSE)
        metadata.set_memory(at + KEY_OFFSET, MAX_KEY_LENGTH, 0)
        if key:
            metadata.put_bytes(at + KEY_OFFSET, key)
        metadata.set_memory(at + LABEL_OFFSET, MAX_LABEL_LENGTH, 0)
        if encoded:
            metadata.put_bytes(at + LABEL_OFFSET, encoded)
        metadata.put_int32(at + LABEL_LENGTH_OFFSET, len(encoded))
        metadata.put_int32_release(at + STATE_OFFSET, RECORD_ALLOCATED)
        self._allocated.add(counter_id)
        return counter_id

    def _next_counter_id(self) -> int:
        now = self.clock()
        for i, (counter_id, deadline) in enumerate(self._free_list):
            if now >= deadline:
                del self._free_list[i]
                return counter_id
        if self._high_water_mark + 1 >= self.max_counters:
            waiting = len(self._free_list)
            raise CountersFullError(
                f"unable to allocate a counter: all {self.max_counters} are in use"
                + (f" ({waiting} freed, waiting for their reuse timeout)" if waiting else ""))
        self._high_water_mark += 1
        return self._high_water_mark

    def free(self, counter_id: int) -> None:
        """Free an allocated counter; its id is reused after the free-for-reuse timeout. Its
        registration, owner and reference ids read NULL_ID from now on.

        Raises ValueError if the counter is not allocated (double free).
        """
        self._check_id(counter_id)
        if counter_id not in self._allocated:
            state = RECORD_UNUSED if counter_id > self._high_water_mark else RECORD_RECLAIMED
            raise ValueError(f"counter {counter_id} is {STATE_NAMES[state]}, not allocated")
        self._allocated.discard(counter_id)
        # a process still holding the id (stopped past its liveness) sees it is no longer its
        # own before anyone else can have it (ImageCore and Heartbeat compare these ids)
        slot = counter_id * COUNTER_LENGTH
        for field in (REGISTRATION_ID_OFFSET, OWNER_ID_OFFSET, REFERENCE_ID_OFFSET):
            self.values.put_int64_release(slot + field, NULL_ID)
        at = self.metadata_offset(counter_id)
        deadline = self.clock() + self.free_to_reuse_timeout_ms
        self.metadata.put_int64(at + FREE_FOR_REUSE_DEADLINE_OFFSET, deadline)
        self.metadata.put_int32_release(at + STATE_OFFSET, RECORD_RECLAIMED)
        self._free_list.append((counter_id, deadline))

    def set_value(self, counter_id: int, value: int) -> None:
        """Set the counter's value (release store). Only the counter's owner calls this."""
        self.values.put_int64_release(self.counter_offset(counter_id), value)

    def add(self, counter_id: int, delta: int = 1) -> int:
        """Atomically add ``delta``; returns the value before. Safe from several writers."""
        return self.values.get_and_add_int64(self.counter_offset(counter_id), delta)

    @property
    def available_counters(self) -> int:
        """Ids that can be allocated now or later (never used, or freed)."""
        return self.max_counters - (self._high_water_mark + 1) + len(self._free_list)


def _truncate_utf8(text: str, limit: int) -> bytes:
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return encoded
    return encoded[:limit].decode("utf-8", "ignore").encode("utf-8")
