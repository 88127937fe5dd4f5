# Run from the repository root: .venv/bin/python tools/bench.py [--quick] [--json out.json]
"""shmbus benchmark: one-way throughput and ping-pong latency between two processes.

Every measurement runs in two fresh processes (multiprocessing, spawn) that the parent starts
and watches; the parent only sleeps on the results queue while they run.

Throughput (one writer process, one reader process, for each message size): the writer sends
for a fixed duration, then a STOP message; the rate is messages / (time the reader saw STOP -
time the writer started), both from CLOCK_MONOTONIC, which is shared by the processes. Every
message carries its sequence number at its head and its tail; the reader checks both for every
message (in place, or vectorised for the batch API) and the run fails unless the reader got
exactly the messages the writer sent, in order, intact.

* shmbus offer/poll: ExclusivePublication.offer() loop; Image.poll(handler, 256) where the
  handler unpacks and checks the head and tail sequence numbers in place (zero copy). Messages
  longer than mtu - 32 (4 KiB with the default mtu of 1408) arrive as fragments and go through
  shmbus.FragmentAssembler first, as an application's would.
* shmbus offer/poll +copy: the same, but the handler first copies the payload (bytes(buffer)),
  as an application that keeps messages would: what peers that hand out a copy always pay.
* shmbus offer_many/poll_batch: offer_many() of a 2-D numpy array of 1024 rows; poll_batch()
  with a limit of 1024 and the checks done with numpy over the whole batch (per fragment flags
  when messages are fragmented).
* mp.Queue (ctx.Queue(maxsize=1024): put(bytes) / get()), mp.Pipe (Pipe(duplex=False):
  send_bytes / recv_bytes), posix_ipc.MessageQueue (the system's default depth: send /
  receive), pyzmq PAIR over ipc:// (send(copy=True) of a reused buffer, recv(copy=False) for
  4 KiB and recv() below). zmq connects and exchanges a hello before the clock starts, and the
  sender waits for an ack before closing (libzmq can drop the last messages of an ipc socket
  closed right after sending them, LINGER or not).

Ping-pong: 32 B messages, echoed; the pinger times each round trip (perf_counter_ns) for the
run's duration and drops the first 10% (at most 1000) as warm-up. shmbus uses two streams, ping
and pong, each a stream of its own.

Idle strategies: a shmbus side that has nothing to do (reader: nothing to read; writer:
back-pressured) uses the default back-off strategy (spin 10, yield 20, then sleep from 1 us to
1 ms, doubling; a 1 us time.sleep lasts ~60-90 us on Linux). Peers use their natural blocking
calls. The ping-pong runs shmbus twice: both sides busy-spinning, and both on the default
back-off. Busy-spinning needs a free core for each side: on a 2-core machine anything else
runnable makes those numbers collapse (the report warns when busy-spin loses to back-off).

Until the driver lands, a shmbus stream is a tests/standalone_stream.StandaloneStream, and one
process stands in for the driver's flow control (publication limit = reader position + window,
cleaning behind the reader): in throughput runs the reader, after each poll (a cheap check; the
limit moves every window / 8); in ping-pong runs the pinger, for both streams, between round
trips, so that work is off the timed path as a real driver's would be. All of this is in the
"shmbus setup" section: create_stream() and ShmbusStream are the only code that changes when
shmbus.connect() arrives.

Bounded waits: shmbus loops and barriers check deadlines, posix_ipc and zmq calls have
timeouts; mp.Queue and mp.Pipe block natively (a timeout would add a poll() per message), so
for them, as for everything, the parent's watchdog terminates a run that overruns its deadline.

Fan-out over the network (--fanout after the above, --fanout-only instead of it): the section
of tools/bench_fanout.py, with this run's --quick, --duration, --repeat and --timeout: one
publisher's throughput to one receiving host by unicast, and to two by multicast and by MDC
(manual and dynamic), between network namespaces (needs root); its table follows this one and
its report goes into --json as "fanout".
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import platform
import queue
import shutil
import struct
import sys
import tempfile
import time
import traceback
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

SIZES = (32, 256, 4096)
LATENCY_SIZE = 32
STOP = -1  # sequence number of the message that ends a run
QUEUE_MAXSIZE = 1024  # mp.Queue bound (unbounded, a fast writer would buffer gigabytes)
POLL_LIMIT = 256  # fragment limit of Image.poll in throughput runs
BATCH_ROWS = 1024  # rows of the offer_many array, and the poll_batch limit
TERM_LENGTH = 1024 * 1024  # shmbus's default term length: a window of 512 KiB
MAX_SAMPLES = 500_000  # ping-pong round trips kept at most per run
_RUN_IDS = itertools.count()  # names of the files and queues of each run

SHM = "shmbus offer/poll"
SHM_COPY = "shmbus offer/poll +copy"
SHM_BATCH = "shmbus offer_many/poll_batch"
QUEUE = "mp.Queue"
PIPE = "mp.Pipe"
POSIX = "posix_ipc.MessageQueue"
ZMQ = "zmq PAIR ipc://"
PEERS = (QUEUE, PIPE, POSIX, ZMQ)
THROUGHPUT_TRANSPORTS = (SHM, SHM_COPY, SHM_BATCH, *PEERS)

IDLE_SHM = "back-off / back-off"
IDLE_SPIN = "busy-spin / busy-spin"
IDLE_PEER = "blocking / blocking"


class BenchError(RuntimeError):
    """A run that failed: timed out, crashed, or delivered wrong messages."""


def _use_repo_imports() -> None:
    """Make shmbus and tests.standalone_stream importable (the package is not installed)."""
    root = str(ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


def _codec(size: int) -> struct.Struct:
    """A message: its sequence number in the first and in the last 8 bytes."""
    return struct.Struct(f"<q{size - 16}xq")


# ---------------------------------------------------------------------------------------------
# shmbus setup: the only code that knows how a stream is made.
#
# Today a stream is a StandaloneStream (a log and a positions file in a directory) and some
# process stands in for the driver's flow control by calling driver_duty(). When the driver
# lands: StreamSpec becomes (channel, stream_id) (plus a picklable shmbus.Context),
# create_stream() only picks the id, ShmbusStream opens bus.add_exclusive_publication() /
# bus.add_subscription() (waiting for the image, with a deadline), and driver_duty() does
# nothing.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamSpec:
    """Where a stream lives: made in the parent, handed to the spawned processes."""

    directory: str
    term_length: int


def create_stream(root: Path, name: str, term_length: int = TERM_LENGTH,
                  mtu: int | None = None) -> StreamSpec:
    """Make a stream's files in the parent; the children open them by path."""
    _use_repo_imports()
    from tests.standalone_stream import StandaloneStream

    directory = root / name
    directory.mkdir()
    log_args = {"term_length": term_length} if mtu is None else {"term_length": term_length,
                                                                  "mtu": mtu}
    StandaloneStream(directory, create=True, **log_args).close()
    return StreamSpec(str(directory), term_length)


