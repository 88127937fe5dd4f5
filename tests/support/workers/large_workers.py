"""Spawn targets of test_large_messages.py: writers and readers of large messages.

Every message is ``head`` (writer id, sequence number, length, crc32 of the body) + body; the
body is pseudo-random from (writer, seq), so a reader checks every byte.
"""

from __future__ import annotations

import os
import struct
import time
import traceback
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

import shmbus

HEAD = struct.Struct("<iiqI")


def message(writer: int, seq: int, length: int) -> bytes:
    """The message ``seq`` of ``writer``: ``length`` bytes in all (at least HEAD.size)."""
    body = np.random.default_rng([writer, seq]).bytes(max(0, length - HEAD.size))
    return HEAD.pack(writer, seq, length, zlib.crc32(body)) + body


def check(buffer: Any) -> tuple[int, int]:
    """(writer, seq) of a message; AssertionError when a byte is wrong."""
    data = memoryview(buffer)
    writer, seq, length, crc = HEAD.unpack(bytes(data[:HEAD.size]))
    assert len(data) == length, f"writer {writer} seq {seq}: {len(data)} bytes, not {length}"
    assert zlib.crc32(data[HEAD.size:]) == crc, f"writer {writer} seq {seq}: bad checksum"
    return writer, seq


def _connected(publication: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not publication.is_connected:
        assert time.monotonic() < deadline, "no subscriber connected"
        time.sleep(0.005)


def guard(results: Any, kind: str, name: str, body: Any) -> None:
    try:
        body()
    except BaseException as e:  # reported, so the test fails with the cause
        results.put({"kind": kind, "name": name,
                     "exception": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"})


def writer(context: shmbus.Context, stream: int, writer_id: int, sizes: list[int],
           readers: int, results: Any, first_seq: int = 0) -> None:
    """Publish one message per size (sequence numbers from ``first_seq``) on a concurrent
    publication once ``readers`` images are connected (the subscriptions report before the
    writers start)."""
    def body() -> None:
        with shmbus.connect(context) as bus:
            pub = bus.add_publication("aeron:ipc", stream)
            _connected(pub)
            for seq, size in enumerate(sizes, first_seq):
                pub.publish(message(writer_id, seq, size), timeout=30.0)
            results.put({"kind": "sent", "name": f"writer {writer_id}", "count": len(sizes)})
    guard(results, "sent", f"writer {writer_id}", body)


def reader(context: shmbus.Context, stream: int, expected: dict[int, int], mode: str,
           results: Any, linger: float = 0.0) -> None:
    """Read until every writer's ``expected[writer]`` messages came, each checked, in order per
    writer, then ``linger`` seconds more, failing on any further message. ``mode``:
    "messages" (bytes), "views" (MessageView), "poll" (handler views)."""
    name = f"reader {mode}"

    def body() -> None:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream)
            results.put({"kind": "ready", "name": name, "pid": os.getpid()})
            next_seq = dict.fromkeys(expected, 0)
            total = sum(expected.values())
            got = 0
            deadline = time.monotonic() + 90

            def take(buffer: Any, *_: Any) -> None:
                nonlocal got
                writer_id, seq = check(buffer)
                assert seq == next_seq[writer_id], f"writer {writer_id}: {seq} after " \
                                                   f"{next_seq[writer_id] - 1}"
                next_seq[writer_id] += 1
                got += 1

            assembler = shmbus.FragmentAssembler(take)
            while got < total:
                assert time.monotonic() < deadline, f"{got} of {total} messages"
                if mode == "messages":
                    for m in sub.messages(timeout=0.5):
                        take(m)
                        if got == total:
                            break
                elif mode == "views":
                    view = sub.take_view()
                    if view is None:
                        sub.wait(0.05)
                        continue
                    with view:
                        take(view.buffer)
                else:
                    if not sub.poll(assembler, 10):
                        sub.wait(0.05)
            extra = [check(m) for m in sub.messages(timeout=linger)] if linger else []
            assert not extra, f"messages past the expected ones: {extra}"
            results.put({"kind": "read", "name": name, "count": got, "next": next_seq})
    guard(results, "read", name, body)


def half_filled_writer(context: shmbus.Context, stream: int, writer_id: int, sizes: list[int],
                       claim_length: int, results: Any) -> None:
    """Publish one message per size on a concurrent publication, then claim a block of
    ``claim_length`` bytes past the log's max (a LargeClaim), write the first half of message
    ``len(sizes)`` into it and sleep, uncommitted, until killed."""
    def body() -> None:
        bus = shmbus.connect(context)
        pub = bus.add_publication("aeron:ipc", stream)
        _connected(pub)
        for seq, size in enumerate(sizes):
            pub.publish(message(writer_id, seq, size), timeout=30.0)
        assert claim_length > pub.max_message_length
        deadline = time.monotonic() + 30
        claim = pub.try_claim(claim_length)
        while not claim:
            assert time.monotonic() < deadline, f"no claim: {claim.result}"
            time.sleep(0.01)
            claim = pub.try_claim(claim_length)
        assert isinstance(claim, shmbus.LargeClaim) and claim.buffer is not None
        data = message(writer_id, len(sizes), claim_length)
        half = claim_length // 2
        claim.buffer[:half] = data[:half]
        results.put({"kind": "filling", "name": f"writer {writer_id}", "pid": os.getpid()})
        time.sleep(600)  # parked with the block half made, until the test kills it
    guard(results, "filling", f"writer {writer_id}", body)


def holder(context: shmbus.Context, stream: int, results: Any) -> None:
    """Take a view of the first message and hold it until killed."""
    def body() -> None:
        bus = shmbus.connect(context)
        sub = bus.add_subscription("aeron:ipc", stream)
        results.put({"kind": "ready", "name": "holder", "pid": os.getpid()})
        deadline = time.monotonic() + 30
        view = None
        while view is None:
            assert time.monotonic() < deadline, "no message to hold"
            view = sub.take_view()
            if view is None:
                sub.wait(0.05)
        writer_id, seq = check(view.buffer)
        results.put({"kind": "holding", "name": "holder", "zero_copy": view.zero_copy,
                     "seq": seq, "position": sub.images[0].position})
        time.sleep(600)  # parked holding the view, until the test kills it
    guard(results, "holding", "holder", body)


def array_for(i: int) -> np.ndarray:
    """The i-th array of array_writer: sizes from 8 B to 12 MiB, several dtypes and orders."""
    rng = np.random.default_rng(i)
    side = [1, 7, 100, 600, 1200][i % 5]
    kind = i % 4
    if kind == 0:
        return rng.random((side, side))
    if kind == 1:
        return np.asfortranarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))
    if kind == 2:
        out = np.zeros(side * 4, dtype=[("t", "M8[us]"), ("v", "<f4", (2,)), ("k", "i2")])
        out["t"] = rng.integers(0, 2**50, side * 4).astype("M8[us]")
        out["v"] = rng.random((side * 4, 2))
        return out
    return np.array(float(i))


