"""Shared-memory logs for the netbridge tests that need the real thing (the native batch paths
of netbridge.datagram_io and netbridge.shared_log): a publication log with a publisher, and an
image factory whose images a shmbus Image reads, as a subscriber would."""

from __future__ import annotations

import mmap
from pathlib import Path

from netbridge.receiver_image import ImageRequest, ImageResources
from netbridge.sender import NetworkSender
from netbridge.shared_log import SharedImageLog, SharedPublicationLog
from shmbus import AtomicBuffer, ExclusivePublication, Image
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position
from tests.support.sans_io import DEST, INITIAL, MTU, SESSION, STREAM, TERM


class PublicationLog:
    """A publication log with an exclusive publication whose limit the test sets, standing in
    for the driver: ``follow(sender_position)`` sets pub-lmt = snd-pos + term/2 and cleans the
    log one term behind the sender position (as a network publication's owner must).
    ``port`` is the sender's view of it."""

    def __init__(self, directory: Path, *, term_length: int = TERM,
                 initial_term_id: int = INITIAL, session_id: int = SESSION,
                 stream_id: int = STREAM, mtu: int = MTU, name: str = "pub.log") -> None:
        self.log = LogBuffer.create(
            directory / name, term_length=term_length, initial_term_id=initial_term_id,
            mtu=mtu, session_id=session_id, stream_id=stream_id,
        )
        self._mmap = mmap.mmap(-1, 4096)
        self._positions = AtomicBuffer(self._mmap)
        self.limit = Position(self._positions, 0)
        self.limit.set(term_length // 2)
        self.log.is_connected = True
        self.publication = ExclusivePublication(self.log, self.limit)
        self._cleaner = IpcFlowControl(self.log, self.limit)
        self.term_length = term_length
        self.port = SharedPublicationLog(self.log)

    def follow(self, sender_position: int) -> None:
        self._cleaner.clean_to(sender_position - self.term_length)
        self.limit.set(sender_position + self.term_length // 2)

    def offer(self, payload: bytes) -> int:
        result = self.publication.offer(payload)
        if result < 0:  # an admin action (term rotation) is retried once
            result = self.publication.offer(payload)
        return result

    def bytes_at(self, position: int, length: int) -> bytes:
        index = (position // self.term_length) % 3
        start = index * self.term_length + position % self.term_length
        return self.log.buffer.get_bytes(start, length)

    def close(self) -> None:
        self.publication.close()
        self._positions.release()
        self._mmap.close()
        self.log.close()


def make_sender(pub: PublicationLog, **kwargs: object) -> NetworkSender:
    return NetworkSender(pub.port, destination=DEST, **kwargs)  # type: ignore[arg-type]


class ImageHost:
    """The image factory: creates each image's log in ``directory`` and a shmbus Image over it
    that stands for the one subscriber; its position feeds the SMs."""

    def __init__(self, directory: Path, *, receiver_window: int | None = None) -> None:
        self.directory = directory
        self.receiver_window = receiver_window
        self._mmap = mmap.mmap(-1, 64 * 64)
        self._positions = AtomicBuffer(self._mmap)
        self.requests: list[ImageRequest] = []
        self.images: dict[tuple[int, int], Image] = {}
        self.logs: list[LogBuffer] = []

    def __call__(self, request: ImageRequest) -> ImageResources | None:
        self.requests.append(request)
        n = len(self.requests)
        log = LogBuffer.create(
            self.directory / f"image-{n}.log", term_length=request.term_length,
            initial_term_id=request.initial_term_id, mtu=request.mtu,
            session_id=request.session_id, stream_id=request.stream_id,
        )
        self.logs.append(log)
        image = Image(log, Position(self._positions, 64 * n), join_position=request.join_position)
        self.images[(request.session_id, request.stream_id)] = image
        return ImageResources(SharedImageLog(log, lambda: image.position), self.receiver_window)

    def image(self, session_id: int = SESSION, stream_id: int = STREAM) -> Image:
        return self.images[(session_id, stream_id)]

    def read(self, session_id: int = SESSION, stream_id: int = STREAM) -> list[bytes]:
        """Every fragment the subscriber can read now, as bytes."""
        got: list[bytes] = []
        image = self.image(session_id, stream_id)
        while image.poll(lambda buffer, header: got.append(bytes(buffer)), 1000):
            pass
        return got

    def close(self) -> None:
        self.images.clear()
        for log in self.logs:
            log.close()
        self._positions.release()
        self._mmap.close()
