"""What the driver tells its clients: broadcasts, and the refusals of their commands (Aeron's
ClientProxy).

Two broadcast buffers carry them. shmbus's clients read the events buffer, which has every
message in the order the driver sent it. Aeron's clients read cnc.dat's to-clients buffer,
which has only Aeron's responses (an Aeron client exits on a message type it does not know):
each of those is sent on both, with its log file's path made absolute for Aeron (shmbus's
clients resolve it against the bus directory as they see it). Every client hears every
broadcast and takes what is its own (an answer to its correlation id, an image of its
subscription). The clients' doorbell is rung once per duty cycle that broadcast something, not
once per message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from shmbus.driver.system_counters import SystemCounter
from shmbus.shm import control_protocol as cp
from shmbus.shm.broadcast import BroadcastTransmitter
from shmbus.shm.counters import CountersManager
from shmbus.shm.error_log import DistinctErrorLog


class CommandError(Exception):
    """A command the conductor refuses; becomes an ON_ERROR response."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ClientProxy:
    """The driver's side of the broadcast buffers, and its error log."""

    def __init__(self, events: BroadcastTransmitter, to_clients: BroadcastTransmitter,
                 counters: CountersManager, error_log: DistinctErrorLog,
                 ring_clients: Callable[[], None], directory: Path) -> None:
        self.events = events
        self._directory = directory.absolute()
        self.to_clients = to_clients
        self.error_log = error_log
        self._counters = counters
        self._ring_clients = ring_clients
        self._broadcasts = 0

    def send(self, message: cp.Message) -> None:
        """Broadcast ``message`` to every client (Aeron's clients hear Aeron's responses)."""
        data = message.encode()
        self.events.transmit(message.TYPE_ID, data)
        if message.TYPE_ID in cp.AERON_RESPONSES:
            if isinstance(message, cp.LOG_FILE_MESSAGES):  # Aeron maps the path as it is
                data = replace(message, log_file=str(self._directory / message.log_file)).encode()
            self.to_clients.transmit(message.TYPE_ID, data)
        self._broadcasts += 1

    def error(self, correlation_id: int, code: int, message: str,
              exc: BaseException | None = None) -> None:
        """Refuse the command ``correlation_id`` (ON_ERROR with ``code`` and ``message``),
        counted and recorded in the error log (``exc``, an internal error, with its
        traceback)."""
        self._counters.add(SystemCounter.ERRORS.value, 1)
        self.error_log.record(exc if exc is not None else f"command error {code}: {message}")
        self.send(cp.OnError(correlation_id, code, message))

    def record(self, text: str) -> None:
        """Count an error no command is refused for, and record ``text`` in the error log."""
        self._counters.add(SystemCounter.ERRORS.value, 1)
        self.error_log.record(text)

    def ring_if_sent(self) -> None:
        """Ring the clients' doorbell if anything was broadcast since the last ring."""
        if self._broadcasts:
            self._broadcasts = 0
            self._ring_clients()