def _publish_arrays(context: shmbus.Context, stream: int, count: int, results: Any,
                    make: Callable[[int], np.ndarray], name: str) -> None:
    """Publish make(0 .. count - 1) with publish_array, then report as ``name``."""
    def body() -> None:
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", stream)
            _connected(pub)
            for i in range(count):
                pub.publish_array(make(i), timeout=30.0)
            results.put({"kind": "sent", "name": name, "count": count})
    guard(results, "sent", name, body)


def array_writer(context: shmbus.Context, stream: int, count: int, results: Any) -> None:
    """Publish array_for(0 .. count - 1) with publish_array."""
    _publish_arrays(context, stream, count, results, array_for, "array writer")


def batch_writer(context: shmbus.Context, stream: int, writer_id: int, sizes: list[int],
                 batch: int, rows: int, results: Any) -> None:
    """Publish one message per size with publish_many, ``batch`` at a time (large and small
    mixed in each batch), then ``rows`` more of the last size as one 2-D array (a row each)."""
    def body() -> None:
        with shmbus.connect(context) as bus:
            pub = bus.add_publication("aeron:ipc", stream)
            _connected(pub)
            messages = [message(writer_id, seq, size) for seq, size in enumerate(sizes)]
            for at in range(0, len(messages), batch):
                assert pub.publish_many(messages[at:at + batch], timeout=30.0) == \
                    len(messages[at:at + batch])
            table = np.stack([np.frombuffer(message(writer_id, len(sizes) + row, sizes[-1]),
                                            np.uint8) for row in range(rows)])
            assert pub.publish_many(table, timeout=30.0) == rows
            results.put({"kind": "sent", "name": f"writer {writer_id}",
                         "count": len(sizes) + rows})
    guard(results, "sent", f"writer {writer_id}", body)


FRAME_SHAPE = (600, 800)  # float64: 3.7 MiB, past the default log's max message


def frame_for(i: int) -> np.ndarray:
    """The i-th array of frame_writer: FRAME_SHAPE float64 from a seeded generator, its first
    element the sequence number; every other one Fortran-ordered."""
    frame = np.random.default_rng(i).random(FRAME_SHAPE)
    frame[0, 0] = i
    return np.asfortranarray(frame) if i % 2 else frame


def frame_writer(context: shmbus.Context, stream: int, count: int, results: Any) -> None:
    """Publish frame_for(0 .. count - 1) with publish_array (the readers subscribed before
    this starts)."""
    _publish_arrays(context, stream, count, results, frame_for, "frame writer")


