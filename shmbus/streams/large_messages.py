"""Messages longer than the log takes: written into a shared-memory block, referred to from the
log (the block ring, ``shmbus/shm/block_ring.py``), in stream order with the other messages.

This module is the writer's side, in the client process: ``offer``/``publish`` of a message
longer than ``max_message_length`` come here from the native core (only such messages pay a
Python call); ``try_claim`` past the max payload returns a :class:`LargeClaim` to fill in
place. It works on its publication through :class:`BlockPublisher`, the members it needs.
The reader's side is the image's (``Image._large_payload`` and :class:`MessageView`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from shmbus.settings import codes
from shmbus.settings.errors import PublicationError
from shmbus.settings.timeouts import deadline_after
from shmbus.shm.block_ring import (
    REFERENCE_FLAGS,
    REFERENCE_LENGTH,
    BlockRing,
    BlockRingFullError,
    encode_reference,
    ring_path,
)
from shmbus.shm.log_buffer import LogBuffer
from shmbus.streams.context_managers import ClaimScope

_FLAGS_OFFSET = 5


class BlockPublisher(Protocol):
    """What the large-message path uses of its publication (a ``Publication``): its log and
    ring, the native core's claim and commit, and its waits."""

    log: LogBuffer
    _blocks: BlockRing | None
    _ring_lock: threading.Lock
    _default_timeout: float
    _wake_driver: Callable[[], None]

    @property
    def is_closed(self) -> bool: ...
    @property
    def is_connected(self) -> bool: ...
    def _block_ring(self, length: int, claim: bool = False) -> BlockRing: ...
    def _claim(self, length: int, reserved_value: int = 0, /) -> tuple[int, int]: ...
    def _claim_view(self, frame_offset: int, length: int, /) -> memoryview: ...
    def _commit(self, frame_offset: int, /) -> None: ...
    def _sleep_or_raise(self, result: int, deadline: float, timeout: float | None
                        ) -> float: ...
    def _await_progress(self, timeout: float, /) -> None: ...

#: the longest a writer waiting for room in the ring sleeps between looks: the driver frees
#: blocks on its duty cycle (the writer rings it first) and wakes it once it did
_ROOM_WAIT_S = 0.0005


def open_ring(log_path: Any, channel: str, limit: int, length: int, what: str,
              limit_name: str, warm_share: float) -> BlockRing:
    """The block ring beside a publication's log; ValueError for a log without one (a UDP
    channel: its max message length is its own; a log no driver made)."""
    try:
        return BlockRing.open(ring_path(log_path), warm_share)
    except FileNotFoundError:
        raise ValueError(
            f"{what} of {length} bytes exceeds the {limit_name} of {limit} bytes of "
            f"{channel!r}, which has no block ring for larger ones (max message length: term "
            f"length / 8, at most 16 MiB, for a UDP channel: raise the channel's term-length "
            f"or Context.udp_term_length; larger messages cross hosts in pieces, see the "
            f"README's Large messages)") from None


def _buffers_length(buffers: tuple[Any, ...]) -> tuple[list[memoryview], int]:
    views = []
    for buffer in buffers:
        view = memoryview(buffer)
        if not view.c_contiguous:
            raise ValueError("a message buffer must be C-contiguous")
        views.append(view.cast("B") if view.ndim != 1 or view.format != "B" else view)
    return views, sum(v.nbytes for v in views)


#: from this many bytes on a part of a message is copied by numpy, with the GIL released
_GIL_FREE_COPY = 1 << 16


def _copy(target: memoryview, at: int, view: memoryview) -> None:
    """Copy ``view`` into ``target`` at ``at``; a long one with the GIL released (numpy's
    contiguous copy), so other threads of the writer run meanwhile."""
    n = view.nbytes
    if n < _GIL_FREE_COPY:
        target[at:at + n] = view
    else:
        np.copyto(np.frombuffer(target, np.uint8, n, at), np.frombuffer(view, np.uint8))


def offer_large(pub: BlockPublisher, buffers: tuple[Any, ...], reserved_value: int,
                publish: bool, timeout: float | None) -> int:
    """offer() (``publish`` False: once, a code when refused) or publish() (retries until
    ``timeout``, raises PublicationError) of a message longer than the log's max message."""
    views, length = _buffers_length(buffers)
    if pub._blocks is None and not os.path.exists(pub.log.path):
        # the log's files are gone: its driver died and the next one removed them before this
        # client mapped the ring; the client hears of it soon
        if publish:
            raise PublicationError(codes.NOT_CONNECTED, "the publication's block ring is "
                                   "gone: its driver died")
        return codes.NOT_CONNECTED
    ring = pub._block_ring(length)
    if length > ring.max_message_length:
        raise ValueError(f"message of {length} bytes exceeds the max large message length of "
                         f"{ring.max_message_length} bytes (Context.max_large_message_length)")
    if pub.is_closed:
        if publish:
            raise PublicationError(codes.CLOSED)
        return codes.CLOSED
    deadline = None
    if publish:
        deadline = deadline_after(timeout)
    if not ring.enter():  # closed meanwhile: the client is rebinding or closing the publication
        result = codes.CLOSED if pub.is_closed else codes.NOT_CONNECTED
    else:
        try:
            # (every byte is copied in next: its pages mapped in one call, not a fault per
            # page; a LargeClaim is not, as its writer may fill only part of it)
            result = reserve(pub, ring, length, deadline, populate=True)
            if result >= 0:
                result = _fill_and_offer(pub, ring, result, views, length, reserved_value,
                                         deadline, timeout)
        finally:
            ring.leave()
    if result < 0 and publish:
        raise PublicationError(result, f"offer not accepted within {timeout} s: "
                               f"{codes.result_name(result)}")
    return result


