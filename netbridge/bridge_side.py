"""One side of the netbridge, sending (:mod:`netbridge.send_channels`) or receiving
(:mod:`netbridge.receive_channels`): what both sides have the same way.

A side works with the same collaborators (the driver link, the datagram I/O, the channel
sealers, the loop's log watcher, the loss filters' source and the socket buffer size), keeps
its channels by key, polls them one by one in the duty cycle and releases what their loss
filters held back. How a channel is polled and where its held-back incoming datagrams go is
the side's own.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from netbridge.datagram_io import DatagramIO, release_held
from netbridge.driver_link import DriverLink
from netbridge.loss_filter import LossFilter
from netbridge.sealing import ChannelSealers, KeyedChannel
from shmbus.shm import _native

__all__ = ["BridgeSide", "SideChannel"]


class SideChannel(KeyedChannel, Protocol):
    """A channel of either side as the side's shared part sees it: its (first) socket and its
    (outgoing, incoming) loss filters, besides what its sealing sees."""

    @property
    def sock(self) -> socket.socket: ...

    @property
    def loss_out(self) -> LossFilter | None: ...

    @property
    def loss_in(self) -> LossFilter | None: ...


_Channel = TypeVar("_Channel", bound=SideChannel)


class BridgeSide(ABC, Generic[_Channel]):
    """The channels of one side of a netbridge, by key (``channels``).

    ``driver`` is the bridge's link to its driver; ``io`` sends and receives the channels'
    datagrams; ``sealers`` seals a keyed channel's; ``watcher`` is the loop's log watcher (it
    may be asleep on a log about to be closed); ``loss_filters`` gives a new channel its
    (outgoing, incoming) loss filters; ``socket_buffer`` sizes the sockets.
    """

    def __init__(self, driver: DriverLink, io: DatagramIO, sealers: ChannelSealers,
                 watcher: _native.FutexRing | _native.LogWatcher,
                 loss_filters: Callable[[], tuple[LossFilter | None, LossFilter | None]], *,
                 socket_buffer: int) -> None:
        self._driver = driver
        self._io = io
        self._sealers = sealers
        self._watcher = watcher
        self._loss_filters = loss_filters
        self._socket_buffer = socket_buffer
        self.channels: dict[tuple[str, ...], _Channel] = {}

    def poll(self, now: int, deadline: int, *, stats: bool, poll_all: bool) -> tuple[int, int]:
        """Poll every channel (:meth:`_poll_channel`; a channel may close meanwhile). Returns
        the work done and ``deadline`` lowered to when a channel wants its next poll."""
        work = 0
        for key, channel in list(self.channels.items()):
            work, deadline = self._poll_channel(key, channel, now, stats, poll_all, work,
                                                deadline)
        return work, deadline

    @abstractmethod
    def _poll_channel(self, key: tuple[str, ...], channel: _Channel, now: int, stats: bool,
                      poll_all: bool, work: int, deadline: int) -> tuple[int, int]:
        """One channel's part of :meth:`poll`: ``work`` and ``deadline`` updated with it."""

    def release_held(self, now: int, deadline: int) -> tuple[int, int]:
        """What the channels' loss filters held back and is due: sent, or handed to
        :meth:`_deliver_held`. Returns how many, and ``deadline`` lowered to the filters' next
        one."""
        work = 0
        for channel in self.channels.values():
            count, held = release_held(now, channel.sock, channel.sealer, channel.loss_out,
                                       channel.loss_in, self._deliver_held(channel, now))
            work += count
            if held is not None:
                deadline = min(deadline, held)
        return work, deadline

    @abstractmethod
    def _deliver_held(self, channel: _Channel, now: int) -> Callable[[bytes, object], None]:
        """Where ``channel``'s incoming datagrams that its loss filter held back go (with
        their source) when they are due at ``now``."""
