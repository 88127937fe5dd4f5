"""The netbridge's send side: the network publications the driver tells it about, each sent
from its log by a sans-IO :class:`~netbridge.sender.NetworkSender`, on one socket per
endpoint (or group, or multi-destination-cast control address) and key.

Here the senders are polled when they have something to do, their status messages and NAKs
routed to them (and, for a dynamic multi-destination-cast channel, their destinations taken
from who sends status messages: :mod:`netbridge.destinations`), their counters mirrored into
the driver's (snd-pos, snd-lmt, snd-bpe, the connection, one fc-rcv-pos per receiver the flow
control knows), and a sender's new DATA sent natively when that is all its poll would do
(:meth:`NetworkSender.spin_send <netbridge.sender.NetworkSender.spin_send>`). A channel is
closed with its last publication.
"""

from __future__ import annotations

import functools
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, cast

from netbridge import _io
from netbridge.bridge_side import BridgeSide
from netbridge.datagram_io import DatagramIO
from netbridge.destinations import DestinationTracker
from netbridge.driver_link import ChannelCounters, DriverLink
from netbridge.flow_control import strategy_for
from netbridge.frames import HDR_TYPE_SM, SETUP_FLAG_GROUP
from netbridge.log_port import Scan
from netbridge.loss_filter import LossFilter
from netbridge.sealing import SEAL_STATS, ChannelSealers, seal_counts
from netbridge.sender import NetworkSender
from netbridge.shared_log import NativeSend, SharedPublicationLog, native_send, send_now
from netbridge.transport import SendTransport, open_send, parse_address
from shmbus.settings.channel_uri import ChannelUri
from shmbus.settings.errors import RegistrationError
from shmbus.shm import _native
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import FC_RCV_POS, FC_RECEIVERS
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position

__all__ = ["SEND_CHANNEL_STAT", "SEND_STATS", "DataWatch", "SendChannel", "SendChannels",
           "Sender"]

#: the counter type id of a send channel's statistics
SEND_CHANNEL_STAT: Final = 101
SEND_STATS: Final = ("bytes sent", "datagrams sent", "heartbeats sent", "retransmits",
                     "naks received", "sms received", "invalid datagrams", "destinations")

#: where a sender waits for a publisher's next frame: (log buffer, term length, position)
DataWatch = tuple[_native.AtomicBuffer, int, int]

_SESSION_STREAM = struct.Struct("<ii")
_SENDER_LINGER_NS = 2_000_000_000
_NO_END_OF_STREAM = (1 << 63) - 1  # a log's end-of-stream position while it is open
#: at most this many fc-rcv-pos counters per publication (a flood of status messages with
#: made-up receiver ids must not use up the counters)
_RECEIVER_COUNTERS_PER_SENDER = 64


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


