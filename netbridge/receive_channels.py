"""The netbridge's receive side: the endpoints its bus subscribes to over udp, each with the
sans-IO :class:`~netbridge.receiver.NetworkReceiver` of its traffic, and the image logs the
driver makes for what their SETUPs announce.

Receive endpoints: one socket per endpoint, whatever the streams and channel parameters (those
of its first subscription apply). Whether it could be bound goes back to the driver, which
answers the waiting subscription (the error names the address and the process holding it); an
endpoint is closed ``Context.netbridge_endpoint_linger`` after its last stream went, so that
another process may bind it. A receive endpoint is keyed or not by its first subscription's
channel.

Here the datagrams are received (in-order DATA placed natively, :mod:`netbridge.datagram_io`),
the receivers polled when they have something to do, a dynamic multi-destination-cast
receiver's announcements sent, and the images' positions and the channels' statistics
mirrored into the driver's counters.
"""

from __future__ import annotations

import functools
import random
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

from netbridge import _io
from netbridge.bridge_side import BridgeSide
from netbridge.datagram_io import DatagramIO, send_to
from netbridge.driver_link import ChannelCounters, DriverLink
from netbridge.frames import SM_FLAG_SETUP, StatusMessage
from netbridge.loss_detector import multicast_nak_delay
from netbridge.loss_filter import LossFilter
from netbridge.receiver import RECEIVER_WINDOW_DEFAULT, NetworkReceiver
from netbridge.receiver_image import (
    ImageRequest,
    ImageResources,
    ImageUnavailable,
    ReceiverImage,
)
from netbridge.sealing import SEAL_STATS, ChannelSealers, KeyringError, seal_counts
from netbridge.shared_log import SharedImageLog
from netbridge.transport import ReceiveTransport, open_receive
from shmbus.settings.channel_uri import ChannelUri
from shmbus.settings.errors import RegistrationError, ShmbusError
from shmbus.shm import _native
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import RCV_CC_WINDOW
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position

__all__ = ["RECEIVE_CHANNEL_STAT", "RECEIVE_STATS", "ProgressWatch", "ReceiveChannel",
           "ReceiveChannels", "ReceivedImage"]

#: the counter type id of a receive channel's statistics
RECEIVE_CHANNEL_STAT: Final = 102
RECEIVE_STATS: Final = ("bytes received", "datagrams received", "datagrams in order",
                        "heartbeats received", "naks sent", "sms sent", "invalid datagrams",
                        "gaps", "bytes lost", "rtt ns")

#: how far an image's subscribers must read for a status message to fall due: (log buffer,
#: term length, their position counter's buffer and offset, that position)
ProgressWatch = tuple[_native.AtomicBuffer, int, _native.AtomicBuffer, int, int]

#: dynamic MDC receivers announce themselves this often (Aeron: 1 s)
_ANNOUNCE_INTERVAL_NS = 1_000_000_000


@dataclass
class ReceivedImage:
    """An image being rebuilt, with the driver's ids for it."""

    image_id: int
    log: LogBuffer
    rcv_hwm: Position
    rcv_pos: Position
    join_position: int
    #: the bridge's own counter of the window its congestion control advertises (None when
    #: the driver had no counter left)
    cc_window: tuple[int, Position] | None
    subscriber_positions: list[Position] | None = None  # None until the driver says
    #: the receiver's port over ``log`` (set once the image is made)
    port: SharedImageLog | None = None

    def subscriber_position(self) -> int:
        positions = self.subscriber_positions
        if positions is None:
            return self.join_position
        if not positions:
            return self.rcv_pos.get()  # nobody reads: do not hold the sender back
        return min(p.get() for p in positions)


@dataclass
class ReceiveChannel:
    """The sockets of one subscribed endpoint (the channel of its first subscription), with
    the receiver state machine for them."""

    channel: str
    transport: ReceiveTransport
    receiver: NetworkReceiver
    counters: ChannelCounters
    loss_out: LossFilter | None
    loss_in: LossFilter | None
    next_announce_ns: int = 0
    #: since when no stream is subscribed (None while one is): closed after the linger
    idle_since_ns: int | None = None
    #: how many images the counters were last mirrored for (a new one is mirrored at once)
    mirrored_images: int = 0
    #: datagrams came in this duty cycle for the receiver's state machine: it is polled
    heard: bool = False
    #: when the receiver's timers want the next poll
    next_poll_ns: int = 0
    #: an authenticated endpoint's key name and its sockets' sealer
    key: str | None = None
    sealer: _io.Sealer | None = None

    @property
    def sock(self) -> socket.socket:
        return self.transport.sock


