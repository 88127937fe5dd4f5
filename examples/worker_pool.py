"""A worker pool on the bus: one producer, four workers, each task done by exactly one worker.

The workers join the subscription group "squares" on the task stream, so every task goes to
one of them (whichever claims it first); each answers on a result stream that the parent
reads. Delivery is at least once: had a worker died holding a task, another would get it.

    .venv/bin/python examples/worker_pool.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
from typing import Any

import shmbus

TASKS, RESULTS = 3001, 3002
WORKERS = 4
COUNT = 10_000
TASK = struct.Struct("<q")            # the number to square
RESULT = struct.Struct("<qqi")        # the number, its square, the worker's pid


def worker(context: shmbus.Context, stop: Any) -> None:
    with shmbus.connect(context) as bus:
        tasks = bus.add_subscription("aeron:ipc", TASKS, group="squares")
        # the parent sees this session once this worker is in the group
        results = bus.add_exclusive_publication("aeron:ipc", RESULTS)

        def on_task(buffer: memoryview, header: shmbus.Header) -> None:
            (n,) = TASK.unpack(buffer)
            results.publish(RESULT.pack(n, n * n, os.getpid()), timeout=10)

        while not stop.is_set():
            tasks.poll(on_task, 64, timeout=0.1)  # sleeps while there is nothing to claim


def main() -> None:
    spawn = mp.get_context("spawn")
    with shmbus.connect() as bus:
        results = bus.add_subscription("aeron:ipc", RESULTS)
        tasks = bus.add_publication("aeron:ipc", TASKS)
        stop = spawn.Event()
        workers = [spawn.Process(target=worker, args=(bus.context, stop)) for _ in range(WORKERS)]
        for process in workers:
            process.start()
        while len(results.images) < WORKERS:  # every worker is in: its result stream is here
            results.poll(lambda buffer, header: None, 1, timeout=0.1)
        for n in range(COUNT):
            tasks.publish(TASK.pack(n), timeout=10)
        squares: dict[int, int] = {}
        by_worker: dict[int, int] = {}
        for message in results.messages(timeout=10):
            n, square, pid = RESULT.unpack(message)
            assert n not in squares, f"task {n} done twice"
            squares[n] = square
            by_worker[pid] = by_worker.get(pid, 0) + 1
            if len(squares) == COUNT:
                break
        stop.set()
        for process in workers:
            process.join(10)
    assert squares == {n: n * n for n in range(COUNT)}
    print(f"{COUNT} tasks, each done once; per worker: {sorted(by_worker.values())}")


if __name__ == "__main__":
    main()
