"""Spawn targets for tests/shmbus/driver/test_driver_processes.py: clients of a real driver.

Every function here runs in a process of its own (multiprocessing "spawn" context), connects
with ``shmbus.connect(context)`` using the test's pickled :class:`shmbus.Context`, and reports
back through a multiprocessing queue as plain dicts (``kind`` says which report it is). Every
loop is bounded by a deadline; empty polls and back-pressure idle with
:class:`shmbus.idle_strategies.BackoffIdleStrategy` (the machine has two cores: nothing busy-spins).

Messages (``make_message``): a 16-byte head ``(writer u16, flags u16, crc32 u32, seq u64)``
then a body cut from a random block shared by every process. The crc covers writer, flags,
seq and the body; the body length is a function of (writer, seq), so a reader checks the
framing, the checksum and the order of every message of every writer (:class:`Checker`).
Every message fits one frame (no fragmentation), so the frame flags must always say B|E.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import shmbus
from shmbus.settings import codes
from shmbus.shm.log_buffer import UNFRAGMENTED

HEAD = struct.Struct("<HHIQ")  # writer, flags, crc32, seq
_CRC_PREFIX = struct.Struct("<HHQ")  # what the crc covers before the body: writer, flags, seq
LAST = 1  # flag: the writer's last message
MAX_BODY = 600
BLOCK_LENGTH = 1 << 16
_BLOCK = random.Random(20240611).randbytes(BLOCK_LENGTH)
MAX_ERROR_SAMPLES = 20


# -- messages -----------------------------------------------------------------------------------


def body_length(writer: int, seq: int) -> int:
    """The body length of a writer's message ``seq`` (0..MAX_BODY)."""
    return (seq * 7919 + writer * 104729) % (MAX_BODY + 1)


def make_message(writer: int, seq: int, flags: int = 0) -> bytes:
    length = body_length(writer, seq)
    offset = (seq * 977 + writer * 131) % (BLOCK_LENGTH - MAX_BODY)
    body = _BLOCK[offset:offset + length]
    crc = zlib.crc32(body, zlib.crc32(_CRC_PREFIX.pack(writer, flags, seq)))
    return HEAD.pack(writer, flags, crc, seq) + body


