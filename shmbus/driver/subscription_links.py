"""Subscriptions, and their links to the publications and network images they read.

A subscription is linked to every active publication of its stream on its endpoint (a spy to
the local log of a udp publication), and to every network image of its stream on its udp
endpoint: a sub-pos counter per link, or, for a member of a consumer group, a claim record in
its group on that log. Each link is an image for the client (OnAvailableImage, then
OnUnavailableImage). A subscription with a join-position starts inside the logs, pinned against
cleaning (log_history.py). A subscription on a udp endpoint no one else subscribes to waits for
the netbridge to take the endpoint before it is answered.
"""

from __future__ import annotations

from dataclasses import dataclass

from shmbus.driver.bridge_link import BridgeLink
from shmbus.driver.client_proxy import ClientProxy, CommandError
from shmbus.driver.client_sessions import ClientSessions
from shmbus.driver.counter_allocation import allocate_all, free_all, position
from shmbus.driver.group_claims import SubscriptionGroup
from shmbus.driver.ipc_publication import (
    ImageEvent,
    IpcPublication,
    LinkState,
    NetworkPublication,
    PublicationState,
    SubscriberLink,
)
from shmbus.driver.log_history import (
    EARLIEST,
    JoinPositionGone,
    check_join,
    pin_join,
    retained_range,
)
from shmbus.driver.network_image import NetworkImage
from shmbus.driver.publications import Publications
from shmbus.driver.system_counters import SystemCounter
from shmbus.settings.channel_uri import CONSUMER_GROUP, ChannelUri
from shmbus.settings.context import Context
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import (
    GROUP_CLAIM,
    GROUP_CLAIM_KEY,
    GROUP_MEMBERS,
    GROUP_ORPHAN,
    GROUP_POS,
    GROUP_REDELIVERED,
    SUB_POS,
    CountersManager,
)
from shmbus.shm.ring_buffer import ManyToOneRingBuffer

#: a subscription waiting for the netbridge to take its endpoint is refused after this share of
#: the driver timeout (how long clients wait for an answer), so that it hears why
_BRIDGE_ANSWER_SHARE = 0.8


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


