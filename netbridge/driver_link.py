"""The netbridge's link to its bus's driver: a client with extra rights (it registers as the
bridge), through which it asks for image logs, answers waiting subscriptions, allocates its own
counters, writes to the error log, and hears of network publications, receive channels,
destinations and image subscribers (docs/protocol.md, Control protocol).

Requests are made inside the bridge's duty cycle, on its one thread; the driver's events are
queued while they come (a request's answer may bring some) and handed to the duty cycle one at
a time, never handled inside another request.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from netbridge.receiver_image import ImageRequest
from shmbus import Client
from shmbus.settings.context import Context
from shmbus.settings.errors import ShmbusError
from shmbus.shm import control_protocol as cp
from shmbus.shm.position import Position

__all__ = ["ChannelCounters", "DriverLink"]


@dataclass
class ChannelCounters:
    """A channel's statistics: counters in cnc.dat, mirrored from plain ints."""

    #: by name: (counter id, position)
    counters: dict[str, tuple[int, Position]]
    #: the values as last written: a counter is written when its value changes, never read
    last: dict[str, int] = field(default_factory=dict)

    def update(self, values: dict[str, int]) -> None:
        last = self.last
        for name, value in values.items():
            if last.get(name) != value:
                counter = self.counters.get(name)
                if counter is not None:
                    counter[1].set(value)
                last[name] = value


class DriverLink:
    """The bridge's client of the driver of ``context``'s bus, registered as its netbridge.

    Requests raise ShmbusError as the client's do (RegistrationError when the driver refuses,
    DriverTimeoutError when it does not answer).
    """

    def __init__(self, context: Context) -> None:
        self.client = Client(context, conductor_thread=False)
        self._events: list[cp.Message] = []
        self.client.on_driver_event = self._events.append
        self._request(cp.RegisterBridge(self.client.client_id, self._correlation()))

    @property
    def directory(self) -> Path:
        """The bus directory, where the driver's log files are."""
        return self.client.directory

    def _correlation(self) -> int:
        return self.client._correlation()

    def _request(self, command: cp.Message) -> cp.Message:
        return self.client._request(command)

    # -- events --------------------------------------------------------------------------------

    def service(self) -> int:
        """Read what the driver sent (queueing its events); returns how many messages."""
        return self.client._service()

    @property
    def has_events(self) -> bool:
        return bool(self._events)

    def next_event(self) -> cp.Message | None:
        """The oldest event not yet handled, or None."""
        return self._events.pop(0) if self._events else None

    # -- commands ------------------------------------------------------------------------------

    def create_image(self, request: ImageRequest, channel: str, source: str) -> cp.OnImageReady:
        """An image log for what a SETUP from ``source`` announced on ``channel``."""
        ready = self._request(cp.CreateImage(
            self.client.client_id, self._correlation(), request.session_id,
            request.stream_id, request.initial_term_id, request.term_length, request.mtu,
            request.join_position, channel, source))
        assert isinstance(ready, cp.OnImageReady)
        return ready

    def close_image(self, image_id: int) -> None:
        self._request(cp.CloseImage(self.client.client_id, self._correlation(), image_id))

    def receive_channel_status(self, subscription_id: int, stream_id: int, channel: str,
                               error: str) -> None:
        """Tell the driver whether ``channel``'s endpoint could be listened on (``error``
        empty) or not (``error`` says why), for the subscription waiting for it (or 0)."""
        self._request(cp.ReceiveChannelStatus(
            self.client.client_id, self._correlation(), subscription_id, stream_id, channel,
            error))

    def report(self, text: str) -> None:
        """A line for the driver's error log (``shmbus errors``); on stderr when the driver
        cannot take it."""
        try:
            self._request(cp.ReportError(self.client.client_id, self._correlation(), text))
        except ShmbusError as e:
            print(f"netbridge: {text} (not logged: {e})", file=sys.stderr)

    # -- counters ------------------------------------------------------------------------------

    def counter(self, counter_id: int) -> Position:
        """The counter ``counter_id`` of cnc.dat, to read or write."""
        counters = self.client.counters
        return Position(counters.values, counters.counter_offset(counter_id))

    def add_counter(self, type_id: int, label: str, registration_id: int = 0,
                    reference_id: int = 0) -> tuple[int, Position]:
        """A counter of the bridge's own (freed with remove_counter or when it goes away)."""
        ready = self._request(cp.AddLinkedCounter(self.client.client_id, self._correlation(),
                                                  type_id, registration_id, reference_id,
                                                  label))
        assert isinstance(ready, cp.OnCounterReady)
        return ready.counter_id, self.counter(ready.counter_id)

    def remove_counter(self, counter_id: int) -> None:
        self._request(cp.FreeCounter(self.client.client_id, self._correlation(), counter_id))

    def add_channel_counters(self, type_id: int, channel: str, names: tuple[str, ...]
                             ) -> ChannelCounters:
        """One counter of ``type_id`` per name, labelled "<name>: <channel>"."""
        return ChannelCounters({name: self.add_counter(type_id, f"{name}: {channel}")
                                for name in names})

    def remove_channel_counters(self, counters: ChannelCounters) -> None:
        for counter_id, _ in counters.counters.values():
            self.remove_counter(counter_id)

    def close(self) -> None:
        self.client.close()
