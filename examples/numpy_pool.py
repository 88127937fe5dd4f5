"""A multiprocessing.Pool of workers sharing numpy arrays over the bus.

The parent publishes work items (a 2-D float64 array each) on one stream; every worker
subscribes, takes the items whose index matches its slot, and publishes the row sums back on a
second stream as numpy records, each worker with a publication (session) of its own. Workers
connect with the parent's picklable Context, so they find the same bus (and its embedded
driver).

    .venv/bin/python examples/numpy_pool.py
"""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np

import shmbus

WORK, RESULTS = 2001, 2002
WORKERS = 3
ITEMS = 300
SHAPE = (64, 16)  # 8 KiB of float64 per item: fragmented on the way, reassembled on arrival
RESULT = np.dtype([("item", "<u4"), ("sums", "<f8", SHAPE[0])])


def worker(context: shmbus.Context, slot: int) -> int:
    done = 0
    with shmbus.connect(context) as bus:
        work = bus.add_subscription("aeron:ipc", WORK)
        deadline = time.monotonic() + 60
        while not work.is_connected and time.monotonic() < deadline:
            work.poll(lambda buffer, header: None, 1)  # nothing is published yet
            time.sleep(0.001)
        # the parent starts publishing once it sees this session: by then this worker's image
        # of the work stream is there, and it sees every item
        results = bus.add_exclusive_publication("aeron:ipc", RESULTS)

        def on_item(buffer: memoryview, header: shmbus.Header) -> None:
            nonlocal done
            item = header.reserved_value
            if item % WORKERS != slot:
                return
            matrix = np.frombuffer(buffer, np.float64).reshape(SHAPE)  # zero copy
            record = np.zeros(1, RESULT)
            record["item"] = item
            record["sums"] = matrix.sum(axis=1)
            results.publish(record, timeout=10)
            done += 1

        assembler = shmbus.FragmentAssembler(on_item)
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        while done < ITEMS // WORKERS + (slot < ITEMS % WORKERS) and time.monotonic() < deadline:
            idle.idle(work.poll(assembler, 16))
    return done


def main() -> None:
    rng = np.random.default_rng(7)
    items = [rng.standard_normal(SHAPE) for _ in range(ITEMS)]
    with shmbus.connect(ipc_term_length=1 << 20) as bus:
        work = bus.add_publication("aeron:ipc", WORK)
        results = bus.add_subscription("aeron:ipc", RESULTS)
        with mp.get_context("spawn").Pool(WORKERS) as pool:
            jobs = [pool.apply_async(worker, (bus.context, slot)) for slot in range(WORKERS)]
            sums: dict[int, np.ndarray] = {}
            # the buffer is only valid during the call: copy what is kept
            batches = shmbus.FragmentAssembler(
                lambda b, h: sums.update({int(r["item"]): r["sums"].copy()
                                          for r in np.frombuffer(b, RESULT)}))
            deadline = time.monotonic() + 30
            while len(results.images) < WORKERS:  # every worker is ready for every item
                if time.monotonic() > deadline:
                    raise SystemExit("workers did not subscribe")
                results.poll(batches, 64)
                time.sleep(0.01)
            for index, matrix in enumerate(items):
                work.publish(matrix, timeout=10, reserved_value=index)
            while len(sums) < ITEMS and time.monotonic() < deadline + 30:
                if not results.poll(batches, 64):
                    time.sleep(0.001)
            counts = [job.get(60) for job in jobs]
    wrong = sum(not np.allclose(sums[i], items[i].sum(axis=1)) for i in sums)
    print(f"{ITEMS} matrices of {SHAPE} float64 to {WORKERS} workers {counts}: "
          f"{len(sums)} results, {wrong} wrong")
    raise SystemExit(0 if len(sums) == ITEMS and not wrong else 1)


if __name__ == "__main__":
    main()