def _default_window(sock: socket.socket) -> int:
    """A receive channel's window when its URI names none: RECEIVER_WINDOW_DEFAULT, or what
    the socket's receive buffer holds if that is less (a window beyond it overruns the buffer
    in a burst: loss to repair). Linux reports twice the bytes it grants to data."""
    return min(RECEIVER_WINDOW_DEFAULT, sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2)


class ReceiveChannels(BridgeSide[ReceiveChannel]):
    """The receive endpoints of one netbridge, by endpoint (ChannelUri.endpoint_key: one
    socket per endpoint, whatever the streams), and the images rebuilt on them.

    The arguments but the last two are :class:`~netbridge.bridge_side.BridgeSide`'s
    (``driver`` also makes the images); an endpoint without streams is closed after
    ``endpoint_linger_ns``; a receiver whose poll schedules nothing is polled again
    ``unscheduled_poll_ns`` later (the loop's longest sleep).
    """

    def __init__(self, driver: DriverLink, io: DatagramIO, sealers: ChannelSealers,
                 watcher: _native.FutexRing | _native.LogWatcher,
                 loss_filters: Callable[[], tuple[LossFilter | None, LossFilter | None]], *,
                 socket_buffer: int, endpoint_linger_ns: int, unscheduled_poll_ns: int) -> None:
        super().__init__(driver, io, sealers, watcher, loss_filters, socket_buffer=socket_buffer)
        self._endpoint_linger_ns = endpoint_linger_ns
        self._unscheduled_poll_ns = unscheduled_poll_ns
        self._images_by_id: dict[int, ReceivedImage] = {}
        # unique across hosts (client ids are only unique within one bus), as Aeron's are
        self._receiver_id = random.SystemRandom().getrandbits(63)
        #: what a dynamic MDC receiver sends its control address: an SM for session 0 and
        #: stream 0 with the SETUP flag
        self._announcement = StatusMessage(
            flags=SM_FLAG_SETUP, session_id=0, stream_id=0, consumption_term_id=0,
            consumption_term_offset=0, receiver_window=0, receiver_id=self._receiver_id).encode()

    def sockets(self) -> list[socket.socket]:
        return [sock for channel in self.channels.values() for sock in channel.transport.sockets()]

    # -- driver events -------------------------------------------------------------------------

    def add_subscription(self, event: cp.OnReceiveChannel) -> None:
        """Listen for the event's stream on its endpoint (opening the endpoint's sockets when
        nothing listens there yet) and tell the driver how that went when a subscription waits
        for it or when it failed."""
        error = ""
        try:
            channel = self._channel_for(event.channel)
        except (OSError, KeyringError) as e:  # e.g. another process holds the address
            error = str(e)
        else:
            channel.receiver.add_subscription(event.stream_id)
            channel.idle_since_ns = None
        if event.subscription_id or error:
            self._driver.receive_channel_status(event.subscription_id, event.stream_id,
                                                event.channel, error)

    def remove_subscription(self, event: cp.OnReceiveChannelClosed) -> None:
        """The stream's last subscription on the endpoint went: its images are closed; the
        endpoint lingers once no stream is left."""
        channel = self.channels.get(ChannelUri.parse(event.channel).endpoint_key())
        if channel is not None:
            now = time.monotonic_ns()
            channel.receiver.remove_subscription(event.stream_id, now)
            if not channel.receiver.subscriptions:
                channel.idle_since_ns = now

    def on_image_subscribers(self, event: cp.OnImageSubscribers) -> None:
        """The subscribers' position counters of an image (its status messages follow the
        slowest)."""
        image = self._images_by_id.get(event.image_id)
        if image is not None:
            ids = [int(i) for i in event.counter_ids.split(",") if i]
            image.subscriber_positions = [self._driver.counter(i) for i in ids]

    def _channel_for(self, channel_text: str) -> ReceiveChannel:
        """The endpoint's channel, opened now when nothing listens there (KeyringError when it
        is keyed otherwise than ``channel_text`` says)."""
        uri = ChannelUri.parse(channel_text)
        key = uri.endpoint_key()
        channel = self.channels.get(key)
        if (channel is not None and channel.key != uri.key and channel.idle_since_ns is not None
                and not channel.receiver.images):
            self._close_channel(key)  # lingering, unused: opened again with this key
            channel = None
        if channel is not None:
            if channel.key != uri.key:  # the driver refuses this first: a safety net
                keyed = f"keyed with {channel.key!r}" if channel.key else "not keyed"
                wants = f"names key {uri.key!r}" if uri.key else "names no key"
                raise KeyringError(f"endpoint {uri.params.get('endpoint', '')} is {keyed} (by "
                                   f"the channel it was opened for, {channel.channel!r}); "
                                   f"this channel {wants}: an endpoint is keyed or not")
            return channel
        sealer = self._sealers.sealer(uri)
        transport = open_receive(uri, self._socket_buffer)
        window = uri.int_param("rcv-wnd", _default_window(transport.sock))
        multicast = transport.control_address is not None
        holder: list[ReceiveChannel] = []
        receiver = NetworkReceiver(
            lambda request: self._create_image(holder[0], request),
            receiver_id=self._receiver_id, receiver_window=window,
            congestion_control=uri.congestion_control,
            group_tag=uri.int_param("gtag") if "gtag" in uri.params else None,
            control_address=transport.control_address,
            nak_delay=multicast_nak_delay(random.Random()) if multicast else None)
        channel = ReceiveChannel(channel_text, transport, receiver,
                                 self._driver.add_channel_counters(
                                     RECEIVE_CHANNEL_STAT, uri.canonical(),
                                     RECEIVE_STATS + (SEAL_STATS if sealer else ())),
                                 *self._loss_filters(), key=uri.key, sealer=sealer)
        holder.append(channel)
        self.channels[key] = channel
        return channel

    def _close_channel(self, key: tuple[str, ...]) -> None:
        """Let an endpoint go: its sockets are closed (another process may bind it at once)
        and its counters freed. Its images are gone already."""
        channel = self.channels.pop(key)
        for sock in channel.transport.sockets():
            sock.close()
        self._driver.remove_channel_counters(channel.counters)

    # -- images ----------------------------------------------------------------------------------

    def _create_image(self, channel: ReceiveChannel, request: ImageRequest
                      ) -> ImageResources | None:
        """The receiver's image factory: an image log from the driver, with its counters."""
        host, port = cast("tuple[str, int]", request.source)
        try:
            ready = self._driver.create_image(request, channel.channel, f"{host}:{port}")
        except ShmbusError as e:
            print(f"netbridge: cannot create an image: {e}", file=sys.stderr)
            return None
        log = LogBuffer.open(self._driver.directory / ready.log_file)
        label = (f"{ready.image_id} {request.session_id} {request.stream_id} "
                 f"{ChannelUri.parse(channel.channel).canonical()} {host}:{port}")
        try:
            cc_window: tuple[int, Position] | None = self._driver.add_counter(
                RCV_CC_WINDOW, f"rcv-cc-window: {label}", ready.image_id, request.session_id)
        except RegistrationError as e:  # e.g. no counter left: the image works without it
            print(f"netbridge: no rcv-cc-window counter for image {ready.image_id}: {e}",
                  file=sys.stderr)
            cc_window = None
        image = ReceivedImage(ready.image_id, log, self._driver.counter(ready.rcv_hwm_counter_id),
                              self._driver.counter(ready.rcv_pos_counter_id),
                              request.join_position, cc_window)
        self._images_by_id[ready.image_id] = image
        image.port = SharedImageLog(log, image.subscriber_position)
        return ImageResources(image.port)

    def _received(self, image: ReceiverImage) -> ReceivedImage | None:
        for received in self._images_by_id.values():
            if received.port is image.log:
                return received
        return None

    def _close_image(self, image: ReceiverImage) -> None:
        received = self._received(image)
        if received is None:
            return
        received.rcv_pos.set(image.rcv_pos)
        del self._images_by_id[received.image_id]
        try:
            if received.cc_window is not None:
                self._driver.remove_counter(received.cc_window[0])
            self._driver.close_image(received.image_id)
        except ShmbusError as e:
            print(f"netbridge: closing image {received.image_id}: {e}", file=sys.stderr)
        self._watcher.disarm(True)  # it may still be asleep on this log
        received.log.close()

    # -- datagrams in ----------------------------------------------------------------------------

    def receive(self, now: int, readable: set[int] | None) -> int:
        """Every readable socket's datagrams (``readable``: the file descriptors that have
        some, None: try every socket): DATA, SETUPs and RTTMs for the receivers, and on a
        multicast channel's control socket the other receivers' NAKs. Returns how many came."""
        io = self._io
        data = 0
        for channel in self.channels.values():
            receiver = channel.receiver
            count = handled = 0
            if readable is None or channel.sock.fileno() in readable:
                count, handled = io.receive(
                    channel.sock, now, functools.partial(receiver.on_datagram, now), receiver,
                    channel.loss_in, channel.sealer, self._sealers.drops_of(channel, now))
            control = channel.transport.control_sock  # multicast: others' NAKs
            if control is not None and (readable is None or control.fileno() in readable):
                heard = io.receive(control, now, functools.partial(self._on_nak_heard,
                                                                   receiver, now),
                                   sealer=channel.sealer,
                                   on_drops=self._sealers.drops_of(channel, now))[0]
                count += heard
                handled += heard
            # data placed in order natively changes no timer: only the others need a poll
            channel.heard = handled > 0
            data += count
        return data

    @staticmethod
    def _on_nak_heard(receiver: NetworkReceiver, now: int, data: memoryview,
                      _source: object) -> None:
        receiver.on_nak_heard(now, data)

    def _deliver_held(self, channel: ReceiveChannel, now: int
                      ) -> Callable[[bytes, object], None]:
        """Held-back datagrams are handed to the endpoint's receiver."""
        return functools.partial(channel.receiver.on_datagram, now)

    # -- the duty cycle ----------------------------------------------------------------------------

    def _poll_channel(self, key: tuple[str, ...], channel: ReceiveChannel, now: int,
                      stats: bool, poll_all: bool, work: int, deadline: int) -> tuple[int, int]:
        """The endpoint receiver's timers (NAKs, status messages, liveness) when it has
        something to do (datagrams came, subscribers read up to where a status message falls
        due, its timers are due, or ``poll_all``), its announcements, and the endpoint closed
        once the linger is over; mirror the counters (the channel's statistics when
        ``stats``)."""
        receiver = channel.receiver
        # dynamic MDC: announce while a subscription wants the channel (once the last one
        # goes, the sender drops this destination after its timeout)
        if (channel.transport.announce_to is not None and receiver.subscriptions
                and now >= channel.next_announce_ns):
            channel.next_announce_ns = now + _ANNOUNCE_INTERVAL_NS
            send_to(channel.sock, self._announcement, channel.transport.announce_to,
                    channel.sealer)
        if (poll_all or channel.heard or now >= channel.next_poll_ns
                or any(image.log.subscriber_position() >= image.sm_due_position
                       for image in receiver.images.values())):
            polled = receiver.poll(now)
            work += self._io.send(channel.sock, polled.datagrams, now, channel.loss_out,
                                  channel.sealer)
            for image_event in polled.events:
                if isinstance(image_event, ImageUnavailable):
                    self._close_image(image_event.image)
            channel.next_poll_ns = (polled.next_deadline_ns if polled.next_deadline_ns is not None
                                    else now + self._unscheduled_poll_ns)
        deadline = min(deadline, channel.next_poll_ns)
        if channel.idle_since_ns is not None and not receiver.images:
            if now - channel.idle_since_ns >= self._endpoint_linger_ns:
                self._close_channel(key)
                return work + 1, deadline
            deadline = min(deadline, channel.idle_since_ns + self._endpoint_linger_ns)
        if stats or len(receiver.images) != channel.mirrored_images:
            self._mirror_channel(channel)
        return work, deadline

    def progress_watches(self) -> tuple[ProgressWatch, ...]:
        """How far each image's subscribers must read for a status message to fall due, for
        the log watcher. A subscriber there already is left out: it waits for a slower one
        (the status message follows the slowest), and a watch that is ready must mean work to
        do."""
        progress = []
        for channel in self.channels.values():
            for image in channel.receiver.images.values():
                received = self._received(image)
                if received is not None and received.subscriber_positions:
                    due = image.sm_due_position
                    progress += [(received.log.buffer, image.term_length, p.buffer, p.offset,
                                  due)
                                 for p in received.subscriber_positions if p.get() < due]
        return tuple(progress)

    def _mirror_channel(self, channel: ReceiveChannel) -> None:
        r = channel.receiver
        channel.mirrored_images = len(r.images)
        for image in r.images.values():
            received = self._received(image)
            if received is not None:
                if received.rcv_hwm.get() != image.rcv_hwm:
                    received.rcv_hwm.set(image.rcv_hwm)
                if received.rcv_pos.get() != image.rcv_pos:
                    received.rcv_pos.set(image.rcv_pos)
                if received.cc_window is not None and received.cc_window[1].get() != image.window:
                    received.cc_window[1].set(image.window)
        channel.counters.update({
            "bytes received": r.bytes_received, "datagrams received": r.datagrams_received,
            "datagrams in order": r.datagrams_in_order,
            "heartbeats received": r.heartbeats_received, "naks sent": r.naks_sent,
            "sms sent": r.sms_sent, "invalid datagrams": r.invalid_datagrams,
            "gaps": r.gaps_detected, "bytes lost": r.bytes_lost,
            # the latest round-trip time of the channel's images (the worst of them), 0 if none
            "rtt ns": max((i.rtt_ns or 0 for i in r.images.values()), default=0),
            **(seal_counts(channel.sealer) if channel.sealer is not None else {}),
        })

    def close(self) -> None:
        """Close every endpoint's sockets and every image's log."""
        for channel in self.channels.values():
            for sock in channel.transport.sockets():
                sock.close()
        for image in self._images_by_id.values():
            image.log.close()
        self.channels.clear()
        self._images_by_id.clear()
