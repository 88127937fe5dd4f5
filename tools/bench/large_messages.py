"""Large numpy arrays from one writer process to 2 and 4 reader processes, every row doing the
same work: the writer writes every element of every array, every reader reads every byte.

Every array is ``n`` uint64 elements holding ``ramp + seq`` (``ramp`` is ``0 .. n-1``, ``seq``
the array's sequence number): :func:`fill` writes all of it. Every reader sums every element
of every array it gets (uint64, wrapping) and compares the sum with the closed form
:func:`expected_sum` (:func:`check`): a wrong, stale or torn array changes the sum, so one
wrong element fails the row. Two kinds of rows, compared only within their kind:

* in place, the writer filling the transport's own memory: shmbus ``pub.claim_array`` filled
  in place and ``sub.arrays()`` views; a ring of preallocated
  ``multiprocessing.shared_memory`` slots written in place, readers told the slot on a queue
  each, viewing it and acking it before the writer reuses it; iceoryx2 loans filled in place
  (the ``iceoryx2`` package, ``.[bench]``; n/a without it);
* copying, the writer filling a source array of its own and handing it over: shmbus
  ``pub.publish_array(a)`` with ``sub.arrays()`` views, and with ``sub.arrays(copy=True)``;
  pyzmq's ``send_array`` recipe (dtype and shape as JSON, then ``send(a, copy=False,
  track=True)`` on PUB over ipc://, a source reused once its tracker is done; SUB readers
  ``recv(copy=False)`` and ``np.frombuffer``); ``mp.Queue`` (a queue per reader, a new array
  per message as ``put`` pickles it later in a thread); the shared_memory ring with the
  source copied into the slot.

Hand-over latency: from a stamp taken before the writer's first call for that array (before
the claim or loan, or the wait for a free slot, for in-place rows: their fill is part of
it; after the source's fill, before publish/send/put/copy-in, for copying rows) to the reader
holding the array, before it sums (CLOCK_MONOTONIC, one clock for every process on the host).
Every latency is >= 0 or the row fails (BenchError). The writer's fill time is reported apart.
GB/s: payload bytes read and checked (10^9, summed over readers) over the time from the moment
every reader had read the warm-up arrays to the last reader's last check. Repeated ``--runs``
times, interleaved (every row once, then again), reported as median and spread (min-max).

Run from the repository root: ``python -m tools.bench.large_messages [--quick] [--page DIR]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_module
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import shmbus
from tools.bench import pages
from tools.bench.harness import BenchError, cpu_seconds, deadline_after, start_driver, stop_driver
from tools.bench.large_message_rows import (
    BY_KEY,
    RING_SLOTS,
    ROWS,
    ZMQ_SOURCES,
    Row,
)
from tools.bench.members import connect_publication
from tools.bench.peers import iceoryx_node

CTX = mp.get_context("spawn")
STREAM = 4242
DTYPE = np.uint64
ITEM = 8  # bytes per element


# -- the data every row moves ---------------------------------------------------------------------

def ramp(n: int) -> np.ndarray:
    """``0 .. n-1`` as uint64: the writer's template, made once before the measured part."""
    return np.arange(n, dtype=DTYPE)


def fill(out: np.ndarray, template: np.ndarray, seq: int) -> None:
    """Write every element of ``out`` (uint64, ``template``'s length): ``template + seq``."""
    np.add(template, DTYPE(seq), out=out)


