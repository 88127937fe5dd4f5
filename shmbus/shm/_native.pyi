"""Types of the native core (shmbus/shm/native/*.c); keep in step with its method tables
(tests/shmbus/shm/test_native_stub.py checks that every name is here). Arguments the C code
parses positionally are positional-only here.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias, final

import numpy as np
from _typeshed import ReadableBuffer, WriteableBuffer

# Anything with the buffer protocol. numpy's stubs give ndarray the protocol only on Python
# 3.12 and later, so arrays are named too (shmbus supports 3.11).
Buffer: TypeAlias = ReadableBuffer | np.ndarray[Any, Any]
WritableBuffer: TypeAlias = WriteableBuffer | np.ndarray[Any, Any]

@final
class AtomicBuffer:
    """Bounds-checked plain, acquire/release and atomic access over a writable, C-contiguous
    buffer. A bad offset raises IndexError, a misaligned atomic access ValueError, any access
    after ``release()`` ValueError."""

    def __init__(self, buffer: WritableBuffer) -> None: ...
    @property
    def capacity(self) -> int:
        """Length of the buffer in bytes (0 once released)."""
    def get_int32(self, offset: int, /) -> int: ...
    def get_int64(self, offset: int, /) -> int: ...
    def get_int32_acquire(self, offset: int, /) -> int: ...
    def get_int64_acquire(self, offset: int, /) -> int: ...
    def put_int32(self, offset: int, value: int, /) -> None: ...
    def put_int64(self, offset: int, value: int, /) -> None: ...
    def put_int32_release(self, offset: int, value: int, /) -> None: ...
    def put_int64_release(self, offset: int, value: int, /) -> None: ...
    def get_and_add_int32(self, offset: int, delta: int, /) -> int:
        """The value before the add."""
    def get_and_add_int64(self, offset: int, delta: int, /) -> int:
        """The value before the add."""
    def compare_and_set_int32(self, offset: int, expected: int, desired: int, /) -> bool: ...
    def compare_and_set_int64(self, offset: int, expected: int, desired: int, /) -> bool: ...
    def get_bytes(self, offset: int, length: int, /) -> bytes: ...
    def put_bytes(self, offset: int, data: Buffer, /) -> None: ...
    def set_memory(self, offset: int, length: int, value: int, /) -> None: ...
    def release(self) -> None:
        """Drop the underlying buffer; later accesses raise ValueError. Idempotent."""

class PublicationCore:
    """The term appender behind ExclusivePublication and ConcurrentPublication."""

    def __init__(
        self,
        log_buffer: AtomicBuffer,
        term_length: int,
        initial_term_id: int,
        mtu: int,
        session_id: int,
        stream_id: int,
        limit_buffer: AtomicBuffer,
        limit_offset: int,
        exclusive: bool,
        counters: AtomicBuffer | None = None,
    ) -> None:
        """counters: the bus's counter values; with it the publication raises its own limit
        from the subscriber positions the driver counts (see flow_control_set)."""
    @property
    def max_payload_length(self) -> int:
        """Largest payload of one frame (mtu - 32); larger messages are fragmented."""
    @property
    def max_message_length(self) -> int:
        """Largest message offer accepts: min(term length / 8, 16 MiB)."""
    @property
    def session_id(self) -> int: ...
    @property
    def stream_id(self) -> int: ...
    @property
    def term_length(self) -> int: ...
    @property
    def initial_term_id(self) -> int: ...
    @property
    def mtu(self) -> int: ...
    @property
    def is_closed(self) -> bool: ...
    @property
    def max_possible_position(self) -> int:
        """Term length * 2^31: offers at or past it return MAX_POSITION_EXCEEDED."""
    @property
    def position(self) -> int:
        """The position the next message would be appended at (CLOSED once closed)."""
    @property
    def position_limit(self) -> int:
        """The position beyond which offers are back-pressured."""
    @property
    def is_connected(self) -> bool: ...
    def offer(self, *buffers: Buffer, reserved_value: int = 0) -> int:
        """One message gathered from 1 to 16 buffers: the new position (> 0) or a negative
        code. Past max_message_length, on IPC, a large message (a block of the block ring):
        OSError (ENOSPC, naming the bytes needed and free) when /dev/shm cannot hold it, then
        nothing is sent; ValueError past Context.max_large_message_length or on a channel
        without a block ring (UDP). TypeError for a non-buffer."""
    def publish(self, *buffers: Buffer, timeout: float | None = 1.0,
                reserved_value: int = 0) -> int:
        """offer until accepted (sleeping while back-pressured, after a spin of
        _wait_spin_ns): the new position. Accepted at once, one offer; a refusal goes on in
        Publication._publish_refused, which raises PublicationError after timeout s (None:
        never; 0: after the one offer)."""
    @property
    def _wait_spin_ns(self) -> int:
        """ns a back-pressured publish looks for room, yielding, before it sleeps (0: at once;
        set by the client from Context.wait_spin)."""
    @_wait_spin_ns.setter
    def _wait_spin_ns(self, value: int) -> None: ...
    def offer_many(self, messages: Sequence[Buffer] | Buffer, /) -> int:
        """How many messages were appended from the front (>= 1), a negative code when none
        was, 0 for an empty batch. A message past max_message_length goes alone on the
        large-message path: first, it is the one appended (raising as offer does, OSError
        on a full /dev/shm); further along, the batch ends before it (stream order holds)."""
    def _claim(self, length: int, reserved_value: int = 0, /) -> tuple[int, int]:
        """(new position or code, frame offset into the log; -1 on a code)."""
    def _claim_view(self, frame_offset: int, length: int, /) -> memoryview: ...
    def _commit(self, frame_offset: int, /) -> None: ...
    def _abort(self, frame_offset: int, /) -> None: ...
    def _close_core(self) -> None: ...
    def _detach_core(self) -> None:
        """The driver is gone: offers return NOT_CONNECTED until __init__ runs again."""
    def _await_progress(self, timeout: float, /) -> None:
        """Sleep (GIL released) until a reader or the limit moves, or timeout seconds pass."""

@final
class Header:
    """A copy of one frame's 32-byte header, handed to fragment handlers; made only by the
    native core."""

    @property
    def frame_length(self) -> int: ...
    @property
    def term_offset(self) -> int: ...
    @property
    def session_id(self) -> int: ...
    @property
    def stream_id(self) -> int: ...
    @property
    def term_id(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def type(self) -> int: ...
    @property
    def reserved_value(self) -> int: ...
    @property
    def position(self) -> int:
        """Stream position just after this frame."""
    @property
    def raw(self) -> bytes: ...

class ImageCore:
    """The term reader behind Image."""

    def __init__(
        self,
        log_buffer: AtomicBuffer,
        term_length: int,
        initial_term_id: int,
        position_buffer: AtomicBuffer,
        position_offset: int,
        owned: bool = False,
    ) -> None:
        """``owned``: the position is a driver counter lent to this image; once the driver
        takes it back (its ids change), the image reads and stores nothing more."""
    @property
    def position(self) -> int:
        """The subscriber position; set it to a non-negative multiple of 32 (ValueError)."""
    @position.setter
    def position(self, value: int) -> None: ...
    @property
    def term_length(self) -> int: ...
    @property
    def initial_term_id(self) -> int: ...
    @property
    def is_closed(self) -> bool: ...
    @property
    def is_reclaimed(self) -> bool: ...
    @property
    def _whole_messages(self) -> bool:
        """True for a group's image: a waiter wakes for whole messages only."""
    @_whole_messages.setter
    def _whole_messages(self, value: bool) -> None: ...
    def poll(self, handler: Callable[[memoryview, Header], object], fragment_limit: int, /) -> int:
        """Fragments handed to ``handler``; the memoryview is valid only during the call."""
    def controlled_poll(
        self, handler: Callable[[memoryview, Header], int | None], fragment_limit: int, /
    ) -> int:
        """Like poll; the handler returns an Action (None is CONTINUE)."""
    def _scan(
        self, limit: int, offsets: WritableBuffer, lengths: WritableBuffer,
        flags: WritableBuffer, /,
    ) -> tuple[int, int, int]:
        """(fragments, term index, bytes scanned) from the current position, not moving it."""
    def _close_core(self) -> None: ...

