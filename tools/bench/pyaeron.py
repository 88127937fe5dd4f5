"""shmbus beside Aeron's own C client from Python (pyaeron), each at its defaults, in one run.

    python -m tools.bench.pyaeron [--quick] [--runs N] [--page DIR]   # from the repo root

pyaeron needs CPython >= 3.12: run this in a venv that has it (``../shared/tools/
pyaeron-venv.sh`` builds one; install shmbus into it with ``pip install -e .``). Elsewhere
pyaeron is reported n/a and shmbus alone is measured (exit status 0).

Both buses run the user's loop (tools/bench/user_loop.py) between two spawned processes
(1 writer -> 1 reader, tools/bench/harness.py), on ``aeron:ipc``, one exclusive publication,
a fresh directory per measurement: the writer sends each checked message with one call; the
reader gives every message, copied out as bytes, to the same Python ``consume``, which checks
its sequence number and length and compares every byte a round at a time.

* shmbus as the README teaches: ``shmbus.connect(dir=...)`` with default settings (the first
  client launches the embedded driver), ``pub.publish(message)``, ``for message in
  sub.messages(): consume(message)``: the members of ipc.py's "shmbus publish()/messages()"
  rows (tools/bench/ipc_members.py).
* pyaeron: Aeron's C media driver in a process of its own
  (``pyaeron.MediaDriver(dir=..., threading="dedicated")``, every other setting Aeron's
  default: 64 MiB IPC terms, back-off idle strategies), ``pyaeron.Aeron.connect(dir=...)`` in
  each member, ``offer(message)`` retried with Aeron's back-off idle strategy while refused,
  ``sub.poll(handler, 256)`` (Aeron's C fragment assembler on, its default) with the user
  loop's handler calling ``consume(bytes(buffer))``; an empty poll idles with the back-off
  strategy. The same again with ``term-length=1m`` on the channel, shmbus's default term.

Throughput at 32 B, 256 B and 4 KiB: the writer sends for --duration seconds, then a STOP
message; rate = messages / (time the reader saw STOP - time the writer started). A lost,
reordered or corrupt message fails the run. CPU per message: the CPU seconds of every process
(writer, reader and the bus's driver) from the start to the last result, over the messages
sent.

Round trip: 32 B checked ping-pong back to back (the next ping as soon as the pong is back),
p50/p99 of the round trips (first 10% dropped). shmbus: ``publish()`` and a blocking
``messages()`` on both sides (waits spin for Context.wait_spin, then sleep); pyaeron:
``offer()`` and ``poll()`` with Aeron's back-off idle strategy between empty polls (spins,
yields, then parks 1 us to 1 ms).

Each measurement runs --runs times (default 5), interleaved; tables give the median and the
spread. Output: a markdown report on stdout; with --page DIR the dated page DIR/pyaeron.md and
its plot. Exit status 1 if a measurement failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.harness import (
    BenchError,
    Measurement,
    Member,
    Outcome,
    Unavailable,
    add_runs_options,
    deadline_after,
    delivered,
    loops_ran,
    median_row,
    ping_or_pong,
    polled_recv,
    round_trip_row,
    run_interleaved,
    run_processes,
)
from tools.bench.ipc_members import (
    BLOCKING,
    SHM_PUBLISH,
    Bus,
    Scope,
    shm_reader,
    shm_rtt,
    shm_writer,
)
from tools.bench.pages import add_page_option, fmt_spread, save_plot, spread, started, write_page
from tools.bench.report import add_ratios, fmt_rate, markdown_table, size_name
from tools.bench.rounds import Rounds
from tools.bench.user_loop import Consumer, write

SIZES = (32, 256, 4096)
CHANNEL = "aeron:ipc"
POLL_LIMIT = 256  # fragments per pyaeron poll() in throughput runs
SHMBUS = "shmbus publish()/messages()"
PYAERON = "pyaeron offer()/poll()"
PYAERON_1M = "pyaeron offer()/poll(), term 1 MiB"  # shmbus's default term length
BUSES = (SHMBUS, PYAERON, PYAERON_1M)
BUS_CHANNEL = {PYAERON: CHANNEL, PYAERON_1M: f"{CHANNEL}?term-length=1m"}
DRIVER_START_S = 20.0  # for Aeron's media driver process to come up


@dataclass(frozen=True)
class Settings:
    duration_s: float  # each throughput and round-trip run
    timeout_s: float  # deadline of a run beyond its duration
    root: Path  # one fresh directory per measurement under it


def pyaeron_missing() -> str | None:
    """Why pyaeron cannot be measured here, or None if it can."""
    if sys.version_info < (3, 12):
        return f"Python {platform.python_version()} (pyaeron needs >= 3.12)"
    if importlib.util.find_spec("pyaeron") is None:
        return "pyaeron is not installed"
    return None


# ---------------------------------------------------------------------------------------------
# pyaeron members: offer() / poll(handler), Aeron's media driver in its own process
# ---------------------------------------------------------------------------------------------


def aeron_driver(aeron_dir: str, up: Any, stop: Any) -> None:
    """Aeron's C media driver (dedicated threads, Aeron's defaults otherwise) until stop."""
    import pyaeron

    with pyaeron.MediaDriver(dir=aeron_dir, threading="dedicated"):
        up.set()
        stop.wait()


@contextmanager
def aeron_driver_process(ctx: Any, aeron_dir: str, timeout_s: float) -> Iterator[int]:
    """A spawned process running aeron_driver for the measurement; yields its pid."""
    up, stop = ctx.Event(), ctx.Event()
    process = ctx.Process(target=aeron_driver, args=(aeron_dir, up, stop), daemon=True)
    process.start()
    try:
        if not up.wait(timeout_s):
            raise BenchError(f"Aeron's media driver did not start (exit code "
                             f"{process.exitcode})")
        yield process.pid
    finally:
        stop.set()
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(2)


def _aeron_offer(publication: Any, deadline_ns: int) -> Callable[[Any], None]:
    """send(message): offer(), retried with Aeron's back-off idle strategy while refused
    (back-pressured, not connected, admin action); BenchError at deadline_ns."""
    import pyaeron

    offer = publication.offer
    idle = pyaeron.IdleStrategy.backoff()

    def send(message: Any) -> None:
        if offer(message):
            return
        while not offer(message):
            idle.idle(0)
            if time.monotonic_ns() > deadline_ns:
                raise BenchError("offer not accepted before the deadline")
        idle.reset()

    return send


def _aeron_connect(aeron_dir: str, subscribe: int | None, publish: int | None,
                   timeout_s: float, channel: str = CHANNEL) -> tuple[Any, Any, Any]:
    """(client, subscription on stream ``subscribe`` once it has an image, exclusive
    publication on stream ``publish`` once connected); None where not asked."""
    import pyaeron

    client = pyaeron.Aeron.connect(dir=aeron_dir)
    subscription = None if subscribe is None else client.add_subscription(channel, subscribe)
    publication = (None if publish is None
                   else client.add_exclusive_publication(channel, publish))
    if publication is not None:
        publication.await_connected(timeout_s)
    deadline = deadline_after(timeout_s)
    while subscription is not None and not subscription.image_count:
        if time.monotonic_ns() > deadline:
            raise BenchError(f"subscription on stream {subscribe} never got an image")
        time.sleep(0.002)
    return client, subscription, publication


def aeron_writer(start: Any, aeron_dir: str, channel: str, size: int, duration_s: float,
                 timeout_s: float, done: Any) -> dict[str, Any]:
    """The user's writer loop (user_loop.write): offer() each checked message (retried while
    refused), then STOP."""
    client, _, publication = _aeron_connect(aeron_dir, None, 1, timeout_s, channel)
    with client:
        send = _aeron_offer(publication, deadline_after(duration_s + timeout_s))
        rounds = Rounds(size)
        start.ready()
        out = write(send, rounds, duration_s)
        done.wait(timeout_s)
    return out


def aeron_reader(start: Any, aeron_dir: str, channel: str, size: int, timeout_s: float,
                 done: Any) -> dict[str, Any]:
    """poll(handler) until STOP, the handler copying each message as bytes into the user's
    ``consume`` (user_loop.Consumer.handler); Aeron's back-off idle strategy after an empty
    poll."""
    import pyaeron

    consumer = Consumer(Rounds(size))
    tally, handler = consumer.tally, consumer.handler()
    client, subscription, _ = _aeron_connect(aeron_dir, 1, None, timeout_s, channel)
    with client:
        poll = subscription.poll
        idle = pyaeron.IdleStrategy.backoff()
        start.ready()
        deadline = deadline_after(timeout_s)
        while not tally.stopped:
            if poll(handler, POLL_LIMIT):
                idle.reset()
            else:
                idle.idle(0)
                if time.monotonic_ns() > deadline:
                    raise BenchError(f"reader timed out after {tally.expected} messages")
        t1 = time.monotonic_ns()
        done.set()
    return consumer.result(t1)


def aeron_rtt(start: Any, aeron_dir: str, channel: str, pinger: bool, duration_s: float,
              timeout_s: float, done: Any) -> dict[str, Any]:
    """A pinger (offers on stream 1, polls stream 2) or a ponger: offer() retried while
    refused, poll() with Aeron's back-off idle strategy between empty polls."""
    import pyaeron

    tx, rx = (1, 2) if pinger else (2, 1)
    client, subscription, publication = _aeron_connect(aeron_dir, rx, tx, timeout_s, channel)
    with client:
        deadline = deadline_after(duration_s + timeout_s)
        send = _aeron_offer(publication, deadline)
        recv = polled_recv(subscription.poll, pyaeron.IdleStrategy.backoff(), deadline)
        start.ready()
        return ping_or_pong(pinger, send, recv, duration_s, None, done, timeout_s)


