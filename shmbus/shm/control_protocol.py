"""Messages between clients and the driver: commands on the to-driver ring buffer, responses
and events on the broadcast buffers (docs/protocol.md, Control protocol). Pure encode/decode,
no I/O; the client, the driver and the netbridge all import it.

Each message is a fixed little-endian part followed by zero or more variable parts (UTF-8
strings, or bytes), each prefixed by its length (i32); as in Aeron, every variable part but
the last is padded with zeros to a multiple of 4 bytes. Aeron's commands and responses are
Aeron's flyweights with Aeron's type ids (``aeron_control_protocol.h``, Aeron 1.48 to 1.53), so
Aeron's own clients speak to the driver. shmbus's own messages take type ids from 0x100
(commands) and 0x1F00 (events), clear of Aeron's ranges; its events travel only on the events
buffer, which Aeron's clients never read.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass, fields
from typing import ClassVar


class MalformedMessage(ValueError):
    """A command or response whose bytes do not decode."""


class UnknownMessageType(MalformedMessage):
    """A message type id this protocol does not have (one of Aeron's commands the driver
    does not serve, for instance)."""


# Aeron's error codes for ON_ERROR
INVALID_CHANNEL = 1
UNKNOWN_SUBSCRIPTION = 2
UNKNOWN_PUBLICATION = 3
CHANNEL_ENDPOINT_ERROR = 4
UNKNOWN_COUNTER = 5
UNKNOWN_COMMAND_TYPE_ID = 6
MALFORMED_COMMAND = 7
NOT_SUPPORTED = 8
GENERIC_ERROR = 11
STORAGE_SPACE = 12

#: ON_PUBLICATION_READY's and ON_SUBSCRIPTION_READY's channel status indicator on ipc
CHANNEL_STATUS_NOT_ALLOCATED = -1

#: The integer codes of the fixed parts, by their width in bits
_SIGNED_BITS = {"i": 32, "q": 64}


@dataclass(frozen=True)
class Message:
    """Base of every message: ``FORMAT`` is the fixed part; str fields follow it."""

    TYPE_ID: ClassVar[int] = 0
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<")

    def encode(self) -> bytes:
        """The message's bytes. ValueError (TypeError) names a field whose value does not fit
        (is not of) its integer type, e.g. a stream_id outside int32."""
        values = astuple(self)
        fixed_count = len(values) - self._variable_count()
        try:
            out = [self.FORMAT.pack(*values[:fixed_count])]
        except struct.error:
            self._check_fixed_fields(values[:fixed_count])
            raise
        variable = values[fixed_count:]
        for index, part in enumerate(variable):
            data = part.encode() if isinstance(part, str) else bytes(part)
            out.append(struct.pack("<i", len(data)))
            out.append(data)
            if index < len(variable) - 1:
                out.append(bytes(-len(data) % 4))
        return b"".join(out)

    def _check_fixed_fields(self, values: tuple[object, ...]) -> None:
        codes = self.FORMAT.format.lstrip("<")
        for f, code, value in zip(fields(self), codes, values, strict=True):
            bits = _SIGNED_BITS[code]
            low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{f.name} must be an int, not {type(value).__name__}")
            if not low <= value <= high:
                raise ValueError(f"{f.name}={value} is outside {low}..{high} "
                                 f"(a {bits}-bit signed integer)")

    @classmethod
    def _variable_kinds(cls) -> list[str]:
        return [f.type for f in fields(cls) if f.type in ("str", "bytes")]

    @classmethod
    def _variable_count(cls) -> int:
        return len(cls._variable_kinds())

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Message:
        data = bytes(data)
        try:
            values: list[object] = list(cls.FORMAT.unpack_from(data, 0))
            offset = cls.FORMAT.size
            kinds = cls._variable_kinds()
            for index, kind in enumerate(kinds):
                (length,) = struct.unpack_from("<i", data, offset)
                offset += 4
                if length < 0 or offset + length > len(data):
                    raise MalformedMessage(f"{cls.__name__}: length {length} of a variable "
                                           f"part overruns the {len(data)}-byte message")
                part = data[offset:offset + length]
                values.append(part.decode() if kind == "str" else part)
                offset += length
                if index < len(kinds) - 1:
                    offset += -length % 4
        except (struct.error, UnicodeDecodeError) as e:
            raise MalformedMessage(f"{cls.__name__}: {e}") from None
        return cls(*values)


# -- Aeron's commands (client -> driver) --------------------------------------------------

@dataclass(frozen=True)
class Command(Message):
    """Base of every command: each starts with the id of the client that sent it and the
    correlation id of its answer (for an add, the registration id of what it adds)."""

    client_id: int
    correlation_id: int


@dataclass(frozen=True)
class AddPublication(Command):
    TYPE_ID: ClassVar[int] = 0x01
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqi")
    client_id: int
    correlation_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class AddExclusivePublication(AddPublication):
    TYPE_ID: ClassVar[int] = 0x03


@dataclass(frozen=True)
class RemovePublication(Command):
    """Remove a publication. Aeron's clients add a flags word (bit 0: revoke); the driver
    does not read it, so a revoke is an ordinary remove."""

    TYPE_ID: ClassVar[int] = 0x02
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    registration_id: int


@dataclass(frozen=True)
class AddSubscription(Command):
    """``registration_correlation_id`` is Aeron's (0 from its clients; unused)."""

    TYPE_ID: ClassVar[int] = 0x04
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqqi")
    client_id: int
    correlation_id: int
    registration_correlation_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class RemoveSubscription(RemovePublication):
    TYPE_ID: ClassVar[int] = 0x05


