"""Publications: append messages to a log buffer
(docs/protocol.md, Appending, fragments and padding).

:class:`ExclusivePublication` has one writer (one thread of one process) and is the fastest.
:class:`ConcurrentPublication` may be shared by threads and by several processes that map the
same log: space is claimed with an atomic fetch-add on the term tail, so messages from
different writers never interleave. Both return Aeron's codes from ``offer`` (see
:mod:`shmbus.settings.codes`); the append itself runs in the native core.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shmbus.codecs.array_messages import array_header, array_parts
from shmbus.codecs.object_messages import object_parts
from shmbus.codecs.table_messages import serialize, stream_length, write_stream
from shmbus.settings import codes
from shmbus.settings.errors import PublicationError
from shmbus.settings.timeouts import deadline_after
from shmbus.shm._native import AtomicBuffer, PublicationCore
from shmbus.shm.block_ring import WARM_SHARE, BlockRing, ring_path
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position
from shmbus.streams.async_waits import sleep_on
from shmbus.streams.context_managers import ClaimScope, Closeable
from shmbus.streams.large_messages import LargeClaim, offer_large, open_ring

#: seconds publish(), publish_async() and publish_many() keep trying by default
DEFAULT_PUBLISH_TIMEOUT = 1.0

#: how long a table writer waiting for a block sleeps between tries
_CLAIM_WAIT_S = 0.0005

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from shmbus.shm._native import Buffer  # a type of the stub only: any buffer-protocol object


class BufferClaim(ClaimScope):
    """Space claimed in the log with :meth:`Publication.try_claim`, written in place.

    Truthy when the claim succeeded; then ``buffer`` is a writable memoryview of exactly the
    claimed length, and ``commit()`` publishes the frame or ``abort()`` turns it into padding.
    Used as a context manager it commits on a normal exit and aborts on an exception; entering
    a failed claim raises :class:`PublicationError`. ``result`` is the new stream position
    after the frame, or the negative code when the claim failed.
    """

    __slots__ = {
        "_publication": None,
        "_frame_offset": None,
        "result": "the new stream position after the frame (> 0), or the failure code",
        "buffer": "a writable memoryview of the claimed payload; None when the claim failed",
        "__weakref__": None,
    }

    def __init__(self, publication: Publication, result: int, frame_offset: int,
                 length: int) -> None:
        self._publication = publication
        self._frame_offset = frame_offset
        self.buffer: memoryview | None = None
        if result > 0:
            try:
                self.buffer = publication._claim_view(frame_offset, length)
            except ValueError:
                if not publication.is_closed:
                    raise
                result = codes.CLOSED  # closed since the claim (its client failed): no claim
        self.result = result

    def __bool__(self) -> bool:
        return self.result > 0

    def commit(self) -> None:
        """Publish the claimed frame. Raises ValueError if already committed or aborted, or if
        the driver padded the claim over (it was held open past publication_unblock_timeout,
        its writer descheduled that long: nothing is published, claim again), and
        PublicationError (code CLOSED) if the publication was closed while the claim was open
        (its client closed or failed): the claim was aborted, the message is not published."""
        self._finish(self._publication._commit)

    def abort(self) -> None:
        """Give the claimed space up: readers skip it as padding. Raises as commit() does."""
        self._finish(self._publication._abort)

    def _finish(self, action: Any) -> None:
        if self.result > 0 and self._publication.is_closed:
            raise _closed_under_claim()
        if self.buffer is None:
            raise ValueError(f"no claim to finish ({codes.result_name(self.result)})")
        self.buffer.release()
        self.buffer = None
        try:
            action(self._frame_offset)
        except ValueError:
            if self._publication.is_closed:  # closed meanwhile, by the conductor thread
                raise _closed_under_claim() from None
            raise

    def _is_open(self) -> bool:
        return self.buffer is not None


def _closed_under_claim() -> PublicationError:
    return PublicationError(codes.CLOSED, "the publication was closed while this claim was "
                            "open (its client closed or failed): nothing was published")


class Publication(PublicationCore, Closeable):
    """What both kinds of publication share. Create them through the bus client.

    ``offer(*buffers, reserved_value=0)`` appends one message (several buffers are gathered into
    one message) and returns the new position or a negative code; ``offer_many(messages)``
    appends a batch with one reservation (see its docstring). Messages longer than
    ``max_payload_length`` are fragmented; longer than ``max_message_length`` they go on the
    large-message path (IPC: a shared-memory block the log refers to; in ``offer_many`` such a
    message goes alone, in order) or, on a UDP channel, raise ValueError naming the setting.
    """

    _exclusive = False

    def __init__(
        self,
        log: LogBuffer,
        limit: Position,
        *,
        channel: str = "aeron:ipc",
        registration_id: int = 0,
        on_close: Any = None,
        on_destination: Any = None,
        counters: AtomicBuffer | None = None,
        warm_share: float = WARM_SHARE,
    ) -> None:
        self._blocks: BlockRing | None = None
        #: the share of the bus's free space its block ring may keep warm
        #: (Context.large_message_warm_share)
        self._warm_share = warm_share
        #: held while the ring is swapped or closed, and by a large offer from its check
        #: that the ring is still this one to its commit (large_messages.offer_reference)
        self._ring_lock = threading.Lock()
        self._bind(log, limit, counters)
        self.channel = channel
        self.registration_id = registration_id
        self._on_close = on_close
        self._on_destination = on_destination
        self._claims: weakref.WeakSet[BufferClaim] = weakref.WeakSet()
        #: rings the driver's doorbell (the client sets it): a writer waiting for room in the
        #: block ring has the driver free blocks now rather than at its next timer
        self._wake_driver: Callable[[], None] = _nothing

    def _bind(self, log: LogBuffer, limit: Position, counters: AtomicBuffer | None) -> None:
        d = log.descriptor
        PublicationCore.__init__(
            self, log.buffer, d.term_length, d.initial_term_id, d.mtu, d.session_id,
            d.stream_id, limit.buffer, limit.offset, self._exclusive, counters,
        )
        self.log = log
        # the log's block ring, mapped now (no memory until a writer uses it): a driver that
        # dies may have its files removed by the next one before this client hears of it
        try:
            blocks: BlockRing | None = BlockRing.open(ring_path(log.path), self._warm_share)
        except FileNotFoundError:  # a UDP publication has none
            blocks = None
        with self._ring_lock:
            blocks, self._blocks = self._blocks, blocks
        if blocks is not None:
            blocks.close()

    def _detach(self) -> None:
        """The driver is gone (the client reconnects): claims not yet committed are aborted,
        and offers return NOT_CONNECTED until :meth:`_rebind`. Called by the client only."""
        self._abort_claims()
        self._detach_core()

    def _rebind(self, log: LogBuffer, limit: Position, counters: AtomicBuffer,
                registration_id: int) -> None:
        """Carry on in ``log``, the new driver's publication (a new session), after
        :meth:`_detach`. The old log is not touched again. Called by the client only."""
        self._bind(log, limit, counters)
        self.registration_id = registration_id

    def try_claim(self, length: int, reserved_value: int = 0) -> BufferClaim | LargeClaim:
        """Claim ``length`` bytes to fill in place.

        Up to ``max_payload_length`` the claim is a frame in the log (a :class:`BufferClaim`);
        past it, on an IPC channel, a shared-memory block (a :class:`LargeClaim`, up to
        ``Context.max_large_message_length``) that the log refers to once committed. Either
        is falsy with ``result`` set to the code when the claim failed (back-pressure,
        rotation, not connected, closed). A large claim raises OSError (ENOSPC, naming the
        bytes needed and free) when /dev/shm cannot hold its block (nothing is claimed), and
        ValueError past ``Context.max_large_message_length`` or on a channel without a block
        ring (UDP), as ``offer`` of such a message does.
        """
        if length > self.max_payload_length:
            return LargeClaim(self, length, reserved_value)
        result, frame_offset = self._claim(length, reserved_value)
        claim = BufferClaim(self, result, frame_offset, length)
        if claim:
            self._claims.add(claim)
        return claim

    # publish(*buffers, timeout=1.0, reserved_value=0) is PublicationCore's: one native offer,
    # and only a refused one comes to _publish_refused.

    _default_timeout = DEFAULT_PUBLISH_TIMEOUT

    def _offer_large(self, buffers: tuple[Buffer, ...], reserved_value: int, publish: bool,
                     timeout: float | None) -> int:
        """offer() or publish() of a message longer than ``max_message_length``: called by the
        native core (publication.c) when the message does not fit in the log. It goes into a
        block of the publication's block ring and the log gets a reference frame to it (see
        shmbus/streams/large_messages.py); returns or raises what offer() or publish() do."""
        return offer_large(self, buffers, reserved_value, publish, timeout)

    def _block_ring(self, length: int, claim: bool = False) -> BlockRing:
        with self._ring_lock:
            if self._blocks is None:
                if claim:
                    self._blocks = open_ring(self.log.path, self.channel,
                                             self.max_payload_length, length, "claim",
                                             "max payload (mtu - 32)", self._warm_share)
                else:
                    self._blocks = open_ring(self.log.path, self.channel,
                                             self.max_message_length, length, "message",
                                             "max message length", self._warm_share)
            return self._blocks

    def _publish_refused(self, buffers: tuple[Buffer, ...], result: int, timeout: float | None,
                         reserved_value: int) -> int:
        """publish's retries after its first offer was refused with ``result``: called by the
        native core (publication.c) when that offer returned a negative code. Offers again,
        sleeping while back-pressured, until accepted (the new position) or ``timeout`` has
        passed (PublicationError)."""
        deadline = deadline_after(timeout)
        while True:
            sleep_s = self._sleep_or_raise(result, deadline, timeout)
            if sleep_s:
                self._await_progress(sleep_s)
            result = self.offer(*buffers, reserved_value=reserved_value)
            if result > 0:
                return result

    async def publish_async(self, *buffers: Buffer, timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
                            reserved_value: int = 0) -> int:
        """:meth:`publish`, awaiting back-pressure without blocking the event loop.

        Returns the new position; raises :class:`PublicationError` as ``publish`` does. A
        cancelled await has appended nothing.
        """
        result = self.offer(*buffers, reserved_value=reserved_value)
        deadline = deadline_after(timeout)
        while result <= 0:
            sleep_s = self._sleep_or_raise(result, deadline, timeout)
            if sleep_s:
                await sleep_on(self._await_progress, sleep_s)
            result = self.offer(*buffers, reserved_value=reserved_value)
        return result

    def _sleep_or_raise(self, result: int, deadline: float, timeout: float | None) -> float:
        """Seconds to sleep after an offer refused with ``result`` (0: retry at once); raises
        :class:`PublicationError` once ``deadline`` (monotonic seconds) has passed."""
        sleep_s = self._sleep_time(result, deadline)
        if sleep_s < 0:
            raise PublicationError(result, f"offer not accepted within {timeout} s: "
                                   f"{codes.result_name(result)}")
        return sleep_s

    def _sleep_time(self, result: int, deadline: float) -> float:
        """How long to sleep after a refused offer: -1 when the deadline passed. Readers (and a
        network publication's sender) wake a sleeping publisher when they move; a new
        subscriber does not, so NOT_CONNECTED is looked at again every millisecond."""
        if result in (codes.CLOSED, codes.MAX_POSITION_EXCEEDED):
            raise PublicationError(result)
        if result == codes.ADMIN_ACTION:
            return 0.0
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return -1.0
        slice_s = 0.001 if result == codes.NOT_CONNECTED else 0.1
        return min(remaining, slice_s)

    # -- typed messages (shmbus/codecs/array_messages.py, object_messages.py) -----------------

    def publish_array(self, array: np.ndarray[Any, Any],
                      timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
                      reserved_value: int = 0) -> int:
        """Publish a numpy array with its dtype (structured and datetime too), shape and order
        (C or Fortran; any other layout is sent C-ordered); read it with
        ``Subscription.arrays()``. Any size up to ``Context.max_large_message_length`` on IPC;
        past the log's max message it goes through shared memory with one copy. Returns the
        new position; raises as :meth:`publish` does, ValueError for an object dtype."""
        header, data = array_parts(array)
        return self.publish(header, data, timeout=timeout, reserved_value=reserved_value)

    async def publish_array_async(self, array: np.ndarray[Any, Any],
                                  timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
                                  reserved_value: int = 0) -> int:
        """:meth:`publish_array`, awaiting back-pressure without blocking the event loop."""
        header, data = array_parts(array)
        return await self.publish_async(header, data, timeout=timeout,
                                        reserved_value=reserved_value)

    def claim_array(self, shape: int | tuple[int, ...], dtype: Any, order: str = "C",
                    timeout: float | None = 0) -> ArrayClaim:
        """Claim room for an array to fill in place (no copy on publish): ``with
        pub.claim_array((1080, 1920, 3), np.uint8, timeout=1.0) as claim:
        render(claim.array)`` publishes it on exit (``Subscription.arrays()`` reads it).
        ``timeout``: seconds to keep trying while back-pressured or not connected (0: one
        try, as :meth:`try_claim`; None: until it succeeds). Falsy, with ``result`` the code,
        when the claim failed; entering a failed claim raises."""
        return ArrayClaim(self, shape, dtype, order, timeout)

    def publish_object(self, obj: Any, timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
                       reserved_value: int = 0) -> int:
        """Publish a Python object with pickle protocol 5, its large buffers (numpy arrays
        inside it) out of band, written once; read it with ``Subscription.objects()``, which
        unpickles it: that runs code of the writer's choosing, so read only from writers you
        trust. Returns the new position; raises as :meth:`publish` does."""
        parts = object_parts(obj)
        if len(parts) <= _MAX_GATHER and not _longer_than(parts, self.max_message_length):
            return self.publish(*parts, timeout=timeout, reserved_value=reserved_value)
        return offer_large(self, tuple(parts), reserved_value, True, timeout)

    async def publish_object_async(self, obj: Any, timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
                                   reserved_value: int = 0) -> int:
        """:meth:`publish_object`, awaiting back-pressure without blocking the event loop."""
        parts = object_parts(obj)
        if len(parts) > _MAX_GATHER:
            parts = [b"".join(parts)]
        return await self.publish_async(*parts, timeout=timeout, reserved_value=reserved_value)

    def publish_table(self, table: pa.Table | pa.RecordBatch,
                      timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
                      reserved_value: int = 0) -> int:
        """Publish a pyarrow Table or RecordBatch as one message in Arrow's IPC stream format;
        read it with ``Subscription.tables()``. Past the log's max message the stream is
        written in place into a shared-memory block (one copy, into shared memory). Returns
        the new position; raises as :meth:`publish` does, TypeError for another type,
        ImportError naming pyarrow when it is not installed."""
        length = stream_length(table)
        if length <= self.max_message_length:
            return self.publish(serialize(table), timeout=timeout, reserved_value=reserved_value)
        self._block_ring(length)  # (a channel without one: the ValueError naming its limit)
        claim = LargeClaim(self, length, reserved_value, deadline_after(timeout))
        if not claim:
            raise PublicationError(claim.result, f"no block for a table of {length} bytes "
                                   f"within {timeout} s: {codes.result_name(claim.result)}")
        with claim:
            assert claim.buffer is not None  # (a claim that succeeded has one)
            write_stream(claim.buffer, table, length)
        return claim.result

    async def publish_table_async(self, table: pa.Table | pa.RecordBatch,
                                  timeout: float | None = DEFAULT_PUBLISH_TIMEOUT,
                                  reserved_value: int = 0) -> int:
        """:meth:`publish_table`, awaiting back-pressure without blocking the event loop."""
        length = stream_length(table)
        if length <= self.max_message_length:
            return await self.publish_async(serialize(table), timeout=timeout,
                                            reserved_value=reserved_value)
        self._block_ring(length)
        deadline = deadline_after(timeout)
        while True:
            claim = LargeClaim(self, length, reserved_value)
            if claim:
                break
            if claim.result == codes.CLOSED or time.monotonic() >= deadline:
                raise PublicationError(claim.result, f"no block for a table of {length} bytes "
                                       f"within {timeout} s: {codes.result_name(claim.result)}")
            await asyncio.sleep(_CLAIM_WAIT_S)
        with claim:
            assert claim.buffer is not None  # (a claim that succeeded has one)
            write_stream(claim.buffer, table, length)
        return claim.result

    def publish_many(self, messages: Sequence[Buffer] | np.ndarray[Any, Any],
                     timeout: float | None = DEFAULT_PUBLISH_TIMEOUT) -> int:
        """``offer_many`` until every message is appended, in order; returns the count.

        Messages past ``max_message_length`` may be mixed in: each goes alone on the
        large-message path. Raises :class:`PublicationError` after ``timeout`` seconds without
        progress, ValueError naming the message (and how many before it were appended) for one
        the channel cannot take (past ``Context.max_large_message_length``; past the max
        message length of a UDP channel).
        """
        total = len(messages)
        first = self._offer_many_at(messages, 0, total) if total else 0
        if first == total:  # accepted at once: one native call
            return total
        done = max(first, 0)
        deadline = deadline_after(timeout)
        while done < total:
            result = self._offer_many_at(messages, done, total)
            if result > 0:
                done += result
                deadline = deadline_after(timeout)
                continue
            sleep_s = self._sleep_time(result, deadline)
            if sleep_s < 0:
                raise PublicationError(result, f"{total - done} of {total} messages not "
                                       f"accepted within {timeout} s: "
                                       f"{codes.result_name(result)}")
            if sleep_s:
                self._await_progress(sleep_s)
        return total

    def _offer_many_at(self, messages: Sequence[Buffer] | np.ndarray[Any, Any], done: int,
                       total: int) -> int:
        try:
            return self.offer_many(messages[done:] if done else messages)
        except ValueError as e:
            message: Any = messages[done]
            raise ValueError(f"publish_many: message {done} of {total} "
                             f"({memoryview(message).nbytes} bytes; the {done} before it "
                             f"were appended): {e}") from e

    def add_destination(self, destination: str) -> None:
        """Send to ``destination`` (``aeron:udp?endpoint=host:port``) too: for publications on
        a ``control-mode=manual`` channel (multi-destination-cast). Raises RegistrationError
        when the driver refuses (not a manual MDC publication, a bad URI)."""
        self._change_destination(destination, True)

    def remove_destination(self, destination: str) -> None:
        """Stop sending to ``destination`` (see :meth:`add_destination`)."""
        self._change_destination(destination, False)

    def _change_destination(self, destination: str, add: bool) -> None:
        if self.is_closed:
            raise PublicationError(codes.CLOSED, "the publication is closed")
        if self._on_destination is None:
            raise ValueError("this publication was not made by a bus client")
        self._on_destination(self, destination, add)

    @property
    def available_window(self) -> int:
        """Bytes that can be offered before back-pressure."""
        return self.position_limit - self.position

    def close(self) -> None:
        """Close: later offers return CLOSED; claims not yet committed are aborted (their
        buffers released), and the log may be unmapped. Idempotent."""
        if self.is_closed:
            return
        self._abort_claims()
        self._close_core()
        with self._ring_lock:
            blocks, self._blocks = self._blocks, None
        if blocks is not None:
            blocks.close()
        on_close, self._on_close, self._on_destination = self._on_close, None, None
        if on_close is not None:  # (the client's methods: dropped, so no cycle keeps it alive)
            on_close(self)

    def _abort_claims(self) -> None:
        for claim in list(self._claims):
            if claim.buffer is not None:
                claim.abort()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(channel={self.channel!r}, stream_id={self.stream_id}, "
                f"session_id={self.session_id}, position={self.position})")


def _nothing() -> None:
    pass


#: the most buffers one offer gathers (the native core's limit)
_MAX_GATHER = 16


def _longer_than(parts: list[Any], limit: int) -> bool:
    return sum(memoryview(part).nbytes for part in parts) > limit


class ArrayClaim(ClaimScope):
    """Room for one array claimed with :meth:`Publication.claim_array`: fill ``array`` in
    place, then ``commit()`` (or leave the ``with``); ``abort()`` gives it up. ``array`` must
    not be used after either."""

    def __init__(self, publication: Publication, shape: int | tuple[int, ...], dtype: Any,
                 order: str, timeout: float | None = 0) -> None:
        import numpy as np

        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if order not in ("C", "F"):
            raise ValueError(f"order must be 'C' or 'F', not {order!r}")
        header = array_header(shape, dtype, order == "F" and len(shape) > 1)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self._claim = _claim_within(publication, len(header) + nbytes, timeout)
        self.result = self._claim.result
        self.array: np.ndarray[Any, Any] | None = None
        if self._claim:
            room = self._claim.buffer
            assert room is not None
            room[:len(header)] = header
            self.array = np.ndarray(shape, dtype, buffer=_second_view(self._claim),
                                    offset=len(header), order="F" if order == "F" else "C")

    def __bool__(self) -> bool:
        return bool(self._claim)

    def commit(self) -> None:
        """Publish the array (see :meth:`BufferClaim.commit`, :class:`LargeClaim`)."""
        self.array = None
        self._claim.commit()
        self.result = self._claim.result

    def abort(self) -> None:
        """Give the claim up."""
        self.array = None
        self._claim.abort()

    def _is_open(self) -> bool:
        return self._claim._is_open()


#: the refusals a claim with a timeout waits out
_TRANSIENT = (codes.BACK_PRESSURED, codes.NOT_CONNECTED, codes.ADMIN_ACTION)


def _claim_within(publication: Publication, length: int,
                  timeout: float | None) -> BufferClaim | LargeClaim:
    """try_claim, again every half millisecond while refused for a passing reason, until
    ``timeout`` seconds have passed (0: once; None: forever)."""
    deadline = deadline_after(timeout)
    claim = publication.try_claim(length)
    while (not claim and claim.result in _TRANSIENT and time.monotonic() < deadline):
        time.sleep(0.0005)
        claim = publication.try_claim(length)
    return claim


def _second_view(claim: BufferClaim | LargeClaim) -> memoryview:
    """A writable view of the claim's room that is not ``claim.buffer`` (which commit
    releases: an array over it would keep it exported)."""
    if isinstance(claim, LargeClaim):
        return claim._ring.payload(claim._start, claim._length)
    return claim._publication._claim_view(claim._frame_offset, len(claim.buffer or b""))


class ExclusivePublication(Publication):
    """A publication with a single writer: not safe to share between threads or processes."""

    _exclusive = True


class ConcurrentPublication(Publication):
    """A publication any number of threads and processes may offer to at once."""

    _exclusive = False
