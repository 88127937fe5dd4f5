"""Whose messages may run code here: a network writer only on an authenticated channel.

``Subscription.objects()`` unpickles, and unpickling runs code of the writer's choosing. On
``aeron:ipc`` every writer is a process of the bus's own user (the bus directory is private,
mode 0700). On an ``aeron:udp`` channel the netbridge places whatever datagrams reach the
channel's endpoint: any host that can send one there (its source address forged or not) is a
writer. A channel naming a key (``|key=<name>``, shmbus/settings/keyring.py) has its datagrams
sealed, so only the holders of that key write to it.

The rule: a subscription on ``aeron:udp`` without ``key=`` reads objects
only when its reader passes ``trust_unkeyed_network=True``; otherwise each message is refused
with :class:`~shmbus.settings.errors.UntrustedSourceError` before a byte of it is decoded. The rule
goes by the subscription's channel, not by an image's claimed source. A spy
(``aeron-spy:aeron:udp?...``) reads this host's own publications, so it is trusted as IPC is.
A channel that does not parse counts as unkeyed network (refused). Pure.
"""

from __future__ import annotations

from shmbus.settings.channel_uri import ChannelUri, ChannelUriError
from shmbus.settings.errors import UntrustedSourceError

#: The keyword argument of ``objects()`` and ``objects_async()`` that lets an unkeyed network
#: channel's messages be unpickled.
TRUST_OPTION = "trust_unkeyed_network"


def unkeyed_network(channel: str) -> bool:
    """True when any host may write what a subscription on ``channel`` reads: ``aeron:udp``
    without ``key=`` (not a spy), or a channel that does not parse."""
    try:
        uri = ChannelUri.parse(channel)
    except ChannelUriError:
        return True
    return uri.media == "udp" and uri.key is None and not uri.spy


def refusal(channel: str, source: str) -> UntrustedSourceError:
    """The error refusing a message from ``source`` (an image's source identity) on the
    subscription ``channel``: it names both and the opt-in."""
    return UntrustedSourceError(channel, source, TRUST_OPTION)
