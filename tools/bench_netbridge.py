# Run from the repository root: .venv/bin/python tools/bench_netbridge.py [--quick]
"""netbridge benchmark: shmbus streams through two netbridges on loopback, beside pyzmq over TCP.

Issue 5's benchmark: one-way throughput and ping-pong round trip between two buses, each with
its own driver (a process, as tests/conftest.start_driver starts it) that auto-starts its
netbridge, so a message goes publisher -> log (bus A) -> netbridge A -> UDP 127.0.0.1 ->
netbridge B -> image log (bus B) -> subscriber. Beside it, in the same run with the same
loops, pyzmq PUSH/PULL over tcp://127.0.0.1 (throughput) and PAIR over tcp://127.0.0.1
(ping-pong). Target: at least 2x pyzmq's msgs/s for 32 B messages, no worse for 4 KiB.

Every measurement runs in two fresh processes (multiprocessing, spawn) that the parent starts
and watches; the two drivers and their netbridges are started once and serve every shmbus run
(each run on its own stream id and UDP port, so each run gets fresh logs and images).

Throughput: the writer sends for a fixed duration, then a STOP message; the rate is messages /
(time the reader saw STOP - time the writer started), CLOCK_MONOTONIC in both processes. Every
message carries its sequence number at its head and its tail, and the reader checks both for
every message: a run that loses, duplicates, reorders or tears a message fails instead of
reporting a number.

* shmbus offer/poll: ExclusivePublication.offer() per message; Subscription.poll(handler, 256),
  the handler checking in place; messages over mtu - 32 (4 KiB with the default mtu 1408)
  come in fragments and go through FragmentAssembler.
* shmbus offer_many/poll_batch: offer_many() of a (1024, size) uint8 array, poll_batch() with
  the checks done by numpy over each batch.
* zmq PUSH/PULL tcp://: send(copy=True) of a reused buffer; recv() (recv(copy=False) for 4 KiB).
  The pair exchanges a hello before the clock starts.

Ping-pong: 32 B messages echoed; the pinger times each round trip (perf_counter_ns), drops the
first 10% (at most 1000) as warm-up and checks every echo's sequence number. shmbus uses two
streams on two UDP channels: ping (bus A -> bus B) and pong (bus B -> bus A). zmq uses one PAIR
socket pair over TCP.

Channels: each shmbus measurement runs on the default channel (a plain endpoint URI: term
1 MiB, mtu 1408, receiver window 128 KiB) and on a loopback-tuned one (mtu 65504, rcv-wnd
2 MiB, term 4 MiB; --tuned changes it, --channels picks).

Idle strategies: a shmbus application side with nothing to do uses BackoffIdleStrategy (spin,
yield, then sleep 1 us .. 1 ms); each netbridge, with nothing to do, sleeps in poll() on its
sockets and an eventfd its log watcher thread makes readable when a publisher writes where a
sender waits, until its next timer; each driver backs off to at most 1 ms sleeps. zmq sides
block in their calls (with timeouts). So on a 2-core machine six processes share two cores in
a shmbus run (two drivers, two netbridges, writer, reader), two processes and two zmq I/O
threads in a zmq run.

Bounded waits: every loop checks a deadline, zmq calls have timeouts, and the parent
terminates a pair of processes that overruns.
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
import signal
import socket
import struct
import subprocess
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

SIZES = (32, 4096)
LATENCY_SIZE = 32
STOP = -1  # sequence number of the message that ends a run
POLL_LIMIT = 256
BATCH_ROWS = 1024
MAX_SAMPLES = 500_000
_RUN_IDS = itertools.count(1)

SHM = "shmbus offer/poll"
SHM_BATCH = "shmbus offer_many/poll_batch"
ZMQ = "zmq PUSH/PULL tcp://"
ZMQ_PP = "zmq PAIR tcp://"
PEERS = (ZMQ, ZMQ_PP)

IDLE_SHM = "back-off / back-off"
IDLE_PEER = "blocking / blocking"


class BenchError(RuntimeError):
    """A run that failed: timed out, crashed, or delivered wrong messages."""


@dataclass(frozen=True)
class ChannelConfig:
    """The udp channel of the shmbus runs: its name in the table and its URI parameters."""

    name: str
    params: str = ""  # "|"-separated, e.g. "mtu=65504|rcv-wnd=2097152|term-length=4194304"

    def uri(self, port: int) -> str:
        return f"aeron:udp?endpoint=127.0.0.1:{port}" + (f"|{self.params}" if self.params else "")


#: a channel as a user writes it: term 1 MiB, mtu 1408 (a 4 KiB message is 3 fragments,
#: 22 messages of 32 B fill a datagram), receiver window 128 KiB (Aeron's defaults but the term)
DEFAULT_CHANNEL = ChannelConfig("default")
#: loopback tuning: datagrams up to 64 KiB (no IP fragmentation on lo, whose MTU is 65536; on a
#: real network an mtu above the path MTU would be fragmented) and a 2 MiB receiver window
TUNED_CHANNEL = ChannelConfig("mtu 64K, rcv-wnd 2M",
                              "mtu=65504|rcv-wnd=2097152|term-length=4194304")


def _use_repo_imports() -> None:
    root = str(ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


def _codec(size: int) -> struct.Struct:
    """A message: its sequence number in the first and in the last 8 bytes."""
    return struct.Struct(f"<q{size - 16}xq")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# The two buses: a driver process each, each auto-starting its netbridge
# ---------------------------------------------------------------------------------------------


def netbridge_cpu(driver: subprocess.Popen) -> dict[int, float]:
    """CPU seconds (user + system) of each child of a driver process (its netbridge), by pid;
    empty when it has none (or it is gone)."""
    cpu = {}
    for task in Path(f"/proc/{driver.pid}/task").glob("*/children"):
        try:
            children = task.read_text().split()
        except OSError:
            continue
        for pid in map(int, children):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu[pid] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return cpu


@dataclass
class Buses:
    contexts: tuple[Any, Any]
    drivers: list[subprocess.Popen]

    def bridge_cpu(self) -> dict[int, float]:
        """CPU seconds (user + system) of each netbridge process (the drivers' children)."""
        cpu = {}
        for driver in self.drivers:
            cpu.update(netbridge_cpu(driver))
        return cpu


def start_driver(context: Any, timeout_s: float = 20.0) -> subprocess.Popen:
    """A driver process for context.dir, as tests/conftest.start_driver starts one."""
    from shmbus.client import _try_open

    process = subprocess.Popen(context.driver_command(), cwd=ROOT)
    deadline = time.monotonic() + timeout_s
    while True:
        cnc = _try_open(Path(context.dir), context) if os.path.isdir(context.dir) else None
        if cnc is not None:
            pid = cnc.pid
            cnc.close()
            if pid == process.pid:
                return process
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise BenchError(f"driver for {context.dir} did not start "
                             f"(exit code {process.returncode})")
        time.sleep(0.01)


def stop_driver(process: subprocess.Popen) -> None:
    """SIGTERM (the driver stops its netbridge and removes its files), SIGKILL if stuck."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_buses(root: Path, term_length: int) -> Buses:
    _use_repo_imports()
    import shmbus

    contexts = tuple(shmbus.Context(dir=str(root / name), embedded_driver=False,
                                    driver_idle_timeout=600, ipc_term_length=term_length)
                     for name in ("a", "b"))
    drivers: list[subprocess.Popen] = []
    try:
        for context in contexts:
            drivers.append(start_driver(context))
    except BaseException:
        for process in drivers:
            stop_driver(process)
        raise
    return Buses(contexts, drivers)  # type: ignore[arg-type]


def _connect_publication(bus: Any, uri: str, stream_id: int, deadline: float,
                         destinations: tuple[str, ...] = ()) -> Any:
    """An exclusive publication on uri, with destinations added (a control-mode=manual
    channel's), once connected; BenchError if it is not connected by deadline."""
    publication = bus.add_exclusive_publication(uri, stream_id)
    for destination in destinations:
        publication.add_destination(destination)
    while not publication.is_connected:
        if time.monotonic() > deadline:
            raise BenchError(f"publication on {uri} stream {stream_id} never connected")
        time.sleep(0.002)
    return publication


def _await_image(subscription: Any, deadline: float) -> Any:
    while not subscription.images:
        if time.monotonic() > deadline:
            raise BenchError("subscription never got an image")
        subscription.poll(lambda b, h: None, 1)  # services the client: image events
        time.sleep(0.002)
    return subscription.images[0]


# ---------------------------------------------------------------------------------------------
# Child processes
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


def _offer(offer: Callable[[Any], int], message: Any, idle: Any, deadline_ns: int) -> None:
    """Offer until accepted: back-off while back-pressured, again at once after a rotation."""
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


def _shm_writer(barrier: Any, context: Any, uri: str, stream_id: int, size: int,
                duration_s: float, timeout_s: float, done: Any, batch: bool,
                destinations: tuple[str, ...] = ()) -> dict[str, Any]:
    """Send for duration_s, then STOP; keep the publication until done (its wait(timeout))
    says every reader has everything. destinations: see _connect_publication."""
    import shmbus

    with shmbus.connect(context) as bus:
        publication = _connect_publication(bus, uri, stream_id, time.monotonic() + timeout_s,
                                           destinations)
        offer = publication.offer
        offer_many = publication.offer_many
        pack = _codec(size).pack_into
        message = bytearray(size)
        block = np.zeros((BATCH_ROWS, size), np.uint8)
        words = block.view("<i8")
        ramp = np.arange(BATCH_ROWS, dtype=np.int64)
        idle = shmbus.BackoffIdleStrategy()
        barrier.wait(timeout_s)
        t0 = time.monotonic_ns()
        end_ns = t0 + int(duration_s * 1e9)
        deadline = t0 + int(timeout_s * 1e9)
        seq = 0
        if batch:
            while time.monotonic_ns() < end_ns:
                np.add(ramp, seq, out=words[:, 0])
                words[:, -1] = words[:, 0]
                sent = 0
                while sent < BATCH_ROWS:
                    result = offer_many(block[sent:] if sent else block)
                    if result > 0:
                        sent += result
                        idle.reset()
                        continue
                    if result == shmbus.ADMIN_ACTION:
                        continue
                    if result in (shmbus.CLOSED, shmbus.MAX_POSITION_EXCEEDED):
                        raise BenchError(f"offer_many: {shmbus.result_name(result)}")
                    idle.idle(0)
                    if time.monotonic_ns() > deadline:
                        raise BenchError(f"offer_many blocked: {shmbus.result_name(result)}")
                seq += BATCH_ROWS
        else:
            while True:
                pack(message, 0, seq, seq)
                if offer(message) < 0:
                    _offer(offer, message, idle, deadline)
                seq += 1
                if not seq & 127 and time.monotonic_ns() >= end_ns:
                    break
        pack(message, 0, STOP, STOP)
        _offer(offer, message, idle, deadline)
        # keep the publication until the reader has everything (then close it)
        done.wait(timeout_s)
        publication.close()
    return {"sent": seq, "t0": t0}


def _shm_reader(barrier: Any, context: Any, uri: str, stream_id: int, size: int,
                timeout_s: float, done: Any, batch: bool) -> dict[str, Any]:
    import shmbus
    from shmbus.shm.log_buffer import BEGIN_FLAG, END_FLAG

    unpack = _codec(size).unpack_from
    expected = errors = payload_bytes = 0
    first_bad: str | None = None
    stopped = False
    pending: Any = None

    def bad(head: int, tail: int) -> None:
        nonlocal expected, errors, first_bad, stopped
        if head == STOP:
            stopped = True
            return
        errors += 1
        first_bad = first_bad or f"expected {expected}, got head {head} tail {tail}"
        expected = head + 1

    def in_place(buffer: memoryview, header: Any) -> None:
        nonlocal expected
        head, tail = unpack(buffer)
        if head == expected and tail == head:
            expected += 1
        else:
            bad(head, tail)

    ramp = np.arange(BATCH_ROWS + 1, dtype=np.int64)

    def on_batch(fragments: Any) -> None:
        nonlocal expected, errors, first_bad, payload_bytes, pending, stopped
        words = fragments.term.view(np.int64)
        offsets, lengths = fragments.offsets, fragments.lengths
        if fragmented:
            flags = fragments.flags
            begins, ends = (flags & BEGIN_FLAG) != 0, (flags & END_FLAG) != 0
            heads = words[offsets[begins] >> 3]
            tails = words[(offsets[ends] + lengths[ends] - 8) >> 3]
            payload_bytes += int(lengths.sum())
            if pending is not None:
                heads = np.concatenate(([pending], heads))
            pending = heads[-1] if len(heads) > len(tails) else None
            heads = heads[:len(tails)]
            ok_lengths = True
        else:
            heads = words[offsets >> 3]
            tails = words[(offsets + size - 8) >> 3]
            ok_lengths = bool((lengths == size).all())
        n = len(heads)
        if n and heads[n - 1] == STOP:
            stopped = True
            n -= 1
            heads, tails = heads[:n], tails[:n]
        if not n:
            return
        if ok_lengths and np.array_equal(heads - expected, ramp[:n]) and np.array_equal(
                tails, heads):
            expected += n
        else:
            errors += 1
            first_bad = first_bad or (f"batch at {fragments.position}: expected {expected}, "
                                      f"got heads {heads[:4]} tails {tails[:4]}")
            expected = int(heads[n - 1]) + 1

    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(uri, stream_id)
        image = _await_image(subscription, time.monotonic() + timeout_s)
        fragmented = size > image.log.descriptor.mtu - 32
        handler: Any = in_place
        if fragmented:
            handler = shmbus.FragmentAssembler(handler)
        idle = shmbus.BackoffIdleStrategy()
        barrier.wait(timeout_s)
        deadline = time.monotonic_ns() + int(timeout_s * 1e9)
        idled = 0
        if batch:
            def poll() -> int:
                return image.poll_batch(on_batch, BATCH_ROWS)
        else:
            def poll() -> int:
                return subscription.poll(handler, POLL_LIMIT)
        while not stopped:
            if poll():
                if idled:
                    idle.reset()
                    idled = 0
            else:
                idled += 1
                idle.idle(0)
                if not idled & 63 and time.monotonic_ns() > deadline:
                    raise BenchError(f"reader timed out after {expected} messages")
        t1 = time.monotonic_ns()
        done.set()
    if batch and fragmented and payload_bytes != (expected + 1) * size:
        errors += 1
        first_bad = first_bad or f"{payload_bytes} payload bytes for {expected + 1} messages"
    return {"received": expected, "errors": errors, "first_bad": first_bad, "t1": t1}


def _zmq_socket(kind: str, endpoint: str, bind: bool, timeout_s: float) -> tuple[Any, Any]:
    import zmq

    zctx = zmq.Context()
    sock = zctx.socket(getattr(zmq, kind))
    ms = int(timeout_s * 1000)
    sock.setsockopt(zmq.LINGER, ms)
    sock.setsockopt(zmq.SNDTIMEO, ms)
    sock.setsockopt(zmq.RCVTIMEO, ms)
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    return zctx, sock


def _zmq_writer(barrier: Any, endpoint: str, size: int, duration_s: float, timeout_s: float,
                done: Any) -> dict[str, Any]:
    zctx, sock = _zmq_socket("PUSH", endpoint, False, timeout_s)
    send = sock.send
    send(b"hello")  # connected before the clock starts
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
    except Exception as e:
        raise BenchError(f"send failed after {seq} messages: {e!r}") from e
    done.wait(timeout_s)
    sock.close()
    zctx.term()
    return {"sent": seq, "t0": t0}


def _zmq_reader(barrier: Any, endpoint: str, size: int, timeout_s: float,
                done: Any) -> dict[str, Any]:
    zctx, sock = _zmq_socket("PULL", endpoint, True, timeout_s)
    sock_recv = sock.recv
    if sock_recv() != b"hello":
        raise BenchError("no hello")
    if size >= 4096:
        def recv() -> Any:
            return sock_recv(copy=False)
    else:
        recv = sock_recv
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
    done.set()
    sock.close()
    zctx.term()
    return {"received": expected, "errors": errors, "first_bad": first_bad, "t1": t1}


def _shm_ping(barrier: Any, context: Any, ping_uri: str, pong_uri: str, stream_id: int,
              duration_s: float, timeout_s: float, done: Any) -> dict[str, Any]:
    import shmbus

    unpack = _codec(LATENCY_SIZE).unpack_from
    pack = _codec(LATENCY_SIZE).pack_into
    seen = -2

    def on_pong(buffer: memoryview, header: Any) -> None:
        nonlocal seen
        head, tail = unpack(buffer)
        seen = head if tail == head else -3

    with shmbus.connect(context) as bus:
        deadline_s = time.monotonic() + timeout_s
        subscription = bus.add_subscription(pong_uri, stream_id)
        publication = _connect_publication(bus, ping_uri, stream_id, deadline_s)
        _await_image(subscription, deadline_s)
        offer, poll = publication.offer, subscription.poll
        message = bytearray(LATENCY_SIZE)
        idle = shmbus.BackoffIdleStrategy()
        samples = array("q")
        errors = 0
        clock = time.perf_counter_ns
        barrier.wait(timeout_s)
        start = clock()
        end_ns = start + int(duration_s * 1e9)
        deadline = time.monotonic_ns() + int(timeout_s * 1e9)
        seq = 0
        while True:
            pack(message, 0, seq, seq)
            t0 = clock()
            if offer(message) < 0:
                _offer(offer, message, idle, deadline)
            spins = 0
            while not poll(on_pong, 1):
                idle.idle(0)
                spins += 1
                if not spins & 63 and time.monotonic_ns() > deadline:
                    raise BenchError(f"no pong for ping {seq}")
            t1 = clock()
            idle.reset()
            samples.append(t1 - t0)
            if seen != seq:
                errors += 1
            seq += 1
            if t1 >= end_ns or seq >= MAX_SAMPLES:
                break
        pack(message, 0, STOP, STOP)
        _offer(offer, message, idle, deadline)
        done.wait(timeout_s)
    return {"samples": samples.tobytes(), "errors": errors}


def _shm_pong(barrier: Any, context: Any, ping_uri: str, pong_uri: str, stream_id: int,
              timeout_s: float, done: Any) -> dict[str, Any]:
    import shmbus

    unpack = _codec(LATENCY_SIZE).unpack_from
    expected = errors = 0
    stopped = False
    deadline = 0

    with shmbus.connect(context) as bus:
        deadline_s = time.monotonic() + timeout_s
        subscription = bus.add_subscription(ping_uri, stream_id)
        publication = _connect_publication(bus, pong_uri, stream_id, deadline_s)
        _await_image(subscription, deadline_s)
        offer, poll = publication.offer, subscription.poll
        idle = shmbus.BackoffIdleStrategy()
        echo_idle = shmbus.BackoffIdleStrategy()

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
                _offer(offer, buffer, echo_idle, deadline)

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
        done.set()
    return {"received": expected, "errors": errors}


def _zmq_ping(barrier: Any, endpoint: str, duration_s: float, timeout_s: float,
              done: Any) -> dict[str, Any]:
    zctx, sock = _zmq_socket("PAIR", endpoint, False, timeout_s)
    send, recv = sock.send, sock.recv
    send(b"hello")
    if recv() != b"hello":
        raise BenchError("no hello")
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
    done.wait(timeout_s)
    sock.close()
    zctx.term()
    return {"samples": samples.tobytes(), "errors": errors}


def _zmq_pong(barrier: Any, endpoint: str, timeout_s: float, done: Any) -> dict[str, Any]:
    zctx, sock = _zmq_socket("PAIR", endpoint, True, timeout_s)
    send, recv = sock.send, sock.recv
    if recv() != b"hello":
        raise BenchError("no hello")
    send(b"hello")
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
    done.set()
    sock.close()
    zctx.term()
    return {"received": expected, "errors": errors}


# ---------------------------------------------------------------------------------------------
# The parent: run pairs of processes under a watchdog
# ---------------------------------------------------------------------------------------------


def run_processes(ctx: Any,
                  members: list[tuple[str, Callable[..., dict[str, Any]], tuple[Any, ...]]],
                  timeout_s: float) -> dict[str, dict[str, Any]]:
    """Run each (role, function, args) in a spawned process of its own, all sharing one
    barrier; their results by role (roles are unique).

    Raises BenchError if any fails or if not all are done within timeout_s (then all are
    terminated).
    """
    results = ctx.Queue()
    barrier = ctx.Barrier(len(members))
    procs = [ctx.Process(target=_child, args=(role, fn, args, barrier, results), daemon=True)
             for role, fn, args in members]
    for p in procs:
        p.start()
    collected: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < len(members):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"timed out after {timeout_s:.0f} s")
            try:
                out = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    try:
                        out = results.get(timeout=1.0)
                    except queue.Empty:
                        raise BenchError(f"a process died (exit code {dead[0].exitcode})") \
                            from None
                else:
                    continue
            collected[out["role"]] = out
            if "error" in out:
                raise BenchError(f"{out['role']}: {out['error'].strip().splitlines()[-1]}\n"
                                 f"{out['error']}")
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


@dataclass
class Options:
    duration_s: float
    timeout_s: float


def run_throughput(ctx: Any, buses: Buses, transport: str, config: ChannelConfig | None,
                   size: int, opt: Options) -> dict[str, Any]:
    run = next(_RUN_IDS)
    row: dict[str, Any] = {"test": "throughput", "transport": transport, "size": size,
                           "channel": config.name if config else "-",
                           "idle": IDLE_PEER if transport in PEERS else IDLE_SHM}
    done = ctx.Event()
    try:
        if transport == ZMQ:
            endpoint = f"tcp://127.0.0.1:{_free_tcp_port()}"
            writer = ("writer", _zmq_writer, (endpoint, size, opt.duration_s, opt.timeout_s,
                                              done))
            reader = ("reader", _zmq_reader, (endpoint, size, opt.timeout_s, done))
        else:
            assert config is not None
            uri = config.uri(_free_udp_port())
            batch = transport == SHM_BATCH
            writer = ("writer", _shm_writer, (buses.contexts[0], uri, 1000 + run, size,
                                              opt.duration_s, opt.timeout_s, done, batch))
            reader = ("reader", _shm_reader, (buses.contexts[1], uri, 1000 + run, size,
                                              opt.timeout_s, done, batch))
        cpu0, wall0 = buses.bridge_cpu(), time.monotonic()
        out = run_processes(ctx, [reader, writer], 2 * opt.timeout_s + opt.duration_s + 30)
        wall = time.monotonic() - wall0
        bridge_cpu = sum(v - cpu0.get(pid, 0.0) for pid, v in buses.bridge_cpu().items())
        sent, received = out["writer"]["sent"], out["reader"]["received"]
        errors = out["reader"]["errors"]
        if errors or sent != received:
            raise BenchError(f"sent {sent}, received {received} in order, {errors} bad; first: "
                             f"{out['reader']['first_bad']}")
        seconds = (out["reader"]["t1"] - out["writer"]["t0"]) / 1e9
        row.update(ok=True, messages=sent, seconds=seconds, msgs_per_s=sent / seconds,
                   mb_per_s=sent * size / seconds / 1e6)
        if transport not in PEERS:
            row["bridge_cpu_s"], row["pair_wall_s"] = bridge_cpu, wall
    except BenchError as e:
        row.update(ok=False, error=str(e))
    return row


def run_latency(ctx: Any, buses: Buses, transport: str, config: ChannelConfig | None,
                opt: Options) -> dict[str, Any]:
    run = next(_RUN_IDS)
    row: dict[str, Any] = {"test": "ping-pong", "transport": transport, "size": LATENCY_SIZE,
                           "channel": config.name if config else "-",
                           "idle": IDLE_PEER if transport in PEERS else IDLE_SHM}
    done = ctx.Event()
    try:
        if transport == ZMQ_PP:
            endpoint = f"tcp://127.0.0.1:{_free_tcp_port()}"
            pinger = ("ping", _zmq_ping, (endpoint, opt.duration_s, opt.timeout_s, done))
            ponger = ("pong", _zmq_pong, (endpoint, opt.timeout_s, done))
        else:
            assert config is not None
            ping_uri, pong_uri = config.uri(_free_udp_port()), config.uri(_free_udp_port())
            pinger = ("ping", _shm_ping, (buses.contexts[0], ping_uri, pong_uri, 1000 + run,
                                          opt.duration_s, opt.timeout_s, done))
            ponger = ("pong", _shm_pong, (buses.contexts[1], ping_uri, pong_uri, 1000 + run,
                                          opt.timeout_s, done))
        out = run_processes(ctx, [ponger, pinger], 2 * opt.timeout_s + opt.duration_s + 30)
        samples = np.frombuffer(out["ping"]["samples"], np.int64)
        errors = out["ping"]["errors"] + out["pong"]["errors"]
        if errors or out["pong"]["received"] != len(samples):
            raise BenchError(f"{len(samples)} pings, {out['pong']['received']} echoed, "
                             f"{errors} bad")
        warmup = min(1000, len(samples) // 10)
        kept = samples[warmup:] / 1000.0
        p50, p99 = np.percentile(kept, [50, 99])
        row.update(ok=True, round_trips=int(len(kept)), p50_us=float(p50), p99_us=float(p99),
                   max_us=float(kept.max()))
    except BenchError as e:
        row.update(ok=False, error=str(e))
    return row


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row against the zmq row of the same test and size (x zmq: higher is better for
    throughput, p50 zmq / p50 for ping-pong)."""
    for r in rows:
        if not r["ok"]:
            continue
        peer = next((p for p in rows if p["ok"] and p["transport"] in PEERS
                     and (p["test"], p["size"]) == (r["test"], r["size"])), None)
        if peer is None:
            continue
        if r["test"] == "throughput":
            r["x_zmq"] = r["msgs_per_s"] / peer["msgs_per_s"]
        else:
            r["x_zmq"] = peer["p50_us"] / r["p50_us"]


def evaluate_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    targets = []
    channels = list(dict.fromkeys(r["channel"] for r in rows if r["transport"] not in PEERS))
    for channel_name in channels:
        for transport in (SHM, SHM_BATCH):
            for size, goal in ((32, 2.0), (4096, 1.0)):
                row = next((r for r in rows if (r["test"], r["transport"], r["size"],
                                                r["channel"]) ==
                            ("throughput", transport, size, channel_name) and r["ok"]), None)
                if row is None and not any(r["size"] == size for r in rows):
                    continue
                value = row.get("x_zmq") if row else None
                status = "n/a" if value is None else ("PASS" if value >= goal else "FAIL")
                targets.append({"target": f"{size} B {transport} [{channel_name}] msgs/s vs "
                                          f"zmq >= {goal:g}x",
                                "value": value, "goal": goal, "status": status})
    return targets


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    headers = ["test", "transport", "channel", "size", "idle: side A / side B", "msgs/s",
               "MB/s", "x zmq", "p50 us", "p99 us", "max us", "bridges cpu", "check"]
    right = {3, 5, 6, 7, 8, 9, 10, 11}
    lines = []
    for r in rows:
        cpu = r.get("bridge_cpu_s")
        lines.append([
            r["test"], r["transport"], r["channel"], str(r["size"]), r["idle"],
            _fmt(r.get("msgs_per_s")), _fmt(r.get("mb_per_s"), 1), _fmt(r.get("x_zmq"), 2),
            _fmt(r.get("p50_us"), 1), _fmt(r.get("p99_us"), 1), _fmt(r.get("max_us"), 1),
            "-" if cpu is None else f"{cpu / r['pair_wall_s']:.0%}",
            "ok" if r["ok"] else "FAILED",
        ])
    return render_table(headers, lines, right, [(r["test"], r["size"]) for r in rows])


def render_table(headers: list[str], lines: list[list[str]], right: set[int],
                 groups: list[Any]) -> str:
    """A text table: the headers, a rule, then one line of cells per row, the columns whose
    index is in right right-aligned; a blank line where the group key (one per row) changes."""
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def render(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [render(headers), render(["-" * w for w in widths])]
    previous = None
    for group, line in zip(groups, lines, strict=True):
        if previous is not None and group != previous:
            out.append("")
        previous = group
        out.append(render(line))
    return "\n".join(out)


NOTES = f"""\
notes:
  shmbus path: writer -> log (bus A) -> netbridge A -> UDP 127.0.0.1 -> netbridge B -> image
    (bus B) -> reader; each bus has its own driver process, which started its netbridge.
  channels (shmbus rows only):
{{channels}}
    default: term 1 MiB, mtu 1408 (4 KiB messages in 3 fragments, 22 messages of 32 B per
    datagram), receiver window 128 KiB.
  idle: side A = writer or pinger, side B = reader or ponger. shmbus "back-off" =
    BackoffIdleStrategy (spin 10, yield 20, sleep 1 us .. 1 ms) used only with nothing to do;
    a netbridge with nothing to do sleeps in poll() on its sockets and its log watcher's
    eventfd (readable when a publisher writes where a sender waits) until its next timer;
    drivers back off to 1 ms sleeps. zmq "blocking": blocking calls with timeouts (and
    libzmq's I/O thread).
  throughput: offer/poll = ExclusivePublication.offer / Subscription.poll(limit {POLL_LIMIT})
    with in-place checks (FragmentAssembler when fragmented); batch = offer_many of
    ({BATCH_ROWS}, size) uint8 arrays / Image.poll_batch(limit {BATCH_ROWS}), numpy checks.
    zmq PUSH/PULL: send(copy=True) of a reused buffer, recv() (copy=False for 4 KiB).
  ping-pong: {LATENCY_SIZE} B round trips in microseconds, first 10% (<= 1000) dropped. shmbus:
    two streams (ping A -> B, pong B -> A) on two UDP channels; zmq: PAIR over tcp://.
  x zmq: throughput msgs/s / zmq's msgs/s at the same size; ping-pong zmq p50 / p50.
  bridges cpu: CPU time of both netbridge processes / wall time, over the whole run of the
    pair of processes (their start and connection included; 200% = two cores).
  every message carries its sequence number at head and tail, checked by every reader.
  MB = 10^6 payload bytes."""


def format_targets(targets: list[dict[str, Any]]) -> str:
    width = max(len(t["target"]) for t in targets)
    out = []
    for t in targets:
        value = "-" if t["value"] is None else f"{t['value']:.3g}"
        out.append(f"  {t['status']:4s}  {t['target'].ljust(width)}  measured {value}")
    return "\n".join(out)


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The best of repeated runs; any failed run fails the row."""
    failed = [r for r in runs if not r["ok"]]
    if failed:
        return failed[0]
    if runs[0]["test"] == "throughput":
        best = max(runs, key=lambda r: r["msgs_per_s"])
    else:
        best = min(runs, key=lambda r: r["p50_us"])
    return dict(best, runs=len(runs))


def _channel_configs(names: str, tuned_params: str) -> list[ChannelConfig]:
    configs = {"default": DEFAULT_CHANNEL, "tuned": ChannelConfig(
        TUNED_CHANNEL.name if tuned_params == TUNED_CHANNEL.params else tuned_params,
        tuned_params)}
    out = []
    for name in names.split(","):
        if name not in configs:
            raise SystemExit(f"--channels: unknown channel {name!r} (default, tuned)")
        out.append(configs[name])
    return out


def add_run_options(parser: argparse.ArgumentParser, duration_s: float, what: str) -> None:
    """The options of how long and how often each measurement runs: --quick (0.3 s),
    --duration (default duration_s; help: "seconds <what>"), --repeat, --timeout."""
    parser.add_argument("--quick", action="store_true",
                        help="smoke pass: 0.3 s per measurement instead of --duration")
    parser.add_argument("--duration", type=float, default=duration_s,
                        help=f"seconds {what} (default {duration_s:g})")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each measurement this many times, interleaved, and keep the "
                             "best (a failed run fails the row; default 1)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="deadline of each run beyond its duration, seconds (default 30)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, 2.0, "per throughput and ping-pong run")
    parser.add_argument("--channels", default="default,tuned",
                        help="shmbus channel configurations to run, comma-separated: default "
                             "(plain endpoint URI) and/or tuned (default: both)")
    parser.add_argument("--tuned", default=TUNED_CHANNEL.params, metavar="PARAMS",
                        help=f"URI parameters of the tuned channel (default "
                             f"{TUNED_CHANNEL.params!r})")
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        default=SIZES, help="throughput sizes, comma-separated (default 32,4096)")
    parser.add_argument("--only", help="run only the transports whose name contains this")
    parser.add_argument("--no-latency", action="store_true", help="skip the ping-pong runs")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    for size in args.sizes:
        if size < 16 or size % 8:
            parser.error(f"message size {size}: a multiple of 8, at least 16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _use_repo_imports()
    duration = 0.3 if args.quick else args.duration
    repeat = 1 if args.quick else args.repeat
    opt = Options(duration_s=duration, timeout_s=args.timeout)
    configs = _channel_configs(args.channels, args.tuned)
    ctx = mp.get_context("spawn")
    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="shmbus-bench-nb-", dir=shm_root))

    def wanted(transport: str) -> bool:
        return args.only is None or args.only.lower() in transport.lower()

    def report(row: dict[str, Any]) -> None:
        if row["ok"]:
            summary = (f"{row['msgs_per_s']:,.0f} msgs/s" if row["test"] == "throughput"
                       else f"p50 {row['p50_us']:.1f} us")
        else:
            summary = "FAILED: " + row["error"]
        print(f"  {row['test']:10s} {row['transport']:28s} {row['channel']:20s} "
              f"{row['size']:5d} B  {summary}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    print(f"netbridge bench: {duration} s per run, best of {repeat}, {os.cpu_count()} CPUs, "
          f"load {load_before[0]:.2f}; progress on stderr", file=sys.stderr, flush=True)
    buses = start_buses(root, 1024 * 1024)
    # the measurements, as (key, thunk); repeats are interleaved, so that a burst of load
    # elsewhere on the machine hits shmbus and zmq alike rather than one of them
    plan: list[tuple[tuple[str, str, str, int], Callable[[], dict[str, Any]]]] = []
    for size in args.sizes:
        for config in configs:
            for transport in (SHM, SHM_BATCH):
                if wanted(transport):
                    plan.append((("throughput", transport, config.name, size),
                                 lambda t=transport, c=config, s=size:
                                 run_throughput(ctx, buses, t, c, s, opt)))
        if wanted(ZMQ):
            plan.append((("throughput", ZMQ, "-", size),
                         lambda s=size: run_throughput(ctx, buses, ZMQ, None, s, opt)))
    if not args.no_latency:
        for config in configs:
            if wanted(SHM):
                plan.append((("ping-pong", SHM, config.name, LATENCY_SIZE),
                             lambda c=config: run_latency(ctx, buses, SHM, c, opt)))
        if wanted(ZMQ_PP):
            plan.append((("ping-pong", ZMQ_PP, "-", LATENCY_SIZE),
                         lambda: run_latency(ctx, buses, ZMQ_PP, None, opt)))
    runs: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {key: [] for key, _ in plan}
    try:
        for _ in range(repeat):
            for key, thunk in plan:
                row = thunk()
                report(row)
                runs[key].append(row)
    finally:
        for process in buses.drivers:
            stop_driver(process)
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    rows = [best_of(runs[key]) for key, _ in plan]
    add_ratios(rows)
    targets = evaluate_targets(rows)

    print()
    print(f"netbridge bench: {duration} s per run, best of {repeat}; python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print()
    print(format_table(rows))
    print()
    channels = "\n".join(f"    [{c.name}] {c.uri(0).replace(':0', ':PORT')}" for c in configs)
    print(NOTES.format(channels=channels))
    print()
    print("targets (issue 5):")
    print(format_targets(targets))
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        print(f"\nFAILED {r['test']} {r['transport']} [{r['channel']}] {r['size']} B: "
              f"{r['error']}")
    if args.json:
        report_json = {
            "settings": {"duration_s": duration, "repeat": repeat,
                         "channels": {c.name: c.params for c in configs},
                         "cpus": os.cpu_count(), "load_before": load_before,
                         "load_after": load_after, "python": platform.python_version(),
                         "platform": platform.platform()},
            "rows": rows,
            "targets": targets,
        }
        Path(args.json).write_text(json.dumps(report_json, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
