"""Cost per call of the client's per-message paths, in one process (a lower-level figure).

    python -m tools.bench.call_costs [--messages N] [--runs N] [--json]   # from the repo root

Not a throughput figure (tools/bench/ipc.py measures the bus as users run it, across
processes): this one times each call users make once per message, on a real bus with its
embedded driver and default settings, writer and reader in this one process so that no
wake-up or scheduling enters the figure. Each round publishes a burst that fits the window,
then reads it back; a call's cost is the wall time of a burst over its messages (ns per call,
median over rounds and --runs). 32 B messages; the fragmented paths use 4 KiB.

Rows:
* publish() / publish_many() / offer(): accepted at once (the reader keeps the window open);
* messages(), poll(handler) with bytes(buffer), poll with FragmentAssembler (4 KiB),
  a handler reading Header fields, poll_batch: per message read;
* group poll and messages() (a subscription group of one member);
* request/reply, each side alone: request() with its reply there, submit(), a responder's
  poll() per request, Call.result().
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import shmbus
from tools.bench.harness import BenchError
from tools.bench.members import await_image
from tools.bench.report import markdown_table

CHANNEL = "aeron:ipc"
SMALL, LARGE = 32, 4096


def _burst_ns(write: Callable[[int], None], read: Callable[[int], None], count: int
              ) -> tuple[float, float]:
    """ns per message of write(count) then read(count)."""
    t0 = time.perf_counter_ns()
    write(count)
    t1 = time.perf_counter_ns()
    read(count)
    t2 = time.perf_counter_ns()
    return (t1 - t0) / count, (t2 - t1) / count


def measure(messages: int, rounds: int) -> dict[str, float]:
    """ns per call of each path: the median over ``rounds`` bursts of ``messages``."""
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root, \
            shmbus.connect(dir=f"{root}/bus") as bus:
        deadline = time.monotonic_ns() + 20_000_000_000
        small, large = bytes(SMALL), bytes(LARGE)

        def stream(stream_id: int, group: str | None = None) -> tuple[Any, Any]:
            sub = bus.add_subscription(CHANNEL, stream_id, group=group)
            pub = bus.add_exclusive_publication(CHANNEL, stream_id)
            await_image(sub, deadline)
            return pub, sub

        pub, sub = stream(1)
        got: list[Any] = []

        def copy(buffer: memoryview, header: Any) -> None:
            got.append(bytes(buffer))

        def header_fields(buffer: memoryview, header: Any) -> None:
            got.append(header.position + header.session_id + header.reserved_value)

        def drain_poll(handler: Any, subscription: Any = sub) -> Callable[[int], None]:
            def read(count: int) -> None:
                poll = subscription.poll
                while len(got) < count:
                    poll(handler, 256)
                got.clear()
            return read

        def drain_messages(subscription: Any) -> Callable[[int], None]:
            def read(count: int) -> None:
                it = subscription.messages(timeout=0)
                for _ in range(count):
                    next(it)
            return read

        def batch_read(count: int) -> None:
            seen = 0
            while seen < count:
                seen += sub.poll_batch(len, 1024)

        def publish(count: int, message: bytes = small) -> None:
            p = pub.publish
            for _ in range(count):
                p(message)

        def offer(count: int) -> None:
            o = pub.offer
            for _ in range(count):
                while o(small) < 0:  # ADMIN_ACTION at a term's end: offer again, as users do
                    pass

        def publish_many(count: int) -> None:
            pm = pub.publish_many
            one = [small]
            for _ in range(count):
                pm(one)

        def record(name: str, ns: float) -> None:
            out.setdefault(name, []).append(ns)

        assembler = shmbus.FragmentAssembler(copy)
        for _ in range(rounds):
            w, r = _burst_ns(publish, drain_messages(sub), messages)
            record("publish() 32 B", w)
            record("messages() 32 B", r)
            w, r = _burst_ns(offer, drain_poll(copy), messages)
            record("offer() 32 B", w)
            record("poll(handler) + bytes 32 B", r)
            record("publish_many([m]) 32 B",
                   _burst_ns(publish_many, drain_messages(sub), messages)[0])
            record("poll(handler) reading Header 32 B",
                   _burst_ns(publish, drain_poll(header_fields), messages)[1])
            record("poll_batch 32 B (per message)", _burst_ns(publish, batch_read, messages)[1])
            big = messages // 64
            record("publish() 4 KiB", _burst_ns(lambda n: publish(n, large),
                                                drain_poll(assembler), big)[0])
            record("poll(FragmentAssembler) + bytes 4 KiB",
                   _burst_ns(lambda n: publish(n, large), drain_poll(assembler), big)[1])
        gpub, gsub = stream(2, group="costs")
        for _ in range(rounds):
            record("group messages() 32 B",
                   _burst_ns(lambda n: [gpub.publish(small) for _ in range(n)],
                             drain_messages(gsub), messages)[1])
            record("group poll(handler) + bytes 32 B",
                   _burst_ns(lambda n: [gpub.publish(small) for _ in range(n)],
                             drain_poll(copy, gsub), messages)[1])
        _call_costs(bus, rounds, messages // 4, record)
    return {name: statistics.median(values) for name, values in out.items()}


#: A reply's call header (docs/protocol.md, Request/reply): kind 2, flags, version 1, stream 0,
#: correlation id.
_REPLY_HEADER = struct.Struct("<BBHiq")


def _call_costs(bus: Any, rounds: int, count: int, record: Callable[[str, float], None]
                ) -> None:
    """Request/reply, each side alone (32 B): the requester's ``request()`` with its reply
    written beforehand (its correlation ids follow each other) and a plain subscriber keeping
    the service connected; ``submit()``, a responder's ``poll()`` per request (claim, echo
    handler, reply) and ``Call.result()`` with the reply there."""
    small = bytes(SMALL)
    deadline = time.monotonic_ns() + 20_000_000_000

    def reply(correlation_id: int) -> bytes:
        return _REPLY_HEADER.pack(2, 0, 1, 0, correlation_id)

    def in_flight(requester: Any) -> Any:
        """A call that stays in flight: the service is connected."""
        while (call := requester.submit(small, timeout=60)).done():
            if time.monotonic_ns() > deadline:
                raise BenchError("the request stream never got a subscriber")
            time.sleep(0.002)
        return call

    requester = bus.add_requester(CHANNEL, 3)
    listener = bus.add_subscription(CHANNEL, 3)
    replies = bus.add_exclusive_publication(CHANNEL, requester.response_stream_id)
    while not replies.is_connected:
        if time.monotonic_ns() > deadline:
            raise BenchError("the response stream never got its subscriber")
        time.sleep(0.002)
    probe = in_flight(requester)
    replies.publish(reply(probe.correlation_id), small)
    probe.result(timeout=10)
    next_id = probe.correlation_id + 1
    await_image(listener, deadline)
    for _ in listener.messages(timeout=0):  # the probe's request
        pass
    for _ in range(rounds):
        for correlation_id in range(next_id, next_id + count):
            replies.publish(reply(correlation_id), small)
        next_id += count
        request = requester.request
        t0 = time.perf_counter_ns()
        for _ in range(count):
            request(small)
        record("request() 32 B, reply there (requester alone)",
               (time.perf_counter_ns() - t0) / count)
        drained = listener.messages(timeout=0)
        for _ in range(count):
            next(drained)
    client = bus.add_requester(CHANNEL, 4)
    responder = bus.add_responder(CHANNEL, 4, lambda request: request)
    first = in_flight(client)  # its reply makes the responder's reply publication
    while not responder.poll():
        if time.monotonic_ns() > deadline:
            raise BenchError("the responder never answered")
    first.result(timeout=10)
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        calls = [client.submit(small) for _ in range(count)]
        t1 = time.perf_counter_ns()
        served = responder.served + count
        while responder.served < served:
            responder.poll(256)
        t2 = time.perf_counter_ns()
        for call in calls:
            call.result()
        t3 = time.perf_counter_ns()
        record("submit() 32 B", (t1 - t0) / count)
        record("responder poll() 32 B per request (echo)", (t2 - t1) / count)
        record("Call.result() 32 B, reply there", (t3 - t2) / count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000,
                        help="messages a burst (fits the default window at 32 B)")
    parser.add_argument("--rounds", type=int, default=20, help="bursts a path and run")
    parser.add_argument("--runs", type=int, default=3, help="runs (medians are reported)")
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args(argv)
    runs = [measure(args.messages, args.rounds) for _ in range(args.runs)]
    figures = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(markdown_table(["path (one process, lower-level figure)", "ns per call"],
                             [[name, f"{ns:,.0f}"] for name, ns in figures.items()], (1,)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
