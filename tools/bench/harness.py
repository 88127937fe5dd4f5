"""How the benchmarks in tools/bench/ measure: processes under a watchdog and their CPU,
medians of repeated runs, checked messages, the ping and pong loops, driver processes.

Runs in the parent process of a benchmark (and, for :class:`Start`, the messages and the
round-trip loops, in each spawned member). Imports only the public API of shmbus, psutil and
numpy; nothing from tests/.

A measurement runs each member (a role, a function, its arguments) in a process of its own
(multiprocessing spawn). A member sets itself up, then calls ``start.ready()`` (naming the
driver it is connected to, if any), which waits until every member and the parent are ready;
its work is then timed and accounted from that moment. The member's function returns a dict
of results. The parent takes the CPU time (user + system, all threads) of every process
involved when all are ready and again when the last member has returned (the members wait,
idle, until it has): the members, the driver of each bus a member named, and the driver's
child processes (netbridges), plus any processes the caller names. ``cores`` of a process is
its CPU seconds over those wall seconds (1.0 = one core busy all the time).

Every wait has a deadline: a member that fails reports its traceback, one that overruns is
terminated, and the measurement raises :class:`BenchError` (or :class:`Unavailable` when the
thing measured does not exist here: a missing package or API).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import queue
import signal
import statistics
import struct
import subprocess
import time
import traceback
import zlib
from array import array
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

STOP = -1  # sequence number of the message that ends a throughput run
READY_TIMEOUT_S = 60.0  # for every member to set up (spawn, imports, connect) and say ready
RTT_SIZE = 32  # bytes of a ping
MAX_SAMPLES = 500_000  # round trips kept at most per run


class BenchError(RuntimeError):
    """A measurement that failed: a member crashed, overran, or got wrong messages."""


class Unavailable(BenchError):
    """A measurement that cannot run here: a package, or an API it measures, is missing."""


#: exceptions that, raised by a member, mean "not available here" rather than "failed"
UNAVAILABLE_ERRORS = ("Unavailable", "ImportError", "ModuleNotFoundError")


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------


def codec(size: int) -> struct.Struct:
    """A message of ``size`` bytes (at least 16): an int64 at its head and one at its tail."""
    if size < 16:
        raise ValueError(f"message size {size}: at least 16 bytes (head and tail words)")
    return struct.Struct(f"<q{size - 16}xq")


SEQUENCE = struct.Struct("<q")
TRAILER = struct.Struct("<qI")  # sequence number, CRC-32 of the body and the sequence number
#: zlib.crc32 of any data followed by its own CRC-32 in little-endian order
CRC_RESIDUE = 0x2144DF1C


class Checked:
    """Makes and checks copied messages: a fixed body, then TRAILER. The writer computes the
    body's CRC once and continues it over each sequence number; the reader checks every byte
    with one CRC over the whole message (see CRC_RESIDUE)."""

    def __init__(self, size: int) -> None:
        if size < 16:
            raise ValueError(f"message size {size}: at least 16 bytes")
        self.size = size
        self.seq_offset = size - TRAILER.size
        self.body = bytes(i % 251 for i in range(self.seq_offset))
        body_crc, seq_offset = zlib.crc32(self.body), self.seq_offset
        pack_into, pack, unpack_from, crc32 = (TRAILER.pack_into, SEQUENCE.pack,
                                               SEQUENCE.unpack_from, zlib.crc32)

        def write(message: bytearray, seq: int) -> None:
            """Fill in the sequence number and the checksum."""
            pack_into(message, seq_offset, seq, crc32(pack(seq), body_crc))

        def check(data: bytes) -> tuple[int, bool]:
            """(sequence number, whether length and checksum are right) of a copied message."""
            if len(data) != size:
                return -2, False
            return unpack_from(data, seq_offset)[0], crc32(data) == CRC_RESIDUE

        self.write, self.check = write, check

    def message(self) -> bytearray:
        """A buffer holding the body; write() fills in the trailer."""
        return bytearray(self.body + bytes(TRAILER.size))


class Counter:
    """A reader's tally: messages in order, errors, the first error, and STOP seen."""

    def __init__(self) -> None:
        self.expected = self.errors = 0
        self.first_bad: str | None = None
        self.stopped = False

    def bad(self, seq: int, what: str) -> None:
        self.errors += 1
        self.first_bad = self.first_bad or f"expected {self.expected}, got {seq}: {what}"
        self.expected = seq + 1

    def result(self, t1: int) -> dict[str, Any]:
        return {"received": self.expected, "errors": self.errors, "first_bad": self.first_bad,
                "t1": t1}


