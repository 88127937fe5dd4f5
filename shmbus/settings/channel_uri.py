"""Channel URIs: ``aeron:ipc``, ``aeron:udp?endpoint=host:port|...`` and
``aeron-spy:aeron:udp?...`` (docs/protocol.md, Channels and addressing).

Parsing checks the media, every parameter name and the value of every parameter shmbus uses;
each error names the part of the URI that is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shmbus.shm.log_buffer import LogBufferError, check_mtu, check_term_length

SPY_PREFIX = "aeron-spy:"
MEDIA = ("ipc", "udp")

#: Parameters of Aeron's channel URIs that shmbus accepts.
KNOWN_PARAMS = frozenset({
    "endpoint", "interface", "control", "control-mode", "ttl", "mtu", "term-length",
    "tether", "session-id", "rcv-wnd", "fc", "gtag", "ssc", "reliable", "linger", "sparse",
    "eos", "group", "rejoin", "cc", "so-sndbuf", "so-rcvbuf", "nak-delay", "alias", "tags",
    "init-term-id", "term-id", "term-offset", "untethered-window-limit-timeout",
    "untethered-resting-timeout", "consumer-group", "join-position", "key",
})
_BOOLEAN_PARAMS = ("tether", "ssc", "reliable", "sparse", "eos", "group", "rejoin")
#: the values of ``cc`` (congestion control), the default first
CONGESTION_CONTROLS = ("static", "cubic")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
#: The integer parameters and their ranges (None: mtu and term-length have rules of their own)
_INT_RANGES: dict[str, tuple[int, int] | None] = {
    "ttl": (0, 255), "mtu": None, "term-length": None, "session-id": _INT32,
    "rcv-wnd": (1, _INT32[1]), "so-sndbuf": (0, _INT32[1]), "so-rcvbuf": (0, _INT32[1]),
    "gtag": _INT64, "init-term-id": _INT32, "term-id": _INT32, "term-offset": (0, _INT32[1]),
}


class ChannelUriError(ValueError):
    """A channel URI that cannot be parsed; the message names the bad part."""


#: Parameter of an aeron:udp channel (shmbus's own): the name of the keyring entry that seals
#: its datagrams (netbridge/sealing.py); a channel without it is Aeron's plaintext wire.
KEY = "key"
KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")

#: Parameter of an aeron:ipc subscription: where in the log it starts (shmbus's own): a stream
#: position the log still holds, or ``earliest``.
JOIN_POSITION = "join-position"

def with_join_position(channel: str, from_position: int | str) -> str:
    """``channel`` with ``join-position`` set: a stream position, or ``"start"`` (the earliest
    the log holds). ValueError names a bad value, ChannelUriError a channel naming it too."""
    if from_position == "start":
        value = "earliest"
    elif isinstance(from_position, int) and not isinstance(from_position, bool):
        value = str(from_position)
    else:
        raise ValueError(f"from_position={from_position!r} must be a stream position (int) "
                         f"or 'start'")
    if JOIN_POSITION in ChannelUri.parse(channel).params:
        raise ChannelUriError(f"channel {channel!r} names a {JOIN_POSITION} already; do not "
                              f"pass from_position too")
    uri = f"{channel}{'|' if '?' in channel else '?'}{JOIN_POSITION}={value}"
    ChannelUri.parse(uri)
    return uri


#: Parameter naming a subscription's consumer group (shmbus's own; Aeron has none).
CONSUMER_GROUP = "consumer-group"
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_group_name(name: object) -> str:
    """Return ``name`` if it can name a consumer group: 1 to 64 of A-Z a-z 0-9 _ . -

    Raises ValueError naming the bad name otherwise.
    """
    if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
        raise ValueError(f"group name {name!r} must be 1 to 64 characters of A-Z a-z 0-9 _ . -")
    return name


@dataclass(frozen=True)
class ChannelUri:
    """A parsed channel: media ('ipc' or 'udp'), parameters, and whether it is a spy."""

    media: str
    params: dict[str, str] = field(default_factory=dict)
    spy: bool = False

    @classmethod
    def parse(cls, uri: str) -> ChannelUri:
        """Parse and validate ``uri``; raise ChannelUriError naming what is wrong."""
        if not isinstance(uri, str):
            raise ChannelUriError(f"a channel URI is a string, not {type(uri).__name__}")
        control = next((i for i, ch in enumerate(uri) if ch < " " or ch == "\x7f"), None)
        if control is not None:
            raise ChannelUriError(f"channel {uri!r}: control character {uri[control]!r} at "
                                  f"index {control}")
        text = uri
        spy = text.startswith(SPY_PREFIX)
        if spy:
            text = text[len(SPY_PREFIX):]
        if not text.startswith("aeron:"):
            raise ChannelUriError(f"channel {uri!r} must start with 'aeron:' (or 'aeron-spy:')")
        rest = text[len("aeron:"):]
        media, _, query = rest.partition("?")
        if media not in MEDIA:
            raise ChannelUriError(f"channel {uri!r}: unknown media {media!r} (ipc or udp)")
        if spy and media != "udp":
            raise ChannelUriError(f"channel {uri!r}: only udp publications can be spied on")
        params: dict[str, str] = {}
        if query:
            for item in query.split("|"):
                key, sep, value = item.partition("=")
                if not sep or not key:
                    raise ChannelUriError(f"channel {uri!r}: parameter {item!r} is not key=value")
                if key not in KNOWN_PARAMS:
                    raise ChannelUriError(f"channel {uri!r}: unknown parameter {key!r}")
                if key in params:
                    raise ChannelUriError(f"channel {uri!r}: parameter {key!r} given twice")
                params[key] = value
        elif rest.endswith("?"):
            raise ChannelUriError(f"channel {uri!r}: empty parameter list after '?'")
        channel = cls(media, params, spy)
        channel._validate(uri)
        return channel

    def _validate(self, uri: str) -> None:
        for key in _BOOLEAN_PARAMS:
            if key in self.params and self.params[key] not in ("true", "false"):
                raise ChannelUriError(
                    f"channel {uri!r}: {key}={self.params[key]!r} must be true or false")
        for key, limits in _INT_RANGES.items():
            if key in self.params:
                try:
                    value = self.int_param(key)
                except ValueError:
                    raise ChannelUriError(
                        f"channel {uri!r}: {key}={self.params[key]!r} is not an integer"
                    ) from None
                if limits is not None and not limits[0] <= value <= limits[1]:
                    raise ChannelUriError(f"channel {uri!r}: {key}={self.params[key]} is "
                                          f"outside {limits[0]}..{limits[1]}")
        try:
            if "term-length" in self.params:
                check_term_length(self.int_param("term-length"))
            if "mtu" in self.params:
                check_mtu(self.int_param("mtu"),
                          self.int_param("term-length") if "term-length" in self.params
                          else 1 << 30)
        except LogBufferError as e:
            raise ChannelUriError(f"channel {uri!r}: {e}") from None
        if "cc" in self.params and self.params["cc"] not in CONGESTION_CONTROLS:
            raise ChannelUriError(f"channel {uri!r}: cc={self.params['cc']!r} is not a "
                                  f"congestion control ({' or '.join(CONGESTION_CONTROLS)})")
        if CONSUMER_GROUP in self.params:
            if self.spy:  # a spy reads a publication's own log: its group is on aeron:ipc
                raise ChannelUriError(f"channel {uri!r}: {CONSUMER_GROUP} is for aeron:ipc "
                                      f"and aeron:udp subscriptions, not spies")
            try:
                check_group_name(self.params[CONSUMER_GROUP])
            except ValueError as e:
                raise ChannelUriError(f"channel {uri!r}: {e}") from None
        if JOIN_POSITION in self.params:
            self._check_join_position(uri)
        if self.media == "udp":
            if "endpoint" not in self.params and "control" not in self.params:
                raise ChannelUriError(f"channel {uri!r}: udp needs an endpoint or a control")
            for key in ("endpoint", "control"):
                if key in self.params:
                    _check_host_port(uri, key, self.params[key])
            if "control-mode" in self.params:
                if self.params["control-mode"] not in ("manual", "dynamic"):
                    raise ChannelUriError(f"channel {uri!r}: control-mode must be manual or "
                                          f"dynamic, not {self.params['control-mode']!r}")
                if "control" not in self.params:
                    raise ChannelUriError(f"channel {uri!r}: control-mode="
                                          f"{self.params['control-mode']} needs a control "
                                          f"address (control=host:port)")
            if "endpoint" in self.params:
                group = multicast_group(self.params["endpoint"])
                if group is not None and group % 2 == 0:
                    raise ChannelUriError(
                        f"channel {uri!r}: endpoint {self.params['endpoint']} is an even "
                        f"multicast address; the data group must be odd (control uses the "
                        f"next, even one)")
            if "interface" in self.params:
                _check_host_port(uri, "interface", self.params["interface"], port_optional=True)
            if KEY in self.params and not KEY_NAME.fullmatch(self.params[KEY]):
                raise ChannelUriError(
                    f"channel {uri!r}: key={self.params[KEY]!r} is not a key name (1 to 64 of "
                    f"A-Z a-z 0-9 . _ -; the name of a keyring entry, never the secret)")
            if "fc" in self.params:
                try:
                    parse_flow_control(self.params["fc"])
                except ValueError as e:
                    raise ChannelUriError(f"channel {uri!r}: {e}") from None
        else:
            for key in ("endpoint", "interface", "control", "control-mode", "ttl", KEY):
                if key in self.params:
                    raise ChannelUriError(f"channel {uri!r}: {key} is not a parameter of ipc")

    def _check_join_position(self, uri: str) -> None:
        value = self.params[JOIN_POSITION]
        if self.media != "ipc" or self.spy:
            raise ChannelUriError(f"channel {uri!r}: {JOIN_POSITION} is for aeron:ipc "
                                  f"subscriptions only")
        if value == "earliest":
            return
        # ASCII digits only (str.isdigit takes '²', which int() refuses), and a position an
        # int64 holds (19 digits at most: int() of thousands is an error of its own)
        if (not (value.isascii() and value.isdigit()) or len(value) > 19
                or int(value) >= 2**63 or int(value) % 32):
            raise ChannelUriError(f"channel {uri!r}: {JOIN_POSITION}={value!r} must be "
                                  f"'earliest' or a stream position (a multiple of 32, "
                                  f"0 <= position < 2**63)")

    @property
    def join_position(self) -> int | str | None:
        """The ``join-position`` parameter: a position, ``'earliest'``, or None (the live
        end, as every subscriber joins by default)."""
        value = self.params.get(JOIN_POSITION)
        if value is None or value == "earliest":
            return value
        return int(value)

    def int_param(self, key: str, default: int | None = None) -> int:
        """An integer parameter, with Aeron's k/m/g suffixes; ``default`` when absent."""
        if key not in self.params:
            if default is None:
                raise KeyError(key)
            return default
        value = self.params[key].lower()
        scale = 1
        if value and value[-1] in "kmg":
            scale = {"k": 1024, "m": 1024**2, "g": 1024**3}[value[-1]]
            value = value[:-1]
        return int(value) * scale

    def bool_param(self, key: str, default: bool) -> bool:
        return self.params[key] == "true" if key in self.params else default

    @property
    def is_ipc(self) -> bool:
        return self.media == "ipc"

    @property
    def is_multicast(self) -> bool:
        return "endpoint" in self.params and multicast_group(self.params["endpoint"]) is not None

    @property
    def flow_control(self) -> str:
        """The flow-control strategy of a network publication on this channel: its ``fc``
        parameter's, else max for multicast and multi-destination-cast and unicast otherwise
        (as Aeron chooses)."""
        if "fc" in self.params:
            return parse_flow_control(self.params["fc"]).strategy
        return "max" if self.is_multicast or self.control_mode is not None else "unicast"

    @property
    def congestion_control(self) -> str:
        """The congestion control of the images of a subscription on this channel: its ``cc``
        parameter's, else ``static`` (as Aeron's default)."""
        return self.params.get("cc", CONGESTION_CONTROLS[0])

    @property
    def key(self) -> str | None:
        """The name of the key that seals the channel's datagrams, None for plaintext."""
        return self.params.get(KEY)

    @property
    def control_mode(self) -> str | None:
        """'manual' or 'dynamic' for multi-destination-cast publications, else None."""
        return self.params.get("control-mode")

    def endpoint_key(self) -> tuple[str, ...]:
        """What identifies the transport: publications and subscriptions with the same key
        (and stream id) meet. IPC has one; udp is keyed by endpoint, control and interface."""
        if self.is_ipc:
            return ("ipc",)
        return ("udp", self.params.get("endpoint", ""), self.params.get("control", ""),
                self.params.get("interface", ""))

    def canonical(self) -> str:
        """The channel as a string: what the driver labels counters with."""
        base = f"aeron:{self.media}"
        if self.params:
            base += "?" + "|".join(f"{k}={v}" for k, v in self.params.items())
        return SPY_PREFIX + base if self.spy else base


