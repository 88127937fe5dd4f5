"""Request/reply across hosts: requesters on bus A call responders on bus B over UDP on
loopback, each bus with its own driver and netbridge (two bus directories, real processes,
real sockets). Every reply is checked byte for byte against its request (seq and CRC, see
tests/support/workers/rr_workers.py) and comes back only to the requester that asked; a pool of
responders on B shares the requests (a subscription group on the network image); and every
failure is an answer: no responder, a responder SIGKILLed with requests in hand (alone, and in
a pool), malformed requests and foreign datagrams, bad channels; and a responder whose request
lacks a fragment sleeps until it comes.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
from typing import Any

import pytest

import shmbus
from netbridge.frames import Nak
from shmbus.calls.requester import CONNECT_WAIT_S
from shmbus.shm import call_header
from shmbus.shm.counters import (
    RR_FAILED,
    RR_HANDLER_ERRORS,
    RR_IN_FLIGHT,
    RR_REPLIES_DROPPED,
    RR_SERVED,
)
from tests.support.calls import (
    LIVENESS,
    STREAM,
    bus_pair_serving,
    calling_threads,
    calls_answered,
    counter_total,
    kill_with_every_caller_asleep,
    no_backstop,
)
from tests.support.forged_peer import ForgedPeer, udp_socket
from tests.support.networks import free_udp_port
from tests.support.sleepers import cpu_demand
from tests.support.waits import wait_until
from tests.support.workers import rr_workers as rw

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def buses(shm_dir) -> Any:
    """(context of bus A, context of bus B, the service channel on B's endpoint)."""
    with bus_pair_serving(shm_dir) as (ctx_a, ctx_b, channel, _):
        yield ctx_a, ctx_b, channel


def start_responders(procs: Any, context: shmbus.Context, channel: str, n: int,
                     reports: Any = None) -> list[dict[str, Any]]:
    reports = procs if reports is None else reports
    for i in range(n):
        procs.start(rw.responder, context, STREAM, reports.queue, 120.0, f"responder-{i}",
                    channel)
    return reports.wait("ready", n, timeout=60)


@pytest.fixture
def lone_responder(buses, procs, monkeypatch) -> Any:
    """One responder on bus B, its reports in a queue of their own (a test kills it), and a
    requester on bus A (waits with no backstop) whose first call it answered: (bus A's client,
    the requester, the responder's reports)."""
    no_backstop(monkeypatch)
    ctx_a, ctx_b, channel = buses
    killed = procs.private()
    start_responders(procs, ctx_b, channel, 1, reports=killed)
    with shmbus.connect(ctx_a) as bus, bus.add_requester(channel, STREAM) as client:
        first = rw.make_request(1, 0, 0, 64)
        rw.check_reply(first, client.request(first, timeout=10))
        yield bus, client, killed


def test_a_pool_on_another_bus_answers_every_call_once_to_the_requester_that_asked(
        buses, procs):
    ctx_a, ctx_b, channel = buses
    pids = {r["pid"] for r in start_responders(procs, ctx_b, channel, 2)}
    threads, calls = 2, 150
    own_endpoint = f"{channel}|response-endpoint=127.0.0.1:{free_udp_port()}"
    # requester 0 pipelines 8 calls per thread with 4 KiB requests (several fragments each)
    procs.start(rw.requester, ctx_a, STREAM, procs.queue, 0, threads, calls, 4096, 8, channel)
    procs.start(rw.requester, ctx_a, STREAM, procs.queue, 1, threads, calls, 32, 1,
                own_endpoint)
    answered = calls_answered(procs.wait("calls", 2, timeout=240), pids)
    assert answered == 2 * threads * calls
    with shmbus.connect(ctx_b) as bus:
        assert counter_total(bus, RR_SERVED) == answered  # no request served twice
        assert counter_total(bus, RR_REPLIES_DROPPED) == 0


def test_no_responder_fails_the_call_promptly(buses):
    ctx_a, _, channel = buses
    with shmbus.connect(ctx_a) as bus, bus.add_requester(channel, STREAM) as client:
        started = time.monotonic()
        with pytest.raises(shmbus.NoResponderError, match="no responder is connected"):
            client.request(b"anyone?", timeout=30)
        assert time.monotonic() - started < CONNECT_WAIT_S + 1.0
        started = time.monotonic()  # past the first connection's wait: at once
        with pytest.raises(shmbus.NoResponderError):
            client.submit(b"anyone?", timeout=30).result()
        assert time.monotonic() - started < 0.5
        assert client.in_flight == 0


def test_a_lone_responder_killed_with_calls_in_hand_fails_them_within_the_liveness_timeout(
        lone_responder) -> None:
    bus, client, killed = lone_responder
    hang = client.submit(rw.make_command(1, 0, b"hang"), timeout=60)
    queued = [client.submit(rw.make_request(1, 0, s, 64), timeout=60) for s in range(1, 4)]
    victim = killed.wait("in-hand", timeout=30)[0]
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    for call in [hang, *queued]:
        with pytest.raises(shmbus.ResponderLostError, match="no responder is connected"):
            call.result()
    elapsed = time.monotonic() - killed_at
    # B's driver times the dead client out (LIVENESS, on its timer), its netbridge closes
    # the request image and tells A's (a status message with the EOS flag), A's request
    # publication is no longer connected and A's driver wakes the requester
    assert elapsed < LIVENESS + 1.5, elapsed
    assert client.in_flight == 0
    assert counter_total(bus, RR_FAILED) == 4 and counter_total(bus, RR_IN_FLIGHT) == 0


def test_a_killed_lone_responder_fails_a_lone_caller_threads_and_an_async_caller(
        lone_responder) -> None:
    """Callers sharing one requester, each asleep in its own wait (the lone caller's native
    wait, the reader's turn, a follower, the asyncio reader): the kill wakes them all."""
    bus, client, killed = lone_responder
    outcomes: dict[str, BaseException | bytes] = {}
    lone = calling_threads(client, outcomes, {"lone": rw.make_command(5, 0, b"hang")})[0]
    lone.start()  # alone on the requester: it reads its reply itself
    victim = killed.wait("in-hand", timeout=30)[0]
    callers = [lone, *calling_threads(client, outcomes, {
        "thread-1": rw.make_request(5, 0, 1, 64), "thread-2": rw.make_request(5, 0, 2, 64)},
        rw.make_request(5, 0, 3, 64))]
    for caller in callers[1:]:
        caller.start()
    # each caller asleep: the lone caller (holding the reader's turn) and the asyncio
    # reader on the replies' log (counted there as its sleepers), the threads following
    elapsed = kill_with_every_caller_asleep(client, callers, 4, victim["pid"])
    assert set(outcomes) == {"lone", "thread-1", "thread-2", "async"}
    for name, outcome in outcomes.items():
        assert isinstance(outcome, shmbus.ResponderLostError), (name, outcome)
    # the wake-up from B's leaving, not a 60 s look nor the 60 s connection timeout
    assert elapsed < LIVENESS + 1.5, elapsed
    assert client.in_flight == 0
    assert counter_total(bus, RR_FAILED) == 4 and counter_total(bus, RR_IN_FLIGHT) == 0


def test_a_silent_service_host_fails_the_calls_after_the_connection_timeout(shm_dir, procs):
    """B's driver and netbridge stopped (a host that froze or lost its network): nothing
    says the responder left, so A learns it from Context.publication_connection_timeout."""
    connection_timeout = 1.0
    with bus_pair_serving(shm_dir, publication_connection_timeout=connection_timeout,
                          client_liveness_timeout=30.0) as (ctx_a, ctx_b, channel, drivers):
        killed = procs.private()
        start_responders(procs, ctx_b, channel, 1, reports=killed)
        with shmbus.connect(ctx_a) as bus, bus.add_requester(channel, STREAM) as client:
            first = rw.make_request(7, 0, 0, 64)
            rw.check_reply(first, client.request(first, timeout=10))
            hang = client.submit(rw.make_command(7, 0, b"hang"), timeout=60)
            killed.wait("in-hand", timeout=30)
            frozen = [drivers[1].pid, *_children(drivers[1].pid)]  # B's driver and netbridge
            assert len(frozen) == 2, frozen
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                with pytest.raises(shmbus.ResponderLostError, match="no responder"):
                    hang.result()
                elapsed = time.monotonic() - stopped_at
            finally:
                for pid in frozen:
                    os.kill(pid, signal.SIGCONT)
            assert elapsed < connection_timeout + 1.5, elapsed


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


def test_a_responder_killed_mid_request_hands_it_to_another_on_its_bus(buses, procs):
    """The group on B's network image hands the dead member's claim on: the survivor answers
    the request that was in its hand "lost" (not idempotent), and serves on."""
    ctx_a, ctx_b, channel = buses
    killed = procs.private()
    victim = start_responders(procs, ctx_b, channel, 1, reports=killed)[0]
    with shmbus.connect(ctx_a) as bus, bus.add_requester(channel, STREAM) as client:
        hang = client.submit(rw.make_command(1, 0, b"hang"), timeout=60)
        killed.wait("in-hand", timeout=30)
        survivor = start_responders(procs, ctx_b, channel, 1)[0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(shmbus.ResponderLostError, match="left .died or was timed out. "
                                                            "before answering"):
            hang.result()
        assert time.monotonic() - killed_at < LIVENESS + 2.0
        after = rw.make_request(1, 0, 1, 64)
        assert rw.check_reply(after, client.request(after, timeout=10)) == survivor["pid"]


def test_malformed_requests_and_foreign_datagrams_are_counted_and_dropped(buses, procs):
    ctx_a, ctx_b, channel = buses
    start_responders(procs, ctx_b, channel, 1)
    endpoint_port = int(channel.rpartition(":")[2])
    with shmbus.connect(ctx_a) as bus, bus.add_requester(channel, STREAM) as client:
        good = rw.make_request(2, 0, 0, 100)
        rw.check_reply(good, client.request(good, timeout=10))
        head = call_header.HEADER.pack
        flagged = call_header.REQUEST, call_header.REPLY_TO, call_header.VERSION, -5, 77
        malformed = [
            b"short",
            head(call_header.REQUEST, 0, call_header.VERSION, -5, 77) + b"no reply-to",
            head(*flagged) + call_header.encode_reply_to("aeron:ipc") + b"foreign",
            head(*flagged) + call_header.encode_reply_to(
                "aeron:udp?endpoint=127.0.0.1:9|ttl=1") + b"foreign",
            head(*flagged) + struct.pack("<H", 200) + b"truncated",
            head(call_header.REPLY, 0, call_header.VERSION, 0, 77),
        ]
        with bus.add_publication(channel, STREAM) as raw:
            for message in malformed:
                raw.publish(message, timeout=10)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hostile:
            for size in (0, 1, 8, 31, 32, 1400):
                hostile.sendto(os.urandom(size), ("127.0.0.1", endpoint_port))
        with pytest.raises(shmbus.RemoteError, match="ValueError: refused"):
            client.request(rw.make_command(2, 1, b"raise"), timeout=10)
        for seq in range(2, 50):  # the responder serves on, replies still checked
            request = rw.make_request(2, 0, seq, 64 + seq)
            rw.check_reply(request, client.request(request, timeout=10))
    with shmbus.connect(ctx_b) as bus_b:
        assert counter_total(bus_b, RR_HANDLER_ERRORS) == len(malformed) + 1
        assert counter_total(bus_b, RR_SERVED) == 50


def test_a_responder_sleeps_while_a_request_fragment_awaits_its_retransmission(buses, procs):
    """A request in three fragments whose second was lost (a peer that holds it back, so the
    netbridge NAKs it for as long as the test looks): the responder does not spin over the
    first fragment it cannot claim. A spinning thread wants the CPU (running or runnable) all
    the time, a demand of 1 or more; a sleeping responder only at its wakes (every 0.1 s, and
    its client's timers), which on a loaded machine wait in the run queue. Once the fragment
    comes it gets the request whole (here not a request: counted malformed)."""
    _, ctx_b, channel = buses
    pid = start_responders(procs, ctx_b, channel, 1)[0]["pid"]
    with udp_socket() as sock:
        peer = ForgedPeer(sock, ("127.0.0.1", int(channel.rpartition(":")[2])), STREAM)
        peer.setup()
        held = peer.send_fragmented(b"q" * 3000, held_back=1)
        assert peer.receive(10, Nak), "the netbridge never asked for the missing fragment"
        window = 1.0
        before, started = cpu_demand(pid), time.monotonic()
        peer.receive(window, wanted=type(None))  # (reads the NAKs meanwhile, for the window)
        demand = (cpu_demand(pid) - before) / (time.monotonic() - started)
        assert demand < 0.6, f"the responder wanted the CPU {demand:.0%} of the time"
        peer.resend(held)
        with shmbus.connect(ctx_b) as bus_b:
            wait_until(lambda: counter_total(bus_b, RR_HANDLER_ERRORS) == 1, 30,
                       "the whole request, dropped as malformed")


def test_bad_service_channels_are_refused_naming_why(buses):
    ctx_a, _, channel = buses
    with shmbus.connect(ctx_a) as bus:
        for bad, message in [
                ("aeron:udp?endpoint=224.0.1.1:40456", "multicast"),
                ("aeron-spy:" + channel, "spies"),
                ("aeron:udp?control=127.0.0.1:40001|control-mode=dynamic", "needs endpoint"),
                (f"{channel}|response-endpoint=127.0.0.1", "is not host:port"),
                ("aeron:ipc?response-endpoint=127.0.0.1:5", "for aeron:udp services")]:
            with pytest.raises(ValueError, match=message):
                bus.add_requester(bad, STREAM)
        with pytest.raises(ValueError, match="a requester's parameter"):
            bus.add_responder(f"{channel}|response-endpoint=127.0.0.1:5", STREAM, bytes)
        with pytest.raises(ValueError, match="unknown media"):
            bus.add_responder("aeron:tcp?endpoint=127.0.0.1:5", STREAM, bytes)
        # nothing was made on the way: a service on the bus still works
        with bus.add_responder("aeron:ipc", STREAM, bytes) as svc, \
                bus.add_requester("aeron:ipc", STREAM) as client:
            call = client.submit(b"ok", timeout=10)
            deadline = time.monotonic() + 10
            while not svc.served and time.monotonic() < deadline:
                svc.poll()
            assert call.result(timeout=10) == b"ok"