class ShmbusStream:
    """One process's handle on a stream: its exclusive publication and/or its image.

    Exactly one process per stream opens it with ``driver=True`` and calls driver_duty().
    """

    def __init__(self, spec: StreamSpec, *, driver: bool = False) -> None:
        _use_repo_imports()
        from shmbus.driver.ipc_flow_control import ipc_window
        from shmbus.shm.position import Position
        from tests.standalone_stream import StandaloneStream, reader_offset

        self._stream = StandaloneStream(spec.directory)
        self.max_payload_length = self._stream.log.descriptor.mtu - 32
        # the reader's position as the driver sees it: readable from any process
        self._reader_position = Position(self._stream.positions, reader_offset(0))
        self._duty_step = ipc_window(spec.term_length) // 8  # the flow control's trip gain
        self._next_duty = 0
        self._driver = driver
        self._publication: Any = None
        self._image: Any = None
        if driver:
            # Take the flow control now, before the writer may write: StandaloneStream makes
            # its IpcFlowControl on the first update_limit(), and that starts cleaning at the
            # producer position of that moment, so frames written before it would never be
            # cleaned and a reader would meet their stale lengths one lap later.
            self.driver_duty()

    def publication(self) -> Any:
        """The stream's ExclusivePublication (one writer)."""
        if self._publication is None:
            self._publication = self._stream.publication(exclusive=True)
        return self._publication

    def image(self) -> Any:
        """The stream's Image for reader 0."""
        if self._image is None:
            self._image = self._stream.image(0)
        return self._image

    def driver_duty(self) -> None:
        """Stand in for the driver: raise the limit behind the reader, cleaning behind it.

        Exactly one process per stream calls this. Cheap until the reader has moved by the
        flow control's trip gain (window / 8), when the limit would move anyway.
        """
        if not self._driver:
            raise RuntimeError("driver_duty() on a stream not opened with driver=True")
        position = self._reader_position.get()
        if position >= self._next_duty:
            self._stream.update_limit([position])
            self._next_duty = position + self._duty_step

    def close(self) -> None:
        if self._publication is not None:
            self._publication.close()
        if self._image is not None:
            self._image.close()
        self._stream.close()


# ---------------------------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------------------------


@dataclass
class PeerEnd:
    """One process's end of a peer link: where it sends (tx) and receives (rx)."""

    kind: str
    tx: Any = None
    rx: Any = None
    bind: bool = False  # zmq: this end binds
    zmq_copy: bool = True  # zmq: recv(copy=...)


def make_peer_link(ctx: Any, kind: str, root: Path, name: str, size: int,
                   two_way: bool) -> tuple[PeerEnd, PeerEnd, Callable[[], None]]:
    """(a, b, cleanup): a sends to b, and with two_way b sends back to a."""
    if kind == QUEUE:
        fwd = ctx.Queue(maxsize=QUEUE_MAXSIZE)
        back = ctx.Queue(maxsize=QUEUE_MAXSIZE) if two_way else None
        return PeerEnd(kind, fwd, back), PeerEnd(kind, back, fwd), lambda: None
    if kind == PIPE:
        fwd_r, fwd_w = ctx.Pipe(duplex=False)
        back_r, back_w = ctx.Pipe(duplex=False) if two_way else (None, None)
        return PeerEnd(kind, fwd_w, back_r), PeerEnd(kind, back_w, fwd_r), lambda: None
    if kind == POSIX:
        import posix_ipc

        names = [f"/shmbus-bench-{os.getpid()}-{name}-{d}" for d in ("f", "b")[:1 + two_way]]
        for n in names:
            posix_ipc.MessageQueue(n, posix_ipc.O_CREX).close()

        def cleanup() -> None:
            for n in names:
                try:
                    posix_ipc.unlink_message_queue(n)
                except posix_ipc.ExistentialError:
                    pass

        back_name = names[1] if two_way else None
        return PeerEnd(kind, names[0], back_name), PeerEnd(kind, back_name, names[0]), cleanup
    if kind == ZMQ:
        endpoint = f"ipc://{root}/{name}.zmq"
        copy = size < 4096
        a = PeerEnd(kind, endpoint, endpoint if two_way else None, zmq_copy=copy)
        b = PeerEnd(kind, endpoint if two_way else None, endpoint, bind=True, zmq_copy=copy)
        return a, b, lambda: None
    raise ValueError(f"unknown peer {kind!r}")


