"""IPC benchmark: the bus users run, beside the IPC a Python user would pick instead.

    python -m tools.bench.ipc [--quick] [--runs N] [--only NAMES] [--json]   # from the repo root

shmbus is measured as a user runs it: ``shmbus.connect()`` with the embedded driver and default
settings (a fresh bus directory per measurement; the first client launches the driver), an
exclusive publication (``aeron:ipc``) in one spawned process and a subscription in another.
Beside it, in the same run with the same loops: multiprocessing Queue and Pipe, posix_ipc
MessageQueue, pyzmq PAIR over ipc:// and iceoryx2 (publish-subscribe over shared memory).

Every measurement runs in fresh spawned processes (tools/bench/harness.py): they set up and connect,
then start together; the CPU time of every process involved (writer, reader, the bus's driver)
is taken from the start to the last result, and reported as cores (CPU s / wall s). Each
measurement is repeated --runs times, interleaved with the others (so a burst of load on the
machine hits every transport alike); the table shows the median of each figure.

Throughput (1 writer -> 1 reader, 32 B, 256 B, 4 KiB): the writer sends for --duration seconds,
then a STOP message; rate = messages / (time the reader saw STOP - time the writer started),
both CLOCK_MONOTONIC. A message is a fixed body, its sequence number (int64) and a CRC-32 of both
(uint32, little-endian). They are made and checked a round at a time (tools/bench/rounds.py):
the writer makes a round of consecutive messages with numpy and sends each as its own bytes
object; the reader collects a round of copied messages and compares them with the round it
makes itself, so every byte of every message is checked at a few tens of ns a message, the
same way for every transport; a round that differs is walked message by message to name the
errors.

* copied and checked (every transport): the reader copies each message out as bytes and checks
  its sequence number and its checksum (every byte of the message); errors are counted. shmbus
  first as the README teaches: ``pub.publish(message)`` for each message and ``for message in
  sub.messages()``; then with the lower-level API: ``offer()`` (``publish()`` only once
  refused) read by ``messages()``, and by ``poll(handler)`` with ``bytes(buffer)`` in a Python
  handler.
* shmbus no-copy: the handler reads the sequence number from the memoryview in place.
* shmbus batch: ``offer_many`` of a (1024, size) uint8 numpy array, ``Subscription.poll_batch``;
  the reader checks, with numpy over each batch, the sequence number at the head and at the tail
  of every message (the tail carries the sequence number again instead of a checksum: a CRC per
  message in Python is the per-message cost the batch API exists to avoid).

Messages over the mtu less the 32-byte frame header (4 KiB at the default mtu 1408) arrive in
fragments; ``messages()`` reassembles them itself, the handler readers with FragmentAssembler,
as an application would. Nobody spins in throughput runs: a back-pressured shmbus writer sleeps
in ``publish()`` / ``publish_many()`` until the reader moves, an empty reader in ``messages()``,
``poll(..., timeout=)`` or ``wait()`` until the writer writes (peers block in their calls,
iceoryx2 polls).

Round trip (32 B ping-pong; p50/p90/p99 of the round trips, the first 10% dropped):

* back-to-back: the next ping goes as soon as the pong is back. shmbus as the README teaches
  (``publish()`` and a blocking ``messages()`` on both sides: their waits spin for
  Context.wait_spin, then sleep), and with offer()/poll() busy-spinning (BusySpinIdleStrategy on
  both sides); peers block in their receive calls, iceoryx2 polls.
* 1,000 msg/s: one ping per millisecond. shmbus waits blocking in ``Subscription.messages()``
  (publish() and messages(): woken by the writer), awaiting ``messages_async()`` on an asyncio
  loop, and
  with the default BackoffIdleStrategy between empty polls; peers as above. The summary shows the
  blocking-wait p50 with the ponger's CPU (a subscriber that waits all the time but for one
  echo per millisecond) in % of a core.

Idle: a connected publication and subscription doing nothing for --idle seconds (the publisher
sleeps, the subscriber polls with the default back-off, or blocks in ``poll(timeout=...)``):
the CPU of the publisher, the subscriber and the driver.

Output: a markdown report on stdout (or the JSON report with --json), and bench.md, bench.json
and bench.png (throughput by size, round-trip percentiles) in --out (default tools/results/).
Exit status 1 if a measurement failed (crashed, timed out, or got wrong messages); a
measurement that cannot run here (missing package or API) is reported "n/a: <reason>".
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
    SHM_HANDLER,
    SHM_NOCOPY,
    SHM_PUBLISH,
    SPIN,
    Scope,
    shm_batch_reader,
    shm_idle,
    shm_reader,
    shm_rtt,
    shm_writer,
)
from tools.bench.members import (
    BATCH_ROWS,
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
THROUGHPUT = (SHM_PUBLISH, SHM, SHM_HANDLER, SHM_NOCOPY, SHM_BATCH, *PEERS)

BACK_TO_BACK = "back-to-back"
PACED = f"{RTT_RATE:,} msg/s"
PEER_WAIT = {QUEUE: "blocking", PIPE: "blocking", POSIX: "blocking", ZMQ: "blocking",
             ICEORYX: "busy-poll", ZENOH: "blocking"}


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
            "messages": sent, "errors": 0, "cores": out.cores}


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
            bus = scope.bus()
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
    rtt = [(SHM_PUBLISH, BLOCKING, None), (SHM_PUBLISH, BLOCKING, RTT_RATE), (SHM, SPIN, None),
           (SHM, ASYNCIO, RTT_RATE),
           (SHM, BACKOFF, RTT_RATE), (ZMQ, ASYNCIO, RTT_RATE),
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


def summary_table(rows: list[dict[str, Any]], sizes: tuple[int, ...]) -> str:
    """One line per transport: msg/s by size, p50 / p99 of its fastest round trip, and p50 of
    its waiting round trip at RTT_RATE with the ponger's CPU (shmbus: the blocking wait)."""
    headers = ["1 writer -> 1 reader", *(f"{size_name(z)} msg/s" for z in sizes),
               f"RTT p50 / p99 us ({RTT_SIZE} B, {BACK_TO_BACK})",
               f"RTT p50 us at {PACED}, waiting / subscriber CPU"]
    lines = []
    for t in THROUGHPUT:
        mine = [r for r in rows if r["transport"] == t]
        if not mine:
            continue
        cells = []
        for z in sizes:
            r = next((r for r in mine if r["test"] == "throughput" and r["size"] == z), None)
            cells.append("-" if r is None else (cell_status(r) or _rate_cell(r, z)))
        rtt = next((r for r in mine if r["test"] == "rtt" and r["rate"] == BACK_TO_BACK), None)
        cells.append("-" if rtt is None else (cell_status(rtt) or
                                              f"{rtt['p50_us']:.1f} / {rtt['p99_us']:.1f}"))
        waiting = next((r for r in mine if r["test"] == "rtt" and r["rate"] == PACED
                        and r["wait"] in (BLOCKING, PEER_WAIT.get(t))), None)
        cells.append("-" if waiting is None else (cell_status(waiting) or
                                                  f"{waiting['p50_us']:.1f} / "
                                                  f"{_percent_of_core(waiting, 'ponger')}"))
        lines.append([_label(t), *cells])
    return markdown_table(headers, lines, range(1, len(headers)))