class Checker:
    """Checks every message of every writer: framing, crc32, length and sequence.

    A sequence that jumps forward is an error unless ``allow_gaps`` (a subscriber that rejoins
    the live stream); then the jump is recorded in ``gaps``. A sequence that goes back is always
    an error. ``writers`` (optional) are the only writer ids expected.
    """

    def __init__(self, *, allow_gaps: bool = False, writers: set[int] | None = None,
                 stream_id: int | None = None) -> None:
        self.allow_gaps = allow_gaps
        self.writers = writers
        self.stream_id = stream_id
        self.next_seq: dict[int, int] = {}
        self.counts: dict[int, int] = {}
        self.gaps: list[tuple[int, int, int]] = []
        self.finished: set[int] = set()
        self.sessions: set[int] = set()
        self.count = 0
        self.error_count = 0
        self.errors: list[str] = []
        self.last_seq = -1
        self.last_position = 0

    def _error(self, text: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERROR_SAMPLES:
            self.errors.append(text)

    def __call__(self, buffer: memoryview, header: Any) -> None:
        self.sessions.add(header.session_id)
        self.last_position = header.position
        where = f"at position {header.position} (session {header.session_id})"
        if header.flags & UNFRAGMENTED != UNFRAGMENTED:
            self._error(f"fragment flags 0x{header.flags:x} {where}")
            return
        if self.stream_id is not None and header.stream_id != self.stream_id:
            self._error(f"stream id {header.stream_id}, expected {self.stream_id} {where}")
            return
        if len(buffer) < HEAD.size:
            self._error(f"{len(buffer)}-byte message {where}")
            return
        writer, flags, crc, seq = HEAD.unpack_from(buffer)
        body = buffer[HEAD.size:]
        if zlib.crc32(body, zlib.crc32(_CRC_PREFIX.pack(writer, flags, seq))) != crc:
            self._error(f"crc mismatch (writer {writer}, seq {seq}) {where}")
            return
        if len(body) != body_length(writer, seq):
            self._error(f"writer {writer} seq {seq}: body of {len(body)} bytes, expected "
                        f"{body_length(writer, seq)} {where}")
            return
        if self.writers is not None and writer not in self.writers:
            self._error(f"unexpected writer {writer} {where}")
            return
        expected = self.next_seq.get(writer, 0)
        if seq != expected:
            if seq > expected and self.allow_gaps:
                self.gaps.append((writer, expected, seq))
            else:
                self._error(f"writer {writer}: seq {seq}, expected {expected} {where}")
        self.next_seq[writer] = seq + 1
        self.counts[writer] = self.counts.get(writer, 0) + 1
        self.count += 1
        self.last_seq = seq
        if flags & LAST:
            self.finished.add(writer)

    def summary(self) -> dict[str, Any]:
        return {"count": self.count, "counts": dict(self.counts), "errors": self.errors,
                "error_count": self.error_count, "gaps": self.gaps,
                "sessions": sorted(self.sessions), "finished": sorted(self.finished),
                "next_seq": dict(self.next_seq), "position": self.last_position}


def _wait(event: Any, deadline: float, what: str) -> None:
    if not event.wait(max(0.0, deadline - time.monotonic())):
        raise TimeoutError(f"timed out waiting for {what}")


def offer_counted(publication: Any, message: bytes, deadline: float, stats: dict[str, int],
                  what: str = "offer") -> int:
    """Offer until accepted, idling (back-off) on back-pressure, retrying ADMIN_ACTION at once;
    count each refusal by name in ``stats``. CLOSED and MAX_POSITION_EXCEEDED raise
    PublicationError, the ``deadline`` passed TimeoutError (naming ``what``). Returns the
    publication's session id as it was just before the offer that was accepted."""
    idle = shmbus.idle_strategies.BackoffIdleStrategy()
    while True:
        session_id = int(publication.session_id)
        result = publication.offer(message)
        if result > 0:
            return session_id
        if result in (codes.CLOSED, codes.MAX_POSITION_EXCEEDED):
            raise shmbus.PublicationError(result)
        name = codes.result_name(result)
        stats[name] = stats.get(name, 0) + 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not accepted before the deadline ({name})")
        if result != codes.ADMIN_ACTION:
            idle.idle(0)


def _report_errors(results: Any, kind: str, name: str, body: Callable[[], None]) -> None:
    """Run ``body``; an exception is reported (so the test fails with it) and re-raised."""
    try:
        body()
    except BaseException as e:
        results.put({"kind": kind, "name": name, "exception": f"{type(e).__name__}: {e}"})
        raise


# -- publishers ---------------------------------------------------------------------------------


def publisher(context: shmbus.Context, channel: str, stream_id: int, writer: int,
              count: int | None, start: Any, results: Any, timeout: float, *,
              exclusive: bool = True, stop: Any = None, pause_at: int | None = None,
              paused: Any = None, resume: Any = None, pace_every: int = 0,
              pace_sleep: float = 0.0) -> None:
    """Publishes ``count`` messages (the last flagged LAST), or until ``stop`` then one LAST.

    Reports ``pub-ready`` (registration and session id) before waiting for ``start``, then
    ``pub`` with what it sent and how often it was held back. With ``pause_at`` it sets
    ``paused`` after that many messages and waits for ``resume``. ``pace_every`` messages it
    sleeps ``pace_sleep`` s (a rate, for tests that need a publisher slower than its readers).
    """
    name = f"publisher-{writer}"
    deadline = time.monotonic() + timeout

    def run() -> None:
        with shmbus.connect(context) as bus:
            add = bus.add_exclusive_publication if exclusive else bus.add_publication
            pub = add(channel, stream_id)
            results.put({"kind": "pub-ready", "name": name, "writer": writer,
                         "registration_id": pub.registration_id, "session_id": pub.session_id,
                         "max_payload_length": pub.max_payload_length})
            _wait(start, deadline, "start")
            stats: dict[str, int] = {}
            began = time.monotonic()
            seq = 0
            while True:
                if pause_at is not None and seq == pause_at:
                    paused.set()
                    _wait(resume, deadline, "resume")
                last = (count is not None and seq == count - 1) or (
                    stop is not None and stop.is_set())
                offer_counted(pub, make_message(writer, seq, LAST if last else 0), deadline, stats)
                seq += 1
                if last:
                    break
                if pace_every and seq % pace_every == 0:
                    time.sleep(pace_sleep)
            results.put({"kind": "pub", "name": name, "writer": writer, "sent": seq,
                         "stats": stats, "position": pub.position,
                         "registration_id": pub.registration_id,
                         "elapsed": time.monotonic() - began})

    _report_errors(results, "pub", name, run)


def claim_and_hang(context: shmbus.Context, channel: str, stream_id: int, writer: int,
                   committed: int, go: Any, results: Any, timeout: float) -> None:
    """Publishes ``committed`` messages on a ConcurrentPublication, waits for ``go``, then
    claims a frame, fills it with garbage and never commits: it waits to be killed."""
    name = f"claimer-{writer}"
    deadline = time.monotonic() + timeout

    def run() -> None:
        bus = shmbus.connect(context)
        pub = bus.add_publication(channel, stream_id)
        stats: dict[str, int] = {}
        for seq in range(committed):
            offer_counted(pub, make_message(writer, seq), deadline, stats)
        results.put({"kind": "committed", "name": name, "count": committed,
                     "registration_id": pub.registration_id, "session_id": pub.session_id})
        _wait(go, deadline, "go")
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        while True:
            claim = pub.try_claim(200)
            if claim:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no claim: {codes.result_name(claim.result)}")
            idle.idle(0)
        assert claim.buffer is not None
        claim.buffer[:] = b"\xee" * len(claim.buffer)  # garbage a reader must never see
        results.put({"kind": "claimed", "name": name, "position": claim.result,
                     "pid": os.getpid()})
        threading.Event().wait(max(0.0, deadline - time.monotonic()))  # until SIGKILL

    _report_errors(results, "claimed", name, run)


def multi_stream_publisher(context: shmbus.Context, stream_ids: list[int], count: int,
                           start: Any, results: Any, timeout: float) -> None:
    """One exclusive publication per stream; ``count`` messages on each, round-robin over the
    streams (a back-pressured stream is skipped until the next round). Writer id = stream id."""
    name = f"multi-publisher-{stream_ids[0]}"
    deadline = time.monotonic() + timeout

    def run() -> None:
        with shmbus.connect(context) as bus:
            pubs = {s: bus.add_exclusive_publication("aeron:ipc", s) for s in stream_ids}
            results.put({"kind": "pub-ready", "name": name, "streams": len(pubs)})
            _wait(start, deadline, "start")
            sent = dict.fromkeys(stream_ids, 0)
            held: dict[str, int] = {}
            idle = shmbus.idle_strategies.BackoffIdleStrategy()
            pending = list(stream_ids)
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{sum(sent.values())} messages sent before the "
                                       f"deadline; streams not done: {pending[:10]}...")
                work = 0
                for s in pending:
                    for _ in range(8):
                        seq = sent[s]
                        flags = LAST if seq == count - 1 else 0
                        result = pubs[s].offer(make_message(s, seq, flags))
                        if result < 0:
                            key = codes.result_name(result)
                            held[key] = held.get(key, 0) + 1
                            break
                        sent[s] = seq + 1
                        work += 1
                        if sent[s] == count:
                            break
                pending = [s for s in pending if sent[s] < count]
                idle.idle(work)
            results.put({"kind": "pub", "name": name, "sent": sent, "stats": held})

    _report_errors(results, "pub", name, run)