# ---------------------------------------------------------------------------------------------
# The parent: one measurement each
# ---------------------------------------------------------------------------------------------


def run_bus(ctx: Any, bus: str, members: Callable[[str], list[Member]], timeout_s: float,
            s: Settings) -> Outcome:
    """Run the members of one measurement on a fresh directory of ``bus`` (an ipc_members.Scope: the
    shmbus drivers that served it stopped, the directory removed at its end); pyaeron's with
    Aeron's media driver in a process of its own, accounted as "driver"."""
    with Scope(s.root) as scope:
        bus_dir = str(scope.dir)
        if bus == SHMBUS:
            return scope.run(ctx, members(bus_dir), timeout_s)
        missing = pyaeron_missing()
        if missing:
            raise Unavailable(missing)
        with aeron_driver_process(ctx, bus_dir, DRIVER_START_S) as pid:
            return run_processes(ctx, members(bus_dir), timeout_s,
                                 watch=lambda: {"driver": [pid]})


def throughput(ctx: Any, bus: str, size: int, s: Settings) -> dict[str, Any]:
    """One throughput run: msg/s, GB/s, CPU us per message; BenchError if a message was lost,
    reordered or corrupted."""
    done = ctx.Event()

    def members(bus_dir: str) -> list[Member]:
        if bus == SHMBUS:  # ipc_members: publish() and messages() on stream 1
            spec = Bus(bus_dir)
            return [Member("reader", shm_reader, (spec, 1, size, SHM_PUBLISH, s.timeout_s, done)),
                    Member("writer", shm_writer, (spec, 1, size, SHM_PUBLISH, s.duration_s,
                                                  s.timeout_s, done))]
        channel = BUS_CHANNEL[bus]
        return [Member("reader", aeron_reader, (bus_dir, channel, size, s.timeout_s, done)),
                Member("writer", aeron_writer, (bus_dir, channel, size, s.duration_s,
                                                s.timeout_s, done))]

    out = run_bus(ctx, bus, members, s.duration_s + s.timeout_s, s)
    sent, seconds = delivered(out)
    return {"msgs_per_s": sent / seconds, "gb_per_s": sent * size / seconds / 1e9,
            "messages": sent, "errors": 0, "cores": out.cores,
            "cpu_us_per_msg": _cpu_us(out, sent), "loops": loops_ran(out)}


