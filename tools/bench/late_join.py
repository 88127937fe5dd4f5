"""Late joiners: recorded history, then live, in one subscription, beside doing it by hand.

    python -m tools.bench.late_join [--history-s 2] [--rate 0] [--runs 3] [--json FILE]

A driver process, a publisher process (``offer_many`` of 64-byte messages, each carrying its
sequence number and a check word; ``--rate`` messages/s, default 50,000/s, a rate a
per-message Python reader outruns; 0: as fast as offer_many goes) and a
recorder process (``shmbus.Recorder``) run for ``--history-s`` seconds; then, per run, while
the publisher keeps publishing, this process (the joiner) measures, in turn:

* **reader**: ``RecordingReader.messages(from, to)`` over the recording from the start to
  where it stood: the recording read by hand, every payload copied out and checked (the
  reference rate);
* **late join**: ``bus.add_subscription(..., history=shmbus.Recording(dir),
  from_position="start")`` read with ``messages()``: the catch-up rate (messages replayed /
  seconds until the replay stops), the seconds from ``add_subscription`` to the first live
  message, how many messages were replayed after the live subscription joined (the merge:
  the issue's target is within a term's worth), and gaps and duplicates over the whole run
  (the sequence numbers, checked for every message);
* **by hand**: ``RecordingReader.messages()`` from the start to the recording's end, then a
  plain live subscription (what was published between is lost); and the live subscription
  added first, then the recording read, then the live messages (what both hold comes twice):
  the messages lost or duplicated at the seam, counted from the sequence numbers (a late
  joiner without a merge has no way to know either).

Every message is copied out and checked. CPU seconds of every process (driver, publisher,
recorder, joiner) are reported for the whole run. Medians of ``--runs``; the ratio of the
catch-up rate to the reader's is the figure the issue asks for (>= 0.8).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import shmbus
from tools.bench.harness import BenchError, cpu_seconds, start_driver, stop_driver
from tools.bench.report import text_table

STREAM = 1001
SIZE = 64
_HEAD = struct.Struct("<QQ")
_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_CHECK = np.uint64(_GOLDEN)


def rows(first: int, n: int) -> np.ndarray:
    """Messages ``first`` .. ``first + n - 1``: seq, seq * golden (a check word), zeros."""
    block = np.zeros((n, SIZE), np.uint8)
    words = block.view(np.uint64)
    seqs = np.arange(first, first + n, dtype=np.uint64)
    words[:, 0] = seqs
    with np.errstate(over="ignore"):
        words[:, 1] = seqs * _CHECK
    return block


def check(message: bytes) -> int:
    """The sequence number of a message; BenchError when it is not one of the publisher's."""
    if len(message) != SIZE:
        raise BenchError(f"message of {len(message)} bytes")
    seq, word = _HEAD.unpack_from(message)
    if (seq * _GOLDEN) & _MASK != word:
        raise BenchError(f"message {int(seq)}: bad check word")
    return int(seq)


