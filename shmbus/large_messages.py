"""Messages longer than the log takes: written into a shared-memory block, referred to from the
log (the block ring, ``shmbus/shm/block_ring.py``), in stream order with the other messages.

Writers: ``offer``/``publish`` of a message longer than ``max_message_length`` come here from
the native core (only such messages pay a Python call); ``try_claim`` past the max payload
returns a :class:`LargeClaim` to fill in place. Readers: the native core hands a reference
frame to :meth:`ReferenceResolver` methods of the image (``poll`` handlers get a read-only view
of the block, ``messages()`` a bytes copy); :class:`MessageView` is a view the reader keeps, and
holding it holds that image's position before the message, so the block is not reused.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from shmbus import codes
from shmbus.errors import PublicationError
from shmbus.shm.block_ring import (
    REFERENCE_LENGTH,
    BlockRing,
    BlockRingFullError,
    encode_reference,
    ring_path,
)

if TYPE_CHECKING:
    from shmbus.image import Image
    from shmbus.publication import Publication
    from shmbus.subscription import Subscription

#: the frame flags of a reference frame: a whole message (B, E) that refers to a block. On a
#: fragment (not both B and E) the large flag means nothing and is ignored, as unknown flags are
LARGE_FLAG = 0x01
REFERENCE_FLAGS = 0x80 | 0x40 | LARGE_FLAG
_FLAGS_OFFSET = 5

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


def offer_large(pub: Publication, buffers: tuple[Any, ...], reserved_value: int,
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
        timeout = pub._default_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
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


def _fill_and_offer(pub: Publication, ring: BlockRing, start: int, views: list[memoryview],
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


def reserve(pub: Publication, ring: BlockRing, length: int, deadline: float | None,
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


def offer_reference(pub: Publication, ring: BlockRing, start: int, length: int,
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
        sleep_s = pub._sleep_or_raise(result, deadline, timeout or 0.0)
        if sleep_s:
            pub._await_progress(sleep_s)


class LargeClaim:
    """A block claimed with ``try_claim`` past the log's max payload, filled in place.

    Truthy when the claim succeeded; then ``buffer`` is a writable memoryview of exactly the
    claimed length in shared memory, and ``commit()`` appends the frame that refers to it (it
    waits up to the publication's default publish timeout for room in the log, then raises
    :class:`PublicationError` and frees the block), or ``abort()`` frees it. A context manager
    as :class:`BufferClaim` is. ``result``: the failure code, the new stream position once
    committed, 1 before.
    """

    def __init__(self, publication: Publication, length: int, reserved_value: int,
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

    def __enter__(self) -> LargeClaim:
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


# -- readers ------------------------------------------------------------------------------------

class MessageView:
    """One message a reader holds: ``buffer`` is a read-only memoryview of it.

    For a large message it is the shared-memory block itself (``zero_copy`` True): holding the
    view holds the image's position before the message, so the writer cannot reuse the block,
    and readers after it on that image wait. :meth:`release` (or leaving the ``with``) lets the
    position move past it; the buffer must not be used after. A small message is a copy
    (``zero_copy`` False) and holds nothing.
    """

    __slots__ = {
        "buffer": "the message, a read-only memoryview",
        "session_id": "the publishing session",
        "position": "the stream position just after the message",
        "reserved_value": "the reserved value of its (last) frame",
        "zero_copy": "True for a view of shared memory that holds the position",
        "_image": None,
    }

    def __init__(self, buffer: memoryview, session_id: int, position: int, reserved_value: int,
                 image: Image | None) -> None:
        self.buffer = buffer
        self.session_id = session_id
        self.position = position
        self.reserved_value = reserved_value
        self.zero_copy = image is not None
        self._image = image

    def release(self) -> None:
        """Done with the message: its image's position moves past it. Idempotent."""
        image, self._image = self._image, None
        try:
            self.buffer.release()
        except BufferError:
            pass  # an array over it lives on: it may see the block reused from now on
        if image is not None:
            image._held = False
            if not image.is_closed and image.position < self.position:
                image.position = self.position
                # the driver frees the block on its next duty cycle; woken now only when a
                # writer waits for room (a wake can cost a time slice on a busy machine)
                if image._ring().writer_waiting():
                    image._wake_driver()

    def __enter__(self) -> MessageView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same(view: MessageView) -> MessageView:
    return view


