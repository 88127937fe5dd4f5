"""The netbridge process: the socket layer around the sans-IO sender and receiver.

It is a client of its bus's driver with extra rights (it registers as the bridge). The driver
tells it about publications on udp channels (it sends them from their logs) and subscriptions
on udp channels (it listens on their endpoints and asks the driver for an image log when a
SETUP arrives). Everything protocol-shaped happens in :mod:`netbridge.sender` and
:mod:`netbridge.receiver`; here are the sockets, the clock, the counters and the loop.

Start it by hand with ``netbridge --dir DIR``, or let the driver start it when the first udp
channel appears.
"""

from __future__ import annotations

import dataclasses
import json
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from netbridge.loss_filter import LossFilter, LossSpec
from netbridge.receiver import (
    ImageRequest,
    ImageResources,
    ImageUnavailable,
    NetworkReceiver,
    ReceiverImage,
)
from netbridge.sender import NetworkSender
from shmbus import control_protocol as cp
from shmbus.channel_uri import ChannelUri
from shmbus.client import Client
from shmbus.context import Context
from shmbus.errors import ShmbusError
from shmbus.log_buffer import LogBuffer
from shmbus.position import Position

#: counter type ids of the netbridge's per-channel statistics
SEND_CHANNEL_STAT = 101
RECEIVE_CHANNEL_STAT = 102

SEND_STATS = ("bytes sent", "datagrams sent", "heartbeats sent", "retransmits",
              "naks received", "sms received", "invalid datagrams")
RECEIVE_STATS = ("bytes received", "datagrams received", "heartbeats received", "naks sent",
                 "sms sent", "invalid datagrams", "gaps", "bytes lost", "rtt ns")

_SESSION_STREAM = struct.Struct("<ii")
_RECV_BATCH = 64
_SENDER_LINGER_NS = 2_000_000_000
_NO_END_OF_STREAM = (1 << 63) - 1  # a log's end-of-stream position while it is open


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return socket.gethostbyname(host.strip("[]")), int(port)


@dataclass
class ChannelCounters:
    """A channel's statistics: counters in cnc.dat, mirrored from plain ints."""

    positions: dict[str, Position]

    def update(self, values: dict[str, int]) -> None:
        for name, value in values.items():
            position = self.positions.get(name)
            if position is not None and position.get() != value:
                position.set(value)


@dataclass
class Sender:
    """One network publication being sent."""

    registration_id: int
    sender: NetworkSender
    log: LogBuffer
    snd_pos: Position
    snd_lmt: Position
    snd_bpe: Position
    closed_at_ns: int | None = None
    #: (snd-pos, snd-lmt, snd-bpe, connected) as last written: counters are written only when
    #: the sender's own value changes, never read back (the driver may free and reuse them)
    mirrored: tuple[int, int, int, int] = (-1, -1, -1, -1)


@dataclass
class SendChannel:
    """One socket sending to one endpoint, shared by every publication to it."""

    channel: str
    destination: tuple[str, int]
    sock: socket.socket
    counters: ChannelCounters
    loss: LossFilter | None
    senders: dict[tuple[int, int], Sender] = field(default_factory=dict)
    invalid: int = 0


@dataclass
class ReceivedImage:
    """An image being rebuilt, with the driver's ids for it."""

    image_id: int
    log: LogBuffer
    rcv_hwm: Position
    rcv_pos: Position
    join_position: int
    subscriber_positions: list[Position] | None = None  # None until the driver says

    def subscriber_position(self) -> int:
        positions = self.subscriber_positions
        if positions is None:
            return self.join_position
        if not positions:
            return self.rcv_pos.get()  # nobody reads: do not hold the sender back
        return min(p.get() for p in positions)


@dataclass
class ReceiveChannel:
    """One socket bound to an endpoint, with the receiver state machine for it."""

    channel: str
    sock: socket.socket
    receiver: NetworkReceiver
    counters: ChannelCounters
    loss: LossFilter | None


