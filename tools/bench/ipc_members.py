"""shmbus's members on ``aeron:ipc`` as a user runs them, measured by ipc.py and pyaeron.py:
each measurement on a fresh bus directory (Bus; the first client launches the embedded driver)
held by a Scope; the throughput writer and readers (``publish()``/``messages()`` as the README
teaches and ``offer()``/``poll(handler)``, both in the user's loop of tools/bench/user_loop.py;
the lower-level drained, in-place and numpy batch readers), the round-trip pinger and ponger
(blocking with and without a spin, busy-spin, back-off and asyncio waits) and the idle
publisher and subscriber. Each member function runs in a spawned member process (see
harness.run_processes) and imports only shmbus's public API.
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
from tools.bench.rounds import Rounds, read_rounds
from tools.bench.user_loop import Consumer, write

POLL_LIMIT = 256  # fragment limit of Subscription.poll in throughput runs
CHANNEL = "aeron:ipc"

# the ways shmbus is measured (row names of ipc.py's reports)
SHM_PUBLISH = "shmbus publish()/messages()"  # the user's loop, as the README teaches
SHM_HANDLER = "shmbus offer()/poll(handler)"  # the user's consume, from a poll handler
SHM_DRAIN = "shmbus messages() drained"  # lower-level: no Python step per message
SHM_NOCOPY = "shmbus no-copy"  # lower-level: the sequence number read in place
SHM_BATCH = "shmbus batch"  # lower-level: offer_many / poll_batch
SHM = "shmbus offer()/poll()"  # round trips and idle: offer() and poll() with an idle strategy

# how a round-trip or idle member waits
SPIN = "busy-spin"
BLOCKING = "blocking wait"  # the default: spins up to Context.wait_spin (20 us), then sleeps
SLEEPING = "blocking wait, no spin"  # Context.wait_spin = 0: sleeps at once, as the peers do
ASYNCIO = "asyncio await"
BACKOFF = "back-off (default)"


# ---------------------------------------------------------------------------------------------
# shmbus: connecting as a user does
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bus:
    """One measurement's bus: a fresh directory (the first client launches its driver), and
    the clients' Context.wait_spin (None: the default)."""

    dir: str
    wait_spin: float | None = None

    def connect(self) -> Any:
        import shmbus

        if self.wait_spin is None:
            return shmbus.connect(dir=self.dir)
        return shmbus.connect(dir=self.dir, wait_spin=self.wait_spin)


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
    """Checked messages for duration_s, then STOP, in the user's writer loop
    (user_loop.write): each by ``publish()`` (SHM_PUBLISH and SHM_DRAIN: what the README
    teaches), or by ``offer()`` and, back-pressured, ``publish()`` (SHM_HANDLER and SHM_NOCOPY:
    the lower-level API); or offer_many of a batch then publish_many() (SHM_BATCH).
    Back-pressured, it sleeps in publish()/publish_many() until the reader moves."""
    with bus_spec.connect() as bus:
        publication = _publication(bus, stream_id, deadline_after(timeout_s))
        rounds = Rounds(size)
        start.ready(bus.driver_pid)
        if how == SHM_BATCH:
            out = _write_batches(publication, size, duration_s, timeout_s)
        elif how in (SHM_PUBLISH, SHM_DRAIN):  # publish(message) at its default timeout
            out = write(publication.publish, rounds, duration_s)
        else:
            offer, publish = publication.offer, publication.publish

            def send(message: bytes) -> None:
                if offer(message) < 0:  # back-pressured: sleep until the reader moves
                    publish(message, timeout=timeout_s)

            out = write(send, rounds, duration_s)
        done.wait(timeout_s)  # keep the publication until the reader has everything
    return out


def _write_batches(publication: Any, size: int, duration_s: float, timeout_s: float
                   ) -> dict[str, Any]:
    """offer_many of (BATCH_ROWS, size) blocks, the sequence number in each message's first
    and last word, for duration_s; then a STOP message."""
    t0 = time.monotonic_ns()
    end_ns = t0 + int(duration_s * 1e9)
    seq = 0
    block = np.zeros((BATCH_ROWS, size), np.uint8)
    words = block.view("<i8")
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
    return {"sent": seq, "t0": t0}


def shm_reader(start: Any, bus_spec: Bus, stream_id: int, size: int, how: str,
               timeout_s: float, done: Any) -> dict[str, Any]:
    """Read until STOP. SHM_PUBLISH, the user's loop (user_loop.read): ``for message in
    sub.messages(): consume(message)``. SHM_HANDLER: ``poll(handler)``, the handler copying
    each message as bytes into the same ``consume``. SHM_DRAIN (lower-level): ``messages()``
    emptied a round at a time with itertools.islice, no Python step per message, each round
    compared whole (rounds.read_rounds). SHM_NOCOPY (lower-level): the handler reads the
    sequence number in place, nothing else checked."""
    import shmbus

    rounds = Rounds(size)
    consumer = Consumer(rounds)
    tally = consumer.tally
    if how == SHM_NOCOPY:
        tally = Counter()
        unpack_from, seq_offset = SEQUENCE.unpack_from, rounds.checked.seq_offset

        def in_place(buffer: memoryview, header: Any) -> None:
            seq = unpack_from(buffer, seq_offset)[0]
            if seq == tally.expected:
                tally.expected += 1
            elif seq == STOP:
                tally.stopped = True
            else:
                tally.bad(seq, "out of order")

        handler: Any = in_place
    elif how == SHM_HANDLER:
        handler = consumer.handler()
    if how in (SHM_NOCOPY, SHM_HANDLER) and size > max_payload(CHANNEL):
        handler = shmbus.FragmentAssembler(handler)
    with _subscribed(start, bus_spec, stream_id, timeout_s) as subscription:
        if how == SHM_PUBLISH:
            consumer.read(subscription.messages(timeout=timeout_s))
        elif how == SHM_DRAIN:
            tally = read_rounds(subscription.messages(timeout=timeout_s), rounds)
        else:
            poll = subscription.poll
            deadline = deadline_after(timeout_s)
            while not tally.stopped:
                # nothing there: asleep until the writer wakes it
                if not poll(handler, POLL_LIMIT) and not poll(handler, POLL_LIMIT, timeout=0.1):
                    if time.monotonic_ns() > deadline:
                        break
        t1 = time.monotonic_ns()
        done.set()
    if not tally.stopped:
        raise BenchError(f"reader timed out after {tally.expected} messages")
    if how in (SHM_PUBLISH, SHM_HANDLER):
        return consumer.result(t1)
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

    if wait in (BLOCKING, SLEEPING):
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

    if wait in (BLOCKING, SLEEPING):
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