# ---------------------------------------------------------------------------------------------
# Members
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One process of a measurement: ``fn(start, *args) -> dict`` runs in it, as ``role``."""

    role: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Start:
    """A member's handle on the start of the measurement (picklable into spawned members)."""

    role: str
    messages: Any  # the parent's queue
    barrier: Any  # members + the parent
    timeout_s: float

    def ready(self, driver_pid: int | None = None) -> None:
        """Say this member is set up (connected to the bus whose driver is ``driver_pid``),
        then wait for the others and the parent; BenchError if they are not all there within
        the timeout."""
        self.messages.put({"role": self.role, "ready": True, "pid": os.getpid(),
                           "driver_pid": driver_pid})
        try:
            self.barrier.wait(self.timeout_s)
        except Exception as e:  # BrokenBarrierError: another member failed, or timed out
            raise BenchError(f"the measurement did not start: {type(e).__name__}") from None


def _member_main(member: Member, start: Start, release: Any) -> None:
    """Entry point of every member process: run, report the result or the error, then wait
    (idle) until the parent has taken its CPU sample."""
    try:
        out = member.fn(start, *member.args)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the run
        out = {"error": traceback.format_exc(limit=6), "error_type": type(e).__name__,
               "error_message": str(e)}
    out["role"] = member.role
    start.messages.put(out)
    release.wait(start.timeout_s)


@dataclass
class Outcome:
    """What a measurement returns: each member's result by role, the wall seconds between
    the start and the last result, the processes accounted by label (member roles,
    ``driver``, ``netbridge``, and the labels of ``watch``) and the cores each label used
    meanwhile (several processes under one label add up; None when one could not be read)."""

    results: dict[str, dict[str, Any]]
    wall_s: float
    pids: dict[str, set[int]] = field(default_factory=dict)
    cores: dict[str, float | None] = field(default_factory=dict)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (all its threads); None if gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return times.user + times.system


