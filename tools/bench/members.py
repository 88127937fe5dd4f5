"""shmbus members shared by the benchmarks: connecting a publication and a subscription as a
user does, and the writer and reader of a stream over any channel (used by netbridge.py and
fanout.py). Each member function runs in a spawned member process (see harness.run_processes)
and imports only shmbus's public API.

Messages carry their sequence number at their head and their tail (harness.codec) and zeros
between, or with ``checked`` on the per-message path are harness.Checked messages: a sequence
number and a CRC-32 of every byte, both checked per message. With ``checked`` the batch reader
checks every byte too (head, tail, and zeros between); without it, head and tail only. The
writer sends for a fixed duration, then a STOP message; every reader checks every message, so
a lost, duplicated, reordered or torn message fails the run.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np

from tools.bench.harness import STOP, BenchError, Checked, Counter, codec, deadline_after

BATCH_ROWS = 1024  # rows of an offer_many array, and the poll_batch limit
FRAME_HEADER = 32  # bytes of a data frame's header: longer payloads than mtu - 32 fragment
BEGIN_FLAG, END_FLAG = 0x80, 0x40  # FragmentBatch.flags: first and last fragment of a message


def max_payload(uri: str) -> int:
    """Longest payload of one frame on channel ``uri``: its mtu (or the default) - 32."""
    import shmbus

    mtu = re.search(r"[?|]mtu=(\d+)", uri)
    return (int(mtu.group(1)) if mtu else shmbus.Context().mtu) - FRAME_HEADER


def _channel_params(uri: str) -> tuple[str, frozenset[str]]:
    base, _, query = uri.partition("?")
    return base, frozenset(query.split("|") if query else ())


def seal_drops(bus: Any, uri: str) -> dict[str, int] | None:
    """The netbridge's "dropped <kind>" channel counters of ``uri`` on ``bus`` (the counters
    ``shmbus stat`` lists), summed by kind. Only an authenticated channel has them (its
    Sealer counts the datagrams it refuses), so None means that the netbridge does not seal
    ``uri``'s datagrams."""
    want = _channel_params(uri)
    found: dict[str, int] = {}
    for counter in bus.counters.counters():
        kind, sep, channel = counter.label.partition(": ")
        if sep and kind.startswith("dropped ") and _channel_params(channel) == want:
            found[kind] = found.get(kind, 0) + counter.value
    return found or None


def connect_publication(bus: Any, uri: str, stream_id: int, deadline_ns: int,
                        destinations: tuple[str, ...] = ()) -> Any:
    """An exclusive publication on uri, with destinations added (a control-mode=manual
    channel's), once connected; BenchError if it is not connected by deadline_ns."""
    publication = bus.add_exclusive_publication(uri, stream_id)
    for destination in destinations:
        publication.add_destination(destination)
    while not publication.is_connected:
        if time.monotonic_ns() > deadline_ns:
            raise BenchError(f"publication on {uri} stream {stream_id} never connected")
        time.sleep(0.002)
    return publication


def await_image(subscription: Any, deadline_ns: int) -> Any:
    """The subscription's first image once it has one; BenchError if none by deadline_ns."""
    while not subscription.images:
        if time.monotonic_ns() > deadline_ns:
            raise BenchError(f"subscription on stream {subscription.stream_id} never got an "
                             f"image")
        time.sleep(0.002)  # the client's conductor thread adds the image
    return subscription.images[0]


