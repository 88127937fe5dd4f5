"""Worker-pool benchmark: one producer, 4 workers, each task done by exactly one worker.

    python -m tools.bench.workers [--tasks N] [--json FILE]   # from the repository root

For 32 B and 4 KiB tasks, in one run, on the same machine:

* shmbus: a publication (``publish_many`` of 256 tasks at a time) and 4 members of a
  subscription group (``group="bench"``), each polling up to 256 fragments at a time through
  a FragmentAssembler; an embedded driver in a fresh bus directory.
* multiprocessing.Queue: one queue, ``put`` per task, 4 workers ``get``.
* multiprocessing.Pool: ``imap_unordered(check, tasks, chunksize=256)`` on 4 processes (the
  producer is the parent, which also takes the results).
* pyzmq PUSH/PULL over ``ipc://``: the producer PUSHes, 4 workers PULL.

A task is ``(seq u64, crc u32)`` then a body cut from a random block; ``crc`` is the crc32 of
the body started from the low 32 bits of seq. The producer makes every task before the clock
starts, so the figures are those of moving and checking tasks, not of making them. Every
worker checks every task's length and CRC and counts each seq it was handed; at the end the
counts of all workers must be exactly one per task, else the row says failed.

The clock (CLOCK_MONOTONIC, shared by all processes) runs from the producer's first send to
the last task a worker finished; a worker stops once the workers' progress counters (a
shared array, one slot each) add up to every task. Processes, start barrier, watchdog and CPU
accounting are tools/bench/harness.py's: "cores" is CPU seconds over wall seconds, per role, the
driver of the bus included. Each transport runs ``--repeat`` times (default 3), the transports
taking turns, and the median is reported; ratios are shmbus's tasks/s over each peer's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import shutil
import struct
import tempfile
import time
import zlib
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import shmbus
from tools.bench.harness import BenchError, Member, attempt, cpu_seconds, median_row, run_processes
from tools.bench.report import fmt, fmt_rate, machine, text_table

CTX = mp.get_context("spawn")
HEAD = struct.Struct("<QI")
WORKERS = 4
BATCH = 256
IDLE_S = 0.05
TIMEOUT_S = 300.0
BLOCK = random.Random(15).randbytes(1 << 16)


# -- tasks and their checks --------------------------------------------------------------------

def make_task(seq: int, size: int) -> bytes:
    start = (seq * 64) % (len(BLOCK) - size)
    body = BLOCK[start:start + size - HEAD.size]
    return HEAD.pack(seq, zlib.crc32(body, seq & 0xFFFFFFFF)) + body


def make_tasks(count: int, size: int) -> list[bytes]:
    return [make_task(seq, size) for seq in range(count)]


class Checker:
    """A worker's checks: each task's length and CRC, and how often each seq came."""

    def __init__(self, count: int, size: int, progress: Any, slot: int) -> None:
        self.seen = bytearray(count)
        self.count = count
        self.size = size
        self.errors = 0
        self.done = 0
        self.last_s = 0.0
        self.progress = progress
        self.slot = slot

    def __call__(self, task: bytes | memoryview, header: Any = None) -> None:
        seq, crc = HEAD.unpack_from(task)
        if len(task) != self.size or zlib.crc32(task[HEAD.size:], seq & 0xFFFFFFFF) != crc:
            self.errors += 1
        else:
            self.seen[seq] = min(self.seen[seq] + 1, 255)
        self.done += 1

    def published(self) -> bool:
        """Publish this worker's progress; True once all workers together did every task."""
        if self.progress[self.slot] != self.done:
            self.progress[self.slot] = self.done
            self.last_s = time.monotonic()
        return sum(self.progress) >= self.count

    def report(self) -> dict[str, Any]:
        return {"seen": bytes(self.seen), "errors": self.errors, "last_s": self.last_s}


def all_done(progress: Any, count: int) -> None:
    """Wait (sleeping) until the workers did every task: a producer keeps its queue till then."""
    deadline = time.monotonic() + TIMEOUT_S
    while sum(progress) < count and time.monotonic() < deadline:
        time.sleep(0.001)


# -- shmbus --------------------------------------------------------------------------------

def shmbus_worker(start: Any, context: shmbus.Context, count: int, size: int, progress: Any,
                  slot: int) -> dict[str, Any]:
    checker = Checker(count, size, progress, slot)
    with shmbus.connect(context) as bus:
        member = bus.add_subscription("aeron:ipc", 1001, group="bench")
        whole = shmbus.FragmentAssembler(checker)  # 4 KiB tasks come in 3 fragments
        start.ready(bus.cnc.pid)
        while not checker.published():
            member.poll(whole, BATCH, timeout=IDLE_S)
    return checker.report()