class SubscriptionLinks:
    """The subscriptions of the bus by registration id, those waiting for the netbridge, and
    their links to publications and images. Single-threaded: the conductor's."""

    def __init__(self, context: Context, counters: CountersManager,
                 to_driver: ManyToOneRingBuffer, proxy: ClientProxy, clients: ClientSessions,
                 publications: Publications, bridge: BridgeLink) -> None:
        self._context = context
        self._counters = counters
        self._to_driver = to_driver
        self._proxy = proxy
        self._clients = clients
        self._publications = publications
        self._bridge = bridge
        self.subscriptions: dict[int, SubscriptionLink] = {}
        #: subscriptions waiting for the netbridge to take their endpoint, with since when (ms)
        self._awaiting_endpoint: dict[int, tuple[SubscriptionLink, int]] = {}

    # -- subscriptions -------------------------------------------------------------------------

    def add(self, command: cp.AddSubscription, uri: ChannelUri) -> None:
        """The subscription ``command`` asks for on ``uri``: answered and linked, or (the
        first on a udp endpoint) waiting for the netbridge to take the endpoint."""
        link = SubscriptionLink(
            command.correlation_id, command.client_id, command.stream_id, uri.canonical(),
            uri.bool_param("tether", self._context.tether_subscriptions),
            uri.int_param("session-id") if "session-id" in uri.params else None,
            uri.endpoint_key(), spy=uri.spy, simulate_connection=uri.bool_param("ssc", False),
            group=uri.params.get(CONSUMER_GROUP), join_position=uri.join_position)
        if link.is_network:
            self._check_endpoint_key(link.endpoint_key, uri.key)
        if link.is_network and not self.wanted(link.endpoint_key, link.stream_id,
                                               ready_only=True):
            self._bridge.ensure()
            if self._bridge.client_id is not None or self._context.netbridge_auto_start:
                # answered when the netbridge says whether it could take the endpoint
                self._awaiting_endpoint[link.registration_id] = (link, self._counters.clock())
                if self._bridge.client_id is not None:
                    self._proxy.send(cp.OnReceiveChannel(link.registration_id, link.stream_id,
                                                         link.channel))
                return
            self._proxy.send(cp.OnReceiveChannel(0, link.stream_id, link.channel))
        self.activate(link)

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

    def wanted(self, endpoint_key: tuple[str, ...], stream_id: int,
               ready_only: bool = False) -> bool:
        """Whether a subscription (a ready one, or also one waiting for the netbridge) wants
        ``stream_id`` on that endpoint from the netbridge."""
        links = list(self.subscriptions.values())
        if not ready_only:
            links += [link for link, _ in self._awaiting_endpoint.values()]
        return any(link.endpoint_key == endpoint_key and link.stream_id == stream_id
                   for link in links)

    def activate(self, link: SubscriptionLink) -> None:
        """The subscription is ready: answer it and link it to what it reads.

        With a join-position, every log it reads now is joined (and pinned) before it is
        answered, so a position no longer there refuses the subscription and joins nothing.
        """
        joined: list[tuple[IpcPublication, ImageEvent]] = []
        if not link.is_network:
            joined = self._attach_all(link)
        self.subscriptions[link.registration_id] = link
        self._counters.add(SystemCounter.SUBSCRIPTIONS.value, 1)
        self._clients.clients[link.client_id].subscriptions.add(link.registration_id)
        self._proxy.send(cp.OnSubscriptionReady(link.registration_id,
                                                cp.CHANNEL_STATUS_NOT_ALLOCATED))
        if link.is_network:
            for image in self._bridge.images.values():
                if self._matches_image(link, image):
                    self.link_image(image, link)
            return
        for publication, event in joined:
            self._publications.send_image_event(publication, event)

    def _attach_all(self, link: SubscriptionLink) -> list[tuple[IpcPublication, ImageEvent]]:
        """Attach ``link`` to every publication it matches at its join-position; all or none
        (CommandError naming the position and what the log holds)."""
        matching = [p for p in self._publications.publications if self._matches(link, p)]
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

    def remove(self, registration_id: int) -> None:
        """Unlink the subscription ``registration_id`` from everything it reads, and forget
        it; an endpoint no one wants any more is let go by the netbridge."""
        removed = self.subscriptions.pop(registration_id, None)
        for publication in self._publications.publications:
            self._unlink(publication, registration_id)
        for image in self._bridge.images.values():
            if self._unlink(image, registration_id):
                self._bridge.subscribers_changed(image)
        if removed is not None and removed.is_network and not self.wanted(
                removed.endpoint_key, removed.stream_id):
            self._proxy.send(cp.OnReceiveChannelClosed(removed.stream_id, removed.channel))

    # -- waiting for the netbridge -------------------------------------------------------------

    def stop_awaiting(self, registration_id: int) -> SubscriptionLink | None:
        """The subscription ``registration_id`` waits no more for its endpoint (the netbridge
        answered); None if it was not waiting."""
        waiting = self._awaiting_endpoint.pop(registration_id, None)
        return None if waiting is None else waiting[0]

    def forget_awaiting_of(self, client_id: int) -> None:
        """The client ``client_id`` went: its subscriptions wait no more."""
        for registration_id, (link, _) in list(self._awaiting_endpoint.items()):
            if link.client_id == client_id:
                del self._awaiting_endpoint[registration_id]

    def announce_to_bridge(self) -> None:
        """Tell a netbridge that registers every endpoint and stream subscribed to (once
        each), and those waiting for it."""
        announced: set[tuple[tuple[str, ...], int]] = set()
        for link in self.subscriptions.values():
            key = (link.endpoint_key, link.stream_id)
            if link.is_network and key not in announced:
                announced.add(key)
                self._proxy.send(cp.OnReceiveChannel(0, link.stream_id, link.channel))
        for link, _ in self._awaiting_endpoint.values():
            self._proxy.send(cp.OnReceiveChannel(link.registration_id, link.stream_id,
                                                 link.channel))

    def on_timer(self, now_ms: int) -> int:
        """Refuse the subscriptions that waited too long for the netbridge (a share of the
        driver timeout, so their clients hear why). Returns how many."""
        work = 0
        patience_ms = int(self._context.driver_timeout * _BRIDGE_ANSWER_SHARE * 1000)
        for registration_id, (link, since_ms) in list(self._awaiting_endpoint.items()):
            if now_ms - since_ms > patience_ms:
                del self._awaiting_endpoint[registration_id]
                self._proxy.error(registration_id, cp.CHANNEL_ENDPOINT_ERROR,
                                  f"channel {link.channel!r}: no netbridge took the endpoint "
                                  f"within {patience_ms / 1000:g} s (is one starting? see the "
                                  f"error log)")
                work += 1
        return work

    def network_in_use(self) -> bool:
        """Whether any publication or subscription is on a udp channel."""
        return self._publications.network_active() or any(
            link.is_network for link in self.subscriptions.values()) or bool(
            self._awaiting_endpoint)

    # -- links ---------------------------------------------------------------------------------

    def link_publication(self, publication: IpcPublication) -> None:
        """Link a new publication to the subscriptions it matches."""
        for link in self.subscriptions.values():
            if self._matches(link, publication):
                self._publications.send_image_event(publication,
                                                    self._attach(publication, link, None))

    def link_new_image(self, image: NetworkImage, endpoint_key: tuple[str, ...]) -> None:
        """Link a new network image to the subscriptions of its endpoint (``endpoint_key``) it
        matches (the netbridge hears of its subscribers once, after)."""
        for link in self.subscriptions.values():
            if link.endpoint_key == endpoint_key and self._matches_image(link, image):
                self.link_image(image, link, notify_bridge=False)

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

    def link_image(self, image: NetworkImage, link: SubscriptionLink,
                   notify_bridge: bool = True) -> None:
        """Link ``link`` to the network ``image`` where the netbridge has received to (a group
        member: where its group is), and tell its client."""
        join = image.rcv_pos.get()
        if link.group is not None:  # a member claims where its group is
            subscriber = self._join_group(image, link, link.group, join)
        else:
            subscriber = self._subscriber_link(link, image.session_id, image.stream_id,
                                               image.channel, image.image_id, join)
        image.subscribers[subscriber.link_id] = subscriber
        self._proxy.send(cp.OnAvailableImage(subscriber.link_id, image.session_id,
                                             image.stream_id, link.registration_id,
                                             subscriber.counter_id, image.log_file,
                                             image.source_identity))
        if notify_bridge:
            self._bridge.subscribers_changed(image)

    def _subscriber_link(self, link: SubscriptionLink, session_id: int, stream_id: int,
                         channel: str, reference_id: int, join: int) -> SubscriberLink:
        who = self._clients.who(link.client_id)
        counter_id = self._counters.allocate(
            f"sub-pos: {link.registration_id} {session_id} {stream_id} {channel} @{join}{who}",
            SUB_POS, registration_id=link.registration_id, owner_id=link.client_id,
            reference_id=reference_id)
        sub_pos = position(self._counters, counter_id)
        sub_pos.set(join)
        return SubscriberLink(self._to_driver.next_correlation_id(), link.registration_id,
                              link.client_id, counter_id, sub_pos, link.tethered,
                              LinkState.ACTIVE, self._counters.clock())

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
        return ImageEvent(True, subscriber)

    def _detach(self, publication: IpcPublication, subscriber: SubscriberLink) -> None:
        """Undo an _attach whose image event was never sent."""
        self._drop_subscriber(publication, subscriber)
        publication.update_limit()

    def _unlink(self, publication: IpcPublication | NetworkImage, registration_id: int) -> bool:
        """Take the links of the subscription ``registration_id`` off this publication or
        network image; False if it had none."""
        links = [subscriber for subscriber in publication.subscribers.values()
                 if subscriber.subscription_id == registration_id]
        for subscriber in links:
            self._drop_subscriber(publication, subscriber)
        return bool(links)

    def _drop_subscriber(self, publication: IpcPublication | NetworkImage,
                         subscriber: SubscriberLink) -> None:
        """Take ``subscriber`` off this publication or network image: its sub-pos counter is
        freed, or it leaves its group."""
        del publication.subscribers[subscriber.link_id]
        if subscriber.group is None:
            self._counters.free(subscriber.counter_id)
        else:
            self._leave_group(publication, subscriber, subscriber.group)

    # -- consumer groups -----------------------------------------------------------------------

    def _join_group(self, publication: IpcPublication | NetworkImage, link: SubscriptionLink,
                    name: str, start: int | None = None) -> SubscriberLink:
        """A member's claim record in its group on this publication or network image (the
        group is made when its first member comes, claiming from ``start``, by default the
        publication's live end); the record takes the place of a sub-pos counter."""
        stream = f"{publication.session_id} {publication.stream_id} {publication.channel}"
        label = f"{publication.registration_id} {stream}"
        group = publication.groups.get(name)
        if group is None:
            counters = self._counters
            ids = allocate_all(
                counters,
                [(f"{kind}: {label} group={name}", type_id) for kind, type_id in (
                    ("grp-pos", GROUP_POS), ("grp-orphan", GROUP_ORPHAN),
                    ("grp-members", GROUP_MEMBERS), ("grp-redelivered", GROUP_REDELIVERED))],
                registration_id=publication.registration_id, owner_id=link.client_id,
                reference_id=publication.registration_id)
            group = SubscriptionGroup(name, ids[0], position(counters, ids[0]), ids[1],
                                      position(counters, ids[1]), ids[2],
                                      position(counters, ids[2]), ids[3],
                                      position(counters, ids[3]))
            if start is None:
                assert isinstance(publication, IpcPublication)
                start = publication.join_position()
            group.start(start)
            publication.groups[name] = group
        who = self._clients.who(link.client_id)
        # the subscription's registration id is the member's claim-lock token
        counter_id = self._counters.allocate(
            f"grp-claim: {link.registration_id} {stream} group={name}{who}", GROUP_CLAIM,
            key=GROUP_CLAIM_KEY.pack(group.position_counter_id, group.orphan_counter_id,
                                     link.registration_id),
            registration_id=link.registration_id, owner_id=link.client_id,
            reference_id=publication.registration_id)
        record = position(self._counters, counter_id)
        group.add_member(counter_id, record)
        return SubscriberLink(self._to_driver.next_correlation_id(), link.registration_id,
                              link.client_id, counter_id, record, True, LinkState.ACTIVE,
                              self._counters.clock(), group=name)

    def _leave_group(self, publication: IpcPublication | NetworkImage, link: SubscriberLink,
                     name: str) -> None:
        """A member left (closed, or its client timed out): its unfinished claim is handed on;
        the last member's leaving ends the group."""
        group = publication.groups[name]
        if group.remove_member(link.counter_id, link.subscription_id):
            self._counters.free(link.counter_id)
        if group.members:
            free_all(self._counters, group.hand_on(publication.log))
        else:
            free_all(self._counters, group.counter_ids())
            del publication.groups[name]
