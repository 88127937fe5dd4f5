"""netbridge benchmark: shmbus streams through two netbridges on loopback, beside pyzmq over TCP.

    python -m tools.bench.netbridge [--quick] [--aeron-bin DIR]   # from the repository root

One-way throughput and a paced ping-pong between two buses, each with its own driver (a
process: ``python -m shmbus.driver``, Context.driver_command) that starts its netbridge, so a
message goes publisher -> log (bus A) -> netbridge A -> UDP 127.0.0.1 -> netbridge B -> image
log (bus B) -> subscriber. Beside it, in the same run with the same loops, pyzmq PUSH/PULL
over tcp://127.0.0.1 (throughput) and PAIR over tcp://127.0.0.1 (ping-pong); with
``--aeron-bin DIR``, Aeron C's driver and samples on the default channel (tools/bench/aeron_c.py).
The first table is the summary: 32 B and 4 KiB msg/s, the 32 B round trip's p50 at 10,000
pings a second, and the CPU of each side's bridge and driver; its targets are checked at the
end.

Authenticated channels: the same measurements on the default channel with ``|key=bench``
(channel ``keyed``: both netbridges seal and open every datagram, AES-256-GCM), beside
pyzmq with CURVE security (the same loops as plaintext zmq; the binding end the CURVE server).
The run makes its own keyring: a fresh key named ``bench`` (``shmbus keygen``) in a
0600 file in its temporary directory, Context.keyring of both buses. The second table sets
each authenticated row beside its plaintext twin: msg/s (ping-pong: p50), the ratio, and
authenticated shmbus over zmq CURVE. Each shmbus run also reads its netbridge's channel
counters (members.seal_drops): a keyed channel that the netbridge did not seal, or a
plaintext one that it did, fails the run; datagrams it refused are reported (seal_drops).

Every measurement runs in two fresh processes (multiprocessing, spawn) that the parent starts
and watches; the two drivers and their netbridges are started once and serve every shmbus run
(each run on its own stream id and UDP port, so each run gets fresh logs and images).

Throughput: the writer sends for a fixed duration, then a STOP message; the rate is messages /
(time the reader saw STOP - time the writer started), CLOCK_MONOTONIC in both processes. Every
message is checked by the reader: a run that loses, duplicates, reorders or tears a message
fails instead of reporting a number.

* shmbus offer/messages(): ExclusivePublication.offer() per message (publish() when
  back-pressured); ``for message in Subscription.messages()``, each message copied out as bytes
  (reassembled from its fragments when it is over mtu - 32: 4 KiB with the default mtu 1408)
  and checked in Python: its sequence number and a CRC-32 of every byte (harness.Checked).
* shmbus offer_many/poll_batch: offer_many() of a (1024, size) uint8 array carrying the
  sequence number at each message's head and tail, poll_batch() with those checked by numpy
  over each batch (no Python step per message).
* zmq PUSH/PULL tcp://: send(copy=True) of a reused buffer; recv() (recv(copy=False) for 4 KiB),
  each message checked as offer/messages()'s (sequence number and CRC-32). The pair exchanges
  a hello before the clock starts (with CURVE: after the handshake).

Ping-pong: 32 B messages echoed, --rate pings a second (default 10,000: paced on a fixed
schedule, not saturated; 0: back-to-back); the pinger times each round trip (perf_counter_ns),
drops the first 10% (at most 1000) as warm-up; each side checks every ping or echo (sequence
number and CRC-32, harness.checked_ping_loop). shmbus uses two streams on two UDP channels:
ping (bus A -> bus B) and pong (bus B -> bus A). zmq uses one PAIR socket pair over TCP.

Channels: each shmbus measurement runs on the default channel (a plain endpoint URI: term
4 MiB, mtu 1408, receiver window 2 MiB), on the same with key=bench (authenticated) and on a
loopback-tuned one (mtu 65504, rcv-wnd 2 MiB, term 4 MiB; --tuned changes it, --channels
picks: default, keyed, tuned).

Idle strategies: a back-pressured shmbus writer sleeps in publish() / publish_many(), woken
when the bridge's sender moves; the readers and the ping-pong sides block in Subscription.wait()
or poll(..., timeout=), woken when the bridge writes. Each netbridge, with nothing to do,
sleeps in poll() on its sockets and its log watcher (an io_uring futex wait, or a thread's
eventfd, that turns readable when a publisher writes where a sender waits), until its next
timer; each driver sleeps on its doorbell. So on a 2-core machine six processes share two
cores in a shmbus run (two drivers, two netbridges, writer, reader), two processes and two
zmq I/O threads in a zmq run.

CPU: each side's netbridge and driver (labels bridge A, bridge B, driver A, driver B), CPU
seconds over the wall seconds of the measurement (tools/bench/harness.py).

Bounded waits: every loop checks a deadline, zmq calls have timeouts, and the parent
terminates a pair of processes that overruns.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench import pages
from tools.bench.aeron_c import AeronC, find_binaries
from tools.bench.harness import (
    RTT_SIZE,
    STOP,
    BenchError,
    Checked,
    Measurement,
    Member,
    Options,
    Unavailable,
    add_run_options,
    child_pids,
    deadline_after,
    delivered,
    echoed_samples,
    median_row,
    percentiles_us,
    ping_loop,
    run_interleaved,
    run_processes,
    start_driver,
    stop_driver,
)
from tools.bench.members import (
    BATCH_ROWS,
    await_image,
    connect_publication,
    seal_drops,
    stream_reader,
    stream_writer,
)
from tools.bench.network import free_tcp_port, free_udp_ports
from tools.bench.peers import (
    CurveKeys,
    curve_keys,
    zmq_pull_reader,
    zmq_push_writer,
    zmq_tcp_rtt,
)
from tools.bench.report import (
    add_ratios,
    fmt,
    fmt_rate,
    machine,
    markdown_table,
    size_name,
    text_table,
)

SIZES = (32, 4096)
_RUN_IDS = itertools.count(1)

REPEAT = 5  # runs of every row by default, interleaved
SPREAD_FIGURES = ("msgs_per_s", "p50_us")  # the table gives these as median (lowest-highest)
PING_RATE = 10_000  # pings per second of the ping-pong runs (--rate)
#: cping's round trips per second of --duration: enough for a p99, few enough to finish on a
#: loaded 2-core machine, where two busy-spinning samples starve the drivers (ms round trips)
AERON_ROUND_TRIPS_PER_S = 1_000

SHM = "shmbus offer/messages()"
SHM_BATCH = "shmbus offer_many/poll_batch"
ZMQ = "zmq PUSH/PULL tcp://"
ZMQ_PP = "zmq PAIR tcp://"
ZMQ_CURVE = "zmq PUSH/PULL tcp:// CURVE"
ZMQ_PP_CURVE = "zmq PAIR tcp:// CURVE"
#: each authenticated zmq transport and its plaintext twin (same loops, CURVE security added)
CURVE_TWINS = {ZMQ_CURVE: ZMQ, ZMQ_PP_CURVE: ZMQ_PP}
AERON = "Aeron C streaming_publisher -> rate_subscriber"
AERON_PP = "Aeron C cping/cpong"
PEERS = (ZMQ, ZMQ_PP)
BACK_TO_BACK = "back-to-back"
SIDES = ("bridge A", "bridge B", "driver A", "driver B")  # the per-side CPU labels


@dataclass(frozen=True)
class ChannelConfig:
    """The udp channel of the shmbus runs: its name in the table and its URI parameters."""

    name: str
    params: str = ""  # "|"-separated, e.g. "mtu=65504|rcv-wnd=2097152|term-length=4194304"

    def uri(self, port: int) -> str:
        return f"aeron:udp?endpoint=127.0.0.1:{port}" + (f"|{self.params}" if self.params else "")


#: a channel as a user writes it: term 4 MiB, mtu 1408 (a 4 KiB message is 3 fragments,
#: 22 messages of 32 B fill a datagram), the default receiver window (2 MiB, half the term;
#: Aeron's: 128 KiB)
DEFAULT_CHANNEL = ChannelConfig("default")
#: loopback tuning: datagrams up to 64 KiB (no IP fragmentation on lo, whose MTU is 65536; on a
#: real network an mtu above the path MTU would be fragmented) and a 2 MiB receiver window
TUNED_CHANNEL = ChannelConfig("mtu 64K, rcv-wnd 2M",
                              "mtu=65504|rcv-wnd=2097152|term-length=4194304")
#: the name of the key that seals the authenticated channel, in the run's own keyring
KEY_NAME = "bench"
#: the default channel, authenticated: every datagram sealed with AES-256-GCM under the
#: keyring's key KEY_NAME (netbridge/sealing.py); nothing else differs from DEFAULT_CHANNEL
KEYED_CHANNEL = ChannelConfig(f"default, key={KEY_NAME}", f"key={KEY_NAME}")


# ---------------------------------------------------------------------------------------------
# The two buses: a driver process each, each auto-starting its netbridge
# ---------------------------------------------------------------------------------------------


@dataclass
class Buses:
    contexts: tuple[Any, Any]
    drivers: list[subprocess.Popen[bytes]]

    def sides(self) -> dict[str, set[int]]:
        """The processes of each side by label (SIDES): its driver and its netbridge."""
        out: dict[str, set[int]] = {}
        for side, driver in zip("AB", self.drivers, strict=True):
            out[f"driver {side}"] = {driver.pid}
            out[f"bridge {side}"] = set(child_pids(driver.pid))
        return out


def make_keyring(root: Path) -> Path:
    """The run's keyring: ``root/keyring`` with one fresh key named KEY_NAME, made as a user
    makes it (``shmbus keygen``: mode 0600); both buses read it."""
    path = root / "keyring"
    subprocess.run([sys.executable, "-m", "shmbus", "keygen", KEY_NAME, "--keyring", str(path)],
                   check=True, capture_output=True, timeout=60)
    return path


def start_buses(root: Path, term_length: int, keyring: Path) -> Buses:
    """Bus A and bus B under ``root``, each with its driver process (which starts its
    netbridge), both with ``keyring`` (Context.keyring) for the authenticated channel."""
    import shmbus

    contexts = tuple(shmbus.Context(dir=str(root / name), embedded_driver=False,
                                    driver_idle_timeout=600, ipc_term_length=term_length,
                                    keyring=str(keyring))
                     for name in ("a", "b"))
    drivers: list[subprocess.Popen[bytes]] = []
    try:
        for context in contexts:
            drivers.append(start_driver(context))
    except BaseException:
        for process in drivers:
            stop_driver(process)
        raise
    return Buses(contexts, drivers)  # type: ignore[arg-type]


def _connected(bus: Any, out_uri: str, in_uri: str, stream_id: int,
               timeout_s: float) -> tuple[Any, Any]:
    """One end of the ping-pong: (a publication on out_uri once connected, a subscription on
    in_uri once it has an image); BenchError after timeout_s."""
    deadline = deadline_after(timeout_s)
    subscription = bus.add_subscription(in_uri, stream_id)
    publication = connect_publication(bus, out_uri, stream_id, deadline)
    await_image(subscription, deadline)
    return publication, subscription


def _shm_ping(start: Any, context: Any, ping_uri: str, pong_uri: str, stream_id: int,
              rate: int | None, duration_s: float, timeout_s: float,
              done: Any) -> dict[str, Any]:
    """harness.ping_loop on bus A: ping on ping_uri, each pong taken with poll(timeout=)
    (asleep until the bridge writes it)."""
    import shmbus

    got: list[bytes] = []

    def on_pong(buffer: memoryview, header: Any) -> None:
        got.append(bytes(buffer))

    with shmbus.connect(context) as bus:
        publication, subscription = _connected(bus, ping_uri, pong_uri, stream_id, timeout_s)
        offer, publish, poll = publication.offer, publication.publish, subscription.poll
        start.ready(bus.driver_pid)
        deadline = deadline_after(timeout_s)

        def send(message: Any) -> None:
            if offer(message) < 0:
                publish(message, timeout=timeout_s)

        def recv() -> bytes:
            while not poll(on_pong, 1, timeout=0.1):
                if time.monotonic_ns() > deadline:
                    raise BenchError("no pong before the deadline")
            return got.pop()

        out = ping_loop(send, recv, duration_s, rate, checked=True)
        done.wait(timeout_s)
        out["seal_drops"] = seal_drops(bus, pong_uri)  # what bus A receives on
    return out


def _shm_pong(start: Any, context: Any, ping_uri: str, pong_uri: str, stream_id: int,
              timeout_s: float, done: Any) -> dict[str, Any]:
    """Echo each ping on bus B from inside the poll handler (no copy) until STOP, checking
    each one's sequence number and CRC-32 (harness.Checked): received, errors."""
    import shmbus

    check = Checked(RTT_SIZE).check
    expected = errors = 0
    stopped = False
    with shmbus.connect(context) as bus:
        publication, subscription = _connected(bus, pong_uri, ping_uri, stream_id, timeout_s)
        offer, publish, poll = publication.offer, publication.publish, subscription.poll

        def on_ping(buffer: memoryview, header: Any) -> None:
            nonlocal expected, errors, stopped
            seq, ok = check(buffer)
            if seq == STOP and ok:
                stopped = True
                return
            if seq != expected or not ok:
                errors += 1
            expected = seq + 1
            if offer(buffer) < 0:
                publish(buffer, timeout=timeout_s)

        start.ready(bus.driver_pid)
        deadline = deadline_after(timeout_s)
        while not stopped:
            if not poll(on_ping, 1, timeout=0.1) and time.monotonic_ns() > deadline:
                raise BenchError(f"ponger timed out after {expected} pings")
        done.set()
        sealed = seal_drops(bus, ping_uri)  # what bus B receives on
    return {"received": expected, "errors": errors, "seal_drops": sealed}


