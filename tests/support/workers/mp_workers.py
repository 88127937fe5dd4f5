"""Spawn targets for tests/shmbus/streams/test_multiprocess.py.

Every function here runs in a process of its own (multiprocessing "spawn" context), opens the
stream by path with :class:`StandaloneStream`, and reports back through a multiprocessing
queue. Every loop is bounded by a deadline; waiting is done with
:class:`shmbus.idle_strategies.BackoffIdleStrategy` (the machine has two cores: no busy-spinning).

Message formats (all checksums are zlib.crc32):

* "tagged" (concurrent writers, lengths 1..4000): the header's reserved value is
  ``writer << 56 | seq << 32 | crc32(whole payload)``; payloads of at least
  ``TAG.size`` bytes also start with ``TAG = (writer u16, seq u32, crc32(rest) u32)``.
* "small" (single writer, lengths >= 8): the payload is ``(seq u32, crc32(rest) u32) + rest``.

Payload bytes are windows of a random block shared by writer and reader (``random_block``),
and lengths and window offsets come from seeded generators, so a reader can recompute the
length every message must have.
"""

from __future__ import annotations

import os
import random
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

import shmbus
from shmbus.shm.log_buffer import align
from tests.support.standalone_stream import StandaloneStream, reader_offset

TAG = struct.Struct("<HII")  # writer id, sequence, crc32 of the rest of the payload
SMALL = struct.Struct("<II")  # sequence, crc32 of the rest of the payload
BLOCK_LENGTH = 1 << 20
MAX_ERROR_SAMPLES = 20


def random_block(seed: int) -> bytes:
    """The random bytes payloads are cut from (the same in every process for one seed)."""
    return random.Random(seed).randbytes(BLOCK_LENGTH)


# -- tagged messages (concurrent writers) ---------------------------------------------------


def tagged_rng(seed: int, writer: int) -> random.Random:
    return random.Random(seed * 1000 + writer)


def next_tagged_shape(rng: random.Random, max_length: int) -> tuple[int, int]:
    """(length, offset into the block) of a writer's next message."""
    length = rng.randint(1, max_length)
    return length, rng.randrange(0, BLOCK_LENGTH - max_length)


def make_tagged(block: memoryview, writer: int, seq: int, length: int,
                offset: int) -> tuple[tuple[Any, ...], int]:
    """(buffers to offer, reserved value) of one tagged message."""
    if length >= TAG.size:
        body = block[offset:offset + length - TAG.size]
        head = TAG.pack(writer, seq, zlib.crc32(body))
        crc = zlib.crc32(body, zlib.crc32(head))
        parts: tuple[Any, ...] = (head, body)
    else:
        body = block[offset:offset + length]
        crc = zlib.crc32(body)
        parts = (body,)
    return parts, writer << 56 | seq << 32 | crc


class Offers:
    """The retry policy of a writer's offers and what it counts: ADMIN_ACTION is retried at
    once, BACK_PRESSURED idles (back-off) until ``timeout`` seconds from now, any other
    failure raises."""

    def __init__(self, timeout: float) -> None:
        self.idle = shmbus.idle_strategies.BackoffIdleStrategy()
        self.deadline = time.monotonic() + timeout
        self.admin = 0
        self.back_pressured = 0

    def taken(self, result: int, what: str, seq: int) -> bool:
        """Whether ``result`` (of the offer ``what`` of message ``seq``) took the message;
        when not, idles as the policy says before the caller offers again."""
        if result > 0:
            return True
        if result == shmbus.codes.ADMIN_ACTION:
            self.admin += 1
            return False
        if result != shmbus.codes.BACK_PRESSURED:
            raise RuntimeError(f"{what}: {shmbus.codes.result_name(result)}")
        self.back_pressured += 1
        if self.back_pressured % 64 == 0 and time.monotonic() > self.deadline:
            raise TimeoutError(f"back-pressured past the deadline at seq {seq}")
        self.idle.idle(0)
        return False