@dataclass(frozen=True)
class ClientKeepalive(Command):
    """The client is alive: its heartbeat counter takes the time. No answer. Aeron's clients
    from 1.48 to 1.53 write their heartbeat counter instead; the driver serves the command
    as Aeron's driver does."""

    TYPE_ID: ClassVar[int] = 0x06
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qq")
    client_id: int
    correlation_id: int


@dataclass(frozen=True)
class AddDestination(Command):
    """Add a destination to a manual multi-destination-cast publication."""

    TYPE_ID: ClassVar[int] = 0x07
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    registration_id: int
    destination: str


@dataclass(frozen=True)
class RemoveDestination(AddDestination):
    TYPE_ID: ClassVar[int] = 0x08


@dataclass(frozen=True)
class AddCounter(Command):
    """Aeron's ADD_COUNTER: a counter of ``type_id`` owned by the client, its registration id
    the correlation id; answered by OnCounterReady."""

    TYPE_ID: ClassVar[int] = 0x09
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqi")
    client_id: int
    correlation_id: int
    type_id: int
    key: bytes
    label: str


@dataclass(frozen=True)
class RemoveCounter(Command):
    """Aeron's REMOVE_COUNTER, by the counter's registration id; answered by
    OnOperationSuccess, then OnUnavailableCounter."""

    TYPE_ID: ClassVar[int] = 0x0A
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    registration_id: int


@dataclass(frozen=True)
class ClientClose(Command):
    TYPE_ID: ClassVar[int] = 0x0B
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qq")
    client_id: int
    correlation_id: int


# -- Aeron's responses (driver -> clients) ------------------------------------------------

@dataclass(frozen=True)
class OnError(Message):
    TYPE_ID: ClassVar[int] = 0x0F01
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    correlation_id: int
    code: int
    message: str


@dataclass(frozen=True)
class OnAvailableImage(Message):
    """A publication's session is now readable by a subscription. The subscriber's position
    counter holds the join position when this is sent."""

    TYPE_ID: ClassVar[int] = 0x0F02
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qiiqi")
    correlation_id: int              # the image's id (the driver's link id)
    session_id: int
    stream_id: int
    subscription_registration_id: int
    position_counter_id: int         # sub-pos: the subscriber writes it
    log_file: str
    source_identity: str


@dataclass(frozen=True)
class OnPublicationReady(Message):
    TYPE_ID: ClassVar[int] = 0x0F03
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqiiii")
    correlation_id: int
    registration_id: int
    session_id: int
    stream_id: int
    limit_counter_id: int            # pub-lmt: the driver (or a shmbus publisher) moves it
    channel_status_indicator_id: int
    log_file: str