class SendChannels(BridgeSide[SendChannel]):
    """The send channels of one netbridge, by endpoint (ChannelUri.endpoint_key) and key name,
    and the senders on them.

    The arguments but the last are :class:`~netbridge.bridge_side.BridgeSide`'s (``driver``
    allocates the counters); a sender is disconnected after ``connection_timeout_ns`` without
    a status message.
    """

    def __init__(self, driver: DriverLink, io: DatagramIO, sealers: ChannelSealers,
                 watcher: _native.FutexRing | _native.LogWatcher,
                 loss_filters: Callable[[], tuple[LossFilter | None, LossFilter | None]], *,
                 socket_buffer: int, connection_timeout_ns: int) -> None:
        super().__init__(driver, io, sealers, watcher, loss_filters, socket_buffer=socket_buffer)
        self._connection_timeout_ns = connection_timeout_ns

    def sockets(self) -> list[socket.socket]:
        return [channel.sock for channel in self.channels.values()]

    # -- driver events -------------------------------------------------------------------------

    def add_publication(self, event: cp.OnNetworkPublication) -> None:
        """Send a new network publication from its log, on its channel's socket (opened now
        when it is the channel's first)."""
        uri = ChannelUri.parse(event.channel)
        key = (*uri.endpoint_key(), uri.key or "")
        channel = self.channels.get(key)
        if channel is None:
            sealer = self._sealers.sealer(uri)
            transport = open_send(uri, self._socket_buffer)
            tracker = (DestinationTracker(dynamic=transport.control_mode == "dynamic")
                       if transport.control_mode else None)
            channel = SendChannel(event.channel, transport, self._driver.add_channel_counters(
                SEND_CHANNEL_STAT, uri.canonical(), SEND_STATS + (SEAL_STATS if sealer else ())),
                *self._loss_filters(), tracker=tracker, key=uri.key, sealer=sealer)
            self.channels[key] = channel
        log = LogBuffer.open(self._driver.directory / event.log_file)
        snd_pos = self._driver.counter(event.snd_pos_counter_id)
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
            event.registration_id, sender, log, snd_pos,
            self._driver.counter(event.snd_lmt_counter_id),
            self._driver.counter(event.snd_bpe_counter_id), label, self._driver.add_counter(
                FC_RECEIVERS, f"fc-receivers: {label}", event.registration_id,
                event.session_id))

    def close_publication(self, event: cp.OnNetworkPublicationClosed) -> None:
        """The publication's last owner went: its sender ends the stream at its end position."""
        for channel in self.channels.values():
            for sender in channel.senders.values():
                if sender.registration_id == event.registration_id:
                    sender.sender.close(event.end_position)

    def on_destination(self, event: cp.OnDestination) -> None:
        """A multi-destination-cast publication's destination added or removed by hand: for
        every sender on its channel."""
        for channel in self.channels.values():
            if channel.tracker is None:
                continue
            if any(s.registration_id == event.registration_id for s in channel.senders.values()):
                destination = parse_address(event.destination)
                if event.added:
                    channel.tracker.add(destination)
                else:
                    channel.tracker.remove(destination)
                channel.apply_destinations()

    # -- datagrams in ----------------------------------------------------------------------------

    def receive(self, now: int, readable: set[int] | None) -> int:
        """Every readable socket's status messages and NAKs, for their senders (``readable``:
        the file descriptors that have datagrams, None: try every socket); returns how many
        came."""
        control_count = 0
        for channel in self.channels.values():
            count = 0
            if readable is None or channel.sock.fileno() in readable:
                count = self._io.receive(
                    channel.sock, now, functools.partial(self._on_control, channel, now),
                    loss=channel.loss_in, sealer=channel.sealer,
                    on_drops=self._sealers.drops_of(channel, now))[0]
            channel.heard = count > 0
            control_count += count
        return control_count

    def _on_control(self, channel: SendChannel, now: int, data: bytes | memoryview,
                    source: object) -> None:
        """Route a control datagram to its sender by session and stream (read straight from
        the bytes); a dynamic MDC channel's status messages also say who its destinations
        are."""
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

    def _deliver_held(self, channel: SendChannel, now: int) -> Callable[[bytes, object], None]:
        """Held-back control datagrams are routed to the senders."""
        return functools.partial(self._on_control, channel, now)

    # -- the duty cycle ----------------------------------------------------------------------------

    def _poll_channel(self, key: tuple[str, ...], channel: SendChannel, now: int, stats: bool,
                      poll_all: bool, work: int, deadline: int) -> tuple[int, int]:
        """Poll every sender of the channel that has something to do (a datagram came for it,
        a publisher committed where it waits, its timers are due, or ``poll_all``) and send
        what it has; mirror the counters (the channel's statistics and the receivers'
        positions when ``stats``). The channel is closed with its last sender."""
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
                    self.on_data_sent(sender, now, scan)
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
                        self._driver.remove_counter(counter_id)
                    if not channel.senders:
                        self._close_channel(key)
                        return work + 1, deadline
        if stats:
            self._mirror_channel(channel)
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

    def _close_channel(self, key: tuple[str, ...]) -> None:
        """Let a channel whose last publication went go: its socket is closed and its
        counters freed (a new publication on it opens it again)."""
        channel = self.channels.pop(key)
        channel.sock.close()
        self._driver.remove_channel_counters(channel.counters)

    # -- native sends ------------------------------------------------------------------------------

    def data_watches(self) -> tuple[DataWatch, ...]:
        """Where senders wait for a publisher's next frame, for the log watcher."""
        return tuple((s.log.buffer, s.sender.term_length, s.sender.sender_position)
                     for channel in self.channels.values()
                     for s in channel.senders.values() if s.sender.waits_for_data)

    def spin_sends(self) -> tuple[tuple[DataWatch, ...], tuple[NativeSend, ...], list[Sender]]:
        """The busy spin's part of the send side: the data watches of :meth:`data_watches`,
        except that a sender the spin may send for by itself (NetworkSender.spin_send: no loss
        filter on its channel) is given as a send (socket, log buffer, term length, position,
        limit, mtu, max datagrams, destinations) instead of a data watch; and the senders of
        those sends, in order."""
        data = []
        sends = []
        sending = []
        for channel in self.channels.values():
            for s in channel.senders.values():
                send = self._native_send(channel, s)  # None unless it waits for data
                if send is not None:
                    sends.append(send)
                    sending.append(s)
                elif s.sender.waits_for_data:
                    data.append((s.log.buffer, s.sender.term_length, s.sender.sender_position))
        return tuple(data), tuple(sends), sending

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

    def on_data_sent(self, sender: Sender, now: int, scan: Scan) -> bool:
        """Account for the DATA a native send scanned and sent for ``sender``. Returns
        whether more is committed: its poll is due."""
        sender.sender.on_data_sent(now, scan)
        self._mirror_sender(sender)
        if scan.more:
            sender.next_poll_ns = now
        return scan.more

    # -- counters ----------------------------------------------------------------------------------

    @staticmethod
    def _mirror_sender(sender: Sender) -> None:
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
            self._driver.remove_counter(counters.pop(receiver_id)[0])
        for receiver_id, receiver in known.items():
            counter = counters.get(receiver_id)
            if counter is None:
                if len(counters) >= _RECEIVER_COUNTERS_PER_SENDER or sender.counters_refused:
                    continue  # still counted in fc-receivers
                host, port = cast("tuple[str, int]", receiver.source)
                uncounted = "" if receiver.counted else " (not counted)"
                try:
                    counter = counters[receiver_id] = self._driver.add_counter(
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

    @staticmethod
    def _mirror_channel(channel: SendChannel) -> None:
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

    def close(self) -> None:
        """Close every sender's log and every channel's socket (the driver frees the counters
        of a client that goes)."""
        for channel in self.channels.values():
            for sender in channel.senders.values():
                sender.log.close()
            channel.sock.close()
        self.channels.clear()
