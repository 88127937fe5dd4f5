"""In-memory logs behind the log port (netbridge.log_port), for the sender's and receiver's unit
tests: no /dev/shm, no other process.

:class:`FakePublicationLog` is a publication's log with a publisher that appends whole frames
(a message longer than the mtu allows is fragmented; a frame that does not fit the term's rest
pads it out) under a limit the test moves, and :class:`FakeImageLog` an image's log with one
subscriber that reads what is contiguous from its position. Both keep three partitions of
raw bytes laid out as the shared logs are. The scan is a plain Python model of the native one
(frames whole, at most the mtu, a PAD as its header); the receiver's check of frame headers is
the real one (:func:`netbridge.shared_log.walk_frames`, bytes only).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from netbridge.frames import HDR_TYPE_DATA, HDR_TYPE_PAD
from netbridge.log_port import FrameWalk, Scan, term_id_of
from netbridge.receiver_image import ImageRequest, ImageResources
from netbridge.shared_log import walk_frames

PARTITIONS = 3
HEADER = 32
BACK_PRESSURED = -2
_HEADER = struct.Struct("<iBBHiiiiq")
_LENGTH = struct.Struct("<i")


def align(length: int) -> int:
    return (length + 31) & ~31


class _Terms:
    """Three partitions of a log's terms, addressed by stream position."""

    def __init__(self, term_length: int, initial_term_id: int) -> None:
        self.term_length = term_length
        self.initial_term_id = initial_term_id
        self.position_bits = term_length.bit_length() - 1
        self.memory = bytearray(PARTITIONS * term_length)

    def offset(self, position: int) -> int:
        index = (position >> self.position_bits) % PARTITIONS
        return index * self.term_length + position % self.term_length

    def length_at(self, position: int) -> int:
        return int(_LENGTH.unpack_from(self.memory, self.offset(position))[0])

    def term_id(self, position: int) -> int:
        return term_id_of(position, self.position_bits, self.initial_term_id)

    def bytes_at(self, position: int, length: int) -> bytes:
        start = self.offset(position)
        return bytes(self.memory[start:start + length])

    def clean(self, start: int, end: int) -> None:
        while start < end:
            length = min(end - start, self.term_length - start % self.term_length)
            at = self.offset(start)
            self.memory[at:at + length] = bytes(length)
            start += length


@dataclass(frozen=True)
class FakeBatch:
    """:class:`netbridge.log_port.Datagrams` as a list of read-only views."""

    views: list[memoryview]

    @property
    def count(self) -> int:
        return len(self.views)

    @property
    def length(self) -> int:
        return sum(len(v) for v in self.views)

    def datagrams(self) -> list[memoryview]:
        return list(self.views)


