"""netbridge: carries shmbus streams over UDP with Aeron's wire protocol.

:mod:`netbridge.frames` is the sans-IO wire codec (frame dataclasses, ``decode_frames``,
``encode_datagram``, ``MalformedFrame``); its main names are re-exported here.
"""

from netbridge.frames import (
    DataHeader,
    ErrorFrame,
    Frame,
    MalformedFrame,
    Nak,
    RttMeasurement,
    SetupFrame,
    StatusMessage,
    UnknownFrame,
    decode_frames,
    encode_datagram,
)

__all__ = [
    "DataHeader",
    "ErrorFrame",
    "Frame",
    "MalformedFrame",
    "Nak",
    "RttMeasurement",
    "SetupFrame",
    "StatusMessage",
    "UnknownFrame",
    "decode_frames",
    "encode_datagram",
]
