"""The log port: all the netbridge's sans-IO sender and receiver ask of a log.

:class:`~netbridge.sender.NetworkSender` reads a publication's log through a
:class:`PublicationPort`; :class:`~netbridge.receiver_image.ReceiverImage` rebuilds an image's
log through an :class:`ImagePort`. Both take datagrams and times (ns) from their caller and touch
no shared memory, socket or clock of their own. :mod:`netbridge.shared_log` implements the
ports over shmbus's shared-memory logs (the bridge's); the unit tests implement them over an
in-memory model (``tests/support/fake_log_port.py``).

Positions are stream positions in bytes from the log's initial term (multiples of 32); a
term offset is a position modulo the term length.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

__all__ = [
    "Datagrams",
    "FrameWalk",
    "ImagePort",
    "LogGeometry",
    "PublicationPort",
    "Scan",
    "position_of",
    "term_id_of",
    "valid_geometry",
]


def position_of(term_id: int, term_offset: int, position_bits: int, initial_term_id: int) -> int:
    """The stream position of (term_id, term_offset) in a log whose term length is
    ``1 << position_bits``: right across the int32 wrap of term ids."""
    term_count = ((term_id - initial_term_id + 2**31) & 0xFFFFFFFF) - 2**31
    return (term_count << position_bits) + term_offset


def term_id_of(position: int, position_bits: int, initial_term_id: int) -> int:
    """The (int32) term id of the term holding ``position``."""
    return ((initial_term_id + (position >> position_bits) + 2**31) & 0xFFFFFFFF) - 2**31


def valid_geometry(term_length: int, mtu: int) -> bool:
    """Whether a log can have this term length and mtu: a power of two from 64 KiB to 1 GiB,
    and a multiple of 32 from 64 to 65504 and at most an eighth of the term (the rules of
    ``shmbus.shm.log_buffer.check_term_length`` and ``check_mtu``; a test ties them)."""
    return (65536 <= term_length <= 1 << 30 and term_length & (term_length - 1) == 0
            and mtu % 32 == 0 and 64 <= mtu <= min(65504, term_length // 8))


# --- the sender's side --------------------------------------------------------------------


class Datagrams(Protocol):
    """DATA datagrams of one scan, held as spans of the log (nothing copied): valid until the
    log is cleaned past them."""

    @property
    def count(self) -> int:
        """How many datagrams."""
        ...

    @property
    def length(self) -> int:
        """Their bytes in all."""
        ...

    def datagrams(self) -> list[memoryview]:
        """Each datagram as a read-only view of the log."""
        ...


class Scan(NamedTuple):
    """What a scan of committed DATA from a position up to a limit found (and, for the
    bridge's native spin, sent): ``position`` is where the next scan starts (after a PAD, past
    its padding); ``datagrams``: how many datagrams, ``length`` bytes in all, each at most the
    mtu and never split inside a frame; ``back_pressured``: a committed frame waits that the limit
    leaves no room for; ``more``: the datagram budget ran out with more committed.
    ``batch`` holds the datagrams, or is None when the port sent them itself."""

    position: int
    datagrams: int
    length: int
    back_pressured: bool
    more: bool
    batch: Datagrams | None


class LogGeometry(Protocol):
    """What a port says of its log's terms: their length and the first one's id, from which
    positions and (term id, term offset) pairs are reckoned."""

    @property
    def term_length(self) -> int: ...

    @property
    def initial_term_id(self) -> int: ...


class PublicationPort(LogGeometry, Protocol):
    """A publication's log as its network sender reads it (another process writes it).

    Only committed frames are ever read: a frame counts once its length (read with acquire
    semantics) is positive. The log's owner cleans it no closer than one term behind the
    sender position, so what a scan or :meth:`frames` returns stays valid until then."""

    @property
    def session_id(self) -> int: ...

    @property
    def stream_id(self) -> int: ...

    @property
    def mtu(self) -> int:
        """The log's mtu: no frame is longer."""
        ...

    @property
    def max_message_length(self) -> int:
        """The longest message the log takes (how far behind a retransmit may read past half
        a term)."""
        ...

    def scan(self, position: int, limit: int, mtu: int, max_datagrams: int) -> Scan:
        """DATA from ``position`` up to ``limit``: datagrams of committed whole frames, each
        at most ``mtu`` bytes; a PAD frame ends a datagram as its 32-byte header and the scan
        goes on past its padding; at most ``max_datagrams`` datagrams."""
        ...

    def committed(self, position: int) -> bool:
        """A frame is committed at ``position``."""
        ...

    def frames(self, position: int, length: int, mtu: int) -> list[memoryview] | None:
        """For a retransmit: the committed whole frames that start in [position, position +
        length) of one term, packed into datagrams of at most ``mtu`` bytes as :meth:`scan`
        packs them. None when the frame at ``position`` is not one this session committed
        there (its length, term offset, session or term id disagree)."""
        ...

    def producer_position(self) -> int:
        """How far publishers have claimed the log (where a closed stream ends)."""
        ...


# --- the receiver's side ------------------------------------------------------------------


class FrameWalk(NamedTuple):
    """A DATA/PAD datagram whose every frame header agrees with its place (see
    :meth:`ImagePort.walk`): ``end`` bytes of it are to be copied (a PAD as its header),
    ``span`` bytes of the stream it covers (a PAD's whole length), ``skip`` leading bytes of
    frames that already lie below the rebuild position."""

    end: int
    span: int
    skip: int


class ImagePort(LogGeometry, Protocol):
    """An image's log as the network receiver rebuilds it (subscribers in other processes
    read it)."""

    def walk(self, datagram: memoryview, term_offset: int, term_id: int,
             below: int) -> FrameWalk | None:
        """Check every frame of a DATA/PAD datagram whose first frame is at ``term_offset``
        of ``term_id``: version 0, type DATA (at least a header long, inside the datagram) or
        PAD (which ends it), this image's session and stream, that term id, each frame's term
        offset its place in the datagram, all inside the term. ``below`` is the rebuild
        position minus the datagram's position (for ``skip``). None if any check fails."""
        ...

    def insert(self, position: int, frames: memoryview) -> None:
        """Copy whole, valid ``frames`` (see :meth:`walk`) into the log at ``position``, the
        first frame's length last with a release store: a reader that sees it sees them all.
        Inside one term; never below the clean position."""
        ...

    def subscriber_position(self) -> int:
        """The slowest subscriber's position (values below the join position are taken as
        the join position)."""
        ...

    def clean(self, start: int, end: int) -> None:
        """Zero [start, end) so terms are clean before they are written again (the first
        8 bytes of each term's part last, with a release store)."""
        ...

    def end_of_stream(self, position: int) -> None:
        """Tell subscribers the stream ends at ``position``."""
        ...

    def wake_readers(self) -> None:
        """Wake subscribers asleep on the log (after frames were inserted)."""
        ...
