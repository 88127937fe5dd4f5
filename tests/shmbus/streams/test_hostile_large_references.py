"""Hostile large-message reference frames in a log, read by every reader API
(shmbus/streams/large_messages.py, shmbus/streams/image.py, shmbus/shm/block_ring.py).

In one process, without a driver: a log and its block ring, an exclusive publication that
writes small and large messages, and among them frames a hostile (or broken) writer of the same
log wrote by hand with the large flag: garbage, a reference cut short or too long, another
version, a position not at a block, past the ring's end or past what writers reserved, a
length no block has, or a second reference to a live block (the block is bound to its own
frame). Readers: ``poll`` with a fragment
assembler, ``controlled_poll``, ``messages()`` (the native take) and ``take_view``.

Property: each reader gets exactly the messages written, and in their place, for each frame no
writer could have made, one CorruptReferenceError (a ValueError) naming the corrupt reference, the
frame dropped; never a crash, a reader stopped for good, a wrong message, or a large flag on
anything but a whole-message frame taken for a message.
"""

from __future__ import annotations

import mmap
import struct
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import shmbus
from shmbus import ExclusivePublication, Image, Subscription
from shmbus.shm import block_ring as br
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.block_ring import LARGE_FLAG
from shmbus.shm.log_buffer import BEGIN_FLAG, END_FLAG, LogBuffer
from shmbus.shm.position import Position
from shmbus.streams.fragment_assembler import FragmentAssembler
from tests.support.corrupt_references import messages_and_errors
from tests.support.waits import wait_until

TERM = 64 * 1024  # max message length 8 KiB: longer messages go to the ring
RING_MAX = 1 << 20
FLAGS_OFFSET = 5

KINDS = ["garbage", "short", "long", "version", "negative", "misaligned", "past-tail",
         "past-end", "wrong-length", "huge-length", "fragment", "duplicate"]

items = st.lists(st.one_of(
    st.tuples(st.just("small"), st.integers(0, 8 * 1024 - 32)),
    st.tuples(st.just("large"), st.integers(8 * 1024 + 1, 200 * 1024)),
    st.tuples(st.sampled_from(KINDS), st.binary(max_size=48)),
), min_size=1, max_size=10)