def take_view(sub: Subscription) -> MessageView | None:
    """The next whole message of any image not holding a view, or None: large ones as views of
    their block (held), small ones copied. Images are visited round-robin."""
    images = sub.images
    n = len(images)
    if not n:
        return None
    start = sub._round_robin = (sub._round_robin + 1) % n
    for i in range(n):
        image = images[(start + i) % n]
        if not image._held:
            view = _take_from(image)
            if view is not None:
                return view
    return None


def _take_from(image: Image) -> MessageView | None:
    found = image._view_found
    assembler = image._view_assembler
    if assembler is None:
        from shmbus.fragment_assembler import FragmentAssembler

        def whole(buffer: memoryview, header: Any) -> None:
            found.append((bytes(buffer), header.session_id, header.position,
                          header.reserved_value))
        assembler = image._view_assembler = FragmentAssembler(whole)

    def peek(buffer: memoryview, header: Any) -> int:
        if header.flags & REFERENCE_FLAGS == REFERENCE_FLAGS:  # (not on a fragment: ignored)
            found.append((None, header.session_id, header.position, header.reserved_value))
            return codes.Action.ABORT
        assembler(buffer, header)
        return codes.Action.CONTINUE

    while not found and image.controlled_poll(peek, 1):
        pass
    if not found:
        return None
    data, session_id, position, reserved = found.pop(0)
    if data is not None:
        return MessageView(memoryview(data), session_id, position, reserved, None)
    view = image._large_view(image._last_reference)
    if view is None:  # freed since the peek: this reader was dropped (see Image._large_payload)
        return None
    image._held = True
    return MessageView(view, session_id, position, reserved, image)


def views(sub: Subscription, timeout: float | None,
          transform: Callable[[MessageView], Any] = _same, hold: bool = True) -> Iterator[Any]:
    """Messages as :class:`MessageView` (or what ``transform`` makes of each); each is released
    when the next is asked for (or when the loop ends), or with ``hold`` False (``transform``
    copies what it keeps) as soon as ``transform`` returns: the writer may then reuse the
    block while the caller works on the copy. Ends after ``timeout`` seconds with none (None:
    when closed)."""
    held: MessageView | None = None
    deadline = None
    try:
        while not sub.is_closed:
            if held is not None:
                held.release()
                held = None
            view = take_view(sub)
            if view is not None:
                deadline = None
                held = view
                item = transform(view)
                if not hold:
                    held = None
                    view.release()
                yield item
                continue
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            remaining = 0.05 if deadline is None else min(deadline - time.monotonic(), 0.05)
            if remaining <= 0:
                return
            if _any_held(sub):  # data waits behind a held view: wait() would not sleep
                time.sleep(min(remaining, _HELD_WAIT_S))
            else:
                sub.wait(remaining)
    finally:
        if held is not None:
            held.release()


async def views_async(sub: Subscription, timeout: float | None,
                      transform: Callable[[MessageView], Any] = _same,
                      hold: bool = True) -> AsyncIterator[Any]:
    """:func:`views`, awaiting new messages without blocking the event loop."""
    held: MessageView | None = None
    deadline = None
    try:
        while not sub.is_closed:
            if held is not None:
                held.release()
                held = None
            view = take_view(sub)
            if view is not None:
                deadline = None
                held = view
                item = transform(view)
                if not hold:
                    held = None
                    view.release()
                yield item
                continue
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            if _any_held(sub):
                if deadline is not None and time.monotonic() >= deadline:
                    return
                await asyncio.sleep(_HELD_WAIT_S)
            elif not await sub._readable(deadline):
                return
    finally:
        if held is not None:
            held.release()


#: how long a reader sleeps between looks while every message waits behind a held view
_HELD_WAIT_S = 0.001


def _any_held(sub: Subscription) -> bool:
    return any(image._held for image in sub.images)
