"""The files of a bus the driver makes and deletes: the logs (``logs/<id>.log``) of publications
and network images, and the block rings of IPC publications (``logs/<id>.blocks``, their large
messages; shmbus/shm/block_ring.py), and the room they need on the bus's filesystem.

A block ring keeps the warm pages at its beginning once used. When a new file does not fit
(ENOSPC), every ring first gives back the warm pages no live block holds, then the file is
tried once more.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shmbus.driver.system_counters import SystemCounter
from shmbus.settings.context import Context
from shmbus.shm.block_ring import BlockRing, ring_path
from shmbus.shm.counters import CountersManager
from shmbus.shm.log_buffer import LogBuffer

#: the folder of the bus directory the logs and block rings are in
LOGS_DIR = "logs"
_T = TypeVar("_T")


class LogFiles:
    """The driver's logs and block rings in ``directory``; it knows the rings it made until
    they are deleted."""

    def __init__(self, context: Context, directory: Path, counters: CountersManager) -> None:
        self._context = context
        self.directory = directory
        self._counters = counters
        #: the block rings made and not yet deleted, oldest first
        self._rings: list[BlockRing] = []

    def create_log(self, log_file: str, **layout: int) -> LogBuffer:
        """Create the log ``log_file`` (relative to the directory; ``layout``: the arguments
        of LogBuffer.create), making room if it does not fit (see :meth:`create_with_room`)."""
        return self.create_with_room(lambda: LogBuffer.create(self.directory / log_file,
                                                              **layout))

    def create_ring(self, log_file: str) -> BlockRing:
        """Create the block ring beside the log ``log_file``, making room if it does not fit."""
        ring = self.create_with_room(lambda: BlockRing.create(
            ring_path(self.directory / log_file), self._context.max_large_message_length,
            self._context.large_message_warm_share))
        self._rings.append(ring)
        return ring

    def create_with_room(self, create: Callable[[], _T]) -> _T:
        """``create()`` a file of the bus (a log, a block ring); when the filesystem has no
        room for it (ENOSPC), the block rings first give back the warm pages no live block
        holds (BlockRing.give_back_warm), then it is tried once more: a second failure, or a
        first one with nothing to give back, is the error as it is (with the sizes)."""
        try:
            return create()
        except OSError as e:
            if e.errno != errno.ENOSPC or not self._give_back_warm():
                raise
        return create()

    def _give_back_warm(self) -> int:
        """Every block ring's warm pages that no live block holds go back to the filesystem;
        returns the bytes given back (also counted)."""
        freed = sum(ring.give_back_warm() for ring in self._rings)
        if freed:
            self._counters.add(SystemCounter.WARM_BYTES_GIVEN_BACK.value, freed)
        return freed

    def discard(self, log: LogBuffer, log_file: str) -> None:
        """Undo the creation of the log ``log_file``, nothing else having used it yet."""
        log.close()
        os.unlink(self.directory / log_file)

    def delete(self, log: LogBuffer, log_file: str, ring: BlockRing | None = None) -> None:
        """Unmap and delete the log ``log_file`` and its block ring ``ring`` (files already
        gone are no error)."""
        log.close()
        paths = [self.directory / log_file]
        if ring is not None:
            self._rings.remove(ring)
            ring.close()
            paths.append(ring.path)
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
