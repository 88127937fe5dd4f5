"""IPC benchmark: the bus users run, beside the IPC a Python user would pick instead.

    python -m tools.bench.ipc [--quick] [--runs N] [--only NAMES] [--json] [--page DIR]

shmbus runs as a user runs it: ``shmbus.connect()`` with the embedded driver and default
settings (a fresh bus directory per measurement; the first client launches the driver), an
exclusive publication (``aeron:ipc``) in one spawned process and a subscription in another.
Beside it, in the same run and the same loops: multiprocessing Queue and Pipe, posix_ipc
MessageQueue, pyzmq PAIR over ipc://, iceoryx2 (publish-subscribe over shared memory) and
zenoh.

Every measurement runs in fresh spawned processes (tools/bench/harness.py): they set up and
connect, then start together; the CPU time of every process involved (writer, reader, the bus's
driver) is taken from the start to the last result, as cores (CPU s / wall s). Each measurement
runs --runs times (default 5), interleaved with the others, so a burst of load on the machine
hits every transport alike; tables give the median and the spread (lowest-highest) of the runs.

Throughput (1 writer -> 1 reader, 32 B, 256 B, 4 KiB): the writer sends for --duration seconds,
then a STOP message; rate = messages / (time the reader saw STOP - time the writer started),
both CLOCK_MONOTONIC. A message is a fixed body, its sequence number (int64) and a CRC-32 of
both (uint32, little-endian).

* The user's loop (tools/bench/user_loop.py), the same functions for every transport: the
  writer calls the transport's send once per message (``pub.publish``, ``sock.send``,
  ``queue.put``, ...); the reader is ``for message in source: consume(message)``, ``source``
  the transport's iterator (``sub.messages()``; ``iter(recv, None)`` for a peer), ``consume``
  a Python function that reads the sequence number and length, checks them and keeps the
  message, comparing every byte a round at a time. ``shmbus offer()/poll(handler)`` calls the
  same ``consume`` from its poll handler (``bytes(buffer)``).
* Lower-level rows, labelled so: ``messages() drained`` (no Python step per message: the
  iterator is emptied a round at a time with islice, every byte compared), ``no-copy`` (the
  handler reads the sequence number in place; nothing else checked) and ``batch``
  (``offer_many`` of a (1024, size) uint8 array, ``poll_batch``; the sequence number at the
  head and the tail of every message checked with numpy, no CRC).

Messages over the mtu less the 32-byte frame header (4 KiB at the default mtu 1408) arrive in
fragments; ``messages()`` reassembles them itself, the handler readers with FragmentAssembler.
Nobody spins in throughput runs: a back-pressured shmbus writer sleeps in ``publish()`` until
the reader moves, an empty reader in ``messages()`` or ``poll(..., timeout=)`` until the writer
writes; peers block in their calls, iceoryx2 polls.

Round trip (32 B ping-pong; p50/p90/p99 of the round trips, the first 10% dropped; every ping
and pong is a checked message, sequence number and CRC-32 of every byte):

* back-to-back, blocking against blocking: shmbus ``publish()`` and a blocking ``messages()``
  with ``Context.wait_spin = 0`` (every wait sleeps on the futex at once, as the peers' blocking
  calls do), beside the peers' blocking calls; and shmbus at its default wait (spins up to
  ``wait_spin``, 20 us, then sleeps), labelled so.
* back-to-back, spinning against spinning: shmbus ``offer()``/``poll()`` with
  BusySpinIdleStrategy beside iceoryx2, which polls.
* 1,000 msg/s: one ping per millisecond, the ponger waiting as named (blocking, asyncio, the
  default back-off); the ponger's CPU in % of a core beside its p50.

Idle: a connected publication and subscription doing nothing for --idle seconds (the publisher
sleeps, the subscriber polls with the default back-off, blocks in ``poll(timeout=...)`` or
awaits): the CPU of the publisher, the subscriber and the driver.

Output: a markdown report on stdout (or JSON with --json), bench.md, bench.json and bench.png in
--out (default tools/results/); with --page DIR the dated page DIR/ipc.md and its plot
DIR/ipc.png (tools/bench/pages.py). Exit status 1 if a measurement failed (crashed, timed out,
or got wrong messages); one that cannot run here (missing package or API) reads "n/a: <reason>".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.harness import (
    RTT_SIZE,
    Measurement,
    Member,
    add_runs_options,
    delivered,
    loops_ran,
    median_row,
    round_trip_row,
    run_interleaved,
)
from tools.bench.ipc_members import (
    ASYNCIO,
    BACKOFF,
    BLOCKING,
    CHANNEL,
    SHM,
    SHM_BATCH,
    SHM_DRAIN,
    SHM_HANDLER,
    SHM_NOCOPY,
    SHM_PUBLISH,
    SLEEPING,
    SPIN,
    Bus,
    Scope,
    shm_batch_reader,
    shm_idle,
    shm_reader,
    shm_rtt,
    shm_writer,
)
from tools.bench.pages import (
    Spread,
    add_page_option,
    fmt_spread,
    save_plot,
    spread,
    started,
    write_page,
)
from tools.bench.peers import (
    ICEORYX,
    PIPE,
    POSIX,
    QUEUE,
    QUEUE_DEPTH,
    ZENOH,
    ZMQ,
    make_peer_link,
    peer_reader,
    peer_rtt,
    peer_writer,
    zmq_async_rtt,
)
from tools.bench.report import add_ratios, fmt, fmt_rate, machine, markdown_table, size_name

SIZES = (32, 256, 4096)
RTT_RATE = 1000  # pings per second of the paced round-trip mode
RESULTS = Path(__file__).resolve().parents[1] / "results"  # tools/results/, not in git

PEERS = (QUEUE, PIPE, POSIX, ZMQ, ICEORYX, ZENOH)
USER_LOOP = (SHM_PUBLISH, *PEERS, SHM_HANDLER)  # rows run by tools/bench/user_loop.py
LOWER_LEVEL = (SHM_DRAIN, SHM_NOCOPY, SHM_BATCH)
THROUGHPUT = (*USER_LOOP, *LOWER_LEVEL)

BACK_TO_BACK = "back-to-back"
PACED = f"{RTT_RATE:,} msg/s"
PEER_WAIT = {QUEUE: "blocking", PIPE: "blocking", POSIX: "blocking", ZMQ: "blocking",
             ICEORYX: "busy-poll", ZENOH: "blocking"}
#: how a shmbus round-trip row waits, beside the peers that wait the same way (None: no peer
#: spins, then sleeps)
SHM_WAITS = {SLEEPING: "blocking", BLOCKING: None, SPIN: "busy-poll"}


# ---------------------------------------------------------------------------------------------
# The parent: one measurement each
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    duration_s: float  # throughput and back-to-back round trips
    paced_s: float  # 1,000 msg/s round trips
    idle_s: float
    timeout_s: float
    root: Path


def throughput(ctx: Any, transport: str, size: int, s: Settings) -> dict[str, Any]:
    """One throughput run: msg/s, MB/s, cores by process; BenchError if a message was lost,
    reordered or corrupted."""
    done = ctx.Event()
    with Scope(s.root) as scope:
        if transport in PEERS:
            a, b, cleanup = make_peer_link(ctx, transport, s.root, scope.name, False)
            scope.cleanups.append(cleanup)
            writer = Member("writer", peer_writer, (a, size, s.duration_s, s.timeout_s, done))
            reader = Member("reader", peer_reader, (b, size, s.timeout_s, done))
        else:
            bus = scope.bus()
            writer = Member("writer", shm_writer, (bus, 1, size, transport, s.duration_s,
                                                   s.timeout_s, done))
            reader = (Member("reader", shm_batch_reader, (bus, 1, size, s.timeout_s, done))
                      if transport == SHM_BATCH else
                      Member("reader", shm_reader, (bus, 1, size, transport, s.timeout_s,
                                                    done)))
        out = scope.run(ctx, [reader, writer], s.duration_s + s.timeout_s)
    sent, seconds = delivered(out)
    return {"msgs_per_s": sent / seconds, "mb_per_s": sent * size / seconds / 1e6,
            "messages": sent, "errors": 0, "cores": out.cores, "loops": loops_ran(out)}


def round_trip(ctx: Any, transport: str, wait: str, rate: int | None,
               s: Settings) -> dict[str, Any]:
    """One ping-pong run (rate: pings per second, None: back-to-back): round-trip
    percentiles and cores by process; BenchError if an echo was wrong."""
    done = ctx.Event()
    duration = s.duration_s if rate is None else s.paced_s
    with Scope(s.root) as scope:
        if transport in PEERS:
            a, b, cleanup = make_peer_link(ctx, transport, s.root, scope.name, True)
            scope.cleanups.append(cleanup)
            run = zmq_async_rtt if wait == ASYNCIO else peer_rtt
            pinger = Member("pinger", run, (a, True, rate, duration, s.timeout_s, done))
            ponger = Member("ponger", run, (b, False, rate, duration, s.timeout_s, done))
        else:
            bus = Bus(str(scope.dir), 0.0) if wait == SLEEPING else scope.bus()
            pinger = Member("pinger", shm_rtt, (bus, True, wait, rate, duration, s.timeout_s,
                                                done))
            ponger = Member("ponger", shm_rtt, (bus, False, wait, rate, duration, s.timeout_s,
                                                done))
        return round_trip_row(scope.run(ctx, [ponger, pinger], duration + s.timeout_s))


def idle(ctx: Any, wait: str, s: Settings) -> dict[str, Any]:
    """A publisher and a subscriber connected and idle for s.idle_s: cores by process."""
    with Scope(s.root) as scope:
        bus = scope.bus()
        members = [Member(role, shm_idle, (bus, role == "publisher", wait, s.idle_s, s.timeout_s))
                   for role in ("subscriber", "publisher")]
        out = scope.run(ctx, members, s.idle_s + s.timeout_s)
    return {"errors": 0, "cores": out.cores}


# ---------------------------------------------------------------------------------------------
# The plan, the report
# ---------------------------------------------------------------------------------------------


def plan(ctx: Any, sizes: tuple[int, ...], wanted: Callable[[str], bool], s: Settings
         ) -> list[Measurement]:
    """Every measurement as (its key fields, a thunk that runs it once)."""
    out: list[Measurement] = []
    for size in sizes:
        for t in THROUGHPUT:
            if wanted(t):
                out.append(({"test": "throughput", "transport": t, "size": size},
                            lambda t=t, size=size: throughput(ctx, t, size, s)))
    rtt = [(SHM_PUBLISH, SLEEPING, None), (SHM_PUBLISH, BLOCKING, None), (SHM, SPIN, None),
           (SHM_PUBLISH, SLEEPING, RTT_RATE), (SHM_PUBLISH, BLOCKING, RTT_RATE),
           (SHM, ASYNCIO, RTT_RATE), (SHM, BACKOFF, RTT_RATE), (ZMQ, ASYNCIO, RTT_RATE),
           *((p, PEER_WAIT[p], rate) for rate in (None, RTT_RATE) for p in PEERS)]
    for t, wait, rate in rtt:
        if wanted(t):
            out.append(({"test": "rtt", "transport": t, "size": RTT_SIZE, "wait": wait,
                         "rate": BACK_TO_BACK if rate is None else PACED},
                        lambda t=t, wait=wait, rate=rate: round_trip(ctx, t, wait, rate, s)))
    if wanted(SHM):
        for wait in (BACKOFF, BLOCKING, ASYNCIO):
            out.append(({"test": "idle", "transport": SHM, "wait": wait},
                        lambda wait=wait: idle(ctx, wait, s)))
    return out


def cell_status(row: dict[str, Any]) -> str | None:
    """"n/a: reason" / "FAILED: reason" for a row that did not measure, else None."""
    if row["status"] == "ok":
        return None
    reason = row["error"].strip().splitlines()[0]
    return f"{'n/a' if row['status'] == 'n/a' else 'FAILED'}: {reason}"


def cores_cell(row: dict[str, Any], labels: tuple[str, ...]) -> str:
    cores = row.get("cores") or {}
    return " / ".join("-" if cores.get(label) is None else f"{cores[label]:.2f}"
                      for label in labels)


def _spread(row: dict[str, Any], key: str) -> Spread | None:
    """The spread of ``key`` over the row's runs (harness.median_row's samples)."""
    return spread(row.get("samples", {}).get(key, [row.get(key)]))


def _rate_cell(row: dict[str, Any]) -> str:
    return cell_status(row) or fmt_spread(_spread(row, "msgs_per_s"), fmt_rate)


def _us_cell(row: dict[str, Any], key: str) -> str:
    return cell_status(row) or fmt_spread(_spread(row, key), lambda v: f"{v:.1f}")


def _find(rows: list[dict[str, Any]], **fields: Any) -> dict[str, Any] | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in fields.items())), None)


def summary_table(rows: list[dict[str, Any]], sizes: tuple[int, ...]) -> str:
    """The user's loop, one line per transport: msg/s by size (median and spread), and the
    ratio of shmbus publish()/messages() to zmq PAIR and to the best peer at each size."""
    headers = ["the user's loop, 1 writer -> 1 reader",
               *(f"{size_name(z)} msg/s" for z in sizes)]
    lines = []
    for t in USER_LOOP:
        cells = [(_rate_cell(r) if (r := _find(rows, test="throughput", transport=t, size=z))
                  else "-") for z in sizes]
        if any(c != "-" for c in cells):
            lines.append([_label(t), *cells])
    for name, field in (("shmbus publish()/messages() / zmq PAIR", "x_zmq"),
                        ("shmbus publish()/messages() / best peer", "x_best_peer")):
        cells = []
        for z in sizes:
            r = _find(rows, test="throughput", transport=SHM_PUBLISH, size=z)
            cells.append("-" if r is None or r.get(field) is None else f"{r[field]:.2f}x")
        lines.append([name, *cells])
    return markdown_table(headers, lines, range(1, len(headers)))


def rtt_summary(rows: list[dict[str, Any]]) -> str:
    """Back-to-back round trips, each shmbus wait beside the peers that wait the same way."""
    headers = ["back-to-back, 32 B", "waits", "p50 us", "p99 us", "p50 / best peer's"]
    lines = []
    for wait, kind in SHM_WAITS.items():
        transport = SHM if wait == SPIN else SHM_PUBLISH
        r = _find(rows, test="rtt", transport=transport, wait=wait, rate=BACK_TO_BACK)
        peers = [p for p in PEERS if PEER_WAIT[p] == kind]
        best = min((p for p in (_find(rows, test="rtt", transport=t, rate=BACK_TO_BACK)
                                for t in peers) if p and p["status"] == "ok"),
                   key=lambda p: p["p50_us"], default=None)
        if r is None:
            continue
        ratio = (f"{r['p50_us'] / best['p50_us']:.2f} ({best['transport']})"
                 if best and r["status"] == "ok" else
                 "no peer waits this way" if kind is None else "-")
        lines.append([_label(transport), wait, _us_cell(r, "p50_us"), _us_cell(r, "p99_us"),
                      ratio])
    return markdown_table(headers, lines, (2, 3, 4))


def _percent_of_core(row: dict[str, Any], label: str) -> str:
    cores = (row.get("cores") or {}).get(label)
    return "-" if cores is None else f"{cores:.1%}"


def _label(transport: str) -> str:
    return {SHM_PUBLISH: "shmbus publish()/messages()",
            SHM_HANDLER: "shmbus offer()/poll(handler) (lower-level API)",
            SHM_DRAIN: "lower-level: shmbus messages() drained, no Python step per message",
            SHM_NOCOPY: "lower-level: shmbus poll, sequence number read in place, no copy",
            SHM_BATCH: "lower-level: shmbus offer_many/poll_batch (numpy), head and tail "
                       "sequence checked",
            ICEORYX: "iceoryx2 (busy-poll)"}.get(transport, transport)


def _test_table(rows: list[dict[str, Any]], test: str, headers: list[str],
                names: Callable[[dict[str, Any]], list[str]],
                figures: Callable[[dict[str, Any]], list[str]], right: tuple[int, ...]) -> str:
    """A markdown table of the rows of ``test``, a line each: its names(row) cells, then its
    figures(row) cells, or for a row that did not measure its cell_status in place of the
    first figure and the others blank; ``right``: the right-aligned columns."""
    lines = []
    for r in rows:
        if r["test"] == test:
            named, status = names(r), cell_status(r)
            blank = [""] * (len(headers) - len(named) - 1)
            lines.append([*named, *(figures(r) if status is None else [status, *blank])])
    return markdown_table(headers, lines, right)


def throughput_table(rows: list[dict[str, Any]]) -> str:
    """Every throughput row: msg/s (median and spread), MB/s, over the best peer's msg/s,
    cores, errors."""

    def figures(r: dict[str, Any]) -> list[str]:
        best = r.get("x_best_peer")
        return [_rate_cell(r), fmt(r["mb_per_s"], 1), "" if best is None else f"{best:.2f}",
                cores_cell(r, ("writer", "reader", "driver")), str(r["errors"])]

    return _test_table(rows, "throughput",
                       ["transport", "size", "msg/s (lowest-highest)", "MB/s", "x best peer",
                        "cores: writer / reader / driver", "errors"],
                       lambda r: [_label(r["transport"]), size_name(r["size"])], figures,
                       (2, 3, 4, 6))


def rtt_table(rows: list[dict[str, Any]]) -> str:
    """Every round-trip row: percentiles (p50 with its spread), cores, errors."""

    def figures(r: dict[str, Any]) -> list[str]:
        return [_us_cell(r, "p50_us"), fmt(r["p90_us"], 1), fmt(r["p99_us"], 1),
                fmt(r["max_us"], 1), cores_cell(r, ("pinger", "ponger", "driver")),
                _percent_of_core(r, "ponger"), str(r["errors"])]

    return _test_table(rows, "rtt",
                       ["transport", "pace", "waiting", "p50 us (lowest-highest)", "p90 us",
                        "p99 us", "max us", "cores: pinger / ponger / driver", "ponger CPU",
                        "errors"],
                       lambda r: [r["transport"], r["rate"], r["wait"]], figures,
                       (3, 4, 5, 6, 8, 9))


def idle_table(rows: list[dict[str, Any]]) -> str:
    headers = ["bus doing nothing", "subscriber waits", "cores: publisher / subscriber / driver"]
    lines = [[r["transport"], r["wait"],
              cell_status(r) or cores_cell(r, ("publisher", "subscriber", "driver"))]
             for r in rows if r["test"] == "idle"]
    return markdown_table(headers, lines)


def report_markdown(report: dict[str, Any]) -> str:
    """The report's body: settings, the summaries, every row, and what each row does."""
    rows, settings = report["rows"], report["settings"]
    head = (f"Median and spread (lowest-highest) of {settings['runs']} runs, interleaved; "
            f"{settings['duration_s']} s per throughput and back-to-back run, "
            f"{settings['paced_s']} s per paced run, {settings['idle_s']} s idle.")
    parts = [head, "", "## The user's loop", "", summary_table(rows, tuple(settings["sizes"]))]
    if any(r["test"] == "rtt" for r in rows):
        parts += ["", "## Round trips, like against like", "", rtt_summary(rows)]
    if any(r["test"] == "throughput" for r in rows):
        parts += ["", "## Every throughput row", "", throughput_table(rows)]
    if any(r["test"] == "rtt" for r in rows):
        parts += ["", f"## Every round trip, {RTT_SIZE} B ping-pong", "", rtt_table(rows)]
    if any(r["test"] == "idle" for r in rows):
        parts += ["", "## Idle", "", idle_table(rows)]
    parts += ["", "## What each row does", "", NOTES]
    return "\n".join(parts)


