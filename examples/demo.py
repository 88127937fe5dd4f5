"""The main job (`make demo`): an embedded driver, worker processes publishing and subscribing.

Three publisher processes share one concurrent publication and send numpy records carrying
(publisher id, sequence, crc32 of the payload); two subscriber processes check that every
message arrives exactly once, in order per publisher, with its checksum right. The summary
says what was sent, received and lost (nothing).
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
import zlib

import numpy as np

import shmbus

STREAM = 1001
PUBLISHERS = 3
SUBSCRIBERS = 2
MESSAGES = 200_000
RECORD = np.dtype([("publisher", "<u4"), ("sequence", "<u4"), ("crc", "<u4"),
                   ("payload", "u1", 52)])


def publisher(context: shmbus.Context, publisher_id: int, ready: mp.Barrier) -> float:
    with shmbus.connect(context) as bus:
        publication = bus.add_publication("aeron:ipc", STREAM)
        rng = np.random.default_rng(publisher_id)
        batch = np.zeros(256, RECORD)
        batch["publisher"] = publisher_id
        ready.wait(30)
        start = time.perf_counter()
        for first in range(0, MESSAGES, len(batch)):
            n = min(len(batch), MESSAGES - first)
            records = batch[:n]
            records["sequence"] = np.arange(first, first + n)
            records["payload"] = rng.integers(0, 256, (n, 52), dtype=np.uint8)
            records["crc"] = [zlib.crc32(p.tobytes()) for p in records["payload"]]
            publication.publish_many(records, timeout=30)
        return time.perf_counter() - start


def subscriber(context: shmbus.Context, ready: mp.Barrier) -> dict[str, int]:
    expected = np.zeros(PUBLISHERS, np.int64)
    stats = {"received": 0, "bad_checksum": 0, "out_of_order": 0}
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription("aeron:ipc", STREAM)
        ready.wait(30)

        def on_batch(batch: shmbus.FragmentBatch) -> None:
            records = batch.records(RECORD)
            for pid in range(PUBLISHERS):
                seqs = records["sequence"][records["publisher"] == pid]
                if seqs.size:
                    want = np.arange(expected[pid], expected[pid] + seqs.size)
                    stats["out_of_order"] += int(np.count_nonzero(seqs != want))
                    expected[pid] = seqs[-1] + 1
            crcs = np.array([zlib.crc32(p.tobytes()) for p in records["payload"]], np.uint32)
            stats["bad_checksum"] += int(np.count_nonzero(crcs != records["crc"]))
            stats["received"] += len(records)

        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        deadline = time.monotonic() + 120
        while stats["received"] < PUBLISHERS * MESSAGES and time.monotonic() < deadline:
            idle.idle(subscription.poll_batch(on_batch, 4096))
    return stats


def main() -> None:
    directory = tempfile.mkdtemp(prefix="shmbus-demo-", dir="/dev/shm")
    context = shmbus.Context.resolve(dir=directory, ipc_term_length=4 << 20,
                                     driver_idle_timeout=2.0)
    spawn = mp.get_context("spawn")
    with shmbus.connect(context) as bus:
        print(f"bus {directory}: driver pid {bus.cnc.pid} (embedded)")
        ready = spawn.Manager().Barrier(PUBLISHERS + SUBSCRIBERS)
        with spawn.Pool(PUBLISHERS + SUBSCRIBERS) as pool:
            subs = [pool.apply_async(subscriber, (context, ready)) for _ in range(SUBSCRIBERS)]
            time.sleep(0.5)  # subscriptions first, so they see every message
            pubs = [pool.apply_async(publisher, (context, i, ready)) for i in range(PUBLISHERS)]
            seconds = [p.get(180) for p in pubs]
            results = [s.get(180) for s in subs]
    sent = PUBLISHERS * MESSAGES
    print(f"sent      {sent:>9,} messages of {RECORD.itemsize} B from {PUBLISHERS} processes "
          f"({sent / max(seconds):,.0f} msg/s in all)")
    for i, r in enumerate(results):
        lost = sent - r["received"]
        print(f"received  {r['received']:>9,} by subscriber {i}: lost {lost}, out of order "
              f"{r['out_of_order']}, bad checksums {r['bad_checksum']}")
    ok = all(r["received"] == sent and not r["out_of_order"] and not r["bad_checksum"]
             for r in results)
    print("nothing lost, nothing reordered, nothing corrupted" if ok else "FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