# ---------------------------------------------------------------------------------------------
# The parent: run pairs of processes under a watchdog
# ---------------------------------------------------------------------------------------------


def run_throughput(ctx: Any, buses: Buses, aeron: AeronC | None, transport: str,
                   config: ChannelConfig | None, size: int, opt: Options,
                   every_byte: bool = True) -> dict[str, Any]:
    """One throughput run: its figures (msgs/s, MB/s, cores by process); BenchError if any
    message was lost, repeated, reordered or torn. ``every_byte``: a shmbus reader checks
    every byte of every message (members.stream_reader's ``checked``), else the sequence
    number at head and tail only (zmq's reader checks every byte either way)."""
    if transport == AERON:
        assert aeron is not None and config is not None
        with aeron.running():
            return aeron.throughput(config.uri(free_udp_ports(1)[0]), size, opt.duration_s,
                                    opt.timeout_s)
    run = next(_RUN_IDS)
    done = ctx.Event()
    watch = None
    if transport in (ZMQ, ZMQ_CURVE):
        endpoint, curve = _zmq_link(transport == ZMQ_CURVE)
        writer = Member("writer", zmq_push_writer, (endpoint, size, opt.duration_s,
                                                    opt.timeout_s, done, curve))
        reader = Member("reader", zmq_pull_reader, (endpoint, size, opt.timeout_s, done,
                                                    curve))
    else:
        assert config is not None
        uri = config.uri(free_udp_ports(1)[0])
        batch = transport == SHM_BATCH
        writer = Member("writer", stream_writer, (buses.contexts[0], uri, 1000 + run, size,
                                                  opt.duration_s, opt.timeout_s, done, batch,
                                                  (), every_byte))
        reader = Member("reader", stream_reader, (buses.contexts[1], uri, 1000 + run, size,
                                                  opt.timeout_s, done, batch, every_byte))
        watch = buses.sides
    out = run_processes(ctx, [reader, writer], 2 * opt.timeout_s + opt.duration_s + 30, watch)
    sent, seconds = delivered(out)
    return {"messages": sent, "received": sent, "errors": 0,
            **_sealing(config, [out.results["reader"].get("seal_drops")]), "seconds": seconds,
            "msgs_per_s": sent / seconds, "mb_per_s": sent * size / seconds / 1e6,
            "cpu_us_per_msg": _cpu_seconds(out) / sent * 1e6, "cores": out.cores}


