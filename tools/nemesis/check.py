"""The nemesis' messages and the checks on what a subscriber received: pure code, no IO.

A message is ``HEAD`` (writer u16, incarnation u16, sequence u64, crc32 u32) then a body cut
from a seeded random block; the crc covers the first 12 header bytes and the body. A writer
incarnation is one publication of one writer (a session, or a share of a concurrent one): its
sequence starts at 0 and counts every message it offered.

A :class:`SubscriberCheck` follows one subscriber through its images. Within one image the
sequence of every writer incarnation must go up by one; a gap there is *lost*, a message seen
again *duplicated*, one that fills an earlier gap *reordered*. Between images (a rejoin, a
rebuilt client) a jump forward is *skipped*, which the rules allow. :func:`breaches` applies the
rules of tools/nemesis/run.py to the checks and to what the writers say they sent.

The Aeron stream carries the C programs' message instead (tools/aeron_c/message.py: publisher
id, length, sequence, CRC-32 and a payload pattern); its publisher id is
:func:`aeron_publisher_id` (writer and incarnation), and :class:`AeronFormatCheck` checks it
the same way.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from tools.aeron_c.message import HEADER_LENGTH as AERON_HEADER_LENGTH
from tools.aeron_c.message import MESSAGE_HEADER as AERON_HEADER
from tools.aeron_c.message import message_payload

HEAD = struct.Struct("<HHQI")  # writer, incarnation, sequence, crc32
HEAD_SIZE = HEAD.size
_unpack_head = HEAD.unpack_from
_crc32 = zlib.crc32
BLOCK_LENGTH = 1 << 16
MAX_GAPS = 64  # gap ranges remembered per writer incarnation (to tell reordered from dup)


def payload_block(seed: int) -> bytes:
    """The random bytes message bodies are cut from (the same in every process for a seed)."""
    return random.Random(seed).randbytes(BLOCK_LENGTH)


def encode(block: bytes, writer: int, incarnation: int, sequence: int, length: int) -> bytes:
    """One message of ``length`` bytes (at least ``HEAD.size``)."""
    body_length = length - HEAD.size
    if body_length > BLOCK_LENGTH // 2:  # a large message: the block over and over
        offset = sequence * 7919 % BLOCK_LENGTH
        body = (block * (body_length // BLOCK_LENGTH + 2))[offset:offset + body_length]
    else:
        offset = sequence * 7919 % (BLOCK_LENGTH - body_length)
        body = block[offset:offset + body_length]
    head = HEAD.pack(writer, incarnation, sequence, 0)[:12]
    return head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body


def decode(message: bytes | memoryview) -> tuple[int, int, int] | None:
    """(writer, incarnation, sequence) of an intact message; None if it is corrupt."""
    if len(message) < HEAD.size:
        return None
    writer, incarnation, sequence, crc = HEAD.unpack_from(message)
    if zlib.crc32(message[HEAD.size:], zlib.crc32(message[:12])) != crc:
        return None
    return writer, incarnation, sequence


Key = tuple[int, int]  # (writer, incarnation)


@dataclass
class Track:
    """What one subscriber saw of one writer incarnation."""

    received: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    skipped: int = 0
    first: int = -1
    last: int = -1  # the highest sequence seen
    #: images of this incarnation that ended before the subscriber saw its last message
    interrupted: int = 0
    #: the subscriber was timed out by the driver (paused past its liveness) while following
    dropped: bool = False
    _next: int | None = None  # the sequence expected next in the current image (None: new)
    _gaps: list[list[int]] = field(default_factory=list)  # [start, stop) lost in this image
    #: where each gap this track opens is noted, (track, messages), until its poll returns
    #: (the subscriber's list: a poll that raises ClientTimeoutError takes its gaps back)
    poll_gaps: list[tuple[Track, int]] | None = None

    def on_message(self, sequence: int) -> None:
        self.received += 1
        if sequence == self._next:  # (the common case first: the next one, in order)
            self._next = sequence + 1
            if sequence > self.last:
                self.last = sequence
            return
        if self._next is None:  # the first message of an image
            if self.last < 0:
                self.first = sequence
            elif sequence <= self.last:
                self.duplicated += 1
                return
            else:
                self.skipped += sequence - self.last - 1
            self._next = sequence + 1
        elif sequence > self._next:
            self.lost += sequence - self._next
            if self.poll_gaps is not None:
                self.poll_gaps.append((self, sequence - self._next))
            if len(self._gaps) < MAX_GAPS:
                self._gaps.append([self._next, sequence])
            self._next = sequence + 1
        elif self._fill_gap(sequence):
            self.reordered += 1
            self.lost -= 1
        else:
            self.duplicated += 1
        self.last = max(self.last, sequence)

    def _fill_gap(self, sequence: int) -> bool:
        for i, (start, stop) in enumerate(self._gaps):
            if start <= sequence < stop:
                self._gaps[i:i + 1] = [r for r in ([start, sequence], [sequence + 1, stop])
                                       if r[0] < r[1]]
                return True
        return False

    @property
    def following(self) -> bool:
        """Whether the subscriber reads this incarnation from an image now."""
        return self._next is not None

    def end_image(self) -> None:
        """The image this incarnation was read from is gone; a new one may rejoin later."""
        if self.following:
            self.interrupted += 1
        self._next = None
        self._gaps.clear()


class SubscriberCheck:
    """Checks every message one subscriber receives, across its images and client rebuilds."""

    def __init__(self) -> None:
        self.tracks: dict[Key, Track] = {}
        self.corrupt = 0
        #: corrupt messages handed out by a poll that raised ClientTimeoutError, and the
        #: messages of the gaps it opened: paused past its liveness in the poll, the memory
        #: was reused under it (valid messages of a later lap of the log among them)
        self.torn = 0
        self._suspect_this_poll = 0
        self._gaps_this_poll: list[tuple[Track, int]] = []
        #: why the subscriber's client was rebuilt: exception name -> count
        self.rebuilds: Counter[str] = Counter()
        self._keys_by_session: dict[int, set[Key]] = {}
        #: a late joiner's joins (each from a recorded position, history then live)
        self.joins = 0
        #: (session, writer, incarnation, track) of the last message: most come in runs
        self._last: tuple[int, int, int, Track] | None = None

    def on_message(self, session_id: int, message: bytes | memoryview) -> None:
        # decode(), inline: every reader calls this for every message
        if len(message) < HEAD_SIZE:
            self._suspect_this_poll += 1
            return
        writer, incarnation, sequence, crc = _unpack_head(message)
        if _crc32(message[HEAD_SIZE:], _crc32(message[:12])) != crc:
            self._suspect_this_poll += 1
            return
        self._on_intact(session_id, writer, incarnation, sequence)

    def _on_intact(self, session_id: int, writer: int, incarnation: int, sequence: int) -> None:
        last = self._last
        if last is not None and last[0] == session_id and last[1] == writer \
                and last[2] == incarnation:
            last[3].on_message(sequence)
            return
        key = (writer, incarnation)
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(poll_gaps=self._gaps_this_poll)
        keys = self._keys_by_session.get(session_id)
        if keys is None:
            keys = self._keys_by_session[session_id] = set()
        keys.add(key)
        self._last = (session_id, writer, incarnation, track)
        track.on_message(sequence)

    def on_new_image(self, session_id: int) -> None:
        """An image of this session (re)appeared: its writers' sequences may jump ahead."""
        for key in self._keys_by_session.get(session_id, ()):
            self.tracks[key].end_image()

    def on_poll_done(self) -> None:
        """A poll returned: its corrupt messages are corrupt (a poll that delivered anything
        checks, before it returns, that the driver had not timed its client out)."""
        self.corrupt += self._suspect_this_poll
        self._suspect_this_poll = 0
        if self._gaps_this_poll:
            self._gaps_this_poll.clear()

    def finish(self) -> None:
        """The subscriber stopped reading: what is still suspect is corrupt."""
        self.on_poll_done()

    def on_rebuild(self, reason: str) -> None:
        """The subscriber's client was rebuilt (``reason``: the exception's name): every image
        is new. When the poll raised ClientTimeoutError, its corrupt messages were torn."""
        self.rebuilds[reason] += 1
        suspect, self._suspect_this_poll = self._suspect_this_poll, 0
        if reason == "ClientTimeoutError":
            self.torn += suspect
            for track, messages in self._gaps_this_poll:
                track.lost -= messages
                self.torn += messages
            for track in self.tracks.values():
                track.dropped |= track.following
        else:
            self.corrupt += suspect
        self._gaps_this_poll.clear()
        for track in self.tracks.values():
            track.end_image()
        self._keys_by_session.clear()
        self._last = None


