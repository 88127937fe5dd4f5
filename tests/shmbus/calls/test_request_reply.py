"""Request/reply across real processes on a real bus: every call answered exactly once by
the responder pool, replies only to the requester that asked (checked byte for byte), and
every failure an answer: no responder, a handler that raises, a responder SIGKILLed with a
request in hand (alone: the call fails within the liveness timeout; with another responder:
a "lost" reply, or the request run again when idempotent), a requester that dies (its replies
dropped and counted), a call that times out (its late reply dropped and counted).

Responders and requesters are spawn processes (tests/support/workers/rr_workers.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest

import shmbus
from shmbus.shm.counters import (
    RR_ANSWERED,
    RR_FAILED,
    RR_IN_FLIGHT,
    RR_LATE,
    RR_REPLIES_DROPPED,
    RR_SERVED,
    RR_TIMED_OUT,
)
from tests.support.calls import (
    STREAM,
    calling_threads,
    calls_answered,
    counter_total,
    kill_with_every_caller_asleep,
    no_backstop,
)
from tests.support.waits import wait_until
from tests.support.workers import rr_workers as rw

pytestmark = pytest.mark.timeout(300)


def start_responders(procs: Any, context: shmbus.Context, n: int, seconds: float = 60.0,
                     reports: Any = None) -> list[dict[str, Any]]:
    reports = procs if reports is None else reports
    for i in range(n):
        procs.start(rw.responder, context, STREAM, reports.queue, seconds, f"responder-{i}")
    return reports.wait("ready", n, timeout=60)


def test_a_pool_answers_every_call_exactly_once_to_the_requester_that_asked(
        bus_context, driver, procs):
    responders = start_responders(procs, bus_context, 3, seconds=60)
    pids = {r["pid"] for r in responders}
    requesters, threads, calls = 3, 2, 300
    for index in range(requesters):  # one pipelines 8 calls per thread, with 4 KiB requests
        procs.start(rw.requester, bus_context, STREAM, procs.queue, index, threads, calls,
                    4096 if index == 0 else 32, 8 if index == 0 else 1)
    answered = calls_answered(procs.wait("calls", requesters, timeout=240), pids)
    assert answered == requesters * threads * calls
    with shmbus.connect(bus_context) as bus:
        assert counter_total(bus, RR_SERVED) == answered  # no request served twice
        assert counter_total(bus, RR_REPLIES_DROPPED) == 0


def test_no_responder_fails_at_once(bus_context, driver):
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        started = time.monotonic()
        with pytest.raises(shmbus.NoResponderError, match="no responder is connected to "
                                                          "aeron:ipc stream 5001"):
            client.request(b"x", timeout=10)
        assert time.monotonic() - started < 1.0
        assert client.in_flight == 0
        assert counter_total(bus, RR_FAILED) == 1


def test_a_handler_that_raises_is_a_remote_error_and_the_next_call_works(
        bus_context, driver, procs):
    start_responders(procs, bus_context, 1)
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        request = rw.make_command(1, 0, b"raise now")
        with pytest.raises(shmbus.RemoteError, match="ValueError: refused") as raised:
            client.request(request, timeout=10)
        assert raised.value.remote.startswith("ValueError: refused b'raise now'")
        good = rw.make_request(1, 0, 1, 64)
        rw.check_reply(good, client.request(good, timeout=10))
        assert counter_total(bus, RR_ANSWERED) == 1 and counter_total(bus, RR_FAILED) == 1


def test_a_lone_responder_killed_mid_request_fails_its_calls_within_the_liveness_timeout(
        bus_context, driver, procs):
    killed = procs.private()
    start_responders(procs, bus_context, 1, reports=killed)
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        hang = client.submit(rw.make_command(1, 0, b"hang"), timeout=60)
        queued = [client.submit(rw.make_request(1, 0, s, 64), timeout=60) for s in range(1, 6)]
        victim = killed.wait("in-hand", timeout=30)[0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(shmbus.ResponderLostError, match="no responder is connected"):
            hang.result()
        for call in queued:
            with pytest.raises(shmbus.ResponderLostError):
                call.result()
        elapsed = time.monotonic() - killed_at
        # the driver times the dead client out after client_liveness_timeout (2 s), checked
        # on its timer, and wakes the requester as it clears the is-connected word
        assert elapsed < bus_context.client_liveness_timeout + 1.5, elapsed
        assert client.in_flight == 0
        assert counter_total(bus, RR_FAILED) == 6 and counter_total(bus, RR_IN_FLIGHT) == 0


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_responder_killed_mid_request_hands_it_on(bus_context, driver, procs, idempotent):
    """The survivor gets the dead responder's claim: the request in its hand is answered
    "lost" (ResponderLostError) unless idempotent, then it is run again."""
    killed = procs.private()
    victim = start_responders(procs, bus_context, 1, reports=killed)[0]
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        hang = client.submit(rw.make_command(1, 0, b"hang"), timeout=60,
                             idempotent=idempotent)
        killed.wait("in-hand", timeout=30)
        survivor = start_responders(procs, bus_context, 1)[0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        if idempotent:  # run again by the survivor: its body says hang, so it hangs there too
            procs.wait("in-hand", timeout=30)
            assert not hang.done()
            os.kill(survivor["pid"], signal.SIGKILL)
            with pytest.raises(shmbus.ResponderLostError):
                hang.result()
        else:
            with pytest.raises(shmbus.ResponderLostError, match="left .died or was timed "
                                                                "out. before answering"):
                hang.result()
            assert time.monotonic() - killed_at < bus_context.client_liveness_timeout + 1.5
            after = rw.make_request(1, 0, 1, 64)  # the survivor serves on
            assert rw.check_reply(after, client.request(after, timeout=10)) == survivor["pid"]


def test_a_dead_requesters_replies_are_dropped_and_counted(bus_context, driver, procs):
    start_responders(procs, bus_context, 1)
    victim = procs.private()
    procs.start(rw.hanging_requester, bus_context, STREAM, victim.queue, 10)
    submitted = victim.wait("submitted", timeout=60)[0]
    os.kill(submitted["pid"], signal.SIGKILL)
    with shmbus.connect(bus_context) as bus:
        # ten slow requests (0.5 s each): those answered after the driver timed the
        # requester out (2 s) find no response stream and are dropped and counted; those not
        # started when its request log goes (publication_linger_timeout after) go with it
        wait_until(lambda: counter_total(bus, RR_REPLIES_DROPPED) >= 1, 30, "a dropped reply")
        with bus.add_requester("aeron:ipc", STREAM) as client:  # the responder serves on
            request = rw.make_request(1, 0, 0, 64)
            rw.check_reply(request, client.request(request, timeout=30))
        assert counter_total(bus, RR_SERVED) + counter_total(bus, RR_REPLIES_DROPPED) <= 11


def test_a_timed_out_call_drops_its_late_reply_and_counts_it(bus_context, driver, procs):
    start_responders(procs, bus_context, 1)
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        started = time.monotonic()
        with pytest.raises(shmbus.RequestTimeoutError, match="no reply before its deadline"):
            client.request(rw.make_command(1, 0, b"slow"), timeout=0.1)
        # it ended at its deadline, not with the reply (the handler takes 0.5 s to make it)
        assert 0.1 <= time.monotonic() - started < 0.5
        good = rw.make_request(1, 0, 1, 64)  # the late reply is read and dropped meanwhile
        rw.check_reply(good, client.request(good, timeout=10))
        assert counter_total(bus, RR_LATE) == 1
        assert counter_total(bus, RR_TIMED_OUT) == 1 and counter_total(bus, RR_ANSWERED) == 1


def test_result_with_a_shorter_timeout_leaves_the_call_in_flight(bus_context, driver, procs):
    start_responders(procs, bus_context, 1)
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        request = rw.make_command(1, 0, b"slow")
        call = client.submit(request, timeout=10)
        with pytest.raises(TimeoutError, match="stays in flight"):
            call.result(timeout=0.05)
        assert not call.done() and client.in_flight == 1
        rw.check_reply(request, call.result())


def test_request_async_many_coroutines(bus_context, driver, procs):
    start_responders(procs, bus_context, 2)

    async def main(client: shmbus.Requester) -> None:
        requests = [rw.make_request(2, 0, s, 48) for s in range(64)]
        replies = await asyncio.gather(*(client.request_async(r, timeout=30)
                                         for r in requests))
        for request, reply in zip(requests, replies, strict=True):
            rw.check_reply(request, reply)

    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        asyncio.run(main(client))
        assert client.in_flight == 0


def test_serve_async_answers(bus_context, driver):
    async def main(bus: shmbus.Client) -> bytes:
        with bus.add_responder("aeron:ipc", STREAM, lambda r: r[::-1]) as svc, \
                bus.add_requester("aeron:ipc", STREAM) as client:
            serving = asyncio.create_task(svc.serve_async(timeout=5))
            reply = await client.request_async(b"abc", timeout=5)
            svc.close()
            await serving
            return reply

    with shmbus.connect(bus_context) as bus:
        assert asyncio.run(main(bus)) == b"cba"


def test_bad_arguments_are_named(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        with pytest.raises(TypeError, match="handler must be callable, not int"):
            bus.add_responder("aeron:ipc", STREAM, 3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="multicast or multi-destination-cast"):
            bus.add_requester("aeron:udp?endpoint=224.0.1.1:40999", STREAM)
        client = bus.add_requester("aeron:ipc", STREAM)
        client.close()
        with pytest.raises(shmbus.ClientClosedError, match="requester .* is closed"):
            client.submit(b"x")


def call_back_to_back(client: shmbus.Requester, tag: int, thread: int, calls: int,
                      sizes: int, problems: list[str]) -> None:
    """``calls`` checked request() calls one after the other (32 to 32 + sizes - 1 bytes),
    each problem collected into ``problems`` (a thread's assert would be lost)."""
    for seq in range(calls):
        request = rw.make_request(tag, thread, seq, 32 + seq % sizes)
        try:
            rw.check_reply(request, client.request(request, timeout=30))
        except Exception as error:
            problems.append(f"thread {thread} call {seq}: {error!r}")


def run_callers(bus: shmbus.Client, client: shmbus.Requester, workers: list[threading.Thread],
                problems: list[str], total: int) -> None:
    """Run the calling threads to their end (bounded): no problem collected, ``total`` calls
    answered, none in flight, failed or late."""
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)
    assert not any(worker.is_alive() for worker in workers)
    assert problems == []
    assert client.in_flight == 0
    assert counter_total(bus, RR_ANSWERED) == total
    assert counter_total(bus, RR_IN_FLIGHT) == 0
    assert counter_total(bus, RR_FAILED) == counter_total(bus, RR_LATE) == 0