def round_trip(ctx: Any, bus: str, s: Settings) -> dict[str, Any]:
    """One back-to-back ping-pong run: round-trip percentiles, cores by process."""
    done = ctx.Event()

    def members(bus_dir: str) -> list[Member]:
        if bus == SHMBUS:  # ipc_members: publish() and a blocking messages(), back to back
            return [Member(role, shm_rtt, (Bus(bus_dir), role == "pinger", BLOCKING, None,
                                           s.duration_s, s.timeout_s, done))
                    for role in ("ponger", "pinger")]
        return [Member(role, aeron_rtt, (bus_dir, BUS_CHANNEL[bus], role == "pinger",
                                         s.duration_s, s.timeout_s, done))
                for role in ("ponger", "pinger")]

    return round_trip_row(run_bus(ctx, bus, members, s.duration_s + s.timeout_s, s))


def _cpu_us(out: Outcome, messages: int) -> float | None:
    """Microseconds of CPU of every process of the run per message (None if one was not
    read)."""
    if any(c is None for c in out.cores.values()):
        return None
    return sum(c for c in out.cores.values() if c is not None) * out.wall_s / messages * 1e6


def plan(ctx: Any, sizes: tuple[int, ...], s: Settings) -> list[Measurement]:
    """Every measurement as (its key fields, a thunk that runs it once)."""
    out: list[Measurement] = []
    for size in sizes:
        for bus in BUSES:
            out.append(({"test": "throughput", "bus": bus, "size": size},
                        lambda bus=bus, size=size: throughput(ctx, bus, size, s)))
    for bus in BUSES:
        out.append(({"test": "rtt", "bus": bus}, lambda bus=bus: round_trip(ctx, bus, s)))
    return out


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _status(row: dict[str, Any]) -> str | None:
    """"n/a" (the report's head says why) / "FAILED: reason" for a row that did not measure,
    else None."""
    if row["status"] == "ok":
        return None
    return "n/a" if row["status"] == "n/a" else f"FAILED: {_reason(row)}"