def _zmq_link(curve: bool) -> tuple[str, CurveKeys | None]:
    """A zmq run's endpoint (tcp on loopback, a free port) and, with curve, its CURVE keys."""
    return f"tcp://127.0.0.1:{free_tcp_port()}", curve_keys() if curve else None


def _cpu_seconds(out: Any) -> float:
    """CPU seconds of every process of a measurement: writer and reader (zmq's I/O threads
    are theirs), each bus's driver and netbridge (the labels of run_processes; SIDES only
    name the same processes again, by side)."""
    return sum(c for label, c in out.cores.items()
               if label not in SIDES and c is not None) * out.wall_s


def _sealing(config: ChannelConfig | None, drops: list[dict[str, int] | None]
             ) -> dict[str, Any]:
    """A shmbus run's ``sealed`` (whether the netbridges sealed the receiving channels: see
    members.seal_drops) and ``seal_drops`` (datagrams they refused); BenchError when a keyed
    channel was not sealed, or a plaintext one was. Nothing for the other transports."""
    if config is None:
        return {}
    sealed = [d is not None for d in drops]
    keyed = "key=" in config.params
    if any(s != keyed for s in sealed):
        raise BenchError(f"channel [{config.name}]: the netbridge "
                         f"{'did not seal' if keyed else 'sealed'} its datagrams")
    return {"sealed": keyed,
            "seal_drops": sum(sum(d.values()) for d in drops if d is not None)}


