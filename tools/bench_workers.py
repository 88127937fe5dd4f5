# Run from the repository root: .venv/bin/python tools/bench_workers.py [--tasks N] [--json f]
"""Worker-pool benchmark: one producer, 4 workers, each task done by exactly one worker.

For 32 B and 4 KiB tasks, in one run, on the same machine:

* shmbus: a publication and 4 members of a subscription group (``group="bench"``), each
  polling up to 256 fragments at a time; an embedded driver in a fresh bus directory.
* multiprocessing.Queue: one queue, ``put`` per task, 4 workers ``get``.
* multiprocessing.Pool: ``imap_unordered(check, tasks, chunksize=256)`` on 4 processes (the
  producer is the parent, which also takes the results).
* pyzmq PUSH/PULL over ``ipc://``: the producer PUSHes, 4 workers PULL.

A task is ``(seq u64, crc u32)`` then a body cut from a random block; ``crc`` is the crc32 of
the body started from the low 32 bits of seq. The producer makes every task before the clock
starts, so the figures are those of moving and checking tasks, not of making them. Every
worker checks every task's length and CRC and counts each seq it was handed; at the end the
counts of all workers must be exactly one per task, else the row says FAILED. The clock runs
from the producer's start until the workers' progress counters (a shared array, one slot per
worker) add up to every task.
CPU seconds (user + system) of every process over that time come from psutil: the producer,
the sum of the workers, and the shmbus driver; "cpu us/task" is all of it per task, the figure
a busy machine disturbs least.

Each transport runs ``--repeat`` times (default 3), the transports taking turns, and the best
round of each is reported (the machine is shared: the best round is the one least disturbed).
Ratios are shmbus's tasks/s over each peer's in the same run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import shmbus  # noqa: E402

CTX = mp.get_context("spawn")
HEAD = struct.Struct("<QI")
WORKERS = 4
BATCH = 256
IDLE_S = 0.05
BLOCK = random.Random(15).randbytes(1 << 16)


# -- tasks ---------------------------------------------------------------------------------

def make_task(seq: int, size: int) -> bytes:
    start = (seq * 64) % (len(BLOCK) - size)
    body = BLOCK[start:start + size - HEAD.size]
    return HEAD.pack(seq, zlib.crc32(body, seq & 0xFFFFFFFF)) + body


def make_tasks(count: int, size: int, prepared: Any) -> list[bytes]:
    """Every task, made before the clock starts (then ``prepared`` is set)."""
    made = [make_task(seq, size) for seq in range(count)]
    prepared.set()
    return made


class Checker:
    """A worker's checks: each task's length and CRC, and how often each seq came."""

    def __init__(self, count: int, size: int, progress: Any, slot: int) -> None:
        self.seen = bytearray(count)
        self.size = size
        self.errors = 0
        self.done = 0
        self.progress = progress
        self.slot = slot

    def __call__(self, task: bytes | memoryview, header: Any = None) -> None:
        seq, crc = HEAD.unpack_from(task)
        if len(task) != self.size or zlib.crc32(task[HEAD.size:], seq & 0xFFFFFFFF) != crc:
            self.errors += 1
        else:
            self.seen[seq] = min(self.seen[seq] + 1, 255)
        self.done += 1

    def publish_progress(self) -> None:
        self.progress[self.slot] = self.done

    def report(self) -> dict[str, Any]:
        return {"seen": bytes(self.seen), "errors": self.errors}


# -- shmbus --------------------------------------------------------------------------------

def shmbus_worker(context: shmbus.Context, count: int, size: int, progress: Any, slot: int,
                  ready: Any, stop: Any, results: Any) -> None:
    checker = Checker(count, size, progress, slot)
    with shmbus.connect(context) as bus:
        member = bus.add_subscription("aeron:ipc", 1001, group="bench")
        whole = shmbus.FragmentAssembler(checker)  # 4 KiB tasks come in 3 fragments
        ready.put(os.getpid())
        while not stop.is_set():
            if member.poll(whole, BATCH, timeout=IDLE_S):
                checker.publish_progress()
        results.put(checker.report())


def shmbus_producer(context: shmbus.Context, count: int, size: int, prepared: Any, go: Any,
                    stop: Any) -> None:
    with shmbus.connect(context) as bus:
        publication = bus.add_publication("aeron:ipc", 1001)
        made = make_tasks(count, size, prepared)
        go.wait(60)
        for start in range(0, count, BATCH):
            publication.publish_many(made[start:start + BATCH], timeout=60)
        stop.wait(600)  # until every task is done: the stream stays meanwhile


# -- multiprocessing.Queue -----------------------------------------------------------------

def queue_worker(queue: Any, count: int, size: int, progress: Any, slot: int, ready: Any,
                 stop: Any, results: Any) -> None:
    checker = Checker(count, size, progress, slot)
    ready.put(os.getpid())
    while not stop.is_set():
        try:
            checker(queue.get(timeout=IDLE_S))
        except Exception:  # queue.Empty
            continue
        checker.publish_progress()
    results.put(checker.report())


def queue_producer(queue: Any, count: int, size: int, prepared: Any, go: Any,
                   stop: Any) -> None:
    made = make_tasks(count, size, prepared)
    go.wait(60)
    for task in made:
        queue.put(task)
    stop.wait(600)


# -- pyzmq PUSH/PULL -----------------------------------------------------------------------

def zmq_worker(address: str, count: int, size: int, progress: Any, slot: int, ready: Any,
               stop: Any, results: Any) -> None:
    checker = Checker(count, size, progress, slot)
    with zmq.Context() as context, context.socket(zmq.PULL) as socket:
        socket.connect(address)
        ready.put(os.getpid())
        while not stop.is_set():
            try:
                checker(socket.recv(zmq.NOBLOCK))
                checker.publish_progress()
            except zmq.Again:
                socket.poll(int(IDLE_S * 1000))
        results.put(checker.report())
        socket.close(linger=0)


def zmq_producer(address: str, count: int, size: int, prepared: Any, go: Any,
                 stop: Any) -> None:
    with zmq.Context() as context, context.socket(zmq.PUSH) as socket:
        socket.bind(address)
        made = make_tasks(count, size, prepared)
        go.wait(60)
        for task in made:
            socket.send(task)
        stop.wait(600)  # until every task is done: queued tasks are not dropped
        socket.close(linger=0)


# -- multiprocessing.Pool ------------------------------------------------------------------

def pool_check(task: bytes) -> int:
    """A pool worker's check: the task's seq, or -1 for a bad task."""
    seq, crc = HEAD.unpack_from(task)
    return seq if zlib.crc32(task[HEAD.size:], seq & 0xFFFFFFFF) == crc else -1


def run_pool(count: int, size: int) -> dict[str, Any]:
    with CTX.Pool(WORKERS) as pool:
        pool.map(pool_check, [make_task(0, size)] * WORKERS)  # start every worker first
        made = make_tasks(count, size, CTX.Event())
        processes = [psutil.Process(p.pid) for p in pool._pool]  # type: ignore[attr-defined]
        me = psutil.Process()
        before = [cpu(p) for p in (me, *processes)]
        start = time.perf_counter()
        seen = np.zeros(count, np.int64)
        errors = 0
        for seq in pool.imap_unordered(pool_check, made, chunksize=BATCH):
            if seq < 0:
                errors += 1
            else:
                seen[seq] += 1
        elapsed = time.perf_counter() - start
        after = [cpu(p) for p in (me, *processes)]
    used = [b - a for a, b in zip(before, after, strict=True)]
    return {"elapsed": elapsed, "ok": errors == 0 and bool(np.all(seen == 1)),
            "producer_cpu": used[0], "workers_cpu": sum(used[1:]), "driver_cpu": None}


# -- the common harness for a producer and 4 worker processes ------------------------------

def cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def run_workers(worker: Callable[..., None], producer: Callable[..., None], target: Any,
                count: int, size: int, extra: list[psutil.Process]) -> dict[str, Any]:
    """Start 4 workers (``worker(target, ...)``) and the producer, time until every task is
    done, collect the workers' counts and check each task was done exactly once."""
    progress = CTX.Array("q", WORKERS, lock=False)
    ready, results = CTX.Queue(), CTX.Queue()
    prepared, go, stop = CTX.Event(), CTX.Event(), CTX.Event()
    workers = [CTX.Process(target=worker, args=(target, count, size, progress, slot, ready,
                                                 stop, results), daemon=True)
               for slot in range(WORKERS)]
    for process in workers:
        process.start()
    pids = [ready.get(timeout=60) for _ in workers]
    time.sleep(0.2)  # connections settle (zmq distributes only to connected pullers)
    feeder = CTX.Process(target=producer, args=(target, count, size, prepared, go, stop),
                         daemon=True)
    feeder.start()
    watched = [psutil.Process(pid) for pid in (feeder.pid, *pids)] + extra
    if not prepared.wait(300):
        raise SystemExit(f"{producer.__name__}: no tasks made in 300 s")
    before = [cpu(p) for p in watched]
    start = time.perf_counter()
    go.set()
    deadline = time.monotonic() + 600
    while sum(progress) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{worker.__name__}: {sum(progress)} of {count} tasks in 600 s")
        time.sleep(0.0005)
    elapsed = time.perf_counter() - start
    after = [cpu(p) for p in watched]
    stop.set()
    reports = [results.get(timeout=60) for _ in workers]
    for process in [*workers, feeder]:
        process.join(30)
    seen = sum(np.frombuffer(r["seen"], np.uint8).astype(np.int64) for r in reports)
    used = [b - a for a, b in zip(before, after, strict=True)]
    return {"elapsed": elapsed,
            "ok": all(r["errors"] == 0 for r in reports) and bool(np.all(seen == 1)),
            "producer_cpu": used[0], "workers_cpu": sum(used[1:1 + WORKERS]),
            "driver_cpu": sum(used[1 + WORKERS:]) if extra else None}