def _fill_and_offer(pub: BlockPublisher, ring: BlockRing, start: int, views: list[memoryview],
                    length: int, reserved_value: int, deadline: float | None,
                    timeout: float | None) -> int:
    try:
        target = ring.payload(start, length)
        at = 0
        for view in views:
            _copy(target, at, view)
            at += view.nbytes
        target.release()
        return offer_reference(pub, ring, start, length, reserved_value, deadline, timeout)
    except BaseException:
        ring.abandon(start)
        raise


def reserve(pub: BlockPublisher, ring: BlockRing, length: int, deadline: float | None,
            populate: bool = False) -> int:
    """A block's ring position, or a negative code: NOT_CONNECTED with no subscriber (nothing
    is copied for nobody), BACK_PRESSURED while the ring is full (until ``deadline``, monotonic
    seconds; None: one try). OSError when /dev/shm cannot hold it."""
    pid = os.getpid()
    while True:
        if ring.closed:  # the publication was rebound to a new log (and ring) or closed
            return codes.CLOSED if pub.is_closed else codes.NOT_CONNECTED
        seen = ring.room_seen()  # (before looking: a free after this wakes the wait below)
        if not pub.is_connected:
            result = codes.NOT_CONNECTED
        else:
            try:
                return ring.reserve(length, pid, populate)
            except BlockRingFullError:
                result = codes.BACK_PRESSURED
                pub._wake_driver()
        if deadline is None:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return result
        if result == codes.NOT_CONNECTED:
            time.sleep(min(0.001, remaining))
        else:
            ring.wait_for_room(seen, min(_ROOM_WAIT_S, remaining))


def offer_reference(pub: BlockPublisher, ring: BlockRing, start: int, length: int,
                    reserved_value: int, deadline: float | None,
                    timeout: float | None) -> int:
    """Append the frame that refers to block ``start`` and commit the block; the new position,
    or (``deadline`` None) the code of a refused offer, the block abandoned."""
    reference = encode_reference(start, length)
    while True:
        with pub._ring_lock:  # the log the frame goes into is the ring's own
            if pub._blocks is not ring:
                result = codes.CLOSED if pub.is_closed else codes.NOT_CONNECTED
                ring.abandon(start)  # (in a ring nobody writes to any more)
                return result
            result, frame_offset = pub._claim(REFERENCE_LENGTH, reserved_value)
            if result > 0:
                view = pub._claim_view(frame_offset, REFERENCE_LENGTH)
                view[:] = reference
                view.release()
                pub.log.buffer.put_bytes(frame_offset + _FLAGS_OFFSET,
                                         bytes([REFERENCE_FLAGS]))
                ring.bind(start, result)  # (before the frame is visible: see BlockRing.view)
                try:
                    pub._commit(frame_offset)
                except ValueError:
                    # the claim stayed open past publication_unblock_timeout (this writer was
                    # descheduled) and the driver padded it over: the reference never reached
                    # the log, so append it again
                    if pub.is_closed:
                        ring.abandon(start)
                        return codes.CLOSED
                    continue
                ring.commit(start, result)
                return result
        if deadline is None:
            ring.abandon(start)
            return result
        sleep_s = pub._sleep_or_raise(result, deadline, timeout)
        if sleep_s:
            pub._await_progress(sleep_s)


class LargeClaim(ClaimScope):
    """A block claimed with ``try_claim`` past the log's max payload, filled in place.

    Truthy when the claim succeeded; then ``buffer`` is a writable memoryview of exactly the
    claimed length in shared memory, and ``commit()`` appends the frame that refers to it (it
    waits up to the publication's default publish timeout for room in the log, then raises
    :class:`PublicationError` and frees the block), or ``abort()`` frees it. A context manager
    as :class:`BufferClaim` is. ``result``: the failure code, the new stream position once
    committed, 1 before.
    """

    def __init__(self, publication: BlockPublisher, length: int, reserved_value: int,
                 deadline: float | None = None) -> None:
        self._publication = publication
        self._length = length
        self._reserved_value = reserved_value
        self.buffer: memoryview | None = None
        self._ring = ring = publication._block_ring(length, claim=True)
        if not ring.enter():  # closed meanwhile (the publication rebound or closed)
            self.result = codes.CLOSED if publication.is_closed else codes.NOT_CONNECTED
            return
        # (deadline, monotonic seconds: keep trying while back-pressured or not connected)
        self._start = reserve(publication, ring, length, deadline)
        self.result = self._start if self._start < 0 else 1
        if self._start >= 0:
            self.buffer = ring.payload(self._start, length)
        else:
            ring.leave()

    def __bool__(self) -> bool:
        return self.result > 0

    def commit(self) -> None:
        """Publish the claimed block (see the class docstring)."""
        buffer = self._take_buffer()
        buffer.release()
        pub = self._publication
        timeout = pub._default_timeout
        try:
            self.result = offer_reference(pub, self._ring, self._start, self._length,
                                          self._reserved_value, time.monotonic() + timeout,
                                          timeout)
        except BaseException:
            self._ring.abandon(self._start)
            raise
        finally:
            self._ring.leave()
        if self.result < 0:  # the publication was rebound to a new log, or closed
            raise PublicationError(self.result, "the claimed block was dropped: its "
                                   "publication was closed or moved to a new log")

    def abort(self) -> None:
        """Give the block up, unpublished."""
        self._take_buffer().release()
        try:
            self._ring.abandon(self._start)
        finally:
            self._ring.leave()

    def _take_buffer(self) -> memoryview:
        if self.buffer is None:
            raise ValueError(f"no claim to finish ({codes.result_name(self.result)})")
        buffer, self.buffer = self.buffer, None
        return buffer

    def _is_open(self) -> bool:
        return self.buffer is not None