class SubscriptionCore:
    """The image set, polls and waits behind Subscription."""

    def __init__(self, wake_buffer: AtomicBuffer | None = None, wake_offset: int = 0) -> None:
        """wake_buffer/wake_offset: a word rung (by setting images, or _fail) to wake waiters."""
    @property
    def _wait_spin_ns(self) -> int:
        """ns a waiting poll, wait() or messages() looks for a frame, yielding, before it
        sleeps (0: at once; set by the client from Context.wait_spin)."""
    @_wait_spin_ns.setter
    def _wait_spin_ns(self, value: int) -> None: ...
    @property
    def images(self) -> tuple[Any, ...]:
        """The current images (Image instances), a snapshot: replaced, never changed."""
    @images.setter
    def images(self, value: tuple[ImageCore, ...]) -> None: ...
    def poll(self, handler: Callable[[memoryview, Header], object], fragment_limit: int = 10,
             timeout: float | None = 0) -> int:
        """Fragments delivered; with a timeout, sleeps until one arrives (at most timeout s;
        None: forever; 0: no sleep)."""
    def controlled_poll(self, handler: Callable[[memoryview, Header], object],
                        fragment_limit: int = 10, timeout: float | None = 0) -> int:
        """Like poll, the handler returning an Action."""
    def wait(self, timeout: float | None = None, /) -> bool:
        """Sleeps until an image has a fragment (True) or timeout seconds pass (False)."""
    def messages(self, timeout: float | None = 1.0) -> Iterator[bytes]:
        """Whole messages as bytes until none arrives for timeout s (None: until closed)."""
    def _take(self) -> bytes | None:
        """The next whole message, or None."""
    @property
    def _closed(self) -> bool:
        """True once Subscription.close ran (set by it)."""
    @_closed.setter
    def _closed(self, value: bool) -> None: ...
    def _fail(self, error: BaseException, /) -> None: ...
    def _set_lease(self, buffer: AtomicBuffer, offset: int, owner_id: int,
                   on_lost: Callable[[], object], /) -> None:
        """Every poll checks that the int64 at buffer[offset] is ``owner_id`` before and after
        reading, and calls ``on_lost()`` (which should raise) once it is not."""
    def _drop_lease(self) -> None:
        """Forget the lease (a closed subscription checks nothing)."""
    def _check_client(self) -> None:
        """Raise the client's error, or what on_lost raises once the lease is gone."""
    def _wake(self) -> None:
        """Wakes whoever waits on this subscription (they look again)."""
    def _watch_word(self, view: Buffer | None, offset: int = 0, value: int = 0, /) -> None:
        """wait(), await_reply and asyncio's waits also end once the int32 at ``offset`` of
        ``view`` no longer holds ``value`` (its writer wakes the sleepers, wake_sleepers); the
        view's export keeps the memory. None drops it: before the memory goes."""
    def _arm_watcher(self, watcher: FutexRing | LogWatcher, /) -> bool:
        """Arm ``watcher`` to fire once an image has a fragment to read, the images change or
        the client fails; False (nothing armed) when a poll would find something now."""