class Bus:
    """A log, its block ring, a publication, and reader positions, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.log = LogBuffer.create(directory / "1.log", term_length=TERM, initial_term_id=7,
                                    mtu=1408, session_id=5, stream_id=9)
        self.ring = br.BlockRing.create(br.ring_path(self.log.path), RING_MAX)
        self.positions = AtomicBuffer(mmap.mmap(-1, 4096))
        self.limit = Position(self.positions, 0)
        self.limit.set(1 << 40)
        self.log.is_connected = True
        self.publication = ExclusivePublication(self.log, self.limit)
        self.readers = 0

    def image(self) -> Image:
        self.readers += 1
        return Image(self.log, Position(self.positions, 64 * self.readers))

    def forge(self, payload: bytes, flags: int = BEGIN_FLAG | END_FLAG | LARGE_FLAG) -> None:
        """Append a frame of ``payload`` with ``flags``, as a writer of this log may."""
        pub = self.publication
        result, frame_offset = pub._claim(len(payload), 0)
        assert result > 0
        view = pub._claim_view(frame_offset, len(payload))
        view[:] = payload
        view.release()
        self.log.buffer.put_bytes(frame_offset + FLAGS_OFFSET, bytes([flags]))
        pub._commit(frame_offset)

    def close(self) -> None:
        self.publication.close()
        self.ring.close()
        self.log.close()


def forged(bus: Bus, kind: str, noise: bytes, blocks: list[tuple[int, int]]) -> bytes:
    """The payload of a forged frame of ``kind`` (noise: hypothesis' bytes to vary it)."""
    tail = bus.ring.buffer.get_int64_acquire(br._TAIL)
    start, length = blocks[-1] if blocks else (0, 100)
    pick = noise[0] if noise else 0
    if kind == "garbage":
        return noise
    if kind == "short":
        return br.encode_reference(start, length)[:pick % br.REFERENCE_LENGTH]
    if kind == "long":
        return br.encode_reference(start, length) + (noise or b"\0")
    if kind == "version":
        return struct.pack("<4sHHqq", b"SHBL", 2 + pick, 0, start, length)
    if kind == "negative":
        return struct.pack("<4sHHqq", b"SHBL", 1, 0, -1 - pick if pick % 2 else start,
                           -1 - pick if not pick % 2 else length)
    if kind == "misaligned":
        return br.encode_reference(start + 1 + pick, length)
    if kind == "past-tail":
        # (far past it: a block a writer reserves later at the very position and length a
        # reference names is that message, see test_a_reference_to_a_later_block)
        return br.encode_reference(tail + (1 << 40) + br.PAGE * (pick % 3), length)
    if kind == "past-end":
        at = bus.ring.capacity - br.PAGE
        return br.encode_reference(tail - tail % bus.ring.capacity + at, br.PAGE + pick)
    if kind == "wrong-length":
        return br.encode_reference(start, length + 1 + pick)
    if kind == "huge-length":
        return br.encode_reference(start, 2**62 + pick)
    if kind == "fragment":
        return br.encode_reference(start, length)
    assert kind == "duplicate"
    return br.encode_reference(start, length)


#: a message longer than this goes into the log in fragments (mtu 1408 - 32)
MAX_PAYLOAD = 1408 - 32
FRAGMENT_FLAGS = [BEGIN_FLAG, END_FLAG, 0]


def write(bus: Bus, plan: list[tuple[str, Any]]) -> list[tuple[Any, ...]]:
    """Write ``plan``; returns what the log holds, in order: ("msg", bytes, fragmented) for a
    message a reader should get, ("corrupt",) for a frame no writer could have made, and
    ("frag", flags, payload) for a lone fragment with the large flag (a fragment to readers)."""
    frames: list[tuple[Any, ...]] = []
    blocks: list[tuple[int, int]] = []  # (ring position, length) of the large messages
    for n, (kind, arg) in enumerate(plan):
        if kind in ("small", "large"):
            payload = bytes([n % 256]) * arg
            assert bus.publication.offer(payload) > 0
            if kind == "large":
                # the block this message took: the last one reserved
                start = bus.ring.buffer.get_int64_acquire(br._TAIL) - br._span(arg)
                blocks.append((start, arg))
            frames.append(("msg", payload, kind == "small" and arg > MAX_PAYLOAD))
            continue
        if kind == "duplicate" and not blocks:
            kind = "past-tail"
        payload = forged(bus, kind, arg, blocks)
        if kind == "fragment":
            flags = FRAGMENT_FLAGS[(arg[0] if arg else 0) % 3]
            bus.forge(payload, flags | LARGE_FLAG)
            frames.append(("frag", flags, payload))
            continue
        bus.forge(payload)
        frames.append(("corrupt",))
    return frames


ERROR = "error"


def assembled(frames: list[tuple[Any, ...]]) -> list[bytes | str]:
    """What poll with a FragmentAssembler gives: whole messages, ERROR for each corrupt frame
    (raised, the frame consumed); a whole frame passes by a partial message, a fragmented one
    replaces it; a lone E ends a partial one, a fragment with no B before it is dropped."""
    out: list[bytes | str] = []
    partial: bytes | None = None
    for frame in frames:
        if frame[0] == "msg":
            out.append(frame[1])
            if frame[2]:
                partial = None
        elif frame[0] == "corrupt":
            out.append(ERROR)
        else:
            _, flags, payload = frame
            if flags & BEGIN_FLAG:
                partial = payload
            elif partial is not None:
                partial += payload
                if flags & END_FLAG:
                    out.append(partial)
                    partial = None
    return out


def taken(frames: list[tuple[Any, ...]]) -> list[bytes | str]:
    """What messages() (the native take) gives: whole messages, ERROR for each corrupt frame
    (raised, the frame dropped); a first fragment whose message another first fragment
    interrupts is dropped, and so is a fragment with no first fragment before it."""
    out: list[bytes | str] = []
    i = 0
    while i < len(frames):
        frame = frames[i]
        i += 1
        if frame[0] == "msg":
            out.append(frame[1])
        elif frame[0] == "corrupt":
            out.append(ERROR)
        elif frame[1] & BEGIN_FLAG:
            partial = frame[2]
            while i < len(frames):
                if frames[i][0] != "frag" or frames[i][1] & BEGIN_FLAG:
                    break  # a new first fragment: this one is dropped
                partial += frames[i][2]
                i += 1
                if frames[i - 1][1] & END_FLAG:
                    out.append(partial)
                    break
            else:
                return out  # the rest of the message is not there: nothing more
    return out


def read_all(take: Any, limit: int = 1000) -> list[bytes | str]:
    """What ``take()`` (the messages of one read, None when it read nothing) gives until it
    reads nothing; ERROR for each CorruptReferenceError, which must name the reference. At
    most ``limit`` reads."""
    got: list[bytes | str] = []
    for _ in range(limit):
        try:
            messages = take()
        except br.CorruptReferenceError as e:
            assert "large-message reference" in str(e), str(e)
            got.append(ERROR)
            continue
        if messages is None:
            return got
        got += messages
    raise AssertionError("a reader never ran dry")


def reader_apis(bus: Bus) -> dict[str, Any]:
    def polling(controlled: bool) -> Any:
        image = bus.image()
        out: list[bytes] = []
        assembler = FragmentAssembler(lambda buffer, header: out.append(bytes(buffer)))

        def take() -> list[bytes] | None:
            out.clear()
            if controlled:
                fragments = image.controlled_poll(assembler, 1)
            else:
                fragments = image.poll(assembler, 1)
            return list(out) if fragments else None
        return take

    def messages() -> Any:
        sub = Subscription("aeron:ipc", 9)
        sub.images = (bus.image(),)

        def take() -> list[bytes] | None:
            message = sub._take()  # one step of messages()
            return None if message is None else [message]
        return take

    def views() -> Any:
        sub = Subscription("aeron:ipc", 9)
        sub.images = (bus.image(),)

        def take() -> list[bytes] | None:
            view = sub.take_view()
            if view is None:
                return None
            with view:
                return [bytes(view.buffer)]
        return take

    return {"poll": polling(False), "controlled_poll": polling(True), "messages": messages(),
            "take_view": views()}


@given(items)
@settings(max_examples=150)
def test_every_reader_gets_the_messages_and_a_named_error_for_each_corrupt_reference(
        plan: list[tuple[str, Any]]) -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        bus = Bus(Path(tmp))
        try:
            readers = reader_apis(bus)
            frames = write(bus, plan)
            expected = {"poll": assembled(frames), "controlled_poll": assembled(frames),
                        "take_view": assembled(frames), "messages": taken(frames)}
            for name, take in readers.items():
                # every reader drops the corrupt frame, raising once (polls as for any
                # handler error), and reads on
                assert read_all(take) == expected[name], name
                assert read_all(take) == [], name
        finally:
            bus.close()


def test_a_reference_to_a_later_block_is_refused_before_and_after_a_writer_makes_it(
        tmp_path: Path) -> None:
    """What the property above leaves out: a reference to the ring position and length the
    next block will have is refused (named) while no writer has reserved it, and still once a
    writer has: the block was made for its own reference frame (its release position), not
    for one at another log position. The block's own reference delivers it."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        bus = Bus(Path(tmp))
        try:
            early, late = reader_apis(bus)["poll"], reader_apis(bus)["poll"]
            tail = bus.ring.buffer.get_int64_acquire(br._TAIL)
            bus.forge(br.encode_reference(tail, 10_000))
            assert read_all(early) == [ERROR]
            message = b"later" * 2000
            assert bus.publication.offer(message) > 0
            assert read_all(late) == [ERROR, message]
        finally:
            bus.close()


def test_a_reference_forged_into_a_block_still_filling_is_refused_not_delivered_torn(
        tmp_path: Path) -> None:
    """A writer has claimed a block (a LargeClaim) and filled half of it; a frame names the
    block's exact ring position and length before the writer's own reference is in the log.
    Every reader refuses that frame (named: the block is still its writer's), never hands out
    the half-written payload, and then gets the message whole from its own reference."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        bus = Bus(Path(tmp))
        try:
            readers = reader_apis(bus)
            length = 100_000
            claim = bus.publication.try_claim(length)
            assert isinstance(claim, shmbus.LargeClaim) and claim.buffer is not None
            start = bus.ring.buffer.get_int64_acquire(br._TAIL) - br._span(length)
            claim.buffer[:length // 2] = b"h" * (length // 2)
            bus.forge(br.encode_reference(start, length))
            for name, take in readers.items():
                assert read_all(take) == [ERROR], name
            claim.buffer[length // 2:] = b"t" * (length - length // 2)
            claim.commit()
            whole = b"h" * (length // 2) + b"t" * (length - length // 2)
            for name, take in readers.items():
                assert read_all(take) == [whole], name
        finally:
            bus.close()


def test_a_group_member_drops_a_corrupt_reference_naming_it_and_reads_on(bus_context,
                                                                          driver) -> None:
    """The same for a subscription group's members (their own native take): the message
    before, one error naming the reference (the message done: the group's claim moves on),
    the message after."""
    with shmbus.connect(bus_context) as bus:
        member = bus.add_subscription("aeron:ipc", 61, group="g")
        pub = bus.add_exclusive_publication("aeron:ipc", 61)
        wait_until(lambda: pub.is_connected and member.images, 10, "the member")
        pub.publish(b"before", timeout=5)
        result, frame_offset = pub._claim(br.REFERENCE_LENGTH, 0)
        view = pub._claim_view(frame_offset, br.REFERENCE_LENGTH)
        view[:] = br.encode_reference(1 << 40, 10)
        view.release()
        pub.log.buffer.put_bytes(frame_offset + FLAGS_OFFSET,
                                 bytes([BEGIN_FLAG | END_FLAG | LARGE_FLAG]))
        pub._commit(frame_offset)
        pub.publish(b"after", timeout=5)
        before, error, after = messages_and_errors(member, 3, 10)
        assert (before, after) == (b"before", b"after")
        assert isinstance(error, br.CorruptReferenceError), error
        assert "no writer used the ring" in str(error)