def open_peer(end: PeerEnd, timeout_s: float) -> tuple[Callable[[Any], Any],
                                                       Callable[[], Any], Callable[[], None]]:
    """(send, recv, close) for this end, in the child process."""
    if end.kind == QUEUE:
        tx, rx = end.tx, end.rx

        def send(message: Any) -> None:
            tx.put(bytes(message))

        return send, rx.get if rx is not None else None, lambda: None
    if end.kind == PIPE:
        return (end.tx.send_bytes if end.tx is not None else None,
                end.rx.recv_bytes if end.rx is not None else None, lambda: None)
    if end.kind == POSIX:
        import posix_ipc

        txq = posix_ipc.MessageQueue(end.tx) if end.tx else None
        rxq = posix_ipc.MessageQueue(end.rx) if end.rx else None
        tx_send = txq.send if txq else None
        rx_receive = rxq.receive if rxq else None

        def send(message: Any) -> None:
            tx_send(message, timeout_s)

        def recv() -> Any:
            return rx_receive(timeout_s)[0]

        def close() -> None:
            for q in (txq, rxq):
                if q is not None:
                    q.close()

        return send, recv, close
    if end.kind == ZMQ:
        import zmq

        zctx = zmq.Context()
        sock = zctx.socket(zmq.PAIR)
        ms = int(timeout_s * 1000)
        sock.setsockopt(zmq.LINGER, ms)
        sock.setsockopt(zmq.SNDTIMEO, ms)
        sock.setsockopt(zmq.RCVTIMEO, ms)
        endpoint = end.tx or end.rx
        # connect first, so the timed part never waits for zmq's reconnect interval
        if end.bind:
            sock.bind(endpoint)
            sock.recv()
        else:
            sock.connect(endpoint)
            sock.send(b"hello")
        sock_recv = sock.recv
        if end.zmq_copy:
            recv = sock_recv
        else:
            def recv() -> Any:
                return sock_recv(copy=False)

        def close() -> None:
            # libzmq can drop the last messages of an ipc:// socket closed right after sending
            # them, LINGER or not (libzmq #4660): seen here as a lost STOP. So the end that
            # sent STOP (a, connecting) waits for an ack from the binding end before closing.
            try:
                if end.bind:
                    sock.send(b"")
                else:
                    sock.setsockopt(zmq.RCVTIMEO, 2000)
                    sock_recv()
            except zmq.Again:
                pass  # the ack itself may be lost that way: the counts are checked anyway
            sock.close()
            zctx.term()

        return sock.send, recv, close
    raise ValueError(f"unknown peer {end.kind!r}")


# ---------------------------------------------------------------------------------------------
# Child processes: throughput
# ---------------------------------------------------------------------------------------------


def _child(role: str, fn: Callable[..., dict[str, Any]], args: tuple[Any, ...], barrier: Any,
           results: Any) -> None:
    """Entry point of every spawned process: run fn, report its result or its traceback."""
    try:
        out = fn(barrier, *args)
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the run
        out = {"error": traceback.format_exc(limit=6)}
    out["role"] = role
    results.put(out)


def _offer_retry(offer: Callable[..., int], message: Any, idle: Any, deadline_ns: int) -> None:
    """Offer until accepted: back-off while back-pressured, at once after a rotation."""
    from shmbus import ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED, result_name

    while True:
        result = offer(message)
        if result > 0:
            idle.reset()
            return
        if result in (CLOSED, MAX_POSITION_EXCEEDED):
            raise BenchError(f"offer failed: {result_name(result)}")
        if result != ADMIN_ACTION:
            idle.idle(0)
            if time.monotonic_ns() > deadline_ns:
                raise BenchError(f"offer not accepted before the deadline: {result_name(result)}")


def _peer_writer(barrier: Any, end: PeerEnd, size: int, duration_s: float,
                 timeout_s: float) -> dict[str, Any]:
    send, _, close = open_peer(end, timeout_s)
    pack = _codec(size).pack_into
    message = bytearray(size)
    barrier.wait(timeout_s)
    t0 = time.monotonic_ns()
    end_ns = t0 + int(duration_s * 1e9)
    seq = 0
    try:
        while True:
            pack(message, 0, seq, seq)
            send(message)
            seq += 1
            if not seq & 127 and time.monotonic_ns() >= end_ns:
                break
        pack(message, 0, STOP, STOP)
        send(message)
        close()
    except Exception as e:
        raise BenchError(f"send failed after {seq} messages: {e!r}") from e
    return {"sent": seq, "t0": t0}


def _peer_reader(barrier: Any, end: PeerEnd, size: int, timeout_s: float) -> dict[str, Any]:
    _, recv, close = open_peer(end, timeout_s)
    unpack = _codec(size).unpack_from
    barrier.wait(timeout_s)
    expected = errors = 0
    first_bad = None
    try:
        while True:
            head, tail = unpack(recv())
            if head == expected and tail == head:
                expected += 1
            elif head == STOP:
                break
            else:
                errors += 1
                first_bad = first_bad or f"expected {expected}, got head {head} tail {tail}"
                expected = head + 1
    except Exception as e:
        raise BenchError(f"receive failed after {expected} messages: {e!r}") from e
    t1 = time.monotonic_ns()
    close()
    return {"received": expected, "errors": errors, "first_bad": first_bad, "t1": t1}


def _shm_writer(barrier: Any, spec: StreamSpec, size: int, duration_s: float,
                timeout_s: float) -> dict[str, Any]:
    from shmbus import BackoffIdleStrategy

    stream = ShmbusStream(spec)
    offer = stream.publication().offer
    pack = _codec(size).pack_into
    message = bytearray(size)
    idle = BackoffIdleStrategy()
    barrier.wait(timeout_s)
    t0 = time.monotonic_ns()
    end_ns = t0 + int(duration_s * 1e9)
    deadline = t0 + int(timeout_s * 1e9)
    seq = 0
    while True:
        pack(message, 0, seq, seq)
        if offer(message) < 0:
            _offer_retry(offer, message, idle, deadline)
        seq += 1
        if not seq & 127 and time.monotonic_ns() >= end_ns:
            break
    pack(message, 0, STOP, STOP)
    _offer_retry(offer, message, idle, deadline)
    stream.close()
    return {"sent": seq, "t0": t0}