def stream_writer(start: Any, context: Any, uri: str, stream_id: int, size: int,
                  duration_s: float, timeout_s: float, done: Any, batch: bool,
                  destinations: tuple[str, ...] = (), checked: bool = False
                  ) -> dict[str, Any]:
    """Send size-byte messages for duration_s (offer per message, or offer_many of
    (BATCH_ROWS, size) arrays with batch), then STOP; keep the publication until done (its
    wait(timeout)) says every reader has everything. destinations: see connect_publication;
    checked: Checked messages (sequence number and CRC-32) on the per-message path.
    Returns sent (messages before STOP) and t0 (CLOCK_MONOTONIC ns at the start)."""
    import shmbus

    with shmbus.connect(context) as bus:
        publication = connect_publication(bus, uri, stream_id, deadline_after(timeout_s),
                                          destinations)
        offer, offer_many = publication.offer, publication.offer_many
        publish, publish_many = publication.publish, publication.publish_many
        pack = codec(size).pack_into
        message = bytearray(size)
        checked = checked and not batch
        if checked:
            messages = Checked(size)
            write, message = messages.write, messages.message()
        block = np.zeros((BATCH_ROWS, size), np.uint8)
        words = block.view("<i8")
        ramp = np.arange(BATCH_ROWS, dtype=np.int64)
        start.ready(bus.driver_pid)
        t0 = time.monotonic_ns()
        end_ns = t0 + int(duration_s * 1e9)
        seq = 0
        # back-pressured, the writer sleeps in publish()/publish_many() until the sender moves
        if batch:
            while time.monotonic_ns() < end_ns:
                np.add(ramp, seq, out=words[:, 0])
                words[:, -1] = words[:, 0]
                sent = offer_many(block)
                if sent != BATCH_ROWS:
                    publish_many(block[max(sent, 0):], timeout=timeout_s)
                seq += BATCH_ROWS
        elif checked:
            while True:
                write(message, seq)
                if offer(message) < 0:
                    publish(message, timeout=timeout_s)
                seq += 1
                if not seq & 127 and time.monotonic_ns() >= end_ns:
                    break
        else:
            while True:
                pack(message, 0, seq, seq)
                if offer(message) < 0:
                    publish(message, timeout=timeout_s)
                seq += 1
                if not seq & 127 and time.monotonic_ns() >= end_ns:
                    break
        if checked:
            write(message, STOP)
        else:
            pack(message, 0, STOP, STOP)
        publish(message, timeout=timeout_s)
        # keep the publication until the reader has everything (then close it)
        done.wait(timeout_s)
        publication.close()
    return {"sent": seq, "t0": t0}


class BatchCheck(Counter):
    """A poll_batch handler that checks, with numpy over each FragmentBatch, that the messages
    carry the sequence numbers 0, 1, 2 ... at their head and their tail (the first and the last
    8 bytes), until STOP. With ``fragmented`` (size over the channel's max payload) a message
    is checked at its first and last fragments, and the lengths by their total (finish). With
    ``every_byte`` it also checks that every other byte of every payload is zero, as
    stream_writer's batches write them (``size`` a multiple of 8): every byte is checked."""

    def __init__(self, size: int, fragmented: bool, every_byte: bool = False) -> None:
        super().__init__()
        self.size, self.fragmented, self.every_byte = size, fragmented, every_byte
        self.payload_bytes = 0
        self._pending: list[int] = []  # head of a message whose last fragment is yet to come
        self._ramp = np.arange(BATCH_ROWS + 1, dtype=np.int64)

    def __call__(self, batch: Any) -> None:
        words = batch.term.view(np.int64)  # frames are 32-byte aligned: payloads 8-aligned
        offsets, lengths = batch.offsets, batch.lengths
        if self.fragmented:
            begins, ends = (batch.flags & BEGIN_FLAG) != 0, (batch.flags & END_FLAG) != 0
            heads = np.concatenate((self._pending, words[offsets[begins] >> 3])).astype(np.int64)
            tails = words[(offsets[ends] + lengths[ends] - 8) >> 3]
            self.payload_bytes += int(lengths.sum())
            self._pending = heads[len(tails):].tolist()
            heads = heads[:len(tails)]
            lengths_ok = True
        else:
            heads = words[offsets >> 3]
            tails = words[(offsets + self.size - 8) >> 3]
            lengths_ok = bool((lengths == self.size).all())
        if self.every_byte and len(offsets) and not self._rest_is_zero(words, batch):
            self.bad(int(heads[-1]) if len(heads) else -1,
                     f"batch at position {batch.position}: a payload byte between the head "
                     f"and the tail is not zero")
            return
        n = len(heads)
        if n and heads[n - 1] == STOP:
            self.stopped = True
            n -= 1
            heads, tails = heads[:n], tails[:n]
        if not n:
            return
        if (lengths_ok and np.array_equal(heads - self.expected, self._ramp[:n])
                and np.array_equal(tails, heads)):
            self.expected += n
        else:
            self.bad(int(heads[n - 1]), f"batch at position {batch.position}: heads "
                                        f"{heads[:4]}.. tails {tails[:4]}..")

    @staticmethod
    def _rest_is_zero(words: Any, batch: Any) -> bool:
        """Whether every 8-byte word of the batch's payloads is zero, but the head word of a
        message's first fragment and the tail word of its last (counted with a running sum
        of nonzero words over the span of the batch)."""
        offsets, lengths, flags = batch.offsets, batch.lengths, batch.flags
        first = int(offsets[0]) >> 3
        span = words[first:(int(offsets[-1]) + int(lengths[-1])) >> 3]
        nonzero = np.zeros(len(span) + 1, np.int64)
        np.cumsum(span != 0, out=nonzero[1:])
        starts = (offsets >> 3) - first + ((flags & BEGIN_FLAG) != 0)
        ends = ((offsets + lengths) >> 3) - first - ((flags & END_FLAG) != 0)
        return not (nonzero[ends] - nonzero[starts]).any()

    def finish(self) -> None:
        """After STOP: a fragmented stream's payload bytes must add up to its messages' (STOP
        included); an error if not."""
        if self.fragmented and self.payload_bytes != (self.expected + 1) * self.size:
            self.errors += 1
            self.first_bad = self.first_bad or (f"{self.payload_bytes} payload bytes for "
                                                f"{self.expected + 1} messages")


