"""A stranger on the network: plain UDP sockets that speak just enough of Aeron's wire
protocol (netbridge/frames.py) to talk to a netbridge.

No bus, no driver. :class:`ForgedPeer` sends: a hand-made SETUP until the netbridge answers
with a status message (its image is made), then DATA frames, one whole message each, one after
another in the term, or a message in fragments with one held back (the netbridge NAKs it; the
peer sends it when told). :class:`ForgedReceiver` receives: it answers a publication's SETUP with a
status message, so the publication connects, and keeps the messages of its DATA frames. Every
wait is bounded.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from netbridge.frames import (
    DATA_FLAG_BEGIN,
    DATA_FLAG_END,
    DataHeader,
    Frame,
    MalformedFrame,
    SetupFrame,
    StatusMessage,
    align,
    data_frame,
    decode_frames,
    encode_datagram,
)

TERM_LENGTH = 1 << 16
MTU = 1408
#: how often the SETUP is sent again while no status message has come back
_SETUP_EVERY_S = 0.1


def received_datagrams(sock: socket.socket, seconds: float,
                       until: Callable[[], bool] = lambda: False,
                       ) -> Iterator[tuple[list[Frame], Any]]:
    """(frames, source address) of each well-formed datagram ``sock`` receives for up to
    ``seconds``, looking at ``until()`` before each wait and ending once it is true; a
    malformed datagram is passed over."""
    deadline = time.monotonic() + seconds
    while not until() and (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            datagram, source = sock.recvfrom(65536)
        except TimeoutError:
            return
        try:
            frames = list(decode_frames(datagram))
        except MalformedFrame:
            continue
        yield frames, source


@dataclass
class ForgedPeer:
    """One forged publication (session ``session_id`` on ``stream_id``) sending from ``sock``
    to a netbridge's ``endpoint`` (host, port)."""

    sock: socket.socket
    endpoint: tuple[str, int]
    stream_id: int
    session_id: int = 0x5EED
    term_offset: int = 0
    status_messages: list[StatusMessage] = field(default_factory=list)

    @property
    def source_identity(self) -> str:
        """What the netbridge names this peer as: the socket's ``host:port``."""
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def setup(self, timeout: float = 20.0) -> None:
        """Send SETUP until a status message for this session comes back (the netbridge made
        the image); AssertionError after ``timeout`` seconds."""
        frame = SetupFrame(term_offset=self.term_offset, session_id=self.session_id,
                           stream_id=self.stream_id, initial_term_id=0, active_term_id=0,
                           term_length=TERM_LENGTH, mtu=MTU)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.sendto(encode_datagram([frame]), self.endpoint)
            if self.receive(_SETUP_EVERY_S):
                return
        raise AssertionError(f"no status message from {self.endpoint} within {timeout} s")

    def receive(self, seconds: float, wanted: type = StatusMessage) -> bool:
        """Read what the netbridge sends back for up to ``seconds``; True once a frame of type
        ``wanted`` (a status message, a NAK) for this session came."""
        for frames, _ in received_datagrams(self.sock, seconds):
            for frame in frames:
                if isinstance(frame, StatusMessage) and frame.session_id == self.session_id:
                    self.status_messages.append(frame)
                if isinstance(frame, wanted) and getattr(frame, "session_id", None) == \
                        self.session_id:
                    return True
        return False

    def send(self, message: bytes, flags: int = DATA_FLAG_BEGIN | DATA_FLAG_END) -> None:
        """Send ``message`` as one whole DATA frame (``flags``: B and E, and any others) at the
        next offset of the term."""
        frame = data_frame(term_offset=self.term_offset, session_id=self.session_id,
                           stream_id=self.stream_id, term_id=0, payload=message, flags=flags)
        assert frame.frame_length <= MTU, f"a message of {len(message)} bytes is past the MTU"
        self.sock.sendto(encode_datagram([frame]), self.endpoint)
        self.term_offset += align(frame.frame_length)

    def send_fragmented(self, message: bytes, held_back: int) -> bytes:
        """Send ``message`` in MTU-sized fragments at the next offsets of the term, but for
        fragment ``held_back`` (a gap the netbridge NAKs); returns that fragment's datagram,
        for :meth:`resend`."""
        most = MTU - 32
        pieces = [message[at:at + most] for at in range(0, len(message), most)]
        assert 0 <= held_back < len(pieces) > 1, "a message of several fragments"
        held = b""
        for index, piece in enumerate(pieces):
            flags = ((DATA_FLAG_BEGIN if index == 0 else 0)
                     | (DATA_FLAG_END if index == len(pieces) - 1 else 0))
            frame = data_frame(term_offset=self.term_offset, session_id=self.session_id,
                               stream_id=self.stream_id, term_id=0, payload=piece,
                               flags=flags)
            datagram = encode_datagram([frame])
            if index == held_back:
                held = datagram
            else:
                self.sock.sendto(datagram, self.endpoint)
            self.term_offset += align(frame.frame_length)
        return held

    def resend(self, datagram: bytes) -> None:
        """Send a datagram :meth:`send_fragmented` held back."""
        self.sock.sendto(datagram, self.endpoint)


@dataclass
class ForgedReceiver:
    """A plain socket at an endpoint a publication sends to: it answers each SETUP with a
    status message (window ``window``) and keeps the payload of each whole DATA frame."""

    sock: socket.socket
    window: int = 1 << 16
    messages: list[bytes] = field(default_factory=list)
    setups: int = 0

    def receive(self, seconds: float, count: int = 1) -> list[bytes]:
        """Serve for up to ``seconds``, until ``count`` messages came; the messages so far."""
        for frames, source in received_datagrams(self.sock, seconds,
                                                 until=lambda: len(self.messages) >= count):
            for frame in frames:
                if isinstance(frame, SetupFrame):
                    self.setups += 1
                    status = StatusMessage(
                        session_id=frame.session_id, stream_id=frame.stream_id,
                        consumption_term_id=frame.active_term_id,
                        consumption_term_offset=frame.term_offset,
                        receiver_window=self.window, receiver_id=0x7E57)
                    self.sock.sendto(encode_datagram([status]), source)
                elif (isinstance(frame, DataHeader) and not frame.is_padding
                      and not frame.is_heartbeat and frame.is_begin and frame.is_end):
                    self.messages.append(bytes(frame.payload))
        return self.messages


def udp_socket(host: str = "127.0.0.1") -> socket.socket:
    """A UDP socket bound to a free port of ``host``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    return sock
