"""shmbus's members on ``aeron:ipc`` as a user runs them, measured by ipc.py and pyaeron.py:
each measurement on a fresh bus directory (Bus; the first client launches the embedded driver)
held by a Scope; the throughput writer and readers (``publish()``/``messages()`` as the README
teaches, the lower-level ``offer()``/``poll(handler)``, in place, and the numpy batch API),
the round-trip pinger and ponger (blocking, busy-spin, back-off and asyncio waits) and the idle
publisher and subscriber. Each member function runs in a spawned member process (see
harness.run_processes) and imports only shmbus's public API; messages are made and checked a
round at a time (tools/bench/rounds.py).
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench.harness import (
    SEQUENCE,
    STOP,
    BenchError,
    Counter,
    Member,
    Outcome,
    async_round_trips,
    deadline_after,
    offer_until_accepted,
    ping_loop,
    polled_recv,
    pong_loop,
    run_processes,
    stop_driver_pid,
)
from tools.bench.members import (
    BATCH_ROWS,
    BatchCheck,
    await_image,
    connect_publication,
    max_payload,
)
from tools.bench.rounds import RoundCheck, Rounds, read_rounds, send_rounds

POLL_LIMIT = 256  # fragment limit of Subscription.poll in throughput runs
CHANNEL = "aeron:ipc"

# the ways shmbus is measured (row names of ipc.py's reports)
SHM_PUBLISH = "shmbus publish()"
SHM = "shmbus offer()"
SHM_HANDLER = "shmbus poll(handler)"
SHM_NOCOPY = "shmbus no-copy"
SHM_BATCH = "shmbus batch"

# how a round-trip or idle member waits
SPIN = "busy-spin"
BLOCKING = "blocking wait"
ASYNCIO = "asyncio await"
BACKOFF = "back-off (default)"


# ---------------------------------------------------------------------------------------------
# shmbus: connecting as a user does
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bus:
    """One measurement's bus: a fresh directory (the first client launches its driver)."""

    dir: str

    def connect(self) -> Any:
        import shmbus

        return shmbus.connect(dir=self.dir)


def _publication(bus: Any, stream_id: int, deadline_ns: int) -> Any:
    return connect_publication(bus, CHANNEL, stream_id, deadline_ns)


def _subscription(bus: Any, stream_id: int, deadline_ns: int) -> Any:
    """A subscription on CHANNEL once it has an image."""
    subscription = bus.add_subscription(CHANNEL, stream_id)
    await_image(subscription, deadline_ns)
    return subscription


@contextmanager
def _subscribed(start: Any, bus_spec: Bus, stream_id: int, timeout_s: float) -> Iterator[Any]:
    """A reader's subscription on stream_id (once it has an image), on its own connection to
    the bus, yielded once every member is ready (``start.ready``); BenchError if it has no
    image within timeout_s."""
    with bus_spec.connect() as bus:
        subscription = _subscription(bus, stream_id, deadline_after(timeout_s))
        start.ready(bus.driver_pid)
        yield subscription


# ---------------------------------------------------------------------------------------------
# Throughput members
# ---------------------------------------------------------------------------------------------


def shm_writer(start: Any, bus_spec: Bus, stream_id: int, size: int, how: str,
               duration_s: float, timeout_s: float, done: Any) -> dict[str, Any]:
    """Checked messages for duration_s, then STOP: each by publish() (how=SHM_PUBLISH, what
    the README teaches), or offer() and, back-pressured, publish() (the lower-level API), or
    offer_many of a batch then publish_many() (SHM_BATCH). Back-pressured, it sleeps in
    publish()/publish_many() until the reader moves."""
    with bus_spec.connect() as bus:
        publication = _publication(bus, stream_id, deadline_after(timeout_s))
        offer = publication.offer
        rounds = Rounds(size)
        start.ready(bus.driver_pid)
        t0 = time.monotonic_ns()
        end_ns = t0 + int(duration_s * 1e9)
        seq = 0
        if how == SHM_BATCH:
            block = np.zeros((BATCH_ROWS, size), np.uint8)
            words = block.view("<i8")  # sequence numbers in the first and the last word
            ramp = np.arange(BATCH_ROWS, dtype=np.int64)
            offer_many = publication.offer_many
            while time.monotonic_ns() < end_ns:
                np.add(ramp, seq, out=words[:, 0])
                words[:, -1] = words[:, 0]
                sent = offer_many(block)
                if sent != BATCH_ROWS:  # back-pressured: the rest sleeps until it moves
                    publication.publish_many(block[max(sent, 0):], timeout=timeout_s)
                seq += BATCH_ROWS
            words[:1, 0] = words[:1, -1] = STOP
            publication.publish_many(block[:1], timeout=timeout_s)
        elif how == SHM_PUBLISH:  # as users write it: publish(message), its default timeout
            seq, t0 = send_rounds(publication.publish, rounds, duration_s)
        else:
            publish = publication.publish

            def send(message: bytes) -> None:
                if offer(message) < 0:  # back-pressured: sleep until the reader moves
                    publish(message, timeout=timeout_s)

            seq, t0 = send_rounds(send, rounds, duration_s)
        done.wait(timeout_s)  # keep the publication until the reader has everything
    return {"sent": seq, "t0": t0}


