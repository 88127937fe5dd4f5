"""A sender and a receiver joined by a simulated network (no sockets, a fake clock).

Messages published to the sender's log must come out of the receiver's image log, read and
reassembled as a subscriber would, exactly once, in order and intact, whatever the link does:
loss, duplication and reordering in both directions (seeded, so every failure replays). Both
logs are in memory (tests/support/fake_log_port.py).
"""

from __future__ import annotations

import heapq
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from netbridge.frames import HDR_TYPE_PAD, SetupFrame, StatusMessage, decode_frames
from netbridge.receiver import NetworkReceiver
from netbridge.receiver_image import (
    EndOfStream,
    ImageAvailable,
    ImageUnavailable,
    ReceiverEvent,
)
from netbridge.sender import NetworkSender
from tests.support.fake_log_port import FakeImageHost
from tests.support.sans_io import INITIAL, SESSION, STREAM, TERM, publication_log

MS = 1_000_000
US = 1_000


@dataclass
class LossyLink:
    """One direction of the network: each datagram is dropped with probability ``loss`` (or
    when ``drop_if`` says so), duplicated with probability ``duplicate``, and arrives after
    ``delay_ns``, or, with probability ``reorder``, up to ``jitter_ns`` later (so datagrams
    sent after it overtake it). Datagrams are copied when sent, as a socket would."""

    rng: random.Random
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay_ns: int = 50 * US
    jitter_ns: int = 2 * MS
    drop_if: Callable[[bytes], bool] | None = None
    queue: list[tuple[int, int, bytes]] = field(default_factory=list)
    sent: int = 0
    dropped: int = 0
    _sequence: int = 0

    def send(self, now: int, datagram: bytes | memoryview) -> None:
        data = bytes(datagram)
        self.sent += 1
        if (self.drop_if is not None and self.drop_if(data)) or self.rng.random() < self.loss:
            self.dropped += 1
            return
        copies = 2 if self.rng.random() < self.duplicate else 1
        for _ in range(copies):
            at = now + self.delay_ns
            if self.rng.random() < self.reorder:
                at += self.rng.randrange(self.jitter_ns)
            self._sequence += 1
            heapq.heappush(self.queue, (at, self._sequence, data))

    def due(self, now: int) -> list[bytes]:
        out = []
        while self.queue and self.queue[0][0] <= now:
            out.append(heapq.heappop(self.queue)[2])
        return out

    def next_time(self) -> int | None:
        return self.queue[0][0] if self.queue else None


def make_messages(rng: random.Random, count: int) -> list[bytes]:
    """Messages of mixed sizes (a few fragmented), each (sequence, crc32 of the body) + body."""
    messages = []
    for sequence in range(count):
        roll = rng.random()
        if roll < 0.7:
            size = rng.randrange(0, 200)
        elif roll < 0.95:
            size = rng.randrange(200, 1400)
        else:
            size = rng.randrange(1400, 5000)  # fragmented: mtu 1408 carries 1376 per frame
        body = rng.randbytes(size)
        messages.append(struct.pack("<II", sequence, zlib.crc32(body)) + body)
    return messages


