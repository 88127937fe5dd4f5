"""What Wireshark's Aeron dissector shows of a datagram (tshark's field names), worked out from
the netbridge's own decoding of it: the columns a test asks tshark for, and the values it must
print for each."""

from __future__ import annotations

from dataclasses import dataclass

from netbridge import frames as F
from netbridge.frames import DataHeader
from tests.support.pcap import UdpDatagram


@dataclass(frozen=True)
class Decoded:
    """A captured datagram and the frames the codec decodes from it."""

    datagram: UdpDatagram
    frames: list[F.Frame]


_HEADER = ("frame_length", "version", "flags", "type")
_DATA = (*_HEADER, "term_offset", "session_id", "stream_id", "term_id")
TSHARK_FIELDS: dict[str, tuple[str, ...]] = {
    "data": (*_DATA, "reserved_value"),
    "pad": _DATA,  # the dissector shows no reserved value for PAD
    "heartbeat": _DATA,
    "setup": (
        *_HEADER,
        "term_offset",
        "session_id",
        "stream_id",
        "initial_term_id",
        "active_term_id",
        "term_length",
        "mtu",
        "ttl",
    ),
    "sm": (
        *_HEADER,
        "session_id",
        "stream_id",
        "consumption_term_id",
        "consumption_term_offset",
        "receiver_window",
        "receiver_id",
    ),
    "nak": (*_HEADER, "session_id", "stream_id", "term_id", "term_offset", "length"),
    "rtt": (
        *_HEADER,
        "session_id",
        "stream_id",
        "echo_timestamp",
        "reception_delta",
        "receiver_id",
    ),
}
INT64_FIELDS = {"reserved_value", "receiver_id", "echo_timestamp", "reception_delta"}
COLUMNS = [f"aeron.{kind}.{name}" for kind, names in TSHARK_FIELDS.items() for name in names]
EXTRA_COLUMNS = ["udp.length", "aeron.err.type"]


def dissector_kind(frame: F.Frame) -> str:
    """The name Wireshark's dissector files a frame under."""
    if isinstance(frame, DataHeader):
        if frame.is_padding:
            return "pad"
        # Wireshark calls a frame_length-0 DATA frame a heartbeat only without the EOS flag.
        return "heartbeat" if frame.is_heartbeat and not frame.is_end_of_stream else "data"
    return {
        "SetupFrame": "setup",
        "StatusMessage": "sm",
        "Nak": "nak",
        "RttMeasurement": "rtt",
    }[type(frame).__name__]


def expected_columns(item: Decoded) -> dict[str, list[int]]:
    columns: dict[str, list[int]] = {column: [] for column in COLUMNS + EXTRA_COLUMNS}
    columns["udp.length"] = [8 + len(item.datagram.payload)]
    for frame in item.frames:
        kind = dissector_kind(frame)
        for name in TSHARK_FIELDS[kind]:
            value = getattr(frame, name)
            columns[f"aeron.{kind}.{name}"].append(
                value % (2**64 if name in INT64_FIELDS else 2**32)
            )
    return columns