def shm_reader(start: Any, bus_spec: Bus, stream_id: int, size: int, how: str,
               timeout_s: float, done: Any) -> dict[str, Any]:
    """Read until STOP: every message as bytes from ``messages()``, checked (how=SHM or
    SHM_PUBLISH); by
    poll(handler), copied and checked (SHM_HANDLER), or its sequence number read in place
    (SHM_NOCOPY)."""
    import shmbus

    rounds = Rounds(size)
    if how in (SHM, SHM_PUBLISH):
        return _shm_messages_reader(start, bus_spec, stream_id, rounds, timeout_s, done)
    unpack_from, seq_offset = SEQUENCE.unpack_from, rounds.checked.seq_offset
    round_check = RoundCheck(rounds)
    got: list[bytes] = []
    append, take = got.append, round_check.take
    tally = Counter() if how == SHM_NOCOPY else round_check.tally

    def copied(buffer: memoryview, header: Any) -> None:
        append(bytes(buffer))

    def in_place(buffer: memoryview, header: Any) -> None:
        seq = unpack_from(buffer, seq_offset)[0]
        if seq == tally.expected:
            tally.expected += 1
        elif seq == STOP:
            tally.stopped = True
        else:
            tally.bad(seq, "out of order")

    handler: Any = copied if how == SHM_HANDLER else in_place
    if size > max_payload(CHANNEL):
        handler = shmbus.FragmentAssembler(handler)
    with _subscribed(start, bus_spec, stream_id, timeout_s) as subscription:
        poll = subscription.poll
        deadline = deadline_after(timeout_s)
        while not tally.stopped:
            # nothing there: asleep until the writer wakes it
            if not poll(handler, POLL_LIMIT) and not poll(handler, POLL_LIMIT, timeout=0.1):
                if time.monotonic_ns() > deadline:
                    raise BenchError(f"reader timed out after {tally.expected} messages")
            if got:
                take(got)
        t1 = time.monotonic_ns()
        done.set()
    return tally.result(t1)


def _shm_messages_reader(start: Any, bus_spec: Bus, stream_id: int, rounds: Rounds,
                         timeout_s: float, done: Any) -> dict[str, Any]:
    """shm_reader's messages() loop: the iterator sleeps while there is nothing to read."""
    with _subscribed(start, bus_spec, stream_id, timeout_s) as subscription:
        tally = read_rounds(subscription.messages(timeout=timeout_s), rounds)
        t1 = time.monotonic_ns()
        done.set()
    if not tally.stopped:
        raise BenchError(f"reader timed out after {tally.expected} messages")
    return tally.result(t1)


def shm_batch_reader(start: Any, bus_spec: Bus, stream_id: int, size: int, timeout_s: float,
                     done: Any) -> dict[str, Any]:
    """poll_batch until STOP, checking head and tail sequence numbers with numpy
    (members.BatchCheck)."""
    check = BatchCheck(size, size > max_payload(CHANNEL))
    with _subscribed(start, bus_spec, stream_id, timeout_s) as subscription:
        poll_batch = subscription.poll_batch
        deadline = deadline_after(timeout_s)
        while not check.stopped:
            if not poll_batch(check, BATCH_ROWS) and not subscription.wait(0.1):
                if time.monotonic_ns() > deadline:
                    raise BenchError(f"reader timed out after {check.expected} messages")
        t1 = time.monotonic_ns()
        done.set()
    check.finish()
    return check.result(t1)


# ---------------------------------------------------------------------------------------------
# Round-trip members: a pinger and a ponger over (send, recv)
# ---------------------------------------------------------------------------------------------


def _shm_recv(subscription: Any, wait: str, timeout_s: float) -> Callable[[], bytes]:
    """recv() over a subscription: the next message as bytes; waiting as ``wait`` says
    (busy-spin, back-off, or blocking in messages())."""
    import shmbus

    if wait == BLOCKING:
        messages = subscription.messages(timeout=timeout_s + 60)

        def recv() -> bytes:
            for message in messages:
                return message
            raise BenchError("no message before the deadline")

        return recv
    strategies = shmbus.idle_strategies
    idle = (strategies.BusySpinIdleStrategy() if wait == SPIN
            else strategies.BackoffIdleStrategy())
    return polled_recv(subscription.poll, idle, deadline_after(timeout_s + 60))


