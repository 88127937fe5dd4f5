"""The netbridge process: the socket layer around the sans-IO sender and receiver.

It is a client of its bus's driver with extra rights (it registers as the bridge). The driver
tells it about publications on udp channels (it sends them from their logs) and subscriptions
on udp channels (it listens on their endpoints and asks the driver for an image log when a
SETUP arrives). Here are the sockets, the clock, the counters and the loop; the protocol's
rules live elsewhere:

* what a sender sends and when, and what a receiver answers, places and NAKs: the sans-IO
  state machines :mod:`netbridge.sender` and :mod:`netbridge.receiver` (with
  :mod:`netbridge.flow_control`, :mod:`netbridge.congestion_control`,
  :mod:`netbridge.loss_detector`), which touch logs only through :mod:`netbridge.log_port`;
* where a received datagram goes in an image: :mod:`netbridge.placement`;
* who a multi-destination-cast channel sends to: :mod:`netbridge.destinations`, fed here (the
  bridge reads each control datagram's type and key to route it, and sends a dynamic MDC
  receiver's announcements, status messages for no stream, itself);
* the frame layout on the wire: :mod:`netbridge.frames`;
* the per-frame loops over logs and datagrams (the sender's scan into datagrams, the
  receiver's check of frame headers and copy into the log): native, behind
  :mod:`netbridge.shared_log`, the ports over the shared-memory logs;
* two fast paths the bridge runs natively as batches of those same steps, accounted by the
  state machines: in-order DATA placed as it is received (:mod:`netbridge.datagram_io`,
  ``ReceiverImage.on_in_order_data``), and a sender's new DATA scanned and sent by the busy
  spin (:meth:`Bridge.run`, ``NetworkSender.spin_send`` and ``on_data_sent``).

Receive endpoints: one socket per endpoint, whatever the streams and channel parameters (those
of its first subscription apply). Whether it could be bound goes back to the driver, which
answers the waiting subscription (the error names the address and the process holding it); an
endpoint is closed ``Context.netbridge_endpoint_linger`` after its last stream went, so that
another process may bind it.

Authenticated channels (``key=<name>``): each of their sockets has a Sealer
(:mod:`netbridge.sealing`) that seals what it sends and opens what it receives, before any
protocol rule sees a datagram; the keyring (``Context.keyring``) is reread when it changes.
A receive endpoint is keyed or not by its first subscription's channel, and a send channel is
one socket per endpoint and key.

Start it by hand with ``netbridge --dir DIR``, or let the driver start it when the first udp
channel appears.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from netbridge import _io
from netbridge.datagram_io import DatagramIO, send_to
from netbridge.destinations import DestinationTracker
from netbridge.flow_control import strategy_for
from netbridge.frames import HDR_TYPE_SM, SETUP_FLAG_GROUP, SM_FLAG_SETUP, StatusMessage
from netbridge.log_port import Scan
from netbridge.loss_detector import multicast_nak_delay
from netbridge.loss_filter import LossFilter, LossSpec
from netbridge.receiver import RECEIVER_WINDOW_DEFAULT, NetworkReceiver
from netbridge.receiver_image import (
    ImageRequest,
    ImageResources,
    ImageUnavailable,
    ReceiverImage,
)
from netbridge.sealing import (
    SEAL_STATS,
    DropReports,
    KeyringError,
    KeyringWatch,
    new_sealer,
    rekey,
    seal_counts,
)
from netbridge.sender import NetworkSender
from netbridge.shared_log import (
    NativeSend,
    SharedImageLog,
    SharedPublicationLog,
    native_send,
    send_now,
    sent,
)
from netbridge.transport import (
    ReceiveTransport,
    SendTransport,
    open_receive,
    open_send,
    parse_address,
)
from shmbus import Client
from shmbus.settings.channel_uri import ChannelUri
from shmbus.settings.context import Context
from shmbus.settings.errors import RegistrationError, ShmbusError
from shmbus.settings.keyring import keyring_path
from shmbus.shm import _native
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import FC_RCV_POS, FC_RECEIVERS, RCV_CC_WINDOW
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.log_watchers import new_log_watcher
from shmbus.shm.position import Position

#: counter type ids of the netbridge's per-channel statistics
SEND_CHANNEL_STAT = 101
RECEIVE_CHANNEL_STAT = 102

SEND_STATS = ("bytes sent", "datagrams sent", "heartbeats sent", "retransmits",
              "naks received", "sms received", "invalid datagrams", "destinations")
RECEIVE_STATS = ("bytes received", "datagrams received", "datagrams in order",
                 "heartbeats received", "naks sent", "sms sent", "invalid datagrams", "gaps",
                 "bytes lost", "rtt ns")

_SESSION_STREAM = struct.Struct("<ii")
_SENDER_LINGER_NS = 2_000_000_000
#: dynamic MDC receivers announce themselves this often (Aeron: 1 s)
_ANNOUNCE_INTERVAL_NS = 1_000_000_000
#: driver events are serviced, and channel statistics mirrored, at most this often (not at
#: every duty cycle: under load a duty cycle takes a few microseconds)
_SERVICE_INTERVAL_NS = 200_000
_STATS_INTERVAL_NS = 1_000_000
#: with nothing to do the bridge sleeps until a datagram, a publisher's frame where a sender
#: waits, subscribers reading up to where a status message falls due, or its next deadline,
#: but at most this long: driver events (new channels) have no wake-up of their own
_IDLE_WAIT_MAX_NS = 20_000_000
#: the log watcher's (data, progress) watches: see Bridge._watches
Watches = tuple[tuple[tuple[_native.AtomicBuffer, int, int], ...],
                tuple[tuple[_native.AtomicBuffer, int, _native.AtomicBuffer, int, int], ...]]
_NO_END_OF_STREAM = (1 << 63) - 1  # a log's end-of-stream position while it is open
#: at most this many fc-rcv-pos counters per publication (a flood of status messages with
#: made-up receiver ids must not use up the counters)
_RECEIVER_COUNTERS_PER_SENDER = 64
#: the keyring file is looked at this often for a change
_KEYRING_CHECK_NS = 1_000_000_000


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


@dataclass
class Sender:
    """One network publication being sent."""

    registration_id: int
    sender: NetworkSender
    log: LogBuffer
    snd_pos: Position
    snd_lmt: Position
    snd_bpe: Position
    #: "<registration> <session> <stream> <channel>": how its counters' labels name it
    label: str
    #: the bridge's own counters for it: fc-receivers, then one fc-rcv-pos per receiver
    fc_receivers: tuple[int, Position]
    receiver_positions: dict[int, tuple[int, Position]] = field(default_factory=dict)
    counters_refused: bool = False  # the driver refused an fc-rcv-pos counter: ask no more
    closed_at_ns: int | None = None
    #: when its timers want the next poll (it is polled sooner for a datagram or a frame)
    next_poll_ns: int = 0
    #: (snd-pos, snd-lmt, snd-bpe, connected) as last written: counters are written only when
    #: the sender's own value changes, never read back (the driver may free and reuse them)
    mirrored: tuple[int, int, int, int] = (-1, -1, -1, -1)

    def counter_ids(self) -> list[int]:
        """The ids of the counters the bridge allocated for this sender."""
        return [self.fc_receivers[0], *(c for c, _ in self.receiver_positions.values())]


@dataclass
class SendChannel:
    """One socket sending to one endpoint (or group, or set of destinations), shared by every
    publication on the channel."""

    channel: str
    transport: SendTransport
    counters: ChannelCounters
    loss_out: LossFilter | None
    loss_in: LossFilter | None
    #: multi-destination-cast: who gets the data
    tracker: DestinationTracker | None = None
    senders: dict[tuple[int, int], Sender] = field(default_factory=dict)
    invalid: int = 0
    #: a status message or NAK came in this duty cycle: its senders are polled
    heard: bool = False
    #: an authenticated channel's key name and its socket's sealer
    key: str | None = None
    sealer: _io.Sealer | None = None

    @property
    def sock(self) -> socket.socket:
        return self.transport.sock

    def apply_destinations(self) -> None:
        """Tell every sender about destinations added or dropped since the last call."""
        if self.tracker is None:
            return
        added, removed = self.tracker.changes()
        for sender in self.senders.values():
            for destination in added:
                sender.sender.add_destination(destination)
            for destination in removed:
                sender.sender.remove_destination(destination)


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


class Bridge:
    """The netbridge of one bus. ``run()`` serves until the driver goes away or stop()."""

    def __init__(self, context: Context) -> None:
        self.context = context.with_(embedded_driver=False)
        self._loss_spec = LossSpec.parse(context.netbridge_loss)
        self.send_channels: dict[tuple[str, ...], SendChannel] = {}
        #: by endpoint (ChannelUri.endpoint_key): one socket per endpoint, whatever the streams
        self.receive_channels: dict[tuple[str, ...], ReceiveChannel] = {}
        self._endpoint_linger_ns = int(context.netbridge_endpoint_linger * 1e9)
        self._connection_timeout_ns = int(context.publication_connection_timeout * 1e9)
        self._busy_window_ns = int(context.netbridge_busy_window * 1e9)
        self._images_by_id: dict[int, ReceivedImage] = {}
        self._stopped = False
        self._next_service_ns = 0
        self._next_stats_ns = 0
        #: poll every sender and receiver in the next duty cycle (after driver events)
        self._poll_all = True
        self._io = DatagramIO()
        self._keyring = KeyringWatch(keyring_path(context.keyring))
        self._next_keyring_check_ns = 0
        self._drop_reports = DropReports()
        #: wakes the loop when a publisher commits a frame where a sender waits for data, or
        #: subscribers read up to where a status message falls due
        self._watcher = new_log_watcher()
        #: the fds the loop polls and a poll object on them (None: made again, see _polled)
        self._poller: tuple[tuple[int, ...], select.poll] | None = None
        self.client = Client(self.context, conductor_thread=False)
        # unique across hosts (client ids are only unique within one bus), as Aeron's are
        self._receiver_id = random.SystemRandom().getrandbits(63)
        #: what a dynamic MDC receiver sends its control address: an SM for session 0 and
        #: stream 0 with the SETUP flag
        self._announcement = StatusMessage(
            flags=SM_FLAG_SETUP, session_id=0, stream_id=0, consumption_term_id=0,
            consumption_term_offset=0, receiver_window=0, receiver_id=self._receiver_id).encode()
        # events are queued and handled in do_work, never inside another request
        self._events: list[cp.Message] = []
        self.client.on_driver_event = self._events.append
        self._request(cp.RegisterBridge(self.client.client_id, self._correlation()))

    # -- driver events -------------------------------------------------------------------------

    def _correlation(self) -> int:
        return self.client._correlation()

    def _request(self, command: cp.Message) -> cp.Message:
        return self.client._request(command)

    def _on_driver_event(self, message: cp.Message) -> None:
        if isinstance(message, cp.OnNetworkPublication):
            self._add_sender(message)
        elif isinstance(message, cp.OnNetworkPublicationClosed):
            for channel in self.send_channels.values():
                for sender in channel.senders.values():
                    if sender.registration_id == message.registration_id:
                        sender.sender.close(message.end_position)
        elif isinstance(message, cp.OnReceiveChannelClosed):
            receive_channel = self.receive_channels.get(
                ChannelUri.parse(message.channel).endpoint_key())
            if receive_channel is not None:
                now = time.monotonic_ns()
                receive_channel.receiver.remove_subscription(message.stream_id, now)
                if not receive_channel.receiver.subscriptions:
                    receive_channel.idle_since_ns = now
        elif isinstance(message, cp.OnReceiveChannel):
            self._on_receive_channel(message)
        elif isinstance(message, cp.OnDestination):
            self._on_destination(message)
        elif isinstance(message, cp.OnImageSubscribers):
            image = self._images_by_id.get(message.image_id)
            if image is not None:
                ids = [int(i) for i in message.counter_ids.split(",") if i]
                image.subscriber_positions = [self._counter(i) for i in ids]

    def _counter(self, counter_id: int) -> Position:
        counters = self.client.counters
        return Position(counters.values, counters.counter_offset(counter_id))

    def _add_counter(self, type_id: int, label: str, registration_id: int = 0,
                     reference_id: int = 0) -> tuple[int, Position]:
        """A counter of the bridge's own (freed with _remove_counter or when it goes away)."""
        ready = self._request(cp.AddCounter(self.client.client_id, self._correlation(), type_id,
                                            registration_id, reference_id, label))
        assert isinstance(ready, cp.OnCounterReady)
        return ready.counter_id, self._counter(ready.counter_id)

    def _remove_counter(self, counter_id: int) -> None:
        self._request(cp.RemoveCounter(self.client.client_id, self._correlation(), counter_id))

    def _add_counters(self, kind: int, channel: str, names: tuple[str, ...]) -> ChannelCounters:
        return ChannelCounters({name: self._add_counter(kind, f"{name}: {channel}")
                                for name in names})

    def _loss_filters(self) -> tuple[LossFilter | None, LossFilter | None]:
        """(outgoing, incoming) filters for a new channel, each with its own seed."""
        spec = self._loss_spec
        if spec is None:
            return None, None
        count = 2 * (len(self.send_channels) + len(self.receive_channels))
        out = LossFilter(dataclasses.replace(spec, seed=spec.seed * 1000 + count))
        into = LossFilter(dataclasses.replace(spec, seed=spec.seed * 1000 + count + 1))
        return (out if spec.outgoing else None), (into if spec.incoming else None)

    def _sealer(self, uri: ChannelUri) -> _io.Sealer | None:
        """A new Sealer for an authenticated channel, None for plaintext (KeyringError when
        the keyring cannot seal its key)."""
        return None if uri.key is None else new_sealer(self._keyring.keyring(), uri.key)

    def _add_sender(self, event: cp.OnNetworkPublication) -> None:
        uri = ChannelUri.parse(event.channel)
        key = (*uri.endpoint_key(), uri.key or "")
        channel = self.send_channels.get(key)
        if channel is None:
            sealer = self._sealer(uri)
            transport = open_send(uri, self.context.netbridge_socket_buffer)
            tracker = (DestinationTracker(dynamic=transport.control_mode == "dynamic")
                       if transport.control_mode else None)
            channel = SendChannel(event.channel, transport, self._add_counters(
                SEND_CHANNEL_STAT, uri.canonical(), SEND_STATS + (SEAL_STATS if sealer else ())),
                *self._loss_filters(), tracker=tracker, key=uri.key, sealer=sealer)
            self.send_channels[key] = channel
            self._poller = None
        log = LogBuffer.open(self.client.directory / event.log_file)
        snd_pos = self._counter(event.snd_pos_counter_id)
        transport = channel.transport
        destinations: list[object] = list(transport.destinations)
        if channel.tracker is not None:
            destinations += channel.tracker.destinations
        sender = NetworkSender(
            SharedPublicationLog(log), destination=None, position=snd_pos.get(),
            mtu=uri.int_param("mtu", log.descriptor.mtu), ttl=uri.int_param("ttl", 0),
            flow_control=strategy_for(uri),
            setup_flags=SETUP_FLAG_GROUP if transport.group else 0, data_batches=True,
            connection_timeout_ns=self._connection_timeout_ns)
        for destination in destinations:
            sender.add_destination(destination)
        label = (f"{event.registration_id} {event.session_id} {event.stream_id} "
                 f"{uri.canonical()}")
        channel.senders[(event.session_id, event.stream_id)] = Sender(
            event.registration_id, sender, log, snd_pos, self._counter(event.snd_lmt_counter_id),
            self._counter(event.snd_bpe_counter_id), label, self._add_counter(
                FC_RECEIVERS, f"fc-receivers: {label}", event.registration_id,
                event.session_id))

    def _on_destination(self, event: cp.OnDestination) -> None:
        for channel in self.send_channels.values():
            if channel.tracker is None:
                continue
            if any(s.registration_id == event.registration_id for s in channel.senders.values()):
                destination = parse_address(event.destination)
                if event.added:
                    channel.tracker.add(destination)
                else:
                    channel.tracker.remove(destination)
                channel.apply_destinations()

    def _on_receive_channel(self, event: cp.OnReceiveChannel) -> None:
        """Listen for the event's stream on its endpoint (opening the endpoint's sockets when
        nothing listens there yet) and tell the driver how that went when a subscription waits
        for it or when it failed."""
        error = ""
        try:
            channel = self._receive_channel(event.channel)
        except (OSError, KeyringError) as e:  # e.g. another process holds the address
            error = str(e)
        else:
            channel.receiver.add_subscription(event.stream_id)
            channel.idle_since_ns = None
        if event.subscription_id or error:
            self._request(cp.ReceiveChannelStatus(
                self.client.client_id, self._correlation(), event.subscription_id,
                event.stream_id, event.channel, error))

    def _receive_channel(self, channel_text: str) -> ReceiveChannel:
        uri = ChannelUri.parse(channel_text)
        key = uri.endpoint_key()
        channel = self.receive_channels.get(key)
        if (channel is not None and channel.key != uri.key and channel.idle_since_ns is not None
                and not channel.receiver.images):
            self._close_receive_channel(key)  # lingering, unused: opened again with this key
            channel = None
        if channel is not None:
            if channel.key != uri.key:  # the driver refuses this first: a safety net
                keyed = f"keyed with {channel.key!r}" if channel.key else "not keyed"
                wants = f"names key {uri.key!r}" if uri.key else "names no key"
                raise KeyringError(f"endpoint {uri.params.get('endpoint', '')} is {keyed} (by "
                                   f"the channel it was opened for, {channel.channel!r}); "
                                   f"this channel {wants}: an endpoint is keyed or not")
            return channel
        sealer = self._sealer(uri)
        transport = open_receive(uri, self.context.netbridge_socket_buffer)
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
        channel = ReceiveChannel(channel_text, transport, receiver, self._add_counters(
            RECEIVE_CHANNEL_STAT, uri.canonical(), RECEIVE_STATS + (SEAL_STATS if sealer else ())),
            *self._loss_filters(), key=uri.key, sealer=sealer)
        holder.append(channel)
        self.receive_channels[key] = channel
        self._poller = None
        return channel

    def _close_send_channel(self, key: tuple[str, ...]) -> None:
        """Let a channel whose last publication went go: its socket is closed and its
        counters freed (a new publication on it opens it again)."""
        channel = self.send_channels.pop(key)
        self._poller = None
        channel.sock.close()
        for counter_id, _ in channel.counters.counters.values():
            self._remove_counter(counter_id)

    def _close_receive_channel(self, key: tuple[str, ...]) -> None:
        """Let an endpoint go: its sockets are closed (another process may bind it at once)
        and its counters freed. Its images are gone already."""
        channel = self.receive_channels.pop(key)
        self._poller = None
        for sock in channel.transport.sockets():
            sock.close()
        for counter_id, _ in channel.counters.counters.values():
            self._remove_counter(counter_id)

    def _create_image(self, channel: ReceiveChannel, request: ImageRequest
                      ) -> ImageResources | None:
        host, port = cast("tuple[str, int]", request.source)
        try:
            ready = self._request(cp.CreateImage(
                self.client.client_id, self._correlation(), request.session_id,
                request.stream_id, request.initial_term_id, request.term_length, request.mtu,
                request.join_position, channel.channel, f"{host}:{port}"))
        except ShmbusError as e:
            print(f"netbridge: cannot create an image: {e}", file=sys.stderr)
            return None
        assert isinstance(ready, cp.OnImageReady)
        log = LogBuffer.open(self.client.directory / ready.log_file)
        label = (f"{ready.image_id} {request.session_id} {request.stream_id} "
                 f"{ChannelUri.parse(channel.channel).canonical()} {host}:{port}")
        try:
            cc_window: tuple[int, Position] | None = self._add_counter(
                RCV_CC_WINDOW, f"rcv-cc-window: {label}", ready.image_id, request.session_id)
        except RegistrationError as e:  # e.g. no counter left: the image works without it
            print(f"netbridge: no rcv-cc-window counter for image {ready.image_id}: {e}",
                  file=sys.stderr)
            cc_window = None
        image = ReceivedImage(ready.image_id, log, self._counter(ready.rcv_hwm_counter_id),
                              self._counter(ready.rcv_pos_counter_id), request.join_position,
                              cc_window)
        self._images_by_id[ready.image_id] = image
        image.port = SharedImageLog(log, image.subscriber_position)
        return ImageResources(image.port)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() or the driver goes away; then close(). After work it spins for
        ``Context.netbridge_busy_window`` (natively, yielding the CPU at every turn: see
        _io.busy_poll) until a socket is readable, a publisher commits where a sender
        waits, or a timer is due; a sender's DATA the spin sends itself when its poll would do
        nothing else, and spins on. With nothing to do, it sleeps in poll() on its sockets and
        the log watcher's fd until the next deadline."""
        watcher = self._watcher
        watching: Watches | None = None
        readable: set[int] | None = None  # the first cycle tries every socket
        busy_until = 0
        try:
            while not self._stopped:
                now = time.monotonic_ns()
                work, deadline = self.do_work(now, readable)
                if work:
                    busy_until = now + self._busy_window_ns
                if work or now < busy_until:  # spin natively until there is something to do
                    if watching is not None:  # awake: publishers need not wake anyone
                        watcher.disarm()
                        watching = None
                    while True:  # a sender the spin sent for needs no duty cycle
                        data, progress, sends, sending = self._spin_watches()
                        found, spun = _io.busy_poll(self._poll_fds(), data, progress,
                                                        min(busy_until, deadline), sends)
                        if not spun:
                            break
                        now = time.monotonic_ns()
                        more = self._on_data_sent(sending[spun[0]], now, sent(spun[1:]))
                        busy_until = now + self._busy_window_ns
                        if more or now >= self._next_service_ns:
                            break  # its poll, or the driver's events, are due
                    readable = set(found or ())
                else:
                    watches = self._watches()
                    if watches != watching:  # else it still watches just these
                        watcher.arm(*watches)
                        watching = watches
                    if _io.busy_poll((), *watches, 0)[0] is not None:
                        # a frame or a reader came since the duty cycle (arm leaves out a
                        # watch that is ready: it would never fire): no sleep
                        timeout_ms = 0
                    else:
                        timeout_ns = min(deadline - time.monotonic_ns(), _IDLE_WAIT_MAX_NS)
                        timeout_ms = max(0, -(-timeout_ns // 1_000_000))  # rounded up
                    readable = {fd for fd, _ in self._poll().poll(timeout_ms)}
                    if watching is not None and watcher.clear():  # it fired; it is disarmed
                        watching = None
        except ShmbusError as e:  # the driver went away: nothing left to bridge
            print(f"netbridge: stopping: {e}", file=sys.stderr)
        finally:
            self.close()

    def stop(self) -> None:
        self._stopped = True

    def _sockets(self) -> list[socket.socket]:
        return [c.sock for c in self.send_channels.values()] + [
            sock for c in self.receive_channels.values() for sock in c.transport.sockets()]

    def _poll_fds(self) -> tuple[int, ...]:
        """The watcher's fd, then every socket's."""
        return self._polled()[0]

    def _poll(self) -> select.poll:
        """A poll object on those fds."""
        return self._polled()[1]

    def _polled(self) -> tuple[tuple[int, ...], select.poll]:
        """The fds to poll and a poll object on them, made again after a channel was opened
        or closed (which sets _poller to None)."""
        if self._poller is None:
            fds = (self._watcher.fileno(), *(sock.fileno() for sock in self._sockets()))
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            self._poller = (fds, poller)
        return self._poller

    def _watches(self) -> Watches:
        """What the log watcher wakes the bridge for: where senders wait for a publisher's
        next frame (log buffer, term length, position), and how far each image's subscribers
        must read for a status message to fall due (see _progress_watches)."""
        data = tuple((s.log.buffer, s.sender.term_length, s.sender.sender_position)
                     for channel in self.send_channels.values()
                     for s in channel.senders.values() if s.sender.waits_for_data)
        return data, self._progress_watches()

    def _spin_watches(self) -> tuple[
            tuple[tuple[_native.AtomicBuffer, int, int], ...],
            tuple[tuple[_native.AtomicBuffer, int, _native.AtomicBuffer, int, int], ...],
            tuple[NativeSend, ...], list[Sender]]:
        """The busy spin's watches: those of _watches, except that a sender the spin may send
        for by itself (NetworkSender.spin_send: no loss filter on its channel) is given as a
        send (socket, log buffer, term length, position, limit, mtu, max datagrams,
        destinations) instead of a data watch; and the senders of those sends, in order."""
        data = []
        sends = []
        sending = []
        for channel in self.send_channels.values():
            for s in channel.senders.values():
                send = self._native_send(channel, s)  # None unless it waits for data
                if send is not None:
                    sends.append(send)
                    sending.append(s)
                elif s.sender.waits_for_data:
                    data.append((s.log.buffer, s.sender.term_length, s.sender.sender_position))
        return tuple(data), self._progress_watches(), tuple(sends), sending

    @staticmethod
    def _native_send(channel: SendChannel, sender: Sender) -> NativeSend | None:
        """The send (as _io.busy_poll and send_now take it) that scans and sends the
        sender's next committed DATA natively, or None when its poll must
        (NetworkSender.spin_send says when) or its channel has an outgoing loss filter."""
        spin = sender.sender.spin_send() if channel.loss_out is None else None
        if spin is None:
            return None
        return native_send(channel.sock.fileno(), sender.log, spin, sender.sender.destinations,
                           channel.sealer)

    def _on_data_sent(self, sender: Sender, now: int, scan: Scan) -> bool:
        """Account for the DATA a native send scanned and sent for ``sender``. Returns
        whether more is committed: its poll is due."""
        sender.sender.on_data_sent(now, scan)
        self._mirror_sender(sender)
        if scan.more:
            sender.next_poll_ns = now
        return scan.more

    def _progress_watches(self) -> tuple[
            tuple[_native.AtomicBuffer, int, _native.AtomicBuffer, int, int], ...]:
        """How far each image's subscribers must read for a status message to fall due (log
        buffer, term length, their position counter's buffer and offset, that position). A
        subscriber there already is left out: it waits for a slower one (the status message
        follows the slowest), and a watch that is ready must mean work to do."""
        progress = []
        for channel in self.receive_channels.values():
            for image in channel.receiver.images.values():
                received = self._received(image)
                if received is not None and received.subscriber_positions:
                    due = image.sm_due_position
                    progress += [(received.log.buffer, image.term_length, p.buffer, p.offset,
                                  due)
                                 for p in received.subscriber_positions if p.get() < due]
        return tuple(progress)

    def do_work(self, now: int, readable: set[int] | None = None) -> tuple[int, int]:
        """One duty cycle; returns (work done, when to come back at the latest). ``readable``:
        the file descriptors of the sockets that have datagrams (None: try every socket).

        In the order a datagram's latency wants: what came in (DATA, which wakes subscribers,
        then control, which moves senders' limits); the CPU offered to the subscribers just
        woken (one may answer at once, and its answer goes out below); what goes out (DATA,
        then receivers' NAKs and status messages); then driver events, statistics and the loss
        filters' timers."""
        stats = now >= self._next_stats_ns
        if stats:
            self._next_stats_ns = now + _STATS_INTERVAL_NS
        poll_all = stats or self._poll_all
        self._poll_all = False
        work = self._receive(now, readable)
        deadline = now + _IDLE_WAIT_MAX_NS
        for key, send_channel in list(self.send_channels.items()):
            work, deadline = self._send(key, send_channel, now, stats, poll_all, work, deadline)
        for key, receive_channel in list(self.receive_channels.items()):
            work, deadline = self._poll_receiver(key, receive_channel, now, stats, poll_all,
                                                 work, deadline)
        if now >= self._next_service_ns:
            self._next_service_ns = now + _SERVICE_INTERVAL_NS
            work += self.client._service()
        if now >= self._next_keyring_check_ns:
            self._next_keyring_check_ns = now + _KEYRING_CHECK_NS
            self._reread_keyring()
        if self._events:  # channels, destinations, subscriptions changed: poll everything
            self._poll_all = True
            deadline = now
        while self._events:
            work += 1
            event = self._events.pop(0)
            try:
                self._on_driver_event(event)
            except OSError as e:  # e.g. an endpoint another process holds: report, go on
                print(f"netbridge: {type(event).__name__}: {e}", file=sys.stderr)
            except KeyringError as e:  # a publication whose key cannot seal: it never connects
                self._report(f"{type(event).__name__}: {e}")
        channels: list[ReceiveChannel | SendChannel] = [*self.send_channels.values(),
                                                         *self.receive_channels.values()]
        for channel in channels:
            for loss, outgoing in ((channel.loss_out, True), (channel.loss_in, False)):
                if loss is None:
                    continue
                for data, address in loss.due(now):
                    work += 1
                    if outgoing:
                        send_to(channel.sock, data, address, channel.sealer)
                    elif isinstance(channel, SendChannel):
                        self._on_control(channel, now, memoryview(data), address)
                    else:
                        channel.receiver.on_datagram(now, data, address)
                next_loss = loss.next_deadline()
                if next_loss is not None:
                    deadline = min(deadline, next_loss)
        return work, deadline

    def _receive(self, now: int, readable: set[int] | None) -> int:
        """Every readable socket's datagrams: DATA (and multicast NAKs) first, then status
        messages and NAKs for the senders; returns how many came. Yields the CPU after DATA
        came: a subscriber it woke may be waiting for this core."""
        io = self._io
        data = 0
        for channel in self.receive_channels.values():
            receiver = channel.receiver
            count = handled = 0
            if readable is None or channel.sock.fileno() in readable:
                count, handled = io.receive(
                    channel.sock, now, functools.partial(receiver.on_datagram, now), receiver,
                    channel.loss_in, channel.sealer, self._drops_of(channel, now))
            control = channel.transport.control_sock  # multicast: others' NAKs
            if control is not None and (readable is None or control.fileno() in readable):
                heard = io.receive(control, now, functools.partial(self._on_nak_heard,
                                                                   receiver, now),
                                   sealer=channel.sealer,
                                   on_drops=self._drops_of(channel, now))[0]
                count += heard
                handled += heard
            # data placed in order natively changes no timer: only the others need a poll
            channel.heard = handled > 0
            data += count
        if data:
            os.sched_yield()
        control_count = 0
        for send_channel in self.send_channels.values():
            count = 0
            if readable is None or send_channel.sock.fileno() in readable:
                count = io.receive(
                    send_channel.sock, now, functools.partial(self._on_control, send_channel, now),
                    loss=send_channel.loss_in, sealer=send_channel.sealer,
                    on_drops=self._drops_of(send_channel, now))[0]
            send_channel.heard = count > 0
            control_count += count
        return data + control_count

    def _drops_of(self, channel: SendChannel | ReceiveChannel, now: int
                  ) -> Callable[[list[tuple[int, object]]], None] | None:
        """What a keyed channel's receive does with the datagrams that did not open: the
        error log hears of a few (DropReports); the Sealer counted them all."""
        if channel.sealer is None:
            return None

        def report(dropped: list[tuple[int, object]]) -> None:
            for line in self._drop_reports.reports(now, channel.channel, dropped):
                self._report(line)
        return report

    def _report(self, text: str) -> None:
        """A line for the driver's error log (``shmbus errors``)."""
        try:
            self._request(cp.ReportError(self.client.client_id, self._correlation(), text))
        except ShmbusError as e:
            print(f"netbridge: {text} (not logged: {e})", file=sys.stderr)

    def _reread_keyring(self) -> None:
        """Give every keyed channel the keys of a keyring file that changed (its keys stay
        as they were, and the error log says why, when the new file cannot be used)."""
        try:
            keyring = self._keyring.changed()
        except KeyringError as e:
            self._report(f"keyring not reread: {e}")
            return
        if keyring is None:
            return
        channels: list[SendChannel | ReceiveChannel] = [*self.send_channels.values(),
                                                         *self.receive_channels.values()]
        for channel in channels:
            if channel.sealer is not None and channel.key is not None:
                try:
                    rekey(channel.sealer, keyring, channel.key)
                except KeyringError as e:
                    self._report(f"{channel.channel}: keys unchanged: {e}")

    @staticmethod
    def _on_nak_heard(receiver: NetworkReceiver, now: int, data: memoryview,
                      _source: object) -> None:
        receiver.on_nak_heard(now, data)

    def _send(self, key: tuple[str, ...], channel: SendChannel, now: int, stats: bool,
              poll_all: bool, work: int, deadline: int) -> tuple[int, int]:
        """Poll the channel's senders that have something to do (a datagram came for them, a
        publisher committed where they wait, their timers are due, or ``poll_all``) and send
        what they have; mirror their counters. The channel is closed with its last sender."""
        if stats and channel.tracker is not None:
            channel.tracker.on_idle(now)
            channel.apply_destinations()
        for sender_key, sender in list(channel.senders.items()):
            if not (poll_all or channel.heard or now >= sender.next_poll_ns):
                if not sender.sender.data_ready():
                    deadline = min(deadline, sender.next_poll_ns)
                    continue
                send = self._native_send(channel, sender)
                if send is not None:  # only a publisher's frame to send: natively, no poll
                    scan = send_now(send)
                    work += scan.datagrams
                    self._on_data_sent(sender, now, scan)
                    deadline = min(deadline, sender.next_poll_ns)
                    continue
            self._check_closed(sender)
            datagrams, due = sender.sender.poll(now)
            sender.next_poll_ns = due
            work += self._io.send(channel.sock, datagrams, now, channel.loss_out, channel.sealer)
            deadline = min(deadline, due)
            if sender.closed_at_ns is None:
                # after the end of stream is mirrored the driver frees the counters
                self._mirror_sender(sender)
            if stats:
                self._mirror_receivers(sender)
            if sender.sender.is_end_of_stream:
                sender.closed_at_ns = sender.closed_at_ns or now
                if now - sender.closed_at_ns > _SENDER_LINGER_NS:
                    del channel.senders[sender_key]
                    self._watcher.disarm(True)  # it may still be asleep on this log
                    sender.log.close()
                    for counter_id in sender.counter_ids():
                        self._remove_counter(counter_id)
                    if not channel.senders:
                        self._close_send_channel(key)
                        return work + 1, deadline
        if stats:
            self._mirror_send(channel)
        return work, deadline

    def _poll_receiver(self, key: tuple[str, ...], channel: ReceiveChannel, now: int,
                       stats: bool, poll_all: bool, work: int, deadline: int) -> tuple[int, int]:
        """The receiver's timers (NAKs, status messages, liveness) when it has something to do
        (datagrams came, subscribers read up to where a status message falls due, its timers
        are due, or ``poll_all``), its announcements, and the endpoint closed once its linger
        is over; mirror its counters."""
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
                    self._close_image(channel, image_event.image)
            channel.next_poll_ns = (polled.next_deadline_ns if polled.next_deadline_ns is not None
                                    else now + _IDLE_WAIT_MAX_NS)
        deadline = min(deadline, channel.next_poll_ns)
        if channel.idle_since_ns is not None and not receiver.images:
            if now - channel.idle_since_ns >= self._endpoint_linger_ns:
                self._close_receive_channel(key)
                return work + 1, deadline
            deadline = min(deadline, channel.idle_since_ns + self._endpoint_linger_ns)
        if stats or len(receiver.images) != channel.mirrored_images:
            self._mirror_receive(channel)
        return work, deadline

    @staticmethod
    def _check_closed(sender: Sender) -> None:
        """The driver marks a publication closed (its last owner gone) by setting the log's
        end-of-stream position; from then on the sender ends the stream there (EOS
        heartbeats once everything is sent)."""
        if not sender.sender.closed:
            end = sender.log.end_of_stream_position
            if end != _NO_END_OF_STREAM:
                sender.sender.close(end)

    def _on_control(self, channel: SendChannel, now: int, data: memoryview,
                    source: object) -> None:
        if len(data) < 16:
            channel.invalid += 1
            return
        key = _SESSION_STREAM.unpack_from(data, 8)
        if channel.tracker is not None and data[6] == HDR_TYPE_SM and data[7] == 0:
            channel.tracker.on_status_message(source, now)  # dynamic MDC: a destination
            channel.apply_destinations()
            if key == (0, 0):
                return  # an announcement, for no stream in particular
        sender = channel.senders.get(key)
        if sender is None:
            channel.invalid += 1
            return
        sender.sender.on_datagram(now, bytes(data), source)  # frames may keep their bytes

    # -- counters ------------------------------------------------------------------------------

    def _mirror_sender(self, sender: Sender) -> None:
        s = sender.sender
        values = (s.sender_position, s.sender_limit, s.back_pressure_events,
                  1 if s.is_connected and not s.closed else 0)
        last = sender.mirrored
        if values == last:
            return
        sender.mirrored = values
        if values[0] != last[0]:
            sender.snd_pos.set(values[0])
            # the publisher's limit follows snd-pos: one asleep on it must look again
            _native.wake_log_writers(sender.log.buffer)
        if values[1] != last[1]:
            sender.snd_lmt.set(values[1])
        if values[2] != last[2]:
            sender.snd_bpe.set(values[2])
        if values[3] != last[3]:
            sender.log.active_transport_count = values[3]  # the driver derives is-connected

    def _mirror_receivers(self, sender: Sender) -> None:
        """Keep one fc-rcv-pos counter per receiver the flow control knows (allocated when it
        is first heard, freed when the strategy forgets it) and the fc-receivers count."""
        flow_control = sender.sender.flow_control
        known = flow_control.receivers
        counters = sender.receiver_positions
        for receiver_id in [r for r in counters if r not in known]:
            self._remove_counter(counters.pop(receiver_id)[0])
        for receiver_id, receiver in known.items():
            counter = counters.get(receiver_id)
            if counter is None:
                if len(counters) >= _RECEIVER_COUNTERS_PER_SENDER or sender.counters_refused:
                    continue  # still counted in fc-receivers
                host, port = cast("tuple[str, int]", receiver.source)
                uncounted = "" if receiver.counted else " (not counted)"
                try:
                    counter = counters[receiver_id] = self._add_counter(
                        FC_RCV_POS, f"fc-rcv-pos: {sender.label} receiver {receiver_id} at "
                                    f"{host}:{port}{uncounted}",
                        sender.registration_id, sender.sender.session_id)
                except RegistrationError as e:  # e.g. no counter left: not worth a retry
                    print(f"netbridge: no fc-rcv-pos counter for {sender.label}: {e}",
                          file=sys.stderr)
                    sender.counters_refused = True
                    continue
            counter[1].set(receiver.position)
        sender.fc_receivers[1].set(flow_control.counted_receivers())

    def _mirror_send(self, channel: SendChannel) -> None:
        senders = [s.sender for s in channel.senders.values()]
        channel.counters.update({
            "bytes sent": sum(s.bytes_sent for s in senders),
            "datagrams sent": sum(s.datagrams_sent for s in senders),
            "heartbeats sent": sum(s.heartbeats_sent for s in senders),
            "retransmits": sum(s.retransmits for s in senders),
            "naks received": sum(s.naks_received for s in senders),
            "sms received": sum(s.sms_received for s in senders),
            "invalid datagrams": channel.invalid + sum(s.invalid_datagrams for s in senders),
            # where data goes: the endpoint or group, or the MDC destinations known now
            "destinations": len(channel.transport.destinations) + (
                len(channel.tracker.destinations) if channel.tracker is not None else 0),
            **(seal_counts(channel.sealer) if channel.sealer is not None else {}),
        })

    def _mirror_receive(self, channel: ReceiveChannel) -> None:
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

    def _received(self, image: ReceiverImage) -> ReceivedImage | None:
        for received in self._images_by_id.values():
            if received.port is image.log:
                return received
        return None

    def _close_image(self, channel: ReceiveChannel, image: ReceiverImage) -> None:
        received = self._received(image)
        if received is None:
            return
        received.rcv_pos.set(image.rcv_pos)
        del self._images_by_id[received.image_id]
        try:
            if received.cc_window is not None:
                self._remove_counter(received.cc_window[0])
            self._request(cp.CloseImage(self.client.client_id, self._correlation(),
                                        received.image_id))
        except ShmbusError as e:
            print(f"netbridge: closing image {received.image_id}: {e}", file=sys.stderr)
        self._watcher.disarm(True)  # it may still be asleep on this log
        received.log.close()

    def close(self) -> None:
        self._watcher.close()
        for channel in self.send_channels.values():
            for sender in channel.senders.values():
                sender.log.close()
            channel.sock.close()
        for receive_channel in self.receive_channels.values():
            for sock in receive_channel.transport.sockets():
                sock.close()
        for image in self._images_by_id.values():
            image.log.close()
        self.send_channels.clear()
        self.receive_channels.clear()
        self._images_by_id.clear()
        self.client.close()


def run_bridge(context: Context) -> None:
    """Run a netbridge for ``context.dir`` until SIGINT/SIGTERM or the driver goes away."""
    bridge = Bridge(context)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: bridge.stop())
    bridge.run()


def embedded_main() -> None:
    """How the driver starts a netbridge: the context as JSON in ``sys.argv[1]``."""
    run_bridge(Context.from_json(sys.argv[1]) if len(sys.argv) > 1 else Context())