def child_pids(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def run_processes(ctx: Any, members: Sequence[Member], timeout_s: float,
                  watch: Callable[[], Mapping[str, Iterable[int]]] | None = None) -> Outcome:
    """Run each member in a spawned process of its own (roles unique) and account the CPU of
    every process involved (see the module docstring); ``watch``, called once every member is
    ready (so it sees what their setting up started, e.g. a netbridge), adds processes by label.

    ``timeout_s`` bounds the measured part (from the start to the last result). Raises
    BenchError if a member fails or overruns (all are then terminated), Unavailable if a
    member failed with one of UNAVAILABLE_ERRORS.
    """
    messages = ctx.Queue()
    barrier = ctx.Barrier(len(members) + 1)
    release = ctx.Event()
    procs = [ctx.Process(target=_member_main,
                         args=(m, Start(m.role, messages, barrier, READY_TIMEOUT_S + timeout_s),
                               release), daemon=True)
             for m in members]
    for p in procs:
        p.start()
    try:
        ready = _collect(messages, procs, len(members), READY_TIMEOUT_S, barrier, want_ready=True)
        labelled: dict[str, set[int]] = {m.role: {p.pid} for m, p in zip(members, procs,
                                                                          strict=True)}
        drivers = {r["driver_pid"] for r in ready.values() if r.get("driver_pid")}
        labelled["driver"] = drivers
        labelled["netbridge"] = {c for d in drivers for c in child_pids(d)}
        for label, pids in (watch() if watch else {}).items():
            labelled.setdefault(label, set()).update(pids)
        labelled = {label: pids for label, pids in labelled.items() if pids}
        before = {pid: cpu_seconds(pid) for pids in labelled.values() for pid in pids}
        t0 = time.monotonic()
        barrier.wait(READY_TIMEOUT_S)
        results = _collect(messages, procs, len(members), timeout_s, barrier, want_ready=False)
        wall = time.monotonic() - t0
        after = {pid: cpu_seconds(pid) for pid in before}
    finally:
        release.set()
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        messages.close()
        messages.cancel_join_thread()
    cores: dict[str, float | None] = {}
    for label, pids in labelled.items():
        spent = [(before[pid], after[pid]) for pid in pids]
        cores[label] = (None if any(a is None or b is None for a, b in spent)
                        else sum(b - a for a, b in spent) / wall)  # type: ignore[operator]
    return Outcome(results, wall, labelled, cores)


def _collect(messages: Any, procs: list[Any], count: int, timeout_s: float, barrier: Any,
             *, want_ready: bool) -> dict[str, dict[str, Any]]:
    """The next ``count`` messages of the members (ready messages, or results), by role."""
    collected: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(collected) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            barrier.abort()
            raise BenchError(f"timed out after {timeout_s:.0f} s "
                             f"({'setting up' if want_ready else 'measuring'}; "
                             f"{count - len(collected)} member(s) not done)")
        try:
            out = messages.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if not dead:
                continue
            try:
                out = messages.get(timeout=1.0)  # a report may still be on its way
            except queue.Empty:
                barrier.abort()
                raise BenchError(f"a member died (exit code {dead[0].exitcode})") from None
        if "error" in out:
            barrier.abort()
            if out.get("error_type") in UNAVAILABLE_ERRORS:
                raise Unavailable(f"{out['role']}: {out['error_message']}")
            raise BenchError(f"{out['role']}: {out['error'].strip().splitlines()[-1]}")
        if bool(out.get("ready")) != want_ready:
            raise BenchError(f"{out['role']}: unexpected message {sorted(out)}")
        collected[out["role"]] = out
    return collected


# ---------------------------------------------------------------------------------------------
# Repeated runs, bounded loops
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How long each run of a network benchmark lasts, its deadline beyond that, and the pace
    of its ping-pong runs."""

    duration_s: float
    timeout_s: float
    rate: int | None = None  # pings per second of the ping-pong runs (None: back-to-back)


def add_run_options(parser: argparse.ArgumentParser, duration_s: float, what: str) -> None:
    """The options of how long and how often each measurement runs: --quick (0.3 s),
    --duration (default duration_s; help: "seconds <what>"), --repeat, --timeout."""
    parser.add_argument("--quick", action="store_true",
                        help="smoke pass: 0.3 s per measurement instead of --duration")
    parser.add_argument("--duration", type=float, default=duration_s,
                        help=f"seconds {what} (default {duration_s:g})")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each measurement this many times, interleaved, and report "
                             "the median (a failed run fails the row; default 1)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="deadline of each run beyond its duration, seconds (default 30)")


def run_count(text: str) -> int:
    """An argparse type: a count of runs, at least 1."""
    runs = int(text)
    if runs < 1:
        raise argparse.ArgumentTypeError(f"{runs}: at least 1")
    return runs


def add_runs_options(parser: argparse.ArgumentParser, quick: str, duration: str) -> None:
    """The options of how long and how often each measurement of a one-host benchmark runs:
    --quick (help: "smoke pass: <quick>"), --runs (default 5, at least 1), --duration (default
    1; help: "seconds per <duration>") and --timeout."""
    parser.add_argument("--quick", action="store_true", help=f"smoke pass: {quick}")
    parser.add_argument("--runs", type=run_count, default=5,
                        help="runs of each measurement, interleaved; the median and the "
                             "spread are reported (default 5)")
    parser.add_argument("--duration", type=float, default=1.0,
                        help=f"seconds per {duration} (default 1)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="deadline of each run beyond its duration, seconds (default 30)")


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated runs of a measurement: the median of every numeric field, errors
    summed, the first failure if any run failed (``status`` "failed" beats "n/a"). ``samples``
    holds each numeric field's values over the runs, in run order (for the spread)."""
    for status in ("failed", "n/a"):
        bad = [r for r in runs if r["status"] == status]
        if bad:
            return dict(bad[0], runs=len(runs))
    row = dict(runs[0], runs=len(runs), samples={})
    for key, value in runs[0].items():
        if isinstance(value, float | int) and not isinstance(value, bool):
            values = [r[key] for r in runs if r.get(key) is not None]
            row["samples"][key] = values
            row[key] = sum(values) if key == "errors" else statistics.median(values)
        elif isinstance(value, dict):  # cores by label
            labels = {label for r in runs for label in r[key]}
            row[key] = {label: _median_or_none([r[key].get(label) for r in runs])
                        for label in labels}
    return row


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def attempt(thunk: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one measurement; its row with ``status`` "ok", or "n/a" / "failed" and ``error``."""
    try:
        row = thunk()
    except Unavailable as e:
        return {"status": "n/a", "error": str(e)}
    except BenchError as e:
        return {"status": "failed", "error": str(e)}
    row.setdefault("status", "ok")
    return row


#: a measurement of a plan: its key fields (the row's name) and a thunk that runs it once
Measurement = tuple[dict[str, Any], Callable[[], dict[str, Any]]]


def run_interleaved(measurements: Sequence[Measurement], runs: int,
                    report: Callable[[dict[str, Any]], None]) -> list[list[dict[str, Any]]]:
    """Run every measurement ``runs`` times, interleaved (so that a burst of load elsewhere on
    the machine hits every measurement alike rather than one of them): each measurement's
    rows, its key fields with the row of :func:`attempt`, each passed to ``report`` (progress)
    as it is made."""
    rows: list[list[dict[str, Any]]] = [[] for _ in measurements]
    for _ in range(runs):
        for (key, thunk), done in zip(measurements, rows, strict=True):
            row = {**key, **attempt(thunk)}
            report(row)
            done.append(row)
    return rows


def loops_ran(out: Outcome) -> str | None:
    """The loop functions a throughput run's writer and reader ran (tools/bench/user_loop.py),
    as "write | read | consume" names; None for a run outside the user's loop."""
    w, r = out.results["writer"], out.results["reader"]
    names = (w.get("loop_write"), r.get("loop_read"), r.get("loop_consume"))
    return None if None in names else " | ".join(str(n) for n in names)


def delivered(out: Outcome) -> tuple[int, float]:
    """(messages sent, seconds from the writer's start to the reader's STOP) of a throughput
    run whose members "writer" (results sent, t0) and "reader" (a Counter's result) got every
    message through in order and intact; BenchError if one was lost, reordered or corrupted."""
    w, r = out.results["writer"], out.results["reader"]
    if r["errors"] or w["sent"] != r["received"]:
        raise BenchError(f"sent {w['sent']}, received {r['received']} in order, {r['errors']} "
                         f"bad; first: {r['first_bad']}")
    return w["sent"], (r["t1"] - w["t0"]) / 1e9


def offer_until_accepted(offer: Callable[[Any], int], message: Any, idle: Any,
                         deadline_ns: int) -> None:
    """Offer ``message`` with a shmbus publication's ``offer`` until accepted: ``idle`` (a
    shmbus idle strategy) backs off while back-pressured, a rotation (ADMIN_ACTION) is retried
    at once. BenchError when the publication refuses for good or at ``deadline_ns``."""
    from shmbus import codes

    while True:
        result = offer(message)
        if result > 0:
            idle.reset()
            return
        if result in (codes.CLOSED, codes.MAX_POSITION_EXCEEDED):
            raise BenchError(f"offer failed: {codes.result_name(result)}")
        if result != codes.ADMIN_ACTION:
            idle.idle(0)
            if time.monotonic_ns() > deadline_ns:
                raise BenchError(f"offer not accepted before the deadline: "
                                 f"{codes.result_name(result)}")


def deadline_after(seconds: float) -> int:
    """CLOCK_MONOTONIC in ns, ``seconds`` from now (loops compare time.monotonic_ns() to it)."""
    return time.monotonic_ns() + int(seconds * 1e9)


def percentiles_us(samples_ns: Sequence[int] | Any, warmup_fraction: float = 0.1,
                   max_warmup: int = 1000) -> dict[str, float]:
    """p50/p90/p99/max in microseconds of round-trip samples in ns, the first
    ``warmup_fraction`` (at most ``max_warmup``) dropped."""
    import numpy as np

    samples = np.asarray(samples_ns, dtype=np.int64)
    if len(samples) < 10:
        raise BenchError(f"only {len(samples)} round trips")
    kept = samples[min(max_warmup, int(len(samples) * warmup_fraction)):] / 1000.0
    p50, p90, p99 = np.percentile(kept, [50, 90, 99])
    return {"round_trips": int(len(kept)), "p50_us": float(p50), "p90_us": float(p90),
            "p99_us": float(p99), "max_us": float(kept.max())}


def echoed_samples(out: Outcome, pinger: str = "pinger", ponger: str = "ponger") -> Any:
    """The round-trip samples (int64 ns, a numpy array) of a ping-pong run (ping_loop's
    result as role ``pinger``, pong_loop's as ``ponger``) in which every ping was echoed and
    no ping or pong was wrong; BenchError otherwise."""
    import numpy as np

    ping, pong = out.results[pinger], out.results[ponger]
    samples = np.frombuffer(ping["samples"], np.int64)
    errors = ping["errors"] + pong["errors"]
    if errors or pong["received"] != len(samples):
        raise BenchError(f"{len(samples)} pings, {pong['received']} echoed, {errors} bad")
    return samples


def round_trip_row(out: Outcome) -> dict[str, Any]:
    """The row of a ping-pong run with roles "pinger" and "ponger" (see echoed_samples): its
    round-trip percentiles (percentiles_us), errors (none) and cores by process."""
    return {**percentiles_us(echoed_samples(out)), "errors": 0, "cores": out.cores}


# ---------------------------------------------------------------------------------------------
# Round trips: a pinger and a ponger over (send, recv)
# ---------------------------------------------------------------------------------------------


def ping_loop(send: Callable[[Any], Any], recv: Callable[[], Any], duration_s: float,
              rate: int | None, checked: bool = True) -> dict[str, Any]:
    """Ping (RTT_SIZE bytes) with ``send``, take each pong with ``recv`` (bytes), time each
    round trip (perf_counter) and check each pong; ``rate``: pings per second on a fixed
    schedule (a late pong delays only its own ping), None: back-to-back. Stops after
    duration_s or MAX_SAMPLES pings and sends a STOP ping. Returns samples (int64 ns, as
    bytes), errors and pings_per_s. ``checked`` (the default): the pings are :class:`Checked`
    messages, sequence number and a CRC-32 over every byte both checked (checked_ping_loop);
    without it only the sequence number at the head and the tail is."""
    if checked:
        return checked_ping_loop(send, recv, duration_s, rate)
    pack, unpack = codec(RTT_SIZE).pack_into, codec(RTT_SIZE).unpack_from
    message = bytearray(RTT_SIZE)
    samples = array("q")
    errors = 0
    clock = time.perf_counter_ns
    period = None if rate is None else 1e9 / rate
    began = clock()
    end_ns = began + int(duration_s * 1e9)
    seq = 0
    while True:
        pack(message, 0, seq, seq)
        t0 = clock()
        send(message)
        head, tail = unpack(recv())
        t1 = clock()
        samples.append(t1 - t0)
        errors += head != seq or tail != seq
        seq += 1
        if t1 >= end_ns or seq >= MAX_SAMPLES:
            break
        if period is not None and (wait_ns := began + seq * period - clock()) > 0:
            time.sleep(wait_ns / 1e9)
    elapsed_s = (clock() - began) / 1e9
    pack(message, 0, STOP, STOP)
    send(message)
    return {"samples": samples.tobytes(), "errors": errors, "pings_per_s": seq / elapsed_s}


def pong_loop(send: Callable[[Any], Any], recv: Callable[[], Any],
              checked: bool = True) -> dict[str, Any]:
    """Echo every ping until STOP, checking sequence numbers (with ``checked``: Checked pings,
    sequence number and CRC-32): received, errors."""
    if checked:
        return checked_pong_loop(send, recv)
    unpack = codec(RTT_SIZE).unpack_from
    expected = errors = 0
    while True:
        message = recv()
        head, tail = unpack(message)
        if head == STOP:
            break
        errors += head != expected or tail != head
        expected = head + 1
        send(message)
    return {"received": expected, "errors": errors}


def ping_or_pong(pinger: bool, send: Callable[[Any], Any], recv: Callable[[], Any],
                 duration_s: float, rate: int | None, done: Any,
                 timeout_s: float) -> dict[str, Any]:
    """A round-trip member's run: ping_loop (``pinger``) or pong_loop over (send, recv); the
    ponger then sets ``done`` (it has echoed the last ping and seen STOP) and both wait for it
    (up to timeout_s), so that neither closes its end under the other. Its loop's result."""
    out = ping_loop(send, recv, duration_s, rate) if pinger else pong_loop(send, recv)
    if not pinger:
        done.set()
    done.wait(timeout_s)
    return out


def checked_ping_loop(send: Callable[[Any], Any], recv: Callable[[], Any], duration_s: float,
                      rate: int | None) -> dict[str, Any]:
    """ping_loop with Checked pings (RTT_SIZE bytes: sequence number and CRC-32 of every
    byte), each pong's sequence number and CRC checked. Kept apart from ping_loop so that its
    plain loop pays no extra call per ping (the one-host benchmarks time sub-microsecond
    round trips with it)."""
    messages = Checked(RTT_SIZE)
    write, check = messages.write, messages.check
    message = messages.message()
    samples = array("q")
    errors = 0
    clock = time.perf_counter_ns
    period = None if rate is None else 1e9 / rate
    began = clock()
    end_ns = began + int(duration_s * 1e9)
    seq = 0
    while True:
        write(message, seq)
        t0 = clock()
        send(message)
        got, ok = check(recv())
        t1 = clock()
        samples.append(t1 - t0)
        errors += got != seq or not ok
        seq += 1
        if t1 >= end_ns or seq >= MAX_SAMPLES:
            break
        if period is not None and (wait_ns := began + seq * period - clock()) > 0:
            time.sleep(wait_ns / 1e9)
    elapsed_s = (clock() - began) / 1e9
    write(message, STOP)
    send(message)
    return {"samples": samples.tobytes(), "errors": errors, "pings_per_s": seq / elapsed_s}


def checked_pong_loop(send: Callable[[Any], Any], recv: Callable[[], Any]) -> dict[str, Any]:
    """pong_loop for checked_ping_loop: echo every ping until STOP, checking each one's
    sequence number and CRC-32: received, errors."""
    check = Checked(RTT_SIZE).check
    expected = errors = 0
    while True:
        message = recv()
        seq, ok = check(message)
        if seq == STOP and ok:
            break
        errors += seq != expected or not ok
        expected = seq + 1
        send(message)
    return {"received": expected, "errors": errors}


def polled_recv(poll: Callable[[Callable[[Any, Any], None], int], int], idle: Any,
                deadline_ns: int) -> Callable[[], bytes]:
    """recv() for ping_loop / pong_loop over an Aeron-style subscription's ``poll(handler,
    limit)`` (shmbus's or pyaeron's): one fragment a poll, its handler copying the message as
    bytes, ``idle`` (an idle strategy: idle(0), reset()) between empty polls; BenchError when
    nothing has come by deadline_ns."""
    got: list[bytes] = []

    def handler(buffer: Any, header: Any) -> None:
        got.append(bytes(buffer))

    def recv() -> bytes:
        spins = 0
        while not poll(handler, 1):
            idle.idle(0)
            spins += 1
            if not spins & 1023 and time.monotonic_ns() > deadline_ns:
                raise BenchError("no message before the deadline")
        idle.reset()
        return got.pop()

    return recv


async def async_round_trips(pinger: bool, send: Callable[[Any], Any],
                            recv: Callable[[], Awaitable[bytes]], duration_s: float,
                            rate: int | None) -> dict[str, Any]:
    """checked_ping_loop (pinger) or checked_pong_loop as one coroutine on an asyncio event
    loop; ``send`` may return an awaitable (awaited), ``recv`` is awaited."""

    async def sent(message: Any) -> None:
        if inspect.isawaitable(result := send(message)):
            await result

    messages = Checked(RTT_SIZE)
    write, check = messages.write, messages.check
    message = messages.message()
    if not pinger:
        expected = errors = 0
        while True:
            ping = await recv()
            seq, ok = check(ping)
            if seq == STOP and ok:
                return {"received": expected, "errors": errors}
            errors += seq != expected or not ok
            expected = seq + 1
            await sent(ping)
    samples = array("q")
    errors = seq = 0
    clock = time.perf_counter_ns
    period = None if rate is None else 1e9 / rate
    began = clock()
    while True:
        write(message, seq)
        t0 = clock()
        await sent(message)
        got, ok = check(await recv())
        t1 = clock()
        samples.append(t1 - t0)
        errors += got != seq or not ok
        seq += 1
        if t1 >= began + duration_s * 1e9 or seq >= MAX_SAMPLES:
            break
        if period is not None and (wait_ns := began + seq * period - clock()) > 0:
            await asyncio.sleep(wait_ns / 1e9)
    write(message, STOP)
    await sent(message)
    return {"samples": samples.tobytes(), "errors": errors}


# ---------------------------------------------------------------------------------------------
# Driver processes
# ---------------------------------------------------------------------------------------------


def start_driver(context: Any, prefix: tuple[str, ...] = (), timeout_s: float = 20.0
                 ) -> subprocess.Popen[bytes]:
    """A driver process for context.dir (``python -m shmbus.driver``, through ``prefix``, e.g.
    ``ip netns exec NAME``), once a client can connect to it; BenchError if it cannot by
    ``timeout_s`` (a driver that has not yet answered a client, e.g. on a loaded machine, is
    asked again until then)."""
    import shmbus

    process = subprocess.Popen([*prefix, *context.driver_command()])
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with shmbus.connect(context.with_(embedded_driver=False)) as bus:
                if bus.driver_pid == process.pid:
                    return process
        except (shmbus.DriverUnavailableError, shmbus.DriverTimeoutError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise BenchError(f"driver for {context.dir} did not start "
                             f"(exit code {process.returncode})")
        time.sleep(0.01)


def stop_process(process: subprocess.Popen[Any], sig: int = signal.SIGTERM,
                 timeout_s: float = 10.0) -> None:
    """Send ``sig`` to ``process`` unless it has exited (Popen.send_signal polls first), wait
    up to timeout_s for it to exit, SIGKILL it if it is still there."""
    process.send_signal(sig)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_driver(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the driver stops its netbridge and removes its files), SIGKILL if stuck."""
    stop_process(process)


def stop_driver_pid(pid: int) -> None:
    """stop_driver for a driver this process did not start (an embedded driver, which
    outlives its clients by its idle timeout), by pid; nothing if it is gone."""
    try:
        process = psutil.Process(pid)
        process.terminate()
        process.wait(10)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        process.kill()