def run_latency(ctx: Any, buses: Buses, aeron: AeronC | None, transport: str,
                config: ChannelConfig | None, opt: Options) -> dict[str, Any]:
    """One ping-pong run: its round-trip percentiles, the pings per second it achieved and
    cores by process; BenchError if an echo was wrong."""
    if transport == AERON_PP:
        assert aeron is not None and config is not None
        round_trips = max(100, int(opt.duration_s * AERON_ROUND_TRIPS_PER_S))
        ping_port, pong_port = free_udp_ports(2)
        with aeron.running():
            return {**aeron.ping_pong(config.uri(ping_port), config.uri(pong_port),
                                      round_trips, opt.timeout_s + opt.duration_s),
                    "pace": BACK_TO_BACK}
    run = next(_RUN_IDS)
    done = ctx.Event()
    watch = None
    if transport in (ZMQ_PP, ZMQ_PP_CURVE):
        endpoint, curve = _zmq_link(transport == ZMQ_PP_CURVE)
        pinger = Member("ping", zmq_tcp_rtt, (endpoint, True, opt.rate, opt.duration_s,
                                              opt.timeout_s, done, curve, True))
        ponger = Member("pong", zmq_tcp_rtt, (endpoint, False, None, opt.duration_s,
                                              opt.timeout_s, done, curve, True))
    else:
        assert config is not None
        ping_uri, pong_uri = (config.uri(port) for port in free_udp_ports(2))
        pinger = Member("ping", _shm_ping, (buses.contexts[0], ping_uri, pong_uri, 1000 + run,
                                            opt.rate, opt.duration_s, opt.timeout_s, done))
        ponger = Member("pong", _shm_pong, (buses.contexts[1], ping_uri, pong_uri, 1000 + run,
                                            opt.timeout_s, done))
        watch = buses.sides
    out = run_processes(ctx, [ponger, pinger], 2 * opt.timeout_s + opt.duration_s + 30, watch)
    samples = echoed_samples(out, "ping", "pong")
    ping, pong = out.results["ping"], out.results["pong"]
    return {**percentiles_us(samples), "pings": len(samples), "echoed": len(samples),
            "errors": 0, **_sealing(config, [ping.get("seal_drops"), pong.get("seal_drops")]),
            "pings_per_s": ping["pings_per_s"], "pace": _pace_name(opt.rate),
            "cores": out.cores}


def _pace_name(rate: int | None) -> str:
    return BACK_TO_BACK if rate is None else f"{rate:,}/s"


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _row(rows: list[dict[str, Any]], test: str, transport: str, channel: str,
         size: int) -> dict[str, Any] | None:
    """The measured row of that test, transport, channel and size, if any."""
    return next((r for r in rows if (r["test"], r["transport"], r["channel"], r["size"]) ==
                 (test, transport, channel, size) and r["status"] == "ok"), None)


def evaluate_targets(rows: list[dict[str, Any]], channels: list[str]) -> list[dict[str, Any]]:
    """The netbridge's targets, each as {target, value, goal, status: PASS / FAIL / n/a}: on the
    default channel 32 B >= 3 M msg/s, >= 0.8x Aeron C and >= 2.5x zmq; 4 KiB >= 250 MB/s;
    ping-pong p50 <= 100 us; on the tuned one (any other of ``channels`` but the keyed one)
    4 KiB >= 1x zmq; then authenticated_targets."""
    targets: list[dict[str, Any]] = []
    default = DEFAULT_CHANNEL.name
    tuned = next((name for name in channels if name not in (default, KEYED_CHANNEL.name)),
                 None)
    checks: list[tuple[str, str, str, int, str, float, str]] = []  # name, test, .., field, goal
    for transport in (SHM, SHM_BATCH):
        checks += [
            (f"32 B {transport} msg/s >= 3 M", "throughput", transport, 32, "msgs_per_s", 3e6,
             ">="),
            (f"32 B {transport} >= 0.8x Aeron C", "throughput", transport, 32, "x_aeron", 0.8,
             ">="),
            (f"32 B {transport} >= 2.5x zmq", "throughput", transport, 32, "x_zmq", 2.5, ">="),
            (f"4 KiB {transport} MB/s >= 250", "throughput", transport, 4096, "mb_per_s", 250,
             ">="),
        ]
    checks.append(("ping-pong p50 us <= 100", "ping-pong", SHM, RTT_SIZE, "p50_us", 100,
                   "<="))
    for name, test, transport, size, key, goal, sense in checks:
        if default not in channels:
            break
        row = _row(rows, test, transport, default, size)
        value = None if row is None else row.get(key)
        if key == "x_aeron" and row is not None:
            aeron = _row(rows, "throughput", AERON, default, size)
            value = None if aeron is None else row["msgs_per_s"] / aeron["msgs_per_s"]
        targets.append(_target(f"{name} [{default}]", value, goal, sense))
    if tuned is not None:
        for transport in (SHM, SHM_BATCH):
            row = _row(rows, "throughput", transport, tuned, 4096)
            targets.append(_target(f"4 KiB {transport} >= 1x zmq [{tuned}]",
                                   None if row is None else row.get("x_zmq"), 1.0, ">="))
    return targets + authenticated_targets(rows, channels)