class GroupMemberCore(ImageCore):
    """One member of a subscription group on one log (see shmbus/shm/native/group_member.c).

    ``counters`` is the bus's counter values; the offsets are the value slots of the group's
    grp-pos, this member's grp-claim and the group's grp-orphan counters; ``token`` (> 0, unique
    in the group) marks this member in the group's claim lock."""

    def __init__(
        self,
        log_buffer: AtomicBuffer,
        term_length: int,
        initial_term_id: int,
        counters: AtomicBuffer,
        group_offset: int,
        claim_offset: int,
        orphan_offset: int,
        token: int,
    ) -> None: ...
    @property  # type: ignore[misc]
    def position(self) -> int:
        """The group's claim position (read-only)."""
    @property
    def claim(self) -> tuple[int, int]:
        """This member's claim record (start, end); it owns [start, end) while start < end."""
    @property
    def handed_on(self) -> bool:
        """True while the handler gets the first message of a claim handed on from a member
        that left (it may have been handling it when it went)."""
    def poll(self, handler: Callable[[memoryview, Header], object], fragment_limit: int, /) -> int:
        """Delivers this member's claim: the rest of an unfinished one, else the group's
        orphan, else a new run of whole messages of up to fragment_limit fragments."""
    def take(self) -> bytes | None:
        """The next whole message of this member's claim, copied out and done (claiming one
        message when it holds no claim); None when there is nothing to claim."""
    def controlled_poll(self, *args: object) -> int:
        """Raises TypeError: a member delivers whole claims with poll() only."""
    def _scan(self, *args: object) -> tuple[int, int, int]:
        """Raises TypeError, as controlled_poll does."""