def aeron_publisher_id(writer: int, incarnation: int) -> int:
    """The C message format's publisher id of a writer incarnation on the Aeron stream."""
    return writer << 16 | incarnation


def aeron_key(publisher_id: int) -> Key:
    """The (writer, incarnation) of an Aeron-stream publisher id."""
    return publisher_id >> 16, publisher_id & 0xFFFF


class AeronFormatCheck(SubscriberCheck):
    """A SubscriberCheck of the Aeron stream: its messages are the C programs' (length field,
    CRC-32 and payload pattern checked; anything else is corrupt), each writer incarnation
    known by its publisher id (:func:`aeron_publisher_id`)."""

    def on_message(self, session_id: int, message: bytes | memoryview) -> None:
        length = len(message)
        if length < AERON_HEADER_LENGTH:
            self._suspect_this_poll += 1
            return
        publisher_id, length_field, sequence, crc = AERON_HEADER.unpack_from(message)
        body = message[AERON_HEADER_LENGTH:]
        if length_field != length or _crc32(body) != crc \
                or body != message_payload(publisher_id, sequence, length):
            self._suspect_this_poll += 1
            return
        self._on_intact(session_id, publisher_id >> 16, publisher_id & 0xFFFF, sequence)


# -- the rules ---------------------------------------------------------------------------------

