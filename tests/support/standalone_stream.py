"""One IPC stream without a driver: a log file plus a small positions file, for tests and
benchmarks of the data plane. The process that calls ``update_limit`` stands in for the
driver's IPC flow control (limit = slowest reader + window, cleaning behind it).

Every process opens the same two files by path, so spawned processes share the stream.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from shmbus import AtomicBuffer, ConcurrentPublication, ExclusivePublication, Image
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position

POSITIONS_LENGTH = 4096
LIMIT_OFFSET = 0


def reader_offset(reader: int) -> int:
    """Each reader's position sits on its own cache line."""
    return 64 * (reader + 1)


class StandaloneStream:
    """Opens (or with ``create``, makes) the stream in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = False,
                 **log_args: int) -> None:
        directory = Path(directory)
        self.directory = directory
        if create:
            self.log = LogBuffer.create(directory / "stream.log", **log_args)
            fd = os.open(directory / "positions", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, POSITIONS_LENGTH)
        else:
            self.log = LogBuffer.open(directory / "stream.log")
            fd = os.open(directory / "positions", os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, POSITIONS_LENGTH)
        finally:
            os.close(fd)
        self.positions = AtomicBuffer(self._mmap)
        self.limit = Position(self.positions, LIMIT_OFFSET)
        self._flow: IpcFlowControl | None = None
        if create:
            self.log.is_connected = True
            self.update_limit([0])

    def publication(self, exclusive: bool = False) -> ExclusivePublication | ConcurrentPublication:
        kind = ExclusivePublication if exclusive else ConcurrentPublication
        return kind(self.log, self.limit)

    def image(self, reader: int = 0) -> Image:
        return Image(self.log, Position(self.positions, reader_offset(reader)))

    def update_limit(self, reader_positions: list[int]) -> int:
        """Act as the driver: raise the limit behind the slowest reader, cleaning behind it."""
        if self._flow is None:
            self._flow = IpcFlowControl(self.log, self.limit)
        return self._flow.update(reader_positions)

    def close(self) -> None:
        self.positions.release()
        self._mmap.close()
        self.log.close()
