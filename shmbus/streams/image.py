"""Images: the read side of one publishing session's log (docs/protocol.md, Log buffer layout).

An :class:`Image` reads frames in place from the log buffer and advances its subscriber
position; the native core does the scanning. ``poll`` hands each fragment to a Python
handler; ``poll_batch`` hands a whole run of fragments over at once as numpy arrays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from shmbus.settings import codes
from shmbus.shm._native import Header, ImageCore
from shmbus.shm.block_ring import REFERENCE_FLAGS, BlockRing, CorruptReferenceError, ring_path
from shmbus.shm.log_buffer import BEGIN_FLAG, END_FLAG, LogBuffer
from shmbus.shm.position import Position
from shmbus.streams.fragment_assembler import FragmentAssembler

FragmentHandler = Callable[[memoryview, Header], Any]


class FragmentBatch:
    """A run of fragments of one term, handed to a ``poll_batch`` handler.

    ``term`` is a read-only uint8 numpy view of the whole term; fragment ``i``'s payload is
    ``term[offsets[i]:offsets[i] + lengths[i]]``; ``flags[i]`` has B (0x80) and E (0x40) set
    for a whole message. The arrays are valid only during the handler call: copy what you keep.
    ``position`` is the stream position where the batch starts.
    """

    __slots__ = {
        "term": "the whole term, a read-only uint8 numpy view",
        "offsets": "payload offsets into term (int64), one per fragment",
        "lengths": "payload lengths in bytes (int32), one per fragment",
        "flags": "frame flags (uint8): B 0x80, E 0x40; both for a whole message",
        "position": "stream position (bytes) where the batch starts",
        "session_id": "the publishing session",
    }

    def __init__(self, term: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                 flags: np.ndarray, position: int, session_id: int) -> None:
        self.term = term
        self.offsets = offsets
        self.lengths = lengths
        self.flags = flags
        self.position = position
        self.session_id = session_id

    def __len__(self) -> int:
        return len(self.offsets)

    def payload(self, i: int) -> memoryview:
        """Fragment ``i``'s payload, zero copy."""
        start = int(self.offsets[i])
        return self.term.data[start:start + int(self.lengths[i])]

    def payloads(self) -> list[bytes]:
        """Every fragment's payload, copied."""
        term = self.term
        return [term[o:o + n].tobytes() for o, n in zip(self.offsets.tolist(),
                                                        self.lengths.tolist(), strict=True)]

    def records(self, dtype: np.dtype | str) -> np.ndarray:
        """The fragments as an array of fixed-size records of ``dtype``, copied.

        Every fragment must be a whole message of exactly ``dtype.itemsize`` bytes; otherwise
        ValueError names the first one that is not.
        """
        dtype = np.dtype(dtype)
        n = len(self.offsets)
        bad = np.flatnonzero((self.lengths != dtype.itemsize)
                             | ((self.flags & (BEGIN_FLAG | END_FLAG)) != BEGIN_FLAG | END_FLAG))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"fragment {i} has {int(self.lengths[i])} bytes and flags "
                             f"0x{int(self.flags[i]):x}; records of {dtype} need "
                             f"{dtype.itemsize}-byte whole messages")
        if n == 0:
            return np.empty(0, dtype)
        first = int(self.offsets[0])
        stride = int(self.offsets[1] - self.offsets[0]) if n > 1 else dtype.itemsize
        if n == 1 or bool(np.all(np.diff(self.offsets) == stride)):
            # equally spaced frames (the usual case): one strided copy
            return np.ndarray((n,), dtype, buffer=self.term, offset=first,
                              strides=(stride,)).copy()
        index = self.offsets[:, None] + np.arange(dtype.itemsize)
        return self.term[index].view(dtype).reshape(n)


def _nothing() -> None:
    pass


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