@dataclass
class Loopback:
    """A publication, a sender, a receiver with one subscriber, and two links, run in steps."""

    forward: LossyLink
    backward: LossyLink
    receiver_window: int | None = None
    initial_term_id: int = INITIAL

    def __post_init__(self) -> None:
        self.pub = publication_log(initial_term_id=self.initial_term_id)
        self.host = FakeImageHost(receiver_window=self.receiver_window)
        self.sender = NetworkSender(self.pub, destination="receiver")
        self.receiver = NetworkReceiver(self.host, receiver_id=0xABCDEF)
        self.receiver.add_subscription(STREAM)
        self.received: list[bytes] = []
        self.events: list[ReceiverEvent] = []
        self.now = 0

    def read(self) -> None:
        """The subscriber reads what it can."""
        image = self.host.logs.get((SESSION, STREAM))
        if image is not None:
            self.received += image.messages()

    def step(self, pending: list[bytes]) -> int:
        """One round at ``self.now``; offers from ``pending`` (consumed in place). Returns the
        time of the next round."""
        now = self.now
        for datagram in self.forward.due(now):
            self.receiver.on_datagram(now, datagram, "sender")
        for datagram in self.backward.due(now):
            self.sender.on_datagram(now, datagram, "receiver")
        self.read()
        self.pub.follow(self.sender.sender_position)
        while pending and self.pub.offer(pending[0]) > 0:
            pending.pop(0)
        before = self.sender.sender_position
        out, sender_deadline = self.sender.poll(now)
        for datagram, destination in out:
            assert destination == "receiver"
            self.forward.send(now, datagram)
        result = self.receiver.poll(now)
        self.events.extend(result.events)
        for datagram, destination in result.datagrams:
            assert destination == "sender"
            self.backward.send(now, datagram)
        if self.sender.sender_position != before and pending:
            return now  # the publication limit moved: offer more at once
        times = [sender_deadline, self.forward.next_time(), self.backward.next_time(),
                 result.next_deadline_ns]
        return max(now, min(t for t in times if t is not None))

    def run(self, messages: list[bytes], *, until_ns: int) -> None:
        """Publish every message, close the publication, and run until the receiver reports
        the end of stream and everything was read."""
        pending = list(messages)
        rounds = 0
        while True:
            if not pending and not self.sender.closed:
                self.sender.close()
            next_time = self.step(pending)
            done = any(isinstance(e, EndOfStream) for e in self.events)
            if done and len(self.received) >= len(messages):
                self.read()
                return
            assert next_time < until_ns, (
                f"stuck at {self.now} ns: {len(self.received)}/{len(messages)} received, "
                f"snd-pos {self.sender.sender_position}, snd-lmt {self.sender.sender_limit}, "
                f"images {list(self.receiver.images.values())}"
            )
            rounds += 1
            assert rounds < 500_000
            self.now = next_time if next_time > self.now else self.now + (
                1 if next_time == self.now and self.sender.sender_position else 0)
            if next_time == self.now and rounds % 1000 == 0:
                self.now += US  # never spin at one instant


def check_delivery(received: list[bytes], messages: list[bytes]) -> None:
    assert len(received) == len(messages)
    for sequence, (got, sent) in enumerate(zip(received, messages, strict=True)):
        number, crc = struct.unpack_from("<II", got)
        assert number == sequence, f"message {sequence} arrived as {number}"
        assert zlib.crc32(got[8:]) == crc, f"message {sequence} is corrupt"
        assert got == sent


# --- end to end ------------------------------------------------------------------------------