def _shm_reader(barrier: Any, spec: StreamSpec, size: int, timeout_s: float,
                copy: bool) -> dict[str, Any]:
    from shmbus import BackoffIdleStrategy, FragmentAssembler

    stream = ShmbusStream(spec, driver=True)
    poll = stream.image().poll
    duty = stream.driver_duty
    unpack = _codec(size).unpack_from
    expected = errors = 0
    first_bad = None
    stopped = False

    def bad(head: int, tail: int, header: Any) -> None:
        nonlocal expected, errors, first_bad, stopped
        if head == STOP:
            stopped = True
            return
        errors += 1
        first_bad = first_bad or (f"expected {expected}, got head {head} tail {tail} in the "
                                  f"frame ending at position {header.position}")
        expected = head + 1

    def in_place(buffer: memoryview, header: Any) -> None:
        nonlocal expected
        head, tail = unpack(buffer)
        if head == expected and tail == head:
            expected += 1
        else:
            bad(head, tail, header)

    def copied(buffer: memoryview, header: Any) -> None:
        nonlocal expected
        head, tail = unpack(bytes(buffer))
        if head == expected and tail == head:
            expected += 1
        else:
            bad(head, tail, header)

    handler: Any = copied if copy else in_place
    if size > stream.max_payload_length:
        handler = FragmentAssembler(handler)  # messages over mtu - 32 come in fragments
    idle = BackoffIdleStrategy()
    barrier.wait(timeout_s)
    deadline = time.monotonic_ns() + int(timeout_s * 1e9)
    idled = 0
    while not stopped:
        if poll(handler, POLL_LIMIT):
            if idled:
                idle.reset()
                idled = 0
        else:
            idled += 1
            idle.idle(0)
            if not idled & 63 and time.monotonic_ns() > deadline:
                raise BenchError(f"reader timed out after {expected} messages")
        duty()
    t1 = time.monotonic_ns()
    stream.close()
    return {"received": expected, "errors": errors, "first_bad": first_bad, "t1": t1}


def _shm_batch_writer(barrier: Any, spec: StreamSpec, size: int, duration_s: float,
                      timeout_s: float) -> dict[str, Any]:
    from shmbus import BackoffIdleStrategy

    stream = ShmbusStream(spec)
    publication = stream.publication()
    offer_many = publication.offer_many
    block = np.zeros((BATCH_ROWS, size), np.uint8)
    words = block.view("<i8")  # (rows, size / 8): sequence numbers in the first and last word
    ramp = np.arange(BATCH_ROWS, dtype=np.int64)
    idle = BackoffIdleStrategy()
    message = bytearray(size)
    barrier.wait(timeout_s)
    t0 = time.monotonic_ns()
    end_ns = t0 + int(duration_s * 1e9)
    deadline = t0 + int(timeout_s * 1e9)
    seq = 0
    while True:
        np.add(ramp, seq, out=words[:, 0])
        words[:, -1] = words[:, 0]
        done = 0
        while done < BATCH_ROWS:
            result = offer_many(block[done:] if done else block)
            if result > 0:
                done += result
                continue
            _idle_on_code(result, idle, deadline)
        idle.reset()
        seq += BATCH_ROWS
        if time.monotonic_ns() >= end_ns:
            break
    _codec(size).pack_into(message, 0, STOP, STOP)
    _offer_retry(publication.offer, message, idle, deadline)
    stream.close()
    return {"sent": seq, "t0": t0}


def _idle_on_code(result: int, idle: Any, deadline_ns: int) -> None:
    from shmbus import ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED, result_name

    if result in (CLOSED, MAX_POSITION_EXCEEDED):
        raise BenchError(f"offer_many failed: {result_name(result)}")
    if result != ADMIN_ACTION:
        idle.idle(0)
        if time.monotonic_ns() > deadline_ns:
            raise BenchError(f"offer_many not accepted before the deadline: "
                             f"{result_name(result)}")


def _shm_batch_reader(barrier: Any, spec: StreamSpec, size: int,
                      timeout_s: float) -> dict[str, Any]:
    from shmbus import BackoffIdleStrategy
    from shmbus.shm.log_buffer import BEGIN_FLAG, END_FLAG

    stream = ShmbusStream(spec, driver=True)
    poll_batch = stream.image().poll_batch
    duty = stream.driver_duty
    fragmented = size > stream.max_payload_length
    ramp = np.arange(BATCH_ROWS + 1, dtype=np.int64)
    tail_offset = size - 8
    expected = errors = payload_bytes = 0
    first_bad = None
    pending: Any = None  # head of a fragmented message whose end is in a later batch
    stopped = False

    def on_batch(batch: Any) -> None:
        # The checks run on whole arrays: the head and tail words of every message.
        nonlocal expected, errors, first_bad, payload_bytes, pending, stopped
        words = batch.term.view(np.int64)  # frames are 32-byte aligned: payloads 8-aligned
        offsets, lengths = batch.offsets, batch.lengths
        if fragmented:
            flags = batch.flags
            begins, ends = (flags & BEGIN_FLAG) != 0, (flags & END_FLAG) != 0
            heads = words[offsets[begins] >> 3]
            tails = words[(offsets[ends] + lengths[ends] - 8) >> 3]
            payload_bytes += int(lengths.sum())  # checked against the count at the end
            if pending is not None:
                heads = np.concatenate(([pending], heads))
            pending = heads[-1] if len(heads) > len(tails) else None
            heads = heads[:len(tails)]
            ok_lengths = True
        else:
            heads = words[offsets >> 3]
            tails = words[(offsets + tail_offset) >> 3]
            ok_lengths = bool((lengths == size).all())
        n = len(heads)
        if n and heads[n - 1] == STOP:
            stopped = True
            n -= 1
            heads, tails = heads[:n], tails[:n]
        if not n:
            return
        if (ok_lengths and np.array_equal(heads - expected, ramp[:n])
                and np.array_equal(tails, heads)):
            expected += n
        else:
            errors += 1
            first_bad = first_bad or (f"batch at position {batch.position}: expected "
                                      f"{expected}..{expected + n - 1}, got heads "
                                      f"{heads[:4]}.. tails {tails[:4]}..")
            expected = int(heads[n - 1]) + 1

    idle = BackoffIdleStrategy()
    barrier.wait(timeout_s)
    deadline = time.monotonic_ns() + int(timeout_s * 1e9)
    idled = 0
    while not stopped:
        if poll_batch(on_batch, BATCH_ROWS):
            if idled:
                idle.reset()
                idled = 0
        else:
            idled += 1
            idle.idle(0)
            if not idled & 63 and time.monotonic_ns() > deadline:
                raise BenchError(f"reader timed out after {expected} messages")
        duty()
    t1 = time.monotonic_ns()
    stream.close()
    if fragmented and payload_bytes != (expected + 1) * size:  # + 1: the STOP message
        errors += 1
        first_bad = first_bad or f"{payload_bytes} payload bytes for {expected + 1} messages"
    return {"received": expected, "errors": errors, "first_bad": first_bad, "t1": t1}


