"""The driver's conductor: commands from clients, linking publications to subscriptions, IPC
flow control, tethering, unblocking, client liveness and end of life.

The conductor owns the counters, the log files and the broadcast to clients. It is driven by
``do_work(now_ms)`` from the driver's loop (the clock is an argument, so tests drive it), and
never blocks.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shmbus import control_protocol as cp
from shmbus.broadcast import BroadcastTransmitter
from shmbus.channel_uri import ChannelUri, ChannelUriError
from shmbus.context import Context
from shmbus.counters import (
    CLIENT_HEARTBEAT,
    PUB_LIMIT,
    PUB_POS,
    SUB_POS,
    CountersFullError,
    CountersManager,
)
from shmbus.error_log import DistinctErrorLog
from shmbus.ipc_flow_control import IpcFlowControl
from shmbus.ipc_publication import (
    ImageEvent,
    IpcPublication,
    LinkState,
    PublicationOwner,
    PublicationState,
    SubscriberLink,
    Timeouts,
)
from shmbus.log_buffer import LogBuffer, LogBufferError
from shmbus.position import Position
from shmbus.ring_buffer import ManyToOneRingBuffer
from shmbus.system_counters import SystemCounter

LOGS_DIR = "logs"


class CommandError(Exception):
    """A command the conductor refuses; becomes an ON_ERROR response."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ClientSession:
    """A connected client: its heartbeat counter and what it owns."""

    client_id: int
    pid: int
    name: str
    heartbeat_counter_id: int
    publications: set[int] = field(default_factory=set)      # owner registration ids
    subscriptions: set[int] = field(default_factory=set)     # subscription ids


@dataclass
class SubscriptionLink:
    """A subscription: which stream it wants and whether it holds publishers back."""

    registration_id: int
    client_id: int
    stream_id: int
    channel: str
    tethered: bool
    session_id: int | None


