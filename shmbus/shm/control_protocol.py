"""Messages between clients and the driver: commands on the to-driver ring buffer, responses
and events on the to-clients broadcast buffer (docs/protocol.md, Control protocol). Pure
encode/decode, no I/O; the client, the driver and the netbridge all import it.

Each message is a fixed little-endian part followed by zero or more UTF-8 strings, each
prefixed by its length (i32). Type ids follow Aeron's ControlProtocolEvents where one exists.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass, fields
from typing import ClassVar


class MalformedMessage(ValueError):
    """A command or response whose bytes do not decode."""


# Aeron's error codes for ON_ERROR
GENERIC_ERROR = 0
INVALID_CHANNEL = 1
UNKNOWN_SUBSCRIPTION = 2
UNKNOWN_PUBLICATION = 3
CHANNEL_ENDPOINT_ERROR = 4
UNKNOWN_COMMAND_TYPE_ID = 6
MALFORMED_COMMAND = 7
STORAGE_SPACE = 11

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
        fixed_count = len(values) - self._string_count()
        try:
            out = [self.FORMAT.pack(*values[:fixed_count])]
        except struct.error:
            self._check_fixed_fields(values[:fixed_count])
            raise
        for text in values[fixed_count:]:
            data = text.encode()
            out.append(struct.pack("<i", len(data)))
            out.append(data)
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
    def _string_count(cls) -> int:
        return sum(1 for f in fields(cls) if f.type == "str")

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Message:
        data = bytes(data)
        try:
            values = list(cls.FORMAT.unpack_from(data, 0))
            offset = cls.FORMAT.size
            for _ in range(cls._string_count()):
                (length,) = struct.unpack_from("<i", data, offset)
                offset += 4
                if length < 0 or offset + length > len(data):
                    raise MalformedMessage(f"{cls.__name__}: string length {length} overruns")
                values.append(data[offset:offset + length].decode())
                offset += length
        except (struct.error, UnicodeDecodeError) as e:
            raise MalformedMessage(f"{cls.__name__}: {e}") from None
        return cls(*values)


# -- commands (client -> driver) ----------------------------------------------------------

@dataclass(frozen=True)
class Command(Message):
    """Base of every command: each starts with the id of the client that sent it and the
    correlation id of its answer."""

    client_id: int
    correlation_id: int


@dataclass(frozen=True)
class ClientConnect(Command):
    """A new client introduces itself; the driver answers ClientReady."""

    TYPE_ID: ClassVar[int] = 0x10
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    pid: int
    name: str


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
class AddSubscription(AddPublication):
    TYPE_ID: ClassVar[int] = 0x04


@dataclass(frozen=True)
class RemovePublication(Command):
    TYPE_ID: ClassVar[int] = 0x02
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    registration_id: int


@dataclass(frozen=True)
class RemoveSubscription(RemovePublication):
    TYPE_ID: ClassVar[int] = 0x05


@dataclass(frozen=True)
class ClientClose(Command):
    TYPE_ID: ClassVar[int] = 0x0A
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qq")
    client_id: int
    correlation_id: int


# -- responses and events (driver -> clients) ---------------------------------------------

@dataclass(frozen=True)
class OnError(Message):
    TYPE_ID: ClassVar[int] = 0x0F01
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    correlation_id: int
    code: int
    message: str


@dataclass(frozen=True)
class OnAvailableImage(Message):
    """A publication's session is now readable by a subscription."""

    TYPE_ID: ClassVar[int] = 0x0F02
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqiiiq")
    correlation_id: int              # the image's id (the driver's link id)
    subscription_registration_id: int
    session_id: int
    stream_id: int
    position_counter_id: int         # sub-pos: the subscriber writes it
    join_position: int
    log_file: str
    source_identity: str


@dataclass(frozen=True)
class OnPublicationReady(Message):
    TYPE_ID: ClassVar[int] = 0x0F03
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqiii")
    correlation_id: int
    registration_id: int
    session_id: int
    stream_id: int
    limit_counter_id: int            # pub-lmt: the driver writes it
    log_file: str


@dataclass(frozen=True)
class OnOperationSuccess(Message):
    TYPE_ID: ClassVar[int] = 0x0F04
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<q")
    correlation_id: int


@dataclass(frozen=True)
class OnUnavailableImage(Message):
    TYPE_ID: ClassVar[int] = 0x0F05
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqii")
    correlation_id: int
    subscription_registration_id: int
    stream_id: int
    session_id: int


@dataclass(frozen=True)
class OnExclusivePublicationReady(OnPublicationReady):
    TYPE_ID: ClassVar[int] = 0x0F06


@dataclass(frozen=True)
class OnSubscriptionReady(Message):
    TYPE_ID: ClassVar[int] = 0x0F07
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<q")
    correlation_id: int


@dataclass(frozen=True)
class OnClientTimeout(Message):
    TYPE_ID: ClassVar[int] = 0x0F0A
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<q")
    client_id: int


@dataclass(frozen=True)
class OnClientReady(Message):
    TYPE_ID: ClassVar[int] = 0x0F10
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    correlation_id: int
    heartbeat_counter_id: int


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


# -- the netbridge's commands (a client with extra rights) --------------------------------

