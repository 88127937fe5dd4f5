"""The netbridge's sans-IO state machines (netbridge/sender.py, netbridge/receiver.py) in a
test: one stream's geometry, and the frames either side gets, made by hand. Term ids start
just below the int32 wrap, so every stream crosses it."""

from __future__ import annotations

from typing import Any

from netbridge.frames import SetupFrame, StatusMessage, data_frame, encode_datagram, heartbeat
from netbridge.receiver import NetworkReceiver
from netbridge.sender import NetworkSender
from tests.support.fake_log_port import FakePublicationLog

TERM = 64 * 1024
INITIAL = 0x7FFF_FFFE  # term ids wrap to negative after two terms
SESSION = 0x1234
STREAM = 1001
MTU = 1408
#: where a sender sends its stream (and, here, where its status messages come from)
DEST = ("10.0.0.2", 40123)
CONTROL = ("10.0.0.2", 40123)
#: where a receiver's stream comes from
SENDER = ("10.0.0.1", 50000)
RECEIVER_ID = 0x5EED


def term_id_at(position: int, initial: int = INITIAL, term_length: int = TERM) -> int:
    """The term id of stream position ``position`` (wrapping as an int32)."""
    return ((initial + position // term_length + 2**31) % 2**32) - 2**31


# -- the sender's side ---------------------------------------------------------------------------


def publication_log(*, initial_term_id: int = INITIAL) -> FakePublicationLog:
    """An in-memory publication log of the stream."""
    return FakePublicationLog(term_length=TERM, initial_term_id=initial_term_id,
                              session_id=SESSION, stream_id=STREAM, mtu=MTU)


def sm(position: int, window: int = 32 * 1024, *, flags: int = 0,
       session_id: int = SESSION, receiver_id: int = 77) -> bytes:
    """A receiver's status message: consumed up to ``position``, ``window`` bytes more."""
    return StatusMessage(
        flags=flags, session_id=session_id, stream_id=STREAM,
        consumption_term_id=term_id_at(position), consumption_term_offset=position % TERM,
        receiver_window=window, receiver_id=receiver_id,
    ).encode()


def connect(sender: NetworkSender, now: int = 0, window: int = 32 * 1024) -> None:
    """Run the handshake: the first poll sends SETUP, a status message ends the setup phase."""
    sender.poll(now)
    sender.on_datagram(now, sm(sender.sender_position, window), CONTROL)


# -- the receiver's side -------------------------------------------------------------------------


def setup(position: int = 0, *, session_id: int = SESSION, stream_id: int = STREAM,
          term_length: int = TERM, mtu: int = MTU) -> bytes:
    """A sender's SETUP frame for a stream at ``position``."""
    return SetupFrame(
        term_offset=position % term_length, session_id=session_id, stream_id=stream_id,
        initial_term_id=INITIAL, active_term_id=term_id_at(position), term_length=term_length,
        mtu=mtu,
    ).encode()


def data(position: int, *payloads: bytes, session_id: int = SESSION) -> bytes:
    """A datagram of DATA frames, one per payload, from ``position`` on, as a sender packs."""
    frames = []
    for payload in payloads:
        frames.append(data_frame(term_offset=position % TERM, session_id=session_id,
                                 stream_id=STREAM, term_id=term_id_at(position),
                                 payload=payload))
        position += (32 + len(payload) + 31) & ~31
    return encode_datagram(frames)


def beat(position: int, *, eos: bool = False, session_id: int = SESSION) -> bytes:
    """A heartbeat at ``position`` (with the end-of-stream flag: ``eos``)."""
    return heartbeat(term_offset=position % TERM, session_id=session_id, stream_id=STREAM,
                     term_id=term_id_at(position), end_of_stream=eos).encode()


def payload(i: int, size: int = 96) -> bytes:
    """``size`` bytes of ``i``; the default makes a 128-byte frame."""
    return bytes([i % 256]) * size


def make_receiver(host: Any, **kwargs: Any) -> NetworkReceiver:
    """A receiver subscribed to the stream, making its images with ``host``."""
    receiver = NetworkReceiver(host, receiver_id=RECEIVER_ID, **kwargs)
    receiver.add_subscription(STREAM)
    return receiver