def frame_reader(context: shmbus.Context, stream: int, count: int, order: str,
                 results: Any) -> None:
    """Read ``count`` frames with ``arrays(out=...)`` into one array of ``order`` ("C" or
    "F"), each checked element for element against frame_for(seq) in sequence; reports the
    crc32 of every frame's bytes and whether ``out`` was the array handed out every time."""
    name = f"frame reader {order}"

    def body() -> None:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream)
            results.put({"kind": "ready", "name": name, "pid": os.getpid()})
            out = np.empty(FRAME_SHAPE, order=order)
            crcs, same_out = [], True
            for seq, array in enumerate(sub.arrays(timeout=30, out=out)):
                same_out = same_out and array is out
                expected = frame_for(seq)
                assert array[0, 0] == seq, f"frame {int(array[0, 0])} where {seq} was due"
                assert np.array_equal(array, expected), f"frame {seq} differs"
                crcs.append(zlib.crc32(np.ascontiguousarray(array).tobytes()))
                if seq == count - 1:
                    break
            results.put({"kind": "read", "name": name, "crcs": crcs, "same_out": same_out,
                         "out_order_kept": bool(out.flags.f_contiguous if order == "F"
                                                else out.flags.c_contiguous)})
    guard(results, "read", name, body)


#: the writer id of the message that ends a stream of streaming_writer (its seq: how many
#: messages were accepted before it)
END_WRITER = 2


def streaming_writer(context: shmbus.Context, stream: int, length: int, stop: Any,
                     results: Any, timeout: float) -> None:
    """Publish writer 1's messages of ``length`` bytes on an exclusive publication as fast as
    they are accepted until ``stop`` is set, then an END_WRITER message. A message not accepted
    (back-pressure or no subscriber through a driver restart: publish's timeout; no room for
    its block: OSError ENOSPC, nothing reserved) is published again with the same sequence
    number, after a short sleep. Reports the sessions it published into and how many offers
    each kind of refusal took; everything is bounded by ``timeout`` seconds."""
    import errno

    name = "streaming writer"

    def body() -> None:
        deadline = time.monotonic() + timeout
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", stream)
            results.put({"kind": "writer-ready", "name": name})
            _connected(pub)
            sessions: dict[int, list[int]] = {}
            refused = {"enospc": 0, "timeout": 0}
            seq = 0
            while True:
                last = stop.is_set()
                data = message(END_WRITER, seq, 100) if last else message(1, seq, length)
                while True:
                    assert time.monotonic() < deadline, f"seq {seq} not accepted: {refused}"
                    session_id = pub.session_id
                    try:
                        pub.publish(data, timeout=2.0)
                        break
                    except shmbus.PublicationError as e:
                        if e.code == shmbus.codes.CLOSED:
                            raise
                        refused["timeout"] += 1
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        refused["enospc"] += 1
                        time.sleep(0.02)
                if last:
                    break
                sessions.setdefault(session_id, [seq, seq])[1] = seq
                seq += 1
            results.put({"kind": "written", "name": name, "count": seq, "sessions": sessions,
                         "refused": refused, "reconnects": bus.reconnects})
    guard(results, "written", name, body)


def streaming_reader(context: shmbus.Context, stream: int, results: Any,
                     timeout: float) -> None:
    """Read streaming_writer's messages as views until its END_WRITER message, checking each
    (length, checksum) and its sequence: consecutive within a session; a new session (the
    publication rebound to a new driver's log) may start further on (what the old log held
    unread is lost with it), never before. Reports ``reader-ready``, ``reader-streaming``
    after 5 messages, then what it read."""
    name = "streaming reader"

    def body() -> None:
        deadline = time.monotonic() + timeout
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream)
            results.put({"kind": "reader-ready", "name": name})
            count, last, session = 0, -1, None
            sessions: dict[int, list[int]] = {}
            jumps: list[tuple[int, int]] = []
            while True:
                assert time.monotonic() < deadline, f"{count} messages read, last {last}"
                view = sub.take_view()
                if view is None:
                    sub.wait(0.05)
                    continue
                with view:
                    writer_id, seq = check(view.buffer)
                    if writer_id == END_WRITER:
                        assert seq == last + 1, f"the end after {seq} messages, {last} read last"
                        break
                    if view.session_id == session:
                        assert seq == last + 1, f"seq {seq} after {last} in one session"
                    else:
                        assert seq > last, f"seq {seq} after {last} in a new session"
                        if seq != last + 1:
                            jumps.append((last, seq))
                        session = view.session_id
                    sessions.setdefault(session, [seq, seq])[1] = seq
                    last = seq
                    count += 1
                    if count == 5:
                        results.put({"kind": "reader-streaming", "name": name})
            results.put({"kind": "read", "name": name, "count": count, "last": last,
                         "sessions": sessions, "jumps": jumps, "reconnects": bus.reconnects})
    guard(results, "read", name, body)
