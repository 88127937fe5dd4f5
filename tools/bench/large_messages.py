"""Large numpy arrays from one writer process to 1 and 4 reader processes, in one run.

For each array size (1, 16, 64 and 256 MiB of float64 by default: ``--sizes``) and reader
count (``--readers``), each way of moving the array sends ``--count`` arrays (default: about
256 MiB per size, at least 4) after unmeasured warm-up ones (:func:`warmup`: 64 MiB's worth,
at least 2; the writer sends the measured ones once every reader has read the warm-up ones),
each filled with its sequence number (the writer's source array holds data, its pages
touched); every reader checks every array it gets (sequence at both ends) and, where the row
says so, copies it out first:

* shmbus views: ``pub.claim_array`` filled in place (no copy on the writer) and
  ``sub.arrays()`` (read-only views of the shared memory, no copy on the readers);
* shmbus copy: ``pub.publish_array(a)`` (one copy in) and ``sub.arrays(copy=True)`` (a new
  array per message, as a reader that keeps each one does);
* shmbus copy into out: ``pub.publish_array(a)`` and ``sub.arrays(out=buffer)``, the reader's
  copy going into one array it owns and reuses (docs/guides/large-and-typed-messages.md:
  the way for a stream of copies);
* mp.Queue: ``queue.put(a)`` to one queue per reader (pickled), ``queue.get()``;
* shared_memory by hand: a ``multiprocessing.shared_memory.SharedMemory`` per array, its name
  sent on a queue per reader, readers attach and view it, ack, the writer unlinks it;
* zmq send_array: pyzmq's recipe (dtype and shape as JSON, then ``send(a, copy=False)``) on a
  PUB socket over ipc://, a SUB socket per reader (``recv(copy=False)``, ``np.frombuffer``);
* iceoryx2 loans (the ``iceoryx2`` package, ``.[bench]``; n/a without it): a publish-subscribe
  service of byte slices (``Slice[c_uint8]``, ``initial_max_slice_len`` the array's bytes, back
  pressure ``RetryUntilDelivered``, safe overflow off); the writer loans a slice and fills the
  array in place (view) or copies it in (copy), sends, and rings an event service; each reader
  waits on its listener, receives, views the sample's payload in place as a numpy array (or
  copies it) and releases the sample. iceoryx2's Python API takes such dynamic payloads; its
  memory is preallocated per publisher (slice length x samples in flight). A reader that gets
  an array out of sequence (iceoryx2 0.10 lost arrays in view rows here: the writer was not
  held back) makes the row n/a with that reason.

Hand-over latency: from the writer's publish/put/send returning to the reader holding the
array (CLOCK_MONOTONIC is one clock for every process on the host); median and max over the
measured arrays and readers, and apart the first array's (cold memory). GB/s: payload bytes
delivered (10^9, summed over readers) over the time from the moment every reader had read the
warm-up arrays to the last array read (a view row whose writer fills only the array's ends, as
``shmbus views`` and iceoryx2's view row do, measures the hand-over alone: no byte is copied).
CPU: user+system seconds of every process (the shmbus driver included) per GB delivered,
warm-up included. Peak /dev/shm: the most it held above the run's start
(sampled every 2 ms). Also memcpy bandwidth in one process (warm buffers, best of 5),
measured in the same run: before each size and again after each row; a size's ratios use its
best (on a loaded machine one measurement may fall in a busy moment). ``--repeat N`` measures
each row N times and reports the median by GB/s.

Run from the repository root: ``python -m tools.bench.large_messages [--quick]``.
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
from tools.bench.harness import BenchError, cpu_seconds, deadline_after, start_driver, stop_driver
from tools.bench.members import connect_publication
from tools.bench.peers import iceoryx_node

CTX = mp.get_context("spawn")
STREAM = 4242


def warmup(nbytes: int) -> int:
    """Arrays sent before the measured ones: at least 2, and 64 MiB's worth. A new stream's
    first memory is cold for every method (fresh pages to allocate and map: shmbus's block
    ring beginning, iceoryx2's sample pool, shared_memory's and the readers' allocations);
    the first array's hand-over is reported apart."""
    return max(2, -(-(64 << 20) // nbytes))
METHODS = ("shmbus views", "shmbus copy", "shmbus copy into out", "mp.Queue",
           "shared_memory by hand", "zmq send_array", "iceoryx2 loans")


def fill(array: np.ndarray, seq: int) -> None:
    array[0] = seq
    array[-1] = seq


def check(array: np.ndarray, seq: int) -> None:
    if array[0] != seq or array[-1] != seq:
        raise BenchError(f"array {seq}: ends {array[0]}, {array[-1]}")


class Pace:
    """The start signal of a measurement and its warm-up: the writer sends the warm-up arrays,
    then waits until every reader has read them all before it sends the measured ones, so the
    measured time holds no reader still working through cold warm-up memory."""

    def __init__(self, warm: int, readers: int) -> None:
        self.warm = warm
        self.readers = readers
        self._go = CTX.Event()
        self._warmed = CTX.Value("i", 0)

    def go(self) -> None:
        self._go.set()

    def wait_go(self) -> None:
        self._go.wait()

    def sent(self, seq: int) -> int | None:
        """(The writer, after sending ``seq``.) After the last warm-up array: wait for the
        readers; returns the time the measured part starts (monotonic ns), None before."""
        if seq != self.warm - 1:
            return None
        deadline = time.monotonic() + 120
        while self._warmed.value < self.readers:
            if time.monotonic() > deadline:
                raise BenchError(f"the readers did not read the {self.warm} warm-up arrays "
                                 f"within 120 s")
            time.sleep(0.001)
        return time.monotonic_ns()

    def read(self, seq: int) -> None:
        """(A reader, after reading ``seq``.)"""
        if seq == self.warm - 1:
            with self._warmed.get_lock():
                self._warmed.value += 1


# -- shmbus ---------------------------------------------------------------------------------------

def shmbus_writer(context: shmbus.Context, n: int, count: int, readers: int, zero_copy: bool,
                  pace: Pace, out: Any) -> None:
    with shmbus.connect(context) as bus:
        pub = connect_publication(bus, "aeron:ipc", STREAM, deadline_after(30))
        source = np.ones(n)  # (data: np.zeros' untouched pages are one zero page, in cache)
        pace.wait_go()
        cpu0 = time.process_time()
        returned = []
        start = 0
        for seq in range(count):
            if zero_copy:
                claim = pub.claim_array((n,), np.float64, timeout=30)
                if not claim:
                    raise BenchError(f"claim refused: {claim.result}")
                with claim:
                    assert claim.array is not None
                    fill(claim.array, seq)
            else:
                fill(source, seq)
                pub.publish_array(source, timeout=30)
            returned.append(time.monotonic_ns())
            start = pace.sent(seq) or start
        out.put({"role": "writer", "returned": returned, "start": start,
                 "cpu": time.process_time() - cpu0})
        time.sleep(0.5)


def shmbus_reader(context: shmbus.Context, n: int, count: int, method: str, ready: Any,
                  pace: Pace, out: Any) -> None:
    with shmbus.connect(context) as bus:
        sub = bus.add_subscription("aeron:ipc", STREAM)
        ready.put(1)
        cpu0 = time.process_time()
        received = []
        if method == "shmbus copy into out":
            arrays = sub.arrays(timeout=60, out=np.empty(n))
        else:
            arrays = sub.arrays(timeout=60, copy=method == "shmbus copy")
        for seq, array in enumerate(arrays):
            received.append(time.monotonic_ns())
            check(array, seq)
            pace.read(seq)
            if seq == count - 1:
                break
        out.put({"role": "reader", "received": received, "cpu": time.process_time() - cpu0})


# -- peers ----------------------------------------------------------------------------------------

def queue_writer(queues: list[Any], n: int, count: int, pace: Pace, out: Any) -> None:
    pace.wait_go()
    cpu0 = time.process_time()
    returned = []
    start = 0
    for seq in range(count):
        source = np.empty(n)  # a new array each time: put() pickles it later, in a thread
        fill(source, seq)
        for q in queues:
            q.put(source)
        returned.append(time.monotonic_ns())
        start = pace.sent(seq) or start
    out.put({"role": "writer", "returned": returned, "start": start,
             "cpu": time.process_time() - cpu0})


def queue_reader(q: Any, count: int, ready: Any, pace: Pace, out: Any) -> None:
    ready.put(1)
    cpu0 = time.process_time()
    received = []
    for seq in range(count):
        array = q.get(timeout=120)
        received.append(time.monotonic_ns())
        check(array, seq)
        pace.read(seq)
    out.put({"role": "reader", "received": received, "cpu": time.process_time() - cpu0})


def shm_writer(queues: list[Any], acks: Any, n: int, count: int, pace: Pace, out: Any) -> None:
    from multiprocessing import shared_memory

    source = np.ones(n)
    pace.wait_go()
    cpu0 = time.process_time()
    returned = []
    start = 0
    live: dict[int, tuple[Any, int]] = {}
    for seq in range(count):
        block = shared_memory.SharedMemory(create=True, size=source.nbytes)
        target = np.ndarray(source.shape, source.dtype, buffer=block.buf)
        fill(source, seq)
        target[:] = source
        del target
        live[seq] = (block, len(queues))
        for q in queues:
            q.put((block.name, seq))
        returned.append(time.monotonic_ns())
        start = pace.sent(seq) or start
        while len(live) > 2:  # at most 3 arrays in flight: the same as readers keep up
            _ack(acks, live)
    while live:
        _ack(acks, live)
    out.put({"role": "writer", "returned": returned, "start": start,
             "cpu": time.process_time() - cpu0})


def _ack(acks: Any, live: dict[int, tuple[Any, int]]) -> None:
    seq = acks.get(timeout=120)
    block, left = live[seq]
    if left == 1:
        del live[seq]
        block.close()
        block.unlink()
    else:
        live[seq] = (block, left - 1)


def shm_reader(q: Any, acks: Any, n: int, count: int, copy: bool, ready: Any,
               pace: Pace, out: Any) -> None:
    from multiprocessing import shared_memory

    ready.put(1)
    cpu0 = time.process_time()
    received = []
    for _ in range(count):
        name, seq = q.get(timeout=120)
        # (on Python < 3.13 attaching registers the name with the resource tracker the writer
        # shares: a set, so the writer's unlink unregisters it once)
        block = shared_memory.SharedMemory(name=name)
        array = np.ndarray((n,), np.float64, buffer=block.buf)
        if copy:
            array = array.copy()
        received.append(time.monotonic_ns())
        check(array, seq)
        pace.read(seq)
        del array
        block.close()
        acks.put(seq)
    out.put({"role": "reader", "received": received, "cpu": time.process_time() - cpu0})


def zmq_writer(address: str, n: int, count: int, pace: Pace, out: Any) -> None:
    import zmq

    socket = zmq.Context.instance().socket(zmq.PUB)
    socket.setsockopt(zmq.SNDHWM, 0)  # PUB drops past its high-water mark: none here
    socket.bind(address)
    pace.wait_go()
    cpu0 = time.process_time()
    time.sleep(0.5)  # the subscribers' subscriptions reach the publisher
    returned = []
    start = 0
    for seq in range(count):
        source = np.empty(n)  # a new array each time: send(copy=False) keeps a reference
        fill(source, seq)
        socket.send_json({"dtype": str(source.dtype), "shape": source.shape, "seq": seq},
                         zmq.SNDMORE)
        socket.send(source, copy=False)
        returned.append(time.monotonic_ns())
        start = pace.sent(seq) or start
    out.put({"role": "writer", "returned": returned, "start": start,
             "cpu": time.process_time() - cpu0})
    time.sleep(2)
    socket.close(linger=10_000)


def zmq_reader(address: str, count: int, copy: bool, ready: Any, pace: Pace, out: Any) -> None:
    import zmq

    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.connect(address)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    ready.put(1)
    cpu0 = time.process_time()
    received = []
    for _ in range(count):
        if not socket.poll(120_000):
            raise BenchError("zmq: nothing within 120 s")
        md = socket.recv_json()
        frame = socket.recv(copy=False)
        array = np.frombuffer(frame.buffer, dtype=md["dtype"]).reshape(md["shape"])
        if copy:
            array = array.copy()
        received.append(time.monotonic_ns())
        check(array, md["seq"])
        pace.read(md["seq"])
    out.put({"role": "reader", "received": received, "cpu": time.process_time() - cpu0})


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

    return np.ctypeslib.as_array((ctypes.c_double * n).from_address(address))


def iceoryx_writer(name: str, n: int, count: int, readers: int, zero_copy: bool, pace: Pace,
                   finished: Any, out: Any) -> None:
    iox2, node, service, events = _iceoryx(name, readers)
    publisher = (service.publisher_builder().initial_max_slice_len(n * 8)
                 .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
                 .max_loaned_samples(1).create())
    notifier = events.notifier_builder().create()
    deadline = time.monotonic() + 30
    while service.dynamic_config.number_of_subscribers < readers:
        if time.monotonic() > deadline:
            raise BenchError("iceoryx2: the readers did not subscribe within 30 s")
        time.sleep(0.001)
    source = np.ones(n)
    pace.wait_go()
    cpu0 = time.process_time()
    returned = []
    start = 0
    for seq in range(count):
        deadline = time.monotonic() + 30
        while True:
            try:
                sample = publisher.loan_slice_uninit(n * 8)
                break
            except iox2.LoanError:  # every sample still held by readers: back-pressure
                if time.monotonic() > deadline:
                    raise BenchError("iceoryx2: no sample to loan within 30 s") from None
                time.sleep(0.0001)
        target = _iceoryx_array(sample.payload_ptr, n)
        if zero_copy:
            fill(target, seq)
        else:
            fill(source, seq)
            target[:] = source
        del target
        sample.assume_init().send()
        notifier.notify()
        returned.append(time.monotonic_ns())
        start = pace.sent(seq) or start
    out.put({"role": "writer", "returned": returned, "start": start,
             "cpu": time.process_time() - cpu0})
    deadline = time.monotonic() + 120  # (samples not yet received go with their publisher)
    while finished.value < readers and time.monotonic() < deadline:
        time.sleep(0.01)
    notifier.delete()
    publisher.delete()


def iceoryx_reader(name: str, count: int, readers: int, copy: bool, ready: Any,
                   pace: Pace, finished: Any, out: Any) -> None:
    try:
        _iceoryx_read(name, count, readers, copy, ready, pace, out)
    except BenchError as e:  # reported, so the row says why it is n/a
        out.put({"role": "error", "error": str(e)})
        raise
    finally:
        with finished.get_lock():
            finished.value += 1


def _iceoryx_read(name: str, count: int, readers: int, copy: bool, ready: Any,
                  pace: Pace, out: Any) -> None:
    iox2, node, service, events = _iceoryx(name, readers)
    subscriber = service.subscriber_builder().create()
    listener = events.listener_builder().create()
    ready.put(1)
    cpu0 = time.process_time()
    received = []
    seq = 0
    deadline = time.monotonic() + 120
    while seq < count:
        sample = subscriber.receive()
        if sample is None:
            if time.monotonic() > deadline:
                raise BenchError(f"iceoryx2: {seq} of {count} arrays within 120 s")
            listener.timed_wait(iox2.Duration.from_millis(50))
            continue
        array = _iceoryx_array(sample.payload_ptr, sample.header.number_of_elements // 8)
        if copy:
            array = array.copy()
        received.append(time.monotonic_ns())
        if array[0] != seq:
            raise BenchError(f"iceoryx2: array {int(array[0])} arrived where {seq} was due "
                             f"(arrays lost with back-pressure RetryUntilDelivered)")
        check(array, seq)
        pace.read(seq)
        del array
        sample.delete()
        seq += 1
    out.put({"role": "reader", "received": received, "cpu": time.process_time() - cpu0})
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


def measure(method: str, copy: bool, n: int, count: int, readers: int,
            context: shmbus.Context, driver_pid: int) -> dict[str, Any]:
    warm = warmup(n * 8)
    measured, count = count, count + warm
    out, ready, pace = CTX.Queue(), CTX.Queue(), Pace(warm, readers)
    procs: list[Any] = []

    def start(target: Callable[..., Any], *args: Any) -> None:
        p = CTX.Process(target=target, args=args, daemon=True)
        p.start()
        procs.append(p)

    extra: list[int] = []
    if method.startswith("shmbus"):
        for _ in range(readers):
            start(shmbus_reader, context, n, count, method, ready, pace, out)
        _ready(ready, readers)
        start(shmbus_writer, context, n, count, readers, method == "shmbus views", pace,
              out)
        extra.append(driver_pid)
    elif method == "mp.Queue":
        queues = [CTX.Queue(maxsize=2) for _ in range(readers)]
        for q in queues:
            start(queue_reader, q, count, ready, pace, out)
        _ready(ready, readers)
        start(queue_writer, queues, n, count, pace, out)
    elif method == "shared_memory by hand":
        queues = [CTX.Queue() for _ in range(readers)]
        acks = CTX.Queue()
        for q in queues:
            start(shm_reader, q, acks, n, count, copy, ready, pace, out)
        _ready(ready, readers)
        start(shm_writer, queues, acks, n, count, pace, out)
    elif method == "iceoryx2 loans":
        name = f"shmbus-large-bench-{os.getpid()}-{time.monotonic_ns()}"
        finished = CTX.Value("i", 0)
        for _ in range(readers):
            start(iceoryx_reader, name, count, readers, copy, ready, pace, finished, out)
        _ready(ready, readers)
        start(iceoryx_writer, name, n, count, readers, not copy, pace, finished, out)
    else:
        address = f"ipc://{tempfile.gettempdir()}/large-bench-{os.getpid()}"
        start(zmq_writer, address, n, count, pace, out)
        for _ in range(readers):
            start(zmq_reader, address, count, copy, ready, pace, out)
        _ready(ready, readers)
    time.sleep(0.2)
    extra_cpu = {pid: cpu_seconds(pid) or 0.0 for pid in extra}
    sampler = ShmSampler()
    pace.go()
    results = []
    deadline = time.monotonic() + 600
    try:
        while len(results) < readers + 1:
            try:
                result = out.get(timeout=0.5)
            except queue_module.Empty:
                if time.monotonic() > deadline or any(p.exitcode for p in procs):
                    raise BenchError(f"{method}: results missing; exit codes "
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
    returned = writer["returned"]
    latencies = [(rcv - ret) / 1e3 for r in reads
                 for rcv, ret in zip(r["received"][warm:], returned[warm:], strict=True)]
    first_ms = max((r["received"][0] - returned[0]) / 1e6 for r in reads)
    start_ns = writer["start"]  # every reader had read the warm-up arrays
    end_ns = max(r["received"][-1] for r in reads)
    gb = n * 8 * measured * readers / 1e9
    cpu = writer["cpu"] + sum(r["cpu"] for r in reads) + extra_used
    return {"method": method, "copy": copy, "mib": n * 8 / 2**20, "readers": readers,
            "count": measured, "p50_us": statistics.median(latencies), "max_us": max(latencies),
            "first_ms": first_ms, "gb_s": gb / ((end_ns - start_ns) / 1e9),
            "cpu_s_per_gb": cpu / (gb * count / measured),
            "peak_shm_mib": peak / 2**20}


def _ready(ready: Any, n: int) -> None:
    for _ in range(n):
        ready.get(timeout=60)


def memcpy_gb_s(n: int) -> float:
    a, b = np.ones(n), np.empty(n)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return n * 8 / best / 1e9


# -- the run --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 16, 64, 256],
                        help="array sizes in MiB")
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--count", type=int, default=0, help="arrays per measurement "
                        "(0: about 256 MiB per size, at least 4, at most 64)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeat", type=int, default=1, help="measurements per row, the "
                        "median (by GB/s) reported: a loaded machine moves single ones")
    parser.add_argument("--quick", action="store_true", help="1 and 16 MiB, 4 arrays")
    parser.add_argument("--out", default="tools/results/large_messages.json")
    args = parser.parse_args(argv)
    sizes = [1, 16] if args.quick else args.sizes
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    print(f"/dev/shm free: {free / 2**30:.1f} GiB; load {os.getloadavg()[0]:.1f}; "
          f"{psutil.cpu_count()} cores", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="large-bench-", dir="/dev/shm") as tmp:
        context = shmbus.Context(dir=str(Path(tmp) / "bus"), embedded_driver=False,
                                 driver_idle_timeout=3600.0)  # the peers run without a client
        driver = start_driver(context)
        try:
            for mib in sizes:
                n = int(mib * 2**20) // 8
                count = args.count or (4 if args.quick else max(4, min(64, int(256 / mib))))
                memcpy = memcpy_gb_s(n)
                print(f"\n{mib:g} MiB x {count}: memcpy {memcpy:.2f} GB/s (one process)",
                      flush=True)
                for readers in args.readers:
                    for method in args.methods:
                        for copy in ((False, True) if method in ("shmbus views",
                                                                 "shared_memory by hand",
                                                                 "zmq send_array",
                                                                 "iceoryx2 loans")
                                     else (True,)):
                            if method == "shmbus views" and copy:
                                continue  # "shmbus copy" is that row
                            try:
                                runs = [measure(method, copy, n, count, readers, context,
                                                driver.pid) for _ in range(args.repeat)]
                                row = sorted(runs, key=lambda r: r["gb_s"])[len(runs) // 2]
                                row["runs_gb_s"] = [r["gb_s"] for r in runs]
                            except BenchError as e:  # a peer that failed: n/a, the run goes on
                                print(f"  {readers} reader(s) {method:<22} "
                                      f"{'copy' if copy else 'view':<5} n/a: {e}", flush=True)
                                rows.append({"method": method, "copy": copy, "mib": mib,
                                             "readers": readers, "error": str(e)})
                                if method.startswith("shmbus"):
                                    raise  # shmbus itself must not fail
                                continue
                            # (the machine's load moves: memcpy again, right after the row)
                            memcpy = max(memcpy_gb_s(n), memcpy)
                            row["memcpy_gb_s"] = memcpy
                            rows.append(row)
                            print(f"  {readers} reader(s) {method:<22} "
                                  f"{'copy' if copy else 'view':<5} p50 "
                                  f"{row['p50_us']:>9.0f} us  max {row['max_us']:>9.0f} us  "
                                  f"first {row['first_ms']:>6.1f} ms  "
                                  f"{row['gb_s']:>6.2f} GB/s ({row['gb_s'] / memcpy:.2f}x "
                                  f"memcpy)  {row['cpu_s_per_gb']:.2f} cpu-s/GB  peak "
                                  f"/dev/shm {row['peak_shm_mib']:.0f} MiB", flush=True)
                best = max((r["memcpy_gb_s"] for r in rows
                            if r["mib"] == mib and "memcpy_gb_s" in r), default=memcpy)
                for r in rows:  # one memcpy figure per size: its best
                    if r["mib"] == mib and "memcpy_gb_s" in r:
                        r["memcpy_gb_s"] = best
                print(f"  memcpy at {mib:g} MiB, best in the run: {best:.2f} GB/s", flush=True)
        finally:
            stop_driver(driver)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