@final
class FragmentAssembler:
    """A fragment handler that calls ``delegate(buffer, header)`` once per whole message."""

    def __init__(self, delegate: Callable[[memoryview, Header], object]) -> None: ...
    @property
    def delegate(self) -> Callable[[memoryview, Header], object]: ...
    def __call__(self, buffer: memoryview, header: Header, /) -> Any:
        """The delegate's result for the last fragment of a message, otherwise None."""
    def free_session(self, session_id: int, /) -> None: ...

@final
class Heartbeat:
    """A thread (no GIL) that stores epoch_ms() at buffer[offset] every ``interval`` seconds
    (0 < interval < 3600) until stop(), or until the counter's registration id (the next word)
    is no longer ``owner_id`` or its value not what it stored (the driver took it back)."""

    def __init__(self, buffer: AtomicBuffer, offset: int, interval: float,
                 owner_id: int) -> None: ...
    @property
    def running(self) -> bool: ...
    def stop(self) -> None:
        """Stop the thread and let go of the buffer. Idempotent; a no-op after fork."""

#: The log layout constants of shmbus/shm/native/shmbus_native.h, under the names
#: shmbus/shm/log_buffer.py gives them (tests/shmbus/shm/test_log_buffer.py compares the two).
LAYOUT: dict[str, int]

def epoch_ms() -> int:
    """The clock heartbeats use: wall-clock time in milliseconds."""

def acquire_fence() -> None: ...
def wake_log_readers(log_buffer: AtomicBuffer, /) -> None:
    """Wakes the readers asleep on the log (call after insert_frames)."""
def wake_log_writers(log_buffer: AtomicBuffer, /) -> None:
    """Wakes the publishers asleep on the log (call after the sender position moved)."""

def signal_word(buffer: AtomicBuffer, offset: int, /) -> None:
    """Bumps the 32-bit wake-up word at offset and wakes whoever sleeps on it."""

def wake_sleepers(buffer: AtomicBuffer, offset: int, /) -> None:
    """Wake everyone asleep on the int32 word at ``offset`` without changing it (a state word
    its writer just changed, such as a log's is-connected flag)."""
def wait_word(buffer: AtomicBuffer, offset: int, expected: int, timeout: float, /) -> None:
    """Sleeps (GIL released) while the word at offset holds expected, at most timeout seconds."""

def wait_for_data(
    images: tuple[ImageCore, ...], timeout: float,
    wake: tuple[AtomicBuffer, int, int] | None = None, /,
) -> bool:
    """Sleeps until one of the images has a frame to read, the wake word (buffer, offset,
    expected value) changes, or timeout seconds pass; True when an image has data."""

