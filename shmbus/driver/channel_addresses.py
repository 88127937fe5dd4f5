"""The driver's check of a udp channel's addresses against this host, when a publication,
subscription or destination is added: every ``endpoint`` and ``control`` host resolves, and
``interface`` is one of this host's IPv4 addresses. Runs in the driver process.

Parsing (shmbus.settings.channel_uri) only checks the shape of ``host:port``; whether a name
resolves is a fact of the host at the moment of adding, so the driver asks, as Aeron's does: a
channel that cannot resolve is refused then, instead of a publication that never connects.
"""

from __future__ import annotations

import socket

import psutil

from shmbus.settings.channel_uri import ChannelUri, ChannelUriError


def check_addresses(uri: ChannelUri, channel: str) -> None:
    """Raise ChannelUriError naming the parameter and host of ``channel`` (as the client
    wrote it) whose host does not resolve to an IPv4 address, or whose ``interface`` is not
    an address of this host. Resolution may query DNS (the host's resolver, as the netbridge
    will when it opens the sockets)."""
    if uri.is_ipc:
        return
    for key in ("endpoint", "control"):
        if key in uri.params:
            _resolve(channel, key, uri.params[key].rpartition(":")[0])
    if "interface" in uri.params:
        host = uri.params["interface"].partition(":")[0]
        address = _resolve(channel, "interface", host)
        local = {a.address for addresses in psutil.net_if_addrs().values()
                 for a in addresses if a.family == socket.AF_INET}
        if address not in local and address != "0.0.0.0":
            raise ChannelUriError(f"channel {channel!r}: interface {host} is not an address "
                                  f"of this host ({', '.join(sorted(local))})")


def _resolve(channel: str, key: str, host: str) -> str:
    if "\0" in host:  # (the resolver raises TypeError for one, not an OSError)
        raise ChannelUriError(f"channel {channel!r}: {key} host {host!r} holds a NUL byte")
    try:
        return socket.gethostbyname(host.strip("[]"))
    except (OSError, UnicodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ChannelUriError(f"channel {channel!r}: {key} host {host!r} does not resolve "
                              f"to an IPv4 address ({reason})") from None