def stream_reader(start: Any, context: Any, uri: str, stream_id: int, size: int,
                  timeout_s: float, done: Any, batch: bool,
                  checked: bool = False) -> dict[str, Any]:
    """Read stream_writer's messages until STOP, checking each (``for message in
    Subscription.messages()``, or Image.poll_batch with BatchCheck), then done.set(). With
    ``checked`` every byte is checked: on the per-message path (the writer's ``checked`` too)
    each message's sequence number and CRC-32, on the batch path every byte between head and
    tail is zero (BatchCheck's every_byte). Returns received (in order), errors, first_bad, t1
    (CLOCK_MONOTONIC ns when STOP arrived) and seal_drops (see seal_drops: None on a
    plaintext channel)."""
    import shmbus

    unpack = codec(size).unpack_from
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(uri, stream_id)
        image = await_image(subscription, deadline_after(timeout_s))
        check = BatchCheck(size, size > max_payload(uri), every_byte=checked)
        start.ready(bus.driver_pid)
        deadline = deadline_after(timeout_s)
        if not batch and checked:
            expected = 0
            check_message = Checked(size).check
            for message in subscription.messages(timeout=timeout_s):  # asleep while empty
                seq, ok = check_message(message)
                if seq == expected and ok:
                    expected += 1
                elif seq == STOP and ok:
                    check.stopped = True
                    break
                else:
                    check.expected = expected
                    check.bad(seq, f"CRC ok: {ok}")
                    expected = check.expected
            check.expected = expected
        elif not batch:
            expected = 0
            for message in subscription.messages(timeout=timeout_s):  # asleep while empty
                head, tail = unpack(message)
                if head == expected and tail == head:
                    expected += 1
                elif head == STOP:
                    check.stopped = True
                    break
                else:
                    check.expected = expected
                    check.bad(head, f"tail {tail}")
                    expected = check.expected
            check.expected = expected
        while not check.stopped:
            # nothing there: asleep until the bridge writes more
            if (not image.poll_batch(check, BATCH_ROWS) and not subscription.wait(0.1)
                    and time.monotonic_ns() > deadline):
                raise BenchError(f"reader timed out after {check.expected} messages")
        t1 = time.monotonic_ns()
        done.set()
        sealed = seal_drops(bus, uri)  # the receive channel is still there
    if batch:
        check.finish()
    return {**check.result(t1), "seal_drops": sealed}
