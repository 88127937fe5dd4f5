"""Late joiners: recorded history, then live, in one subscription, beside doing it by hand.

    python -m tools.bench.late_join [--quick] [--history-s 2] [--rate 50000] [--runs 5]
                                    [--json FILE] [--page DIR]

A driver process, a publisher process (``offer_many`` of 64-byte messages, each carrying its
sequence number, a check word derived from it and a fixed 48-byte pattern; ``--rate``
messages/s, default 50,000/s, a rate a per-message Python reader outruns; 0: as fast as
offer_many goes) and a recorder process (``shmbus.Recorder``) run for ``--history-s`` seconds;
then, per run, while the publisher keeps publishing, this process (the joiner) measures, in
turn (so the runs of the rows are interleaved):

* **batch reader**: ``RecordingReader.read_batches(from, to)`` over the recording from the
  start to where it stood, each batch's payloads sliced out as bytes (``MessageBatch.payloads``,
  as the late joiner's replay does) and checked: the same reader and the same per-message work
  as the late joiner's replay, without the merge (the reference rate);
* **late join**: ``bus.add_subscription(..., history=shmbus.Recording(dir),
  from_position="start")`` read with ``messages()``: the catch-up rate (messages replayed /
  seconds until the first live message), the seconds from ``add_subscription`` to the first
  live message, how many messages were replayed after the live subscription joined (the
  merge: the issue's target is within a term's worth), and gaps and duplicates over the whole
  run (the sequence numbers, checked for every message);
* **by hand**: ``RecordingReader.messages()`` from the start to the recording's end, then a
  plain live subscription (what was published between is lost); and the live subscription
  added first, then the recording read, then the live messages (what both hold comes twice):
  the messages lost or duplicated at the seam, counted from the sequence numbers (a late
  joiner without a merge has no way to know either).

Every message of every row is copied out and checked byte for byte (:func:`check`: length,
check word and pattern, so every one of the 64 bytes is compared with what the publisher wrote
for that sequence number). CPU seconds of every process (driver, publisher, recorder, joiner)
are reported for the whole run. ``--runs`` runs (default 5); figures are the median and the
spread (lowest-highest). The ratio of the catch-up rate to the batch reader's, per run, is
the figure the issue asks for (>= 0.8). ``--page DIR`` writes DIR/late_join.md and the rates
of every run, DIR/late_join.png.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import shmbus
from tools.bench import pages
from tools.bench.harness import BenchError, cpu_seconds, start_driver, stop_driver
from tools.bench.report import markdown_table, text_table

STREAM = 1001
SIZE = 64
_HEAD = struct.Struct("<QQ")
_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_CHECK = np.uint64(_GOLDEN)
#: bytes 16..63 of every message: not zeros, so that an unwritten or zeroed payload fails
PATTERN = bytes((7 * i + 3) % 251 for i in range(SIZE - _HEAD.size))
RUNS = 5


def rows(first: int, n: int) -> np.ndarray:
    """Messages ``first`` .. ``first + n - 1``: seq, seq * golden (a check word), PATTERN."""
    block = np.empty((n, SIZE), np.uint8)
    block[:, _HEAD.size:] = np.frombuffer(PATTERN, np.uint8)
    words = block.view(np.uint64)
    seqs = np.arange(first, first + n, dtype=np.uint64)
    words[:, 0] = seqs
    with np.errstate(over="ignore"):
        words[:, 1] = seqs * _CHECK
    return block


def check(message: bytes) -> int:
    """The sequence number of a message after checking all of its bytes against what the
    publisher writes for that number (its length, the check word, PATTERN); BenchError when
    any byte differs."""
    if len(message) != SIZE:
        raise BenchError(f"message of {len(message)} bytes")
    seq, word = _HEAD.unpack_from(message)
    if (seq * _GOLDEN) & _MASK != word:
        raise BenchError(f"message {int(seq)}: bad check word")
    if not message.endswith(PATTERN):
        raise BenchError(f"message {int(seq)}: payload differs from the pattern")
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


def read_by_batches(directory: Path) -> dict[str, Any]:
    """The recording from its start to where it stands, read with the late joiner's batch
    reader (RecordingReader.read_batches, payloads sliced out as bytes) and every message
    checked: messages, checked (messages whose every byte was checked), seconds, rate
    (messages/s); BenchError if a message is missing, repeated or wrong."""
    reader = shmbus.RecordingReader(directory, 0)
    end = reader.stop_position
    seqs = SeqCheck()
    add = seqs.add
    start = time.perf_counter()
    for batch in reader.read_batches(None, end):
        for payload in batch.payloads():
            add(check(payload))
    seconds = time.perf_counter() - start
    if seqs.missing or seqs.duplicated or seqs.count == 0:
        raise BenchError(f"the recording is not whole: {vars(seqs)}")
    return {"messages": seqs.count, "checked": seqs.count, "seconds": seconds,
            "rate": seqs.count / seconds}


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
    return {"replayed": replayed, "checked": seqs.count,
            "catch_up_rate": replayed / first_live_s,
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
    return {"first_live_s": first_live_s, "checked": seqs.count, "missing": seqs.missing,
            "duplicated": seqs.duplicated}


def measure(context: shmbus.Context, directory: Path, rate: float, history_s: float,
            runs: int, live: int, catch_up: float | None
            ) -> tuple[list[dict[str, Any]], dict[str, float], float]:
    """With the publisher (``rate`` messages/s, 0: full speed) and the recorder, recording
    into ``directory``, running for ``history_s`` seconds before: ``runs``
    runs of every row in turn (read_by_batches, late_join, by_hand recording first, by_hand
    live first). Returns the runs, the CPU seconds of each process over them and the wall
    seconds."""
    ctx = mp.get_context("spawn")
    stop, ready_pub, ready_rec = ctx.Event(), ctx.Event(), ctx.Event()
    driver = start_driver(context)
    processes = [ctx.Process(target=recorder, args=(context, str(directory), stop, ready_rec)),
                 ctx.Process(target=publisher, args=(context, rate, stop, ready_pub))]
    done: list[dict[str, Any]] = []
    try:
        processes[0].start()
        if not ready_rec.wait(30):
            raise BenchError("the recorder did not start")
        processes[1].start()
        if not ready_pub.wait(30):
            raise BenchError("the publisher did not start")
        pids = {"driver": driver.pid, "publisher": processes[1].pid,
                "recorder": processes[0].pid, "joiner": os.getpid()}
        cpu_before = {k: cpu_seconds(p) or 0.0 for k, p in pids.items()}
        wall_before = time.monotonic()
        time.sleep(history_s)  # the history the joiners catch up on
        with shmbus.connect(context) as bus:
            for _ in range(runs):
                done.append({"reader": read_by_batches(directory),
                             "late_join": late_join(bus, directory, live, catch_up),
                             "by_hand": by_hand(bus, directory, live, False),
                             "live_first": by_hand(bus, directory, live, True)})
        wall = time.monotonic() - wall_before
        cpu = {k: (cpu_seconds(p) or 0.0) - cpu_before[k] for k, p in pids.items()}
    finally:
        stop.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
        stop_driver(driver)
    return done, cpu, wall


def summarise(runs: list[dict[str, Any]], cpu: dict[str, float], wall: float
              ) -> dict[str, Any]:
    """The figures of the runs: spreads (pages.Spread) of the batch reader's rate, the catch-up
    rate, their ratio per run, the messages replayed, the seconds to the first live message
    and the messages replayed after the live join; the by-hand losses and duplicates per run;
    the messages checked byte for byte by every row; CPU and wall seconds."""
    def values(part: str, key: str) -> list[float]:
        return [float(r[part][key] or 0) for r in runs]

    ratios = [r["late_join"]["catch_up_rate"] / r["reader"]["rate"] for r in runs]
    return {
        "runs": runs, "cpu_s": cpu, "wall_s": wall,
        "reader_msgs_per_s": pages.spread(values("reader", "rate")),
        "catch_up_msgs_per_s": pages.spread(values("late_join", "catch_up_rate")),
        "catch_up_vs_reader": pages.spread(ratios),
        "replayed": pages.spread(values("late_join", "replayed")),
        "first_live_s": pages.spread(values("late_join", "first_live_s")),
        "replayed_after_live": pages.spread(values("late_join", "replayed_after_live")),
        "term_messages": runs[0]["late_join"]["term_messages"],
        "checked": {part: sum(r[part]["checked"] for r in runs)
                    for part in ("reader", "late_join", "by_hand", "live_first")},
        "by_hand_missing": [r["by_hand"]["missing"] for r in runs],
        "by_hand_duplicated": [r["by_hand"]["duplicated"] for r in runs],
        "live_first_missing": [r["live_first"]["missing"] for r in runs],
        "live_first_duplicated": [r["live_first"]["duplicated"] for r in runs],
    }


def _fmt(spread: pages.Spread | None, f: Callable[[float], str]) -> str:
    return pages.fmt_spread(spread, f)


def report_lines(s: dict[str, Any]) -> list[list[str]]:
    """The (measure, median (lowest-highest)) lines of a summary."""
    rate, count = (lambda v: f"{v:,.0f}"), (lambda v: f"{v:,.0f}")
    cpu = s["cpu_s"]
    return [
        ["batch reader (read_batches, payloads), msgs/s", _fmt(s["reader_msgs_per_s"], rate)],
        ["late join catch-up, msgs/s", _fmt(s["catch_up_msgs_per_s"], rate)],
        ["catch-up / batch reader (per run)",
         _fmt(s["catch_up_vs_reader"], lambda v: f"{v:.2f}")],
        ["messages replayed (late join)", _fmt(s["replayed"], count)],
        ["add_subscription -> first live message, s",
         _fmt(s["first_live_s"], lambda v: f"{v:.3f}")],
        [f"replayed after the live join (a term holds ~{s['term_messages']:,})",
         _fmt(s["replayed_after_live"], count)],
        ["late join: missing / duplicated", "0 / 0"],
        ["by hand, recording then live: missing per run", str(s["by_hand_missing"])],
        ["by hand, recording then live: duplicated per run", str(s["by_hand_duplicated"])],
        ["by hand, live first: missing per run", str(s["live_first_missing"])],
        ["by hand, live first: duplicated per run", str(s["live_first_duplicated"])],
        ["messages checked byte for byte (reader, late join, by hand, live first)",
         ", ".join(f"{n:,}" for n in s["checked"].values())],
        ["CPU s (driver, publisher, recorder, joiner)",
         ", ".join(f"{cpu[k]:.2f}" for k in ("driver", "publisher", "recorder", "joiner"))],
        ["wall s", f"{s['wall_s']:.1f}"]]


PAGE_ROWS = """\
A publisher process writes 64-byte messages at {rate} with `offer_many`, and a recorder
process records them. After {history:g} s of history, this process runs every row in turn, {runs}
times, while the publisher keeps publishing. The figures are the median of the runs, and in
brackets the lowest and highest run.