def publisher(context: shmbus.Context, rate: float, stop: Any, ready: Any) -> None:
    with shmbus.connect(context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", STREAM)
        ready.set()
        seq, batch = 0, 256
        start = time.monotonic()
        while not stop.is_set():
            if rate and seq > (time.monotonic() - start) * rate:
                time.sleep(0.0005)
                continue
            result = pub.offer_many(rows(seq, batch))
            if result > 0:
                seq += result
            else:
                time.sleep(0)


def recorder(context: shmbus.Context, directory: str, stop: Any, ready: Any) -> None:
    with shmbus.connect(context) as bus, bus.add_recorder(directory, "aeron:ipc", STREAM) as rec:
        ready.set()
        rec.run(stop=stop)


class SeqCheck:
    """Sequence numbers in order: counts gaps (messages missing) and duplicates."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.count = self.missing = self.duplicated = 0

    def add(self, seq: int) -> None:
        if self.last is not None:
            if seq > self.last + 1:
                self.missing += seq - self.last - 1
            elif seq <= self.last:
                self.duplicated += self.last - seq + 1
        self.last = seq
        self.count += 1


def read_by_reader(directory: Path) -> dict[str, Any]:
    reader = shmbus.RecordingReader(directory, 0)
    end = reader.stop_position
    seqs = SeqCheck()
    start = time.perf_counter()
    for m in reader.messages(None, end):
        seqs.add(check(m.payload))
    seconds = time.perf_counter() - start
    if seqs.missing or seqs.duplicated or seqs.count == 0:
        raise BenchError(f"the recording is not whole: {vars(seqs)}")
    return {"messages": seqs.count, "seconds": seconds, "rate": seqs.count / seconds}


def late_join(bus: shmbus.Client, directory: Path, live_messages: int,
              catch_up: float | None) -> dict[str, Any]:
    """From the start with ``messages()``: the replay's rate (messages replayed / seconds to
    the first live message), the time to the first live message, the messages replayed after
    the live subscription joined."""
    seqs = SeqCheck()
    first_live_s = None
    replayed_before_live_join = None
    term = shmbus.RecordingReader(directory, 0).descriptor.term_length
    start = time.perf_counter()
    sub = bus.add_subscription("aeron:ipc", STREAM, history=shmbus.Recording(directory),
                               from_position="start", catch_up=catch_up)
    deadline = time.monotonic() + 120
    with sub:
        for message in sub.messages(timeout=10):
            seqs.add(check(message))
            if replayed_before_live_join is None and sub.live_since is not None:
                replayed_before_live_join = sub.replayed_messages
            if first_live_s is None and sub.live_messages:
                first_live_s = time.perf_counter() - start
            if sub.live_messages >= live_messages:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"no merge within 120 s ({sub.positions()}, behind "
                                 f"{sub.behind})")
        replayed = sub.replayed_messages
    if first_live_s is None or sub.live_messages < live_messages:
        raise BenchError(f"late join: {sub.live_messages} live messages, {live_messages} due")
    if seqs.missing or seqs.duplicated:
        raise BenchError(f"late join: {seqs.missing} missing, {seqs.duplicated} duplicated")
    return {"replayed": replayed, "catch_up_rate": replayed / first_live_s,
            "first_live_s": first_live_s,
            "replayed_after_live": replayed - (replayed_before_live_join or 0),
            "term_messages": term // 96, "missing": 0, "duplicated": 0}


def by_hand(bus: shmbus.Client, directory: Path, live_messages: int,
            live_first: bool) -> dict[str, Any]:
    """The recording read to its end, then a live subscription (messages published between
    are lost), or the live subscription first (what it holds that the recording has too
    comes twice)."""
    seqs = SeqCheck()
    reader = shmbus.RecordingReader(directory, 0)
    start = time.perf_counter()
    sub = bus.add_subscription("aeron:ipc", STREAM) if live_first else None
    position, end = None, reader.stop_position
    while position != end:  # to the recording's end, as long as it grows
        for m in reader.messages(position, end):
            seqs.add(check(m.payload))
        position, end = end, reader.stop_position
    if sub is None:
        sub = bus.add_subscription("aeron:ipc", STREAM)
    live = 0
    first_live_s = None
    for message in sub.messages(timeout=10):
        if first_live_s is None:
            first_live_s = time.perf_counter() - start
        seqs.add(check(message))
        live += 1
        if live >= live_messages:
            break
    sub.close()
    return {"first_live_s": first_live_s, "missing": seqs.missing,
            "duplicated": seqs.duplicated}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--history-s", type=float, default=2.0,
                        help="seconds of publishing recorded before the first join")
    parser.add_argument("--rate", type=float, default=50_000,
                        help="publisher messages/s (0: as fast as offer_many goes, faster "
                             "than any per-message reader: the joiner then never catches up "
                             "without --catch-up)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--live", type=int, default=10_000,
                        help="live messages each joiner reads after the merge")
    parser.add_argument("--catch-up", type=float, default=10.0,
                        help="catch_up seconds of the late joiner (docs/guides/late-joiners.md): "
                             "on a loaded machine the replay may not outrun the publisher; then "
                             "it joins live after this and holds the publisher until it merges")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="late-join-bench-", dir="/dev/shm"))
    context = shmbus.Context(dir=str(root / "bus"), embedded_driver=False)
    driver = start_driver(context)
    ctx = mp.get_context("spawn")
    stop, ready_pub, ready_rec = ctx.Event(), ctx.Event(), ctx.Event()
    directory = root / "rec"
    processes = [ctx.Process(target=recorder, args=(context, str(directory), stop, ready_rec)),
                 ctx.Process(target=publisher, args=(context, args.rate, stop, ready_pub))]
    runs: list[dict[str, Any]] = []
    try:
        processes[0].start()
        if not ready_rec.wait(30):
            raise BenchError("the recorder did not start")
        processes[1].start()
        if not ready_pub.wait(30):
            raise BenchError("the publisher did not start")
        pids = {"driver": driver.pid, "recorder": processes[0].pid,
                "publisher": processes[1].pid, "joiner": os.getpid()}
        cpu_before = {k: cpu_seconds(p) or 0.0 for k, p in pids.items()}
        wall_before = time.monotonic()
        time.sleep(args.history_s)
        with shmbus.connect(context) as bus:
            for _ in range(args.runs):
                runs.append({"reader": read_by_reader(directory),
                             "late_join": late_join(bus, directory, args.live, args.catch_up),
                             "by_hand": by_hand(bus, directory, args.live, False),
                             "live_first": by_hand(bus, directory, args.live, True)})
        wall = time.monotonic() - wall_before
        cpu = {k: (cpu_seconds(p) or 0.0) - cpu_before[k] for k, p in pids.items()}
    finally:
        stop.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
        stop_driver(driver)
        shutil.rmtree(root, ignore_errors=True)

    def median(part: str, key: str) -> float:
        return statistics.median(float(r[part][key] or 0) for r in runs)

    reader_rate = median("reader", "rate")
    catch_up = median("late_join", "catch_up_rate")
    summary = {
        "runs": runs, "cpu_s": cpu, "wall_s": wall,
        "reader_msgs_per_s": reader_rate, "catch_up_msgs_per_s": catch_up,
        "catch_up_vs_reader": catch_up / reader_rate,
        "first_live_s": median("late_join", "first_live_s"),
        "replayed_after_live": median("late_join", "replayed_after_live"),
        "by_hand_missing": [r["by_hand"]["missing"] for r in runs],
        "by_hand_duplicated": [r["by_hand"]["duplicated"] for r in runs],
        "live_first_missing": [r["live_first"]["missing"] for r in runs],
        "live_first_duplicated": [r["live_first"]["duplicated"] for r in runs],
    }
    lines = [["RecordingReader.messages(), msgs/s", f"{reader_rate:,.0f}"],
         ["late join catch-up, msgs/s", f"{catch_up:,.0f}"],
         ["catch-up / reader", f"{summary['catch_up_vs_reader']:.2f}"],
         ["messages replayed (late join)", f"{median('late_join', 'replayed'):,.0f}"],
         ["add_subscription -> first live message, s", f"{summary['first_live_s']:.3f}"],
         ["replayed after the live join (a term holds ~"
          f"{median('late_join', 'term_messages'):,.0f})",
          f"{summary['replayed_after_live']:,.0f}"],
         ["late join: missing / duplicated", "0 / 0"],
         ["by hand, recording then live: missing per run", str(summary["by_hand_missing"])],
         ["by hand, recording then live: duplicated per run",
          str(summary["by_hand_duplicated"])],
         ["by hand, live first: missing per run", str(summary["live_first_missing"])],
         ["by hand, live first: duplicated per run", str(summary["live_first_duplicated"])],
         ["CPU s (driver, publisher, recorder, joiner)",
          ", ".join(f"{cpu[k]:.2f}" for k in ("driver", "publisher", "recorder", "joiner"))],
         ["wall s", f"{wall:.1f}"]]
    print(text_table(["measure", "median of runs"], lines, right=[1],
                     groups=[0] * len(lines)))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"late_join: {e}", file=sys.stderr)
        sys.exit(1)