class DriverConductor:
    """Handles commands and timers for one bus directory. Single-threaded; the driver owns it."""

    def __init__(
        self,
        context: Context,
        directory: Path,
        to_driver: ManyToOneRingBuffer,
        to_clients: BroadcastTransmitter,
        counters: CountersManager,
        error_log: DistinctErrorLog,
        set_heartbeat: Callable[[int], None],
    ) -> None:
        self.context = context
        self.directory = directory
        self.to_driver = to_driver
        self.to_clients = to_clients
        self.counters = counters
        self.error_log = error_log
        self.set_heartbeat = set_heartbeat
        self.timeouts = Timeouts(
            unblock_ms=int(context.publication_unblock_timeout * 1000),
            linger_ms=int(context.publication_linger_timeout * 1000),
            window_limit_ms=int(context.untethered_window_limit_timeout * 1000),
            resting_ms=int(context.untethered_resting_timeout * 1000),
        )
        self.clients: dict[int, ClientSession] = {}
        self.publications: list[IpcPublication] = []
        self.subscriptions: dict[int, SubscriptionLink] = {}
        self._owner_index: dict[int, IpcPublication] = {}
        self._next_timer_ms = 0
        self._last_client_ms = counters.clock()
        self._random = random.Random()
        (directory / LOGS_DIR).mkdir(mode=0o700, exist_ok=True)

    # -- the loop ------------------------------------------------------------------------------

    def do_work(self, now_ms: int) -> int:
        """One duty cycle: commands, limits, and (every timer interval) timers. Returns work."""
        work = self.to_driver.read(self._on_command, 50)
        published = 0
        for publication in self.publications:
            published += publication.update_limit()
        if published:
            self._add(SystemCounter.BYTES_PUBLISHED, published)
            work += 1
        if now_ms >= self._next_timer_ms:
            self._next_timer_ms = now_ms + int(self.context.timer_interval * 1000)
            work += self._on_timer(now_ms)
        return work

    def _on_timer(self, now_ms: int) -> int:
        self.set_heartbeat(now_ms)
        self.to_driver.consumer_heartbeat_time = now_ms
        work = self._check_clients(now_ms)
        for publication in list(self.publications):
            events, unblocked = publication.on_timer(now_ms, self.timeouts)
            if unblocked:
                self._add(SystemCounter.UNBLOCKED_PUBLICATIONS, 1)
                work += 1
            for event in events:
                self._send_image_event(publication, event)
                work += 1
            if publication.state is PublicationState.DONE:
                self._delete_publication(publication)
                work += 1
        if self.clients:
            self._last_client_ms = now_ms
        return work

    def idle_for_ms(self, now_ms: int) -> int:
        """How long the driver has had no client (0 while it has one)."""
        return 0 if self.clients else now_ms - self._last_client_ms

    # -- commands ------------------------------------------------------------------------------

    def _on_command(self, msg_type: int, payload: memoryview) -> None:
        correlation_id = 0
        try:
            command = cp.decode(msg_type, payload)
            correlation_id = getattr(command, "correlation_id", 0)
            handler = self._handlers.get(type(command))
            if handler is None:
                raise CommandError(cp.UNKNOWN_COMMAND_TYPE_ID,
                                   f"command type 0x{msg_type:x} is not a command")
            if not isinstance(command, cp.ClientConnect):
                self._touch_client(command.client_id)
            handler(self, command)
        except cp.MalformedMessage as e:
            self._error(correlation_id, cp.MALFORMED_COMMAND, str(e))
        except CommandError as e:
            self._error(correlation_id, e.code, str(e))
        except ChannelUriError as e:
            self._error(correlation_id, cp.INVALID_CHANNEL, str(e))
        except (OSError, LogBufferError, CountersFullError) as e:
            code = cp.STORAGE_SPACE if isinstance(e, OSError) else cp.GENERIC_ERROR
            self._error(correlation_id, code, str(e))
        except Exception as e:  # a bug must not take the driver down: record it, go on
            self._error(correlation_id, cp.GENERIC_ERROR, f"{type(e).__name__}: {e}", e)

    def _touch_client(self, client_id: int) -> None:
        if client_id not in self.clients:
            raise CommandError(cp.GENERIC_ERROR,
                               f"unknown client {client_id} (timed out? connect again)")

    def _on_client_connect(self, command: cp.ClientConnect) -> None:
        label = f"client-heartbeat: {command.client_id} pid={command.pid} {command.name}"
        counter_id = self.counters.allocate(label, CLIENT_HEARTBEAT,
                                            registration_id=command.client_id,
                                            owner_id=command.client_id,
                                            reference_id=command.pid)
        self.counters.set_value(counter_id, self._now_ms())
        self.clients[command.client_id] = ClientSession(command.client_id, command.pid,
                                                        command.name, counter_id)
        self._send(cp.OnClientReady(command.correlation_id, counter_id))

    def _on_add_publication(self, command: cp.AddPublication) -> None:
        exclusive = isinstance(command, cp.AddExclusivePublication)
        channel = self._ipc_channel(command.channel, command.stream_id)
        publication = None
        if not exclusive:
            publication = self._find_concurrent(channel, command.stream_id)
        if publication is None:
            publication = self._create_publication(command, channel, exclusive)
        publication.owners.append(PublicationOwner(command.correlation_id, command.client_id))
        self._owner_index[command.correlation_id] = publication
        self.clients[command.client_id].publications.add(command.correlation_id)
        ready = cp.OnExclusivePublicationReady if exclusive else cp.OnPublicationReady
        self._send(ready(command.correlation_id, command.correlation_id, publication.session_id,
                         publication.stream_id, publication.limit_counter_id,
                         publication.log_file))

    def _on_remove_publication(self, command: cp.RemovePublication) -> None:
        publication = self._owner_index.pop(command.registration_id, None)
        if publication is None or not publication.remove_owner(command.registration_id,
                                                               self._now_ms()):
            raise CommandError(cp.UNKNOWN_PUBLICATION,
                               f"unknown publication {command.registration_id}")
        self.clients[command.client_id].publications.discard(command.registration_id)
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _on_add_subscription(self, command: cp.AddSubscription) -> None:
        channel = self._ipc_channel(command.channel, command.stream_id)
        uri = ChannelUri.parse(command.channel)
        link = SubscriptionLink(
            command.correlation_id, command.client_id, command.stream_id, channel,
            uri.bool_param("tether", self.context.tether_subscriptions),
            uri.int_param("session-id") if "session-id" in uri.params else None)
        self.subscriptions[link.registration_id] = link
        self._add(SystemCounter.SUBSCRIPTIONS, 1)
        self.clients[command.client_id].subscriptions.add(link.registration_id)
        self._send(cp.OnSubscriptionReady(command.correlation_id))
        for publication in self.publications:
            if self._matches(link, publication):
                self._link(publication, link)

    def _on_remove_subscription(self, command: cp.RemoveSubscription) -> None:
        if command.registration_id not in self.subscriptions:
            raise CommandError(cp.UNKNOWN_SUBSCRIPTION,
                               f"unknown subscription {command.registration_id}")
        self._remove_subscription(command.registration_id)
        self.clients[command.client_id].subscriptions.discard(command.registration_id)
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _on_client_close(self, command: cp.ClientClose) -> None:
        self._remove_client(command.client_id)

    _handlers: dict[type, Callable[[DriverConductor, cp.Message], None]] = {
        cp.ClientConnect: _on_client_connect,
        cp.AddPublication: _on_add_publication,
        cp.AddExclusivePublication: _on_add_publication,
        cp.RemovePublication: _on_remove_publication,
        cp.AddSubscription: _on_add_subscription,
        cp.RemoveSubscription: _on_remove_subscription,
        cp.ClientClose: _on_client_close,
    }

    # -- publications and links ----------------------------------------------------------------

    def _ipc_channel(self, channel: str, stream_id: int) -> ChannelUri:
        uri = ChannelUri.parse(channel)
        if not -(2**31) <= stream_id < 2**31 or stream_id == 0:
            raise CommandError(cp.INVALID_CHANNEL,
                               f"stream id {stream_id} must be a non-zero 32-bit integer")
        if not uri.is_ipc:
            raise CommandError(cp.INVALID_CHANNEL,
                               f"channel {channel!r}: udp channels need the netbridge, which "
                               f"this driver does not run yet")
        return uri

    def _find_concurrent(self, uri: ChannelUri, stream_id: int) -> IpcPublication | None:
        session = uri.int_param("session-id") if "session-id" in uri.params else None
        for publication in self.publications:
            if (not publication.exclusive and publication.stream_id == stream_id
                    and publication.state is PublicationState.ACTIVE
                    and (session is None or publication.session_id == session)):
                return publication
        return None

    def _create_publication(self, command: cp.AddPublication, uri: ChannelUri,
                            exclusive: bool) -> IpcPublication:
        registration_id = command.correlation_id
        term_length = uri.int_param("term-length", self.context.ipc_term_length)
        mtu = uri.int_param("mtu", self.context.mtu)
        if "session-id" in uri.params:
            session_id = uri.int_param("session-id")
            if any(p.session_id == session_id and p.stream_id == command.stream_id
                   for p in self.publications):
                raise CommandError(cp.GENERIC_ERROR,
                                   f"session-id {session_id} is already in use on stream "
                                   f"{command.stream_id}")
        else:
            session_id = self._new_session_id(command.stream_id)
        log_file = f"{LOGS_DIR}/{registration_id}.log"
        log = LogBuffer.create(self.directory / log_file, term_length=term_length,
                               initial_term_id=self._random.randint(-(2**31), 2**31 - 1),
                               mtu=mtu, session_id=session_id, stream_id=command.stream_id,
                               registration_id=registration_id)
        label = f"{registration_id} {session_id} {command.stream_id} {uri.canonical()}"
        counter_ids: list[int] = []
        try:
            for type_id, name in ((PUB_LIMIT, "pub-lmt"), (PUB_POS, "pub-pos")):
                counter_ids.append(self.counters.allocate(
                    f"{name}: {label}", type_id, registration_id=registration_id,
                    owner_id=command.client_id, reference_id=session_id))
        except CountersFullError:
            for counter_id in counter_ids:
                self.counters.free(counter_id)
            log.close()
            os.unlink(self.directory / log_file)
            raise
        limit = self._position(counter_ids[0])
        publication = IpcPublication(
            registration_id=registration_id, session_id=session_id,
            stream_id=command.stream_id, channel=uri.canonical(), exclusive=exclusive,
            log=log, log_file=log_file, limit_counter_id=counter_ids[0], limit=limit,
            pub_pos_counter_id=counter_ids[1], pub_pos=self._position(counter_ids[1]),
            flow=IpcFlowControl(log, limit, self.context.ipc_window or None))
        self.publications.append(publication)
        self._add(SystemCounter.PUBLICATIONS, 1)
        for link in self.subscriptions.values():
            if self._matches(link, publication):
                self._link(publication, link)
        return publication

    def _new_session_id(self, stream_id: int) -> int:
        used = {p.session_id for p in self.publications if p.stream_id == stream_id}
        while True:
            session_id = self._random.randint(-(2**31), 2**31 - 1)
            if session_id not in used:
                return session_id

    @staticmethod
    def _matches(link: SubscriptionLink, publication: IpcPublication) -> bool:
        return (link.stream_id == publication.stream_id
                and publication.state is PublicationState.ACTIVE
                and (link.session_id is None or link.session_id == publication.session_id))

    def _link(self, publication: IpcPublication, link: SubscriptionLink) -> None:
        join = publication.join_position()
        client = self.clients.get(link.client_id)
        who = f" pid={client.pid} {client.name}" if client else ""
        counter_id = self.counters.allocate(
            f"sub-pos: {link.registration_id} {publication.session_id} {publication.stream_id} "
            f"{publication.channel} @{join}{who}", SUB_POS,
            registration_id=link.registration_id, owner_id=link.client_id,
            reference_id=publication.registration_id)
        position = self._position(counter_id)
        position.set(join)
        link_id = self.to_driver.next_correlation_id()
        subscriber = SubscriberLink(link_id, link.registration_id, link.client_id, counter_id,
                                    position, link.tethered, LinkState.ACTIVE, self._now_ms())
        publication.subscribers[link_id] = subscriber
        publication.update_limit()
        self._send_image_event(publication, ImageEvent(True, subscriber, join))

    def _send_image_event(self, publication: IpcPublication, event: ImageEvent) -> None:
        link = event.link
        if event.available:
            self._send(cp.OnAvailableImage(link.link_id, link.subscription_id,
                                           publication.session_id, publication.stream_id,
                                           link.counter_id, event.join_position,
                                           publication.log_file, "ipc"))
        else:
            self._send(cp.OnUnavailableImage(link.link_id, link.subscription_id,
                                             publication.stream_id, publication.session_id))

    def _remove_subscription(self, registration_id: int) -> None:
        self.subscriptions.pop(registration_id, None)
        for publication in self.publications:
            for link_id, link in list(publication.subscribers.items()):
                if link.subscription_id == registration_id:
                    del publication.subscribers[link_id]
                    self.counters.free(link.counter_id)

    def _delete_publication(self, publication: IpcPublication) -> None:
        self.publications.remove(publication)
        for link in publication.subscribers.values():
            self.counters.free(link.counter_id)
        self.counters.free(publication.limit_counter_id)
        self.counters.free(publication.pub_pos_counter_id)
        publication.log.close()
        try:
            os.unlink(self.directory / publication.log_file)
        except FileNotFoundError:
            pass

    # -- clients -------------------------------------------------------------------------------

    def _check_clients(self, now_ms: int) -> int:
        timeout_ms = int(self.context.client_liveness_timeout * 1000)
        work = 0
        for client in list(self.clients.values()):
            heartbeat = self.counters.get_value(client.heartbeat_counter_id)
            if now_ms - heartbeat > timeout_ms:
                self._add(SystemCounter.CLIENT_TIMEOUTS, 1)
                self._send(cp.OnClientTimeout(client.client_id))
                self._remove_client(client.client_id)
                work += 1
        if self.to_driver.unblock():
            self._add(SystemCounter.UNBLOCKED_COMMANDS, 1)
        return work

    def _remove_client(self, client_id: int) -> None:
        client = self.clients.pop(client_id, None)
        if client is None:
            return
        now_ms = self._now_ms()
        for registration_id in client.subscriptions:
            self._remove_subscription(registration_id)
        for registration_id in client.publications:
            publication = self._owner_index.pop(registration_id, None)
            if publication is not None:
                publication.remove_owner(registration_id, now_ms)
        self.counters.free(client.heartbeat_counter_id)

    # -- helpers -------------------------------------------------------------------------------

    def _position(self, counter_id: int) -> Position:
        return Position(self.counters.values, self.counters.counter_offset(counter_id))

    def _add(self, counter: SystemCounter, delta: int) -> None:
        self.counters.add(counter.value, delta)

    def _send(self, message: cp.Message) -> None:
        self.to_clients.transmit(message.TYPE_ID, message.encode())

    def _error(self, correlation_id: int, code: int, message: str,
               exc: BaseException | None = None) -> None:
        self._add(SystemCounter.ERRORS, 1)
        self.error_log.record(exc if exc is not None else f"command error {code}: {message}")
        self._send(cp.OnError(correlation_id, code, message))

    def _now_ms(self) -> int:
        return self.counters.clock()

    def close(self) -> None:
        """Unmap every log (the driver deletes the directory's files after)."""
        for publication in self.publications:
            publication.log.close()
        self.publications.clear()