NOTES = f"""\
* shmbus: `shmbus.connect()` (embedded driver, default settings: term 1 MiB, mtu 1408,
  `{CHANNEL}`), an exclusive publication and a subscription in two spawned processes.
* The user's loop (tools/bench/user_loop.py), the same functions for every transport: the
  writer calls the transport's send once per message; the reader runs `for message in source:
  consume(message)`, `consume` reading the sequence number and length of each message,
  checking them and keeping the message, then comparing every byte of a round (the sequence
  number and a CRC-32 included) with the round it computes. shmbus reads `sub.messages()`; a
  peer `iter(recv, None)`; `offer()/poll(handler)` calls the same `consume` from its handler.
* Lower-level rows say so in their name and what they check.
* Peers: mp.Queue(maxsize={QUEUE_DEPTH}) put/get, mp.Pipe send_bytes/recv_bytes, posix_ipc
  (default depth) send/receive, zmq PAIR send/recv, iceoryx2 Slice[uint8] loan/send and
  receive (subscriber buffer {QUEUE_DEPTH}, the publisher retries when it is full), eclipse-zenoh
  put and a FifoChannel({QUEUE_DEPTH}) subscriber between two sessions over tcp loopback
  (reliable, congestion control BLOCK).
* cores: CPU seconds over wall seconds of each process from the start of the measurement to
  its last result (1.00 = one core). MB = 10^6 payload bytes. x best peer: msg/s over the
  fastest peer's at that size, both in the user's loop.
* Round trips: microseconds, the first 10% dropped, every ping and pong checked (sequence
  number and CRC-32). Every row pays for the check, about 0.4 us a round trip here: it
  matters only beside shmbus's 1 to 2 us round trips. "blocking wait, no spin":
  `Context.wait_spin = 0`, every wait sleeps at once, like the peers' blocking calls.
  "blocking wait": the default, which spins up to `wait_spin` (20 us) before it sleeps; no
  peer waits this way. "busy-spin": `offer()`/`poll()` with BusySpinIdleStrategy, beside
  iceoryx2, which polls. At {PACED}: one ping a millisecond;
  "ponger CPU" is the waiting side's CPU in % of a core.
* Idle: publisher sleeping, subscriber waiting as named."""


