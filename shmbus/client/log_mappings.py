"""The logs a client maps: one mapping per log file, shared by its publications and images.

A concurrent publication added twice, or a publication and an image of it in the same client,
use the same log: it is mapped once and counted, and the last user to go unmaps it. An image
the conductor removes may still be read by a handler on another thread, so its log lingers
mapped for a while before it is unmapped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from shmbus.shm.log_buffer import LogBuffer

#: how long a removed image's log stays mapped: a handler may still hold a view into it
LOG_LINGER_S = 3.0


class LogMappings:
    """The logs of one client's bus directory it has mapped, by file name, with their users.

    Not thread-safe: the client calls it under its lock. Iterating gives the names mapped.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._logs: dict[str, tuple[LogBuffer, int]] = {}
        #: (when to unmap, log) of removed images' logs, oldest first
        self._lingering: list[tuple[float, LogBuffer]] = []
        #: set once the client failed: nothing is unmapped here from then on
        self._abandoned = False

    def map(self, log_file: str) -> LogBuffer:
        """The log ``log_file`` (relative to the bus directory), mapped for one more user.
        Raises as LogBuffer.open does (the driver deleted it meanwhile, ...)."""
        entry = self._logs.get(log_file)
        if entry is None:
            log = LogBuffer.open(self._directory / log_file)
            self._logs[log_file] = (log, 1)
            return log
        self._logs[log_file] = (entry[0], entry[1] + 1)
        return entry[0]

    def unmap(self, log: LogBuffer, *, linger: bool = False) -> None:
        """One user fewer; the last one unmaps it (its users are closed by then).

        ``linger``: another thread may still be reading it (an image the conductor removed),
        so it is unmapped only after LOG_LINGER_S. A failed client unmaps nothing: the
        mappings go with their last reference.
        """
        for name, (mapped, count) in list(self._logs.items()):
            if mapped is log:
                if count > 1:
                    self._logs[name] = (mapped, count - 1)
                else:
                    del self._logs[name]
                    if linger:
                        self._lingering.append((time.monotonic() + LOG_LINGER_S, mapped))
                    elif not self._abandoned:
                        mapped.close()
                return

    def set_aside(self, why: str) -> None:
        """The driver that made these logs is gone: its logs keep their users but no longer
        answer to their names (``why`` is added to each), since the next driver names its
        logs as this one did."""
        self._logs = {f"{name} ({why})": entry for name, entry in self._logs.items()}

    def unmap_expired(self, now: float) -> None:
        """Unmap the lingering logs whose time (``time.monotonic()``) has come by ``now``."""
        while self._lingering and self._lingering[0][0] <= now:
            self._lingering.pop(0)[1].close()

    def abandon(self) -> None:
        """The client failed: unmap nothing from now on (a handler may still hold a view)."""
        self._abandoned = True

    def close(self) -> None:
        """Unmap every log, lingering ones too (unless abandoned), and forget them all."""
        if not self._abandoned:
            for log, _ in self._logs.values():
                log.close()
            for _, log in self._lingering:
                log.close()
        self._logs.clear()
        self._lingering.clear()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._logs))