def test_lone_and_shared_callers_of_one_requester_never_mix_replies(bus_context, driver, procs):
    """Threads calling request() back to back (each alone on the requester at times, so on
    its fast path, at other times sharing it) beside a thread with calls in flight: every
    reply answers its own request, and the counters add up to the calls."""
    start_responders(procs, bus_context, 2)
    threads, calls, problems = 4, 400, []
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:

        def lone(thread: int) -> None:
            call_back_to_back(client, 3, thread, calls, 64, problems)

        def pipelined() -> None:
            for base in range(0, calls, 8):
                requests = [rw.make_request(3, threads, seq, 48) for seq in range(base, base + 8)]
                pending = [client.submit(r, timeout=30) for r in requests]
                for request, call in zip(requests, pending, strict=True):
                    try:
                        rw.check_reply(request, call.result())
                    except Exception as error:
                        problems.append(f"pipelined call: {error!r}")

        workers = [threading.Thread(target=lone, args=(t,)) for t in range(threads)]
        workers.append(threading.Thread(target=pipelined))
        run_callers(bus, client, workers, problems, (threads + 1) * calls)


def test_lone_callers_beside_an_asyncio_caller_never_lose_or_mix_replies(
        bus_context, driver, procs):
    """Threads calling request() back to back, each first look made with its call outside
    the table, beside a thread whose asyncio reader may start meanwhile and read their
    answers: every reply answers its own request, none is lost or dropped as late, and the
    counters add up to the calls."""
    start_responders(procs, bus_context, 2)
    threads, calls, gathered, problems = 2, 300, 4, []
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:

        def lone(thread: int) -> None:
            call_back_to_back(client, 7, thread, calls, 32, problems)

        async def gather_calls() -> None:
            for base in range(0, calls, gathered):
                requests = [rw.make_request(7, threads, seq, 40)
                            for seq in range(base, base + gathered)]
                replies = await asyncio.gather(
                    *(client.request_async(r, timeout=30) for r in requests),
                    return_exceptions=True)
                for request, reply in zip(requests, replies, strict=True):
                    try:
                        assert isinstance(reply, bytes), reply
                        rw.check_reply(request, reply)
                    except Exception as error:
                        problems.append(f"asyncio call: {error!r}")

        workers = [threading.Thread(target=lone, args=(t,)) for t in range(threads)]
        workers.append(threading.Thread(target=asyncio.run, args=(gather_calls(),)))
        run_callers(bus, client, workers, problems, (threads + 1) * calls)


