"""The driver's conductor: commands from clients, linking publications to subscriptions, IPC
flow control, tethering, unblocking, client liveness and end of life.

The conductor owns the counters, the log files and the broadcast to clients. It is driven by
``do_work(now_ms)`` from the driver's loop (the clock is an argument, so tests drive it), and
never blocks, except to resolve the host names of a udp channel being added.
"""

from __future__ import annotations

import errno
import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shmbus.driver.channel_addresses import check_addresses
from shmbus.driver.group_claims import SubscriptionGroup
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.driver.ipc_publication import (
    ImageEvent,
    IpcPublication,
    LinkState,
    NetworkPublication,
    PublicationOwner,
    PublicationState,
    SubscriberLink,
    Timeouts,
)
from shmbus.driver.log_history import (
    EARLIEST,
    JoinPositionGone,
    check_join,
    pin_join,
    retained_range,
)
from shmbus.driver.network_image import NetworkImage
from shmbus.driver.system_counters import SystemCounter
from shmbus.settings.channel_uri import CONSUMER_GROUP, ChannelUri, ChannelUriError
from shmbus.settings.context import Context
from shmbus.settings.keyring import KeyringError, keyring_path, load_keyring
from shmbus.shm import control_protocol as cp
from shmbus.shm.block_ring import BlockRing, ring_path
from shmbus.shm.broadcast import BroadcastTransmitter
from shmbus.shm.counters import (
    CLIENT_HEARTBEAT,
    GROUP_CLAIM,
    GROUP_CLAIM_KEY,
    GROUP_MEMBERS,
    GROUP_ORPHAN,
    GROUP_POS,
    GROUP_REDELIVERED,
    PUB_LIMIT,
    PUB_POS,
    RCV_HWM,
    RCV_POS,
    SND_BPE,
    SND_LMT,
    SND_POS,
    SUB_POS,
    CountersFullError,
    CountersManager,
)
from shmbus.shm.error_log import DistinctErrorLog
from shmbus.shm.log_buffer import LogBuffer, LogBufferError
from shmbus.shm.position import Position
from shmbus.shm.ring_buffer import ManyToOneRingBuffer, RingBufferCorruptError

LOGS_DIR = "logs"
_T = TypeVar("_T")
#: a subscription waiting for the netbridge to take its endpoint is refused after this share of
#: the driver timeout (how long clients wait for an answer), so that it hears why
_BRIDGE_ANSWER_SHARE = 0.8
#: ``python -c BRIDGE_COMMAND '<context as JSON>'``: how the driver starts a netbridge.
BRIDGE_COMMAND = "from netbridge.bridge import embedded_main; embedded_main()"


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
    counters: set[int] = field(default_factory=set)          # counters it asked for


@dataclass
class SubscriptionLink:
    """A subscription: which stream it wants and whether it holds publishers back."""

    registration_id: int
    client_id: int
    stream_id: int
    channel: str
    tethered: bool
    session_id: int | None
    endpoint_key: tuple[str, ...] = ("ipc",)
    spy: bool = False                   # reads a local network publication's log
    simulate_connection: bool = False   # ssc=true: a spy counts as a connection
    group: str | None = None            # consumer-group: each message to one member
    #: join-position: where it starts in the logs there are when it is added (None: the end)
    join_position: int | str | None = None

    @property
    def is_network(self) -> bool:
        """Received from the network by the netbridge (spies read locally)."""
        return self.endpoint_key[0] != "ipc" and not self.spy


