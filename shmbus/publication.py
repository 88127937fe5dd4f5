"""Publications: append messages to a log buffer (seed 003).

:class:`ExclusivePublication` has one writer (one thread of one process) and is the fastest.
:class:`ConcurrentPublication` may be shared by threads and by several processes that map the
same log: space is claimed with an atomic fetch-add on the term tail, so messages from
different writers never interleave. Both return Aeron's codes from ``offer`` (see
:mod:`shmbus.codes`); the append itself runs in the native core.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shmbus import codes
from shmbus.errors import PublicationError
from shmbus.shm._native import AtomicBuffer, PublicationCore
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position

if TYPE_CHECKING:
    import numpy as np

    from shmbus.shm._native import Buffer  # a type of the stub only: any buffer-protocol object


class BufferClaim:
    """Space claimed in the log with :meth:`Publication.try_claim`, written in place.

    Truthy when the claim succeeded; then ``buffer`` is a writable memoryview of exactly the
    claimed length, and ``commit()`` publishes the frame or ``abort()`` turns it into padding.
    Used as a context manager it commits on a normal exit and aborts on an exception; entering
    a failed claim raises :class:`PublicationError`. ``result`` is the new stream position
    after the frame, or the negative code when the claim failed.
    """

    __slots__ = ("_publication", "_frame_offset", "result", "buffer", "__weakref__")

    def __init__(self, publication: Publication, result: int, frame_offset: int,
                 length: int) -> None:
        self._publication = publication
        self._frame_offset = frame_offset
        self.result = result
        self.buffer: memoryview | None = (
            publication._claim_view(frame_offset, length) if result > 0 else None
        )

    def __bool__(self) -> bool:
        return self.result > 0

    def commit(self) -> None:
        """Publish the claimed frame. Raises ValueError if already committed or aborted."""
        self._finish(self._publication._commit)

    def abort(self) -> None:
        """Give the claimed space up: readers skip it as padding."""
        self._finish(self._publication._abort)

    def _finish(self, action: Any) -> None:
        if self.buffer is None:
            raise ValueError(f"no claim to finish ({codes.result_name(self.result)})")
        self.buffer.release()
        self.buffer = None
        action(self._frame_offset)

    def __enter__(self) -> BufferClaim:
        if self.result <= 0:
            raise PublicationError(self.result)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.buffer is None:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class Publication(PublicationCore):
    """What both kinds of publication share. Create them through the bus client.

    ``offer(*buffers, reserved_value=0)`` appends one message (several buffers are gathered into
    one message) and returns the new position or a negative code; ``offer_many(messages)``
    appends a batch with one reservation (see its docstring). Messages longer than
    ``max_payload_length`` are fragmented; longer than ``max_message_length`` raise ValueError.
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
    ) -> None:
        d = log.descriptor
        super().__init__(
            log.buffer, d.term_length, d.initial_term_id, d.mtu, d.session_id, d.stream_id,
            limit.buffer, limit.offset, self._exclusive, counters,
        )
        self.log = log
        self.channel = channel
        self.registration_id = registration_id
        self._on_close = on_close
        self._on_destination = on_destination
        self._claims: weakref.WeakSet[BufferClaim] = weakref.WeakSet()

    def try_claim(self, length: int, reserved_value: int = 0) -> BufferClaim:
        """Claim ``length`` bytes (at most ``max_payload_length``) to fill in place.

        Returns a :class:`BufferClaim`, falsy with ``result`` set to the code when the claim
        failed (back-pressure, rotation, not connected, closed).
        """
        result, frame_offset = self._claim(length, reserved_value)
        claim = BufferClaim(self, result, frame_offset, length)
        if claim:
            self._claims.add(claim)
        return claim

    def publish(self, *buffers: Buffer, timeout: float = 1.0, reserved_value: int = 0) -> int:
        """Offer until it succeeds, sleeping while back-pressured; returns the new position.

        A back-pressured publisher sleeps (no CPU) until a subscriber moves, woken by it.
        Raises :class:`PublicationError` with the last code after ``timeout`` seconds, or at
        once when the publication is closed or its position space is exhausted.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.offer(*buffers, reserved_value=reserved_value)
            if result > 0:
                return result
            if result in (codes.CLOSED, codes.MAX_POSITION_EXCEEDED):
                raise PublicationError(result)
            if result != codes.ADMIN_ACTION:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PublicationError(
                        result, f"offer not accepted within {timeout} s: "
                        f"{codes.result_name(result)}")
                self._wait(result, remaining)

    def _wait(self, result: int, remaining: float) -> None:
        """Sleep until the limit may have moved: woken by readers (IPC), else in 1 ms slices
        (a network sender's position and a new subscriber are not signalled)."""
        self._await_progress(min(remaining, 0.001 if result == codes.NOT_CONNECTED or
                                 not self.channel.startswith("aeron:ipc") else 0.1))

    def publish_many(self, messages: Sequence[Buffer] | np.ndarray[Any, Any],
                     timeout: float = 1.0) -> int:
        """``offer_many`` until every message is appended; returns the count.

        Raises :class:`PublicationError` after ``timeout`` seconds without progress.
        """
        total = len(messages)
        done = 0
        deadline = time.monotonic() + timeout
        while done < total:
            result = self.offer_many(messages[done:] if done else messages)
            if result > 0:
                done += result
                deadline = time.monotonic() + timeout
                continue
            if result in (codes.CLOSED, codes.MAX_POSITION_EXCEEDED):
                raise PublicationError(result)
            if result != codes.ADMIN_ACTION:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PublicationError(result, f"{total - done} of {total} messages not "
                                           f"accepted within {timeout} s: "
                                           f"{codes.result_name(result)}")
                self._wait(result, remaining)
        return total

    def add_destination(self, destination: str) -> None:
        """Send to ``destination`` (``aeron:udp?endpoint=host:port``) too: for publications on
        a ``control-mode=manual`` channel (multi-destination-cast). Raises RegistrationError
        when the driver refuses (not a manual MDC publication, a bad URI)."""
        self._change_destination(destination, True)

    def remove_destination(self, destination: str) -> None:
        """Stop sending to ``destination`` (see :meth:`add_destination`)."""
        self._change_destination(destination, False)

    def _change_destination(self, destination: str, add: bool) -> None:
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
        for claim in list(self._claims):
            if claim.buffer is not None:
                claim.abort()
        self._close_core()
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(channel={self.channel!r}, stream_id={self.stream_id}, "
                f"session_id={self.session_id}, position={self.position})")


class ExclusivePublication(Publication):
    """A publication with a single writer: not safe to share between threads or processes."""

    _exclusive = True


class ConcurrentPublication(Publication):
    """A publication any number of threads and processes may offer to at once."""

    _exclusive = False