def authenticated_targets(rows: list[dict[str, Any]], channels: list[str]
                          ) -> list[dict[str, Any]]:
    """The targets of authenticated channels (issue 34), on the keyed default channel: at 32 B
    and 4 KiB, each shmbus way >= 0.7x its plaintext msg/s and offer/messages() (a Python step
    per message, like zmq's loop) >= 3x zmq CURVE's msg/s; the ping-pong p50 <= 1.2x the
    plaintext p50 (see add_authenticated_ratios)."""
    keyed = KEYED_CHANNEL.name
    if keyed not in channels:
        return []
    targets: list[dict[str, Any]] = []

    def value(test: str, transport: str, size: int, key: str) -> float | None:
        row = _row(rows, test, transport, keyed, size)
        return None if row is None else row.get(key)

    for size in SIZES:
        for transport in (SHM, SHM_BATCH):
            targets.append(_target(f"{size_name(size)} {transport} >= 0.7x plaintext [{keyed}]",
                                   value("throughput", transport, size, "x_plain"), 0.7, ">="))
        targets.append(_target(f"{size_name(size)} {SHM} >= 3x zmq CURVE [{keyed}]",
                               value("throughput", SHM, size, "x_curve"), 3.0, ">="))
    targets.append(_target(f"ping-pong p50 <= 1.2x plaintext [{keyed}]",
                           value("ping-pong", SHM, RTT_SIZE, "x_plain"), 1.2, "<="))
    return targets


def add_authenticated_ratios(rows: list[dict[str, Any]]) -> None:
    """On each ok authenticated row (shmbus on KEYED_CHANNEL, zmq with CURVE): ``x_plain``,
    against its plaintext twin (shmbus on DEFAULT_CHANNEL, zmq without CURVE): msg/s over the
    twin's for throughput, p50 over the twin's p50 for ping-pong (lower is better); and on
    the shmbus ones ``x_curve``, against zmq CURVE at the same size: msg/s over CURVE's, or
    CURVE's p50 over the row's (higher is better, as x zmq)."""
    for r in rows:
        if r["status"] != "ok":
            continue
        if r["channel"] == KEYED_CHANNEL.name:
            twin = _row(rows, r["test"], r["transport"], DEFAULT_CHANNEL.name, r["size"])
            curve = _row(rows, r["test"], ZMQ_CURVE if r["test"] == "throughput"
                         else ZMQ_PP_CURVE, "-", r["size"])
        elif r["transport"] in CURVE_TWINS:
            twin = _row(rows, r["test"], CURVE_TWINS[r["transport"]], "-", r["size"])
            curve = None
        else:
            continue
        throughput = r["test"] == "throughput"
        if twin is not None:
            r["x_plain"] = (r["msgs_per_s"] / twin["msgs_per_s"] if throughput
                            else r["p50_us"] / twin["p50_us"])
        if curve is not None:
            r["x_curve"] = (r["msgs_per_s"] / curve["msgs_per_s"] if throughput
                            else curve["p50_us"] / r["p50_us"])


def authenticated_table(rows: list[dict[str, Any]], sizes: tuple[int, ...]) -> str:
    """The authenticated channels' table (markdown): for each size and way of sending its
    plaintext and authenticated msg/s (shmbus: the default channel without and with
    key=KEY_NAME; zmq: without and with CURVE), their ratio and the authenticated shmbus row
    over zmq CURVE; then the same for the ping-pong's p50."""
    keyed, plain = KEYED_CHANNEL.name, DEFAULT_CHANNEL.name
    headers = ["loopback, one stream", "plaintext", f"authenticated (key={KEY_NAME} / CURVE)",
               "authenticated / plaintext", "authenticated x zmq CURVE",
               "CPU us/msg, all processes: plaintext / authenticated"]
    lines = []
    pairs = [(SHM, plain, SHM, keyed), (SHM_BATCH, plain, SHM_BATCH, keyed),
             (ZMQ, "-", ZMQ_CURVE, "-")]
    for size in sizes:
        for base, base_channel, transport, channel in pairs:
            b = _row(rows, "throughput", base, base_channel, size)
            r = _row(rows, "throughput", transport, channel, size)
            if b is None and r is None:
                continue
            lines.append([f"{size_name(size)} msg/s: {_AUTH_LABELS[base]}",
                          "-" if b is None else fmt_rate(b["msgs_per_s"]),
                          "-" if r is None else fmt_rate(r["msgs_per_s"]),
                          fmt((r or {}).get("x_plain"), 2), fmt((r or {}).get("x_curve"), 2),
                          f"{fmt((b or {}).get('cpu_us_per_msg'), 2)} / "
                          f"{fmt((r or {}).get('cpu_us_per_msg'), 2)}"])
    for base, base_channel, transport, channel in ((SHM, plain, SHM, keyed),
                                                   (ZMQ_PP, "-", ZMQ_PP_CURVE, "-")):
        b = _row(rows, "ping-pong", base, base_channel, RTT_SIZE)
        r = _row(rows, "ping-pong", transport, channel, RTT_SIZE)
        if b is None and r is None:
            continue
        pace = (b or r or {}).get("pace", "-")
        lines.append([f"RTT p50 us ({RTT_SIZE} B at {pace}): {_AUTH_LABELS[base]}",
                      "-" if b is None else f"{b['p50_us']:,.1f}",
                      "-" if r is None else f"{r['p50_us']:,.1f}",
                      fmt((r or {}).get("x_plain"), 2), fmt((r or {}).get("x_curve"), 2),
                      "-"])
    return markdown_table(headers, lines, range(1, len(headers)))


_AUTH_LABELS = {
    SHM: "shmbus offer/messages()",
    SHM_BATCH: "shmbus offer_many/poll_batch",
    ZMQ: "pyzmq PUSH/PULL tcp://",
    ZMQ_PP: "pyzmq PAIR tcp://",
}


def _target(name: str, value: float | None, goal: float, sense: str) -> dict[str, Any]:
    met = value is not None and (value >= goal if sense == ">=" else value <= goal)
    return {"target": name, "value": value, "goal": goal,
            "status": "n/a" if value is None else ("PASS" if met else "FAIL")}