@dataclass(frozen=True)
class OnOperationSuccess(Message):
    TYPE_ID: ClassVar[int] = 0x0F04
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<q")
    correlation_id: int


@dataclass(frozen=True)
class OnUnavailableImage(Message):
    TYPE_ID: ClassVar[int] = 0x0F05
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqi")
    correlation_id: int
    subscription_registration_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class OnExclusivePublicationReady(OnPublicationReady):
    TYPE_ID: ClassVar[int] = 0x0F06


@dataclass(frozen=True)
class OnSubscriptionReady(Message):
    TYPE_ID: ClassVar[int] = 0x0F07
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    correlation_id: int
    channel_status_indicator_id: int


@dataclass(frozen=True)
class OnCounterReady(Message):
    """A counter is allocated: an AddCounter's (by its correlation id), or a client's
    heartbeat (by the client id)."""

    TYPE_ID: ClassVar[int] = 0x0F08
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    correlation_id: int
    counter_id: int


@dataclass(frozen=True)
class OnUnavailableCounter(OnCounterReady):
    TYPE_ID: ClassVar[int] = 0x0F09


@dataclass(frozen=True)
class OnClientTimeout(Message):
    TYPE_ID: ClassVar[int] = 0x0F0A
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<q")
    client_id: int


# -- shmbus's own commands (type ids from 0x100) -------------------------------------------

@dataclass(frozen=True)
class ClientConnect(Command):
    """A new shmbus client introduces itself; the driver answers ClientReady."""

    TYPE_ID: ClassVar[int] = 0x101
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    pid: int
    name: str


@dataclass(frozen=True)
class AddLinkedCounter(Command):
    """Allocate a counter owned by the client (freed by FreeCounter or when the client goes
    away); answered by OnCounterReady. ``registration_id`` and ``reference_id`` go into the
    counter (a registration id of 0: the correlation id), so that a counter about a stream can
    name its log as the driver's own stream counters do."""

    TYPE_ID: ClassVar[int] = 0x102
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqiqq")
    client_id: int
    correlation_id: int
    type_id: int
    registration_id: int
    reference_id: int
    label: str


@dataclass(frozen=True)
class FreeCounter(Command):
    """Free a counter the client allocated, by its id; answered by OnOperationSuccess."""

    TYPE_ID: ClassVar[int] = 0x103
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqi")
    client_id: int
    correlation_id: int
    counter_id: int


# -- the netbridge's commands (a client with extra rights) --------------------------------

@dataclass(frozen=True)
class RegisterBridge(ClientClose):
    """The client is the netbridge: it gets network publications and receive channels."""

    TYPE_ID: ClassVar[int] = 0x120


@dataclass(frozen=True)
class CreateImage(Command):
    """A SETUP arrived: make an image log; answered by OnImageReady."""

    TYPE_ID: ClassVar[int] = 0x121
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqiiiiiq")
    client_id: int
    correlation_id: int
    session_id: int
    stream_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    join_position: int
    channel: str
    source_identity: str


@dataclass(frozen=True)
class CloseImage(Command):
    """The image ended (end of stream or liveness timeout)."""

    TYPE_ID: ClassVar[int] = 0x122
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    image_id: int


@dataclass(frozen=True)
class ReceiveChannelStatus(Command):
    """The netbridge's answer to an OnReceiveChannel: it listens for ``stream_id`` on
    ``channel``'s endpoint (``error`` empty), or it could not (``error`` says why, naming the
    address and, where it can, the process that holds it). ``subscription_id`` is the
    OnReceiveChannel's: the subscription waiting for this answer, or 0. Answered by
    OnOperationSuccess."""

    TYPE_ID: ClassVar[int] = 0x123
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqqi")
    client_id: int
    correlation_id: int
    subscription_id: int
    stream_id: int
    channel: str
    error: str


@dataclass(frozen=True)
class ReportError(Command):
    """The netbridge's note for the driver's error log (``shmbus errors``): e.g. datagrams it
    dropped on an authenticated channel, at most a few per source a second. Answered by
    OnOperationSuccess."""

    TYPE_ID: ClassVar[int] = 0x124
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qq")
    client_id: int
    correlation_id: int
    error: str