def _shm_async_recv(subscription: Any, timeout_s: float) -> Callable[[], Awaitable[bytes]]:
    """recv for _async_round_trips: each message awaited from Subscription.messages_async (the
    loop free while it waits)."""
    messages = subscription.messages_async(timeout=timeout_s + 60)

    async def recv() -> bytes:
        async for message in messages:
            return message
        raise BenchError("no message before the deadline")

    return recv


def _shm_send(publication: Any, wait: str, timeout_s: float) -> Callable[[Any], None]:
    """send(message): publish() when blocking (what the README teaches), else offer() with the
    idle strategy while back-pressured."""
    import shmbus

    if wait == BLOCKING:
        publish = publication.publish

        def publish_one(message: Any) -> None:
            publish(message, timeout=timeout_s + 60)

        return publish_one

    offer = publication.offer
    idle = shmbus.idle_strategies.BackoffIdleStrategy()
    deadline = deadline_after(timeout_s + 60)

    def send(message: Any) -> None:
        if offer(message) < 0:
            offer_until_accepted(offer, message, idle, deadline)

    return send


def shm_rtt(start: Any, bus_spec: Bus, pinger: bool, wait: str, rate: int | None,
            duration_s: float, timeout_s: float, done: Any) -> dict[str, Any]:
    """A shmbus pinger (pinger=True: publishes on stream 1, subscribes to 2) or ponger."""
    tx, rx = (1, 2) if pinger else (2, 1)
    with bus_spec.connect() as bus:
        deadline = deadline_after(timeout_s)
        subscription = bus.add_subscription(CHANNEL, rx)
        publication = _publication(bus, tx, deadline)
        await_image(subscription, deadline)
        send = _shm_send(publication, wait, timeout_s)
        start.ready(bus.driver_pid)
        if wait == ASYNCIO:
            recv_async = _shm_async_recv(subscription, timeout_s)
            out = asyncio.run(async_round_trips(pinger, send, recv_async, duration_s, rate))
        else:
            recv = _shm_recv(subscription, wait, timeout_s)
            out = ping_loop(send, recv, duration_s, rate) if pinger else pong_loop(send, recv)
        if not pinger:
            done.set()
        done.wait(timeout_s)
    return out


# ---------------------------------------------------------------------------------------------
# Idle members
# ---------------------------------------------------------------------------------------------


def shm_idle(start: Any, bus_spec: Bus, publisher: bool, wait: str, duration_s: float,
             timeout_s: float) -> dict[str, Any]:
    """Connected and doing nothing for duration_s: a publisher sleeps; a subscriber polls
    (back-off between empty polls), blocks in poll(timeout=) or awaits poll_async(timeout=)
    on an asyncio loop."""
    import shmbus

    with bus_spec.connect() as bus:
        deadline = deadline_after(timeout_s)
        if publisher:
            _publication(bus, 1, deadline)
        else:
            subscription = _subscription(bus, 1, deadline)
            poll = subscription.poll
        start.ready(bus.driver_pid)
        end_ns = deadline_after(duration_s)
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        polls = 0
        if not publisher and wait == ASYNCIO:
            async def awaits() -> int:
                count = 0
                while time.monotonic_ns() < end_ns:
                    count += 1
                    await subscription.poll_async(lambda buffer, header: None, 10, timeout=0.05)
                return count

            return {"polls": asyncio.run(awaits())}
        while time.monotonic_ns() < end_ns:
            if publisher:
                time.sleep(0.05)
            elif wait == BLOCKING:
                polls += 1
                poll(lambda buffer, header: None, 10, timeout=0.05)
            else:
                polls += 1
                if not poll(lambda buffer, header: None, 10):
                    idle.idle(0)
    return {"polls": polls}


_run_ids = itertools.count(1)


class Scope:
    """One measurement's resources, released at its end: a fresh bus directory under ``root``
    (removed), the drivers its members were served by (an embedded driver outlives its clients
    by its idle timeout: stopped with SIGTERM, by pid) and peer links (their cleanups)."""

    def __init__(self, root: Path) -> None:
        self.name = f"run{next(_run_ids)}"
        self.dir = root / self.name
        self.cleanups: list[Callable[[], None]] = []

    def bus(self) -> Bus:
        return Bus(str(self.dir))

    def run(self, ctx: Any, members: list[Member], timeout_s: float) -> Outcome:
        """run_processes, remembering the drivers to stop."""
        out = run_processes(ctx, members, timeout_s)
        self.cleanups.extend(lambda pid=pid: stop_driver_pid(pid)
                             for pid in out.pids.get("driver", ()))
        return out

    def __enter__(self) -> Scope:
        return self

    def __exit__(self, *exc: object) -> None:
        for cleanup in self.cleanups:
            cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