def shmbus_producer(start: Any, context: shmbus.Context, count: int, size: int,
                    progress: Any) -> dict[str, Any]:
    with shmbus.connect(context) as bus:
        publication = bus.add_publication("aeron:ipc", 1001)
        made = make_tasks(count, size)
        start.ready(bus.cnc.pid)
        t0 = time.monotonic()
        for first in range(0, count, BATCH):
            publication.publish_many(made[first:first + BATCH], timeout=60)
        all_done(progress, count)
    return {"t0": t0}


# -- multiprocessing.Queue -----------------------------------------------------------------

def queue_worker(start: Any, queue: Any, count: int, size: int, progress: Any,
                 slot: int) -> dict[str, Any]:
    checker = Checker(count, size, progress, slot)
    start.ready()
    while not checker.published():
        try:
            checker(queue.get(timeout=IDLE_S))
        except Exception:  # queue.Empty
            continue
    return checker.report()


def queue_producer(start: Any, queue: Any, count: int, size: int,
                   progress: Any) -> dict[str, Any]:
    made = make_tasks(count, size)
    start.ready()
    t0 = time.monotonic()
    for task in made:
        queue.put(task)
    all_done(progress, count)
    return {"t0": t0}


# -- pyzmq PUSH/PULL -----------------------------------------------------------------------

def zmq_worker(start: Any, address: str, count: int, size: int, progress: Any,
               slot: int) -> dict[str, Any]:
    import zmq

    checker = Checker(count, size, progress, slot)
    with zmq.Context() as context, context.socket(zmq.PULL) as socket:
        socket.connect(address)
        start.ready()
        while not checker.published():
            try:
                checker(socket.recv(zmq.NOBLOCK))
            except zmq.Again:
                socket.poll(int(IDLE_S * 1000))
        socket.close(linger=0)
    return checker.report()


def zmq_producer(start: Any, address: str, count: int, size: int,
                 progress: Any) -> dict[str, Any]:
    import zmq

    with zmq.Context() as context, context.socket(zmq.PUSH) as socket:
        socket.bind(address)
        made = make_tasks(count, size)
        start.ready()
        t0 = time.monotonic()
        for task in made:
            socket.send(task)
        all_done(progress, count)  # queued tasks are not dropped by closing early
        socket.close(linger=0)
    return {"t0": t0}


# -- the measurements ----------------------------------------------------------------------

def measure(producer: Any, worker: Any, target: Any, count: int, size: int) -> dict[str, Any]:
    """Run the producer and 4 workers on ``target``; the row of the run."""
    progress = CTX.Array("q", WORKERS, lock=False)
    members = [Member("producer", producer, (target, count, size, progress))] + [
        Member(f"worker {slot}", worker, (target, count, size, progress, slot))
        for slot in range(WORKERS)]
    out = run_processes(CTX, members, TIMEOUT_S)
    reports = [out.results[f"worker {slot}"] for slot in range(WORKERS)]
    seen = sum(np.frombuffer(r["seen"], np.uint8).astype(np.int64) for r in reports)
    if any(r["errors"] for r in reports) or not np.all(seen == 1):
        raise BenchError(f"{int(np.sum(seen == 0))} tasks lost, {int(np.sum(seen > 1))} done "
                         f"twice, {sum(r['errors'] for r in reports)} corrupt")
    elapsed = max(r["last_s"] for r in reports) - out.results["producer"]["t0"]
    workers = [out.cores.get(f"worker {slot}") for slot in range(WORKERS)]
    return {"tasks_per_s": count / elapsed,
            "cpu_us_per_task": sum(c or 0.0 for c in out.cores.values()) * out.wall_s
            / count * 1e6,
            "cores": {"producer": out.cores.get("producer"),
                      "workers": sum(c or 0.0 for c in workers),
                      "driver": out.cores.get("driver")}}


def run_shmbus(count: int, size: int, *, term_length: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="bench-workers-", dir="/dev/shm")
    context = shmbus.Context(dir=directory + "/bus", ipc_term_length=term_length,
                             driver_idle_timeout=2.0)
    try:
        with shmbus.connect(context):  # keeps the embedded driver for the run
            return measure(shmbus_producer, shmbus_worker, context, count, size)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_queue(count: int, size: int) -> dict[str, Any]:
    return measure(queue_producer, queue_worker, CTX.Queue(), count, size)