def _reason(row: dict[str, Any]) -> str:
    return str(row["error"]).strip().splitlines()[0]


RATIOS = {"x_msgs": "msgs_per_s", "x_cpu": "cpu_us_per_msg", "x_p50": "p50_us",
          "x_p99": "p99_us"}


def add_pyaeron_ratios(rows: list[dict[str, Any]]) -> None:
    """On each shmbus row, shmbus over pyaeron of msg/s (x_msgs), CPU per message (x_cpu)
    and round-trip p50 (x_p50), where both measured."""
    for ratio, figure in RATIOS.items():
        add_ratios([r for r in rows if r.get(figure) is not None], ratio,
                   lambda r: r["bus"] != SHMBUS, lambda r: (r["test"], r.get("size")),
                   lambda r, base, figure=figure: r[figure] / base[figure])


def summary_table(rows: list[dict[str, Any]], sizes: tuple[int, ...]) -> str:
    """One line per figure, one column per bus and the ratio of shmbus to the faster pyaeron
    row of the figure."""
    by_key = {(r["test"], r["bus"], r.get("size")): r for r in rows}
    headers = ["figure", *BUSES, "shmbus / faster pyaeron"]
    lines = []

    def line(name: str, test: str, size: int | None,
             cell: Callable[[dict[str, Any]], str], ratio: str) -> None:
        cells = []
        for bus in BUSES:
            r = by_key[(test, bus, size)]
            cells.append(_status(r) or cell(r))
        value = by_key[(test, SHMBUS, size)].get(ratio)
        lines.append([name, *cells, "-" if value is None else f"{value:.2f}"])

    for z in sizes:
        line(f"{size_name(z)} msg/s (lowest-highest)", "throughput", z,
             lambda r: fmt_spread(spread(r["samples"]["msgs_per_s"]), fmt_rate), "x_msgs")
    for z in sizes:
        line(f"{size_name(z)} CPU us per message, all processes", "throughput", z,
             lambda r: "-" if r["cpu_us_per_msg"] is None else f"{r['cpu_us_per_msg']:.2f}",
             "x_cpu")
    line("RTT p50 us (lowest-highest), 32 B, back to back", "rtt", None,
         lambda r: fmt_spread(spread(r["samples"]["p50_us"]), lambda v: f"{v:.1f}"), "x_p50")
    line("RTT p99 us, 32 B, back to back", "rtt", None, lambda r: f"{r['p99_us']:.1f}",
         "x_p99")
    return markdown_table(headers, lines, range(1, len(headers)))


def cores_table(rows: list[dict[str, Any]]) -> str:
    """Cores of each process in each measurement."""
    headers = ["measurement", "bus", "cores: writer or pinger / reader or ponger / driver"]
    lines = []
    for r in rows:
        cores = r.get("cores") or {}
        roles = ("writer", "reader") if r["test"] == "throughput" else ("pinger", "ponger")
        cell = _status(r) or " / ".join("-" if cores.get(k) is None else f"{cores[k]:.2f}"
                                        for k in (*roles, "driver"))
        what = size_name(r["size"]) if r["test"] == "throughput" else "RTT 32 B"
        lines.append([what, r["bus"], cell])
    return markdown_table(headers, lines)


NOTES = f"""\
* Both buses on `{CHANNEL}`, one exclusive publication, a writer and a reader in two spawned
  processes, a fresh directory per measurement.
* Both run the user's loop of tools/bench/user_loop.py: the writer sends each message with one
  call (shmbus `publish()`; pyaeron `offer()`, retried with `IdleStrategy.backoff()` while
  refused); the reader gives every message, copied out as bytes, to the same Python
  `consume`, which reads and checks its sequence number and length and compares every byte a
  round at a time. shmbus reads `for m in sub.messages(): consume(m)`; pyaeron, which has no
  iterator, calls `consume(bytes(buffer))` from its `poll(handler, {POLL_LIMIT})` handler (Aeron's
  C fragment assembler on), with the back-off idle strategy after an empty poll.
* shmbus: `shmbus.connect(dir=)` (embedded driver, term 1 MiB, mtu 1408). pyaeron: Aeron's C
  media driver in its own process (`MediaDriver(threading="dedicated")`, Aeron's defaults:
  IPC term 64 MiB, mtu 1408, back-off idle strategies); and the same with the term at 1 MiB
  (`term-length=1m` on the channel), shmbus's default.
* CPU per message: CPU seconds of writer, reader and driver over the messages sent.
* Round trips: checked pings (sequence number and CRC-32 of every byte); shmbus `publish()`
  and a blocking `messages()` on both sides (waits spin up to 20 us, then sleep); pyaeron
  `offer()` and `poll()` with the back-off idle strategy (it spins and yields before it
  parks); first 10% of round trips dropped.
* Ratio: shmbus over the faster pyaeron row (msg/s: > 1 is shmbus faster; CPU and RTT: < 1 is
  shmbus cheaper or quicker)."""


