"""The commands of the bus's clients: publications and subscriptions added and removed,
destinations of manual-control udp publications, a client closing; and a client's end, by
its close or its timeout, which takes with it everything it owned.

Each handler answers its command (a ready or success response) or raises CommandError, which
the conductor turns into ON_ERROR.
"""

from __future__ import annotations

from shmbus.driver.bridge_link import BridgeLink
from shmbus.driver.channel_addresses import check_addresses
from shmbus.driver.client_proxy import ClientProxy, CommandError
from shmbus.driver.client_sessions import ClientSessions
from shmbus.driver.ipc_publication import NetworkPublication
from shmbus.driver.publications import Publications
from shmbus.driver.subscription_links import SubscriptionLinks
from shmbus.driver.system_counters import SystemCounter
from shmbus.settings.channel_uri import ChannelUri
from shmbus.settings.context import Context
from shmbus.settings.keyring import KeyringError, keyring_path, load_keyring
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import CountersManager


class ClientCommands:
    """The handlers of the clients' commands, and the removal of a client. Single-threaded:
    the conductor's."""

    def __init__(self, context: Context, counters: CountersManager, proxy: ClientProxy,
                 clients: ClientSessions, publications: Publications,
                 links: SubscriptionLinks, bridge: BridgeLink) -> None:
        self._context = context
        self._counters = counters
        self._proxy = proxy
        self._clients = clients
        self._publications = publications
        self._links = links
        self._bridge = bridge

    def _parse_channel(self, channel: str, stream_id: int) -> ChannelUri:
        uri = ChannelUri.parse(channel)
        check_addresses(uri, channel)
        if uri.key is not None:  # the netbridge seals with it: a missing key fails here, clearly
            try:
                load_keyring(keyring_path(self._context.keyring)).keys_of(uri.key)
            except KeyringError as e:
                raise CommandError(cp.INVALID_CHANNEL, f"channel {channel!r}: {e}") from None
        if stream_id == 0:  # the wire format holds any other 32-bit signed integer
            raise CommandError(cp.INVALID_CHANNEL,
                               "stream_id 0 is reserved: a stream id is a non-zero 32-bit "
                               "signed integer")
        return uri

    # -- publications --------------------------------------------------------------------------

    def on_add_publication(self, command: cp.AddPublication) -> None:
        exclusive = isinstance(command, cp.AddExclusivePublication)
        channel = self._parse_channel(command.channel, command.stream_id)
        if channel.spy:
            raise CommandError(cp.INVALID_CHANNEL,
                               f"channel {command.channel!r}: spies are for subscriptions")
        publication = None
        if not exclusive:
            publication = self._publications.find_concurrent(channel, command.stream_id)
        if publication is None:
            publication = self._publications.create(command, channel, exclusive)
            if isinstance(publication, NetworkPublication):
                self._bridge.ensure()
                self._publications.announce(publication)
            self._links.link_publication(publication)
        self._publications.add_owner(publication, command.correlation_id, command.client_id)
        client = self._clients.clients[command.client_id]
        client.publications.add(command.correlation_id)
        if client.aeron and not isinstance(publication, NetworkPublication):
            publication.log.raised_by_readers(publication.limit_counter_id)
        ready = cp.OnExclusivePublicationReady if exclusive else cp.OnPublicationReady
        # the registration id is the log's (its first add's): Aeron's clients key their log
        # mappings by it; each add's own id is its correlation id
        self._proxy.send(ready(command.correlation_id, publication.registration_id,
                               publication.session_id, publication.stream_id,
                               publication.limit_counter_id,
                               cp.CHANNEL_STATUS_NOT_ALLOCATED, publication.log_file))

    def on_remove_publication(self, command: cp.RemovePublication) -> None:
        self._clients.check_owns_publication(command.client_id, command.registration_id)
        if not self._publications.remove_owner(command.registration_id):
            raise CommandError(cp.UNKNOWN_PUBLICATION,
                               f"unknown publication {command.registration_id}")
        self._clients.clients[command.client_id].publications.discard(command.registration_id)
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))

    def on_destination(self, command: cp.AddDestination) -> None:
        self._clients.check_owns_publication(command.client_id, command.registration_id)
        publication = self._publications.owned(command.registration_id)
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
        self._publications.set_destination(publication, endpoint, added)
        self._proxy.send(cp.OnDestination(publication.registration_id, int(added), endpoint))
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))

    # -- subscriptions -------------------------------------------------------------------------

    def on_add_subscription(self, command: cp.AddSubscription) -> None:
        uri = self._parse_channel(command.channel, command.stream_id)
        self._links.add(command, uri)

    def on_remove_subscription(self, command: cp.RemoveSubscription) -> None:
        owned = self._clients.clients[command.client_id].subscriptions
        if command.registration_id not in owned:
            raise CommandError(cp.UNKNOWN_SUBSCRIPTION,
                               f"unknown subscription {command.registration_id} (not one "
                               f"client {command.client_id} added)")
        self._links.remove(command.registration_id)
        owned.discard(command.registration_id)
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))

    # -- a client's end ------------------------------------------------------------------------

    def on_client_close(self, command: cp.ClientClose) -> None:
        self.remove_client(command.client_id)

    def check_clients(self, now_ms: int) -> int:
        """Time out the clients whose heartbeat stopped (each hears it, and goes), and pass a
        dead client's half-written command. Returns the work done."""
        work = 0
        for client in self._clients.timed_out(now_ms):
            self._counters.add(SystemCounter.CLIENT_TIMEOUTS.value, 1)
            self._proxy.send(cp.OnClientTimeout(client.client_id))
            self.remove_client(client.client_id)
            work += 1
        return work + self._clients.unblock_commands(now_ms)

    def remove_client(self, client_id: int) -> None:
        """The client ``client_id`` is gone: its subscriptions, publications and counters go
        with it; a netbridge's images close, and with udp channels in use another netbridge
        is started."""
        client = self._clients.pop(client_id)
        if client is None:
            return
        now_ms = self._counters.clock()
        self._links.forget_awaiting_of(client_id)
        for registration_id in client.subscriptions:
            self._links.remove(registration_id)
        for registration_id in client.publications:
            self._publications.remove_owner(registration_id)
        self._clients.free_counters(client)
        if client_id == self._bridge.client_id:
            for publication in self._publications.network():
                publication.log.active_transport_count = 0
            self._bridge.gone(client_id, client.pid, now_ms, self._links.network_in_use())
