"""Request/reply across hosts: which channels a service may use, and where replies go back.

A requester on bus A calls a service on ``aeron:udp?endpoint=B:port``: its requests cross to
bus B through the netbridges like any UDP stream, and the responders there (a subscription
group on the network image, shmbus/driver/network_image.py) share them. A reply must come back
to the one requester that asked, on host A. The requester therefore subscribes on a UDP
endpoint of its own host, its *response endpoint*, with its own (negative) response stream id,
and every request carries that response channel after the call header (the ``reply-to``
extension, shmbus/shm/call_header.py). A responder answers on a UDP publication to that
channel and stream, made at the first reply to it and kept for the next ones (one per
requester; dropped when it stops being connected).

Why not Aeron's response channels (``control-mode=response``): there the server's reply
publication sends from the requester's subscription socket back to the address the requests
came from, which needs a sender on a receive channel's socket and a new kind of image in the
netbridge. An ordinary UDP publication to an endpoint the requester names needs nothing new in
the netbridge or on the wire, and the first reply pays one SETUP/status round trip (then the
publication is cached). The cost: the requester's host must accept UDP on its response
endpoint (name it with ``response-endpoint=host:port`` on the requester's channel; by default
the address of the interface that routes to the service and a free port).

The rules (pure; the one function that opens a socket says so):

* a service channel is ``aeron:ipc`` or unicast ``aeron:udp`` with an endpoint (not a spy,
  multicast or multi-destination-cast: each receiving host's pool would run every request);
* ``response-endpoint`` is the requester's only, and only on UDP;
* a reply-to channel taken from a request is exactly ``aeron:udp?endpoint=host:port``: a
  request naming anything else is malformed (so a request cannot make a responder publish to
  an arbitrary channel or stream parameters).

Who may be answered (no reflection). A request is a datagram, and anyone can send one naming
any reply-to: a responder that answered every request would send its replies (and the SETUPs
before them) wherever a stranger asks, a reflector aimed at third hosts. So:

* a service channel **without a key**: a request is answered only when its reply-to host is
  the host the request came from (the source address of its image, ``source_identity``
  ``host:port``; the ports may differ). The hosts are compared as addresses: a reply-to naming
  a host name is refused (name ``response-endpoint`` by the address of the interface toward the
  service, as the default does). Any other request is dropped unanswered, counted
  (``rr-reflections-refused``), and no publication to its reply-to is made. This stops
  reflection to a third host, not a stranger: a forged source address still makes an unkeyed
  responder answer the forged host (and run the handler), so a service open to an untrusted
  network names a key.
* a service channel **with a key** (``|key=K``, shmbus/settings/keyring.py): only holders of K can
  send a request, so any reply-to is answered; the replies go on the reply-to channel plus
  ``|key=K`` from the responder's own service channel (never from the request, whose reply-to
  stays exactly ``aeron:udp?endpoint=host:port``), and the requester subscribes to its reply
  channel with the ``|key=K`` of its service channel: replies are sealed as the requests are.
"""

from __future__ import annotations

import ipaddress
import socket

from shmbus.settings.channel_uri import KEY, ChannelUri, ChannelUriError

#: The requester's channel parameter naming its response endpoint (host:port).
RESPONSE_ENDPOINT = "response-endpoint"
_REPLY_TO_PREFIX = "aeron:udp?endpoint="


def service_channel(channel: str, *, requester: bool) -> tuple[str, str | None]:
    """(the service's channel as the driver takes it, the response endpoint or None).

    ``channel`` is what the user passed to ``add_requester`` or ``add_responder``. The
    ``response-endpoint`` parameter is taken off (a requester's, on UDP only). ValueError
    names what is wrong: another media, a spy, multicast or MDC, no endpoint, a malformed
    channel or response endpoint.
    """
    if not isinstance(channel, str):
        raise ValueError(f"a service channel is a string, not {type(channel).__name__}")
    base, _, query = channel.partition("?")
    items = query.split("|") if query else []
    kept = [item for item in items if not item.startswith(RESPONSE_ENDPOINT + "=")]
    named = [item.partition("=")[2] for item in items if item not in kept]
    driver_channel = base + ("?" + "|".join(kept) if kept else "")
    try:
        uri = ChannelUri.parse(driver_channel)
    except ChannelUriError as error:
        raise ValueError(f"request/reply service channel: {error}") from None
    if uri.spy:
        raise ValueError(f"request/reply does not run on spies: {channel!r}")
    if uri.is_ipc:
        if named:
            raise ValueError(f"{RESPONSE_ENDPOINT} is for aeron:udp services; {channel!r} is "
                             f"aeron:ipc (its replies stay on this host)")
        return driver_channel, None
    if "endpoint" not in uri.params:
        raise ValueError(f"a request/reply service on aeron:udp needs endpoint=host:port "
                         f"(where its responders receive): {channel!r}")
    if uri.is_multicast or uri.control_mode is not None or "control" in uri.params:
        raise ValueError(f"request/reply runs on unicast aeron:udp (endpoint=host:port); "
                         f"{channel!r} is multicast or multi-destination-cast, where every "
                         f"receiving host's responders would run each request")
    if len(named) > 1:
        raise ValueError(f"{RESPONSE_ENDPOINT} given twice in {channel!r}")
    if named and not requester:
        raise ValueError(f"{RESPONSE_ENDPOINT} is a requester's parameter (where its replies "
                         f"come back); a responder answers where each request says: "
                         f"{channel!r}")
    if named:
        check_endpoint(named[0], f"{RESPONSE_ENDPOINT} of {channel!r}")
    return driver_channel, named[0] if named else None