* *batch reader*: `RecordingReader.read_batches` from the start of the recording to where it
  stands, each batch's payloads sliced out as bytes. The late joiner replays with this same
  reader and the same slicing, so this row is the rate it could reach.
* *late join*: `add_subscription(..., history=shmbus.Recording(dir), from_position="start")`
  read with `messages()`, replaying the recording and then handing over to live. Its
  catch-up rate is the messages replayed over the seconds to the first live message.
* *by hand*: the recording read with `RecordingReader.messages()` and then a plain live
  subscription, or the live subscription added first. What the seam loses or repeats is
  counted from the sequence numbers.

Every row checks every byte of every message: its length, its sequence number, a check word
derived from it, and the 48-byte pattern after them. A wrong byte fails the run.
"""


def page_body(summary: dict[str, Any], rate: float, history_s: float, runs: int,
              plot: str | None) -> str:
    """The page's body: what each row does and checks, the table, and the plot's link."""
    parts = [PAGE_ROWS.format(rate=f"{rate:,.0f} messages/s" if rate else "full speed",
                              history=history_s, runs=runs), "## Figures\n",
             markdown_table(["measure", "median (lowest-highest)"], report_lines(summary),
                            [1]), ""]
    if plot:
        parts += ["## Every run\n", "The batch reader's rate and the late joiner's catch-up "
                  "rate in each run, in messages a second.", "", f"![rates]({plot})", ""]
    return "\n".join(parts)


def plot_runs(path: Path, summary: dict[str, Any]) -> Path:
    """A PNG of the batch reader's and the late join's rate in every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = summary["runs"]
    xs = np.arange(1, len(runs) + 1)
    figure, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar(xs - 0.2, [r["reader"]["rate"] for r in runs], 0.4, label="batch reader")
    ax.bar(xs + 0.2, [r["late_join"]["catch_up_rate"] for r in runs], 0.4,
           label="late join catch-up")
    ax.set_xticks(xs)
    ax.set_xlabel("run")
    ax.set_ylabel("messages/s")
    ax.set_title("Catching up on a recording, every message checked")
    ax.legend()
    return pages.save_plot(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke pass: 0.3 s of history, 2 runs, 1,000 live messages")
    parser.add_argument("--history-s", type=float, default=None,
                        help="seconds of publishing recorded before the first join (default 2)")
    parser.add_argument("--rate", type=float, default=50_000,
                        help="publisher messages/s (0: as fast as offer_many goes, faster "
                             "than any per-message reader: the joiner then never catches up "
                             "without --catch-up)")
    parser.add_argument("--runs", "--repeat", dest="runs", type=int, default=None,
                        help=f"runs of every row, interleaved (default {RUNS})")
    parser.add_argument("--live", type=int, default=None,
                        help="live messages each joiner reads after the merge (default 10,000)")
    parser.add_argument("--catch-up", type=float, default=10.0,
                        help="catch_up seconds of the late joiner (docs/guides/late-joiners.md): "
                             "on a loaded machine the replay may not outrun the publisher; then "
                             "it joins live after this and holds the publisher until it merges")
    parser.add_argument("--json", type=Path)
    pages.add_page_option(parser)
    args = parser.parse_args(argv)
    history_s = args.history_s if args.history_s is not None else (0.3 if args.quick else 2.0)
    runs = args.runs if args.runs is not None else (2 if args.quick else RUNS)
    live = args.live if args.live is not None else (1_000 if args.quick else 10_000)
    if runs < 1:
        parser.error("--runs: at least 1")
    setting = pages.started(argv)
    root = Path(tempfile.mkdtemp(prefix="late-join-bench-", dir="/dev/shm"))
    try:
        context = shmbus.Context(dir=str(root / "bus"), embedded_driver=False)
        done, cpu, wall = measure(context, root / "rec", args.rate, history_s, runs, live,
                                    args.catch_up)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarise(done, cpu, wall)
    lines = report_lines(summary)
    print(text_table(["measure", "median (lowest-highest)"], lines, right=[1],
                     groups=[0] * len(lines)))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, default=vars))
    if args.page:
        plot = plot_runs(Path(args.page) / "late_join.png", summary)
        page = pages.write_page(args.page, "late_join", "Late joiners", "tools.bench.late_join",
                                setting, page_body(summary, args.rate, history_s, runs,
                                                   plot.name))
        print(f"page: {page}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"late_join: {e}", file=sys.stderr)
        sys.exit(1)