def report_markdown(rows: list[dict[str, Any]], sizes: tuple[int, ...], runs: int,
                    s: Settings) -> str:
    """The report's body: the settings, the tables, what each row does."""
    parts = [f"Median and spread (lowest-highest) of {runs} runs, interleaved; {s.duration_s} s "
             f"per run."]
    for bus in BUSES:
        reasons = sorted({_reason(r) for r in rows if r["bus"] == bus and r["status"] == "n/a"})
        if reasons:
            parts += ["", f"{bus}: n/a ({'; '.join(reasons)})"]
    return "\n".join([*parts, "", summary_table(rows, sizes), "", "## Cores", "",
                      cores_table(rows), "", "## What each row does", "", NOTES])


def draw_chart(rows: list[dict[str, Any]], sizes: tuple[int, ...], path: Path) -> None:
    """msg/s by size and bus (median, whiskers lowest-highest), and round-trip percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / len(BUSES)
    for i, bus in enumerate(BUSES):
        spreads = [spread(r["samples"]["msgs_per_s"]) if (r := _row(rows, "throughput", bus, z))
                   else None for z in sizes]
        medians = [sp.median if sp else 0 for sp in spreads]
        errors = [[sp.median - sp.low if sp else 0 for sp in spreads],
                  [sp.high - sp.median if sp else 0 for sp in spreads]]
        left.bar([x + i * width for x in range(len(sizes))], medians, width, yerr=errors,
                 capsize=2, label=bus)
    left.set_xticks([x + width * (len(BUSES) - 1) / 2 for x in range(len(sizes))],
                    [size_name(z) for z in sizes])
    left.set_ylabel("messages / s")
    left.set_title("The user's loop, 1 writer -> 1 reader")
    left.legend(fontsize=7)
    levels = (50, 90, 99)
    for bus in BUSES:
        if r := _row(rows, "rtt", bus, None):
            right.plot(levels, [r[f"p{q}_us"] for q in levels], marker="o", label=bus)
    right.set_xticks(levels, [f"p{q}" for q in levels])
    right.set_yscale("log")
    right.set_ylabel("round trip, microseconds (log)")
    right.set_title("Round trip, 32 B, back to back")
    right.legend(fontsize=7)
    save_plot(fig, path)


def _row(rows: list[dict[str, Any]], test: str, bus: str, size: int | None
         ) -> dict[str, Any] | None:
    return next((r for r in rows if r["test"] == test and r["bus"] == bus
                 and r.get("size") == size and r["status"] == "ok"), None)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_runs_options(parser, "0.2 s per run, 1 run", "throughput and round-trip run")
    add_page_option(parser)
    args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = 1 if args.quick else args.runs
    setting = started(argv)
    root = Path(tempfile.mkdtemp(prefix="shmbus-bench-pyaeron-",
                                 dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    s = Settings(duration_s=0.2 if args.quick else args.duration, timeout_s=args.timeout,
                 root=root)
    measurements = plan(mp.get_context("spawn"), SIZES, s)
    print(f"shmbus vs pyaeron: {len(measurements)} measurements x {runs} runs; progress on "
          f"stderr", file=sys.stderr, flush=True)
    try:
        results = run_interleaved(measurements, runs, _progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [median_row(r) for r in results]
    add_pyaeron_ratios(rows)
    markdown = report_markdown(rows, SIZES, runs, s)
    print(markdown)
    if args.page:
        write_page(args.page, "pyaeron", "Beside Aeron's C client: tools/bench/pyaeron.py",
                   "tools.bench.pyaeron", setting,
                   "![msg/s by size, round-trip percentiles](pyaeron.png)\n\n" + markdown)
        draw_chart(rows, SIZES, Path(args.page) / "pyaeron.png")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def _progress(row: dict[str, Any]) -> None:
    print(f"  {row['test']} {row['bus']} {row.get('size', '')}: "
          f"{'ok' if row['status'] == 'ok' else _reason(row)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