class Image(ImageCore):
    """One publishing session as seen by one subscription.

    ``position`` is this subscriber's position (bytes consumed); only this image writes it.
    Create images through a Subscription; the bus client does it when a publisher appears.
    """

    def __init__(self, log: LogBuffer, position: Position, *, owned: bool = False,
                 correlation_id: int = 0, subscription_registration_id: int = 0,
                 join_position: int | None = None, source_identity: str = "ipc") -> None:
        d = log.descriptor
        super().__init__(log.buffer, d.term_length, d.initial_term_id, position.buffer,
                         position.offset, owned)
        self.log = log
        self.session_id = d.session_id
        self.stream_id = d.stream_id
        self.correlation_id = correlation_id
        self.subscription_registration_id = subscription_registration_id
        self.source_identity = source_identity
        if join_position is not None:
            self.position = join_position
        self.join_position = self.position
        self._batch_arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._terms: list[np.ndarray] | None = None
        # large messages (shmbus/shm/block_ring.py): the block ring, opened on first use; the
        # reference last resolved; whether a MessageView holds this image's position
        self._blocks: BlockRing | None = None
        # mapped now (see Publication._bind); a ring file that is not one (cut short) is named
        # by the first large message read (_ring), small ones flow meanwhile
        with contextlib.suppress(FileNotFoundError, ValueError):
            self._blocks = BlockRing.open(ring_path(log.path))
        self._last_reference = b""
        self._held = False
        self._view_found: list[Any] = []
        self._view_assembler: Any = None
        #: rings the driver's doorbell (the client sets it): a reader done with a large
        #: message's block has the driver free it now, so the writer reuses warm memory
        self._wake_driver: Callable[[], None] = _nothing

    def _ring(self) -> BlockRing:
        """The log's block ring; CorruptReferenceError (the frame is dropped) for a log with
        none: a network image's (large messages cross hosts in pieces, never as references),
        or one whose driver removed its files."""
        if self._blocks is None:
            try:
                self._blocks = BlockRing.open(ring_path(self.log.path))
            except FileNotFoundError:
                raise CorruptReferenceError(
                    f"a large-message reference in {self.log.path}, which has no block ring "
                    f"(a network image's log, or one its driver removed)") from None
        return self._blocks

    def _large_payload(self, reference: bytes, position: int) -> memoryview | None:
        """What a handler gets for a large message: a read-only view of its block; called by
        the native core (image.c) when a poll reaches a reference frame (``position``: the
        stream position just after it). None when the block is gone: the reader stops there,
        as at a lapped frame, until it hears its image is gone."""
        self._last_reference = reference
        return self._ring().view(reference, position)

    def _large_view(self, reference: bytes, position: int) -> memoryview | None:
        return self._ring().view(reference, position)

    def _take_view(self) -> MessageView | None:
        """The next whole message as a :class:`MessageView` (see Subscription.take_view), or
        None."""
        found = self._view_found
        assembler = self._view_assembler
        if assembler is None:
            def whole(buffer: memoryview, header: Any) -> None:
                found.append((bytes(buffer), header.session_id, header.position,
                              header.reserved_value))
            assembler = self._view_assembler = FragmentAssembler(whole)

        def peek(buffer: memoryview, header: Any) -> int:
            if header.flags & REFERENCE_FLAGS == REFERENCE_FLAGS:  # (not on a fragment: ignored)
                found.append((None, header.session_id, header.position, header.reserved_value))
                return codes.Action.ABORT
            assembler(buffer, header)
            return codes.Action.CONTINUE

        while not found and self.controlled_poll(peek, 1):
            pass
        if not found:
            return None
        data, session_id, position, reserved = found.pop(0)
        if data is not None:
            return MessageView(memoryview(data), session_id, position, reserved, None)
        view = self._large_view(self._last_reference, position)
        if view is None:  # freed since the peek: this reader was dropped (_large_payload)
            return None
        self._held = True
        return MessageView(view, session_id, position, reserved, self)

    def _large_bytes(self, reference: bytes, position: int) -> bytes | None:
        """What ``messages()`` yields for a large message: a copy of its block; called by the
        native core (image.c) when a take reaches a reference frame (None: gone, see
        _large_payload)."""
        block = self._ring().view(reference, position)
        if block is None:
            return None
        try:
            return bytes(block)
        finally:
            block.release()

    def poll_batch(self, handler: Callable[[FragmentBatch], Any], fragment_limit: int) -> int:
        """Hand up to ``fragment_limit`` fragments of the current term to ``handler`` at once.

        The handler gets a :class:`FragmentBatch` (numpy arrays over the term, no per-fragment
        Python call); the position advances past the batch after it returns (also if it
        raises). Returns the number of fragments; 0 calls no handler. Padding is skipped.
        """
        if self._batch_arrays is None or len(self._batch_arrays[0]) < fragment_limit:
            self._batch_arrays = (np.empty(fragment_limit, np.int64),
                                  np.empty(fragment_limit, np.int32),
                                  np.empty(fragment_limit, np.uint8))
        offsets, lengths, flags = self._batch_arrays
        count, index, scanned = self._scan(fragment_limit, offsets, lengths, flags)
        if scanned == 0 or self.is_closed:
            return 0
        position = self.position
        try:
            if count:
                if self._terms is None:
                    self._terms = [np.frombuffer(self.log.term_view(i), np.uint8)
                                   for i in range(3)]
                handler(FragmentBatch(self._terms[index], offsets[:count], lengths[:count],
                                      flags[:count], position, self.session_id))
        finally:
            self.position = position + scanned
        return count

    @property
    def is_end_of_stream(self) -> bool:
        """True once the publisher ended the stream and everything up to the end was read."""
        return self.position >= self.log.end_of_stream_position

    def close(self) -> None:
        """Stop reading: later polls return 0 and the log may be unmapped. Idempotent."""
        self._close_core()
        self._terms = None
        blocks, self._blocks = self._blocks, None
        if blocks is not None:
            blocks.close()

    def __repr__(self) -> str:
        return (f"Image(session_id={self.session_id}, stream_id={self.stream_id}, "
                f"position={self.position})")