# -- subscribers --------------------------------------------------------------------------------


def subscriber(context: shmbus.Context, channel: str, stream_id: int, name: str,
               expected: int | None, results: Any, timeout: float, *,
               sleep_per_batch: float = 0.0, batch: int = 100,
               writers: set[int] | None = None) -> None:
    """Reads until ``expected`` messages (or, when None, a LAST from every writer in
    ``writers``), checking each. Sleeps ``sleep_per_batch`` s after every non-empty poll of
    up to ``batch`` fragments (a slow consumer). Reports ``sub-ready`` then ``sub``; ``max_stall``
    is the longest time between two messages."""
    deadline = time.monotonic() + timeout

    def run() -> None:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription(channel, stream_id)
            results.put({"kind": "sub-ready", "name": name,
                         "registration_id": sub.registration_id})
            checker = Checker(writers=writers, stream_id=stream_id)
            idle = shmbus.idle_strategies.BackoffIdleStrategy()
            last_message = None
            max_stall = 0.0

            def done() -> bool:
                if expected is not None:
                    return checker.count >= expected
                return writers is not None and checker.finished >= writers

            while not done():
                if time.monotonic() > deadline:
                    break
                n = sub.poll(checker, batch)
                if n:
                    now = time.monotonic()
                    if last_message is not None:
                        max_stall = max(max_stall, now - last_message)
                    last_message = now
                    idle.reset()
                    if sleep_per_batch:
                        time.sleep(sleep_per_batch)
                else:
                    idle.idle(0)
            images = [(i.session_id, i.position) for i in sub.images]
            results.put({"kind": "sub", "name": name, "timed_out": not done(),
                         "max_stall": max_stall, "images": images, **checker.summary()})

    _report_errors(results, "sub", name, run)


