"""The bus client: ``shmbus.connect()`` and what it returns.

A :class:`Client` talks to the driver through cnc.dat: commands on the to-driver ring buffer
(then it rings the driver's doorbell), responses and image events on the broadcast buffer (the
driver rings the clients' doorbell). A conductor thread per client, asleep on that doorbell
between events, handles them as Aeron's client conductor does: images appear and go, image
callbacks run and a dead driver is noticed whether or not the application ever polls. Requests
(add_*, close) wait for the conductor to hand them their answer. The heartbeat runs in a native
thread without the GIL.

With ``conductor_thread=False`` (Aeron's invoker mode, for processes with a duty loop of their
own such as the netbridge) nothing runs in the background: the owner calls ``_service()``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, overload

import psutil

from shmbus.calls.call_counters import CallCounters
from shmbus.calls.call_counters import label as call_label
from shmbus.calls.remote_calls import keyed_reply_channel, requester_route, service_channel
from shmbus.calls.requester import Requester
from shmbus.calls.responder import RequestHandler, Responder
from shmbus.calls.responder import group_name as responder_group
from shmbus.client.reconnection import DriverLoss, Reconnected
from shmbus.history.late_join import LateJoinSubscription, Recording
from shmbus.settings.channel_uri import with_join_position
from shmbus.settings.context import Context
from shmbus.settings.errors import (
    ClientClosedError,
    ClientTimeoutError,
    DriverTimeoutError,
    DriverUnavailableError,
    RegistrationError,
    ShmbusError,
)
from shmbus.shm import control_protocol as cp
from shmbus.shm._native import Heartbeat, epoch_ms
from shmbus.shm.broadcast import BroadcastReceiver
from shmbus.shm.bus_directory import prepare_directory
from shmbus.shm.call_header import RESPONSE_CHANNEL, response_stream_for
from shmbus.shm.cnc import (
    CLIENTS_DOORBELL_OFFSET,
    COUNTERS_METADATA,
    COUNTERS_VALUES,
    DRIVER_DOORBELL_OFFSET,
    TO_CLIENTS,
    TO_DRIVER,
    CncError,
    CncFile,
)
from shmbus.shm.counters import (
    REGISTRATION_ID_OFFSET,
    REQUESTER_COUNTERS,
    RESPONDER_COUNTERS,
    TYPE_NAMES,
    CountersReader,
)
from shmbus.shm.doorbell import Doorbell
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position
from shmbus.shm.ring_buffer import ManyToOneRingBuffer
from shmbus.streams.image import Image
from shmbus.streams.publication import ConcurrentPublication, ExclusivePublication, Publication
from shmbus.streams.subscription import ImageHandler, Subscription
from shmbus.streams.subscription_group import GroupImage, GroupSubscription, group_channel

PublicationT = TypeVar("PublicationT", bound=Publication)

LAUNCH_LOCK = "launch.lock"
_DRIVER_CHECK_INTERVAL_S = 0.1
#: how long a removed image's log stays mapped: a handler may still hold a view into it
_LOG_LINGER_S = 3.0
_live_clients: weakref.WeakSet[Client] = weakref.WeakSet()
_launched: list[subprocess.Popen[bytes]] = []


def connect(context: Context | None = None, **settings: Any) -> Client:
    """Connect to the bus in ``context.dir``, starting an embedded driver if none is alive.

    Settings come from ``context`` (a :class:`Context`, e.g. passed to a worker process), or
    from keyword arguments, then ``SHMBUS_*`` variables, then defaults. Raises
    DriverUnavailableError when no driver runs and ``embedded_driver`` is False, or when one
    cannot be started; PermissionError for a directory of another user.
    """
    if context is None:
        context = Context.resolve(**settings)
    elif settings:
        context = context.with_(**settings)
    return Client(context)


class Client:
    """A connection to a driver. Not usable after fork: connect again in the child.

    Thread-safe: any thread may add, close, publish and poll. Once the driver is gone (or has
    timed this client out), every call raises that error (DriverTimeoutError,
    ClientTimeoutError) and the publications and subscriptions are closed.

    With ``reconnect=True`` a client that finds its driver dead (no heartbeat for
    driver_timeout) does not fail. It removes every image (``on_unavailable_image`` runs) and
    its publications refuse offers (NOT_CONNECTED); it then looks for a new live driver in
    the same directory every 0.1 s (or starts one, with ``embedded_driver``) for as long as
    it is open, and re-adds every publication and subscription there: the same objects, with
    new registration ids, a new session per publication, images from the new driver as
    usual. ``on_reconnect`` (called on the conductor thread) then receives a
    :class:`~shmbus.client.reconnection.Reconnected` saying what was lost; ``reconnects`` counts
    them. What is lost: messages offered after the driver died and before the client
    noticed (up to driver_timeout) unless a subscriber read them from the old log; after
    that offers are refused until the new publication is connected; a subscriber loses
    whatever the old logs held that it had not read. While reconnecting, ``add_*`` and
    destination changes wait for the new driver (at most driver_timeout, then
    DriverTimeoutError saying the client is reconnecting; at once on the conductor thread);
    closing a publication, a subscription or the client works at once. A client timed out
    by a live driver (ClientTimeoutError) still fails.
    """

    def __init__(self, context: Context, *, conductor_thread: bool = True) -> None:
        self.context = context
        self.directory = Path(context.dir)
        self._pid = os.getpid()
        self._closed = False
        self._closing = False
        self._driver_timeout_ms = int(context.driver_timeout * 1000)
        self._next_driver_check = 0.0
        self._responses: dict[int, cp.Message] = {}
        self._awaiting: set[int] = set()
        self._lock = threading.RLock()  # the client's state; held while events are handled
        self._answered = threading.Condition(self._lock)
        self._error: ShmbusError | None = None
        #: what a dead driver took, while reconnecting (context.reconnect)
        self._lost: DriverLoss | None = None
        #: called on the conductor thread after each reconnection, with what was lost
        self.on_reconnect: Callable[[Reconnected], None] | None = None
        self.reconnects = 0
        self._images_bell = Doorbell.private()  # wakes this client's waiting subscribers
        self._lingering: list[tuple[float, LogBuffer]] = []
        self._conductor: threading.Thread | None = None
        #: called with driver events this client does not handle itself (the netbridge's)
        self.on_driver_event: Callable[[cp.Message], None] | None = None
        self._logs: dict[str, tuple[LogBuffer, int]] = {}
        self._publications: dict[int, Publication] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._heartbeat: Heartbeat | None = None
        self._attach(_open_or_launch(context))
        _live_clients.add(self)
        if conductor_thread:
            self._conductor = threading.Thread(
                target=_run_conductor, args=(weakref.ref(self),),
                name=f"shmbus-conductor-{self.client_id}", daemon=True)
            self._conductor.start()

    def _attach(self, cnc: CncFile) -> None:
        """Map the driver's cnc.dat and introduce this client to it (a new client id, a
        heartbeat). Raises as _request does."""
        self.cnc = cnc
        self._to_driver = ManyToOneRingBuffer(cnc.section(TO_DRIVER))
        self._to_clients = BroadcastReceiver(cnc.section(TO_CLIENTS))
        self.counters = CountersReader(cnc.section(COUNTERS_METADATA),
                                       cnc.section(COUNTERS_VALUES))
        self._driver_bell = cnc.doorbell(DRIVER_DOORBELL_OFFSET)
        self._clients_bell = cnc.doorbell(CLIENTS_DOORBELL_OFFSET)
        self.client_id = self._to_driver.next_correlation_id()
        ready = self._request(cp.ClientConnect(self.client_id, self._correlation(), os.getpid(),
                                               _process_name()))
        assert isinstance(ready, cp.OnClientReady)
        self.heartbeat_counter_id = ready.heartbeat_counter_id
        self._heartbeat = Heartbeat(self.counters.values,
                                    self.counters.counter_offset(ready.heartbeat_counter_id),
                                    self.context.keepalive_interval, owner_id=self.client_id)

    # -- publications and subscriptions --------------------------------------------------------

    def add_publication(self, channel: str, stream_id: int) -> ConcurrentPublication:
        """A publication many threads and processes may share: one log per channel + stream.

        Raises RegistrationError (with the driver's code and message) for a bad channel or
        stream id, or when the driver cannot create the log (e.g. /dev/shm is full).
        """
        return self._add_publication(cp.AddPublication, ConcurrentPublication, channel,
                                     stream_id)

    def add_exclusive_publication(self, channel: str, stream_id: int) -> ExclusivePublication:
        """A publication with its own log and session, for a single writer thread."""
        return self._add_publication(cp.AddExclusivePublication, ExclusivePublication, channel,
                                     stream_id)

    def _add_publication(self, command: type[cp.AddPublication], kind: type[PublicationT],
                         channel: str, stream_id: int) -> PublicationT:
        self._await_reconnection()
        _check_stream_id(stream_id)
        ready = self._request(command(self.client_id, self._correlation(), stream_id, channel))
        assert isinstance(ready, cp.OnPublicationReady)
        with self._lock:
            if self._lost is not None:  # the driver died just after it answered
                raise self._reconnecting_error()
            log, limit = self._publication_log(ready)
            publication = kind(log, limit, channel=channel,
                               registration_id=ready.registration_id,
                               on_close=self._on_publication_close,
                               on_destination=self._on_destination,
                               counters=self.counters.values,
                               warm_share=self.context.large_message_warm_share)
            publication._wait_spin_ns = round(self.context.wait_spin * 1e9)
            publication._wake_driver = self._ring_driver
            self._publications[ready.registration_id] = publication
        return publication

    def _publication_log(self, ready: cp.OnPublicationReady) -> tuple[LogBuffer, Position]:
        return self._map_log(ready.log_file), Position(
            self.counters.values, self.counters.counter_offset(ready.limit_counter_id))

    @overload
    def add_subscription(
        self, channel: str, stream_id: int, on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None, *, group: str | None = None,
        history: None = None, from_position: int | str | None = None, last: None = None,
    ) -> Subscription: ...

    @overload
    def add_subscription(
        self, channel: str, stream_id: int, on_available_image: None = None,
        on_unavailable_image: None = None, *, group: None = None, history: Recording,
        from_position: int | str | None = None, last: int | None = None,
        catch_up: float | None = None,
    ) -> LateJoinSubscription: ...

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
        *,
        group: str | None = None,
        history: Recording | None = None,
        from_position: int | str | None = None,
        last: int | None = None,
        catch_up: float | None = None,
    ) -> Subscription | LateJoinSubscription:
        """Subscribe to a channel and stream; images appear as publishers do.

        The image callbacks run on the client's conductor thread (keep them short; they may
        call the client). With ``group="name"`` (aeron:ipc or aeron:udp) this subscription joins
        that consumer group: each message goes to one member only, at least once (see
        :class:`~shmbus.GroupSubscription`). ValueError for a bad group name.

        Late joiners: with ``history=shmbus.Recording(dir)`` it is a
        :class:`~shmbus.history.late_join.LateJoinSubscription`: the recorded messages from
        ``from_position`` (``"start"``; or the ``last`` n), then live, per session, no gap, no
        duplicate; ``catch_up`` (seconds) bounds how long the replay may chase a faster live
        stream before the live subscription joins anyway (holding its publishers until the
        replay reaches it; None: it chases as long as it takes). Without a history,
        ``from_position`` (a position, or ``"start"``: the earliest the log holds) starts an
        aeron:ipc subscription (or a new group) inside the log; RegistrationError names the
        range the log holds when the position is gone.
        """
        if history is not None:
            if group is not None or on_available_image or on_unavailable_image:
                raise ValueError("a subscription with history takes no group or image "
                                 "callbacks")
            return LateJoinSubscription(self.add_subscription, channel, stream_id, history,
                                        from_position=from_position, last=last,
                                        catch_up=catch_up)
        if last is not None or catch_up is not None:
            raise ValueError("last=n and catch_up need a history (a Recording) to read from")
        if from_position is not None:
            channel = with_join_position(channel, from_position)
        self._await_reconnection()
        _check_stream_id(stream_id)
        channel, group = group_channel(channel, group)
        correlation_id = self._correlation()
        kind = Subscription if group is None else partial(GroupSubscription, group=group)
        subscription = kind(
            channel, stream_id, registration_id=correlation_id,
            on_available_image=on_available_image, on_unavailable_image=on_unavailable_image,
            on_close=self._on_subscription_close,
            wake=(self._images_bell.buffer, self._images_bell.offset))
        subscription._wait_spin_ns = round(self.context.wait_spin * 1e9)
        self._lease(subscription)
        # registered before the request: image events follow the ready response at once
        with self._lock:
            self._subscriptions[correlation_id] = subscription
        try:
            self._request(cp.AddSubscription(self.client_id, correlation_id, stream_id, channel))
        except BaseException:
            with self._lock:  # (re-added under a new id if the driver was replaced meanwhile)
                self._subscriptions.pop(subscription.registration_id, None)
            raise
        return subscription

    # -- request/reply ----------------------------------------------------------------------

    def add_requester(self, channel: str, stream_id: int) -> Requester:
        """A :class:`~shmbus.calls.requester.Requester` calling the service on ``channel`` and
        ``stream_id`` (``aeron:ipc``, or unicast ``aeron:udp?endpoint=host:port`` for a service
        on another host, optionally with ``response-endpoint=host:port`` where its replies come
        back, see shmbus/calls/remote_calls.py): ``request(data, timeout=)`` -> bytes, ``submit``
        for many in flight, ``request_async``. Its replies come on a response stream of its
        own (over UDP with the service channel's ``key=``, if it names one). ValueError for a
        channel request/reply does not run on; else raises as add_publication and
        add_subscription do."""
        channel, reply_to = requester_route(channel)
        publication = self.add_publication(channel, stream_id)
        response_stream_id = response_stream_for(self._correlation())
        try:
            replies = self.add_subscription(
                RESPONSE_CHANNEL if reply_to is None else keyed_reply_channel(reply_to, channel),
                response_stream_id)
            try:
                counters = self._add_counters(
                    {type_id: call_label(TYPE_NAMES[type_id], channel, stream_id,
                                         f"requester pid={os.getpid()}")
                     for type_id in REQUESTER_COUNTERS})
            except BaseException:
                replies.close()
                raise
        except BaseException:
            publication.close()
            raise
        return Requester(channel, stream_id, publication=publication, replies=replies,
                         response_stream_id=response_stream_id, counters=counters,
                         on_close=lambda: None, reply_to=reply_to)

    def add_responder(self, channel: str, stream_id: int,
                      handler: RequestHandler) -> Responder:
        """A :class:`~shmbus.calls.responder.Responder` answering the service on ``channel`` and
        ``stream_id`` (``aeron:ipc``, or unicast ``aeron:udp?endpoint=host:port`` to serve
        requesters on other hosts) with ``handler(request: bytes) -> bytes``; the responders
        of a service on this bus share its requests, each to one of them. On ``aeron:udp``
        without ``key=`` only requests whose reply-to is the host they came from are answered
        (others are counted, ``rr-reflections-refused``); with a key, any, and the replies
        carry it (shmbus/calls/remote_calls.py). TypeError for a handler that is not callable,
        ValueError for a channel request/reply does not run on."""
        channel, _ = service_channel(channel, requester=False)
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        requests = self.add_subscription(channel, stream_id, group=responder_group(stream_id))
        assert isinstance(requests, GroupSubscription)
        try:
            counters = self._add_counters(
                {type_id: call_label(TYPE_NAMES[type_id], channel, stream_id,
                                     f"responder pid={os.getpid()}")
                 for type_id in RESPONDER_COUNTERS})
        except BaseException:
            requests.close()
            raise
        return Responder(channel, stream_id, handler, requests=requests, counters=counters,
                         reply_publication=self.add_publication, on_close=lambda: None,
                         remote=not channel.startswith("aeron:ipc"))

    def _lease(self, subscription: Subscription) -> None:
        """Have every poll of ``subscription`` check that the driver has not timed this client
        out (its heartbeat counter is still this client's), so a process stopped past its
        liveness learns it before it reads a log no longer held for it."""
        subscription._set_lease(
            self.counters.values,
            self.counters.counter_offset(self.heartbeat_counter_id) + REGISTRATION_ID_OFFSET,
            self.client_id, partial(_timed_out, weakref.ref(self)))

    def _timed_out(self) -> None:
        """The driver timed this client out: fail it (raises ClientTimeoutError)."""
        self._fail(ClientTimeoutError(
            f"the driver timed this client out (no heartbeat for "
            f"{self.context.client_liveness_timeout} s); connect again"))

    # -- driver events -------------------------------------------------------------------------

    def _service(self) -> int:
        """Process driver events, check the driver is alive, unmap lingering logs.

        Called by the conductor thread, or by the owner in invoker mode. Returns events
        handled; raises the client's error once it failed. While reconnecting, it looks for
        a new driver instead.
        """
        if self._lost is not None:
            self._check_usable()
            return self._reconnect()
        with self._lock:
            self._check_usable()
            events = 0
            receiver = self._to_clients
            while receiver.receive_next():
                events += 1
                self._on_broadcast(receiver.msg_type, receiver.buffer)
            if events and self._awaiting:
                self._answered.notify_all()
            now = time.monotonic()
            if now >= self._next_driver_check:
                self._next_driver_check = now + _DRIVER_CHECK_INTERVAL_S
                age = epoch_ms() - self.cnc.driver_heartbeat_ms()
                if age > self._driver_timeout_ms:
                    if self.context.reconnect:
                        self._lose_driver()
                        return events
                    self._fail(DriverTimeoutError(
                        f"the driver (pid {self.cnc.pid}) in {self.directory} has not "
                        f"heartbeated for {age} ms (timeout {self._driver_timeout_ms} ms)"))
                while self._lingering and self._lingering[0][0] <= now:
                    self._lingering.pop(0)[1].close()
            return events

    def _on_broadcast(self, msg_type: int, payload: bytes) -> None:
        try:
            message = cp.decode(msg_type, payload)
        except cp.MalformedMessage:
            return  # a newer driver's event we do not know: not ours to act on
        if isinstance(message, cp.OnAvailableImage):
            subscription = self._subscriptions.get(message.subscription_registration_id)
            if subscription is not None and not subscription.is_closed:
                self._add_image(subscription, message)
        elif isinstance(message, cp.OnUnavailableImage):
            subscription = self._subscriptions.get(message.subscription_registration_id)
            if subscription is not None:
                image = subscription._remove_image(message.correlation_id)
                if image is not None:
                    self._unmap_log(image.log, linger=True)
        elif isinstance(message, cp.OnClientTimeout):
            if message.client_id == self.client_id:
                self._timed_out()
        elif getattr(message, "correlation_id", None) in self._awaiting:
            self._responses[message.correlation_id] = message  # type: ignore[attr-defined]
        elif self.on_driver_event is not None:
            self.on_driver_event(message)

    def _add_image(self, subscription: Subscription, event: cp.OnAvailableImage) -> None:
        previous = subscription.image_by_session_id(event.session_id)
        if previous is not None:
            if previous.correlation_id == event.correlation_id:
                return
            # the session came back (rejoined after it was lost): the old image is done
            if subscription._remove_image(previous.correlation_id) is not None:
                self._unmap_log(previous.log, linger=True)
        log = self._map_log(event.log_file)
        image: Image
        if isinstance(subscription, GroupSubscription):
            image = GroupImage(log, self.counters, event.position_counter_id,
                               correlation_id=event.correlation_id,
                               subscription_registration_id=event.subscription_registration_id,
                               source_identity=event.source_identity)
        else:
            position = Position(self.counters.values,
                                self.counters.counter_offset(event.position_counter_id))
            image = Image(log, position, owned=True, correlation_id=event.correlation_id,
                          subscription_registration_id=event.subscription_registration_id,
                          source_identity=event.source_identity)
        image._wake_driver = self._ring_driver
        subscription._add_image(image)

    # -- requests ------------------------------------------------------------------------------

    def _correlation(self) -> int:
        return self._to_driver.next_correlation_id()

    def _request(self, command: cp.Message) -> cp.Message:
        """Send a command and wait for the driver's answer (at most driver_timeout seconds).

        Raises RegistrationError for the driver's refusal, DriverTimeoutError without an
        answer, the client's error once it failed.
        """
        correlation_id = command.correlation_id  # type: ignore[attr-defined]
        with self._lock:
            self._awaiting.add(correlation_id)
        try:
            deadline = time.monotonic() + self.context.driver_timeout
            while not self._to_driver.write(command.TYPE_ID, command.encode()):
                if time.monotonic() > deadline:
                    raise DriverTimeoutError(f"the driver in {self.directory} is not reading "
                                             f"commands (its queue stayed full)")
                time.sleep(0.001)
            self._driver_bell.ring()
            if self._conductor is None or threading.current_thread() is self._conductor:
                self._service_until_answered(correlation_id, deadline)
            else:
                self._wait_for_answer(correlation_id, deadline)
            with self._lock:
                response = self._responses.pop(correlation_id)
        finally:
            with self._lock:
                self._awaiting.discard(correlation_id)
                self._responses.pop(correlation_id, None)
        if isinstance(response, cp.OnError):
            raise RegistrationError(response.code, response.message)
        return response

    def _wait_for_answer(self, correlation_id: int, deadline: float) -> None:
        """Sleep until the conductor thread hands over the answer."""
        with self._answered:
            while correlation_id not in self._responses:
                self._check_usable()
                if self._lost is not None:  # asked the driver that died: no answer comes
                    raise self._reconnecting_error()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._no_answer()
                self._answered.wait(remaining)

    def _service_until_answered(self, correlation_id: int, deadline: float) -> None:
        """Handle events on this thread until the answer is among them (invoker mode, or a
        request from inside an image callback on the conductor thread)."""
        while correlation_id not in self._responses:
            seen = self._clients_bell.value()
            if self._service() == 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._no_answer()
                self._clients_bell.wait(seen, min(remaining, _DRIVER_CHECK_INTERVAL_S))

    def _no_answer(self) -> None:
        raise DriverTimeoutError(f"no answer from the driver in {self.directory} within "
                                 f"{self.context.driver_timeout} s")

    def _add_counters(self, labels: dict[int, str]) -> CallCounters:
        """Counters owned by this client, one per type id with its label (freed by the
        returned object's close(), or by the driver when this client goes away)."""
        offsets: dict[int, int] = {}
        ids: list[int] = []
        try:
            for type_id, text in labels.items():
                ready = self._request(cp.AddCounter(self.client_id, self._correlation(),
                                                    type_id, 0, 0, text))
                assert isinstance(ready, cp.OnCounterReady)
                ids.append(ready.counter_id)
                offsets[type_id] = self.counters.counter_offset(ready.counter_id)
        except BaseException:
            self._remove_counters(ids)
            raise
        return CallCounters(self.counters.values, offsets, self._remove_counters, ids)

    def _remove_counters(self, counter_ids: list[int]) -> None:
        with self._lock:
            if self._closing or self._error is not None or os.getpid() != self._pid:
                return
            for counter_id in counter_ids:
                self._send(cp.RemoveCounter(self.client_id, self._correlation(), counter_id))

    def _send(self, command: cp.Message) -> None:
        """Send without waiting for the answer (removals)."""
        if not self._to_driver.write(command.TYPE_ID, command.encode()):
            raise DriverTimeoutError(f"the driver in {self.directory} is not reading commands")
        self._driver_bell.ring()

    def _ring_driver(self) -> None:
        """Wake the driver for a duty cycle (a writer waiting for it to free blocks)."""
        self._driver_bell.ring()

    # -- logs ----------------------------------------------------------------------------------

    def _map_log(self, log_file: str) -> LogBuffer:
        entry = self._logs.get(log_file)
        if entry is None:
            log = LogBuffer.open(self.directory / log_file)
            self._logs[log_file] = (log, 1)
            return log
        self._logs[log_file] = (entry[0], entry[1] + 1)
        return entry[0]

    def _unmap_log(self, log: LogBuffer, *, linger: bool = False) -> None:
        """One user fewer; the last one unmaps it (its users are closed by then).

        ``linger``: another thread may still be reading it (an image the conductor removed),
        so it is unmapped only after _LOG_LINGER_S. A failed client unmaps nothing: the
        mappings go with their last reference.
        """
        for name, (mapped, count) in list(self._logs.items()):
            if mapped is log:
                if count > 1:
                    self._logs[name] = (mapped, count - 1)
                else:
                    del self._logs[name]
                    if linger:
                        self._lingering.append((time.monotonic() + _LOG_LINGER_S, mapped))
                    elif self._error is None:
                        mapped.close()
                return

    def _on_publication_close(self, publication: Publication) -> None:
        with self._lock:
            if self._publications.pop(publication.registration_id, None) is None:
                return
            if not self._closing and self._lost is None and os.getpid() == self._pid:
                self._send(cp.RemovePublication(self.client_id, self._correlation(),
                                                publication.registration_id))
            self._unmap_log(publication.log)

    def _on_destination(self, publication: Publication, destination: str, add: bool) -> None:
        self._await_reconnection()
        command = cp.AddDestination if add else cp.RemoveDestination
        self._request(command(self.client_id, self._correlation(), publication.registration_id,
                              destination))

    def _on_subscription_close(self, subscription: Subscription,
                               images: tuple[Image, ...]) -> None:
        with self._lock:
            for image in images:
                self._unmap_log(image.log)
            if self._subscriptions.pop(subscription.registration_id, None) is None:
                return
            if not self._closing and self._lost is None and os.getpid() == self._pid:
                self._send(cp.RemoveSubscription(self.client_id, self._correlation(),
                                                 subscription.registration_id))

    # -- reconnecting (context.reconnect) ------------------------------------------------------

    def _lose_driver(self) -> None:
        """The driver died: detach from it and say what is lost (the conductor, in _service).

        Publications refuse offers (NOT_CONNECTED) and each image is removed (its
        on_unavailable_image runs); _reconnect then looks for a new driver.
        """
        with self._lock:
            if self._heartbeat is not None:
                self._heartbeat.stop()
            loss = self._lost = self._lost or DriverLoss(self.cnc.pid)
            # the next driver names its logs as this one did: keep the old mappings apart
            self._logs = {f"{name} (driver {self.cnc.pid}, lost)": entry
                          for name, entry in self._logs.items()}
            for publication in self._publications.values():
                loss.publication_lost(publication, publication.session_id, publication.position)
                publication._detach()
            self._answered.notify_all()  # requests to the dead driver give up
            for subscription in self._subscriptions.values():
                for image in subscription.images:
                    loss.image_lost(subscription, image.session_id, image.position)
                    try:
                        subscription._remove_image(image.correlation_id)
                    except Exception:
                        traceback.print_exc()  # an image callback raised: the others still run
                    self._unmap_log(image.log, linger=True)

    def _reconnect(self) -> int:
        """Every _DRIVER_CHECK_INTERVAL_S, look for a live driver in the directory (start one
        with embedded_driver) and, once there is one, re-add everything to it and call
        on_reconnect. Returns 1 when it reconnected, else 0. The lock is not held while a
        driver is looked for or started."""
        now = time.monotonic()
        if now < self._next_driver_check:
            return 0
        self._next_driver_check = now + _DRIVER_CHECK_INTERVAL_S
        try:
            cnc = _open_or_launch(self.context)
        except (DriverUnavailableError, CncError):
            return 0  # none yet (or one that cannot start, or of another version): again later
        with self._lock:
            loss, self._lost = self._lost, None
            if loss is None or self._closed:
                cnc.close()
                return 0
            try:
                report = self._rejoin(cnc, loss)
            except (ShmbusError, OSError, ValueError):
                # the new driver died too (or its logs went with it): detach, look again
                self._lost = loss
                self._lose_driver()
                return 0
            self.reconnects += 1
            self._answered.notify_all()  # requests waiting for the reconnection go on
        if self.on_reconnect is not None:
            self.on_reconnect(report)
        return 1

    def _rejoin(self, cnc: CncFile, loss: DriverLoss) -> Reconnected:
        """Introduce this client to the driver of ``cnc`` and re-add every publication (same
        kind, channel and stream; the same object rebound to its new log) and subscription
        (same callbacks; a new registration id). What the new driver refuses is closed."""
        self._attach(cnc)
        publications = list(self._publications.items())
        subscriptions = list(self._subscriptions.items())
        refused: dict[Publication | Subscription, str] = {}
        for old_id, publication in publications:
            command = (cp.AddExclusivePublication if isinstance(publication, ExclusivePublication)
                       else cp.AddPublication)
            try:
                ready = self._request(command(self.client_id, self._correlation(),
                                              publication.stream_id, publication.channel))
            except RegistrationError as e:
                refused[publication] = str(e)
                publication.close()
                continue
            assert isinstance(ready, cp.OnPublicationReady)
            old_log = publication.log
            log, limit = self._publication_log(ready)
            publication._rebind(log, limit, self.counters.values, ready.registration_id)
            del self._publications[old_id]
            self._publications[ready.registration_id] = publication
            self._unmap_log(old_log)
        for old_id, subscription in subscriptions:
            correlation_id = self._correlation()
            # registered before the request: image events follow the ready response at once
            del self._subscriptions[old_id]
            subscription.registration_id = correlation_id
            self._subscriptions[correlation_id] = subscription
            self._lease(subscription)
            try:
                self._request(cp.AddSubscription(self.client_id, correlation_id,
                                                 subscription.stream_id, subscription.channel))
            except RegistrationError as e:
                refused[subscription] = str(e)
                subscription.close()
        return loss.report(cnc.pid, [p for _, p in publications],
                           [s for _, s in subscriptions], refused)

    def _await_reconnection(self) -> None:
        """Before a request: while reconnecting, wait for the new driver (at most
        driver_timeout), then raise DriverTimeoutError; at once on the conductor thread or
        in invoker mode (they do the reconnecting). Raises the client's error too."""
        deadline = time.monotonic() + self.context.driver_timeout
        with self._answered:
            self._check_usable()
            while self._lost is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._conductor in (None, threading.current_thread()):
                    raise self._reconnecting_error()
                self._answered.wait(remaining)
                self._check_usable()

    def _reconnecting_error(self) -> DriverTimeoutError:
        return DriverTimeoutError(
            f"the driver (pid {self.cnc.pid}) in {self.directory} died and this client is "
            f"reconnecting (reconnect=True): no new driver has taken over yet")

    # -- lifecycle -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise ShmbusError(f"this shmbus Client was created in process {self._pid}; after "
                              f"fork, call shmbus.connect() again in the child (pass it the "
                              f"parent's client.context)")
        if self._error is not None:
            raise type(self._error)(str(self._error))
        if self._closed:
            raise ClientClosedError("this shmbus Client is closed")

    def _fail(self, error: ShmbusError) -> None:
        """The client is done for: keep the error for every later call, close everything,
        wake whoever waits, and raise it."""
        with self._lock:
            self._error = error
            for subscription in self._subscriptions.values():
                subscription._fail(error)
            self._release(send_close=False)
            self._answered.notify_all()
        # a copy: the kept one must not hold this traceback's frames (and, through them, the
        # client and its mapping of cnc.dat) alive
        raise type(error)(str(error))

    @property
    def is_closed(self) -> bool:
        """True once closed, or failed (then every call raises the failure)."""
        return self._closed

    @property
    def driver_pid(self) -> int:
        """The pid of the driver process serving this bus, as its cnc.dat names it.

        Read-only, for monitoring (e.g. the CPU the driver uses); the driver may be an embedded
        one that some client launched or one started with ``shmbus driver``. Any process may
        read it, also after :meth:`close`.
        """
        return int(self.cnc.pid)

    def close(self) -> None:
        """Close every publication and subscription made here, then disconnect. Idempotent.

        Do not close a client while other threads still use its publications and
        subscriptions: their logs are unmapped.
        """
        if self._closed or os.getpid() != self._pid:
            return
        with self._lock:
            self._release(send_close=self._lost is None)
        conductor = self._conductor
        if conductor is not None and conductor is not threading.current_thread():
            self._clients_bell.ring()
            conductor.join(1.0)

    def _release(self, *, send_close: bool) -> None:
        if self._closed:
            return
        self._closing = True  # what is closed now goes with the ClientClose below
        for publication in list(self._publications.values()):
            publication.close()
        for subscription in list(self._subscriptions.values()):
            subscription.close()
        if send_close:
            try:
                self._send(cp.ClientClose(self.client_id, self._correlation()))
            except ShmbusError:
                pass
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._publications.clear()
        self._subscriptions.clear()
        if self._error is None:
            for log, _ in self._logs.values():
                log.close()
            for _, log in self._lingering:
                log.close()
        self._logs.clear()
        self._lingering.clear()
        _live_clients.discard(self)
        _reap_launched()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(dir={str(self.directory)!r}, client_id={self.client_id})"


# -- helpers -----------------------------------------------------------------------------------

def _run_conductor(client_ref: weakref.ref[Client]) -> None:
    """The conductor thread: asleep on the clients' doorbell, it handles driver events as they
    come and checks the driver's heartbeat every _DRIVER_CHECK_INTERVAL_S. It holds the client
    only while it works, so an abandoned client is still collected (and the thread ends)."""
    while True:
        client = client_ref()
        if client is None or client.is_closed:
            return
        doorbell = client._clients_bell  # the new driver's, once the client reconnected
        seen = doorbell.value()
        try:
            client._service()
        except ShmbusError:
            return  # the client failed; every later call raises its error
        except Exception:
            # an image callback raised: report it (as Aeron's error handler does), go on
            traceback.print_exc()
        del client
        doorbell.wait(seen, _DRIVER_CHECK_INTERVAL_S)


def _check_stream_id(stream_id: int) -> None:
    if not isinstance(stream_id, int) or isinstance(stream_id, bool):
        raise TypeError(f"stream id must be an int, not {type(stream_id).__name__}")


def _process_name() -> str:
    """The script's name; for ``python -c`` and multiprocessing workers, the worker's name."""
    import multiprocessing

    script = sys.argv[0] if sys.argv else ""
    if script not in ("", "-c", "-"):
        return os.path.basename(script)
    worker = multiprocessing.current_process().name
    return "python" if worker == "MainProcess" else worker


def _driver_alive(cnc: CncFile, context: Context) -> bool:
    age = epoch_ms() - cnc.driver_heartbeat_ms()
    return age <= context.driver_timeout * 1000 and psutil.pid_exists(cnc.pid)


def _try_open(directory: Path, context: Context) -> CncFile | None:
    try:
        cnc = CncFile.open(directory)
    except CncError as e:
        if "layout version" in str(e):
            raise
        return None
    if _driver_alive(cnc, context):
        return cnc
    cnc.close()
    return None


def _open_or_launch(context: Context) -> CncFile:
    directory = Path(context.dir)
    prepare_directory(directory)
    cnc = _try_open(directory, context)
    if cnc is not None:
        return cnc
    if not context.embedded_driver:
        raise DriverUnavailableError(
            f"no live driver in {directory}: start one with `shmbus driver --dir {directory}`, "
            f"or connect with embedded_driver=True")
    lock_fd = os.open(directory / LAUNCH_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # one launcher at a time; the others then find it
        cnc = _try_open(directory, context)
        if cnc is None:
            cnc = _launch(context)
        return cnc
    finally:
        os.close(lock_fd)


def _launch(context: Context) -> CncFile:
    directory = Path(context.dir)
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            context.driver_command(),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True)
        _launched.append(process)
        deadline = time.monotonic() + max(context.driver_timeout, 5.0)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                stderr.seek(0)
                detail = stderr.read().decode(errors="replace").strip().splitlines()
                raise DriverUnavailableError(
                    f"the embedded driver for {directory} exited with {process.returncode}: "
                    f"{detail[-1] if detail else 'no message'}")
            try:
                cnc = CncFile.open(directory)
            except CncError:
                time.sleep(0.005)
                continue
            if cnc.pid == process.pid:
                return cnc
            cnc.close()
            time.sleep(0.005)
    process.kill()
    raise DriverUnavailableError(f"the embedded driver for {directory} did not start within "
                                 f"{max(context.driver_timeout, 5.0)} s")


def _reap_launched() -> None:
    for process in list(_launched):
        if process.poll() is not None:
            _launched.remove(process)


def _after_fork_in_child() -> None:
    for client in list(_live_clients):
        for publication in client._publications.values():
            publication._close_core()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _timed_out(client: weakref.ref[Client]) -> None:
    """A subscription's lease is gone (see Client._lease); weak, so a subscription does not
    keep its client alive."""
    alive = client()
    if alive is not None:
        alive._timed_out()