def draw_chart(rows: list[dict[str, Any]], sizes: tuple[int, ...], path: Path) -> None:
    """The user's loop: msg/s by size (bars at the median, whiskers lowest-highest, log
    scale); and round trips back to back as percentile curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    transports = [t for t in USER_LOOP if _find(rows, test="throughput", transport=t,
                                                 status="ok")]
    width = 0.8 / max(1, len(transports))
    for i, t in enumerate(transports):
        medians, low, high = [], [], []
        for z in sizes:
            r = _find(rows, test="throughput", transport=t, size=z, status="ok")
            sp = _spread(r, "msgs_per_s") if r else None
            medians.append(sp.median if sp else 0)
            low.append(sp.median - sp.low if sp else 0)
            high.append(sp.high - sp.median if sp else 0)
        left.bar([x + i * width for x in range(len(sizes))], medians, width,
                 yerr=[low, high], capsize=2, label=_label(t))
    left.set_xticks([x + width * (len(transports) - 1) / 2 for x in range(len(sizes))],
                    [size_name(z) for z in sizes])
    left.set_yscale("log")
    left.set_ylabel("messages / s (log)")
    left.set_title("The user's loop, 1 writer -> 1 reader (median, lowest-highest)")
    left.legend(fontsize=7)
    levels = (50, 90, 99)
    for r in rows:
        if r["test"] == "rtt" and r["rate"] == BACK_TO_BACK and r["status"] == "ok":
            right.plot(levels, [r[f"p{q}_us"] for q in levels], marker="o",
                       label=f"{r['transport']}, {r['wait']}")
    right.set_xticks(levels, [f"p{q}" for q in levels])
    right.set_yscale("log")
    right.set_xlabel("percentile")
    right.set_ylabel("round trip, microseconds (log)")
    right.set_title(f"Round trip, {RTT_SIZE} B, back to back")
    right.legend(fontsize=7)
    save_plot(fig, path)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_runs_options(parser, "short runs (0.2 s; paced 0.3 s; idle 0.5 s), 1 run",
                     "throughput and back-to-back round-trip run")
    parser.add_argument("--paced", type=float, default=2.0,
                        help=f"seconds per {PACED} round-trip run (default 2)")
    parser.add_argument("--idle", type=float, default=3.0,
                        help="seconds of the idle measurement (default 3)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="throughput message sizes in bytes, comma-separated (default "
                             "32,256,4096; each at least 16)")
    parser.add_argument("--only", metavar="NAMES",
                        help="comma-separated names: run only the transports whose name "
                             "contains one of them (e.g. shmbus,mp.Queue)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="directory for bench.md, bench.json, bench.png "
                             "(default tools/results/)")
    parser.add_argument("--json", action="store_true",
                        help="print the JSON report on stdout instead of the markdown")
    add_page_option(parser)
    args = parser.parse_args(argv)
    try:
        args.sizes = tuple(int(x) for x in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: comma-separated integers")
    if any(z < 16 for z in args.sizes):
        parser.error(f"--sizes {args.sizes}: every size at least 16 bytes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip().lower() for n in (args.only or "").split(",") if n.strip()]

    def wanted(transport: str) -> bool:
        return not names or any(n in transport.lower() for n in names)

    runs = 1 if args.quick else args.runs
    root = Path(tempfile.mkdtemp(prefix="shmbus-bench-",
                                 dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    settings = Settings(duration_s=0.2 if args.quick else args.duration,
                        paced_s=0.3 if args.quick else args.paced,
                        idle_s=0.5 if args.quick else args.idle, timeout_s=args.timeout,
                        root=root)
    ctx = mp.get_context("spawn")
    measurements = plan(ctx, args.sizes, wanted, settings)
    if not measurements:
        print(f"--only {args.only!r}: no transport matches (known: {', '.join(THROUGHPUT)})",
              file=sys.stderr)
        return 2
    setting = started(argv)
    load_before = setting.load
    print(f"shmbus bench: {len(measurements)} measurements x {runs} runs; progress on stderr",
          file=sys.stderr, flush=True)
    try:
        results = run_interleaved(
            measurements, runs, lambda row: print(f"  {_progress(row)}", file=sys.stderr,
                                                  flush=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [median_row(r) for r in results]
    # each throughput row's msg/s over the fastest peer's, and over zmq PAIR's, at its size
    for field, is_base in (("x_best_peer", lambda r: r["transport"] in PEERS),
                           ("x_zmq", lambda r: r["transport"] == ZMQ)):
        add_ratios(rows, field, lambda r, is_base=is_base: r["test"] == "throughput"
                   and is_base(r), lambda r: (r["test"], r.get("size")),
                   lambda r, base: r["msgs_per_s"] / base["msgs_per_s"])
    report = {"settings": {"runs": runs, "duration_s": settings.duration_s,
                           "paced_s": settings.paced_s, "idle_s": settings.idle_s,
                           "sizes": list(args.sizes), "only": args.only,
                           "load_before": load_before, "load_after": os.getloadavg()[0],
                           "machine": machine()},
              "rows": rows}
    markdown = report_markdown(report)
    if args.page:
        write_page(args.page, "ipc", "One host: tools/bench/ipc.py", "tools.bench.ipc",
                   setting, "![The user's loop by message size, and round-trip percentiles]"
                   "(ipc.png)\n\n" + markdown)
        draw_chart(rows, args.sizes, Path(args.page) / "ipc.png")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.md").write_text(markdown + "\n")
    (args.out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    try:
        draw_chart(rows, args.sizes, args.out / "bench.png")
    except ImportError as e:
        print(f"no chart: {e} (pip install -e '.[bench]')", file=sys.stderr)
    print(json.dumps(report, indent=2) if args.json else markdown)
    print(f"written: {args.out}/bench.md, bench.json, bench.png", file=sys.stderr)
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def _progress(row: dict[str, Any]) -> str:
    what = f"{row['test']:10s} {row['transport']:24s}"
    if row["test"] == "throughput":
        what += f" {row['size']:5d} B"
    elif row["test"] == "rtt":
        what += f" {row['rate']}, {row['wait']}"
    else:
        what += f" {row['wait']}"
    if row["status"] != "ok":
        return f"{what}: {cell_status(row)}"
    if row["test"] == "throughput":
        return f"{what}: {row['msgs_per_s']:,.0f} msg/s"
    if row["test"] == "rtt":
        return f"{what}: p50 {row['p50_us']:.1f} us, p99 {row['p99_us']:.1f} us"
    return f"{what}: cores {row['cores']}"


if __name__ == "__main__":
    sys.exit(main())