def _sides_cell(row: dict[str, Any] | None) -> str:
    cores = (row or {}).get("cores") or {}
    if not any(cores.get(label) is not None for label in SIDES):
        return "-"
    return " / ".join("-" if cores.get(label) is None else f"{cores[label]:.0%}"
                      for label in SIDES)


def summary_table(rows: list[dict[str, Any]], sizes: tuple[int, ...],
                  channels: list[str]) -> str:
    """The summary table (markdown): a line per way of sending, msg/s by size (MB/s from 4 KiB),
    its round trip p50 and the CPU of each bridge and driver in the first size's run."""
    headers = ["loopback, one stream",
               *(f"{size_name(z)} msg/s" + (" (MB/s)" if z >= 1024 else "") for z in sizes),
               f"RTT p50 us ({RTT_SIZE} B ping-pong)",
               f"cores in the {size_name(sizes[0])} run: {' / '.join(SIDES)}"]
    ways = [(AERON, AERON_PP, DEFAULT_CHANNEL.name)]
    ways += [(t, SHM if t == SHM else None, channel) for channel in channels
             for t in (SHM, SHM_BATCH)]
    ways += [(ZMQ, ZMQ_PP, "-"), (ZMQ_CURVE, ZMQ_PP_CURVE, "-")]
    lines = []
    for transport, latency, channel in ways:
        if not any(r["transport"] == transport and r["channel"] == channel for r in rows):
            continue
        cells = []
        for size in sizes:
            r = _row(rows, "throughput", transport, channel, size)
            cells.append("-" if r is None else fmt_rate(r["msgs_per_s"]) + (
                f" ({r['mb_per_s']:,.0f} MB/s)" if size >= 1024 else ""))
        pp = None if latency is None else _row(rows, "ping-pong", latency, channel,
                                               RTT_SIZE)
        cells.append("-" if pp is None else f"{pp['p50_us']:,.1f} at {pp['pace']}")
        cells.append(_sides_cell(_row(rows, "throughput", transport, channel, sizes[0])))
        label = _SUMMARY_LABELS[transport] + ("" if channel == "-" else f" [{channel}]")
        lines.append([label, *cells])
    return markdown_table(headers, lines, range(1, len(headers) - 1))


_SUMMARY_LABELS = {
    AERON: "Aeron C driver (SHARED) x2: streaming_publisher -> rate_subscriber; RTT cping/cpong",
    SHM: "shmbus over two netbridges: offer/messages()",
    SHM_BATCH: "shmbus over two netbridges: offer_many/poll_batch",
    ZMQ: "pyzmq PUSH/PULL tcp://; RTT PAIR tcp://",
    ZMQ_CURVE: "pyzmq PUSH/PULL tcp:// CURVE; RTT PAIR tcp:// CURVE",
}