class Bridge:
    """The netbridge of one bus. ``run()`` serves until the driver goes away or stop()."""

    def __init__(self, context: Context) -> None:
        self.context = context.with_(embedded_driver=False)
        self._loss_spec = LossSpec.parse(context.netbridge_loss)
        self.send_channels: dict[tuple[str, int], SendChannel] = {}
        self.receive_channels: dict[str, ReceiveChannel] = {}
        self._images_by_id: dict[int, ReceivedImage] = {}
        self._stopped = False
        self.client = Client(self.context)
        self._receiver_id = self.client.client_id
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
        elif isinstance(message, cp.OnReceiveChannel):
            self._receive_channel(message.channel).receiver.add_subscription(message.stream_id)
        elif isinstance(message, cp.OnReceiveChannelClosed):
            channel = self.receive_channels.get(message.channel)
            if channel is not None:
                channel.receiver.remove_subscription(message.stream_id, time.monotonic_ns())
        elif isinstance(message, cp.OnImageSubscribers):
            image = self._images_by_id.get(message.image_id)
            if image is not None:
                ids = [int(i) for i in message.counter_ids.split(",") if i]
                image.subscriber_positions = [self._counter(i) for i in ids]

    def _counter(self, counter_id: int) -> Position:
        counters = self.client.counters
        return Position(counters.values, counters.counter_offset(counter_id))

    def _add_counters(self, kind: int, channel: str, names: tuple[str, ...]) -> ChannelCounters:
        positions = {}
        for name in names:
            ready = self._request(cp.AddCounter(self.client.client_id, self._correlation(), kind,
                                                f"{name}: {channel}"))
            assert isinstance(ready, cp.OnCounterReady)
            positions[name] = self._counter(ready.counter_id)
        return ChannelCounters(positions)

    def _loss_filter(self) -> LossFilter | None:
        """One filter per socket, each with its own seed (derived from the spec's)."""
        spec = self._loss_spec
        if spec is None:
            return None
        count = len(self.send_channels) + len(self.receive_channels)
        return LossFilter(dataclasses.replace(spec, seed=spec.seed * 1000 + count))

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        size = self.context.netbridge_socket_buffer
        if size:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        sock.setblocking(False)
        return sock

    def _add_sender(self, event: cp.OnNetworkPublication) -> None:
        uri = ChannelUri.parse(event.channel)
        destination = parse_address(uri.params["endpoint"])
        channel = self.send_channels.get(destination)
        if channel is None:
            sock = self._socket()
            interface = uri.params.get("interface", "0.0.0.0:0")
            host, _, port = interface.partition(":")
            sock.bind((host, int(port or 0)))
            channel = SendChannel(event.channel, destination, sock, self._add_counters(
                SEND_CHANNEL_STAT, uri.canonical(), SEND_STATS), self._loss_filter())
            self.send_channels[destination] = channel
        log = LogBuffer.open(self.client.directory / event.log_file)
        snd_pos = self._counter(event.snd_pos_counter_id)
        sender = NetworkSender(log, destination=destination, position=snd_pos.get(),
                               mtu=uri.int_param("mtu", log.descriptor.mtu))
        channel.senders[(event.session_id, event.stream_id)] = Sender(
            event.registration_id, sender, log, snd_pos, self._counter(event.snd_lmt_counter_id),
            self._counter(event.snd_bpe_counter_id))

    def _receive_channel(self, channel_text: str) -> ReceiveChannel:
        channel = self.receive_channels.get(channel_text)
        if channel is not None:
            return channel
        uri = ChannelUri.parse(channel_text)
        sock = self._socket()
        sock.bind(parse_address(uri.params["endpoint"]))
        window = uri.int_param("rcv-wnd", 128 * 1024)
        holder: list[ReceiveChannel] = []
        receiver = NetworkReceiver(lambda request: self._create_image(holder[0], request),
                                   receiver_id=self._receiver_id, receiver_window=window)
        channel = ReceiveChannel(channel_text, sock, receiver, self._add_counters(
            RECEIVE_CHANNEL_STAT, uri.canonical(), RECEIVE_STATS), self._loss_filter())
        holder.append(channel)
        self.receive_channels[channel_text] = channel
        return channel

    def _create_image(self, channel: ReceiveChannel, request: ImageRequest
                      ) -> ImageResources | None:
        host, port = request.source  # type: ignore[misc]
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
        image = ReceivedImage(ready.image_id, log, self._counter(ready.rcv_hwm_counter_id),
                              self._counter(ready.rcv_pos_counter_id), request.join_position)
        self._images_by_id[ready.image_id] = image
        return ImageResources(log, image.subscriber_position)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() or the driver goes away; then close()."""
        try:
            while not self._stopped:
                now = time.monotonic_ns()
                work, deadline = self.do_work(now)
                if not work:
                    timeout = max(0.0, min((deadline - time.monotonic_ns()) / 1e9, 0.001))
                    select.select(self._sockets(), [], [], timeout)
        except ShmbusError as e:  # the driver went away: nothing left to bridge
            print(f"netbridge: stopping: {e}", file=sys.stderr)
        finally:
            self.close()

    def stop(self) -> None:
        self._stopped = True

    def _sockets(self) -> list[socket.socket]:
        return [c.sock for c in self.send_channels.values()] + [
            c.sock for c in self.receive_channels.values()]

    def do_work(self, now: int) -> tuple[int, int]:
        """One duty cycle; returns (work done, when to come back at the latest)."""
        work = self.client._service()
        while self._events:
            work += 1
            event = self._events.pop(0)
            try:
                self._on_driver_event(event)
            except OSError as e:  # e.g. an endpoint another process holds: report, go on
                print(f"netbridge: {type(event).__name__}: {e}", file=sys.stderr)
        deadline = now + 1_000_000
        for channel in list(self.receive_channels.values()):
            work += self._receive(channel.sock, lambda data, source, c=channel:
                                  c.receiver.on_datagram(now, data, source))
            polled = channel.receiver.poll(now)
            work += self._send(channel.sock, channel.loss, polled.datagrams, now)
            for event in polled.events:
                if isinstance(event, ImageUnavailable):
                    self._close_image(channel, event.image)
            if polled.next_deadline_ns is not None:
                deadline = min(deadline, polled.next_deadline_ns)
            self._mirror_receive(channel)
        for channel in list(self.send_channels.values()):
            work += self._receive(channel.sock, lambda data, source, c=channel:
                                  self._on_control(c, now, data, source))
            for key, sender in list(channel.senders.items()):
                self._check_closed(sender)
                datagrams, due = sender.sender.poll(now)
                work += self._send(channel.sock, channel.loss, datagrams, now)
                deadline = min(deadline, due)
                if sender.closed_at_ns is None:
                    # after the end of stream is mirrored the driver frees the counters
                    self._mirror_sender(sender)
                if sender.sender.is_end_of_stream:
                    sender.closed_at_ns = sender.closed_at_ns or now
                    if now - sender.closed_at_ns > _SENDER_LINGER_NS:
                        del channel.senders[key]
                        sender.log.close()
            self._mirror_send(channel)
        for channel in (*self.send_channels.values(), *self.receive_channels.values()):
            if channel.loss is not None:
                for data, destination in channel.loss.due(now):
                    self._sendto(channel.sock, data, destination)
                    work += 1
                next_loss = channel.loss.next_deadline()
                if next_loss is not None:
                    deadline = min(deadline, next_loss)
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

    def _receive(self, sock: socket.socket, handle: Callable[[bytes, object], None]) -> int:
        count = 0
        for _ in range(_RECV_BATCH):
            try:
                data, source = sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break  # e.g. ICMP port unreachable reported on a later recv
            handle(data, source)
            count += 1
        return count

    def _on_control(self, channel: SendChannel, now: int, data: bytes, source: object) -> None:
        if len(data) < 16:
            channel.invalid += 1
            return
        key = _SESSION_STREAM.unpack_from(data, 8)
        sender = channel.senders.get(key)
        if sender is None:
            channel.invalid += 1
            return
        sender.sender.on_datagram(now, data, source)

    def _send(self, sock: socket.socket, loss: LossFilter | None,
              datagrams: list[tuple[bytes | memoryview, object]], now: int) -> int:
        for data, destination in datagrams:
            if loss is None:
                self._sendto(sock, data, destination)
            else:
                for out, dest in loss.send(now, data, destination):
                    self._sendto(sock, out, dest)
        return len(datagrams)

    @staticmethod
    def _sendto(sock: socket.socket, data: bytes | memoryview, destination: object) -> None:
        try:
            sock.sendto(data, destination)  # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            pass  # a full socket buffer is loss: the receiver NAKs it
        except OSError:
            pass  # unreachable peers are not our problem; status messages say who is there

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
        if values[1] != last[1]:
            sender.snd_lmt.set(values[1])
        if values[2] != last[2]:
            sender.snd_bpe.set(values[2])
        if values[3] != last[3]:
            sender.log.active_transport_count = values[3]  # the driver derives is-connected

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
        })

    def _mirror_receive(self, channel: ReceiveChannel) -> None:
        r = channel.receiver
        for image in r.images.values():
            received = self._received(image)
            if received is not None:
                if received.rcv_hwm.get() != image.rcv_hwm:
                    received.rcv_hwm.set(image.rcv_hwm)
                if received.rcv_pos.get() != image.rcv_pos:
                    received.rcv_pos.set(image.rcv_pos)
        channel.counters.update({
            "bytes received": r.bytes_received, "datagrams received": r.datagrams_received,
            "heartbeats received": r.heartbeats_received, "naks sent": r.naks_sent,
            "sms sent": r.sms_sent, "invalid datagrams": r.invalid_datagrams,
            "gaps": r.gaps_detected, "bytes lost": r.bytes_lost,
            # the latest round-trip time of the channel's images (the worst of them), 0 if none
            "rtt ns": max((i.rtt_ns or 0 for i in r.images.values()), default=0),
        })

    def _received(self, image: ReceiverImage) -> ReceivedImage | None:
        for received in self._images_by_id.values():
            if received.log is image.log:
                return received
        return None

    def _close_image(self, channel: ReceiveChannel, image: ReceiverImage) -> None:
        received = self._received(image)
        if received is None:
            return
        received.rcv_pos.set(image.rcv_pos)
        del self._images_by_id[received.image_id]
        try:
            self._request(cp.CloseImage(self.client.client_id, self._correlation(),
                                        received.image_id))
        except ShmbusError as e:
            print(f"netbridge: closing image {received.image_id}: {e}", file=sys.stderr)
        received.log.close()

    def close(self) -> None:
        for channel in self.send_channels.values():
            for sender in channel.senders.values():
                sender.log.close()
            channel.sock.close()
        for channel in self.receive_channels.values():
            channel.sock.close()
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
    fields = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    run_bridge(Context(**fields))