def concurrent_writer(directory: str, writer: int, count: int, seed: int, max_length: int,
                      start: Any, results: Any, timeout: float) -> None:
    """Offers ``count`` tagged messages to a ConcurrentPublication of its own over the log.

    Offers are retried as :class:`Offers` says; the counts of ADMIN_ACTION and BACK_PRESSURED
    are reported with the outcome.
    """
    report: dict[str, Any] = {"kind": "writer", "writer": writer, "sent": 0, "admin": 0,
                              "back_pressured": 0, "error": None}
    try:
        stream = StandaloneStream(directory)
        pub = stream.publication()
        block = memoryview(random_block(seed))
        rng = tagged_rng(seed, writer)
        if not start.wait(timeout):
            raise TimeoutError("start event not set")
        offers = Offers(timeout)
        offer = pub.offer
        for seq in range(count):
            parts, reserved = make_tagged(block, writer, seq,
                                          *next_tagged_shape(rng, max_length))
            while not offers.taken(offer(*parts, reserved_value=reserved), "offer", seq):
                pass
            offers.idle.reset()
            report["sent"] = seq + 1
        report["admin"] = offers.admin
        report["back_pressured"] = offers.back_pressured
        pub.close()
    except BaseException as e:  # reported, never lost in a child's stderr
        report["error"] = repr(e)
    results.put(report)


class Verdicts:
    """What a verifier found: the messages it saw and its errors, with the first
    ``MAX_ERROR_SAMPLES`` of them said in words."""

    def __init__(self) -> None:
        self.errors = 0
        self.samples: list[str] = []
        self.messages = 0

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.samples) < MAX_ERROR_SAMPLES:
            self.samples.append(text)


def read_until(poll: Callable[[], int], done: Callable[[], bool], timeout: float) -> str | None:
    """Runs ``poll()`` (the fragments it read) until ``done()``, idling with back-off while
    nothing comes, then ``poll()`` on for 0.2 s more: anything after the last expected message
    would be a duplicate or garbage. Returns the error to report when the ``timeout`` passed
    before ``done()``."""
    idle = shmbus.idle_strategies.BackoffIdleStrategy()
    deadline = time.monotonic() + timeout
    error = None
    while not done():
        if poll() == 0:
            if time.monotonic() > deadline:
                error = "deadline passed before every message arrived"
                break
            idle.idle(0)
        else:
            idle.reset()
    linger = time.monotonic() + 0.2
    while time.monotonic() < linger:
        poll()
        idle.idle(0)
    return error


class TaggedVerifier(Verdicts):
    """Checks tagged messages: exactly once, in order per writer, lengths and checksums right.
    ``assembler`` is the fragment handler to poll with: it hands the verifier whole messages."""

    def __init__(self, writers: int, seed: int, max_length: int) -> None:
        super().__init__()
        self.expected = [0] * writers
        self.rngs = [tagged_rng(seed, w) for w in range(writers)]
        self.max_length = max_length
        self.assembler = shmbus.FragmentAssembler(self)

    def __call__(self, buffer: memoryview, header: shmbus.Header) -> None:
        self.messages += 1
        reserved = header.reserved_value
        writer, seq, crc = reserved >> 56, (reserved >> 32) & 0xFFFFFF, reserved & 0xFFFFFFFF
        if zlib.crc32(buffer) != crc:
            self.error(f"crc of whole message wrong (writer {writer} seq {seq})")
            return
        if not 0 <= writer < len(self.expected):
            self.error(f"unknown writer {writer}")
            return
        length = len(buffer)
        if length >= TAG.size:
            tag_writer, tag_seq, tag_crc = TAG.unpack_from(buffer)
            if (tag_writer, tag_seq) != (writer, seq):
                self.error(f"tag {(tag_writer, tag_seq)} != reserved value {(writer, seq)}")
                return
            if zlib.crc32(buffer[TAG.size:]) != tag_crc:
                self.error(f"crc of body wrong (writer {writer} seq {seq})")
                return
        if seq != self.expected[writer]:
            self.error(f"writer {writer}: seq {seq}, expected {self.expected[writer]}")
            return
        expected_length, _ = next_tagged_shape(self.rngs[writer], self.max_length)
        if length != expected_length:
            self.error(f"writer {writer} seq {seq}: length {length}, expected {expected_length}")
        self.expected[writer] = seq + 1


def tagged_reader(directory: str, writers: int, count: int, seed: int, max_length: int,
                  ready: Any, results: Any, timeout: float) -> None:
    """Reads until every writer's ``count`` messages arrived (or the deadline), reassembling
    fragments, and reports what it verified; it also stands in for the driver's flow control.
    """
    report: dict[str, Any] = {"kind": "reader", "error": None}
    try:
        stream = StandaloneStream(directory)
        image = stream.image(0)
        verifier = TaggedVerifier(writers, seed, max_length)
        total = writers * count
        fragments = 0

        def poll() -> int:
            nonlocal fragments
            n = image.poll(verifier.assembler, 256)
            stream.update_limit([image.position])
            fragments += n
            return n

        stream.update_limit([image.position])
        ready.set()
        report["error"] = read_until(poll, lambda: verifier.messages >= total, timeout)
        report.update(counts=verifier.expected, messages=verifier.messages,
                      errors=verifier.errors, samples=verifier.samples, fragments=fragments,
                      position=image.position,
                      producer_position=stream.log.producer_position())
    except BaseException as e:
        report["error"] = repr(e)
    results.put(report)