# ---------------------------------------------------------------------------------------------
# Child processes: ping-pong
# ---------------------------------------------------------------------------------------------


def _idle_strategy(busy: bool) -> Any:
    from shmbus import BackoffIdleStrategy, BusySpinIdleStrategy

    return BusySpinIdleStrategy() if busy else BackoffIdleStrategy()


def _shm_ping(barrier: Any, ping_spec: StreamSpec, pong_spec: StreamSpec, duration_s: float,
              timeout_s: float, busy: bool) -> dict[str, Any]:
    # the pinger stands in for the driver of both streams, between round trips
    ping, pong = ShmbusStream(ping_spec, driver=True), ShmbusStream(pong_spec, driver=True)
    offer = ping.publication().offer
    poll = pong.image().poll
    pack = _codec(LATENCY_SIZE).pack_into
    unpack = _codec(LATENCY_SIZE).unpack_from
    message = bytearray(LATENCY_SIZE)
    idle = _idle_strategy(busy)
    seen = -2

    def on_pong(buffer: memoryview, header: Any) -> None:
        nonlocal seen
        head, tail = unpack(buffer)
        seen = head if tail == head else -3

    samples = array("q")
    errors = 0
    clock = time.perf_counter_ns
    barrier.wait(timeout_s)
    start = clock()
    end_ns = start + int(duration_s * 1e9)
    deadline = start + int(timeout_s * 1e9)
    seq = 0
    while True:
        pack(message, 0, seq, seq)
        t0 = clock()
        if offer(message) < 0:
            _offer_retry(offer, message, idle, deadline)
        spins = 0
        while not poll(on_pong, 1):
            idle.idle(0)
            spins += 1
            if not spins & 63 and clock() > deadline:
                raise BenchError(f"no pong for ping {seq}")
        t1 = clock()
        idle.reset()
        samples.append(t1 - t0)
        if seen != seq:
            errors += 1
        seq += 1
        # the driver's work, off the timed path
        ping.driver_duty()
        pong.driver_duty()
        if t1 >= end_ns or seq >= MAX_SAMPLES:
            break
    pack(message, 0, STOP, STOP)
    _offer_retry(offer, message, idle, deadline)
    ping.close()
    pong.close()
    return {"samples": samples.tobytes(), "errors": errors}


def _shm_pong(barrier: Any, ping_spec: StreamSpec, pong_spec: StreamSpec, timeout_s: float,
              busy: bool) -> dict[str, Any]:
    ping, pong = ShmbusStream(ping_spec), ShmbusStream(pong_spec)
    offer = pong.publication().offer
    poll = ping.image().poll
    unpack = _codec(LATENCY_SIZE).unpack_from
    idle = _idle_strategy(busy)
    echo_idle = _idle_strategy(busy)
    expected = errors = 0
    stopped = False
    deadline = 0

    def on_ping(buffer: memoryview, header: Any) -> None:
        nonlocal expected, errors, stopped
        head, tail = unpack(buffer)
        if head == STOP:
            stopped = True
            return
        if head != expected or tail != head:
            errors += 1
        expected = head + 1
        if offer(buffer) < 0:
            _offer_retry(offer, buffer, echo_idle, deadline)

    barrier.wait(timeout_s)
    deadline = time.monotonic_ns() + int(timeout_s * 1e9)
    idled = 0
    while not stopped:
        if poll(on_ping, 1):
            if idled:
                idle.reset()
                idled = 0
        else:
            idled += 1
            idle.idle(0)
            if not idled & 63 and time.monotonic_ns() > deadline:
                raise BenchError(f"ponger timed out after {expected} pings")
    ping.close()
    pong.close()
    return {"received": expected, "errors": errors}


def _peer_ping(barrier: Any, end: PeerEnd, duration_s: float,
               timeout_s: float) -> dict[str, Any]:
    send, recv, close = open_peer(end, timeout_s)
    pack = _codec(LATENCY_SIZE).pack_into
    unpack = _codec(LATENCY_SIZE).unpack_from
    message = bytearray(LATENCY_SIZE)
    samples = array("q")
    errors = 0
    clock = time.perf_counter_ns
    barrier.wait(timeout_s)
    end_ns = clock() + int(duration_s * 1e9)
    seq = 0
    while True:
        pack(message, 0, seq, seq)
        t0 = clock()
        send(message)
        head, tail = unpack(recv())
        t1 = clock()
        samples.append(t1 - t0)
        if head != seq or tail != seq:
            errors += 1
        seq += 1
        if t1 >= end_ns or seq >= MAX_SAMPLES:
            break
    pack(message, 0, STOP, STOP)
    send(message)
    close()
    return {"samples": samples.tobytes(), "errors": errors}


def _peer_pong(barrier: Any, end: PeerEnd, timeout_s: float) -> dict[str, Any]:
    send, recv, close = open_peer(end, timeout_s)
    unpack = _codec(LATENCY_SIZE).unpack_from
    barrier.wait(timeout_s)
    expected = errors = 0
    while True:
        message = recv()
        head, tail = unpack(message)
        if head == STOP:
            break
        if head != expected or tail != head:
            errors += 1
        expected = head + 1
        send(message)
    close()
    return {"received": expected, "errors": errors}


# ---------------------------------------------------------------------------------------------
# The parent: run pairs of processes under a watchdog
# ---------------------------------------------------------------------------------------------


