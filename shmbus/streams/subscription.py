"""Subscriptions: the images of every session publishing on one channel and stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np

from shmbus.codecs.array_messages import check_out, copy_array_into, decode_array
from shmbus.codecs.object_messages import decode_object
from shmbus.codecs.source_trust import refusal, unkeyed_network
from shmbus.codecs.table_messages import decode_table
from shmbus.settings.timeouts import deadline_after
from shmbus.shm._native import AtomicBuffer, SubscriptionCore
from shmbus.streams.async_waits import ReadinessWatcher
from shmbus.streams.context_managers import Closeable
from shmbus.streams.image import FragmentBatch, Image, MessageView

ImageHandler = Callable[[Image], Any]

#: how long a reader sleeps between looks while every message waits behind a held view
_HELD_WAIT_S = 0.001


def _same(view: MessageView) -> MessageView:
    return view


class _ViewsLoop:
    """The state of one views loop over ``subscription``: the view it holds for its caller
    (released when the next message is taken, or by :meth:`release` when the loop ends) and
    the ``timeout`` that runs while no message comes."""

    __slots__ = ("_subscription", "_timeout", "_transform", "_hold", "_view", "deadline")

    def __init__(self, subscription: Subscription, timeout: float | None,
                 transform: Callable[[MessageView], Any], hold: bool) -> None:
        self._subscription = subscription
        self._timeout = timeout
        self._transform = transform
        self._hold = hold
        self._view: MessageView | None = None
        #: monotonic seconds at which the loop ends without a message (None: no limit yet)
        self.deadline: float | None = None

    def ready_items(self) -> Iterator[Any]:
        """What ``transform`` makes of each message ready now. With ``hold`` False each view
        is released as soon as ``transform`` returns; otherwise it is held until the next is
        taken. Finding none starts the deadline; taking one clears it."""
        subscription = self._subscription
        while not subscription.is_closed:
            self.release()
            view = subscription.take_view()
            if view is None:
                if self.deadline is None and self._timeout is not None:
                    self.deadline = time.monotonic() + self._timeout
                return
            self.deadline = None
            self._view = view
            item = self._transform(view)
            if not self._hold:
                self.release()
            yield item

    def release(self) -> None:
        """Release the held view, if any."""
        view, self._view = self._view, None
        if view is not None:
            view.release()


class Subscription(SubscriptionCore, Closeable):
    """Reads a channel and stream: one :class:`Image` per publishing session.

    ``poll`` (native: no Python call unless a fragment is there) visits the images
    round-robin, starting one further along each call so that no session starves another;
    ``messages()`` hands out whole messages as bytes (natively: no Python call per message).
    ``poll(handler, limit, timeout=s)``, :meth:`wait` and ``messages()`` sleep until a writer
    wakes them. Images come and go as publishers do, whether or not anyone polls: the client's
    conductor thread adds and removes them and calls ``on_available_image`` and
    ``on_unavailable_image`` (on that thread, so keep them short and thread-safe).
    """

    #: the longest one await sleeps before polling again (None: until woken)
    _wait_slice_s: float | None = None

    def __init__(
        self,
        channel: str,
        stream_id: int,
        *,
        registration_id: int = 0,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
        on_close: Callable[[Subscription, tuple[Image, ...]], Any] | None = None,
        wake: tuple[AtomicBuffer, int] | None = None,
    ) -> None:
        if wake is None:
            super().__init__()
        else:
            super().__init__(*wake)
        self.channel = channel
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._round_robin = 0
        self._on_close = on_close
        self._closed = False
        self._readiness = ReadinessWatcher()

    # -- images -----------------------------------------------------------------------------

    def image_by_session_id(self, session_id: int) -> Image | None:
        """The image of publishing session ``session_id``, or None when it has none here."""
        images: tuple[Image, ...] = self.images
        return next((image for image in images if image.session_id == session_id), None)

    @property
    def is_connected(self) -> bool:
        """True while at least one publisher's image is here."""
        return bool(self.images)

    def _add_image(self, image: Image) -> None:
        self.images = (*self.images, image)
        if self.on_available_image is not None:
            self.on_available_image(image)

    def _remove_image(self, correlation_id: int) -> Image | None:
        """Remove the image the driver knows by ``correlation_id``; None if it is not here."""
        images: tuple[Image, ...] = self.images
        image = next((i for i in images if i.correlation_id == correlation_id), None)
        if image is None:
            return None
        self.images = tuple(i for i in images if i is not image)
        image.close()
        if self.on_unavailable_image is not None:
            self.on_unavailable_image(image)
        return image

    # -- reading ----------------------------------------------------------------------------

    def poll_batch(self, handler: Callable[[FragmentBatch], Any],
                   fragment_limit: int = 4096) -> int:
        """Hand runs of fragments to ``handler`` as :class:`FragmentBatch` (numpy arrays).

        One handler call per image with data, no Python call per fragment. Returns the number
        of fragments. Raises as :meth:`poll` does (DriverTimeoutError, ClientTimeoutError).
        """
        self._check_client()
        fragments = self._each_image(Image.poll_batch, handler, fragment_limit)
        if fragments:  # stopped inside the handler past its liveness: see poll
            self._check_client()
        return fragments

    def _each_image(self, read: Callable[[Any, Any, int], int], handler: Any,
                    fragment_limit: int) -> int:
        """``read(image, handler, limit)`` over the images, round-robin from one further along
        each call, until ``fragment_limit`` fragments; returns how many."""
        fragments = 0
        for image in self._images_round_robin():
            if fragments >= fragment_limit:
                break
            fragments += read(image, handler, fragment_limit - fragments)
        return fragments

    def _images_round_robin(self) -> tuple[Any, ...]:
        """:attr:`images`, starting one further along than the last call's start, so that no
        session starves another."""
        images = self.images
        if not images:
            return images
        start = self._round_robin = (self._round_robin + 1) % len(images)
        return images[start:] + images[:start]

    # -- holding messages, typed messages ----------------------------------------------------

    def take_view(self) -> MessageView | None:
        """The next whole message as a :class:`MessageView`, or None when none is there.

        A large message (one that went through shared memory) is a read-only view of its
        block, zero copy; until the view is released (``release()`` or leaving its ``with``)
        its image's position stays before it, so the writer cannot reuse the block, and that
        image's later messages wait (other images go on). A small one is a copy. Do not mix
        with ``poll``/``messages()`` while a view is held: they would read it again.
        Images are visited round-robin.
        """
        for image in self._images_round_robin():
            if not image._held:
                view: MessageView | None = image._take_view()
                if view is not None:
                    return view
        return None

    def views(self, timeout: float | None = 1.0) -> Iterator[MessageView]:
        """Whole messages as :class:`MessageView`, each released when the next is asked for
        (or the loop ends). Ends after ``timeout`` seconds without one (None: when closed)."""
        return self._views(timeout)

    def arrays(self, timeout: float | None = 1.0, copy: bool = False,
               out: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """numpy arrays sent with ``publish_array``, with their dtype, shape and order.

        A large array is a read-only view of shared memory (zero copy), valid until the next
        array is asked for: its position is held until then, and the memory may be reused
        after; ``copy=True`` (or ``a.copy()``) for arrays to keep (a new array each, its
        shared memory released at once). A small one is a copy.

        ``out``: a writable array each message is copied into (it must have the message's
        shape and dtype; its layout is its own), yielded in place of a new one: the stream
        reuses the caller's memory (no fresh pages per message, the fastest copy) and the
        shared memory is released before ``out`` is yielded, so the writer goes on while the
        caller works. TypeError or ValueError at once for an ``out`` that is no writable
        array; ValueError naming the shapes and dtypes for a message that does not fit (that
        message is consumed, ``out`` left as it was).

        Ends after ``timeout`` seconds without one (None: when closed). ValueError for a
        message that is not an array message.
        """
        transform, hold = _array_reading(copy, out)
        return self._views(timeout, transform, hold)

    def objects(self, timeout: float | None = 1.0, copy: bool = False, *,
                trust_unkeyed_network: bool = False) -> Iterator[Any]:
        """Python objects sent with ``publish_object`` (pickle protocol 5). Unpickling runs
        code of the writer's choosing: read only from writers you trust. Out-of-band buffers
        of a large object (numpy arrays inside it) are read-only views valid until the next
        object is asked for, as in :meth:`arrays`; ``copy=True`` to keep them (the shared memory
        is then released at once).

        On an ``aeron:udp`` channel without ``key=``, any host that can send
        a datagram to the endpoint is a writer, so each message there is refused before any of
        it is decoded: :class:`~shmbus.UntrustedSourceError`, naming the channel and the
        image's source (the refused message is consumed; the next call reads on). Name a key on
        the channel (``|key=<name>``: its datagrams are sealed), or pass
        ``trust_unkeyed_network=True`` when every host that can reach the endpoint is trusted.
        IPC and keyed channels need nothing (see shmbus/codecs/source_trust.py)."""
        return self._views(timeout, self._object_reading(copy, trust_unkeyed_network),
                     hold=not copy)

    def views_async(self, timeout: float | None = 1.0) -> AsyncIterator[MessageView]:
        """:meth:`views`, awaited, with the same ``timeout``."""
        return self._views_async(timeout)

    def arrays_async(self, timeout: float | None = 1.0, copy: bool = False,
                     out: np.ndarray | None = None) -> AsyncIterator[np.ndarray]:
        """:meth:`arrays`, awaited, with the same ``timeout``."""
        transform, hold = _array_reading(copy, out)
        return self._views_async(timeout, transform, hold)

    def objects_async(self, timeout: float | None = 1.0, copy: bool = False, *,
                      trust_unkeyed_network: bool = False) -> AsyncIterator[Any]:
        """:meth:`objects`, awaited, with the same ``timeout``, the same refusal of unkeyed
        network channels and the same ``trust_unkeyed_network``."""
        return self._views_async(timeout, self._object_reading(copy, trust_unkeyed_network),
                           hold=not copy)

    def _object_reading(self, copy: bool, trust_unkeyed_network: bool
                        ) -> Callable[[MessageView], Any]:
        """The transform of :meth:`_views` for ``objects()``: a message's object, or, on an
        unkeyed network channel not trusted, UntrustedSourceError before anything is read."""
        if trust_unkeyed_network or not unkeyed_network(self.channel):
            return lambda view: decode_object(view.buffer, copy or not view.zero_copy)

        def refuse(view: MessageView) -> Any:
            image = self.image_by_session_id(view.session_id)
            raise refusal(self.channel, f"session {view.session_id} (its image is gone)"
                          if image is None else image.source_identity)
        return refuse

    def tables(self, timeout: float | None = 1.0, copy: bool = False) -> Iterator[Any]:
        """pyarrow Tables sent with ``publish_table`` (a RecordBatch comes out as a Table).

        Every column buffer is a slice of the message: for a large one, of the shared-memory
        block itself (zero copy), valid until the next table is asked for, as in
        :meth:`arrays`; ``copy=True`` for tables to keep (the shared memory is then released
        at once). Ends after ``timeout`` seconds
        without one (None: when closed). ValueError for a message that is not an Arrow IPC
        stream, ImportError naming pyarrow when it is not installed (or older than 14.0.1,
        which ran code from a table's bytes). On a channel other than ``aeron:ipc`` each table
        is validated in full before it is handed out (any host may have written it: offsets
        and strings are checked, linear in its bytes); on IPC, where the writers are this
        user's processes, only its structure is."""
        return self._views(timeout, self._table_reading(copy), hold=not copy)

    def tables_async(self, timeout: float | None = 1.0,
                     copy: bool = False) -> AsyncIterator[Any]:
        """:meth:`tables`, awaited, with the same ``timeout``."""
        return self._views_async(timeout, self._table_reading(copy), hold=not copy)

    def _table_reading(self, copy: bool) -> Callable[[MessageView], Any]:
        """The transform of :meth:`_views` for ``tables()``."""
        validate = not self.channel.startswith("aeron:ipc")
        # (a small message is a private copy already: only a view of a block is copied)
        return lambda view: decode_table(view.buffer, copy and view.zero_copy, validate)

    def _views(self, timeout: float | None, transform: Callable[[MessageView], Any] = _same,
               hold: bool = True) -> Iterator[Any]:
        """Messages as :class:`MessageView` (or what ``transform`` makes of each); each is
        released when the next is asked for (or when the loop ends), or with ``hold`` False
        (``transform`` copies what it keeps) as soon as ``transform`` returns: the writer may
        then reuse the block while the caller works on the copy. Ends after ``timeout`` seconds
        with none (None: when closed)."""
        loop = _ViewsLoop(self, timeout, transform, hold)
        try:
            while True:
                yield from loop.ready_items()
                if self._ended() or not self._wait_for_message(loop.deadline):
                    return
        finally:
            loop.release()

    def _ended(self) -> bool:
        """True once closed; raises the client's error (ClientTimeoutError,
        DriverTimeoutError) when the client's failure closed it, so that a loop over the
        messages never ends as if the stream had."""
        closed = self.is_closed  # read first: a failure keeps its error before it closes
        self._check_client()
        return closed

    def _wait_for_message(self, deadline: float | None) -> bool:
        """Sleep until a writer may have appended, 50 ms at the most, or until ``deadline``
        (monotonic seconds; None: none); False, at once, if it has passed."""
        remaining = 0.05 if deadline is None else min(deadline - time.monotonic(), 0.05)
        if remaining <= 0:
            return False
        if self._holds_a_view():  # data waits behind it: wait() would not sleep
            time.sleep(min(remaining, _HELD_WAIT_S))
        else:
            self.wait(remaining)
        return True

    async def _views_async(self, timeout: float | None,
                           transform: Callable[[MessageView], Any] = _same,
                           hold: bool = True) -> AsyncIterator[Any]:
        """:meth:`_views`, awaiting new messages without blocking the event loop."""
        loop = _ViewsLoop(self, timeout, transform, hold)
        try:
            while True:
                for item in loop.ready_items():
                    yield item
                if self._ended() or not await self._await_message(loop.deadline):
                    return
        finally:
            loop.release()

    async def _await_message(self, deadline: float | None) -> bool:
        """:meth:`_wait_for_message`, awaited without blocking the event loop."""
        if not self._holds_a_view():
            return await self._readable(deadline)
        if deadline is not None and time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_HELD_WAIT_S)
        return True

    def _holds_a_view(self) -> bool:
        return any(image._held for image in self.images)

    # -- asyncio ----------------------------------------------------------------------------

    async def poll_async(self, handler: Callable[[memoryview, Any], Any],
                         fragment_limit: int = 10, timeout: float | None = 0) -> int:
        """:meth:`poll`, awaiting (the event loop runs on) until a fragment arrives.

        The handler runs on the event loop's thread. Returns the number of fragments, 0 when
        ``timeout`` seconds passed (None: no limit; 0, as for :meth:`poll`: one poll).
        Cancelled, it has read nothing. Finding nothing, it sleeps (no CPU) until the writer
        wakes it.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            fragments = self.poll(handler, fragment_limit)
            if fragments or self._closed or not await self._readable(deadline):
                return fragments

    async def wait_async(self, timeout: float | None = None, /) -> bool:
        """:meth:`wait`, awaited: True once an image may have a fragment to read, False when
        ``timeout`` seconds passed first (None: no limit). The event loop runs meanwhile."""
        deadline = None if timeout is None else deadline_after(timeout)
        while not self._closed:
            if self.wait(0):
                return True
            if not await self._readable(deadline):  # (it may wake with nothing there yet)
                return False
        return False

    async def messages_async(self, timeout: float | None = 1.0) -> AsyncIterator[bytes]:
        """Whole messages as bytes, awaited: ``async for message in sub.messages_async()``.

        Ends when none arrives for ``timeout`` seconds, as :meth:`messages` does (None: only
        when the subscription is closed). A message is consumed as it is yielded: a cancelled
        or abandoned loop loses nothing.
        """
        take, deadline = self._take, None
        while not self._closed:
            message = take()
            if message is not None:
                deadline = None
                yield message
                continue
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            if not await self._readable(deadline):
                return

    async def _readable(self, deadline: float | None) -> bool:
        """Await until an image may have something to read (True) or ``deadline`` (monotonic
        seconds; None: none) passed (False). Sleeps in slices of ``_wait_slice_s``."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        # the spin of a blocking wait first (Context.wait_spin, microseconds: the event loop can
        # spare them), so a stream that keeps coming never arms a watcher
        if self._wait_spin_ns and self.wait(self._wait_spin_ns * 1e-9):
            return True
        slice_s = self._wait_slice_s
        if slice_s is not None and (remaining is None or remaining > slice_s):
            remaining = slice_s
        await self._readiness.wait(self._arm_watcher, remaining)
        return True

    def __aiter__(self) -> AsyncIterator[bytes]:
        """``async for message in sub``: :meth:`messages_async` until the subscription is
        closed."""
        return self.messages_async(timeout=None)

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """True once closed (by :meth:`close`, the client's close, or its failure)."""
        return self._closed

    def close(self) -> None:
        """Stop subscribing; images are closed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        images, self.images = self.images, ()
        for image in images:
            image.close()
        self._drop_lease()
        self._readiness.close(self._wake)
        on_close, self._on_close = self._on_close, None
        if on_close is not None:  # (the client's method: dropped, so no cycle keeps it alive)
            on_close(self, images)

    def __repr__(self) -> str:
        return (f"Subscription(channel={self.channel!r}, stream_id={self.stream_id}, "
                f"images={len(self.images)})")


def _array_reading(copy: bool, out: np.ndarray | None
                   ) -> tuple[Callable[[MessageView], np.ndarray], bool]:
    """(transform, hold) of :meth:`Subscription._views` for ``arrays(copy=..., out=...)``: a
    view held until the next, or a copy (new, or into ``out``) after which the view is released
    at once."""
    if out is not None:
        if copy:
            raise ValueError("arrays(copy=True, out=...): out is the copy, pass one of them")
        target = check_out(out)
        return (lambda view: copy_array_into(view.buffer, target)), False
    return (lambda view: decode_array(view.buffer, copy or not view.zero_copy)), not copy
