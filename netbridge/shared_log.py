"""The log port (:mod:`netbridge.log_port`) over shmbus's shared-memory logs, for the bridge.

The netbridge's one module besides its I/O layers that touches logs: every call into
``shmbus.shm._native`` the sender's and receiver's logs need is here, the native fast paths
too: :func:`receive_batch` (a batch of the receiver's in-order placements, see
:func:`netbridge.placement.in_order`) and :func:`native_send` / :func:`send_now` / :func:`sent`
(a batch of the sender's scan and send, accounted by
:meth:`netbridge.sender.NetworkSender.on_data_sent`). Frame headers are read and written as
``shmbus.shm.log_buffer`` lays them out; the per-frame loops are native.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from netbridge import _io
from netbridge.log_port import FrameWalk, ImagePort, Scan
from shmbus.shm import _native
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.log_buffer import PARTITION_COUNT, LogBuffer, max_message_length

__all__ = [
    "DataBatch",
    "NativeSend",
    "SharedImageLog",
    "SharedPublicationLog",
    "native_send",
    "receive_batch",
    "send_now",
    "sent",
    "walk_frames",
]

_SPAN = struct.Struct("<qq")

#: what _io.busy_poll and send_now take for a sender: (fd, log buffer, term length,
#: position, limit, mtu, max datagrams, destinations, sealer or None)
NativeSend = tuple[int, AtomicBuffer, int, int, int, int, int, tuple[object, ...],
                   _io.Sealer | None]


@dataclass(frozen=True, slots=True)
class DataBatch:
    """DATA datagrams of one scan as spans of the log (nothing copied): ``spans`` packs each
    datagram as little-endian int64 (offset in ``buffer``, length), ``count`` of them,
    ``length`` bytes in all; ``terms`` are read-only views of the log's terms. The socket
    layer sends them with :meth:`send`; valid until the log is cleaned past them."""

    buffer: AtomicBuffer
    terms: tuple[memoryview, ...]
    spans: bytes
    count: int
    length: int

    def send(self, fd: int, destination: tuple[str, int], sealer: _io.Sealer | None = None
             ) -> int:
        """sendmmsg the datagrams on socket ``fd`` to a numeric IPv4 (host, port), each sealed
        first with ``sealer``; returns how many went (a full socket buffer is loss). OSError
        for a bad socket."""
        sent: int = _io.send_batch(fd, self.buffer, self.spans, destination, sealer)
        return sent

    def datagrams(self) -> list[memoryview]:
        """Each datagram as a read-only memoryview of the log (for per-datagram handling,
        e.g. a loss filter)."""
        term_length = len(self.terms[0])
        out = []
        for offset, length in _SPAN.iter_unpack(self.spans):
            index, term_offset = divmod(offset, term_length)
            out.append(self.terms[index][term_offset:term_offset + length])
        return out


class _SharedLog:
    """What both ports read of a shared log: its stream's identity and term geometry, from its
    descriptor, and where a position lies in its buffer."""

    def __init__(self, log: LogBuffer) -> None:
        d = log.descriptor
        self.log = log
        self.session_id: int = d.session_id
        self.stream_id: int = d.stream_id
        self.initial_term_id: int = d.initial_term_id
        self.term_length: int = d.term_length
        self._buffer = log.buffer
        self._position_bits = d.term_length.bit_length() - 1

    def _offset(self, position: int) -> int:
        """The buffer offset of ``position`` (in its term's partition)."""
        index = (position >> self._position_bits) % PARTITION_COUNT
        return index * self.term_length + (position & (self.term_length - 1))


class SharedPublicationLog(_SharedLog):
    """:class:`netbridge.log_port.PublicationPort` over a publication's shared log."""

    def __init__(self, log: LogBuffer) -> None:
        super().__init__(log)
        self.mtu: int = log.descriptor.mtu
        self.max_message_length = max_message_length(self.term_length)
        self._terms = tuple(log.term_view(i).toreadonly() for i in range(PARTITION_COUNT))

    def scan(self, position: int, limit: int, mtu: int, max_datagrams: int) -> Scan:
        position, spans, length, back_pressured, more = _io.scan_datagrams(
            self._buffer, self.term_length, position, limit, mtu, max_datagrams)
        count = len(spans) // _SPAN.size
        batch = DataBatch(self._buffer, self._terms, spans, count, length) if count else None
        return Scan(position, count, length, back_pressured, more, batch)

    def committed(self, position: int) -> bool:
        return self._buffer.get_int32_acquire(self._offset(position)) > 0

    def frames(self, position: int, length: int, mtu: int) -> list[memoryview] | None:
        term_length = self.term_length
        start = self._offset(position)
        term_offset = position & (term_length - 1)
        buffer = self._buffer
        if (buffer.get_int32_acquire(start) <= 0
                or buffer.get_int32(start + 8) != term_offset
                or buffer.get_int32(start + 12) != self.session_id
                or buffer.get_int32(start + 20) != self._term_id(position)):
            return None
        base = start - term_offset
        term = self._terms[base // term_length]
        stop = term_offset + length
        out = []
        offset = term_offset
        while offset < stop:
            available, padding = _io.term_scan(buffer, base, term_length, offset, mtu, stop)
            if available == 0:
                break
            out.append(term[offset:offset + available])
            offset += available + padding
        return out

    def _term_id(self, position: int) -> int:
        term_id = self.initial_term_id + (position >> self._position_bits)
        return ((term_id + 2**31) & 0xFFFFFFFF) - 2**31

    def producer_position(self) -> int:
        return self.log.producer_position()


def native_send(fd: int, log: LogBuffer, spin: tuple[int, int, int, int],
                destinations: Sequence[object], sealer: _io.Sealer | None) -> NativeSend:
    """The send that ``_io.busy_poll`` or :func:`send_now` make for a sender on socket
    ``fd``: ``spin`` is :meth:`netbridge.sender.NetworkSender.spin_send`'s (position, limit,
    mtu, max datagrams); each destination a numeric IPv4 (host, port); ``sealer`` the
    socket's on an authenticated channel."""
    return (fd, log.buffer, log.descriptor.term_length, *spin, tuple(destinations), sealer)


def send_now(send: NativeSend) -> Scan:
    """Scan and send at once what is committed for ``send`` (as the spin would): the scan,
    its datagrams already sent to every destination (``batch`` None). OSError for a bad
    socket."""
    return sent(_io.send_now(send))


def sent(result: tuple[int, int, int, bool, bool]) -> Scan:
    """A native send's (position, datagrams, bytes, back_pressured, more) as a Scan."""
    position, count, length, back_pressured, more = result
    return Scan(position, count, length, back_pressured, more, None)


class SharedImageLog(_SharedLog):
    """:class:`netbridge.log_port.ImagePort` over an image's shared log; its subscribers'
    position comes from ``subscriber_position`` (the bridge reads their counters)."""

    def __init__(self, log: LogBuffer, subscriber_position: Callable[[], int]) -> None:
        super().__init__(log)
        self.subscriber_position = subscriber_position

    def walk(self, datagram: memoryview, term_offset: int, term_id: int,
             below: int) -> FrameWalk | None:
        return walk_frames(datagram, term_offset, self.session_id, self.stream_id, term_id,
                           self.term_length, below)

    def insert(self, position: int, frames: memoryview) -> None:
        _io.insert_frames(self._buffer, self._offset(position), frames, 0, len(frames))

    def clean(self, start: int, end: int) -> None:
        term_length = self.term_length
        buffer = self._buffer
        while start < end:
            term_offset = start & (term_length - 1)
            length = min(end - start, term_length - term_offset)
            at = self._offset(start)
            if length > 8:
                buffer.set_memory(at + 8, length - 8, 0)
                buffer.put_int64_release(at, 0)
            else:
                buffer.set_memory(at, length, 0)
            start += length

    def end_of_stream(self, position: int) -> None:
        self.log.end_of_stream_position = position

    def wake_readers(self) -> None:
        _native.wake_log_readers(self._buffer)


def walk_frames(datagram: memoryview, term_offset: int, session_id: int, stream_id: int,
                term_id: int, term_length: int, below: int) -> FrameWalk | None:
    """:meth:`netbridge.log_port.ImagePort.walk` for an image of that session, stream and term
    length: pure (bytes only), the loop over frame headers native."""
    walked = _io.validate_datagram(datagram, term_offset, session_id, stream_id, term_id,
                                       term_length, below)
    return None if isinstance(walked, int) else FrameWalk(*walked)


def receive_batch(fd: int, slots: bytearray, places: Sequence[tuple[ImagePort, int, int]],
                  sealer: _io.Sealer | None = None
                  ) -> tuple[int, list[tuple[int, int, int, object] | None],
                             list[tuple[int, int, tuple[str, int] | None]],
                             list[tuple[int, tuple[str, int] | None]] | None]:
    """One recvmmsg into ``slots`` (64 KiB each) with the in-order placements done natively
    (:func:`netbridge.placement.in_order`): ``places`` is (image log, high-water mark, window
    limit) of each image without an announced end of stream. With ``sealer`` every datagram
    is opened first. Returns (datagrams received, per place None or (new high-water mark,
    datagrams, bytes, source of the latest), the others as (slot offset, length, source) in
    order, the (drop kind, source) of each that did not open or None)."""
    images = []
    for log, hwm, limit in places:
        assert isinstance(log, SharedImageLog)
        images.append((log._buffer, log.session_id, log.stream_id, log.term_length,
                       log.initial_term_id, hwm, limit))
    received, in_order, rest, dropped = _io.receive_batch(fd, slots, tuple(images), sealer)
    return received, list(in_order), rest, dropped
