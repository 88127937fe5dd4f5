"""The commands only the netbridge sends: registering as the bus's netbridge, whether it could
take a subscription's endpoint, the network images it creates and closes, and the errors it
reports (the driver keeps them in its error log).

Each handler answers its command or raises CommandError, which the conductor turns into
ON_ERROR.
"""

from __future__ import annotations

from shmbus.driver.bridge_link import BridgeLink
from shmbus.driver.client_proxy import ClientProxy
from shmbus.driver.publications import Publications
from shmbus.driver.subscription_links import SubscriptionLinks
from shmbus.settings.channel_uri import ChannelUri
from shmbus.shm import control_protocol as cp


class BridgeCommands:
    """The handlers of the netbridge's commands. Single-threaded: the conductor's."""

    def __init__(self, proxy: ClientProxy, publications: Publications,
                 links: SubscriptionLinks, bridge: BridgeLink) -> None:
        self._proxy = proxy
        self._publications = publications
        self._links = links
        self._bridge = bridge

    def on_register_bridge(self, command: cp.RegisterBridge) -> None:
        """The client is the netbridge: it hears of every udp publication (with its
        destinations) and of every endpoint and stream subscribed to."""
        self._bridge.register(command.client_id)
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))
        for publication in self._publications.network():
            self._publications.announce(publication)
            for endpoint in self._publications.destinations(publication):
                self._proxy.send(cp.OnDestination(publication.registration_id, 1, endpoint))
        self._links.announce_to_bridge()

    def on_receive_channel_status(self, command: cp.ReceiveChannelStatus) -> None:
        """Whether the netbridge could take a subscription's endpoint: the subscription
        waiting for it is answered (ready, or refused with the netbridge's reason)."""
        self._bridge.require(command.client_id)
        waiting = self._links.stop_awaiting(command.subscription_id)
        error = f"channel {command.channel!r}: {command.error}" if command.error else ""
        if waiting is not None and error:
            self._proxy.error(command.subscription_id, cp.CHANNEL_ENDPOINT_ERROR, error)
        elif waiting is not None:
            self._links.activate(waiting)
        elif error:  # for subscriptions that were ready before the netbridge (re)started
            self._proxy.record(f"netbridge: {error}")
        else:
            # the subscription it was for went away meanwhile: let the endpoint go again
            # unless someone else wants the stream there
            if not self._links.wanted(ChannelUri.parse(command.channel).endpoint_key(),
                                      command.stream_id):
                self._proxy.send(cp.OnReceiveChannelClosed(command.stream_id, command.channel))
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))

    def on_create_image(self, command: cp.CreateImage) -> None:
        """A network image the netbridge receives: made, answered, and linked to the
        subscriptions of its stream."""
        self._bridge.require(command.client_id)
        image = self._bridge.create_image(command)
        self._links.link_new_image(image, ChannelUri.parse(command.channel).endpoint_key())
        self._bridge.subscribers_changed(image)

    def on_close_image(self, command: cp.CloseImage) -> None:
        self._bridge.require(command.client_id)
        self._bridge.close_image(command.image_id)
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))

    def on_report_error(self, command: cp.ReportError) -> None:
        self._bridge.require(command.client_id)
        self._proxy.error_log.record(f"netbridge: {command.error}")
        self._proxy.send(cp.OnOperationSuccess(command.correlation_id))
