"""Subscription.messages(): whole messages copied out natively, one at a time.

Each message is consumed as it is handed out, so a loop left early loses nothing and reads
nothing twice. An owned image (a driver counter) publishes its position in runs, at most a
sixteenth of a term behind what it has read, and all of it once it finds nothing more or its
iterator goes. Real processes read with messages() in test_waiting.py, test_asyncio.py and
../client/test_client_driver.py; here the reader is driven step by step against a model.
"""

from __future__ import annotations

import mmap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus import AtomicBuffer, ExclusivePublication, Image
from shmbus.shm._native import SubscriptionCore
from shmbus.shm.counters import COUNTER_LENGTH, METADATA_LENGTH, CountersManager
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position
from tests.support.sleepers import readers_asleep
from tests.support.waits import wait_until

TERM = 64 * 1024
MTU = 1408
MAX_PAYLOAD = MTU - 32


class Stream:
    """A log, its publication and one owned image on a counter, as a bus client has them."""

    def __init__(self, directory: Path, name: str = "pub.log") -> None:
        self.counters = CountersManager(AtomicBuffer(mmap.mmap(-1, 4 * METADATA_LENGTH)),
                                        AtomicBuffer(mmap.mmap(-1, 4 * COUNTER_LENGTH)))
        self.log = LogBuffer.create(directory / name, term_length=TERM, initial_term_id=7,
                                    mtu=MTU, session_id=1, stream_id=2)
        self.limit = Position(self.counters.values, self.counters.counter_offset(
            self.counters.allocate("pub-lmt")))
        self.publication = ExclusivePublication(self.log, self.limit)
        self.sub_pos = self.counters.allocate("sub-pos", registration_id=3, reference_id=4)
        self.image = Image(self.log, Position(self.counters.values,
                                              self.counters.counter_offset(self.sub_pos)),
                           owned=True)
        self.subscription = SubscriptionCore()
        self.subscription.images = (self.image,)

    def stored(self) -> int:
        """The position other processes see (the driver, a back-pressured publisher)."""
        return self.counters.get_value(self.sub_pos)

    def offer(self, message: bytes) -> None:
        """Offer with the limit a term ahead of the reader's stored position."""
        self.limit.set(self.stored() + TERM)
        assert self.publication.offer(message) > 0


def payload(seq: int, length: int) -> bytes:
    return (seq.to_bytes(4, "little") * (length // 4 + 1))[:length]


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(0, 64), st.integers(0, 3 * MAX_PAYLOAD)),
                        min_size=1, max_size=150),
       reads=st.lists(st.integers(0, 12), min_size=1, max_size=40))
def test_messages_taken_in_runs_are_each_message_once_in_order(
        tmp_path_factory: pytest.TempPathFactory, lengths: list[int], reads: list[int]) -> None:
    """Write, then read runs of ``reads[i]`` messages, each run a fresh iterator left early:
    every message comes out once, whole, in order, fragmented or not, across terms; the
    stored position never lags by a sixteenth of a term and catches up when a run ends."""
    stream = Stream(tmp_path_factory.mktemp("log"))
    sent = [payload(seq, length) for seq, length in enumerate(lengths)]
    got: list[bytes] = []
    written = 0
    for run in reads * 3:
        while written < len(sent) and stream.publication.position - stream.stored() < TERM // 2:
            stream.offer(sent[written])
            written += 1
        for taken, message in enumerate(stream.subscription.messages(timeout=0), 1):
            got.append(message)
            assert 0 <= stream.image.position - stream.stored() < TERM // 16
            if taken == run:  # left early (0: read to the end)
                break
        assert stream.stored() == stream.image.position  # published as the iterator went
    got.extend(stream.subscription.messages(timeout=0))
    while written < len(sent):  # what the runs left: read as it is written
        stream.offer(sent[written])
        written += 1
        got.extend(stream.subscription.messages(timeout=0))
    assert got == sent
    assert stream.stored() == stream.image.position == stream.publication.position


def test_messages_and_poll_share_one_position(tmp_path: Path) -> None:
    stream = Stream(tmp_path)
    for seq in range(10):
        stream.offer(payload(seq, 20))
    messages = stream.subscription.messages(timeout=0)
    assert next(messages) == payload(0, 20)
    assert stream.stored() == 0  # held back: a run, not one message
    polled: list[bytes] = []
    assert stream.subscription.poll(lambda buffer, header: polled.append(bytes(buffer)), 2) == 2
    assert polled == [payload(1, 20), payload(2, 20)]
    assert stream.stored() == stream.image.position  # the poll stored it all
    assert next(messages) == payload(3, 20)
    del messages
    assert stream.stored() == stream.image.position == 4 * 64


def test_an_ended_iterator_stays_ended_and_a_new_one_reads_on(tmp_path: Path) -> None:
    stream = Stream(tmp_path)
    messages = stream.subscription.messages(timeout=0)
    assert list(messages) == []
    stream.offer(b"late")
    assert list(messages) == []
    assert list(stream.subscription.messages(timeout=0)) == [b"late"]


def test_a_fragmented_message_is_handed_out_only_whole(tmp_path: Path) -> None:
    """Its last fragment not yet committed, nothing is read and a waiter sleeps (wait() is
    False); a reader blocked in messages() gets it once the fragment is committed and the
    writer wakes it."""
    stream = Stream(tmp_path)
    big = payload(1, 2 * MAX_PAYLOAD + 100)
    stream.offer(big)
    last = 2 * MTU  # the third fragment's frame, committed by its length word
    term = stream.log.buffer
    length = term.get_int32(last)
    term.put_int32_release(last, 0)
    assert list(stream.subscription.messages(timeout=0)) == []
    assert stream.image.position == 0
    assert stream.subscription.wait(0) is False

    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(
        stream.subscription.messages(timeout=5)))
    reader.start()
    wait_until(lambda: readers_asleep(stream.log) == 1, 10, "the reader asleep in messages()")
    term.put_int32_release(last, length)
    stream.offer(b"after")  # a commit wakes the sleeping reader
    reader.join(10)
    assert got == [big, b"after"]


def test_fragments_without_their_first_are_dropped(tmp_path: Path) -> None:
    """As FragmentAssembler drops them: a reader that starts inside a message (a position set
    by hand) reads from the next whole one."""
    stream = Stream(tmp_path)
    stream.offer(payload(1, 2 * MAX_PAYLOAD))
    stream.offer(b"whole")
    stream.image.position = MTU  # the second fragment
    assert list(stream.subscription.messages(timeout=0)) == [b"whole"]


def test_messages_checks_its_timeout(tmp_path: Path) -> None:
    subscription = Stream(tmp_path).subscription
    for bad in (-1, float("nan"), "1"):
        with pytest.raises((ValueError, TypeError), match="timeout|must be real"):
            subscription.messages(timeout=bad)
    with pytest.raises(TypeError, match=r"messages\(timeout=1.0\)"):
        subscription.messages(1, 2)
    with pytest.raises(TypeError, match=r"messages\(timeout=1.0\)"):
        subscription.messages(limit=3)


def test_a_timeout_ends_the_loop_after_that_long_without_a_message(tmp_path: Path) -> None:
    subscription = Stream(tmp_path).subscription
    t0 = time.monotonic()
    assert list(subscription.messages(timeout=0.2)) == []
    assert time.monotonic() - t0 >= 0.2