def _spread_cell(row: dict[str, Any], figure: str, f: Callable[[float], str]) -> str:
    """A figure as median (lowest-highest run), or its median alone (or "-") without a
    spread."""
    found = row.get(f"{figure}_spread")
    if found:
        return pages.fmt_spread(pages.Spread(**found), f)
    value = row.get(figure)
    return "-" if value is None else f(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    headers = ["test", "transport", "channel", "size", "pace", "msgs/s", "MB/s", "x zmq",
               "x plain", "x CURVE", "cpu us/msg", "p50 us", "p99 us", "max us",
               f"cores: {' / '.join(SIDES)}", "check"]
    lines = []
    for r in rows:
        lines.append([
            r["test"], r["transport"], r["channel"], str(r["size"]), r.get("pace", "-"),
            _spread_cell(r, "msgs_per_s", lambda v: f"{v:,.0f}"), fmt(r.get("mb_per_s"), 1),
            fmt(r.get("x_zmq"), 2), fmt(r.get("x_plain"), 2), fmt(r.get("x_curve"), 2),
            fmt(r.get("cpu_us_per_msg"), 2), _spread_cell(r, "p50_us", lambda v: f"{v:.1f}"),
            fmt(r.get("p99_us"), 1), fmt(r.get("max_us"), 1),
            _sides_cell(r), (f"ok, {r.get('checks', '-')}" if r["status"] == "ok" else
                             {"n/a": "n/a"}.get(r["status"], "FAILED")),
        ])
    return text_table(headers, lines, {3, 5, 6, 7, 8, 9, 10, 11, 12, 13},
                      [(r["test"], r["size"]) for r in rows])


NOTES = f"""\
notes:
  shmbus path: writer -> log (bus A) -> netbridge A -> UDP 127.0.0.1 -> netbridge B -> image
    (bus B) -> reader; each bus has its own driver process, which started its netbridge.
  channels (shmbus rows; Aeron's on the default one only: its driver refuses a receiver window
  over its socket buffer, 128 KiB unless configured):
{{channels}}
    default: shmbus term 4 MiB (Aeron's default term: 16 MiB), mtu 1408 (4 KiB messages in 3
    fragments, 22 messages of 32 B per datagram), receiver window 2 MiB (Aeron's: 128 KiB).
  waiting: back-pressured shmbus writers sleep in publish() until the bridge's sender moves, readers
    block in Subscription.messages(), wait() or poll(..., timeout=), woken by the bridges; a
    netbridge with nothing to do sleeps in poll() on its sockets and its log watcher
    (readable when a publisher writes where a sender waits, or subscribers read up to where a
    status message falls due) until its next timer; drivers sleep on their doorbells. zmq:
    blocking calls with timeouts (and libzmq's I/O thread). Aeron C: two aeronmd (threading
    SHARED, default back-off idle), the samples busy-spin.
  throughput: offer/messages() = ExclusivePublication.offer / Subscription.messages(), every
    message copied out as bytes (reassembled when fragmented) and its sequence number and
    CRC-32 checked (a Python step per message); batch = offer_many of ({BATCH_ROWS}, size) uint8
    arrays / Image.poll_batch(limit {BATCH_ROWS}), numpy checks of the sequence number at head
    and tail (no Python step per message). zmq PUSH/PULL: send(copy=True) of a reused buffer,
    recv() (copy=False for 4 KiB), each message checked as offer/messages()'s.
    Aeron C: streaming_publisher -L size -m N (its own total: N over the time to offer them).
  authenticated: [{KEYED_CHANNEL.name}] is the default channel with key={KEY_NAME}: both
    netbridges seal and open every datagram (AES-256-GCM, OpenSSL libcrypto) with the
    key of that name in the run's keyring (a fresh key in a 0600 file in a temporary
    directory, Context.keyring of both buses); zmq CURVE: the same loops as zmq's, the
    binding end a CURVE server (curve_server, curve_secretkey/publickey), the connecting end
    its client (curve_serverkey, curve_publickey/secretkey), the handshake done before the
    clock starts.
  ping-pong: {RTT_SIZE} B round trips in microseconds, first 10% (<= 1000) dropped, paced
    as "pace" says (pings sent on a fixed schedule; a late pong delays only its own ping).
    shmbus: two streams (ping A -> B, pong B -> A) on two UDP channels; zmq: PAIR over tcp://;
    every ping and pong's sequence number and CRC-32 checked (shmbus and zmq);
    Aeron C: cping/cpong, which have no pacing (back-to-back, busy-spinning;
    {AERON_ROUND_TRIPS_PER_S:,} round trips per second of the run's duration).
  x zmq: throughput msgs/s / zmq's msgs/s at the same size; ping-pong zmq p50 / p50.
  x plain (authenticated rows): msgs/s / the plaintext twin's (shmbus [default], zmq without
    CURVE); ping-pong: p50 / the twin's p50 (lower is better). x CURVE (authenticated shmbus
    rows): msgs/s / zmq CURVE's at the same size; ping-pong: CURVE's p50 / p50.
  cores: CPU time / wall time of each side's netbridge and driver (Aeron: its drivers, which
    do the bridges' work), from the start of the measurement to its end (100% = one core).
  cpu us/msg (throughput): CPU seconds of every process of the run (writer, reader, both
    drivers and netbridges; zmq: writer and reader, their I/O threads included) per message.
  every shmbus and zmq message is checked by its reader: sequence number and CRC-32 of every
    byte (batch rows: the sequence number at head and tail; Aeron's samples count only).
  MB = 10^6 payload bytes."""


def format_targets(targets: list[dict[str, Any]]) -> str:
    width = max(len(t["target"]) for t in targets)
    out = []
    for t in targets:
        value = "-" if t["value"] is None else f"{t['value']:.3g}"
        out.append(f"  {t['status']:4s}  {t['target'].ljust(width)}  measured {value}")
    return "\n".join(out)


def _channel_configs(names: str, tuned_params: str) -> list[ChannelConfig]:
    configs = {"default": DEFAULT_CHANNEL, "keyed": KEYED_CHANNEL, "tuned": ChannelConfig(
        TUNED_CHANNEL.name if tuned_params == TUNED_CHANNEL.params else tuned_params,
        tuned_params)}
    out = []
    for name in names.split(","):
        if name not in configs:
            raise SystemExit(f"--channels: unknown channel {name!r} (default, keyed, tuned)")
        out.append(configs[name])
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, 1.5, "per throughput and ping-pong run")
    parser.set_defaults(repeat=None)  # REPEAT, or 1 with --quick
    parser.add_argument("--channels", default="default,keyed,tuned",
                        help="shmbus channel configurations to run, comma-separated: default "
                             f"(plain endpoint URI), keyed (the same with key={KEY_NAME}: "
                             "authenticated; zmq CURVE runs beside it), tuned (default: all)")
    parser.add_argument("--tuned", default=TUNED_CHANNEL.params, metavar="PARAMS",
                        help=f"URI parameters of the tuned channel (default "
                             f"{TUNED_CHANNEL.params!r})")
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        default=SIZES, help="throughput sizes, comma-separated (default 32,4096)")
    parser.add_argument("--rate", type=int, default=PING_RATE,
                        help=f"pings per second of the ping-pong runs, 0 for back-to-back "
                             f"(default {PING_RATE:,})")
    parser.add_argument("--aeron-bin", type=Path, metavar="DIR",
                        help="an Aeron C build's binaries (aeronmd, streaming_publisher, "
                             "rate_subscriber, cping, cpong): measure Aeron C in the same run")
    parser.add_argument("--only", help="run only the transports whose name contains this")
    parser.add_argument("--no-latency", action="store_true", help="skip the ping-pong runs")
    parser.add_argument("--check", choices=("every-byte", "head-tail"), default="every-byte",
                        help="what the shmbus throughput readers check of every message: every "
                             "byte (default), or the sequence number at head and tail")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    for size in args.sizes:
        if size < 16 or size % 8:
            parser.error(f"message size {size}: a multiple of 8, at least 16")
    if args.rate < 0:
        parser.error(f"--rate {args.rate}: pings per second, 0 (back-to-back) or more")
    if args.aeron_bin is not None:
        try:
            args.aeron_binaries = find_binaries(args.aeron_bin)
        except Unavailable as e:
            parser.error(str(e))
    return args