def run_shmbus(count: int, size: int, *, term_length: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="bench-workers-", dir="/dev/shm")
    context = shmbus.Context(dir=directory + "/bus", ipc_term_length=term_length,
                             driver_idle_timeout=2.0)
    try:
        with shmbus.connect(context) as bus:  # keeps the embedded driver for the run
            return run_workers(shmbus_worker, shmbus_producer, context, count, size,
                               [psutil.Process(bus.cnc.pid)])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_queue(count: int, size: int) -> dict[str, Any]:
    return run_workers(queue_worker, queue_producer, CTX.Queue(), count, size, [])


def run_zmq(count: int, size: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="bench-workers-zmq-")
    try:
        return run_workers(zmq_worker, zmq_producer, f"ipc://{directory}/push", count, size,
                           [])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- report --------------------------------------------------------------------------------

def total_cpu(row: dict[str, Any]) -> float:
    """CPU seconds of every process of a run: producer, workers and driver."""
    return row["producer_cpu"] + row["workers_cpu"] + (row["driver_cpu"] or 0.0)


def table(rows: list[dict[str, Any]]) -> str:
    header = ("size", "transport", "tasks", "tasks/s", "shmbus x", "cpu s: producer",
              "workers", "driver", "cpu us/task", "check")
    lines = [header]
    for row in rows:
        base = next(r for r in rows if r["size"] == row["size"] and r["transport"] == "shmbus")
        rate = row["tasks"] / row["elapsed"]
        ratio = (base["tasks"] / base["elapsed"]) / rate
        lines.append((f"{row['size']} B", row["transport"], f"{row['tasks']:,}",
                      f"{rate:,.0f}", "-" if row is base else f"{ratio:.1f}",
                      f"{row['producer_cpu']:.2f}", f"{row['workers_cpu']:.2f}",
                      "-" if row["driver_cpu"] is None else f"{row['driver_cpu']:.2f}",
                      f"{total_cpu(row) / row['tasks'] * 1e6:.2f}",
                      "ok" if row["ok"] else "FAILED"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True))
                     for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300_000, help="32 B tasks per transport")
    parser.add_argument("--large-tasks", type=int, default=50_000,
                        help="4 KiB tasks per transport")
    parser.add_argument("--term-length", type=int, default=4 << 20,
                        help="shmbus IPC term length (bytes)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; each transport's best round is reported (a failed "
                        "check in any round is)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"worker-pool bench: 1 producer, {WORKERS} workers, {os.cpu_count()} CPUs, load "
          f"average {load[0]:.2f}; shmbus term length {args.term_length}")
    runners: dict[str, Callable[[int, int], dict[str, Any]]] = {
        "shmbus": partial(run_shmbus, term_length=args.term_length), "mp.Queue": run_queue,
        "mp.Pool": run_pool, "zmq PUSH/PULL": run_zmq}
    rows = []
    for size, count in ((32, args.tasks), (4096, args.large_tasks)):
        best: dict[str, dict[str, Any]] = {}
        for round_ in range(args.repeat):  # rounds interleave the transports: same load
            for name, run in runners.items():
                row = {"size": size, "transport": name, "tasks": count, **run(count, size)}
                print(f"  round {round_ + 1}: {size} B {name}: "
                      f"{count / row['elapsed']:,.0f} tasks/s{'' if row['ok'] else ' FAILED'}",
                      flush=True)
                if name not in best or not row["ok"] or (
                        best[name]["ok"] and row["elapsed"] < best[name]["elapsed"]):
                    best[name] = row
        rows.extend(best.values())
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if not all(row["ok"] for row in rows):
        raise SystemExit("a task was lost, corrupted or done twice")


if __name__ == "__main__":
    main()
