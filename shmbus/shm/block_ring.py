"""The block ring of one IPC publication: where messages too long for its log are kept.

A message longer than the log's max message length (min(term length / 8, 16 MiB)) is written
into a block of this ring, and the log carries a small reference frame to it, in stream order
with the other messages (flag ``LARGE_FLAG`` on a whole-message frame; see
:func:`encode_reference`). The driver creates the file beside the log (``logs/<id>.blocks``,
sparse: a stream that never sends a large message pays no memory for it; the first writer
initialises the header page) and deletes it with the log.

The file's layout (the header page, the block headers) and the reference frames are defined in
:mod:`shmbus.shm.block_ring_layout`; this module re-exports their public names, and callers
take them from here.

* Writers reserve under a lock word (CAS of their pid; a dead holder's lock is taken over):
  the pages are allocated first (``posix_fallocate``: a full /dev/shm is an OSError that says
  how much was needed and what is free, and nothing is reserved), then the headers are written
  and the reserve tail is release-stored. Filling and committing happen outside the lock.
* A block is FILLING until its reference frame is in the log; then COMMITTED with the stream
  position after that frame. The driver (the only one that frees) walks from the free head:
  a COMMITTED block whose position every counted reader has reached, or a FREE one (padding,
  abandoned), is released: its pages go back to /dev/shm (MADV_REMOVE; but the warm
  beginning of the ring, where a writer starts again once it is free, keeps its pages), then
  the free head is release-stored. A FILLING block of a dead writer is committed at
  the producer position (its reference, if any, lies before it). Readers holding a block
  hold their position before its reference frame, so they hold the block.
* The warm beginning is the part of the ring, from its start, whose pages are kept once used:
  blocks of at most half of it stay there (a writer waits for room there rather than take
  cold pages, so readers and writer overlap on two blocks); it is allocated once (a mark in
  the header) and mapped once per copying writer, so a stream of long messages reuses the same
  pages and pays no allocation, zeroing or page fault per message. Its size (the warm limit, a
  header field) is bounded by what the machine has (:func:`warm_bound`): at most
  ``WARM_BYTES`` (64 MiB) and at most a share (``Context.large_message_warm_share``, a
  quarter by default) of the free space of the bus's filesystem, this ring's own pages counted
  as free, but never less than room for two of the longest message reserved (at most the
  whole ring). A writer measures it (``statvfs``) when the ring grows: when the limit is not
  measured yet or too small for two of its blocks (it is raised), and when its block allocates
  pages past the allocated mark (it is lowered to the bound, never below that block or the
  mark). So a quarter is left for the driver's own files and new logs, and what one ring
  keeps shrinks the share of the next. Its /dev/shm cost: a stream of 256 MiB messages holds
  512 MiB and 16 KiB while it runs. Where /dev/shm cannot hold a second block the writer
  waits until the ring is empty and reuses the first: one block at a time, so a 256 MiB
  message needs 256 MiB and 8 KiB free (Docker's default 64 MiB /dev/shm takes messages up to
  what the bus's logs leave free of it).
* The driver gives warm pages back under the reserve lock (so no writer places a block
  meanwhile), lowering the allocated mark before the pages go and bumping the warm generation
  (writers' populated marks are stale then), and the limit goes back to not measured (the
  next writer measures it with the room there is then, at least what is still allocated):
  once the ring has been empty and idle for ``WARM_IDLE_S`` (5 s), what lies past its share
  of the free space now (no floor: nothing is being written); and when the driver cannot
  create a file of the bus (a log, a block ring) for lack of room, every page no live block
  holds (:meth:`BlockRing.give_back_warm`), before it tries once more. A new driver gives
  back the warm pages of a dead driver's rings before it removes their files (their clients
  may map them until they hear of it), so they do not hold the room its cnc.dat and logs
  need.
* Within the warm beginning a block goes round in its cycle (:func:`cycle_length`: the first
  ``CYCLE_BYTES``, 16 MiB, or two blocks when they are longer than 8 MiB) whenever readers
  have left the whole cycle, so the memory a writer fills next is what its readers just left,
  still in cache; while readers are still in it, it goes on into the warm beginning (and
  marks a writer waiting, so readers moving on wake the driver to free the cycle). A writer the ring
  refused sleeps on the ring's room word (bounded), which the driver bumps once it freed
  blocks while a writer waited.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shmbus.shm._native import AtomicBuffer, signal_word, wait_word
from shmbus.shm.block_ring_layout import (
    _CAPACITY,
    _HEAD,
    _LENGTH,
    _LOCK,
    _LONGEST_SPAN,
    _MAGIC,
    _MAX_MESSAGE,
    _PID,
    _RELEASE_POSITION,
    _ROOM_WAKE,
    _SPAN,
    _STATE,
    _TAIL,
    _WARM_ALLOCATED,
    _WARM_GENERATION,
    _WARM_LIMIT,
    _WRITER_WAITING,
    BLOCK_HEADER,
    COMMITTED,
    FILLING,
    FREE,
    HEADER_PAGE,
    LARGE_FLAG,
    MAGIC,
    PAGE,
    REFERENCE_FLAGS,
    REFERENCE_LENGTH,
    CorruptReferenceError,
    RingUsage,
    _span,
    decode_reference,
    encode_reference,
    ring_capacity,
    ring_path,
    ring_usage,
)

__all__ = [
    "BLOCK_HEADER", "COMMITTED", "CYCLE_BYTES", "FILLING", "FREE", "HEADER_PAGE", "LARGE_FLAG",
    "MAGIC", "PAGE", "REFERENCE_FLAGS", "REFERENCE_LENGTH", "WARM_BYTES", "WARM_IDLE_S",
    "WARM_SHARE", "BlockRing", "BlockRingFullError", "CorruptReferenceError", "RingUsage",
    "cycle_length", "decode_reference", "encode_reference", "pid_alive", "ring_capacity",
    "ring_path", "ring_usage", "warm_bound",
]

#: the most of a ring's beginning whose memory is kept once used for blocks of up to half of it
#: (freed blocks there are reused as they are: no allocation, no zeroing, no page faults), where
#: the bus's filesystem has room for it (see warm_bound); the rest is given back when freed
WARM_BYTES = 64 << 20
#: the share of the free space of the bus's filesystem a ring's warm beginning may take
#: (Context.large_message_warm_share)
WARM_SHARE = 0.25
#: seconds an empty ring keeps its warm beginning past its share of the free space before the
#: driver gives that back
WARM_IDLE_S = 5.0

#: the least ring a stream of blocks of at most half the warm beginning goes round in (see
#: cycle_length)
CYCLE_BYTES = 16 << 20


def warm_bound(free_bytes: int, share: float, longest: int, capacity: int | None = None) -> int:
    """The most ring bytes a block ring keeps warm: ``share`` of ``free_bytes`` (the free space
    of the bus's filesystem, the ring's own pages counted as free), at most WARM_BYTES, but
    never less than room for two blocks of ``longest`` payload bytes (0: no such floor), and
    never more than the ring (``capacity``); whole pages."""
    shared = min(WARM_BYTES, int(max(0, free_bytes) * share) // PAGE * PAGE)
    bound = max(shared, 2 * _span(longest) if longest > 0 else 0)
    return bound if capacity is None else min(capacity, bound)


def cycle_length(span: int, warm: int) -> int:
    """The ring bytes from 0 a block of ``span`` bytes (at most half the warm beginning,
    ``warm``) goes round in while its readers keep up: CYCLE_BYTES, or two blocks when they
    are longer (past it, a block goes round once readers have left the whole cycle, and goes
    on into the warm beginning while they have not, so a burst still has all of it).
    Memory written and read again within a few MiB stays in the CPUs' caches: on the 2-core
    development machine a stream of 1 MiB arrays copied on both sides took a fifth to a third less
    CPU per GB than going round 64 MiB."""
    return min(warm, max(CYCLE_BYTES, 2 * span))


#: madvise(2) advice: fault a range's page tables in at once for writing (Linux 5.14+; Python
#: 3.11's mmap module has no name for it)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


class BlockRingFullError(Exception):
    """No room in the ring until readers move on (back-pressure)."""


class BlockRing:
    """One mapped block ring. The driver :meth:`create` s and :meth:`reclaim` s; writers
    :meth:`reserve`, fill and :meth:`commit` (or :meth:`abandon`); readers :meth:`view`."""

    def __init__(self, path: Path, fd: int, mapping: mmap.mmap,
                 warm_share: float = WARM_SHARE) -> None:
        self.path = path
        #: the share of the free space of the bus's filesystem this process lets the warm
        #: beginning take (see warm_bound): a writer's where the ring grows, the driver's
        #: when the ring is idle
        self.warm_share = warm_share
        self._fd = fd
        self._mmap = mapping
        self._memory = memoryview(mapping)
        self.buffer = AtomicBuffer(mapping)
        self.capacity = len(mapping) - HEADER_PAGE
        #: the longest payload a block takes (at least Context.max_large_message_length)
        self.max_message_length = self.capacity // 2 - BLOCK_HEADER
        self._ready = False
        self._next_look = 0.0
        #: ring bytes from 0 this process has populated (see _populate), and in which
        #: generation of the warm beginning
        self._populated_warm = 0
        self._populated_generation = 0
        #: (the driver's) the reserve tail last seen, when it was last seen to move, and
        #: whether the warm beginning was cooled down since (see _cool_down)
        self._seen_tail = -1
        self._tail_moved_at = 0.0
        self._cooled = False
        # uses of the mapping in progress (enter/leave) and whether close was asked: close
        # may come from the client's conductor thread (a driver restart rebinds the
        # publication) while a writer thread is between reserve and commit
        self._use_lock = threading.Lock()
        self._users = 0
        self.closed = False

    @classmethod
    def create(cls, path: str | os.PathLike[str], max_message_length: int,
               warm_share: float = WARM_SHARE) -> BlockRing:
        """Create the ring file for messages up to ``max_message_length`` bytes: sparse, it
        takes no memory until a writer first uses it (and initialises its header)."""
        path = Path(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, HEADER_PAGE + ring_capacity(max_message_length))
            mapping = mmap.mmap(fd, HEADER_PAGE + ring_capacity(max_message_length))
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(path, fd, mapping, warm_share)

    @classmethod
    def open(cls, path: str | os.PathLike[str], warm_share: float = WARM_SHARE) -> BlockRing:
        """Map an existing ring (FileNotFoundError when its publication has none)."""
        path = Path(path)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_PAGE + 2 * PAGE or size % PAGE:
                # (a ring is its header page and two blocks' worth of whole pages at least)
                raise ValueError(f"block ring {path}: {size} bytes, not a header page and "
                                 f"whole pages of ring (cut short, or not a ring)")
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mapping, warm_share)

    def _is_ready(self) -> bool:
        """Whether a writer initialised the header. Until then its page is a hole, and looking
        (through the mapping) would allocate it: the file's blocks are asked first, at most
        every 10 ms."""
        if not self._ready:
            now = time.monotonic()
            if now < self._next_look:
                return False
            self._next_look = now + 0.01
            self._ready = (os.fstat(self._fd).st_blocks > 0
                           and self.buffer.get_int64_acquire(_MAGIC) == MAGIC)
        return self._ready

    def _initialise(self) -> None:
        """A writer's first use: allocate the header page (OSError when /dev/shm is full)."""
        # allocated before it is touched: a fault on a hole of a full tmpfs is a SIGBUS
        self._allocate_at(0, HEADER_PAGE)
        if self.buffer.get_int64_acquire(_MAGIC) != MAGIC:
            self.buffer.put_int64(_CAPACITY, self.capacity)
            self.buffer.put_int64(_MAX_MESSAGE, self.max_message_length)
            self.buffer.compare_and_set_int64(_MAGIC, 0, MAGIC)
        self._ready = True

    # -- writers --------------------------------------------------------------------------------

    def reserve(self, length: int, pid: int, populate: bool = False) -> int:
        """Reserve a block for ``length`` payload bytes; returns its ring position. With
        ``populate`` (the caller writes every byte next) its pages are mapped at once.

        Raises :class:`BlockRingFullError` when it does not fit until readers move on, OSError
        (ENOSPC, with the sizes) when /dev/shm cannot hold it (nothing reserved then), and
        ValueError past the ring's max message length.
        """
        if length > self.max_message_length:
            raise ValueError(f"message of {length} bytes exceeds the max large message length "
                             f"of {self.max_message_length} bytes "
                             f"(Context.max_large_message_length)")
        if not self._ready:
            self._initialise()
        need = _span(length)
        b = self.buffer
        if not self._try_lock(pid):
            raise BlockRingFullError  # another writer is reserving: try again
        try:
            tail = b.get_int64(_TAIL)
            head = b.get_int64_acquire(_HEAD)
            at = tail % self.capacity
            warm = self._warm_limit_for(need)
            # past the end, or past the warm beginning (whose pages are kept) while the
            # beginning is free again: start again there (no allocation, no page faults).
            # A block of at most half the warm beginning always goes there, waiting for room
            # (back-pressure) rather than going on into cold memory: such messages stay within
            # the warm beginning's memory, and a writer ahead of its readers does not pay for
            # fresh pages on every message
            warm_free = head == tail or (head % self.capacity >= need and head // self.capacity
                                         == tail // self.capacity)
            warm_only = need <= warm // 2
            # past its cycle (see cycle_length) such a block goes round as soon as readers have
            # left the whole cycle: the blocks they just left, still in cache, are the ones it
            # fills next, with a cycle of room before it; while readers are still in it, it
            # goes on into the warm beginning (a burst has all of it)
            cycle = cycle_length(need, warm)
            past_cycle = warm_only and at + need > cycle
            cycle_free = head == tail or (head % self.capacity >= cycle and head // self.capacity
                                          == tail // self.capacity)
            pad = self.capacity - at if at and (
                at + need > self.capacity
                or (at + need > warm and (warm_free or warm_only))
                or (past_cycle and cycle_free)) else 0
            if (pad and head == tail and pad + need > self.capacity
                    and at + need <= self.capacity):
                # an empty ring whose block would overlap its own padding: place it here, as
                # waiting would wait for nothing
                pad = 0
            if tail + pad + need - head > self.capacity:
                b.put_int64_release(_WRITER_WAITING, 1)
                raise BlockRingFullError
            start = tail + pad
            self._bound_growth(start % self.capacity, need, warm)
            try:
                self._allocate(start % self.capacity, need)
            except OSError as e:
                # /dev/shm cannot hold one more block, but the allocated warm beginning holds
                # this one: start there now if the ring is empty, else wait until it is
                # (back-pressure), as a writer of one block at a time did before the warm
                # beginning grew
                if (e.errno != errno.ENOSPC or start % self.capacity == 0
                        or need > b.get_int64_acquire(_WARM_ALLOCATED)):
                    raise
                if head != tail or pad or need > at:
                    b.put_int64_release(_WRITER_WAITING, 1)
                    raise BlockRingFullError from e
                pad = self.capacity - at
                start = tail + pad
            self._write_header(start, need, FILLING, length, pid)
            if pad:  # the padding block's header page is free space too: allocate it
                self._allocate(at, PAGE)
                self._write_header(tail, pad, FREE, 0, pid)
            elif past_cycle:
                # the writer would go round: readers moving on wake the driver to free the
                # cycle now rather than on its timer
                b.put_int64_release(_WRITER_WAITING, 1)
            b.put_int64_release(_TAIL, start + need)
        finally:
            b.put_int64_release(_LOCK, 0)
        if populate:
            self._populate(start, need)
        return start

    def warm_limit(self) -> int:
        """The size of the warm beginning now (0: not measured yet; see warm_bound)."""
        return self.buffer.get_int64_acquire(_WARM_LIMIT)

    def _warm_limit_for(self, need: int) -> int:
        """(Under the reserve lock.) The warm beginning for a block of ``need`` bytes: as it
        is, unless not measured yet or too small to hold two such blocks; then measured
        (:meth:`_bound`) and raised to that, so a stream of long messages reuses the same
        pages instead of taking (zeroed, faulted) fresh ones for each."""
        b = self.buffer
        if need > b.get_int64(_LONGEST_SPAN):
            b.put_int64_release(_LONGEST_SPAN, need)
        warm = b.get_int64_acquire(_WARM_LIMIT)
        if warm and 2 * need <= warm:
            return warm
        wanted = max(warm, b.get_int64_acquire(_WARM_ALLOCATED), self._bound())
        b.put_int64_release(_WARM_LIMIT, wanted)
        return wanted

    def _bound_growth(self, at: int, need: int, warm: int) -> None:
        """(Under the reserve lock, before a block of ``need`` bytes at ring offset ``at`` is
        allocated.) Where the block grows the warm beginning's allocated pages, the bound is
        measured again: with less free space now, the warm beginning ends sooner (not before
        this block, nor before the pages already known allocated)."""
        b = self.buffer
        allocated = b.get_int64_acquire(_WARM_ALLOCATED)
        if at <= allocated < min(at + need, warm):
            bound = self._bound()
            if bound < warm:
                b.put_int64_release(_WARM_LIMIT, max(bound, min(at + need, warm)))

    def _bound(self) -> int:
        """(Under the reserve lock.) warm_bound measured now, for the longest block reserved:
        the free space of the ring's filesystem (the bus directory's), with this ring's own
        pages counted as free, so that what it already keeps does not shrink its own share."""
        longest = self.buffer.get_int64_acquire(_LONGEST_SPAN)
        return warm_bound(self._free(), self.warm_share, max(0, longest - BLOCK_HEADER),
                          self.capacity)

    def _free(self) -> int:
        """The free bytes of the ring's filesystem, and those this ring holds."""
        st = os.fstatvfs(self._fd)
        return st.f_bavail * st.f_frsize + os.fstat(self._fd).st_blocks * 512

    def _populate(self, ring_position: int, span: int) -> None:
        """Map a reserved block's pages into this process in one call: the writer's copy then
        runs at memory speed instead of taking a page fault per 4 KiB (on fresh pages that
        halves a large message's cost). Only a hint: a kernel without it is left as it is.
        The warm beginning stays mapped once populated (until the driver gives warm pages
        back: a new generation), so this process does it there once."""
        at = ring_position % self.capacity
        generation = self.buffer.get_int64_acquire(_WARM_GENERATION)
        if generation != self._populated_generation:  # the driver gave warm pages back
            self._populated_warm, self._populated_generation = 0, generation
        if at + span <= self._populated_warm:
            return
        try:
            self._mmap.madvise(_MADV_POPULATE_WRITE, HEADER_PAGE + at, span)
        except OSError:
            return
        warm = self.warm_limit()
        if at <= self._populated_warm < warm:
            self._populated_warm = min(at + span, warm)

    def _try_lock(self, pid: int) -> bool:
        b = self.buffer
        for _ in range(1000):
            holder = b.get_int64_acquire(_LOCK)
            if holder == 0:
                if b.compare_and_set_int64(_LOCK, 0, pid):
                    return True
            elif not pid_alive(holder) and b.compare_and_set_int64(_LOCK, holder, pid):
                return True  # its holder died mid-reserve: nothing it did was published
            os.sched_yield()
        return False

    def _allocate(self, at: int, length: int) -> None:
        """Allocate ring bytes [at, at + length) (under the reserve lock). The warm beginning
        is allocated once: what lies below its mark is skipped, and the mark grows while the
        allocations stay contiguous from 0 (the driver never gives those pages back)."""
        b = self.buffer
        warm = b.get_int64_acquire(_WARM_ALLOCATED)
        end = at + length
        if end <= warm:
            return
        start = max(at, warm)
        self._allocate_at(HEADER_PAGE + start, end - start)
        limit = self.warm_limit()
        if start == warm and warm < limit:
            b.put_int64_release(_WARM_ALLOCATED, min(end, limit))

    def _allocate_at(self, offset: int, length: int) -> None:
        try:
            os.posix_fallocate(self._fd, offset, length)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self._mmap.madvise(mmap.MADV_REMOVE, offset, length)  # undo: free what it got
                st = os.fstatvfs(self._fd)  # (its directory may be gone: a driver restarted)
                raise OSError(e.errno, f"cannot hold a large message in {self.path}: {length} "
                              f"bytes needed, {st.f_bavail * st.f_frsize} bytes free on "
                              f"{self.path.parent} ({e.strerror})") from e
            raise

    def _write_header(self, ring_position: int, span: int, state: int, length: int,
                      pid: int) -> None:
        b, at = self.buffer, HEADER_PAGE + ring_position % self.capacity
        b.put_int64(at + _SPAN, span)
        b.put_int64(at + _LENGTH, length)
        b.put_int64(at + _PID, pid)
        b.put_int64(at + _RELEASE_POSITION, 0)
        b.put_int64_release(at + _STATE, state)

    def payload(self, ring_position: int, length: int) -> memoryview:
        """The writable payload of a block (valid until it is committed and read)."""
        at = HEADER_PAGE + ring_position % self.capacity + BLOCK_HEADER
        return self._memory[at:at + length]

    def bind(self, ring_position: int, release_position: int) -> None:
        """The block's reference frame is claimed in the log and ends at ``release_position``
        (the writer, before it commits the frame): a reader gives the block only for the frame
        that ends there (see :meth:`view`). One store; :meth:`commit` follows once the frame is
        committed."""
        self.buffer.put_int64_release(
            HEADER_PAGE + ring_position % self.capacity + _RELEASE_POSITION, release_position)

    def commit(self, ring_position: int, release_position: int) -> None:
        """The block's reference frame is in the log, ending at ``release_position``: the block
        is freed once every counted reader has reached it."""
        at = HEADER_PAGE + ring_position % self.capacity
        self.buffer.put_int64(at + _RELEASE_POSITION, release_position)
        self.buffer.put_int64_release(at + _STATE, COMMITTED)

    def abandon(self, ring_position: int) -> None:
        """The block will not be referred to (its offer failed): free it."""
        self.buffer.put_int64_release(HEADER_PAGE + ring_position % self.capacity + _STATE, FREE)

    # -- readers --------------------------------------------------------------------------------

    def view(self, reference: bytes | memoryview, position: int) -> memoryview | None:
        """The read-only payload a reference frame refers to (``reference``: its payload;
        ``position``: the stream position just after the frame, ``Header.position``); None
        when the block is gone (the driver freed it: its reader was no longer counted, dropped
        as dead or resting), or the ring is closed (its image closed meanwhile).

        CorruptReferenceError (a ValueError), naming the ring and what is wrong, for a
        reference no writer of this ring made for this frame: not a reference, not at the
        start of a block of that length, past the end of the ring or past what writers
        reserved, into a ring no writer used, or into a ring file whose size is not the one
        its header says (cut short or replaced); and a reference to a block its writer bound
        to another frame (:meth:`bind`), or to none yet (a block still being filled): a
        forged, replayed or duplicated reference, whose block may be half written. A reader
        must not stop there as at a freed block: nothing would ever move it on. (A block
        freed while this looks is told by the free head having passed it.)

        A ring file cut short after this process mapped it (another process truncated it) is
        the same error, naming its size and the mapping's: the file's size is asked (fstat of
        the held descriptor) before the mapping is touched, since touching it past the file's
        end would kill this process with SIGBUS. What this cannot close: a truncation after
        that look, while the reader copies or holds the view (a handler reading it, a
        ``take_view`` held), still faults; only a process that may truncate the bus's files
        can do that, and nothing short of copying every block under a SIGBUS handler would
        stop it."""
        ring_position, length = decode_reference(reference)
        if ring_position % PAGE or length > self.max_message_length or (
                ring_position % self.capacity + BLOCK_HEADER + length > self.capacity):
            raise self._not_a_block(ring_position, length, "not a block start, or past the "
                                    f"end of the ring of {self.capacity} bytes")
        if not self.enter():
            return None
        try:
            size = os.fstat(self._fd).st_size
            if size < HEADER_PAGE + self.capacity:
                raise self._not_a_block(ring_position, length, f"the ring file is cut short: "
                                        f"{size} bytes, mapped as {HEADER_PAGE + self.capacity}"
                                        f" bytes (truncated after this process mapped it)")
            b = self.buffer
            if not self._ready:
                self._next_look = 0.0  # a reference is worth a look now
                if not self._is_ready():
                    raise self._not_a_block(ring_position, length, "no writer used the ring")
            if b.get_int64(_CAPACITY) != self.capacity:
                raise self._not_a_block(ring_position, length, f"the ring's header says "
                                        f"{b.get_int64(_CAPACITY)} bytes of ring, the file "
                                        f"holds {self.capacity}")
            if b.get_int64_acquire(_HEAD) > ring_position:
                return None
            tail = b.get_int64_acquire(_TAIL)
            if ring_position + BLOCK_HEADER + length > tail:
                raise self._not_a_block(ring_position, length, f"past what writers reserved "
                                        f"(to ring position {tail})")
            at = HEADER_PAGE + ring_position % self.capacity
            # (a block is FILLING until its writer, having committed the frame, commits it:
            # a reader may see the frame first; the bound release position tells its frame)
            if (b.get_int64_acquire(at + _STATE) not in (FILLING, COMMITTED)
                    or b.get_int64(at + _LENGTH) != length
                    or b.get_int64(at + _SPAN) != _span(length)):
                if b.get_int64_acquire(_HEAD) > ring_position:
                    return None  # freed (and reused) while we looked
                raise self._not_a_block(ring_position, length, "no block of that length "
                                        "starts there")
            bound = b.get_int64_acquire(at + _RELEASE_POSITION)
            if bound != position:
                if b.get_int64_acquire(_HEAD) > ring_position:
                    return None  # freed (and reused) while we looked
                raise self._not_a_block(ring_position, length, (
                    f"that block is bound to the reference frame ending at stream position "
                    f"{bound}, not to this one ending at {position}" if bound else
                    "that block is still being filled: its writer has not referred to it"))
            start = at + BLOCK_HEADER
            # (the mapping outlives close while this view of it is held: see _unmap)
            return self._memory[start:start + length].toreadonly()
        finally:
            self.leave()

    def _not_a_block(self, ring_position: int, length: int, why: str) -> CorruptReferenceError:
        return CorruptReferenceError(f"corrupt large-message reference to ring position "
                                     f"{ring_position}, {length} bytes, in {self.path}: {why}")

    # -- the driver -----------------------------------------------------------------------------

    def in_use(self) -> int:
        """Ring bytes held by blocks not yet freed."""
        if not self._is_ready():
            return 0
        return self.buffer.get_int64_acquire(_TAIL) - self.buffer.get_int64_acquire(_HEAD)

    def reclaim(self, consumer_position: int, producer_position: int,
                is_alive: Callable[[int], bool] | None = None) -> int:
        """Free the blocks every counted reader is past (``consumer_position``: the lowest
        counted position, or the producer position when nobody counts); with ``is_alive``, a
        dead writer's FILLING block is committed at ``producer_position``. Returns the bytes
        freed. The driver only."""
        if not self._is_ready():
            return 0
        b = self.buffer
        start = head = b.get_int64(_HEAD)
        tail = b.get_int64_acquire(_TAIL)
        if tail != self._seen_tail:
            self._seen_tail, self._tail_moved_at = tail, time.monotonic()
            self._cooled = False
        elif (head == tail and not self._cooled
              and time.monotonic() - self._tail_moved_at > WARM_IDLE_S):
            self._cooled = self._cool_down()
        while head < tail:
            at = HEADER_PAGE + head % self.capacity
            state = b.get_int64_acquire(at + _STATE)
            if state == FILLING and is_alive is not None and not is_alive(b.get_int64(at + _PID)):
                # (bound: its frame is in the log, or padded over, before that position)
                self.commit(head, b.get_int64(at + _RELEASE_POSITION) or producer_position)
                state = COMMITTED
            if state == COMMITTED:
                if b.get_int64(at + _RELEASE_POSITION) > consumer_position:
                    break
            elif state != FREE:
                break
            head += b.get_int64(at + _SPAN)
        if head == start:
            return 0
        first = start % self.capacity
        freed = head - start
        if first + freed <= self.capacity:
            self._give_back(first, first + freed)
        else:
            self._give_back(first, self.capacity)
            self._give_back(0, first + freed - self.capacity)
        b.put_int64_release(_HEAD, head)
        if b.get_int64_acquire(_WRITER_WAITING):
            b.put_int64_release(_WRITER_WAITING, 0)
            signal_word(b, _ROOM_WAKE)
        return freed

    def _cool_down(self) -> bool:
        """(The driver, on an empty ring idle for WARM_IDLE_S.) Keep no more of the warm
        beginning than its share of the free space now (warm_bound with no floor: no message
        is being written), give back the rest, and leave the limit to be measured again by
        the next writer (with the room there is then): under the reserve lock (no writer is
        placing a block), and only while the ring is still empty, so no block lies there.
        False when a writer held the lock (the next reclaim tries again)."""
        b = self.buffer
        warm = b.get_int64_acquire(_WARM_LIMIT)
        if not warm:
            return True
        keep = min(warm, warm_bound(self._free(), self.warm_share, 0, self.capacity))
        if not b.compare_and_set_int64(_LOCK, 0, os.getpid()):
            return False  # a writer is reserving: not idle after all
        try:
            if b.get_int64_acquire(_TAIL) == b.get_int64_acquire(_HEAD):
                self._lower_warm(keep)
                if keep < warm:
                    self._mmap.madvise(mmap.MADV_REMOVE, HEADER_PAGE + keep,
                                       self.capacity - keep)
        finally:
            b.put_int64_release(_LOCK, 0)
        return True

    def _lower_warm(self, keep: int) -> None:
        """(Under the reserve lock, before pages past ``keep`` are given back.) The pages
        known allocated end at ``keep`` at most, and the limit goes back to not measured (the
        next writer measures it, at least what is allocated): the allocated mark first, so no
        writer skips allocating a page about to go; writers' populated marks are made
        stale."""
        b = self.buffer
        if b.get_int64_acquire(_WARM_ALLOCATED) > keep:
            b.put_int64_release(_WARM_ALLOCATED, keep)
        b.put_int64_release(_WARM_LIMIT, 0)
        b.put_int64_release(_WARM_GENERATION, b.get_int64(_WARM_GENERATION) + 1)

    def give_back_warm(self) -> int:
        """(The driver, when a file of the bus cannot be created for lack of room.) Give back
        every page of the ring that no live block holds, the warm beginning's too; the next
        writer measures the warm beginning again (warm_bound, with the room left then).
        Under the reserve lock (nothing is given back when a live writer keeps it); returns
        the bytes given back."""
        self._next_look = 0.0
        if not self._is_ready():
            return 0  # never used: it holds nothing
        b = self.buffer
        if not self._try_lock(os.getpid()):
            return 0
        try:
            before = os.fstat(self._fd).st_blocks
            self._lower_warm(0)
            head = b.get_int64_acquire(_HEAD)
            for start, end in _unused(head, b.get_int64_acquire(_TAIL) - head, self.capacity):
                self._mmap.madvise(mmap.MADV_REMOVE, HEADER_PAGE + start, end - start)
            return max(0, before - os.fstat(self._fd).st_blocks) * 512
        finally:
            b.put_int64_release(_LOCK, 0)

    def room_seen(self) -> int:
        """(A writer, before it tries to reserve.) The room wake-up word, for
        :meth:`wait_for_room`."""
        return self.buffer.get_int32_acquire(_ROOM_WAKE) if self._ready else 0

    def wait_for_room(self, seen: int, timeout: float) -> None:
        """(A writer the ring refused.) Sleep until the driver frees blocks after ``seen`` was
        read (:meth:`room_seen`), or ``timeout`` seconds: the wait is bounded, as a free that
        raced the refusal may not wake it."""
        if self._ready:
            wait_word(self.buffer, _ROOM_WAKE, seen, timeout)
        else:
            time.sleep(timeout)

    def writer_waiting(self) -> bool:
        """Whether a writer found the ring full since the driver last freed a block."""
        return self._is_ready() and self.buffer.get_int64_acquire(_WRITER_WAITING) != 0

    def _give_back(self, start: int, end: int) -> None:
        """Return the pages of ring offsets [start, end) to /dev/shm, but for the warm
        beginning of the ring, which writers reuse whenever the ring empties."""
        start = max(start, self.warm_limit())
        if start < end:
            self._mmap.madvise(mmap.MADV_REMOVE, HEADER_PAGE + start, end - start)

    def enter(self) -> bool:
        """Begin a use of the mapping (a writer's reserve to commit or abandon): it stays
        mapped until the matching :meth:`leave`. False once closed: do not use it."""
        with self._use_lock:
            if self.closed:
                return False
            self._users += 1
            return True

    def leave(self) -> None:
        """End a use begun by :meth:`enter`; the last one after a close unmaps."""
        with self._use_lock:
            self._users -= 1
            unmap = self.closed and self._users == 0
        if unmap:
            self._unmap()

    def close(self) -> None:
        """Close: unmapped now, or by the last :meth:`leave` of a use in progress.
        Idempotent; any thread may call it."""
        with self._use_lock:
            if self.closed:
                return
            self.closed = True
            unmap = self._users == 0
        if unmap:
            self._unmap()

    def _unmap(self) -> None:
        """Unmap (when no view of it is held any more) and close the file."""
        self.buffer.release()
        try:
            self._memory.release()
            self._mmap.close()
        except BufferError:
            pass  # a reader still holds a view: the mapping goes when the last one does
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _unused(head: int, in_use: int, capacity: int) -> list[tuple[int, int]]:
    """The ring offsets [start, end) that no live block holds: those outside the ``in_use``
    bytes from ring position ``head``."""
    if in_use <= 0:
        return [(0, capacity)]
    if in_use >= capacity:
        return []
    first = head % capacity
    end = first + in_use
    if end > capacity:
        return [(end - capacity, first)]
    return [(start, stop) for start, stop in ((0, first), (end, capacity)) if stop > start]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists and has not exited: signal 0 probes without
    sending, and a zombie (killed, not yet reaped by its parent) counts as dead: it holds
    nothing and will never finish what it began."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists (another user's): /proc says whether it is a zombie
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read()
    except OSError:
        return True  # no /proc: signal 0 is all there is
    # the state follows the command name, which is in parentheses and may hold any byte
    return fields[fields.rfind(b")") + 2:][:1] not in (b"Z", b"X")