@dataclass(frozen=True)
class RegisterBridge(ClientClose):
    """The client is the netbridge: it gets network publications and receive channels."""

    TYPE_ID: ClassVar[int] = 0x20


@dataclass(frozen=True)
class AddCounter(Command):
    """Allocate a counter owned by the client (freed by RemoveCounter or when the client goes
    away); answered by OnCounterReady. ``registration_id`` and ``reference_id`` go into the
    counter (a registration id of 0: the correlation id), so that a counter about a stream can
    name its log as the driver's own stream counters do."""

    TYPE_ID: ClassVar[int] = 0x0C
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqiqq")
    client_id: int
    correlation_id: int
    type_id: int
    registration_id: int
    reference_id: int
    label: str


@dataclass(frozen=True)
class RemoveCounter(Command):
    """Free a counter the client allocated; answered by OnOperationSuccess."""

    TYPE_ID: ClassVar[int] = 0x0D
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqi")
    client_id: int
    correlation_id: int
    counter_id: int


@dataclass(frozen=True)
class CreateImage(Command):
    """A SETUP arrived: make an image log; answered by OnImageReady."""

    TYPE_ID: ClassVar[int] = 0x21
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
class ReceiveChannelStatus(Command):
    """The netbridge's answer to an OnReceiveChannel: it listens for ``stream_id`` on
    ``channel``'s endpoint (``error`` empty), or it could not (``error`` says why, naming the
    address and, where it can, the process that holds it). ``subscription_id`` is the
    OnReceiveChannel's: the subscription waiting for this answer, or 0. Answered by
    OnOperationSuccess."""

    TYPE_ID: ClassVar[int] = 0x23
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

    TYPE_ID: ClassVar[int] = 0x24
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qq")
    client_id: int
    correlation_id: int
    error: str


@dataclass(frozen=True)
class CloseImage(Command):
    """The image ended (end of stream or liveness timeout)."""

    TYPE_ID: ClassVar[int] = 0x22
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqq")
    client_id: int
    correlation_id: int
    image_id: int


# -- events for the netbridge --------------------------------------------------------------

@dataclass(frozen=True)
class OnCounterReady(Message):
    TYPE_ID: ClassVar[int] = 0x0F08
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    correlation_id: int
    counter_id: int


@dataclass(frozen=True)
class OnImageReady(Message):
    TYPE_ID: ClassVar[int] = 0x0F11
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qqii")
    correlation_id: int
    image_id: int
    rcv_hwm_counter_id: int
    rcv_pos_counter_id: int
    log_file: str


@dataclass(frozen=True)
class OnNetworkPublication(Message):
    """A publication on a udp channel: the netbridge sends it."""

    TYPE_ID: ClassVar[int] = 0x0F20
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
    TYPE_ID: ClassVar[int] = 0x0F21
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qq")
    registration_id: int
    end_position: int


@dataclass(frozen=True)
class OnReceiveChannel(Message):
    """A subscription on a udp channel: the netbridge listens for its stream on the channel's
    endpoint and answers with ReceiveChannelStatus when it could not, or when
    ``subscription_id`` (the subscription waiting for the answer) is not 0."""

    TYPE_ID: ClassVar[int] = 0x0F22
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    subscription_id: int
    stream_id: int
    channel: str


@dataclass(frozen=True)
class OnReceiveChannelClosed(Message):
    """The last subscription of ``stream_id`` on ``channel``'s endpoint went away."""

    TYPE_ID: ClassVar[int] = 0x0F23
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<i")
    stream_id: int
    channel: str


@dataclass(frozen=True)
class OnDestination(Message):
    """Add (added=1) or remove (0) a destination of a network publication."""

    TYPE_ID: ClassVar[int] = 0x0F25
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<qi")
    registration_id: int
    added: int
    destination: str


@dataclass(frozen=True)
class OnImageSubscribers(Message):
    """The sub-pos counters of an image's subscribers (comma-separated ids), after a change."""

    TYPE_ID: ClassVar[int] = 0x0F24
    FORMAT: ClassVar[struct.Struct] = struct.Struct("<q")
    image_id: int
    counter_ids: str


MESSAGES: dict[int, type[Message]] = {
    cls.TYPE_ID: cls
    for cls in (ClientConnect, AddPublication, AddExclusivePublication, AddSubscription,
                RemovePublication, RemoveSubscription, ClientClose, OnError,
                OnAvailableImage, OnPublicationReady, OnOperationSuccess, OnUnavailableImage,
                OnExclusivePublicationReady, OnSubscriptionReady, OnClientTimeout, OnClientReady,
                RegisterBridge, AddCounter, RemoveCounter, CreateImage, CloseImage,
                ReceiveChannelStatus, ReportError,
                OnCounterReady, OnImageReady,
                OnNetworkPublication, OnNetworkPublicationClosed, OnReceiveChannel,
                OnReceiveChannelClosed, OnImageSubscribers, AddDestination, RemoveDestination,
                OnDestination)
}


def decode(type_id: int, data: bytes | memoryview) -> Message:
    """Decode a message of ``type_id``; MalformedMessage for unknown types or bad bytes."""
    cls = MESSAGES.get(type_id)
    if cls is None:
        raise MalformedMessage(f"unknown message type 0x{type_id:x}")
    return cls.decode(data)