def run_pair(ctx: Any, a: tuple[str, Callable[..., dict[str, Any]], tuple[Any, ...]],
             b: tuple[str, Callable[..., dict[str, Any]], tuple[Any, ...]],
             timeout_s: float) -> dict[str, dict[str, Any]]:
    """Run two (role, function, args) in two spawned processes; their results by role.

    Raises BenchError if either fails or if they are not both done within timeout_s (then
    both are terminated).
    """
    results = ctx.Queue()
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_child, args=(role, fn, args, barrier, results), daemon=True)
             for role, fn, args in (a, b)]
    for p in procs:
        p.start()
    collected: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < 2:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"timed out after {timeout_s:.0f} s")
            try:
                out = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    # give a result already on its way a moment to arrive
                    try:
                        out = results.get(timeout=1.0)
                    except queue.Empty:
                        raise BenchError(f"a process died (exit code {dead[0].exitcode})") \
                            from None
                else:
                    continue
            collected[out["role"]] = out
            if "error" in out:
                other = _other_result(collected, out["role"], results, 2.0)
                raise BenchError(f"{out['role']}: {out['error'].strip().splitlines()[-1]}"
                                 f"{other}\n{out['error']}")
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        results.close()
        results.cancel_join_thread()
    return collected


def _other_result(collected: dict[str, dict[str, Any]], failed: str, results: Any,
                  timeout_s: float) -> str:
    """What the other process of a failed pair reported, for the error message."""
    others = [out for role, out in collected.items() if role != failed]
    if others:
        out = others[0]
    else:
        try:
            out = results.get(timeout=timeout_s)
        except queue.Empty:
            return ""
    if "error" in out:
        return f"; {out['role']}: {out['error'].strip().splitlines()[-1]}"
    shown = {k: v for k, v in out.items() if k in ("sent", "received", "errors", "first_bad")}
    return f"; {out['role']} reported {shown}"


@dataclass
class Options:
    duration_s: float
    latency_s: float
    timeout_s: float
    term_length: int
    sizes: tuple[int, ...]
    only: str | None
    mtu: int | None = None


def run_throughput(ctx: Any, root: Path, transport: str, size: int,
                   opt: Options) -> dict[str, Any]:
    name = f"tp-{next(_RUN_IDS)}"
    row: dict[str, Any] = {"test": "throughput", "transport": transport, "size": size,
                           "idle": IDLE_PEER if transport in PEERS else IDLE_SHM}
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    try:
        if transport in PEERS:
            w_end, r_end, cleanup = make_peer_link(ctx, transport, root, name, size, False)
            writer = ("writer", _peer_writer, (w_end, size, opt.duration_s, opt.timeout_s))
            reader = ("reader", _peer_reader, (r_end, size, opt.timeout_s))
        else:
            spec = create_stream(root, name, opt.term_length, opt.mtu)
            if transport == SHM_BATCH:
                writer = ("writer", _shm_batch_writer, (spec, size, opt.duration_s,
                                                        opt.timeout_s))
                reader = ("reader", _shm_batch_reader, (spec, size, opt.timeout_s))
            else:
                writer = ("writer", _shm_writer, (spec, size, opt.duration_s, opt.timeout_s))
                reader = ("reader", _shm_reader, (spec, size, opt.timeout_s,
                                                  transport == SHM_COPY))
        out = run_pair(ctx, reader, writer, opt.timeout_s + opt.duration_s + 30)
        sent, received = out["writer"]["sent"], out["reader"]["received"]
        errors = out["reader"]["errors"]
        if errors or sent != received:
            raise BenchError(f"sent {sent}, received {received} in order, {errors} bad; first: "
                             f"{out['reader']['first_bad']}")
        seconds = (out["reader"]["t1"] - out["writer"]["t0"]) / 1e9
        row.update(ok=True, messages=sent, seconds=seconds, msgs_per_s=sent / seconds,
                   mb_per_s=sent * size / seconds / 1e6)
    except BenchError as e:
        row.update(ok=False, error=str(e))
    finally:
        cleanup()
    return row