@dataclass(frozen=True)
class FlowControlSpec:
    """The ``fc`` parameter: ``max``, ``min`` or ``tagged``, with Aeron's ``g:<tag>/<n>``
    (group tag and minimum group size) and ``t:<timeout>`` (receiver timeout) options."""

    strategy: str
    group_tag: int | None = None
    group_min_size: int = 0
    receiver_timeout_ns: int | None = None


def parse_flow_control(text: str) -> FlowControlSpec:
    """Parse ``fc=...``; ValueError names the bad part (e.g. ``fc=fastest``)."""
    strategy, *options = text.split(",")
    if strategy not in ("max", "min", "tagged"):
        raise ValueError(f"fc={text!r}: unknown strategy {strategy!r} (max, min or tagged)")
    tag: int | None = None
    size = 0
    timeout: int | None = None
    for option in options:
        try:
            if option.startswith("g:"):
                tag_text, _, size_text = option[2:].partition("/")
                tag = int(tag_text) if tag_text else None
                size = int(size_text) if size_text else 0
            elif option.startswith("t:"):
                value = option[2:]
                scale = {"ms": 10**6, "us": 10**3, "ns": 1, "s": 10**9}
                unit = next((u for u in ("ms", "us", "ns", "s") if value.endswith(u)), "ns")
                timeout = int(value[: len(value) - len(unit)] if value.endswith(unit)
                              else value) * scale[unit]
            else:
                raise ValueError(option)
        except ValueError:
            raise ValueError(f"fc={text!r}: bad option {option!r} (g:<tag>/<n> or "
                             f"t:<timeout>)") from None
    if strategy == "tagged" and tag is None:
        raise ValueError(f"fc={text!r}: tagged flow control needs a group tag (g:<tag>)")
    return FlowControlSpec(strategy, tag, size, timeout)


def multicast_group(address: str) -> int | None:
    """The last octet of an IPv4 multicast host:port, or None when it is not multicast."""
    host = address.rpartition(":")[0]
    parts = host.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts) and 224 <= int(parts[0]) <= 239:
        return int(parts[3])
    return None


def _check_host_port(uri: str, key: str, value: str, port_optional: bool = False) -> None:
    host, sep, port = value.rpartition(":")
    if port_optional and not sep:
        host, sep, port = value, ":", "0"
    if not sep or not host:
        raise ChannelUriError(f"channel {uri!r}: {key}={value!r} is not host:port")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ChannelUriError(f"channel {uri!r}: {key} port {port!r} is not 0..65535")
