"""shmbus: a shared-memory message bus for Python processes, following Aeron's design.

Start with ``bus = shmbus.connect()`` (it starts a driver process if none is alive; settings
as keywords or in a :class:`Context`), then ``bus.add_publication(channel, stream_id)`` or
``bus.add_exclusive_publication(...)`` to write and ``bus.add_subscription(channel,
stream_id)`` to read; channels are ``"aeron:ipc"`` on this host or
``"aeron:udp?endpoint=host:port"`` across hosts.

Writing: ``pub.offer(data)`` returns the new stream position (bytes, > 0) or a negative code
(in :mod:`shmbus.codes`: NOT_CONNECTED, BACK_PRESSURED, ADMIN_ACTION, CLOSED,
MAX_POSITION_EXCEEDED) and never blocks; ``pub.publish(data, timeout=s)`` sleeps while
back-pressured and raises PublicationError after ``timeout`` seconds; ``publish_async`` awaits.
Every call that can wait follows one rule: ``timeout=None`` waits forever, ``0`` tries once, a
number is a deadline in seconds; its ``_async`` twin takes the same arguments.

Reading: ``sub.poll(handler, limit)`` calls ``handler(buffer, header)`` per fragment without
blocking, ``poll(..., timeout=s)`` and ``sub.wait(s)`` sleep until the writer wakes them,
``sub.messages()`` and ``async for m in sub`` yield whole messages as bytes. A late joiner that
needs what it missed passes ``history=Recording(dir)`` and ``from_position`` to
``add_subscription``: the recording that ``bus.add_recorder(dir, channel, stream_id)`` makes
first, then live, with no gap and no duplicate (a :class:`LateJoinSubscription`).

Failures raise subclasses of :class:`ShmbusError`: DriverUnavailableError (no driver, none
startable), DriverTimeoutError (the driver stopped answering; every later call of that client
raises it, unless it was connected with ``reconnect=True``: then it waits for a new driver,
re-adds everything and reports a :class:`Reconnected`), RegistrationError (the driver
refused a channel), PublicationError, ClientClosedError, UntrustedSourceError
(``objects()`` on an ``aeron:udp`` channel without ``key=``: unpickling would run a stranger's
code; ``trust_unkeyed_network=True`` lets it through). Every name in ``__all__`` is public;
everything else is private.
"""

from shmbus.archive.catalog import DiskFullError, RecordingError
from shmbus.archive.recorder import Recorder
from shmbus.archive.recording_reader import RecordingReader
from shmbus.calls.requester import Call, Requester
from shmbus.calls.responder import Responder
from shmbus.client.client import Client, connect
from shmbus.client.reconnection import Reconnected
from shmbus.history.history_merge import HistoryGapError
from shmbus.history.late_join import LateJoinSubscription, MessageInfo, Recording
from shmbus.settings import codes
from shmbus.settings import idle_strategy as idle_strategies
from shmbus.settings.channel_uri import ChannelUriError
from shmbus.settings.context import Context
from shmbus.settings.errors import (
    ClientClosedError,
    ClientTimeoutError,
    DriverTimeoutError,
    DriverUnavailableError,
    NoResponderError,
    PublicationError,
    RegistrationError,
    RemoteError,
    RequestError,
    RequestTimeoutError,
    ResponderLostError,
    ShmbusError,
    UntrustedSourceError,
)
from shmbus.shm._native import AtomicBuffer, Header
from shmbus.streams.fragment_assembler import FragmentAssembler
from shmbus.streams.image import FragmentBatch, Image, MessageView
from shmbus.streams.large_messages import LargeClaim
from shmbus.streams.publication import (
    ArrayClaim,
    BufferClaim,
    ConcurrentPublication,
    ExclusivePublication,
    Publication,
)
from shmbus.streams.subscription import Subscription
from shmbus.streams.subscription_group import GroupSubscription

__all__ = [
    "codes",
    "idle_strategies",
    "ArrayClaim",
    "AtomicBuffer",
    "BufferClaim",
    "ChannelUriError",
    "Client",
    "ClientClosedError",
    "ClientTimeoutError",
    "Context",
    "DiskFullError",
    "DriverTimeoutError",
    "DriverUnavailableError",
    "ConcurrentPublication",
    "ExclusivePublication",
    "FragmentAssembler",
    "FragmentBatch",
    "GroupSubscription",
    "Header",
    "HistoryGapError",
    "Image",
    "LargeClaim",
    "LateJoinSubscription",
    "MessageInfo",
    "MessageView",
    "Publication",
    "PublicationError",
    "Reconnected",
    "Recording",
    "RecordingError",
    "RecordingReader",
    "Recorder",
    "RegistrationError",
    "ShmbusError",
    "Subscription",
    "UntrustedSourceError",
    "ResponderLostError",
    "Responder",
    "Requester",
    "RequestTimeoutError",
    "RequestError",
    "RemoteError",
    "NoResponderError",
    "Call",
    "connect",
]