class DriverConductor:
    """Handles commands and timers for one bus directory. Single-threaded; the driver owns it.

    A subscription on a udp channel that is the first of its stream on its endpoint is answered
    once the netbridge has taken the endpoint (ReceiveChannelStatus): then it is ready, or it
    is refused with the netbridge's reason (CHANNEL_ENDPOINT_ERROR: e.g. another process holds
    the address). It waits while a netbridge is registered or being started, at most a share of
    the driver timeout; with no netbridge and auto-start off it is ready at once, and a
    netbridge started later reports what it cannot take to the error log.
    """

    def __init__(
        self,
        context: Context,
        directory: Path,
        to_driver: ManyToOneRingBuffer,
        to_clients: BroadcastTransmitter,
        counters: CountersManager,
        error_log: DistinctErrorLog,
        set_heartbeat: Callable[[int], None],
        ring_clients: Callable[[], None] = lambda: None,
    ) -> None:
        self.context = context
        self._ring_clients = ring_clients
        self._broadcasts = 0
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
        #: subscriptions waiting for the netbridge to take their endpoint, with since when (ms)
        self._awaiting_endpoint: dict[int, tuple[SubscriptionLink, int]] = {}
        self._owner_index: dict[int, IpcPublication] = {}
        self.images: dict[int, NetworkImage] = {}
        #: manual MDC destinations by publication: told again to a netbridge that registers
        #: after they were added (the one the publication starts, or a restarted one)
        self._destinations: dict[int, list[str]] = {}
        self.bridge_client_id: int | None = None
        self._bridge_process: subprocess.Popen[bytes] | None = None
        self._bridge_started_ms = 0
        self._next_timer_ms = 0
        #: where the command ring's head stood, and since when (for unblocking a dead claim)
        self._command_head = 0
        self._command_head_since_ms = 0
        self._last_client_ms = counters.clock()
        self._random = random.Random()

    # -- the loop ------------------------------------------------------------------------------

    def do_work(self, now_ms: int) -> int:
        """One duty cycle: commands, limits, and (every timer interval) timers. Returns work."""
        try:
            work = self.to_driver.read(self._on_command, 50)
        except RingBufferCorruptError as e:  # a client scribbled on the records: skipped
            self._add(SystemCounter.ERRORS, 1)
            self.error_log.record(f"to-driver ring buffer: {e}")
            work = 1
        published = 0
        for publication in self.publications:
            published += publication.update_limit()
        if published:
            self._add(SystemCounter.BYTES_PUBLISHED, published)
            work += 1
        if now_ms >= self._next_timer_ms:
            self._next_timer_ms = now_ms + int(self.context.timer_interval * 1000)
            work += self._on_timer(now_ms)
        if self._broadcasts:
            self._broadcasts = 0
            self._ring_clients()
        return work

    def ms_until_timer(self, now_ms: int) -> int:
        """How long the driver may sleep before its timers are due (0: due now)."""
        return max(0, self._next_timer_ms - now_ms)

    def _on_timer(self, now_ms: int) -> int:
        self.set_heartbeat(now_ms)
        self.to_driver.consumer_heartbeat_time = now_ms
        work = self._check_clients(now_ms)
        if self._bridge_died_unregistered() and self._network_in_use():
            self._bridge_process = None  # it died starting up: no client timeout will tell
            self._ensure_bridge()
        for publication in list(self.publications):
            for group in publication.groups.values():
                self._free(group.hand_on(publication.log))
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
        for image in list(self.images.values()):
            for group in image.groups.values():
                handed_on = group.hand_on(image.log)
                if handed_on:  # the receiver no longer follows the departed record
                    self._send(cp.OnImageSubscribers(image.image_id,
                                                     image.subscriber_counter_ids()))
                    self._free(handed_on)
            if image.is_done(now_ms, self.timeouts.linger_ms):
                self._delete_image(image)
                work += 1
        patience_ms = int(self.context.driver_timeout * _BRIDGE_ANSWER_SHARE * 1000)
        for registration_id, (link, since_ms) in list(self._awaiting_endpoint.items()):
            if now_ms - since_ms > patience_ms:
                del self._awaiting_endpoint[registration_id]
                self._error(registration_id, cp.CHANNEL_ENDPOINT_ERROR,
                            f"channel {link.channel!r}: no netbridge took the endpoint within "
                            f"{patience_ms / 1000:g} s (is one starting? see the error log)")
                work += 1
        if self._has_users():
            self._last_client_ms = now_ms
        return work

    def _has_users(self) -> bool:
        """Clients other than the netbridge (which serves them, and ends with the driver)."""
        return any(client_id != self.bridge_client_id for client_id in self.clients)

    def idle_for_ms(self, now_ms: int) -> int:
        """How long the driver has had no client (0 while it has one)."""
        return 0 if self._has_users() else now_ms - self._last_client_ms

    # -- commands ------------------------------------------------------------------------------

    def _on_command(self, msg_type: int, payload: memoryview) -> None:
        correlation_id = 0
        try:
            command = cp.decode(msg_type, payload)
            correlation_id = getattr(command, "correlation_id", 0)
            handler = self._handlers.get(type(command))
            if handler is None or not isinstance(command, cp.Command):
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

    def _check_owns_publication(self, client_id: int, registration_id: int) -> None:
        """A client changes only the publications it added (a wrong id from a buggy client
        must not close another client's)."""
        if registration_id not in self.clients[client_id].publications:
            raise CommandError(cp.UNKNOWN_PUBLICATION, f"unknown publication {registration_id} "
                                                       f"(not one client {client_id} added)")

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
        channel = self._parse_channel(command.channel, command.stream_id)
        if channel.spy:
            raise CommandError(cp.INVALID_CHANNEL,
                               f"channel {command.channel!r}: spies are for subscriptions")
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
        self._check_owns_publication(command.client_id, command.registration_id)
        publication = self._owner_index.pop(command.registration_id, None)
        if publication is None or not self._remove_owner(publication, command.registration_id):
            raise CommandError(cp.UNKNOWN_PUBLICATION,
                               f"unknown publication {command.registration_id}")
        self.clients[command.client_id].publications.discard(command.registration_id)
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _on_add_subscription(self, command: cp.AddSubscription) -> None:
        uri = self._parse_channel(command.channel, command.stream_id)
        link = SubscriptionLink(
            command.correlation_id, command.client_id, command.stream_id, uri.canonical(),
            uri.bool_param("tether", self.context.tether_subscriptions),
            uri.int_param("session-id") if "session-id" in uri.params else None,
            uri.endpoint_key(), spy=uri.spy, simulate_connection=uri.bool_param("ssc", False),
            group=uri.params.get(CONSUMER_GROUP), join_position=uri.join_position)
        if link.is_network:
            self._check_endpoint_key(link.endpoint_key, uri.key)
        if link.is_network and not self._wanted(link.endpoint_key, link.stream_id, ready_only=True):
            self._ensure_bridge()
            if self.bridge_client_id is not None or self.context.netbridge_auto_start:
                # answered when the netbridge says whether it could take the endpoint
                self._awaiting_endpoint[link.registration_id] = (link, self._now_ms())
                if self.bridge_client_id is not None:
                    self._send(cp.OnReceiveChannel(link.registration_id, link.stream_id,
                                                   link.channel))
                return
            self._send(cp.OnReceiveChannel(0, link.stream_id, link.channel))
        self._activate_subscription(link)

    def _check_endpoint_key(self, endpoint_key: tuple[str, ...], key: str | None) -> None:
        """An endpoint is keyed or not (the netbridge has one socket, one sealer, for it):
        CommandError when a subscription on it names another key than those before it."""
        links = [*self.subscriptions.values(), *(w for w, _ in self._awaiting_endpoint.values())]
        for other in links:
            if other.is_network and other.endpoint_key == endpoint_key:
                theirs = ChannelUri.parse(other.channel).key
                if theirs != key:
                    keyed = f"keyed with {theirs!r}" if theirs else "not keyed"
                    raise CommandError(cp.INVALID_CHANNEL, (
                        f"endpoint {endpoint_key[1]} is {keyed} by subscription "
                        f"{other.registration_id} ({other.channel!r}); this one names "
                        f"{f'key {key!r}' if key else 'no key'}: an endpoint is keyed or not"))

    def _wanted(self, endpoint_key: tuple[str, ...], stream_id: int,
                ready_only: bool = False) -> bool:
        """Whether a subscription (a ready one, or also one waiting for the netbridge) wants
        ``stream_id`` on that endpoint from the netbridge."""
        links = list(self.subscriptions.values())
        if not ready_only:
            links += [link for link, _ in self._awaiting_endpoint.values()]
        return any(link.endpoint_key == endpoint_key and link.stream_id == stream_id
                   for link in links)

    def _activate_subscription(self, link: SubscriptionLink) -> None:
        """The subscription is ready: answer it and link it to what it reads.

        With a join-position, every log it reads now is joined (and pinned) before it is
        answered, so a position no longer there refuses the subscription and joins nothing.
        """
        joined: list[tuple[IpcPublication, ImageEvent]] = []
        if not link.is_network:
            joined = self._attach_all(link)
        self.subscriptions[link.registration_id] = link
        self._add(SystemCounter.SUBSCRIPTIONS, 1)
        self.clients[link.client_id].subscriptions.add(link.registration_id)
        self._send(cp.OnSubscriptionReady(link.registration_id))
        if link.is_network:
            for image in self.images.values():
                if self._matches_image(link, image):
                    self._link_image(image, link)
            return
        for publication, event in joined:
            self._send_image_event(publication, event)

    def _attach_all(self, link: SubscriptionLink) -> list[tuple[IpcPublication, ImageEvent]]:
        """Attach ``link`` to every publication it matches at its join-position; all or none
        (CommandError naming the position and what the log holds)."""
        matching = [p for p in self.publications if self._matches(link, p)]
        strict = isinstance(link.join_position, int)
        try:
            if strict:
                for publication in matching:
                    if link.group in publication.groups:
                        continue  # a member joins its group where the group is
                    check_join(publication.log, int(link.join_position))  # type: ignore[arg-type]
        except JoinPositionGone as e:
            raise CommandError(cp.INVALID_CHANNEL, f"channel {link.channel!r}: {e}") from None
        joined: list[tuple[IpcPublication, ImageEvent]] = []
        try:
            for publication in matching:
                joined.append((publication, self._attach(publication, link,
                                                         link.join_position)))
        except JoinPositionGone as e:
            for publication, event in joined:
                self._detach(publication, event.link)
            raise CommandError(cp.INVALID_CHANNEL, f"channel {link.channel!r}: {e}") from None
        return joined

    def _on_remove_subscription(self, command: cp.RemoveSubscription) -> None:
        if command.registration_id not in self.clients[command.client_id].subscriptions:
            raise CommandError(cp.UNKNOWN_SUBSCRIPTION,
                               f"unknown subscription {command.registration_id} (not one "
                               f"client {command.client_id} added)")
        self._remove_subscription(command.registration_id)
        self.clients[command.client_id].subscriptions.discard(command.registration_id)
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _on_client_close(self, command: cp.ClientClose) -> None:
        self._remove_client(command.client_id)

    def _on_destination(self, command: cp.AddDestination) -> None:
        self._check_owns_publication(command.client_id, command.registration_id)
        publication = self._owner_index.get(command.registration_id)
        if not isinstance(publication, NetworkPublication):
            raise CommandError(cp.UNKNOWN_PUBLICATION,
                               f"publication {command.registration_id} is not a udp publication")
        if ChannelUri.parse(publication.channel).control_mode != "manual":
            raise CommandError(cp.INVALID_CHANNEL,
                               f"destinations are added to control-mode=manual publications; "
                               f"{publication.channel!r} is not one")
        destination = ChannelUri.parse(command.destination)
        if destination.is_ipc or "endpoint" not in destination.params:
            raise CommandError(cp.INVALID_CHANNEL, f"destination {command.destination!r} "
                               f"needs aeron:udp?endpoint=host:port")
        check_addresses(destination, command.destination)
        added = not isinstance(command, cp.RemoveDestination)
        endpoint = destination.params["endpoint"]
        known = self._destinations.setdefault(publication.registration_id, [])
        if added and endpoint not in known:
            known.append(endpoint)
        elif not added and endpoint in known:
            known.remove(endpoint)
        self._send(cp.OnDestination(publication.registration_id, int(added), endpoint))
        self._send(cp.OnOperationSuccess(command.correlation_id))

    # -- the netbridge's commands --------------------------------------------------------------

    def _on_register_bridge(self, command: cp.RegisterBridge) -> None:
        if self.bridge_client_id is not None and self.bridge_client_id != command.client_id:
            raise CommandError(cp.GENERIC_ERROR, f"a netbridge (client "
                               f"{self.bridge_client_id}) is already registered")
        self.bridge_client_id = command.client_id
        self._send(cp.OnOperationSuccess(command.correlation_id))
        for publication in self.publications:
            if isinstance(publication, NetworkPublication):
                self._announce(publication)
                for endpoint in self._destinations.get(publication.registration_id, ()):
                    self._send(cp.OnDestination(publication.registration_id, 1, endpoint))
        announced: set[tuple[tuple[str, ...], int]] = set()
        for link in self.subscriptions.values():
            key = (link.endpoint_key, link.stream_id)
            if link.is_network and key not in announced:
                announced.add(key)
                self._send(cp.OnReceiveChannel(0, link.stream_id, link.channel))
        for link, _ in self._awaiting_endpoint.values():
            self._send(cp.OnReceiveChannel(link.registration_id, link.stream_id, link.channel))

    def _on_receive_channel_status(self, command: cp.ReceiveChannelStatus) -> None:
        self._require_bridge(command.client_id)
        waiting = self._awaiting_endpoint.pop(command.subscription_id, None)
        error = f"channel {command.channel!r}: {command.error}" if command.error else ""
        if waiting is not None and error:
            self._error(command.subscription_id, cp.CHANNEL_ENDPOINT_ERROR, error)
        elif waiting is not None:
            self._activate_subscription(waiting[0])
        elif error:  # for subscriptions that were ready before the netbridge (re)started
            self._add(SystemCounter.ERRORS, 1)
            self.error_log.record(f"netbridge: {error}")
        else:
            # the subscription it was for went away meanwhile: let the endpoint go again
            # unless someone else wants the stream there
            if not self._wanted(ChannelUri.parse(command.channel).endpoint_key(),
                                command.stream_id):
                self._send(cp.OnReceiveChannelClosed(command.stream_id, command.channel))
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _on_add_counter(self, command: cp.AddCounter) -> None:
        counter_id = self.counters.allocate(
            command.label, command.type_id,
            registration_id=command.registration_id or command.correlation_id,
            owner_id=command.client_id, reference_id=command.reference_id)
        self.clients[command.client_id].counters.add(counter_id)
        self._send(cp.OnCounterReady(command.correlation_id, counter_id))

    def _on_remove_counter(self, command: cp.RemoveCounter) -> None:
        owned = self.clients[command.client_id].counters
        if command.counter_id not in owned:
            raise CommandError(cp.GENERIC_ERROR, f"counter {command.counter_id} is not one "
                                                 f"client {command.client_id} allocated")
        owned.discard(command.counter_id)
        self.counters.free(command.counter_id)
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _on_create_image(self, command: cp.CreateImage) -> None:
        self._require_bridge(command.client_id)
        uri = ChannelUri.parse(command.channel)
        image_id = command.correlation_id
        log_file = f"{LOGS_DIR}/{image_id}.log"
        log = self._create_with_room(lambda: LogBuffer.create(
            self.directory / log_file, term_length=command.term_length,
            initial_term_id=command.initial_term_id, mtu=command.mtu,
            session_id=command.session_id, stream_id=command.stream_id,
            registration_id=image_id))
        label = (f"{image_id} {command.session_id} {command.stream_id} {uri.canonical()} "
                 f"{command.source_identity}")
        hwm = self.counters.allocate(f"rcv-hwm: {label}", RCV_HWM, registration_id=image_id,
                                     owner_id=command.client_id,
                                     reference_id=command.session_id)
        pos = self.counters.allocate(f"rcv-pos: {label}", RCV_POS, registration_id=image_id,
                                     owner_id=command.client_id,
                                     reference_id=command.session_id)
        rcv_pos = self._position(pos)
        rcv_pos.set(command.join_position)
        self._position(hwm).set(command.join_position)
        image = NetworkImage(image_id, uri.canonical(), command.session_id, command.stream_id,
                             command.source_identity, log, log_file, hwm, pos, rcv_pos,
                             command.join_position)
        self.images[image_id] = image
        self._send(cp.OnImageReady(command.correlation_id, image_id, hwm, pos, log_file))
        endpoint_key = uri.endpoint_key()
        for link in self.subscriptions.values():
            if link.endpoint_key == endpoint_key and self._matches_image(link, image):
                self._link_image(image, link, notify_bridge=False)
        self._send(cp.OnImageSubscribers(image_id, image.subscriber_counter_ids()))

    def _on_close_image(self, command: cp.CloseImage) -> None:
        self._require_bridge(command.client_id)
        image = self.images.get(command.image_id)
        if image is None:
            raise CommandError(cp.GENERIC_ERROR, f"unknown image {command.image_id}")
        if image.closing_since_ms is None:
            image.closing_since_ms = self._now_ms()
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _on_report_error(self, command: cp.ReportError) -> None:
        self._require_bridge(command.client_id)
        self.error_log.record(f"netbridge: {command.error}")
        self._send(cp.OnOperationSuccess(command.correlation_id))

    def _require_bridge(self, client_id: int) -> None:
        if client_id != self.bridge_client_id:
            raise CommandError(cp.GENERIC_ERROR, "only the registered netbridge may do this")

    # each handler takes a command of its key's type
    _handlers: dict[type[cp.Message], Callable[[DriverConductor, Any], None]] = {
        cp.AddDestination: _on_destination,
        cp.RemoveDestination: _on_destination,
        cp.RegisterBridge: _on_register_bridge,
        cp.AddCounter: _on_add_counter,
        cp.RemoveCounter: _on_remove_counter,
        cp.CreateImage: _on_create_image,
        cp.CloseImage: _on_close_image,
        cp.ReceiveChannelStatus: _on_receive_channel_status,
        cp.ReportError: _on_report_error,
        cp.ClientConnect: _on_client_connect,
        cp.AddPublication: _on_add_publication,
        cp.AddExclusivePublication: _on_add_publication,
        cp.RemovePublication: _on_remove_publication,
        cp.AddSubscription: _on_add_subscription,
        cp.RemoveSubscription: _on_remove_subscription,
        cp.ClientClose: _on_client_close,
    }

    # -- publications and links ----------------------------------------------------------------

    def _parse_channel(self, channel: str, stream_id: int) -> ChannelUri:
        uri = ChannelUri.parse(channel)
        check_addresses(uri, channel)
        if uri.key is not None:  # the netbridge seals with it: a missing key fails here, clearly
            try:
                load_keyring(keyring_path(self.context.keyring)).keys_of(uri.key)
            except KeyringError as e:
                raise CommandError(cp.INVALID_CHANNEL, f"channel {channel!r}: {e}") from None
        if stream_id == 0:  # the wire format holds any other 32-bit signed integer
            raise CommandError(cp.INVALID_CHANNEL,
                               "stream_id 0 is reserved: a stream id is a non-zero 32-bit "
                               "signed integer")
        return uri

    def _find_concurrent(self, uri: ChannelUri, stream_id: int) -> IpcPublication | None:
        session = uri.int_param("session-id") if "session-id" in uri.params else None
        for publication in self.publications:
            if (not publication.exclusive and publication.stream_id == stream_id
                    and publication.endpoint_key == uri.endpoint_key()
                    and publication.state is PublicationState.ACTIVE
                    and (session is None or publication.session_id == session)):
                return publication
        return None

    def _create_publication(self, command: cp.AddPublication, uri: ChannelUri,
                            exclusive: bool) -> IpcPublication:
        registration_id = command.correlation_id
        term_length = uri.int_param("term-length", self.context.ipc_term_length if uri.is_ipc
                                    else self.context.udp_term_length)
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
        initial_term_id = self._random.randint(-(2**31), 2**31 - 1)
        log = self._create_with_room(lambda: LogBuffer.create(
            self.directory / log_file, term_length=term_length, initial_term_id=initial_term_id,
            mtu=mtu, session_id=session_id, stream_id=command.stream_id,
            registration_id=registration_id))
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
        fields: dict[str, Any] = dict(
            registration_id=registration_id, session_id=session_id,
            stream_id=command.stream_id, channel=uri.canonical(), exclusive=exclusive,
            log=log, log_file=log_file, limit_counter_id=counter_ids[0], limit=limit,
            pub_pos_counter_id=counter_ids[1], pub_pos=self._position(counter_ids[1]),
            endpoint_key=uri.endpoint_key())
        if uri.is_ipc:
            try:
                blocks = self._create_with_room(lambda: BlockRing.create(
                    ring_path(self.directory / log_file), self.context.max_large_message_length,
                    self.context.large_message_warm_share))
            except OSError:
                for counter_id in counter_ids:
                    self.counters.free(counter_id)
                log.close()
                os.unlink(self.directory / log_file)
                raise
            publication = IpcPublication(
                **fields, flow=IpcFlowControl(log, limit, self.context.ipc_window or None),
                blocks=blocks)
        else:
            snd = [self.counters.allocate(f"{name}: {label}", type_id,
                                          registration_id=registration_id,
                                          owner_id=command.client_id, reference_id=session_id)
                   for type_id, name in ((SND_POS, "snd-pos"), (SND_LMT, "snd-lmt"),
                                         (SND_BPE, "snd-bpe"))]
            publication = NetworkPublication(
                **fields, flow=IpcFlowControl(log, limit, clean_lag=term_length),
                snd_pos_counter_id=snd[0], snd_lmt_counter_id=snd[1],
                snd_bpe_counter_id=snd[2], snd_pos=self._position(snd[0]))
        log.publication_window = publication.flow.window
        self.publications.append(publication)
        self._add(SystemCounter.PUBLICATIONS, 1)
        if isinstance(publication, NetworkPublication):
            self._ensure_bridge()
            self._announce(publication)
        for link in self.subscriptions.values():
            if self._matches(link, publication):
                self._link(publication, link)
        return publication

    def _create_with_room(self, create: Callable[[], _T]) -> _T:
        """``create()`` a file of the bus (a log, a block ring); when the filesystem has no
        room for it (ENOSPC), the block rings first give back the warm pages no live block
        holds (BlockRing.give_back_warm), then it is tried once more: a second failure, or a
        first one with nothing to give back, is the error as it is (with the sizes)."""
        try:
            return create()
        except OSError as e:
            if e.errno != errno.ENOSPC or not self._give_back_warm():
                raise
        return create()

    def _give_back_warm(self) -> int:
        """Every block ring's warm pages that no live block holds go back to the filesystem;
        returns the bytes given back (also counted)."""
        freed = sum(p.blocks.give_back_warm() for p in self.publications
                    if p.blocks is not None)
        if freed:
            self._add(SystemCounter.WARM_BYTES_GIVEN_BACK, freed)
        return freed

    def _remove_owner(self, publication: IpcPublication, registration_id: int) -> bool:
        """Drop an owner; when the last one goes, a network publication's stream ends."""
        if not publication.remove_owner(registration_id, self._now_ms()):
            return False
        if (isinstance(publication, NetworkPublication)
                and publication.state is PublicationState.DRAINING):
            self._send(cp.OnNetworkPublicationClosed(publication.registration_id,
                                                     publication.log.end_of_stream_position))
        return True

    def _announce(self, publication: NetworkPublication) -> None:
        self._send(cp.OnNetworkPublication(
            publication.registration_id, publication.session_id, publication.stream_id,
            publication.snd_pos_counter_id, publication.snd_lmt_counter_id,
            publication.snd_bpe_counter_id, publication.channel, publication.log_file))

    def _new_session_id(self, stream_id: int) -> int:
        used = {p.session_id for p in self.publications if p.stream_id == stream_id}
        while True:
            session_id = self._random.randint(-(2**31), 2**31 - 1)
            if session_id not in used:
                return session_id

    @staticmethod
    def _matches(link: SubscriptionLink, publication: IpcPublication) -> bool:
        return (link.stream_id == publication.stream_id
                and link.endpoint_key == publication.endpoint_key
                and link.spy == isinstance(publication, NetworkPublication)
                and publication.state is PublicationState.ACTIVE
                and (link.session_id is None or link.session_id == publication.session_id))

    @staticmethod
    def _matches_image(link: SubscriptionLink, image: NetworkImage) -> bool:
        return (link.stream_id == image.stream_id and link.is_network
                and image.closing_since_ms is None
                and link.endpoint_key == ChannelUri.parse(image.channel).endpoint_key()
                and (link.session_id is None or link.session_id == image.session_id))

    def _link_image(self, image: NetworkImage, link: SubscriptionLink,
                    notify_bridge: bool = True) -> None:
        join = image.rcv_pos.get()
        if link.group is not None:  # a member claims where its group is
            subscriber = self._join_group(image, link, link.group, join)
            join = image.groups[link.group].position.get()
        else:
            subscriber = self._subscriber_link(link, image.session_id, image.stream_id,
                                               image.channel, image.image_id, join)
        image.subscribers[subscriber.link_id] = subscriber
        self._send(cp.OnAvailableImage(subscriber.link_id, link.registration_id,
                                       image.session_id, image.stream_id, subscriber.counter_id,
                                       join, image.log_file, image.source_identity))
        if notify_bridge:
            self._send(cp.OnImageSubscribers(image.image_id, image.subscriber_counter_ids()))

    def _subscriber_link(self, link: SubscriptionLink, session_id: int, stream_id: int,
                         channel: str, reference_id: int, join: int) -> SubscriberLink:
        client = self.clients.get(link.client_id)
        who = f" pid={client.pid} {client.name}" if client else ""
        counter_id = self.counters.allocate(
            f"sub-pos: {link.registration_id} {session_id} {stream_id} {channel} @{join}{who}",
            SUB_POS, registration_id=link.registration_id, owner_id=link.client_id,
            reference_id=reference_id)
        position = self._position(counter_id)
        position.set(join)
        return SubscriberLink(self.to_driver.next_correlation_id(), link.registration_id,
                              link.client_id, counter_id, position, link.tethered,
                              LinkState.ACTIVE, self._now_ms())

    def _link(self, publication: IpcPublication, link: SubscriptionLink) -> None:
        self._send_image_event(publication, self._attach(publication, link, None))

    def _attach(self, publication: IpcPublication, link: SubscriptionLink,
                join_request: int | str | None) -> ImageEvent:
        """Link ``link`` to ``publication``, starting at the live end, or at ``join_request``
        (a position, or 'earliest') pinned against cleaning (log_history); the image event to
        send. JoinPositionGone, having undone the link, when a strict position was cleaned."""
        start = publication.join_position()
        if join_request == EARLIEST:
            start = retained_range(publication.log)[0]
        elif isinstance(join_request, int):
            start = join_request
        if link.group is not None:
            new_group = link.group not in publication.groups
            subscriber = self._join_group(publication, link, link.group,
                                          start if join_request is not None else None)
            counter = publication.groups[link.group].position
            if not new_group:
                join_request = None  # a group's position is the group's, not a member's
        else:
            subscriber = self._subscriber_link(link, publication.session_id,
                                               publication.stream_id, publication.channel,
                                               publication.registration_id, start)
            counter = subscriber.position
        publication.subscribers[subscriber.link_id] = subscriber
        if link.simulate_connection and isinstance(publication, NetworkPublication):
            publication.spies_simulate_connection = True
        publication.update_limit()
        if join_request is not None:
            try:
                pin_join(publication.log, counter, counter.get(),
                         strict=join_request != EARLIEST)
            except JoinPositionGone:
                self._detach(publication, subscriber)
                raise
        return ImageEvent(True, subscriber, counter.get())

    def _detach(self, publication: IpcPublication, subscriber: SubscriberLink) -> None:
        """Undo an _attach whose image event was never sent."""
        del publication.subscribers[subscriber.link_id]
        if subscriber.group is None:
            self.counters.free(subscriber.counter_id)
        else:
            self._leave_group(publication, subscriber, subscriber.group)
        publication.update_limit()

    def _join_group(self, publication: IpcPublication | NetworkImage, link: SubscriptionLink,
                    name: str, start: int | None = None) -> SubscriberLink:
        """A member's claim record in its group on this publication or network image (the
        group is made when its first member comes, claiming from ``start``, by default the
        publication's live end); the record takes the place of a sub-pos counter."""
        stream = f"{publication.session_id} {publication.stream_id} {publication.channel}"
        label = f"{publication.registration_id} {stream}"
        group = publication.groups.get(name)
        if group is None:
            ids = self._allocate_all(
                [(f"{kind}: {label} group={name}", type_id) for kind, type_id in (
                    ("grp-pos", GROUP_POS), ("grp-orphan", GROUP_ORPHAN),
                    ("grp-members", GROUP_MEMBERS), ("grp-redelivered", GROUP_REDELIVERED))],
                registration_id=publication.registration_id, owner_id=link.client_id,
                reference_id=publication.registration_id)
            group = SubscriptionGroup(name, ids[0], self._position(ids[0]), ids[1],
                                      self._position(ids[1]), ids[2], self._position(ids[2]),
                                      ids[3], self._position(ids[3]))
            if start is None:
                assert isinstance(publication, IpcPublication)
                start = publication.join_position()
            group.start(start)
            publication.groups[name] = group
        client = self.clients.get(link.client_id)
        who = f" pid={client.pid} {client.name}" if client else ""
        # the subscription's registration id is the member's claim-lock token
        counter_id = self.counters.allocate(
            f"grp-claim: {link.registration_id} {stream} group={name}{who}", GROUP_CLAIM,
            key=GROUP_CLAIM_KEY.pack(group.position_counter_id, group.orphan_counter_id,
                                     link.registration_id),
            registration_id=link.registration_id, owner_id=link.client_id,
            reference_id=publication.registration_id)
        record = self._position(counter_id)
        group.add_member(counter_id, record)
        return SubscriberLink(self.to_driver.next_correlation_id(), link.registration_id,
                              link.client_id, counter_id, record, True, LinkState.ACTIVE,
                              self._now_ms(), group=name)

    def _leave_group(self, publication: IpcPublication | NetworkImage, link: SubscriberLink,
                     name: str) -> None:
        """A member left (closed, or its client timed out): its unfinished claim is handed on;
        the last member's leaving ends the group."""
        group = publication.groups[name]
        if group.remove_member(link.counter_id, link.subscription_id):
            self.counters.free(link.counter_id)
        if group.members:
            self._free(group.hand_on(publication.log))
        else:
            self._free(group.counter_ids())
            del publication.groups[name]

    def _allocate_all(self, counters: list[tuple[str, int]], *, registration_id: int,
                      owner_id: int, reference_id: int) -> list[int]:
        """Allocate (label, type id) counters with the same ids, all or none."""
        allocated: list[int] = []
        try:
            for label, type_id in counters:
                allocated.append(self.counters.allocate(
                    label, type_id, registration_id=registration_id, owner_id=owner_id,
                    reference_id=reference_id))
        except CountersFullError:
            self._free(allocated)
            raise
        return allocated

    def _free(self, counter_ids: list[int]) -> None:
        for counter_id in counter_ids:
            self.counters.free(counter_id)

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
        removed = self.subscriptions.pop(registration_id, None)
        for publication in self.publications:
            for link_id, link in list(publication.subscribers.items()):
                if link.subscription_id == registration_id:
                    del publication.subscribers[link_id]
                    if link.group is None:
                        self.counters.free(link.counter_id)
                    else:
                        self._leave_group(publication, link, link.group)
        for image in self.images.values():
            for link_id, link in list(image.subscribers.items()):
                if link.subscription_id == registration_id:
                    del image.subscribers[link_id]
                    if link.group is None:
                        self.counters.free(link.counter_id)
                    else:
                        self._leave_group(image, link, link.group)
                    self._send(cp.OnImageSubscribers(image.image_id,
                                                     image.subscriber_counter_ids()))
        if removed is not None and removed.is_network and not self._wanted(
                removed.endpoint_key, removed.stream_id):
            self._send(cp.OnReceiveChannelClosed(removed.stream_id, removed.channel))

    def _delete_publication(self, publication: IpcPublication) -> None:
        self.publications.remove(publication)
        self._destinations.pop(publication.registration_id, None)
        for link in publication.subscribers.values():
            if link.group is None:
                self.counters.free(link.counter_id)
        for group in publication.groups.values():
            self._free(group.counter_ids())
        self.counters.free(publication.limit_counter_id)
        self.counters.free(publication.pub_pos_counter_id)
        if isinstance(publication, NetworkPublication):
            for counter_id in (publication.snd_pos_counter_id, publication.snd_lmt_counter_id,
                               publication.snd_bpe_counter_id):
                self.counters.free(counter_id)
        publication.log.close()
        paths = [self.directory / publication.log_file]
        if publication.blocks is not None:
            publication.blocks.close()
            paths.append(publication.blocks.path)
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _delete_image(self, image: NetworkImage) -> None:
        del self.images[image.image_id]
        for link in image.subscribers.values():
            self._send(cp.OnUnavailableImage(link.link_id, link.subscription_id,
                                             image.stream_id, image.session_id))
            if link.group is None:
                self.counters.free(link.counter_id)
        for group in image.groups.values():
            self._free(group.counter_ids())
        self.counters.free(image.rcv_hwm_counter_id)
        self.counters.free(image.rcv_pos_counter_id)
        image.log.close()
        try:
            os.unlink(self.directory / image.log_file)
        except FileNotFoundError:
            pass

    # -- the netbridge process -----------------------------------------------------------------

    def _ensure_bridge(self) -> None:
        """Start a netbridge for this directory unless one is registered or starting."""
        if self.bridge_client_id is not None or not self.context.netbridge_auto_start:
            return
        now_ms = self._now_ms()
        process = self._bridge_process
        if process is not None and process.poll() is None and (
                now_ms - self._bridge_started_ms < 10_000):
            return
        self._bridge_process = subprocess.Popen(
            [sys.executable, "-c", BRIDGE_COMMAND, self.context.to_json()],
            stdin=subprocess.DEVNULL, start_new_session=True)
        self._bridge_started_ms = now_ms

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
        head = self.to_driver.consumer_position()
        if head != self._command_head or self.to_driver.size() == 0:
            self._command_head, self._command_head_since_ms = head, now_ms
        elif now_ms - self._command_head_since_ms > timeout_ms and self.to_driver.unblock():
            # a client died between claiming and committing a command: pass its record
            self._add(SystemCounter.UNBLOCKED_COMMANDS, 1)
            work += 1
        return work

    def _remove_client(self, client_id: int) -> None:
        client = self.clients.pop(client_id, None)
        if client is None:
            return
        now_ms = self._now_ms()
        for registration_id, (link, _) in list(self._awaiting_endpoint.items()):
            if link.client_id == client_id:
                del self._awaiting_endpoint[registration_id]
        for registration_id in client.subscriptions:
            self._remove_subscription(registration_id)
        for registration_id in client.publications:
            publication = self._owner_index.pop(registration_id, None)
            if publication is not None:
                self._remove_owner(publication, registration_id)
        for counter_id in client.counters:
            self.counters.free(counter_id)
        self.counters.free(client.heartbeat_counter_id)
        if client_id == self.bridge_client_id:
            self.bridge_client_id = None
            for image in self.images.values():
                if image.closing_since_ms is None:
                    image.closing_since_ms = now_ms
            for publication in self.publications:
                if isinstance(publication, NetworkPublication):
                    publication.log.active_transport_count = 0
            if self._network_in_use():
                # it died (or hung): a new one takes over every udp channel as it registers
                then = ("starting another" if self.context.netbridge_auto_start
                        else "start one by hand (netbridge_auto_start is off)")
                self.error_log.record(f"netbridge (client {client_id}, pid {client.pid}) "
                                      f"went away with udp channels in use; {then}")
                old = self._bridge_process
                if old is not None and old.pid == client.pid and old.poll() is None:
                    old.kill()  # declared dead: it must not come back beside the new one
                self._bridge_process = None
                self._ensure_bridge()

    def _bridge_died_unregistered(self) -> bool:
        """The netbridge this driver started exited before it registered as a client."""
        process = self._bridge_process
        return (self.bridge_client_id is None and process is not None
                and process.poll() is not None)

    def _network_in_use(self) -> bool:
        """Whether any publication or subscription is on a udp channel."""
        return any(isinstance(p, NetworkPublication) and p.state is PublicationState.ACTIVE
                   for p in self.publications) or any(
            link.is_network for link in self.subscriptions.values()) or bool(
            self._awaiting_endpoint)

    # -- helpers -------------------------------------------------------------------------------

    def _position(self, counter_id: int) -> Position:
        return Position(self.counters.values, self.counters.counter_offset(counter_id))

    def _add(self, counter: SystemCounter, delta: int) -> None:
        self.counters.add(counter.value, delta)

    def _send(self, message: cp.Message) -> None:
        self.to_clients.transmit(message.TYPE_ID, message.encode())
        self._broadcasts += 1

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
        for image in self.images.values():
            image.log.close()
        self.images.clear()
        if self._bridge_process is not None and self._bridge_process.poll() is None:
            self._bridge_process.terminate()
