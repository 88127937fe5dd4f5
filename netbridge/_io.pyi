"""Types of the netbridge's native loops (netbridge/native/*.c); keep in step with their method
tables (tests/shmbus/shm/test_native_stub.py checks that every name is here). Arguments the C
code parses positionally are positional-only here.
"""

from shmbus.shm._native import AtomicBuffer, Buffer, WritableBuffer

# -- the sender's and receiver's loops over logs --------------------------------------------

def term_scan(
    buffer: AtomicBuffer, term_start: int, term_length: int, term_offset: int, max_length: int,
    stop: int, /,
) -> tuple[int, int]:
    """(bytes of committed whole frames to send from term_offset, padding skipped after them)."""

def validate_datagram(
    datagram: Buffer, term_offset: int, session_id: int, stream_id: int, term_id: int,
    term_length: int, below: int, /,
) -> tuple[int, int, int] | int:
    """(end, span, skip), or -1 when any frame header of the datagram is invalid."""

def insert_frames(
    buffer: AtomicBuffer, at: int, datagram: Buffer, start: int, end: int, /
) -> int:
    """Copies datagram[start:end] to buffer[at:], the first frame's length last (release)."""

# -- datagram batches ----------------------------------------------------------------------

def receive_batch(
    fd: int, slots: WritableBuffer,
    images: tuple[tuple[AtomicBuffer, int, int, int, int, int, int], ...],
    sealer: Sealer | None = None, /,
) -> tuple[int, tuple[tuple[int, int, int, tuple[str, int] | None] | None, ...],
           list[tuple[int, int, tuple[str, int] | None]],
           list[tuple[int, tuple[str, int] | None]] | None]:
    """One non-blocking recvmmsg into 64 KiB slots: (received, in_order, rest, dropped). With
    a sealer each datagram is opened first; one that does not open is counted by the sealer
    and listed in ``dropped`` as (kind, source) (None when none was). ``images``
    are (log buffer, session id, stream id, term length, initial term id, position where its
    highest data ends, limit its data may not pass). DATA that continues one of them exactly
    at its position, valid and within its limit, is inserted into its log (readers woken);
    in_order[i] is None or (position, datagrams, bytes, source of the latest). Every other
    datagram is in ``rest`` as (slot offset, length, source), in order, and so is every later
    one of the same image (after one that names no single image, every later one). OSError
    for a bad descriptor."""

def scan_datagrams(
    log_buffer: AtomicBuffer, term_length: int, position: int, limit: int, mtu: int,
    max_datagrams: int, /,
) -> tuple[int, bytes, int, bool, bool]:
    """The sender's DATA datagrams from position up to limit: (next position, spans packed as
    little-endian int64 (buffer offset, length) pairs, their total bytes, back_pressured,
    more)."""

def send_batch(fd: int, buffer: AtomicBuffer, spans: Buffer, destination: tuple[str, int],
               sealer: Sealer | None = None, /) -> int:
    """sendmmsg of each (offset, length) span of buffer to a numeric IPv4 destination, each
    sealed first with a sealer; returns how many went (a full socket buffer ends the batch:
    loss)."""

def send_now(
    send: tuple[int, AtomicBuffer, int, int, int, int, int, tuple[object, ...], Sealer | None],
    /,
) -> tuple[int, int, int, bool, bool]:
    """busy_poll's send (see there) of what is committed at its position, at once: returns
    (position after the scan, datagrams, bytes, back_pressured, more); OSError for a bad
    socket, ValueError for a bad send."""

def busy_poll(
    fds: tuple[int, ...], data: tuple[tuple[AtomicBuffer, int, int], ...],
    progress: tuple[tuple[AtomicBuffer, int, AtomicBuffer, int, int], ...], until_ns: int,
    sends: tuple[tuple[int, AtomicBuffer, int, int, int, int, int, tuple[object, ...],
                       Sealer | None], ...] = (),
    /,
) -> tuple[tuple[int, ...] | None, tuple[()] | tuple[int, int, int, int, bool, bool]]:
    """A poll loop's spin: until CLOCK_MONOTONIC reaches until_ns, poll fds without waiting,
    check the watches (as LogWatcher.arm takes them) and the sends, and yield the CPU. A send
    is (fd, log buffer, term length, position, limit, mtu, max datagrams, destinations,
    sealer or None; sealed datagrams once for every destination): once a
    frame is committed at position, the spin sends that sender's DATA itself (scan_datagrams,
    then send_batch to each destination) and returns. Returns (found, sent): found is the
    readable fds, () when a watch is ready, else None; sent is (index in sends, position after
    the scan, datagrams, bytes, back_pressured, more) or (). OSError from poll() or a bad
    socket; ValueError for a bad send."""

# -- sealed datagrams (authenticated channels) ----------------------------------------------

class Sealer:
    """Seals and opens one socket's datagrams with AES-256-GCM (netbridge/native/
    sealing.c): ``keys`` are (key id, 32-byte secret, seals), the last that seals seals.
    ValueError for bad keys."""

    @property
    def sealed(self) -> int:
        """Datagrams sealed."""
    @property
    def opened(self) -> int:
        """Datagrams opened."""
    @property
    def bad_tag(self) -> int:
        """Dropped: the tag did not verify, or the envelope was malformed."""
    @property
    def unknown_key(self) -> int:
        """Dropped: sealed with a key id this channel does not have."""
    @property
    def replayed(self) -> int:
        """Dropped: seen already, older than the replay window, or stamped out of the skew."""
    @property
    def plaintext(self) -> int:
        """Dropped: not sealed."""
    @property
    def key_sets(self) -> int:
        """How many times keys were taken: 1 when made, and 1 more for each set_keys."""
    @property
    def session(self) -> bytes:
        """This sealer's random 16-byte session id."""
    def __init__(self, keys: list[tuple[int, bytes, bool]], max_skew_ns: int = ...) -> None: ...
    def set_keys(self, keys: list[tuple[int, bytes, bool]], /) -> None:
        """Replace the keys; peers of keys no longer given are forgotten."""
    def seal(self, datagram: Buffer, /) -> bytes:
        """The sealed datagram (60 bytes longer)."""
    def open(self, datagram: Buffer, /) -> tuple[int, bytes | None]:
        """(0, plaintext), or (drop kind, None): 1 plaintext, 2 unknown key, 3 bad tag,
        4 replayed; counted."""