def test_handshake_then_data_then_end_of_stream_on_a_perfect_link() -> None:
    def body() -> None:
        rng = random.Random(1)
        loop = Loopback(LossyLink(rng), LossyLink(rng))
        first, _ = loop.sender.poll(0)
        (setup,) = [f for d, _ in first for f in decode_frames(bytes(d))]
        assert isinstance(setup, SetupFrame)
        loop.receiver.on_datagram(50 * US, bytes(first[0][0]), "sender")
        result = loop.receiver.poll(50 * US)
        assert [type(e) for e in result.events] == [ImageAvailable]
        (sm,) = [f for d, _ in result.datagrams for f in decode_frames(d)]
        assert isinstance(sm, StatusMessage) and sm.receiver_window == TERM // 2
        loop.sender.on_datagram(100 * US, result.datagrams[0][0], "receiver")
        assert loop.sender.is_connected and loop.sender.sender_limit == TERM // 2
        loop.now = 100 * US
        messages = make_messages(rng, 300)
        loop.run(messages, until_ns=5_000 * MS)
        check_delivery(loop.received, messages)
        assert loop.sender.retransmits == 0 and loop.receiver.naks_sent == 0
        image = loop.receiver.images[(SESSION, STREAM)]
        assert image.rcv_pos == image.rcv_hwm == loop.sender.sender_position
        assert loop.host.image(SESSION, STREAM).is_end_of_stream

    body()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**32 - 1),
    loss=st.sampled_from([0.0, 0.05, 0.2]),
    duplicate=st.sampled_from([0.0, 0.05, 0.2]),
    reorder=st.sampled_from([0.0, 0.1, 0.3]),
)
@example(seed=7, loss=0.05, duplicate=0.05, reorder=0.1)
@example(seed=8, loss=0.2, duplicate=0.2, reorder=0.3)
def test_every_message_arrives_once_in_order_over_a_lossy_link(
    seed: int, loss: float, duplicate: float, reorder: float
) -> None:
    def body() -> None:
        rng = random.Random(seed)
        forward = LossyLink(rng, loss=loss, duplicate=duplicate, reorder=reorder)
        backward = LossyLink(rng, loss=loss, duplicate=duplicate, reorder=reorder)
        loop = Loopback(forward, backward)
        messages = make_messages(rng, 3000)  # about 23 terms: every partition, term ids wrap
        loop.run(messages, until_ns=60_000 * MS)
        check_delivery(loop.received, messages)
        image = loop.receiver.images[(SESSION, STREAM)]
        assert image.rcv_pos == image.rcv_hwm == loop.sender.sender_position
        assert loop.sender.sender_position > 12 * TERM
        if forward.dropped:
            assert loop.receiver.naks_sent > 0 and loop.sender.retransmits > 0
            assert loop.receiver.gaps_detected > 0
        if duplicate:
            assert image.duplicates > 0
        assert loop.receiver.invalid_datagrams == 0

    body()


def test_a_lost_pad_is_recovered_when_its_padding_exceeds_the_window() -> None:
    """The sender sends a PAD header when 32 bytes fit the window, then its position jumps past
    the padding; if the PAD is lost, the receiver must still learn of the gap (from a heartbeat
    past the window) and get it back."""

    def body() -> None:
        rng = random.Random(3)
        dropped: list[bytes] = []

        def drop_first_pad(datagram: bytes) -> bool:
            frames = list(decode_frames(datagram))
            if not dropped and frames[-1].type == HDR_TYPE_PAD and frames[-1].frame_length > 4096:
                dropped.append(datagram)
                return True
            return False

        loop = Loopback(LossyLink(rng, drop_if=drop_first_pad), LossyLink(rng),
                        receiver_window=4096)
        # 4900-byte bodies take 5056 bytes of log: twelve fill a term but for 4864 bytes
        messages = [struct.pack("<II", i, zlib.crc32(b"\x55" * 4900)) + b"\x55" * 4900
                    for i in range(40)]
        loop.run(messages, until_ns=10_000 * MS)
        assert dropped, "the scenario needs a PAD longer than the window"
        check_delivery(loop.received, messages)
        assert loop.sender.retransmits >= 1

    body()


def test_receiver_reports_the_image_unavailable_when_the_sender_goes_silent() -> None:
    def body() -> None:
        rng = random.Random(4)
        loop = Loopback(LossyLink(rng), LossyLink(rng))
        pending = make_messages(rng, 50)
        while pending or loop.host.logs.get((SESSION, STREAM)) is None:
            loop.now = max(loop.now + 1, loop.step(pending))
        # the sender process dies: only the receiver is polled from now on
        heard = loop.receiver.images[(SESSION, STREAM)].last_heard_ns
        gone: list[ImageUnavailable] = []
        at = loop.now
        while not gone and at < heard + 12_000 * MS:
            result = loop.receiver.poll(at)
            gone = [e for e in result.events if isinstance(e, ImageUnavailable)]
            if not gone:
                assert result.next_deadline_ns is not None
                at = result.next_deadline_ns
        assert gone and gone[0].reason == "timeout"
        assert at == heard + 10_000 * MS + 1  # woken by the liveness deadline itself

    body()