def expected_sum(n: int, seq: int) -> int:
    """The uint64 (wrapping) sum of an array of ``n`` elements filled for ``seq``."""
    return (n * (n - 1) // 2 + n * seq) % (1 << 64)


def check(array: np.ndarray, n: int, seq: int) -> None:
    """Read every byte of ``array``: its uint64 sum must be :func:`expected_sum` and its shape
    ``(n,)``. BenchError naming the array otherwise; any single wrong element changes the
    sum (the sum wraps modulo 2^64, so no difference vanishes)."""
    if array.shape != (n,) or array.dtype != DTYPE:
        raise BenchError(f"array {seq}: shape {array.shape}, dtype {array.dtype}, "
                         f"not ({n},) uint64")
    total = int(np.add.reduce(array, dtype=DTYPE))
    if total != expected_sum(n, seq):
        raise BenchError(f"array {seq}: sum {total}, not {expected_sum(n, seq)} (its first "
                         f"element says array {int(array[0])})")


def warmup(nbytes: int) -> int:
    """Arrays sent before the measured ones: at least 2, and 64 MiB's worth. A new stream's
    first memory is cold for every row (fresh pages to allocate and map); the first array's
    hand-over is reported apart."""
    return max(2, -(-(64 << 20) // nbytes))


class Pace:
    """The start signal of a measurement and its warm-up: the writer sends the warm-up arrays,
    then waits until every reader has read them all before it sends the measured ones; and
    at the end, until every reader has read the last of ``total`` arrays."""

    def __init__(self, warm: int, total: int, readers: int) -> None:
        self.warm = warm
        self.total = total
        self.readers = readers
        self._go = CTX.Event()
        self._warmed = CTX.Value("i", 0)
        self._finished = CTX.Value("i", 0)

    def go(self) -> None:
        self._go.set()

    def wait_go(self) -> None:
        self._go.wait()

    def sent(self, seq: int) -> int | None:
        """(The writer, after sending ``seq``.) After the last warm-up array: wait for the
        readers; returns the time the measured part starts (monotonic ns), None before."""
        if seq != self.warm - 1:
            return None
        self._wait_readers(self._warmed, f"read the {self.warm} warm-up arrays")
        return time.monotonic_ns()

    def wait_finished(self) -> None:
        """(The writer, before it closes its publication.) Wait until every reader has read
        the last array."""
        self._wait_readers(self._finished, f"read all {self.total} arrays")

    def read(self, seq: int) -> None:
        """(A reader, after checking ``seq``.)"""
        for last, counter in ((self.warm - 1, self._warmed), (self.total - 1, self._finished)):
            if seq == last:
                with counter.get_lock():
                    counter.value += 1

    def _wait_readers(self, counter: Any, what: str) -> None:
        deadline = time.monotonic() + 120
        while counter.value < self.readers:
            if time.monotonic() > deadline:
                raise BenchError(f"the readers did not {what} within 120 s")
            time.sleep(0.001)


class WriterLog:
    """What a writer notes per array: the hand-over stamp (monotonic ns) and its fill time."""

    def __init__(self, pace: Pace) -> None:
        self.pace = pace
        self.stamps: list[int] = []
        self.fills: list[int] = []
        self.start = 0
        self.cpu0 = time.process_time()

    def stamp(self) -> None:
        """Before the writer's first call for the next array."""
        self.stamps.append(time.monotonic_ns())

    def filled(self, since_ns: int) -> None:
        self.fills.append(time.perf_counter_ns() - since_ns)

    def sent(self, seq: int) -> None:
        self.start = self.pace.sent(seq) or self.start

    def result(self) -> dict[str, Any]:
        return {"role": "writer", "stamps": self.stamps, "fills": self.fills,
                "start": self.start, "cpu": time.process_time() - self.cpu0}


class ReaderLog:
    """What a reader notes per array: when it held it (before the sum) and when it was done."""

    def __init__(self, n: int, pace: Pace) -> None:
        self.n = n
        self.pace = pace
        self.held: list[int] = []
        self.done = 0
        self.cpu0 = time.process_time()

    def read(self, array: np.ndarray, seq: int) -> None:
        """Stamp, read every byte of ``array`` and check it: the reader's work per array."""
        if seq != len(self.held):
            raise BenchError(f"array {seq} arrived where {len(self.held)} was due")
        self.held.append(time.monotonic_ns())
        check(array, self.n, seq)
        self.done = time.monotonic_ns()
        self.pace.read(seq)

    def result(self) -> dict[str, Any]:
        return {"role": "reader", "held": self.held, "done": self.done,
                "cpu": time.process_time() - self.cpu0}


# -- shmbus ---------------------------------------------------------------------------------------

def shmbus_writer(context: shmbus.Context, n: int, count: int, in_place: bool, pace: Pace,
                  out: Any) -> None:
    with shmbus.connect(context) as bus:
        pub = connect_publication(bus, "aeron:ipc", STREAM, deadline_after(30))
        template, source = ramp(n), np.empty(n, DTYPE)
        pace.wait_go()
        log = WriterLog(pace)
        for seq in range(count):
            if in_place:
                log.stamp()
                claim = pub.claim_array((n,), DTYPE, timeout=30)
                if not claim:
                    raise BenchError(f"claim refused: {claim.result}")
                with claim:
                    assert claim.array is not None
                    t = time.perf_counter_ns()
                    fill(claim.array, template, seq)
                    log.filled(t)
            else:
                t = time.perf_counter_ns()
                fill(source, template, seq)
                log.filled(t)
                log.stamp()
                pub.publish_array(source, timeout=30)
            log.sent(seq)
        out.put(log.result())
        pace.wait_finished()  # the publication stays until the readers have read the last


def shmbus_reader(context: shmbus.Context, n: int, count: int, copy: bool, ready: Any,
                  pace: Pace, out: Any) -> None:
    with shmbus.connect(context) as bus:
        sub = bus.add_subscription("aeron:ipc", STREAM)
        ready.put(1)
        log = ReaderLog(n, pace)
        for seq, array in enumerate(sub.arrays(timeout=60, copy=copy)):
            log.read(array, seq)
            if seq == count - 1:
                break
        out.put(log.result())


# -- peers ----------------------------------------------------------------------------------------

def queue_writer(queues: list[Any], n: int, count: int, pace: Pace, out: Any) -> None:
    template = ramp(n)
    pace.wait_go()
    log = WriterLog(pace)
    for seq in range(count):
        t = time.perf_counter_ns()
        source = np.empty(n, DTYPE)  # a new array each time: put() pickles it later
        fill(source, template, seq)
        log.filled(t)
        log.stamp()
        for q in queues:
            q.put(source)
        log.sent(seq)
    out.put(log.result())


def queue_reader(q: Any, n: int, count: int, ready: Any, pace: Pace, out: Any) -> None:
    ready.put(1)
    log = ReaderLog(n, pace)
    for seq in range(count):
        log.read(q.get(timeout=120), seq)
    out.put(log.result())


def ring_writer(names: list[str], queues: list[Any], acks: Any, n: int, count: int,
                in_place: bool, pace: Pace, out: Any) -> None:
    from multiprocessing import shared_memory

    slots = [shared_memory.SharedMemory(name=name) for name in names]
    views = [np.ndarray((n,), DTYPE, buffer=slot.buf) for slot in slots]
    template, source = ramp(n), np.empty(n, DTYPE)
    acked: dict[int, int] = {}
    pace.wait_go()
    log = WriterLog(pace)
    for seq in range(count):
        if not in_place:
            t = time.perf_counter_ns()
            fill(source, template, seq)
            log.filled(t)
        log.stamp()
        _free_slot(acks, acked, seq - len(slots), len(queues))
        target = views[seq % len(slots)]
        if in_place:
            t = time.perf_counter_ns()
            fill(target, template, seq)
            log.filled(t)
        else:
            np.copyto(target, source)
        for q in queues:
            q.put(seq)
        log.sent(seq)
    out.put(log.result())
    del target, views
    for slot in slots:
        slot.close()


def _free_slot(acks: Any, acked: dict[int, int], seq: int, readers: int) -> None:
    """Wait until every reader has acked array ``seq`` (nothing to wait for below 0)."""
    while seq >= 0 and acked.get(seq, 0) < readers:
        got = acks.get(timeout=120)
        acked[got] = acked.get(got, 0) + 1
    acked.pop(seq, None)


def ring_reader(names: list[str], q: Any, acks: Any, n: int, count: int, ready: Any,
                pace: Pace, out: Any) -> None:
    from multiprocessing import shared_memory

    # (on Python < 3.13 attaching registers the name with the resource tracker the parent
    # shares: a set, so the parent's unlink unregisters it once)
    slots = [shared_memory.SharedMemory(name=name) for name in names]
    views = [np.ndarray((n,), DTYPE, buffer=slot.buf) for slot in slots]
    ready.put(1)
    log = ReaderLog(n, pace)
    for _ in range(count):
        seq = q.get(timeout=120)
        log.read(views[seq % len(views)], seq)
        acks.put(seq)
    out.put(log.result())
    del views
    for slot in slots:
        slot.close()


def zmq_writer(address: str, n: int, count: int, pace: Pace, out: Any) -> None:
    import zmq

    socket: Any = zmq.Context.instance().socket(zmq.PUB)
    socket.setsockopt(zmq.SNDHWM, 0)  # PUB drops past its high-water mark: none here
    socket.bind(address)
    template = ramp(n)
    sources = [np.empty(n, DTYPE) for _ in range(ZMQ_SOURCES)]
    trackers: list[Any] = [None] * ZMQ_SOURCES
    pace.wait_go()
    time.sleep(0.5)  # the subscribers' subscriptions reach the publisher (PUB drops before)
    log = WriterLog(pace)
    for seq in range(count):
        k = seq % ZMQ_SOURCES
        if trackers[k] is not None:
            trackers[k].wait(120)  # zmq no longer reads this source
        source = sources[k]
        t = time.perf_counter_ns()
        fill(source, template, seq)
        log.filled(t)
        log.stamp()
        socket.send_json({"dtype": str(source.dtype), "shape": source.shape}, zmq.SNDMORE)
        trackers[k] = socket.send(source, copy=False, track=True)
        log.sent(seq)
    out.put(log.result())
    for tracker in trackers:
        if tracker is not None:
            tracker.wait(120)
    socket.close(linger=10_000)


def zmq_reader(address: str, n: int, count: int, ready: Any, pace: Pace, out: Any) -> None:
    import zmq

    socket: Any = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.connect(address)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    ready.put(1)
    log = ReaderLog(n, pace)
    for seq in range(count):
        if not socket.poll(120_000):
            raise BenchError("zmq: nothing within 120 s")
        md = socket.recv_json()
        frame = socket.recv(copy=False)
        log.read(np.frombuffer(frame.buffer, dtype=md["dtype"]).reshape(md["shape"]), seq)
    out.put(log.result())


def _iceoryx(name: str, readers: int) -> tuple[Any, Any, Any, Any]:
    """(module, node, publish-subscribe service, event service) named ``name``; Unavailable
    (a BenchError) without iceoryx2."""
    import ctypes

    iox2, node = iceoryx_node()
    service = (node.service_builder(iox2.ServiceName.new(name))
               .publish_subscribe(iox2.Slice[ctypes.c_uint8])
               .enable_safe_overflow(False).history_size(0).max_publishers(1)
               .max_subscribers(readers).subscriber_max_buffer_size(2)
               .subscriber_max_borrowed_samples(1).open_or_create())
    events = (node.service_builder(iox2.ServiceName.new(name + "-ready")).event()
              .max_listeners(readers).open_or_create())
    return iox2, node, service, events


def _iceoryx_array(address: int, n: int) -> np.ndarray:
    import ctypes

    return np.ctypeslib.as_array((ctypes.c_uint64 * n).from_address(address))


def iceoryx_writer(name: str, n: int, count: int, readers: int, pace: Pace, finished: Any,
                   out: Any) -> None:
    iox2, node, service, events = _iceoryx(name, readers)
    publisher = (service.publisher_builder().initial_max_slice_len(n * ITEM)
                 .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
                 .max_loaned_samples(1).create())
    notifier = events.notifier_builder().create()
    deadline = time.monotonic() + 30
    while service.dynamic_config.number_of_subscribers < readers:
        if time.monotonic() > deadline:
            raise BenchError("iceoryx2: the readers did not subscribe within 30 s")
        time.sleep(0.001)
    template = ramp(n)
    pace.wait_go()
    log = WriterLog(pace)
    for seq in range(count):
        log.stamp()
        deadline = time.monotonic() + 30
        while True:
            try:
                sample = publisher.loan_slice_uninit(n * ITEM)
                break
            except iox2.LoanError:  # every sample still held by readers: back-pressure
                if time.monotonic() > deadline:
                    raise BenchError("iceoryx2: no sample to loan within 30 s") from None
                time.sleep(0.0001)
        target = _iceoryx_array(sample.payload_ptr, n)
        t = time.perf_counter_ns()
        fill(target, template, seq)
        log.filled(t)
        del target
        sample.assume_init().send()
        notifier.notify()
        log.sent(seq)
    out.put(log.result())
    deadline = time.monotonic() + 120  # (samples not yet received go with their publisher)
    while finished.value < readers and time.monotonic() < deadline:
        time.sleep(0.01)
    notifier.delete()
    publisher.delete()


def iceoryx_reader(name: str, n: int, count: int, readers: int, ready: Any, pace: Pace,
                   finished: Any, out: Any) -> None:
    try:
        _iceoryx_read(name, n, count, readers, ready, pace, out)
    except BenchError as e:  # reported, so the row says why it is n/a
        out.put({"role": "error", "error": str(e)})
        raise
    finally:
        with finished.get_lock():
            finished.value += 1


def _iceoryx_read(name: str, n: int, count: int, readers: int, ready: Any, pace: Pace,
                  out: Any) -> None:
    iox2, node, service, events = _iceoryx(name, readers)
    subscriber = service.subscriber_builder().create()
    listener = events.listener_builder().create()
    ready.put(1)
    log = ReaderLog(n, pace)
    seq = 0
    deadline = time.monotonic() + 120
    while seq < count:
        sample = subscriber.receive()
        if sample is None:
            if time.monotonic() > deadline:
                raise BenchError(f"iceoryx2: {seq} of {count} arrays within 120 s")
            listener.timed_wait(iox2.Duration.from_millis(50))
            continue
        array = _iceoryx_array(sample.payload_ptr, sample.header.number_of_elements // ITEM)
        log.read(array, seq)
        del array
        sample.delete()
        seq += 1
    out.put(log.result())
    listener.delete()
    subscriber.delete()


# -- one measurement ------------------------------------------------------------------------------

class ShmSampler:
    """Peak bytes used on /dev/shm above the start, sampled every 2 ms in a thread."""

    def __init__(self) -> None:
        self.base = self._used()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _used() -> int:
        st = os.statvfs("/dev/shm")
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._used() - self.base)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def latencies_us(stamps: list[int], held: list[int]) -> list[float]:
    """Each array's hand-over in microseconds: ``held[seq] - stamps[seq]``. BenchError for a
    negative one: the stamp precedes the writer's first call for the array and the reader
    cannot hold it before that call, so a negative value is a measurement error."""
    out = []
    for seq, (stamp, got) in enumerate(zip(stamps, held, strict=True)):
        if got < stamp:
            raise BenchError(f"array {seq}: held {(stamp - got) / 1e3:.1f} us before the "
                             f"writer's stamp (a measurement error)")
        out.append((got - stamp) / 1e3)
    return out


def measure(row: Row, n: int, count: int, readers: int, context: shmbus.Context,
            driver_pid: int) -> dict[str, Any]:
    """One measurement of ``row``: ``count`` arrays of ``n`` elements after the warm-up ones,
    to ``readers`` readers, each in a process of its own. Returns the figures of this run;
    BenchError when a process fails, an array is wrong, or a latency is negative."""
    warm = warmup(n * ITEM)
    total = count + warm
    out, ready, pace = CTX.Queue(), CTX.Queue(), Pace(warm, total, readers)
    procs: list[Any] = []
    slots: list[Any] = []

    def start(target: Callable[..., Any], *args: Any) -> None:
        p = CTX.Process(target=target, args=args, daemon=True)
        p.start()
        procs.append(p)

    extra: list[int] = []
    if row.shmbus:
        for _ in range(readers):
            start(shmbus_reader, context, n, total, row.key == "shmbus-publish-copy", ready,
                  pace, out)
        _ready(ready, readers)
        start(shmbus_writer, context, n, total, row.key == "shmbus-claim", pace, out)
        extra.append(driver_pid)
    elif row.key == "mp-queue":
        queues = [CTX.Queue(maxsize=2) for _ in range(readers)]
        for q in queues:
            start(queue_reader, q, n, total, ready, pace, out)
        _ready(ready, readers)
        start(queue_writer, queues, n, total, pace, out)
    elif row.key in ("shm-ring", "shm-ring-copy"):
        from multiprocessing import shared_memory

        slots = [shared_memory.SharedMemory(create=True, size=n * ITEM)
                 for _ in range(RING_SLOTS)]
        names = [slot.name for slot in slots]
        queues = [CTX.Queue() for _ in range(readers)]
        acks = CTX.Queue()
        for q in queues:
            start(ring_reader, names, q, acks, n, total, ready, pace, out)
        _ready(ready, readers)
        start(ring_writer, names, queues, acks, n, total, row.key == "shm-ring", pace, out)
    elif row.key == "iceoryx2-loan":
        name = f"shmbus-large-bench-{os.getpid()}-{time.monotonic_ns()}"
        finished = CTX.Value("i", 0)
        for _ in range(readers):
            start(iceoryx_reader, name, n, total, readers, ready, pace, finished, out)
        _ready(ready, readers)
        start(iceoryx_writer, name, n, total, readers, pace, finished, out)
    else:
        address = f"ipc://{tempfile.gettempdir()}/large-bench-{os.getpid()}"
        start(zmq_writer, address, n, total, pace, out)
        for _ in range(readers):
            start(zmq_reader, address, n, total, ready, pace, out)
        _ready(ready, readers)
    try:
        return _collect(row, n, count, warm, readers, pace, procs, out, extra)
    finally:
        for slot in slots:
            slot.close()
            slot.unlink()


def _collect(row: Row, n: int, count: int, warm: int, readers: int, pace: Pace,
             procs: list[Any], out: Any, extra: list[int]) -> dict[str, Any]:
    extra_cpu = {pid: cpu_seconds(pid) or 0.0 for pid in extra}
    sampler = ShmSampler()
    pace.go()
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + 600
    try:
        while len(results) < readers + 1:
            try:
                result = out.get(timeout=0.5)
            except queue_module.Empty:
                if time.monotonic() > deadline or any(p.exitcode for p in procs):
                    raise BenchError(f"{row.name}: results missing; exit codes "
                                     f"{[p.exitcode for p in procs]}") from None
                continue
            if result["role"] == "error":
                raise BenchError(result["error"])
            results.append(result)
    except BenchError:
        sampler.stop()
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
        raise
    peak = sampler.stop()
    extra_used = sum((cpu_seconds(pid) or 0.0) - before for pid, before in extra_cpu.items())
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    writer = next(r for r in results if r["role"] == "writer")
    reads = [r for r in results if r["role"] == "reader"]
    stamps = writer["stamps"]
    every = [latencies_us(stamps, r["held"]) for r in reads]  # (raises on a negative one)
    measured = [lat for per_reader in every for lat in per_reader[warm:]]
    nbytes = n * ITEM
    gb = nbytes * count * readers / 1e9
    cpu = writer["cpu"] + sum(r["cpu"] for r in reads) + extra_used
    return {"p50_us": statistics.median(measured), "max_us": max(measured),
            "first_ms": max(per_reader[0] for per_reader in every) / 1e3,
            "fill_ms": statistics.median(writer["fills"][warm:]) / 1e6,
            "gb_s": gb / ((max(r["done"] for r in reads) - writer["start"]) / 1e9),
            "cpu_s_per_gb": cpu / (gb * (count + warm) / count),
            "peak_shm_mib": peak / 2**20}


def _ready(ready: Any, n: int) -> None:
    for _ in range(n):
        ready.get(timeout=60)


def memcpy_gb_s(n: int) -> float:
    """One process's copy of ``n`` uint64 between warm buffers, best of 5, in GB/s."""
    a, b = np.ones(n, DTYPE), np.empty(n, DTYPE)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return n * ITEM / best / 1e9


# -- the run --------------------------------------------------------------------------------------

FIGURES = ("gb_s", "p50_us", "max_us", "first_ms", "fill_ms", "cpu_s_per_gb", "peak_shm_mib")


def summarise(row: Row, mib: float, readers: int, runs: list[dict[str, Any] | None],
              errors: list[str]) -> dict[str, Any]:
    """One row of the JSON and the page: every figure's per-run values (None for a failed
    run), its median, low and high, and the failed runs' errors."""
    out: dict[str, Any] = {"method": row.key, "name": row.name, "kind": row.kind,
                           "mib": mib, "readers": readers, "runs": len(runs),
                           "errors": errors}
    for figure in FIGURES:
        values = [r[figure] if r else None for r in runs]
        s = pages.spread(values)
        out[f"{figure}_runs"] = values
        out[figure] = s.median if s else None
        out[f"{figure}_low"] = s.low if s else None
        out[f"{figure}_high"] = s.high if s else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=None,
                        help="array sizes in MiB (default 1 16 64; --quick 1 4)")
    parser.add_argument("--readers", type=int, nargs="+", default=None,
                        help="reader counts (default 2 4; --quick 2)")
    parser.add_argument("--count", type=int, default=0, help="measured arrays per "
                        "measurement (0: about 256 MiB per size, at least 6, at most 32)")
    parser.add_argument("--rows", nargs="+", default=[r.key for r in ROWS],
                        choices=[r.key for r in ROWS])
    parser.add_argument("--runs", type=int, default=None, help="measurements of every row, "
                        "interleaved: every row once, then again (default 5; --quick 2)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 and 4 MiB, 2 readers, 3 arrays, 2 runs")
    parser.add_argument("--out", default="tools/results/large_messages.json")
    pages.add_page_option(parser)
    args = parser.parse_args(argv)
    setting = pages.started(argv)
    sizes = args.sizes or ([1, 4] if args.quick else [1, 16, 64])
    reader_counts = args.readers or ([2] if args.quick else [2, 4])
    runs = args.runs or (2 if args.quick else 5)
    rows = [BY_KEY[key] for key in args.rows]
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    print(f"/dev/shm free: {free / 2**30:.1f} GiB; load {os.getloadavg()[0]:.1f}; "
          f"{psutil.cpu_count()} cores", flush=True)
    found: dict[tuple[str, float, int], list[dict[str, Any] | None]] = {}
    errors: dict[tuple[str, float, int], list[str]] = {}
    memcpy: dict[float, float] = {}
    with tempfile.TemporaryDirectory(prefix="large-bench-", dir="/dev/shm") as tmp:
        context = shmbus.Context(dir=str(Path(tmp) / "bus"), embedded_driver=False,
                                 driver_idle_timeout=3600.0)  # the peers run without a client
        driver = start_driver(context)
        try:
            for run in range(runs):
                order = rows[run % len(rows):] + rows[:run % len(rows)]  # no row always first
                for mib in sizes:
                    n = int(mib * 2**20) // ITEM
                    count = args.count or (3 if args.quick else max(6, min(32, int(256 / mib))))
                    memcpy[mib] = max(memcpy.get(mib, 0.0), memcpy_gb_s(n))
                    for readers in reader_counts:
                        for row in order:
                            key = (row.key, mib, readers)
                            try:
                                result: dict[str, Any] | None = measure(
                                    row, n, count, readers, context, driver.pid)
                            except BenchError as e:  # a peer that failed: n/a this run
                                if row.shmbus:
                                    raise  # shmbus itself must not fail
                                result = None
                                errors.setdefault(key, []).append(str(e))
                            found.setdefault(key, []).append(result)
                            print(f"run {run + 1}/{runs} {mib:g} MiB x {count} to {readers} "
                                  f"{row.name:<42} " + (
                                      f"{result['gb_s']:6.2f} GB/s  p50 "
                                      f"{result['p50_us']:8.0f} us  fill "
                                      f"{result['fill_ms']:6.2f} ms" if result
                                      else f"n/a: {errors[key][-1]}"), flush=True)
        finally:
            stop_driver(driver)
    table = [dict(summarise(BY_KEY[key], mib, readers, values, errors.get((key, mib, readers),
                                                                           [])),
                  memcpy_gb_s=memcpy[mib])
             for (key, mib, readers), values in found.items()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1))
    print(f"\nwrote {out}")
    if args.page:
        from tools.bench import large_messages_page

        path = large_messages_page.write(args.page, setting, table, rows, sizes,
                                         reader_counts, runs)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