def flow_control_set(log_buffer: AtomicBuffer, term_length: int, counter_ids: Sequence[int], /
                     ) -> None:
    """Driver only: the counter ids of the subscriber positions the publication counts."""

def flow_control_advance(
    log_buffer: AtomicBuffer, term_length: int, limit_buffer: AtomicBuffer, limit_offset: int,
    slowest: int, mode: int, /,
) -> bool:
    """Driver only: cleans behind slowest; mode 0 raises the limit, 1 pulls it back, 2 only
    cleans. False when the metadata lock is held by a publisher (try again later)."""

def offer_call(publication: PublicationCore, kind: int, flags: int, stream_id: int,
               correlation_id: int, body: Buffer, /) -> int:
    """offer(header, body) with the 16-byte call header (call_header.py) packed natively:
    the new position or a negative code."""
def await_reply(replies: SubscriptionCore, correlation_id: int, timeout: float,
                on_other: Callable[[bytes], object], /) -> bytes | None:
    """The body of the REPLY to ``correlation_id`` once it comes (spinning for the
    subscription's wait_spin, then asleep), or None: ``timeout`` seconds passed, or another
    message was read and handed to ``on_other`` (which may have settled the call)."""
def answer_request(member: GroupMemberCore, handler: Callable[[bytes], object],
                   replies: Mapping[Any, PublicationCore], responder: object, /) -> int:
    """Claim one request of ``member``, call ``handler(request)``, offer the reply on
    ``replies[stream_id]`` (a dict) and mark the request done: 0 nothing to claim, 1 replied, 2 the
    next message is for ``member.poll(handler, 1)``, 3 malformed (dropped), 4 answered
    through ``responder._reply``/``_reply_error``."""
def answer_requests(member: GroupMemberCore, handler: Callable[[bytes], object],
                    replies: Mapping[Any, PublicationCore], responder: object, limit: int, /
                    ) -> tuple[int, int]:
    """``answer_request`` again while it replies, at most ``limit`` times: (how many replied,
    the last outcome: 1 when ``limit`` replied, else the one that stopped it, 0 drained)."""

@final
class LogWatcher:
    """A native thread that makes ``fileno()`` readable once a frame is committed where a
    sender or subscriber waits, or a subscriber reads up to a threshold; the netbridge polls it
    beside its sockets, an asyncio subscriber's event loop watches it."""

    def __init__(self) -> None: ...
    def arm(self, data: tuple[tuple[AtomicBuffer, int, int], ...],
            progress: tuple[tuple[AtomicBuffer, int, AtomicBuffer, int, int], ...], /) -> None:
        """Watch until a frame is committed at a data watch's (log buffer, term length,
        position) or a progress watch's (log buffer, term length, counter buffer, offset,
        threshold) counter reaches its threshold; replaces earlier watches; ready ones are
        left out."""
    def disarm(self, wait: bool = False, /) -> None:
        """Stop watching; wait=True returns once the thread touches no watched log."""
    def fileno(self) -> int: ...
    def clear(self) -> bool:
        """Consume the eventfd's readiness; True if it was readable."""
    def close(self) -> None: ...

@final
class FutexRing:
    """An io_uring whose fd turns readable once the futex wait armed on it (by ``arm`` or
    ``SubscriptionCore._arm_watcher``) is woken; raises OSError where io_uring or its futex
    waits (Linux 6.7+) are unavailable."""

    def __init__(self) -> None: ...
    def arm(self, data: tuple[tuple[AtomicBuffer, int, int], ...],
            progress: tuple[tuple[AtomicBuffer, int, AtomicBuffer, int, int], ...], /) -> None:
        """LogWatcher.arm's watches; the fd turns readable once one is ready."""
    def disarm(self, wait: bool = False, /) -> None:
        """Cancel the wait and take this process's sleeper counts back (always synchronous)."""
    def fileno(self) -> int: ...
    def clear(self) -> bool:
        """Consume the completions; True if the armed wait completed (then disarmed)."""
    def close(self) -> None: ...