def test_closing_during_a_lone_call_fails_it_and_counts_it(bus_context, driver, procs):
    start_responders(procs, bus_context, 1)
    with shmbus.connect(bus_context) as bus:
        client = bus.add_requester("aeron:ipc", STREAM)
        request = rw.make_request(4, 0, 0, 32)
        rw.check_reply(request, client.request(request, timeout=30))  # a responder is there
        outcomes: dict[str, BaseException | bytes] = {}
        (caller,) = calling_threads(client, outcomes, {"lone": rw.make_command(4, 1, b"hang")})
        caller.start()
        wait_until(lambda: client.in_flight == 1 and counter_total(bus, RR_IN_FLIGHT) == 1,
                   10, "the call in flight, counted")
        client.close()
        caller.join(timeout=10)
        assert not caller.is_alive()
        assert isinstance(outcomes["lone"], shmbus.ClientClosedError), outcomes


def test_a_killed_responder_wakes_an_async_caller_and_two_threads_sharing_the_requester(
        bus_context, driver, procs, monkeypatch):
    no_backstop(monkeypatch)
    killed = procs.private()
    start_responders(procs, bus_context, 1, reports=killed)
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        first = rw.make_request(5, 0, 0, 64)  # answered: the replies' image, where callers sleep
        rw.check_reply(first, client.request(first, timeout=10))
        hang = client.submit(rw.make_command(5, 0, b"hang"), timeout=60)
        victim = killed.wait("in-hand", timeout=30)[0]
        outcomes: dict[str, BaseException | bytes] = {}
        callers = calling_threads(client, outcomes, {
            "thread-1": rw.make_request(5, 0, 1, 64), "thread-2": rw.make_request(5, 0, 2, 64)},
            rw.make_request(5, 0, 3, 64))
        for caller in callers:
            caller.start()
        # each caller asleep: one holds the reader's turn and the asyncio reader await the
        # replies' log (counted there as its sleepers), one follows (on the requester)
        elapsed = kill_with_every_caller_asleep(client, callers, 4, victim["pid"])
        with pytest.raises(shmbus.ResponderLostError, match="no responder is connected"):
            hang.result(timeout=0)
        assert set(outcomes) == {"thread-1", "thread-2", "async"}
        for name, outcome in outcomes.items():
            assert isinstance(outcome, shmbus.ResponderLostError), (name, outcome)
        # the driver times the dead client out after client_liveness_timeout (2 s), on its
        # timer; its wake-up, not a 60 s look, ended every wait
        assert elapsed < bus_context.client_liveness_timeout + 1.5, elapsed
        assert client.in_flight == 0
        assert counter_total(bus, RR_FAILED) == 4 and counter_total(bus, RR_IN_FLIGHT) == 0


def test_a_killed_responder_wakes_a_lone_caller(bus_context, driver, procs, monkeypatch):
    no_backstop(monkeypatch)
    killed = procs.private()
    start_responders(procs, bus_context, 1, reports=killed)
    with shmbus.connect(bus_context) as bus, bus.add_requester("aeron:ipc", STREAM) as client:
        outcomes: dict[str, BaseException | bytes] = {}
        (caller,) = calling_threads(client, outcomes, {"lone": rw.make_command(6, 0, b"hang")})
        caller.start()
        victim = killed.wait("in-hand", timeout=30)[0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        caller.join(timeout=30)
        assert not caller.is_alive()
        assert time.monotonic() - killed_at < bus_context.client_liveness_timeout + 1.5
        assert isinstance(outcomes["lone"], shmbus.ResponderLostError), outcomes
        assert client.in_flight == 0 and counter_total(bus, RR_FAILED) == 1