def run_latency(ctx: Any, root: Path, transport: str, busy: bool,
                opt: Options) -> dict[str, Any]:
    name = f"pp-{next(_RUN_IDS)}"
    idle = IDLE_PEER if transport in PEERS else (IDLE_SPIN if busy else IDLE_SHM)
    row: dict[str, Any] = {"test": "ping-pong", "transport": transport, "size": LATENCY_SIZE,
                           "idle": idle}
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    try:
        if transport in PEERS:
            a, b, cleanup = make_peer_link(ctx, transport, root, name, LATENCY_SIZE, True)
            pinger = ("ping", _peer_ping, (a, opt.latency_s, opt.timeout_s))
            ponger = ("pong", _peer_pong, (b, opt.timeout_s))
        else:
            ping = create_stream(root, name + "-ping", opt.term_length, opt.mtu)
            pong = create_stream(root, name + "-pong", opt.term_length, opt.mtu)
            pinger = ("ping", _shm_ping, (ping, pong, opt.latency_s, opt.timeout_s, busy))
            ponger = ("pong", _shm_pong, (ping, pong, opt.timeout_s, busy))
        out = run_pair(ctx, ponger, pinger, opt.timeout_s + opt.latency_s + 30)
        samples = np.frombuffer(out["ping"]["samples"], np.int64)
        errors = out["ping"]["errors"] + out["pong"]["errors"]
        if errors or out["pong"]["received"] != len(samples):
            raise BenchError(f"{len(samples)} pings, {out['pong']['received']} echoed, "
                             f"{errors} bad")
        warmup = min(1000, len(samples) // 10)
        kept = samples[warmup:] / 1000.0
        p50, p99, p999 = np.percentile(kept, [50, 99, 99.9])
        row.update(ok=True, round_trips=int(len(kept)), p50_us=float(p50), p99_us=float(p99),
                   p999_us=float(p999), max_us=float(kept.max()),
                   round_trips_per_s=float(len(kept) / (kept.sum() / 1e6)))
    except BenchError as e:
        row.update(ok=False, error=str(e))
    finally:
        cleanup()
    return row


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each throughput row's rate against mp.Queue and against the best peer of its size."""
    for size in {r["size"] for r in rows if r["test"] == "throughput"}:
        same = [r for r in rows if r["test"] == "throughput" and r["size"] == size and r["ok"]]
        base = next((r["msgs_per_s"] for r in same if r["transport"] == QUEUE), None)
        peers = [r for r in same if r["transport"] in PEERS]
        best = max(peers, key=lambda r: r["msgs_per_s"]) if peers else None
        for r in same:
            r["x_queue"] = r["msgs_per_s"] / base if base else None
            if best is not None:
                r["best_peer"] = best["transport"]
                r["x_best_peer"] = r["msgs_per_s"] / best["msgs_per_s"]


def evaluate_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def find(test: str, transport: str, size: int, idle: str | None = None) -> Any:
        for r in rows:
            if (r["test"], r["transport"], r["size"]) == (test, transport, size) and r["ok"] \
                    and (idle is None or r["idle"] == idle):
                return r
        return None

    targets = []

    def target(name: str, value: float | None, goal: float, higher: bool = True) -> None:
        if value is None:
            targets.append({"target": name, "value": None, "goal": goal, "status": "n/a"})
            return
        passed = value >= goal if higher else value <= goal
        targets.append({"target": name, "value": value, "goal": goal,
                        "status": "PASS" if passed else "FAIL"})

    shm32 = find("throughput", SHM, 32)
    batch32 = find("throughput", SHM_BATCH, 32)
    shm4k, posix4k = find("throughput", SHM, 4096), find("throughput", POSIX, 4096)
    spin = find("ping-pong", SHM, LATENCY_SIZE, IDLE_SPIN)
    posix_pp = find("ping-pong", POSIX, LATENCY_SIZE)
    target("32 B offer/poll msgs/s vs mp.Queue >= 20x",
           shm32.get("x_queue") if shm32 else None, 20.0)
    target("32 B offer/poll msgs/s vs best peer >= 2x",
           shm32.get("x_best_peer") if shm32 else None, 2.0)
    target("32 B batch API msgs/s vs mp.Queue >= 100x",
           batch32.get("x_queue") if batch32 else None, 100.0)
    target("4 KiB offer/poll bytes/s vs posix_ipc >= 1.5x",
           shm4k["mb_per_s"] / posix4k["mb_per_s"] if shm4k and posix4k else None, 1.5)
    target("32 B p50 RTT (busy-spin) / posix_ipc p50 <= 1/3",
           spin["p50_us"] / posix_pp["p50_us"] if spin and posix_pp else None, 1 / 3,
           higher=False)
    return targets


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    headers = ["test", "transport", "size", "idle: side A / side B", "msgs/s", "MB/s", "x Queue",
               "x best peer", "p50 us", "p99 us", "p99.9 us", "max us", "check"]
    right = {2, 4, 5, 6, 7, 8, 9, 10, 11}
    lines = []
    for r in rows:
        check = "ok" if r["ok"] else "FAILED"
        lines.append([
            r["test"], r["transport"], str(r["size"]), r["idle"],
            _fmt(r.get("msgs_per_s")), _fmt(r.get("mb_per_s"), 1),
            _fmt(r.get("x_queue"), 1), _fmt(r.get("x_best_peer"), 2),
            _fmt(r.get("p50_us"), 1), _fmt(r.get("p99_us"), 1), _fmt(r.get("p999_us"), 1),
            _fmt(r.get("max_us"), 1), check,
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def render(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [render(headers), render(["-" * w for w in widths])]
    previous = None
    for r, line in zip(rows, lines, strict=True):
        if previous is not None and (r["test"], r["size"]) != previous:
            out.append("")
        previous = (r["test"], r["size"])
        out.append(render(line))
    return "\n".join(out)


def format_targets(targets: list[dict[str, Any]]) -> str:
    width = max(len(t["target"]) for t in targets)
    out = []
    for t in targets:
        value = "-" if t["value"] is None else f"{t['value']:.3g}"
        out.append(f"  {t['status']:4s}  {t['target'].ljust(width)}  measured {value}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke pass: 0.2 s per measurement instead of --duration")
    parser.add_argument("--duration", type=float, default=1.5,
                        help="seconds per throughput and per ping-pong run (default 1.5)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each measurement this many times and keep the best "
                             "(a failed run fails the row; default 1)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="deadline of each run beyond its duration, seconds (default 30)")
    parser.add_argument("--term-length", type=int, default=TERM_LENGTH,
                        help=f"shmbus term length in bytes (default {TERM_LENGTH})")
    parser.add_argument("--mtu", type=int,
                        help="shmbus mtu (default: the library's, 1408; a 4 KiB message is then "
                             "3 fragments)")
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        default=SIZES, help="throughput message sizes, comma-separated "
                                            "(default 32,256,4096; at least 16)")
    parser.add_argument("--only", help="run only the transports whose name contains this")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--fanout", action="store_true",
                        help="then run the fan-out network bench (tools/bench_fanout.py: "
                             "unicast to one host, multicast and MDC to two; needs root)")
    parser.add_argument("--fanout-only", action="store_true",
                        help="run only the fan-out network bench")
    args = parser.parse_args(argv)
    for size in args.sizes:
        if size < 16 or size % 8:
            parser.error(f"message size {size}: sizes are multiples of 8, at least 16 (the "
                         f"sequence number is written at the head and the tail)")
    return args


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The best of repeated runs of one measurement; any failed run fails the row."""
    failed = [r for r in runs if not r["ok"]]
    if failed:
        return failed[0]
    if runs[0]["test"] == "throughput":
        best = max(runs, key=lambda r: r["msgs_per_s"])
    else:
        best = min(runs, key=lambda r: r["p50_us"])
    return dict(best, runs=len(runs))


NOTES = f"""\
notes:
  idle: side A = writer or pinger, side B = reader or ponger. shmbus "back-off" =
    BackoffIdleStrategy (the default), used only by a side with nothing to do (reader: nothing
    to read; writer: back-pressured); "busy-spin" = BusySpinIdleStrategy on both sides, each
    holding a core; peers ("blocking") use their natural blocking calls.
  ping-pong: {LATENCY_SIZE} B round trips, microseconds; first 10% (at most 1000) dropped.
  shmbus: exclusive publication; term {{term_kib}} KiB, window = term / 2; mtu {{mtu}}: messages
    over {{max_payload}} B are fragmented (4 KiB: {{fragments_4k}} fragments), and offer/poll
    reassembles them with FragmentAssembler. poll limit {POLL_LIMIT}; offer_many of a
    ({BATCH_ROWS}, size) uint8 array; poll_batch limit {BATCH_ROWS}. "+copy": the handler
    copies each payload out (bytes(buffer)) before checking it. Driver stand-in: the reader
    updates the publication limit (ping-pong: the pinger, for both streams, off the clock).
  peers: mp.Queue(maxsize={QUEUE_MAXSIZE}) put(bytes)/get(); mp.Pipe(duplex=False)
    send_bytes/recv_bytes; posix_ipc default queue (depth {{posix_depth}}) send/receive; zmq PAIR
    ipc:// send(copy=True), recv(copy=False) for 4 KiB, recv() below.
  every message carries its sequence number at head and tail, checked by every reader.
  MB = 10^6 payload bytes. x best peer: against the fastest peer at that size."""


def fanout_argv(args: argparse.Namespace) -> list[str]:
    """tools/bench_fanout.py's command line for this run's --quick, --duration, --repeat and
    --timeout (it keeps its own message sizes)."""
    return [*(["--quick"] if args.quick else []), "--duration", str(args.duration),
            "--repeat", str(args.repeat), "--timeout", str(args.timeout)]


def run_fanout_section(args: argparse.Namespace) -> dict[str, Any]:
    """Run the fan-out bench with this run's settings and print its report; returns the report
    (settings and rows, each row ok or not)."""
    import bench_fanout  # a sibling: tools/ is on sys.path when bench.py runs as a script

    report = bench_fanout.measure(bench_fanout.parse_args(fanout_argv(args)))
    print()
    bench_fanout.print_report(report)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fanout_only:
        import bench_fanout

        return bench_fanout.main([*fanout_argv(args), *(["--json", args.json] if args.json
                                                         else [])])
    _use_repo_imports()
    duration = 0.2 if args.quick else args.duration
    repeat = 1 if args.quick else args.repeat
    opt = Options(duration_s=duration, latency_s=duration, timeout_s=args.timeout,
                  term_length=args.term_length, sizes=args.sizes, only=args.only,
                  mtu=args.mtu)
    ctx = mp.get_context("spawn")
    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="shmbus-bench-", dir=shm_root))

    def wanted(transport: str) -> bool:
        return opt.only is None or opt.only.lower() in transport.lower()

    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        if row["ok"]:
            summary = (f"{row['msgs_per_s']:,.0f} msgs/s" if row["test"] == "throughput"
                       else f"p50 {row['p50_us']:.1f} us")
        else:
            summary = "FAILED: " + row["error"]
        print(f"  {row['test']:10s} {row['transport']:28s} {row['size']:5d} B  "
              f"[{row['idle']}]  {summary}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    print(f"shmbus bench: {duration} s per run, best of {repeat}, term length "
          f"{opt.term_length}, {os.cpu_count()} CPUs, load {load_before[0]:.2f}; progress on "
          f"stderr", file=sys.stderr, flush=True)
    try:
        for size in opt.sizes:
            for transport in THROUGHPUT_TRANSPORTS:
                if wanted(transport):
                    record(best_of([run_throughput(ctx, root, transport, size, opt)
                                    for _ in range(repeat)]))
        for transport, busy in ((SHM, True), (SHM, False),
                                *((p, False) for p in PEERS)):
            if wanted(transport):
                record(best_of([run_latency(ctx, root, transport, busy, opt)
                                for _ in range(repeat)]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()

    add_ratios(rows)
    targets = evaluate_targets(rows)
    print()
    print(f"shmbus bench: {duration} s per run, best of {repeat}; python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print()
    print(format_table(rows))
    print()
    from shmbus.shm.log_buffer import MTU_DEFAULT

    mtu = opt.mtu or MTU_DEFAULT
    import posix_ipc

    print(NOTES.format(term_kib=opt.term_length // 1024, mtu=mtu, max_payload=mtu - 32,
                       fragments_4k=-(-4096 // (mtu - 32)),
                       posix_depth=posix_ipc.QUEUE_MESSAGES_MAX_DEFAULT))
    spin = next((r for r in rows if r["idle"] == IDLE_SPIN and r["ok"]), None)
    backoff = next((r for r in rows if r["test"] == "ping-pong" and r["idle"] == IDLE_SHM
                    and r["ok"]), None)
    if spin and backoff and spin["p50_us"] > backoff["p50_us"]:
        print("  WARNING: busy-spin was slower than back-off: other work was competing for the "
              "2 CPUs\n  the two spinning processes need; rerun on a quiet machine.")
    print()
    print("targets:")
    print(format_targets(targets))
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        print(f"\nFAILED {r['test']} {r['transport']} {r['size']} B: {r['error']}")
    fanout = run_fanout_section(args) if args.fanout else None
    if fanout is not None:
        failed += [r for r in fanout["rows"] if not r["ok"]]
    if args.json:
        report = {
            "settings": {"duration_s": duration, "repeat": repeat,
                         "term_length": opt.term_length, "mtu": opt.mtu,
                         "queue_maxsize": QUEUE_MAXSIZE,
                         "poll_limit": POLL_LIMIT, "batch_rows": BATCH_ROWS,
                         "cpus": os.cpu_count(), "load_before": load_before,
                         "load_after": load_after, "python": platform.python_version(),
                         "platform": platform.platform()},
            "rows": rows,
            "targets": targets,
        }
        if fanout is not None:
            report["fanout"] = fanout
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