def _key(test: str, transport: str, channel: str, size: int,
         checks: str = "every byte") -> dict[str, Any]:
    """A row's identity: test, transport, channel and size; and what its readers check."""
    return {"test": test, "transport": transport, "channel": channel, "size": size,
            "checks": checks}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    duration = 0.3 if args.quick else args.duration
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else REPEAT)
    every_byte = args.check == "every-byte"
    opt = Options(duration_s=duration, timeout_s=args.timeout, rate=args.rate or None)
    configs = _channel_configs(args.channels, args.tuned)
    ctx = mp.get_context("spawn")
    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="shmbus-bench-nb-", dir=shm_root))

    def wanted(transport: str) -> bool:
        return args.only is None or args.only.lower() in transport.lower()

    def report(row: dict[str, Any]) -> None:
        if row["status"] == "ok":
            summary = (f"{row['msgs_per_s']:,.0f} msgs/s" if row["test"] == "throughput"
                       else f"p50 {row['p50_us']:.1f} us")
        else:
            summary = f"{row['status']}: {row['error']}"
        print(f"  {row['test']:10s} {row['transport']:28s} {row['channel']:20s} "
              f"{row['size']:5d} B  {summary}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    print(f"netbridge bench: {duration} s per run, median of {repeat}, {os.cpu_count()} CPUs, "
          f"load {load_before[0]:.2f}; progress on stderr", file=sys.stderr, flush=True)
    aeron = None
    if args.aeron_bin is not None and (wanted(AERON) or wanted(AERON_PP)):
        aeron = AeronC(args.aeron_binaries, root / "aeron")
    shm_ways = [t for t in (SHM, SHM_BATCH) if wanted(t)]
    # zmq CURVE runs beside the authenticated channel, zmq beside any
    zmq_ways = [t for t in (ZMQ, *([ZMQ_CURVE] if KEYED_CHANNEL in configs else []))
                if wanted(t)]
    zmq_pp_ways = [t for t in (ZMQ_PP, *([ZMQ_PP_CURVE] if KEYED_CHANNEL in configs else []))
                   if wanted(t)]
    buses = start_buses(root, 1024 * 1024, make_keyring(root))
    # the measurements; run_interleaved interleaves their repeats
    plan: list[Measurement] = []
    for size in args.sizes:
        for config in configs:
            aeron_too = aeron is not None and config == DEFAULT_CHANNEL
            for transport in [*shm_ways, *([AERON] if aeron_too else [])]:
                checks = ("count only" if transport == AERON else
                          "every byte" if every_byte else "seq at head and tail")
                plan.append((_key("throughput", transport, config.name, size, checks),
                             lambda t=transport, c=config, s=size:
                             run_throughput(ctx, buses, aeron, t, c, s, opt, every_byte)))
        for transport in zmq_ways:
            plan.append((_key("throughput", transport, "-", size),
                         lambda t=transport, s=size:
                         run_throughput(ctx, buses, aeron, t, None, s, opt)))
    if not args.no_latency:
        for config in configs:
            aeron_too = aeron is not None and config == DEFAULT_CHANNEL
            for transport in [*([SHM] if wanted(SHM) else []), *([AERON_PP] if aeron_too else [])]:
                plan.append((_key("ping-pong", transport, config.name, RTT_SIZE,
                                  "count only" if transport == AERON_PP else "every byte"),
                             lambda t=transport, c=config:
                             run_latency(ctx, buses, aeron, t, c, opt)))
        for transport in zmq_pp_ways:
            plan.append((_key("ping-pong", transport, "-", RTT_SIZE),
                         lambda t=transport: run_latency(ctx, buses, aeron, t, None, opt)))
    try:
        runs = run_interleaved(plan, repeat, report)
    finally:
        for process in buses.drivers:
            stop_driver(process)
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    rows = [median_row(r) for r in runs]
    for row, done in zip(rows, runs, strict=True):  # datagrams refused in any of the runs
        row["size"] = done[0]["size"]  # not a median
        if row["status"] == "ok" and "seal_drops" in row:
            row["seal_drops"] = sum(r["seal_drops"] for r in done)
        for figure in SPREAD_FIGURES:  # the median's spread over the runs, as a dict (JSON)
            found = pages.spread(r.get(figure) for r in done if r["status"] == "ok")
            row[f"{figure}_spread"] = vars(found) if found and row.get(figure) else None
    # x zmq: msgs/s over zmq's at the same size; for ping-pong zmq's p50 over the row's
    add_ratios(rows, "x_zmq", lambda r: r["transport"] in PEERS, lambda r: (r["test"], r["size"]),
               lambda r, zmq: (r["msgs_per_s"] / zmq["msgs_per_s"] if r["test"] == "throughput"
                               else zmq["p50_us"] / r["p50_us"]))
    add_authenticated_ratios(rows)  # x plain and x CURVE
    channel_names = [c.name for c in configs]
    targets = evaluate_targets(rows, channel_names)

    print()
    print(f"netbridge bench: {duration} s per run, median of {repeat}; python "
          f"{machine()['python']}, {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print()
    print(summary_table(rows, tuple(args.sizes), channel_names))
    print()
    if KEYED_CHANNEL in configs:
        print(f"authenticated channels: shmbus on the default channel without and with "
              f"key={KEY_NAME}, pyzmq without and with CURVE")
        print()
        print(authenticated_table(rows, tuple(args.sizes)))
        print()
    print(format_table(rows))
    print()
    channels = "\n".join(f"    [{c.name}] {c.uri(0).replace(':0', ':PORT')}" for c in configs)
    print(NOTES.format(channels=channels))
    print()
    print("targets:")
    print(format_targets(targets))
    failed = [r for r in rows if r["status"] != "ok"]
    for r in failed:
        print(f"\n{r['status'].upper()} {r['test']} {r['transport']} [{r['channel']}] "
              f"{r['size']} B: {r['error']}")
    if args.json:
        report_json = {
            "settings": {"duration_s": duration, "repeat": repeat, "rate": opt.rate,
                         "channels": {c.name: c.params for c in configs},
                         "key_name": KEY_NAME,
                         "aeron_bin": None if args.aeron_bin is None else str(args.aeron_bin),
                         "load_before": load_before, "load_after": load_after, **machine()},
            "rows": rows,
            "targets": targets,
        }
        Path(args.json).write_text(json.dumps(report_json, indent=2) + "\n")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
