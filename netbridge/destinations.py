"""Where a multi-destination-cast publication sends
(docs/protocol.md, Channels and addressing).

Sans-IO bookkeeping of one send channel's destinations:

* manual (``control-mode=manual``): the application adds and removes destinations;
* dynamic (``control-mode=dynamic``): receivers announce themselves with status messages to
  the control address, and a destination silent for ``timeout_ns`` (Aeron: 5 s) is dropped.

The socket layer asks :meth:`DestinationTracker.changes` after feeding it and applies the
additions and removals to every sender of the channel (a new destination gets a SETUP).
"""

from __future__ import annotations

from typing import Final

#: Aeron's destination timeout for dynamic MDC.
DESTINATION_TIMEOUT_NS_DEFAULT: Final = 5_000_000_000


class DestinationTracker:
    """The destinations of one send channel: ``dynamic`` learns them from status messages."""

    def __init__(self, *, dynamic: bool, timeout_ns: int = DESTINATION_TIMEOUT_NS_DEFAULT) -> None:
        self.dynamic = dynamic
        self.timeout_ns = timeout_ns
        self._last_heard: dict[object, int] = {}
        self._added: list[object] = []
        self._removed: list[object] = []

    @property
    def destinations(self) -> list[object]:
        return list(self._last_heard)

    def add(self, destination: object, now_ns: int = 0) -> None:
        """A manual destination (or one heard from): send to it from now on."""
        if destination not in self._last_heard:
            self._added.append(destination)
        self._last_heard[destination] = now_ns

    def remove(self, destination: object) -> None:
        if self._last_heard.pop(destination, None) is not None or destination in self._added:
            self._removed.append(destination)

    def on_status_message(self, source: object, now_ns: int) -> None:
        """A status message came from ``source``: in dynamic mode that is a destination."""
        if self.dynamic:
            self.add(source, now_ns)

    def on_idle(self, now_ns: int) -> None:
        """Drop dynamic destinations silent for the timeout."""
        if not self.dynamic:
            return
        for destination, heard in list(self._last_heard.items()):
            if now_ns - heard > self.timeout_ns:
                self.remove(destination)

    def changes(self) -> tuple[list[object], list[object]]:
        """(added, removed) since the last call."""
        added, removed = self._added, self._removed
        self._added, self._removed = [], []
        return [d for d in added if d in self._last_heard], removed