def untethered_subscriber(context: shmbus.Context, stream_id: int, slow_sleep: float,
                          after_rejoin: int, stop: Any, results: Any, timeout: float) -> None:
    """An untethered subscriber (``tether=false``) that first reads one message every
    ``slow_sleep`` s until its image goes unavailable; once the image is available again it
    reads at full speed, sets ``stop`` after ``after_rejoin`` messages and reads to the
    publisher's LAST. Records the image callbacks in order."""
    name = "untethered"
    deadline = time.monotonic() + timeout

    def run() -> None:
        events: list[dict[str, Any]] = []
        checker = Checker(allow_gaps=True, stream_id=stream_id)

        def available(image: shmbus.Image) -> None:
            events.append({"event": "available", "session_id": image.session_id,
                           "join_position": image.join_position, "time": time.monotonic()})

        def unavailable(image: shmbus.Image) -> None:
            events.append({"event": "unavailable", "session_id": image.session_id,
                           "last_position": checker.last_position,
                           "last_seq": checker.last_seq, "time": time.monotonic()})

        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc?tether=false", stream_id,
                                       on_available_image=available,
                                       on_unavailable_image=unavailable)
            results.put({"kind": "sub-ready", "name": name,
                         "registration_id": sub.registration_id})
            idle = shmbus.idle_strategies.BackoffIdleStrategy()
            first_read = None
            rejoined_count = 0
            while not checker.finished and time.monotonic() < deadline:
                rejoined = sum(e["event"] == "available" for e in events) >= 2
                if not rejoined:
                    # slow phase: one message at a time; keeps servicing the driver's events
                    n = sub.poll(checker, 1)
                    if n:
                        if first_read is None:
                            first_read = time.monotonic()
                        time.sleep(slow_sleep)
                    else:
                        idle.idle(0)
                    continue
                n = sub.poll(checker, 100)
                rejoined_count += n
                if rejoined_count >= after_rejoin:
                    stop.set()
                idle.idle(n)
            results.put({"kind": "sub", "name": name, "events": events,
                         "first_read": first_read, "rejoined_count": rejoined_count,
                         "timed_out": not checker.finished, **checker.summary()})

    _report_errors(results, "sub", name, run)


def stalling_subscriber(context: shmbus.Context, channel: str, stream_id: int, read: int,
                        results: Any, timeout: float) -> None:
    """Reads ``read`` messages, reports ``stalled`` with its position, then stops reading
    (holding the publisher back) and waits to be killed."""
    name = "stalling"
    deadline = time.monotonic() + timeout

    def run() -> None:
        bus = shmbus.connect(context)
        sub = bus.add_subscription(channel, stream_id)
        results.put({"kind": "sub-ready", "name": name, "registration_id": sub.registration_id,
                     "pid": os.getpid()})
        checker = Checker(stream_id=stream_id)
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        while checker.count < read:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {checker.count} of {read} messages")
            idle.idle(sub.poll(checker, read - checker.count))
        results.put({"kind": "stalled", "name": name, **checker.summary()})
        threading.Event().wait(max(0.0, deadline - time.monotonic()))  # until SIGKILL

    _report_errors(results, "stalled", name, run)


def driver_loss_subscriber(context: shmbus.Context, stream_id: int, results: Any,
                           timeout: float) -> None:
    """Subscribes, then polls until a call raises; reports the exception and when."""
    name = "driver-loss"
    deadline = time.monotonic() + timeout
    with shmbus.connect(context) as bus:
        sub = bus.add_subscription("aeron:ipc", stream_id)
        results.put({"kind": "sub-ready", "name": name, "registration_id": sub.registration_id})
        checker = Checker(stream_id=stream_id)
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        try:
            while time.monotonic() < deadline:
                idle.idle(sub.poll(checker, 10))
        except shmbus.ShmbusError as e:
            results.put({"kind": "raised", "name": name, "type": type(e).__name__,
                         "message": str(e), "time": time.monotonic(), **checker.summary()})
            return
        results.put({"kind": "raised", "name": name, "type": None, "message": "",
                     "time": time.monotonic(), **checker.summary()})


def multi_stream_subscriber(context: shmbus.Context, stream_ids: list[int], count: int,
                            name: str, results: Any, timeout: float) -> None:
    """Subscribes to every stream and reads until ``count`` messages arrived on each."""
    deadline = time.monotonic() + timeout

    def run() -> None:
        with shmbus.connect(context) as bus:
            subs = {s: bus.add_subscription("aeron:ipc", s) for s in stream_ids}
            results.put({"kind": "sub-ready", "name": name, "streams": len(subs)})
            checkers = {s: Checker(writers={s}, stream_id=s) for s in stream_ids}
            idle = shmbus.idle_strategies.BackoffIdleStrategy()
            pending = list(stream_ids)
            while pending and time.monotonic() < deadline:
                work = 0
                for s in pending:
                    work += subs[s].poll(checkers[s], 100)
                pending = [s for s in pending if checkers[s].count < count]
                idle.idle(work)
            results.put({"kind": "sub", "name": name, "timed_out": bool(pending),
                         "streams": {s: c.summary() for s, c in checkers.items()}})

    _report_errors(results, "sub", name, run)


# -- a driver with its own cnc lengths -----------------------------------------------------------


def run_driver(context: shmbus.Context, lengths: Any) -> None:
    """A driver over ``context.dir`` with the given CncLengths; SIGTERM stops it cleanly."""
    from shmbus.driver.media_driver import Driver

    driver = Driver(context, lengths=lengths)
    driver.start()
    signal.signal(signal.SIGTERM, lambda *_: driver.stop())
    driver.run()