def check_endpoint(endpoint: str, what: str) -> None:
    """ValueError naming ``what`` unless ``endpoint`` is a unicast host:port with a port."""
    try:
        uri = ChannelUri.parse(_REPLY_TO_PREFIX + endpoint)
    except ChannelUriError:
        raise ValueError(f"{what}: {endpoint!r} is not host:port") from None
    if uri.is_multicast:
        raise ValueError(f"{what}: {endpoint!r} is a multicast address")
    if endpoint.rpartition(":")[2] in ("", "0"):
        raise ValueError(f"{what}: {endpoint!r} needs a port (not 0)")


def reply_to_channel(endpoint: str) -> str:
    """The channel a requester subscribes to for its replies, and its requests name."""
    return _REPLY_TO_PREFIX + endpoint


def check_reply_to(channel: str) -> str:
    """``channel`` if it is a reply-to channel (``aeron:udp?endpoint=host:port``, unicast,
    nothing else), else ValueError naming it. Used on what a request carries."""
    if not channel.startswith(_REPLY_TO_PREFIX) or "|" in channel:
        raise ValueError(f"reply-to {channel!r} is not {_REPLY_TO_PREFIX}host:port")
    check_endpoint(channel[len(_REPLY_TO_PREFIX):], "reply-to")
    return channel


def keyed_reply_channel(reply_to: str, service: str) -> str:
    """The channel replies to ``reply_to`` travel on for the service on ``service`` (a driver
    channel): ``reply_to`` with the service's ``key=``, or ``reply_to`` itself when the service
    names none. The key is always the service's own, never anything a request says."""
    key = ChannelUri.parse(service).key
    return reply_to if key is None else f"{reply_to}|{KEY}={key}"


def may_answer(reply_to: str, source_identity: str, service: str) -> bool:
    """Whether a responder on ``service`` answers a request naming ``reply_to`` (a checked
    reply-to channel) that came from ``source_identity`` (its image's ``host:port``): always on
    a keyed service, else only when the reply-to host is the source's host (as addresses; the
    ports may differ)."""
    if ChannelUri.parse(service).key is not None:
        return True
    reply_host = _address(reply_to[len(_REPLY_TO_PREFIX):].rpartition(":")[0])
    return reply_host is not None and reply_host == _address(source_identity.rpartition(":")[0])


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` names (an IPv4-mapped IPv6 address as its IPv4 one), None for a
    host name or anything else."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def default_response_endpoint(service_endpoint: str) -> str:
    """A response endpoint for a requester that named none: the address of this host's
    interface that routes to ``service_endpoint``'s host, and a port free now (I/O: opens
    and closes two UDP sockets; another process could take the port before the netbridge
    binds it, which the subscription's error would then name)."""
    host, _, port = service_endpoint.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, int(port)))  # no datagram: only picks the route
        local = probe.getsockname()[0]
    with socket.socket(family, socket.SOCK_DGRAM) as free:
        free.bind((local, 0))
        free_port = free.getsockname()[1]
    return f"[{local}]:{free_port}" if family == socket.AF_INET6 else f"{local}:{free_port}"


def requester_route(channel: str) -> tuple[str, str | None]:
    """(the service's channel as the driver takes it, the requester's reply-to channel, None
    for aeron:ipc): the response endpoint the channel names, else a default one (see
    :func:`default_response_endpoint`). ValueError as :func:`service_channel`."""
    service, endpoint = service_channel(channel, requester=True)
    if service.startswith("aeron:ipc"):
        return service, None
    if endpoint is None:
        endpoint = default_response_endpoint(ChannelUri.parse(service).params["endpoint"])
    return service, reply_to_channel(endpoint)