def run_zmq(count: int, size: int) -> dict[str, Any]:
    import zmq  # noqa: F401 - Unavailable without it

    directory = tempfile.mkdtemp(prefix="bench-workers-zmq-")
    try:
        return measure(zmq_producer, zmq_worker, f"ipc://{directory}/push", count, size)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def pool_check(task: bytes) -> int:
    """A pool worker's check: the task's seq, or -1 for a bad task."""
    seq, crc = HEAD.unpack_from(task)
    return seq if zlib.crc32(task[HEAD.size:], seq & 0xFFFFFFFF) == crc else -1


def run_pool(count: int, size: int) -> dict[str, Any]:
    """The parent produces and takes the results; the clock covers both."""
    with CTX.Pool(WORKERS) as pool:
        pool.map(pool_check, [make_task(0, size)] * WORKERS)  # every worker started
        pids = [p.pid for p in pool._pool]  # type: ignore[attr-defined]
        made = make_tasks(count, size)
        before = [cpu_seconds(pid) or 0.0 for pid in pids]
        parent_before = time.process_time()
        t0 = time.monotonic()
        seen = np.zeros(count, np.int64)
        corrupt = 0
        for seq in pool.imap_unordered(pool_check, made, chunksize=BATCH):
            if seq < 0:
                corrupt += 1
            else:
                seen[seq] += 1
        elapsed = time.monotonic() - t0
        parent = time.process_time() - parent_before
        workers = sum((cpu_seconds(pid) or 0.0) - b for pid, b in zip(pids, before,
                                                                       strict=True))
    if corrupt or not np.all(seen == 1):
        raise BenchError(f"{int(np.sum(seen == 0))} tasks lost, {int(np.sum(seen > 1))} done "
                         f"twice, {corrupt} corrupt")
    return {"tasks_per_s": count / elapsed, "cpu_us_per_task": (parent + workers) / count * 1e6,
            "cores": {"producer": parent / elapsed, "workers": workers / elapsed,
                      "driver": None}}


# -- report --------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]) -> str:
    headers = ("size", "transport", "tasks", "tasks/s", "shmbus x", "cores: producer",
               "workers", "driver", "cpu us/task", "status")
    lines = []
    for row in rows:
        base = next(r for r in rows if r["size"] == row["size"] and r["transport"] == "shmbus")
        ok = row["status"] == "ok" and base["status"] == "ok"
        cores = row.get("cores", {})
        lines.append((f"{row['size']} B", row["transport"], f"{row['tasks']:,}",
                      fmt_rate(row.get("tasks_per_s")),
                      "-" if row is base or not ok else
                      f"{base['tasks_per_s'] / row['tasks_per_s']:.1f}",
                      fmt(cores.get("producer"), 2), fmt(cores.get("workers"), 2),
                      fmt(cores.get("driver"), 2), fmt(row.get("cpu_us_per_task"), 2),
                      row["status"] if row["status"] == "ok" else
                      f"{row['status']}: {row.get('error', '')}"))
    return text_table(headers, lines, right=range(2, 9), groups=[r["size"] for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300_000, help="32 B tasks per run")
    parser.add_argument("--large-tasks", type=int, default=40_000, help="4 KiB tasks per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; medians reported")
    parser.add_argument("--term-length", type=int, default=4 << 20,
                        help="shmbus IPC term length (bytes)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    where = machine()
    print(f"worker-pool bench: 1 producer, {WORKERS} workers; python {where['python']}, "
          f"{where['cpus']} CPUs, load average {where['load']:.2f}; shmbus term length "
          f"{args.term_length}")
    runners = {"shmbus": partial(run_shmbus, term_length=args.term_length),
               "mp.Queue": run_queue, "mp.Pool": run_pool, "zmq PUSH/PULL": run_zmq}
    rows = []
    for size, count in ((32, args.tasks), (4096, args.large_tasks)):
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
        for round_ in range(args.repeat):  # the transports take turns: they meet one load
            for name, run in runners.items():
                row = attempt(partial(run, count, size))
                runs[name].append(row)
                print(f"  run {round_ + 1}: {size} B {name}: "
                      f"{fmt_rate(row.get('tasks_per_s'))} tasks/s {row['status']}",
                      flush=True)
        rows.extend({"size": size, "transport": name, "tasks": count, **median_row(r)}
                    for name, r in runs.items())
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if any(row["status"] == "failed" for row in rows):
        raise SystemExit("a run failed: a task was lost, corrupted or done twice, or it hung")


if __name__ == "__main__":
    main()