FINISHED, KILLED_MID_OFFER, KILLED_MID_CLAIM = 1, 2, 3
#: the writer rebuilt its client: the driver died or was being replaced; the driver timed the
#: client out; the driver refused its publication (RegistrationError: the disk is full); its
#: publication was closed under it (the client failed between two of its checks); a publication
#: error (a claim closed under it)
DRIVER_LOST, TIMED_OUT, REFUSED, CLOSED, PUBLICATION_FAILED = 4, 5, 6, 7, 8
#: an Aeron C writer that exited on an error of its own (a breach, reported with its output)
FAILED = 9
ENDINGS = {0: "?", FINISHED: "finished", KILLED_MID_OFFER: "killed mid-offer",
           KILLED_MID_CLAIM: "killed mid-claim", DRIVER_LOST: "rebuilt: driver lost",
           TIMED_OUT: "rebuilt: client timed out", REFUSED: "rebuilt: refused",
           CLOSED: "rebuilt: closed under it", PUBLICATION_FAILED: "rebuilt: publication error",
           FAILED: "failed"}


@dataclass(frozen=True)
class Sent:
    """What a writer incarnation says it did: ``acked`` messages were accepted by offer (or
    committed claims), ``attempted`` were handed to offer or claimed; how it ended."""

    acked: int
    attempted: int
    ending: int


@dataclass(frozen=True)
class SubscriberReport:
    name: str
    #: "tethered" and "network" subscribers must get every acked message of a live session;
    #: "untethered" ones and "spy"s may fall behind and rejoin (skipped), never lose in an image
    kind: str
    #: the writers whose streams it subscribes to
    writers: frozenset[int]
    check: SubscriberCheck


def _acked_tracks(name: str, sent: dict[Key, Sent], writers: frozenset[int],
                  check: SubscriberCheck) -> Iterator[tuple[str, Sent, Track, int]]:
    """For each incarnation of ``writers`` that had a message acked, in order: what it is
    called in a breach, what it sent, what subscriber ``name`` got of it (``check``), and how
    many of its acked messages came after the last one received."""
    for key, s in sorted(sent.items()):
        if key[0] in writers and s.acked:
            track = check.tracks.get(key, Track())
            yield (f"{name} from writer {key[0]} incarnation {key[1]} ({ENDINGS[s.ending]})",
                   s, track, s.acked - 1 - track.last)


def breaches(sent: dict[Key, Sent], subscribers: list[SubscriberReport],
             driver_loss_bound: int) -> list[str]:
    """Every rule broken, one line each naming the subscriber, writer incarnation and rule."""
    found = []
    for sub in subscribers:
        check = sub.check
        if check.corrupt:
            found.append(f"{sub.name}: {check.corrupt} corrupt messages (never allowed)")
        for key, track in sorted(check.tracks.items()):
            what = f"{sub.name} from writer {key[0]} incarnation {key[1]}"
            if key not in sent:
                found.append(f"{what}: {track.received} messages no writer sent")
                continue
            s = sent[key]
            for count, name in ((track.lost, "lost within an image"),
                                (track.duplicated, "duplicated"),
                                (track.reordered, "reordered")):
                if count:
                    found.append(f"{what}: {count} {name} (never allowed)")
            if track.last >= s.attempted:
                found.append(f"{what}: sequence {track.last} received, only {s.attempted} "
                             f"attempted")
        if sub.kind not in ("tethered", "network"):
            continue
        for what, s, track, missing in _acked_tracks(sub.name, sent, sub.writers, check):
            if s.ending == FINISHED and missing > 0 and not track.interrupted:
                found.append(f"{what}: the last {missing} of {s.acked} acked messages never "
                             f"arrived (a live writer's stream must arrive whole)")
            elif track.dropped:
                continue  # it was not following: the driver had dropped it
            elif s.ending in (KILLED_MID_OFFER, KILLED_MID_CLAIM) and missing > 0 \
                    and track.received and not track.interrupted:
                found.append(f"{what}: {missing} messages acked before the kill never arrived")
            elif s.ending >= DRIVER_LOST and missing > driver_loss_bound:
                found.append(f"{what}: {missing} acked messages lost when the writer's "
                             f"client was rebuilt, more than the bound {driver_loss_bound}")
    return found


def final_reader_breaches(name: str, sent: dict[Key, Sent], writers: frozenset[int],
                          final: SubscriberCheck) -> list[str]:
    """Rules 3 and 4 for a reader that does not outlive its client (the Aeron C reader: its
    client ends with the driver, and a new incarnation joins where the stream is), applied to
    ``final``, the check of its last incarnation (alive at the end, following the stream
    before the writers stopped): it gets the last acked message of every writer incarnation of
    ``writers`` that finished, and of every one killed mid-offer or mid-claim that it was
    following."""
    found = []
    for what, s, track, missing in _acked_tracks(name, sent, writers, final):
        if s.ending == FINISHED and missing > 0 and not track.interrupted:
            found.append(f"{what}: the last {missing} of {s.acked} acked messages never "
                         f"arrived at its last incarnation (a live writer's stream must arrive "
                         f"whole)")
        elif s.ending in (KILLED_MID_OFFER, KILLED_MID_CLAIM) and missing > 0 \
                and track.received and not track.interrupted:
            found.append(f"{what}: {missing} messages acked before the kill never arrived")
    return found