# -- shmbus's own events (type ids from 0x1F00; on the events buffer only) -----------------

@dataclass(frozen=True)
class OnClientReady(Message):
    TYPE_ID: ClassVar[int] = 0x1F10
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    correlation_id: int
    heartbeat_counter_id: int


@dataclass(frozen=True)
class OnImageReady(Message):
    TYPE_ID: ClassVar[int] = 0x1F11
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqii")
    correlation_id: int
    image_id: int
    rcv_hwm_counter_id: int
    rcv_pos_counter_id: int
    log_file: str


@dataclass(frozen=True)
class OnNetworkPublication(Message):
    """A publication on a udp channel: the netbridge sends it."""

    TYPE_ID: ClassVar[int] = 0x1F20
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qiiiii")
    registration_id: int
    session_id: int
    stream_id: int
    snd_pos_counter_id: int
    snd_lmt_counter_id: int
    snd_bpe_counter_id: int
    channel: str
    log_file: str


@dataclass(frozen=True)
class OnNetworkPublicationClosed(Message):
    TYPE_ID: ClassVar[int] = 0x1F21
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qq")
    registration_id: int
    end_position: int


@dataclass(frozen=True)
class OnReceiveChannel(Message):
    """A subscription on a udp channel: the netbridge listens for its stream on the channel's
    endpoint and answers with ReceiveChannelStatus when it could not, or when
    ``subscription_id`` (the subscription waiting for the answer) is not 0."""

    TYPE_ID: ClassVar[int] = 0x1F22
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    subscription_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class OnReceiveChannelClosed(Message):
    """The last subscription of ``stream_id`` on ``channel``'s endpoint went away."""

    TYPE_ID: ClassVar[int] = 0x1F23
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<i")
    stream_id: int
    channel: str


@dataclass(frozen=True)
class OnImageSubscribers(Message):
    """The sub-pos counters of an image's subscribers (comma-separated ids), after a change."""

    TYPE_ID: ClassVar[int] = 0x1F24
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<q")
    image_id: int
    counter_ids: str


@dataclass(frozen=True)
class OnDestination(Message):
    """Add (added=1) or remove (0) a destination of a network publication."""

    TYPE_ID: ClassVar[int] = 0x1F25
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    registration_id: int
    added: int
    destination: str


MESSAGES: dict[int, type[Message]] = {
    cls.TYPE_ID: cls
    for cls in (AddPublication, RemovePublication, AddExclusivePublication, AddSubscription,
                RemoveSubscription, ClientKeepalive, AddDestination, RemoveDestination,
                AddCounter, RemoveCounter, ClientClose,
                OnError, OnAvailableImage, OnPublicationReady, OnOperationSuccess,
                OnUnavailableImage, OnExclusivePublicationReady, OnSubscriptionReady,
                OnCounterReady, OnUnavailableCounter, OnClientTimeout,
                ClientConnect, AddLinkedCounter, FreeCounter,
                RegisterBridge, CreateImage, CloseImage, ReceiveChannelStatus, ReportError,
                OnClientReady, OnImageReady, OnNetworkPublication, OnNetworkPublicationClosed,
                OnReceiveChannel, OnReceiveChannelClosed, OnImageSubscribers, OnDestination)
}

#: The responses Aeron's clients know: the driver sends these on cnc.dat's to-clients buffer
AERON_RESPONSES = frozenset(
    cls.TYPE_ID for cls in (OnError, OnAvailableImage, OnPublicationReady, OnOperationSuccess,
                            OnUnavailableImage, OnExclusivePublicationReady,
                            OnSubscriptionReady, OnCounterReady, OnUnavailableCounter,
                            OnClientTimeout))


#: The responses that name a log file (relative to the bus directory)
LOG_FILE_MESSAGES = (OnPublicationReady, OnAvailableImage)


def decode(type_id: int, data: bytes | memoryview) -> Message:
    """Decode a message of ``type_id``; MalformedMessage for unknown types or bad bytes."""
    cls = MESSAGES.get(type_id)
    if cls is None:
        raise UnknownMessageType(f"unknown message type 0x{type_id:x}")
    return cls.decode(data)
