"""The bus client: ``shmbus.connect()`` and what it returns.

A :class:`Client` makes publications, subscriptions, requesters and responders and keeps
them. It is made of: a :class:`~shmbus.client.conductor_proxy.ConductorProxy` (the commands to
the driver, its answers and events, the heartbeat and the conductor thread), the
:class:`~shmbus.client.log_mappings.LogMappings` its publications and images share, and a
:class:`~shmbus.client.reconnection.Reconnection` that moves it to a new driver once its driver
died (with ``reconnect=True``). The driver it talks to is found, or started, by
:mod:`shmbus.client.driver_launch`.

With ``conductor_thread=False`` (Aeron's invoker mode, for processes with a duty loop of their
own such as the netbridge) nothing runs in the background: the owner calls ``_service()``.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, overload

from shmbus.archive.recorder import Recorder
from shmbus.calls.call_counters import CallCounters
from shmbus.calls.call_counters import label as call_label
from shmbus.calls.remote_calls import keyed_reply_channel, requester_route, service_channel
from shmbus.calls.requester import Requester
from shmbus.calls.responder import RequestHandler, Responder
from shmbus.calls.responder import group_name as responder_group
from shmbus.client.conductor_proxy import ConductorProxy
from shmbus.client.driver_launch import open_or_launch, reap_launched
from shmbus.client.log_mappings import LogMappings
from shmbus.client.reconnection import Reconnected, Reconnection
from shmbus.history.late_join import LateJoinSubscription, Recording
from shmbus.settings.channel_uri import with_join_position
from shmbus.settings.context import Context
from shmbus.settings.errors import ClientClosedError, ClientTimeoutError, ShmbusError
from shmbus.shm import control_protocol as cp
from shmbus.shm.call_header import RESPONSE_CHANNEL, response_stream_for
from shmbus.shm.cnc import CncFile
from shmbus.shm.counters import REQUESTER_COUNTERS, RESPONDER_COUNTERS, TYPE_NAMES, CountersReader
from shmbus.shm.doorbell import Doorbell
from shmbus.streams.context_managers import Closeable
from shmbus.streams.image import Image
from shmbus.streams.publication import ConcurrentPublication, ExclusivePublication, Publication
from shmbus.streams.subscription import ImageHandler, Subscription
from shmbus.streams.subscription_group import GroupImage, GroupSubscription, group_channel

PublicationT = TypeVar("PublicationT", bound=Publication)

_live_clients: weakref.WeakSet[Client] = weakref.WeakSet()


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


class Client(Closeable):
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
        self._closing = False  # what is closed now goes with the ClientClose
        self._error: ShmbusError | None = None
        #: called on the conductor thread after each reconnection, with what was lost
        self.on_reconnect: Callable[[Reconnected], None] | None = None
        #: called with driver events this client does not handle itself (the netbridge's)
        self.on_driver_event: Callable[[cp.Message], None] | None = None
        self._images_bell = Doorbell.private()  # wakes this client's waiting subscribers
        self._publications: dict[int, Publication] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._logs = LogMappings(self.directory)
        self._conductor = ConductorProxy(context, service=self._service,
                                         check=self._check_answerable, timed_out=self._timed_out)
        self._reconnection = Reconnection(context, self.directory, self._conductor, self._logs,
                                          self._publications, self._subscriptions)
        self._conductor.attach(open_or_launch(context))
        _live_clients.add(self)
        if conductor_thread:
            self._conductor.start()

    @property
    def cnc(self) -> CncFile:
        """The cnc.dat of the driver this client talks to (the new one's once reconnected)."""
        return self._conductor.cnc

    @property
    def counters(self) -> CountersReader:
        """The driver's counters (read-only; ``shmbus stat`` shows them)."""
        return self._conductor.counters

    @property
    def client_id(self) -> int:
        """This client's id at its driver (a new one once reconnected)."""
        return self._conductor.client_id

    @property
    def heartbeat_counter_id(self) -> int:
        """The counter in which this client's heartbeat keeps its lease with the driver."""
        return self._conductor.heartbeat_counter_id

    @property
    def reconnects(self) -> int:
        """How many times a new driver took over (``reconnect=True``)."""
        return self._reconnection.reconnects

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
        self._reconnection.wait(self._check_usable)
        _check_stream_id(stream_id)
        ready = self._request(command(self.client_id, self._correlation(), stream_id, channel))
        assert isinstance(ready, cp.OnPublicationReady)
        with self._conductor.lock:
            if self._reconnection.lost is not None:  # the driver died just after it answered
                raise self._reconnection.error()
            log = self._logs.map(ready.log_file)
            publication = kind(log, self._conductor.position(ready.limit_counter_id),
                               channel=channel, registration_id=ready.correlation_id,
                               on_close=self._on_publication_close,
                               on_destination=self._on_destination,
                               counters=self.counters.values,
                               warm_share=self.context.large_message_warm_share)
            publication._wait_spin_ns = round(self.context.wait_spin * 1e9)
            publication._wake_driver = self._conductor.ring_driver
            self._publications[ready.correlation_id] = publication
        return publication

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
        self._reconnection.wait(self._check_usable)
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
        self._conductor.lease(subscription)
        # registered before the request: image events follow the ready response at once
        with self._conductor.lock:
            self._subscriptions[correlation_id] = subscription
        try:
            self._request(cp.AddSubscription(self.client_id, correlation_id, 0, stream_id, channel))
        except BaseException:
            # (re-added under a new id if the driver was replaced meanwhile)
            with self._conductor.lock:
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

    def add_recorder(self, directory: str | os.PathLike[str], channel: str, stream_id: int, *,
                     session_id: int | None = None, segment_length: int | None = None,
                     fsync: str = "none", fragment_limit: int = 65536,
                     time_resolution: float = 0.001) -> Recorder:
        """Record a channel and stream (every session, or ``session_id``) into ``directory``
        through this client: a :class:`~shmbus.Recorder`, driven by its ``poll()`` or
        ``run()``, read back with :class:`~shmbus.RecordingReader` or a late joiner. Closing
        the recorder leaves the client open. The options are the Recorder's."""
        return Recorder(self.add_subscription, directory, channel, stream_id,
                        session_id=session_id, segment_length=segment_length, fsync=fsync,
                        fragment_limit=fragment_limit, time_resolution=time_resolution)

    def _timed_out(self) -> None:
        """The driver timed this client out: fail it (raises ClientTimeoutError)."""
        self._fail(ClientTimeoutError(
            f"the driver timed this client out (no heartbeat for "
            f"{self.context.client_liveness_timeout} s); connect again"))

    # -- the duty cycle ------------------------------------------------------------------------

    def _service(self) -> int:
        """Process driver events, check the driver is alive, unmap lingering logs.

        Called by the conductor thread, or by the owner in invoker mode. Returns events
        handled; raises the client's error once it failed. While reconnecting, it looks for
        a new driver instead.
        """
        if self._reconnection.lost is not None:
            self._check_usable()
            return self._reconnect()
        with self._conductor.lock:
            self._check_usable()
            events = self._conductor.receive(self._on_event)
            now = time.monotonic()
            if self._conductor.check_due(now):
                silence = self._conductor.driver_silence()
                if silence is not None:
                    if self.context.reconnect:
                        self._reconnection.lose_driver()
                        return events
                    self._fail(silence)
                self._logs.unmap_expired(now)
            return events

    def _reconnect(self) -> int:
        """Look for a new driver (see Reconnection.reconnect); once back on one, call
        on_reconnect. Returns 1 when it reconnected, else 0."""
        report = self._reconnection.reconnect()
        if report is None:
            return 0
        if self.on_reconnect is not None:
            self.on_reconnect(report)
        return 1

    def _on_event(self, message: cp.Message) -> None:
        """A driver event that is no answer to this client: images come and go, the driver
        timed this client out, or it is for ``on_driver_event``."""
        if isinstance(message, cp.OnAvailableImage):
            subscription = self._subscriptions.get(message.subscription_registration_id)
            if subscription is not None and not subscription.is_closed:
                self._add_image(subscription, message)
        elif isinstance(message, cp.OnUnavailableImage):
            subscription = self._subscriptions.get(message.subscription_registration_id)
            if subscription is not None:
                image = subscription._remove_image(message.correlation_id)
                if image is not None:
                    self._logs.unmap(image.log, linger=True)
        elif isinstance(message, cp.OnClientTimeout):
            if message.client_id == self.client_id:
                self._timed_out()
        elif self.on_driver_event is not None:
            self.on_driver_event(message)

    def _add_image(self, subscription: Subscription, event: cp.OnAvailableImage) -> None:
        previous = subscription.image_by_session_id(event.session_id)
        if previous is not None:
            if previous.correlation_id == event.correlation_id:
                return
            # the session came back (rejoined after it was lost): the old image is done
            if subscription._remove_image(previous.correlation_id) is not None:
                self._logs.unmap(previous.log, linger=True)
        log = self._logs.map(event.log_file)
        image: Image
        if isinstance(subscription, GroupSubscription):
            image = GroupImage(log, self.counters, event.position_counter_id,
                               correlation_id=event.correlation_id,
                               subscription_registration_id=event.subscription_registration_id,
                               source_identity=event.source_identity)
        else:
            image = Image(log, self._conductor.position(event.position_counter_id), owned=True,
                          correlation_id=event.correlation_id,
                          subscription_registration_id=event.subscription_registration_id,
                          source_identity=event.source_identity)
        image._wake_driver = self._conductor.ring_driver
        subscription._add_image(image)

    # -- requests ------------------------------------------------------------------------------

    def _correlation(self) -> int:
        return self._conductor.correlation()

    def _request(self, command: cp.Message) -> cp.Message:
        """Send a command and wait for the driver's answer (at most driver_timeout seconds).

        Raises RegistrationError for the driver's refusal, DriverTimeoutError without an
        answer, the client's error once it failed.
        """
        return self._conductor.request(command)

    def _send(self, command: cp.Message) -> None:
        """Send without waiting for the answer (removals)."""
        self._conductor.send(command)

    def _check_answerable(self) -> None:
        """While a request waits: raise the client's error, or, reconnecting, that the driver
        asked died (no answer comes)."""
        self._check_usable()
        if self._reconnection.lost is not None:
            raise self._reconnection.error()

    def _add_counters(self, labels: dict[int, str]) -> CallCounters:
        """Counters owned by this client, one per type id with its label (freed by the
        returned object's close(), or by the driver when this client goes away)."""
        offsets: dict[int, int] = {}
        ids: list[int] = []
        try:
            for type_id, text in labels.items():
                ready = self._request(cp.AddLinkedCounter(self.client_id, self._correlation(),
                                                    type_id, 0, 0, text))
                assert isinstance(ready, cp.OnCounterReady)
                ids.append(ready.counter_id)
                offsets[type_id] = self.counters.counter_offset(ready.counter_id)
        except BaseException:
            self._remove_counters(ids)
            raise
        return CallCounters(self.counters.values, offsets, self._remove_counters, ids)

    def _remove_counters(self, counter_ids: list[int]) -> None:
        with self._conductor.lock:
            if self._closing or self._error is not None or os.getpid() != self._pid:
                return
            for counter_id in counter_ids:
                self._send(cp.FreeCounter(self.client_id, self._correlation(), counter_id))

    # -- what publications and subscriptions tell their client ---------------------------------

    def _on_publication_close(self, publication: Publication) -> None:
        with self._conductor.lock:
            if self._publications.pop(publication.registration_id, None) is None:
                return
            if (not self._closing and self._reconnection.lost is None
                    and os.getpid() == self._pid):
                self._send(cp.RemovePublication(self.client_id, self._correlation(),
                                                publication.registration_id))
            self._logs.unmap(publication.log)

    def _on_destination(self, publication: Publication, destination: str, add: bool) -> None:
        self._reconnection.wait(self._check_usable)
        command = cp.AddDestination if add else cp.RemoveDestination
        self._request(command(self.client_id, self._correlation(), publication.registration_id,
                              destination))

    def _on_subscription_close(self, subscription: Subscription,
                               images: tuple[Image, ...]) -> None:
        with self._conductor.lock:
            for image in images:
                self._logs.unmap(image.log)
            if self._subscriptions.pop(subscription.registration_id, None) is None:
                return
            if (not self._closing and self._reconnection.lost is None
                    and os.getpid() == self._pid):
                self._send(cp.RemoveSubscription(self.client_id, self._correlation(),
                                                 subscription.registration_id))

    # -- lifecycle -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise ShmbusError(f"this shmbus Client was created in process {self._pid}; after "
                              f"fork, call shmbus.connect() again in the child (pass it the "
                              f"parent's client.context)")
        if self._error is not None:
            raise type(self._error)(str(self._error))
        if self.is_closed:
            raise ClientClosedError("this shmbus Client is closed")

    def _fail(self, error: ShmbusError) -> None:
        """The client is done for: keep the error for every later call, close everything,
        wake whoever waits, and raise it."""
        with self._conductor.lock:
            self._error = error
            self._logs.abandon()
            for subscription in self._subscriptions.values():
                subscription._fail(error)
            self._release(send_close=False)
            self._conductor.answered.notify_all()
        # a copy: the kept one must not hold this traceback's frames (and, through them, the
        # client and its mapping of cnc.dat) alive
        raise type(error)(str(error))

    @property
    def is_closed(self) -> bool:
        """True once closed, or failed (then every call raises the failure)."""
        return self._conductor.closed

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
        if self.is_closed or os.getpid() != self._pid:
            return
        with self._conductor.lock:
            self._release(send_close=self._reconnection.lost is None)
        self._conductor.join()

    def _release(self, *, send_close: bool) -> None:
        if self.is_closed:
            return
        self._closing = True  # what is closed now goes with the ClientClose below
        for publication in list(self._publications.values()):
            publication.close()
        for subscription in list(self._subscriptions.values()):
            subscription.close()
        self._conductor.close(goodbye=send_close)
        self._publications.clear()
        self._subscriptions.clear()
        self._logs.close()
        _live_clients.discard(self)
        reap_launched()

    def __repr__(self) -> str:
        return f"Client(dir={str(self.directory)!r}, client_id={self.client_id})"


def _check_stream_id(stream_id: int) -> None:
    if not isinstance(stream_id, int) or isinstance(stream_id, bool):
        raise TypeError(f"stream id must be an int, not {type(stream_id).__name__}")


def _after_fork_in_child() -> None:
    for client in list(_live_clients):
        for publication in client._publications.values():
            publication._close_core()


os.register_at_fork(after_in_child=_after_fork_in_child)