# -- small messages (one writer) ------------------------------------------------------------


def small_shapes(seed: int, count: int, min_length: int = 8,
                 max_length: int = 64) -> tuple[list[int], list[int]]:
    """(lengths, block offsets) of every small message, from a seeded generator."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_length, max_length + 1, count)
    offsets = rng.integers(0, BLOCK_LENGTH - max_length, count)
    return lengths.tolist(), offsets.tolist()


def make_small(block: memoryview, seq: int, length: int, offset: int) -> tuple[bytes, Any]:
    body = block[offset:offset + length - SMALL.size]
    return SMALL.pack(seq, zlib.crc32(body)), body


def exclusive_writer(directory: str, count: int, seed: int, batch: int, start: Any,
                     results: Any, timeout: float, report_positions: bool = False) -> None:
    """Offers ``count`` small messages on an ExclusivePublication: one ``offer`` per message
    when ``batch`` is 0, else ``offer_many`` over lists of ``batch`` messages.

    With ``report_positions`` the stream position after every message is reported too.
    """
    report: dict[str, Any] = {"kind": "writer", "sent": 0, "admin": 0, "back_pressured": 0,
                              "error": None}
    try:
        stream = StandaloneStream(directory)
        pub = stream.publication(exclusive=True)
        block = memoryview(random_block(seed))
        lengths, offsets = small_shapes(seed, count)
        positions = np.zeros(count, np.int64) if report_positions else None
        if not start.wait(timeout):
            raise TimeoutError("start event not set")
        offers = Offers(timeout)
        seq = 0
        offer, offer_many = pub.offer, pub.offer_many
        while seq < count:
            if batch:
                end = min(count, seq + batch)
                messages = [b"".join(make_small(block, i, lengths[i], offsets[i]))
                            for i in range(seq, end)]
                done = 0
                while done < len(messages):
                    result = offer_many(messages[done:] if done else messages)
                    if offers.taken(result, "offer_many", seq):
                        done += result
                        offers.idle.reset()
                seq = end
            else:
                head, body = make_small(block, seq, lengths[seq], offsets[seq])
                while not offers.taken(result := offer(head, body), "offer", seq):
                    pass
                offers.idle.reset()
                if positions is not None:
                    positions[seq] = result
                seq += 1
            report["sent"] = seq
        report.update(admin=offers.admin, back_pressured=offers.back_pressured,
                      position=pub.position)
        if positions is not None:
            report["positions"] = positions
        pub.close()
    except BaseException as e:
        report["error"] = repr(e)
    results.put(report)


class SmallVerifier(Verdicts):
    """Checks small messages: consecutive sequence numbers from ``first``, lengths, crcs."""

    def __init__(self, seed: int, count: int, first: int | None = 0) -> None:
        super().__init__()
        self.lengths, _ = small_shapes(seed, count)
        self.expected = first  # None: take the first message's sequence as the start
        self.first: int | None = None

    def __call__(self, buffer: memoryview, header: shmbus.Header) -> None:
        self.messages += 1
        if len(buffer) < SMALL.size:
            self.error(f"message of {len(buffer)} bytes is too short")
            return
        seq, crc = SMALL.unpack_from(buffer)
        if zlib.crc32(buffer[SMALL.size:]) != crc:
            self.error(f"crc wrong at seq {seq}")
            return
        if self.first is None:
            self.first = seq
            if self.expected is None:
                self.expected = seq
        if seq != self.expected:
            self.error(f"seq {seq}, expected {self.expected}")
            return
        if seq >= len(self.lengths) or len(buffer) != self.lengths[seq]:
            self.error(f"seq {seq}: wrong length {len(buffer)}")
        self.expected = seq + 1


def small_reader(directory: str, count: int, seed: int, ready: Any, results: Any,
                 timeout: float, flow_control: bool = True, slot: int = 0,
                 first: int | None = 0, progress: Any = None) -> None:
    """Reads small messages until the one with sequence ``count - 1`` has arrived.

    With ``flow_control`` this reader also updates the publication limit (standing in for the
    driver); otherwise someone else does. ``first`` is the sequence expected first (None: any,
    reported). ``progress`` (a shared int) gets the number of verified messages after each poll.
    """
    report: dict[str, Any] = {"kind": "reader", "error": None}
    try:
        stream = StandaloneStream(directory)
        image = stream.image(slot)
        report["start_position"] = image.position
        verifier = SmallVerifier(seed, count, first)

        def poll() -> int:
            n = image.poll(verifier, 512)
            if flow_control:
                stream.update_limit([image.position])
            if progress is not None:
                progress.value = verifier.messages
            return n

        if flow_control:
            stream.update_limit([image.position])
        ready.set()
        report["error"] = read_until(
            poll, lambda: verifier.expected is not None and verifier.expected >= count, timeout)
        report.update(first=verifier.first, next=verifier.expected, messages=verifier.messages,
                      errors=verifier.errors, samples=verifier.samples, position=image.position)
    except BaseException as e:
        report["error"] = repr(e)
    results.put(report)


def flow_control_loop(directory: str, slots: list[int], ready: Any, stop: Any,
                      timeout: float) -> None:
    """Stands in for the driver: raises the limit behind the readers in ``slots`` (their
    positions in the positions file) until ``stop`` is set. Readers may come and go under it.
    """
    stream = StandaloneStream(directory)
    offsets = [reader_offset(slot) for slot in slots]
    deadline = time.monotonic() + timeout
    stream.update_limit([stream.positions.get_int64_acquire(o) for o in offsets])
    ready.set()
    while not stop.is_set() and time.monotonic() < deadline:
        stream.update_limit([stream.positions.get_int64_acquire(o) for o in offsets])
        time.sleep(0.0005)
    stream.close()


# -- a writer that dies mid-append ----------------------------------------------------------


def claiming_writer(directory: str, writer: int, complete: int, claim_length: int, seed: int,
                    max_length: int, claimed: Any, results: Any, timeout: float) -> None:
    """Offers ``complete`` tagged messages, then claims ``claim_length`` bytes, fills part of
    them, reports the claim and sleeps (to be SIGKILLed) without committing it.
    """
    report: dict[str, Any] = {"kind": "claimer", "error": None}
    try:
        stream = StandaloneStream(directory)
        pub = stream.publication()
        block = memoryview(random_block(seed))
        rng = tagged_rng(seed, writer)
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        deadline = time.monotonic() + timeout
        positions = []
        for seq in range(complete):
            shape = next_tagged_shape(rng, max_length)
            parts, reserved = make_tagged(block, writer, seq, *shape)
            while (result := pub.offer(*parts, reserved_value=reserved)) <= 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"offer: {shmbus.codes.result_name(result)}")
                if result != shmbus.codes.ADMIN_ACTION:
                    idle.idle(0)
            positions.append(result)
        while not (claim := pub.try_claim(claim_length)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"try_claim: {shmbus.codes.result_name(claim.result)}")
            if claim.result != shmbus.codes.ADMIN_ACTION:
                idle.idle(0)
        body = block[:claim_length - TAG.size]
        claim.buffer[:TAG.size] = TAG.pack(writer, complete, zlib.crc32(body))
        half = claim_length // 2
        claim.buffer[TAG.size:half] = body[:half - TAG.size]  # the rest is never written
        report.update(positions=positions, claim_end=claim.result,
                      claim_start=claim.result - align(claim_length + 32))
    except BaseException as e:
        report["error"] = repr(e)
    results.put(report)
    claimed.set()
    time.sleep(timeout)  # killed here; never commits
    os._exit(3)


def watching_reader(directory: str, writers: int, seed: int, max_length: int, ready: Any,
                    stop: Any, results: Any, timeout: float) -> None:
    """Reads tagged messages (flow control included) until ``stop``; reports every message
    it verified, per writer, and where it stopped.
    """
    report: dict[str, Any] = {"kind": "reader", "error": None}
    try:
        stream = StandaloneStream(directory)
        image = stream.image(0)
        verifier = TaggedVerifier(writers, seed, max_length)
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        stream.update_limit([image.position])
        ready.set()
        deadline = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < deadline:
            idle.idle(image.poll(verifier.assembler, 64))
            stream.update_limit([image.position])
        for _ in range(10):  # a last look after the stop
            image.poll(verifier.assembler, 64)
        report.update(counts=verifier.expected, messages=verifier.messages,
                      errors=verifier.errors, samples=verifier.samples, position=image.position)
    except BaseException as e:
        report["error"] = repr(e)
    results.put(report)