def _percent_of_core(row: dict[str, Any], label: str) -> str:
    cores = (row.get("cores") or {}).get(label)
    return "-" if cores is None else f"{cores:.1%}"


def _rate_cell(row: dict[str, Any], size: int) -> str:
    cell = fmt_rate(row["msgs_per_s"])
    return cell + (f" ({row['mb_per_s'] / 1000:.2f} GB/s)" if size >= 4096 else "")


def _label(transport: str) -> str:
    return {SHM_PUBLISH: "shmbus publish()/messages(), copied + checked",
            SHM: "shmbus offer()/messages() (lower-level API), copied + checked",
            SHM_HANDLER: "shmbus offer()/poll(handler) (lower-level API), copied + checked",
            SHM_NOCOPY: "shmbus offer()/poll (lower-level API), no copy",
            SHM_BATCH: "shmbus offer_many/poll_batch (numpy)",
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
    """Every throughput row: msg/s, MB/s, over the best peer's msg/s, cores, errors."""

    def figures(r: dict[str, Any]) -> list[str]:
        best = r.get("best_peer_msgs_per_s")
        return [fmt(r["msgs_per_s"]), fmt(r["mb_per_s"], 1),
                f"{r['msgs_per_s'] / best:.2f}" if best else "",
                cores_cell(r, ("writer", "reader", "driver")), str(r["errors"])]

    return _test_table(rows, "throughput",
                       ["transport", "size", "msg/s", "MB/s", "x best peer",
                        "cores: writer / reader / driver", "errors"],
                       lambda r: [_label(r["transport"]), size_name(r["size"])], figures,
                       (2, 3, 4, 6))


def rtt_table(rows: list[dict[str, Any]]) -> str:
    """Every round-trip row: percentiles, cores, errors."""

    def figures(r: dict[str, Any]) -> list[str]:
        return [fmt(r["p50_us"], 1), fmt(r["p90_us"], 1), fmt(r["p99_us"], 1),
                fmt(r["max_us"], 1), cores_cell(r, ("pinger", "ponger", "driver")),
                str(r["errors"])]

    return _test_table(rows, "rtt",
                       ["transport", "pace", "waiting", "p50 us", "p90 us", "p99 us", "max us",
                        "cores: pinger / ponger / driver", "errors"],
                       lambda r: [r["transport"], r["rate"], r["wait"]], figures,
                       (3, 4, 5, 6, 8))


def idle_table(rows: list[dict[str, Any]]) -> str:
    headers = ["bus doing nothing", "subscriber waits", "cores: publisher / subscriber / driver"]
    lines = [[r["transport"], r["wait"],
              cell_status(r) or cores_cell(r, ("publisher", "subscriber", "driver"))]
             for r in rows if r["test"] == "idle"]
    return markdown_table(headers, lines)


def report_markdown(report: dict[str, Any]) -> str:
    rows, settings = report["rows"], report["settings"]
    m = settings["machine"]
    head = (f"shmbus bench: median of {settings['runs']} runs; {settings['duration_s']} s per "
            f"throughput and back-to-back run, {settings['paced_s']} s per paced run, "
            f"{settings['idle_s']} s idle; python {m['python']}, {m['cpus']} CPUs, load "
            f"{settings['load_before']:.2f} before, {settings['load_after']:.2f} after.")
    parts = [head, "", summary_table(rows, tuple(settings["sizes"]))]
    if any(r["test"] == "throughput" for r in rows):
        parts += ["", "Throughput", "", throughput_table(rows)]
    if any(r["test"] == "rtt" for r in rows):
        parts += ["", f"Round trip, {RTT_SIZE} B ping-pong", "", rtt_table(rows)]
    if any(r["test"] == "idle" for r in rows):
        parts += ["", "Idle", "", idle_table(rows)]
    parts += ["", NOTES]
    return "\n".join(parts)


NOTES = f"""\
Notes: shmbus = `shmbus.connect()` (embedded driver, default settings: term 1 MiB, mtu 1408,
`{CHANNEL}`), exclusive publication / subscription in two spawned processes; back-pressured,
the writer sleeps in publish() and an empty reader in messages() or poll(timeout=). "copied +
checked": every message copied out as bytes (by `Subscription.messages()`, or by `bytes()` in a
poll handler), its sequence number and CRC-32 checked (every byte compared, a round of
4,096 messages at 32 B at a time: tools/bench/rounds.py); "no copy":
the sequence number read from the memoryview in place; batch: offer_many of ({BATCH_ROWS}, size)
numpy arrays, poll_batch, sequence numbers at head and tail checked with numpy. Peers:
mp.Queue(maxsize={QUEUE_DEPTH}) put/get, mp.Pipe send_bytes/recv_bytes, posix_ipc (default
depth) send/receive, zmq PAIR send/recv, iceoryx2 Slice[uint8] loan/send and receive (subscriber
buffer {QUEUE_DEPTH}, publisher retries when it is full), eclipse-zenoh put and a
FifoChannel({QUEUE_DEPTH}) subscriber's recv between two peer sessions over tcp loopback (reliable,
congestion control BLOCK), all copied + checked like shmbus. cores
= CPU seconds / wall seconds of each process from the start of the measurement to its last
result (1.00 = one core). MB = 10^6 payload bytes. x best peer: msg/s over the fastest peer's
at that size. RTT: microseconds, first 10% of round trips dropped; "waiting / subscriber
CPU": the {PACED} round trip with the receiver waiting (shmbus: blocking in
`Subscription.messages()`, peers: blocking calls, iceoryx2: polling) and the ponger's CPU in %
of one core. "asyncio await": both ends on an asyncio event loop, shmbus awaiting
`Subscription.messages_async()`, zmq its own `zmq.asyncio` PAIR. Idle: publisher sleeping,
subscriber waiting as named."""


def draw_chart(rows: list[dict[str, Any]], sizes: tuple[int, ...], path: Path) -> None:
    """Throughput by size (grouped bars, msg/s, log scale) and round-trip percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    transports = [t for t in THROUGHPUT if any(r["transport"] == t and r["test"] == "throughput"
                                               for r in rows)]
    width = 0.8 / max(1, len(transports))
    for i, t in enumerate(transports):
        values = []
        for z in sizes:
            r = next((r for r in rows if r["test"] == "throughput" and r["transport"] == t
                      and r["size"] == z and r["status"] == "ok"), None)
            values.append(r["msgs_per_s"] if r else 0)
        left.bar([x + i * width for x in range(len(sizes))], values, width, label=_label(t))
    left.set_xticks([x + width * (len(transports) - 1) / 2 for x in range(len(sizes))],
                    [size_name(z) for z in sizes])
    left.set_yscale("log")
    left.set_ylabel("messages / s (log)")
    left.set_title("Throughput, 1 writer -> 1 reader (missing bar: n/a)")
    left.legend(fontsize=7)
    rtts = [r for r in rows if r["test"] == "rtt"]
    for j, (key, label) in enumerate((("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99"))):
        right.bar([x + j * 0.27 for x in range(len(rtts))],
                  [r[key] if r["status"] == "ok" else 0 for r in rtts], 0.27, label=label)
    right.set_xticks([x + 0.27 for x in range(len(rtts))],
                     [f"{r['transport']}\n{r['rate']}, {r['wait']}" for r in rtts],
                     rotation=60, ha="right", fontsize=7)
    right.set_yscale("log")
    right.set_ylabel("round trip, microseconds (log)")
    right.set_title(f"Round trip, {RTT_SIZE} B (missing bars: n/a)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    args = parser.parse_args(argv)
    try:
        args.sizes = tuple(int(x) for x in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: comma-separated integers")
    if any(z < 16 for z in args.sizes):
        parser.error(f"--sizes {args.sizes}: every size at least 16 bytes")
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: at least 1")
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
    load_before = os.getloadavg()[0]
    print(f"shmbus bench: {len(measurements)} measurements x {runs} runs; progress on stderr",
          file=sys.stderr, flush=True)
    try:
        results = run_interleaved(
            measurements, runs, lambda row: print(f"  {_progress(row)}", file=sys.stderr,
                                                  flush=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [median_row(r) for r in results]
    # "x best peer": each throughput row's msg/s over the fastest peer's at its size
    add_ratios(rows, "best_peer_msgs_per_s",
               lambda r: r["test"] == "throughput" and r["transport"] in PEERS,
               lambda r: (r["test"], r.get("size")), lambda r, best: best["msgs_per_s"])
    report = {"settings": {"runs": runs, "duration_s": settings.duration_s,
                           "paced_s": settings.paced_s, "idle_s": settings.idle_s,
                           "sizes": list(args.sizes), "only": args.only,
                           "load_before": load_before, "load_after": os.getloadavg()[0],
                           "machine": machine()},
              "rows": rows}
    markdown = report_markdown(report)
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