class FakePublicationLog(_Terms):
    """A publication's log (a :class:`netbridge.log_port.PublicationPort`) and its publisher.

    ``offer`` appends a message as a real publication does while ``position`` is below
    ``limit`` (else returns BACK_PRESSURED); ``follow(sender_position)`` stands for the
    driver: it moves the limit to snd-pos + half a term and cleans one term behind."""

    def __init__(self, *, term_length: int, initial_term_id: int, session_id: int,
                 stream_id: int, mtu: int) -> None:
        super().__init__(term_length, initial_term_id)
        self.session_id = session_id
        self.stream_id = stream_id
        self.mtu = mtu
        self.max_message_length = min(term_length // 8, 16 * 1024 * 1024)
        self.position = 0
        self.limit = term_length // 2
        self._view = memoryview(self.memory).toreadonly()
        self._clean_position = 0

    # -- the publisher and the driver ----------------------------------------------------

    def offer(self, message: bytes) -> int:
        if self.position >= self.limit:
            return BACK_PRESSURED
        most = self.mtu - HEADER
        chunks = [message[i:i + most] for i in range(0, len(message), most)] or [b""]
        term_offset = self.position % self.term_length
        if term_offset + sum(align(HEADER + len(c)) for c in chunks) > self.term_length:
            # the whole message goes into the next term: pad this one out
            self._write(self.term_length - term_offset, HDR_TYPE_PAD, 0, b"")
        for i, chunk in enumerate(chunks):
            flags = (0x80 if i == 0 else 0) | (0x40 if i == len(chunks) - 1 else 0)
            self._write(HEADER + len(chunk), HDR_TYPE_DATA, flags, chunk)
        return self.position

    def _write(self, frame_length: int, frame_type: int, flags: int, payload: bytes) -> None:
        position = self.position
        at = self.offset(position)
        assert self.memory[at:at + align(frame_length)] == bytes(align(frame_length)), (
            "writing over a part of the log that was not cleaned")
        self.memory[at + HEADER:at + HEADER + len(payload)] = payload
        _HEADER.pack_into(self.memory, at, frame_length, 0, flags, frame_type,
                          position % self.term_length, self.session_id, self.stream_id,
                          self.term_id(position), 0)
        self.position = position + align(frame_length)

    def follow(self, sender_position: int) -> None:
        clean_to = sender_position - self.term_length
        if clean_to > self._clean_position:
            self.clean(self._clean_position, clean_to)
            self._clean_position = clean_to
        self.limit = sender_position + self.term_length // 2

    # -- the port --------------------------------------------------------------------------

    def committed(self, position: int) -> bool:
        return self.length_at(position) > 0

    def producer_position(self) -> int:
        return self.position

    def _frames(self, position: int, max_length: int, stop: int) -> tuple[int, int]:
        """(bytes to send, padding after them) from ``position`` (within its term, frames
        starting before ``stop``), as the native term scan counts them."""
        term_offset = position % self.term_length
        stop = min(stop, self.term_length)
        sent = 0
        while sent < max_length and term_offset + sent < stop:
            frame_length = self.length_at(position + sent)
            if frame_length <= 0:
                break
            aligned = align(frame_length)
            if term_offset + sent + aligned > self.term_length:
                break
            frame_type = self.memory[self.offset(position + sent) + 6]
            if frame_type == HDR_TYPE_PAD:
                if sent + HEADER <= max_length:
                    return sent + HEADER, aligned - HEADER
                break
            if sent + aligned > max_length:
                break
            sent += aligned
        return sent, 0

    def scan(self, position: int, limit: int, mtu: int, max_datagrams: int) -> Scan:
        views: list[memoryview] = []
        back_pressured = more = False
        while True:
            window = limit - position
            committed = self.committed(position)
            if window <= 0:
                back_pressured = committed
                break
            if len(views) >= max_datagrams:
                more = True
                break
            length, padding = self._frames(position, min(window, mtu), self.term_length)
            if length == 0:
                back_pressured = window < mtu and committed
                break
            at = self.offset(position)
            views.append(self._view[at:at + length])
            position += length + padding
        batch = FakeBatch(views) if views else None
        return Scan(position, len(views), sum(len(v) for v in views), back_pressured, more,
                    batch)

    def frames(self, position: int, length: int, mtu: int) -> list[memoryview] | None:
        at = self.offset(position)
        frame_length, _, _, _, term_offset, session_id, _, term_id, _ = _HEADER.unpack_from(
            self.memory, at)
        if (frame_length <= 0 or term_offset != position % self.term_length
                or session_id != self.session_id or term_id != self.term_id(position)):
            return None
        term_start = position - position % self.term_length
        stop = position % self.term_length + length
        out = []
        while position - term_start < stop:
            available, padding = self._frames(position, mtu, stop)
            if available == 0:
                break
            at = self.offset(position)
            out.append(self._view[at:at + available])
            position += available + padding
        return out


class FakeImageLog(_Terms):
    """An image's log (a :class:`netbridge.log_port.ImagePort`) with one subscriber at
    ``position`` (a test may also set it) that :meth:`poll` moves."""

    def __init__(self, request: ImageRequest) -> None:
        super().__init__(request.term_length, request.initial_term_id)
        self.session_id = request.session_id
        self.stream_id = request.stream_id
        self.position = request.join_position
        self.end_of_stream_position: int | None = None
        self.wakes = 0
        self._partial = b""

    # -- the port --------------------------------------------------------------------------

    def walk(self, datagram: memoryview, term_offset: int, term_id: int,
             below: int) -> FrameWalk | None:
        return walk_frames(datagram, term_offset, self.session_id, self.stream_id, term_id,
                           self.term_length, below)

    def insert(self, position: int, frames: memoryview) -> None:
        assert position % self.term_length + len(frames) <= self.term_length
        at = self.offset(position)
        self.memory[at:at + len(frames)] = frames

    def subscriber_position(self) -> int:
        return self.position

    def end_of_stream(self, position: int) -> None:
        self.end_of_stream_position = position

    def wake_readers(self) -> None:
        self.wakes += 1

    # -- the subscriber --------------------------------------------------------------------

    @property
    def is_end_of_stream(self) -> bool:
        end = self.end_of_stream_position
        return end is not None and self.position >= end

    def _data_fragments(self) -> Iterator[tuple[int, bytes]]:
        """(flags, payload) of each DATA frame from ``position`` on, in order, up to a frame
        not yet there; ``position`` moves past each frame (padding too) as it is read."""
        while True:
            frame_length = self.length_at(self.position)
            if frame_length <= 0:
                return
            at = self.offset(self.position)
            self.position += align(frame_length)
            if self.memory[at + 6] == HDR_TYPE_DATA:
                yield self.memory[at + 5], bytes(self.memory[at + HEADER:at + frame_length])

    def poll(self) -> list[bytes]:
        """The fragments' payloads a subscriber reads now, in order (it stops at a frame not
        yet there); moves ``position``."""
        return [payload for _, payload in self._data_fragments()]

    def messages(self) -> list[bytes]:
        """Whole messages read now (fragments reassembled by their begin and end flags)."""
        out = []
        for flags, payload in self._data_fragments():
            self._partial = payload if flags & 0x80 else self._partial + payload
            if flags & 0x40:
                out.append(self._partial)
                self._partial = b""
        return out


class FakeImageHost:
    """The image factory of the tests: a :class:`FakeImageLog` per image, kept by (session,
    stream); ``receiver_window`` goes into every ImageResources; ``decline`` refuses."""

    def __init__(self, *, receiver_window: int | None = None, decline: bool = False) -> None:
        self.receiver_window = receiver_window
        self.decline = decline
        self.requests: list[ImageRequest] = []
        self.logs: dict[tuple[int, int], FakeImageLog] = {}

    def __call__(self, request: ImageRequest) -> ImageResources | None:
        self.requests.append(request)
        if self.decline:
            return None
        log = FakeImageLog(request)
        self.logs[(request.session_id, request.stream_id)] = log
        return ImageResources(log, self.receiver_window)

    def image(self, session_id: int, stream_id: int) -> FakeImageLog:
        return self.logs[(session_id, stream_id)]
