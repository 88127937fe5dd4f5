"""Subscriptions: the images of every session publishing on one channel and stream."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from shmbus.fragment_assembler import FragmentAssembler
from shmbus.idle_strategy import BackoffIdleStrategy
from shmbus.image import FragmentBatch, FragmentHandler, Image
from shmbus.shm._native import Header

ImageHandler = Callable[[Image], Any]


class Subscription:
    """Reads a channel and stream: one :class:`Image` per publishing session.

    ``poll`` visits the images round-robin, starting one further along each call so that no
    session starves another. Images come and go as publishers do; ``on_available_image`` and
    ``on_unavailable_image`` are called (on the polling thread) when they do.
    """

    def __init__(
        self,
        channel: str,
        stream_id: int,
        *,
        registration_id: int = 0,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
        service: Callable[[], Any] | None = None,
        on_close: Callable[[Subscription, tuple[Image, ...]], Any] | None = None,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._images: tuple[Image, ...] = ()
        self._round_robin = 0
        self._service = service
        self._on_close = on_close
        self._closed = False

    # -- images -----------------------------------------------------------------------------

    @property
    def images(self) -> tuple[Image, ...]:
        """The current images (a snapshot)."""
        return self._images

    def image_by_session_id(self, session_id: int) -> Image | None:
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    @property
    def is_connected(self) -> bool:
        """True while at least one publisher's image is here."""
        return bool(self._images)

    def _add_image(self, image: Image) -> None:
        self._images = (*self._images, image)
        if self.on_available_image is not None:
            self.on_available_image(image)

    def _remove_image(self, correlation_id: int) -> Image | None:
        """Remove the image the driver knows by ``correlation_id``; None if it is not here."""
        image = next((i for i in self._images if i.correlation_id == correlation_id), None)
        if image is None:
            return None
        self._images = tuple(i for i in self._images if i is not image)
        image.close()
        if self.on_unavailable_image is not None:
            self.on_unavailable_image(image)
        return image

    # -- reading ----------------------------------------------------------------------------

    def _start(self) -> tuple[tuple[Image, ...], int]:
        if self._service is not None:
            self._service()
        images = self._images
        if not images:
            return images, 0
        start = self._round_robin = (self._round_robin + 1) % len(images)
        return images, start

    def _each_image(self, read: Callable[[Image, Any, int], int], handler: Any,
                    fragment_limit: int) -> int:
        """``read(image, handler, limit)`` over the images round-robin, within the limit."""
        images, start = self._start()
        n = len(images)
        fragments = 0
        for i in range(n):
            if fragments >= fragment_limit:
                break
            fragments += read(images[(start + i) % n], handler, fragment_limit - fragments)
        return fragments

    def poll(self, handler: FragmentHandler, fragment_limit: int = 10) -> int:
        """Call ``handler(buffer, header)`` for up to ``fragment_limit`` fragments in all.

        The buffer is a read-only memoryview valid only during the call. Wrap the handler in
        :class:`FragmentAssembler` to get whole messages. Returns the number of fragments.
        """
        return self._each_image(Image.poll, handler, fragment_limit)

    def controlled_poll(self, handler: Callable[[memoryview, Header], Any],
                        fragment_limit: int = 10) -> int:
        """Like :meth:`poll`, but the handler returns an :class:`~shmbus.Action`."""
        return self._each_image(Image.controlled_poll, handler, fragment_limit)

    def poll_batch(self, handler: Callable[[FragmentBatch], Any],
                   fragment_limit: int = 4096) -> int:
        """Hand runs of fragments to ``handler`` as :class:`FragmentBatch` (numpy arrays).

        One handler call per image with data, no Python call per fragment. Returns the number
        of fragments.
        """
        return self._each_image(Image.poll_batch, handler, fragment_limit)

    def messages(self, timeout: float | None = 1.0) -> Iterator[bytes]:
        """Yield whole messages as bytes, reassembled, until none arrives for ``timeout`` s.

        ``timeout=None`` waits forever. Idles with back-off between empty polls.
        """
        pending: list[bytes] = []
        assembler = FragmentAssembler(lambda buffer, header: pending.append(bytes(buffer)))
        idle = BackoffIdleStrategy()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            if self.poll(assembler, 256):
                idle.reset()
                yield from pending
                pending.clear()
                if timeout is not None:
                    deadline = time.monotonic() + timeout
            elif deadline is not None and time.monotonic() >= deadline:
                return
            else:
                idle.idle(0)

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop subscribing; images are closed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        images, self._images = self._images, ()
        for image in images:
            image.close()
        if self._on_close is not None:
            self._on_close(self, images)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Subscription(channel={self.channel!r}, stream_id={self.stream_id}, "
                f"images={len(self._images)})")
