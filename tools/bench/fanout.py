"""Fan-out network benchmark: one publisher to one or two receiving hosts over UDP.

    sudo .venv/bin/python -m tools.bench.fanout [--quick] [--json out.json] [--page DIR]

Three hosts are network namespaces (tools/bench/network.py: 10.<subnet>.0.1 .. .3
on a Linux bridge, with a multicast route); each runs its own driver in its namespace, and the
driver starts its netbridge there when the first udp channel appears. The publisher and the
subscribers run outside the namespaces (they only touch their bus's shared memory), so a
message goes publisher -> log (host 0's bus) -> netbridge 0 -> UDP over veth and the bridge ->
netbridge N -> image log (host N's bus) -> subscriber N. In the same run, for each message
size, one publisher on host 0 sends to:

* unicast: ``aeron:udp?endpoint=<host 1>:PORT``, one subscriber on host 1 (the default
  flow control, which only has that one receiver): the base line of the "x unicast" ratio;
* multicast: ``aeron:udp?endpoint=224.1.31.1:PORT|interface=<host 0>|fc=min,g:/2``,
  subscribers ``aeron:udp?endpoint=224.1.31.1:PORT|interface=<own address>`` on hosts 1 and 2
  (one datagram on the wire for both);
* MDC manual: ``aeron:udp?control=<host 0>:PORT+1|control-mode=manual|fc=min,g:/2`` with
  ``add_destination("aeron:udp?endpoint=<host N>:PORT")`` for hosts 1 and 2, subscribers on
  that endpoint (the netbridge sends every datagram once per destination);
* MDC dynamic: ``aeron:udp?control=<host 0>:PORT+1|control-mode=dynamic|fc=min,g:/2``,
  subscribers ``aeron:udp?endpoint=<own address>:PORT|control=<host 0>:PORT+1`` on hosts 1 and
  2 (they announce themselves with status messages to the control address).

Flow control: the fan-out publications use ``fc=min`` (the slowest receiver sets the pace), so
their rate is the rate at which BOTH receivers get everything; under the multicast/MDC default,
max, the faster receiver sets the pace and the other one may fall behind and lose data.
``g:/2`` keeps the publication unconnected until both receivers have answered, so neither
joins late. Channels are otherwise defaults: term 1 MiB, mtu 1408 (the veths' MTU is 1500),
receiver window 512 KiB.

Throughput: the writer (tools/bench/members.stream_writer: ExclusivePublication.offer per
message, or offer_many with --batch) sends for a fixed duration, then a STOP message; each
reader (members.stream_reader: Subscription.messages(), or Image.poll_batch with --batch)
checks every byte of every message (``--check every-byte``, the default): per message, its
sequence number and a CRC-32 of every byte (harness.Checked); with --batch, numpy checks the
sequence number at each message's head and tail and that every byte between is zero. With
``--check head-tail`` only the sequence number at head and tail is checked; the table's
"check" column says which. A lost, duplicated, reordered, torn or corrupted message fails the
run. A run counts only if every receiver got
exactly the messages sent, in order; its rate is messages / (time the LAST receiver saw STOP -
time the writer started), CLOCK_MONOTONIC in every process. That rate is per receiver: each
receiver got all of them ("MB/s delivered" counts every receiver's copy). Each row runs
``--repeat`` times (default 5), interleaved with the other rows; figures are the median, msgs/s
also with its spread (lowest-highest run). ``--page DIR`` writes DIR/fanout.md and a plot of
the rates, DIR/fanout.png.

Every measurement runs in fresh spawned processes (one writer, one reader per receiving host)
that the parent starts and watches; the drivers and their netbridges are started once and serve
every run (each run on its own stream id and UDP ports, so each run has fresh logs, images and
sockets). Idle strategies as in tools/bench/netbridge.py: back-off on the application sides,
select() in the netbridges, back-off in the drivers; on a 2-core machine nine processes (three
drivers, three netbridges, writer, two readers) share the two cores.

Bounded waits: every loop checks a deadline, the parent terminates the processes of a run that
overruns, and the drivers are stopped and the namespaces removed on exit, also after a failure
or SIGTERM. Needs root (ip netns).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tools.bench import pages
from tools.bench.harness import (
    BenchError,
    Member,
    Options,
    add_run_options,
    attempt,
    child_pids,
    median_row,
    run_processes,
)
from tools.bench.members import BATCH_ROWS, stream_reader, stream_writer
from tools.bench.network import host_buses
from tools.bench.report import add_ratios, fmt, markdown_table, size_name, text_table

SIZES = (32, 1024)
SUBNET = 231  # the tests use 221..229
GROUP = "224.1.31.1"  # the multicast data group (odd; its control group is 224.1.31.2)
FIRST_PORT = 43100  # run n's UDP ports: FIRST_PORT + 2n (data), FIRST_PORT + 2n + 1 (MDC control)
FIRST_STREAM_ID = 3001
FAN_OUT_FLOW_CONTROL = "fc=min,g:/2"
REPEAT = 5
#: --check: what each reader checks, as the table's "check" column names it
CHECKS = {"every-byte": "every byte", "head-tail": "seq at head and tail"}

#: the configurations, as the table names them
UNICAST, MULTICAST, MDC_MANUAL, MDC_DYNAMIC = "unicast", "multicast", "MDC manual", "MDC dynamic"
#: the configurations by their --configs names, in the order they run
CONFIG_NAMES = {"unicast": UNICAST, "multicast": MULTICAST, "mdc-manual": MDC_MANUAL,
                "mdc-dynamic": MDC_DYNAMIC}


@dataclass(frozen=True)
class Channels:
    """The URIs of one configuration: the publication's (on host 0), the destinations added to
    it (a control-mode=manual channel's), and one subscription per receiving host."""

    publication: str
    destinations: tuple[str, ...]
    subscriptions: tuple[str, ...]


def channels_for(config: str, addresses: list[str], port: int | str,
                 control_port: int | str) -> Channels:
    """The channels of config from the publishing host addresses[0] to the receiving hosts
    addresses[1:] (the first of them for unicast, all for the others) on UDP port port; the
    MDC control address is addresses[0]:control_port. (Ports may be names, for the notes.)"""
    sender, receivers = addresses[0], addresses[1:]
    control = f"{sender}:{control_port}"
    if config == UNICAST:
        endpoint = f"aeron:udp?endpoint={receivers[0]}:{port}"
        return Channels(endpoint, (), (endpoint,))
    if config == MULTICAST:
        group = f"aeron:udp?endpoint={GROUP}:{port}|interface="
        return Channels(f"{group}{sender}|{FAN_OUT_FLOW_CONTROL}", (),
                        tuple(group + address for address in receivers))
    if config == MDC_MANUAL:
        endpoints = tuple(f"aeron:udp?endpoint={address}:{port}" for address in receivers)
        return Channels(f"aeron:udp?control={control}|control-mode=manual|"
                        f"{FAN_OUT_FLOW_CONTROL}", endpoints, endpoints)
    if config == MDC_DYNAMIC:
        return Channels(f"aeron:udp?control={control}|control-mode=dynamic|"
                        f"{FAN_OUT_FLOW_CONTROL}", (),
                        tuple(f"aeron:udp?endpoint={address}:{port}|control={control}"
                              for address in receivers))
    raise ValueError(f"unknown configuration {config!r}")


@dataclass(frozen=True)
class ReadersDone:
    """Done once every reader is: each reader's set() counts one, the writer's wait() returns
    True when all have (False after timeout seconds). Picklable into spawned processes."""

    semaphore: Any  # a multiprocessing Semaphore(0) of the run's context
    readers: int

    def set(self) -> None:
        self.semaphore.release()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for _ in range(self.readers):
            if not self.semaphore.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
        return True


# ---------------------------------------------------------------------------------------------
# One measurement
# ---------------------------------------------------------------------------------------------


def fanout_key(config: str, size: int, channels: Channels) -> dict[str, Any]:
    """A row's identity: the configuration, its receivers, the size and the channels."""
    return {"test": "throughput", "config": config, "receivers": len(channels.subscriptions),
            "size": size, "publication": channels.publication,
            "destinations": list(channels.destinations),
            "subscriptions": list(channels.subscriptions)}


def run_fanout(ctx: Any, net: Any, channels: Channels, size: int, batch: bool,
               opt: Options, stream_id: int, every_byte: bool = True) -> dict[str, Any]:
    """One throughput run on channels with size-byte messages: its figures; BenchError when
    any process failed or any receiver missed, repeated, reordered or tore a message (with
    ``every_byte``, or a byte of it was wrong: see members.stream_reader's ``checked``)."""
    receivers = len(channels.subscriptions)
    done = ReadersDone(ctx.Semaphore(0), receivers)
    writer = Member("writer", stream_writer, (net.contexts[0], channels.publication, stream_id,
                                              size, opt.duration_s, opt.timeout_s, done, batch,
                                              channels.destinations, every_byte))
    readers = [Member(f"reader on host {host}", stream_reader,
                      (net.contexts[host], uri, stream_id, size, opt.timeout_s, done, batch,
                       every_byte))
               for host, uri in enumerate(channels.subscriptions, start=1)]
    labels = [f"bridge {i}" for i in range(len(net.drivers))]  # host i's netbridge

    def bridges() -> dict[str, list[int]]:
        return {label: child_pids(driver.pid) for label, driver in zip(labels, net.drivers,
                                                                       strict=True)}

    out = run_processes(ctx, [*readers, writer], 2 * opt.timeout_s + opt.duration_s + 30,
                        watch=bridges)
    sent, t0 = out.results["writer"]["sent"], out.results["writer"]["t0"]
    got = [out.results[reader.role] for reader in readers]
    short = [f"{reader.role} received {r['received']} in order, {r['errors']} bad (first: "
             f"{r['first_bad']})" for reader, r in zip(readers, got, strict=True)
             if r["errors"] or r["received"] != sent]
    if short:
        raise BenchError(f"sent {sent}; " + "; ".join(short))
    last = max(r["t1"] for r in got)
    seconds = (last - t0) / 1e9
    return {"messages": sent, "seconds": seconds, "msgs_per_s": sent / seconds,
            "mb_per_s": sent * size / seconds / 1e6,
            "delivered_mb_per_s": receivers * sent * size / seconds / 1e6,
            "receiver_spread_ms": (last - min(r["t1"] for r in got)) / 1e6,
            "bridge_cpu_s": [(out.cores.get(label) or 0.0) * out.wall_s for label in labels]}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _bridge_cpu_cell(row: dict[str, Any]) -> str:
    """Netbridge CPU microseconds per message: the sending host's / each receiving host's."""
    if row["status"] != "ok":
        return "-"
    costs = [f"{cpu / row['messages'] * 1e6:.2f}"
             for cpu in row["bridge_cpu_s"][:row["receivers"] + 1]]
    return f"{costs[0]} / {' '.join(costs[1:])}"


HEADERS = ["configuration", "receivers", "size", "msgs/s per receiver", "MB/s per receiver",
           "MB/s delivered", "x unicast", "last - first rcv ms",
           "bridge cpu us/msg: sender / receivers", "check"]


def table_lines(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The cells of every row under HEADERS: msgs/s as median (lowest-highest run), the check
    column "ok, <what was checked>" or FAILED."""
    return [[r["config"], str(r["receivers"]), str(r["size"]),
             pages.fmt_spread(_spread(r.get("msgs_spread")), lambda v: f"{v:,.0f}"),
             fmt(r.get("mb_per_s"), 1), fmt(r.get("delivered_mb_per_s"), 1),
             fmt(r.get("x_unicast"), 2), fmt(r.get("receiver_spread_ms"), 1),
             _bridge_cpu_cell(r),
             f"ok, {r.get('checks', '-')}" if r["status"] == "ok" else "FAILED"] for r in rows]


def _spread(value: dict[str, Any] | None) -> pages.Spread | None:
    """A row's spread (kept as a dict, for JSON) as a pages.Spread."""
    return pages.Spread(**value) if value else None


def format_table(rows: list[dict[str, Any]]) -> str:
    return text_table(HEADERS, table_lines(rows), {1, 2, 3, 4, 5, 6, 7},
                      [r["size"] for r in rows])


NOTES = """\
notes:
  path: writer -> log (host 0's bus) -> netbridge 0 -> UDP (veth, Linux bridge) -> netbridge N
    -> image (host N's bus) -> reader N; each host is a network namespace with its own driver,
    which started its netbridge; writer and readers run outside the namespaces.
  channels (PORT differs for every run; MDC control on PORT+1):
{channels}
    multicast and MDC use {flow_control}: the slowest receiver sets the pace and the publication
    connects once both receivers answered, so the rate is that at which BOTH got everything.
    Otherwise defaults: term 1 MiB, mtu 1408, receiver window 512 KiB.
  api: {api}.
  msgs/s per receiver: messages / (time the LAST receiver saw STOP - time the writer started);
    every receiver got every message, in order, as the check column says: every byte
    (sequence number and CRC-32; batch: head and tail and zeros between) or the sequence number
    at head and tail. MB/s delivered = MB/s per receiver x receivers. MB = 10^6 payload bytes.
  x unicast: msgs/s / the unicast row's msgs/s at the same size, same run.
  last - first rcv ms: how much later the last receiver saw STOP than the first.
  bridge cpu us/msg: CPU time (user + system) of each host's netbridge from the start of the
    measurement (all connected) to its end / messages sent: host 0's / hosts 1 and 2's.
    A warm-up run first starts every host's netbridge, so no row pays for a start."""

API_OFFER = ("ExclusivePublication.offer per message / Subscription.messages(), each copied "
             "out as bytes")
API_BATCH = (f"offer_many of ({BATCH_ROWS}, size) uint8 arrays / Image.poll_batch(limit "
             f"{BATCH_ROWS}), asleep in wait() while empty")


def _channel_templates(configs: list[str]) -> str:
    """The channels of each configuration, for the notes: hosts as HOSTn, ports as names."""
    out = []
    for config in configs:
        channels = channels_for(config, ["HOST0", "HOST1", "HOST2"], "PORT", "PORT+1")
        out.append(f"    [{config}] publication {channels.publication}")
        out.extend(f"      + destination {uri}" for uri in channels.destinations)
        out.extend(f"      subscription {uri}" for uri in channels.subscriptions)
    return "\n".join(out)


def print_report(report: dict[str, Any]) -> None:
    """The table, the notes and any failures of a report that measure() returned."""
    settings = report["settings"]
    load = settings["load_before"][0], settings["load_after"][0]
    print(f"fan-out bench: {settings['duration_s']} s per run, median of {settings['repeat']}; "
          f"python {settings['python']}, {settings['cpus']} CPUs; load average {load[0]:.2f} "
          f"before, {load[1]:.2f} after")
    print()
    print(format_table(report["rows"]))
    print()
    print(NOTES.format(channels=_channel_templates(settings["configs"]),
                       api=API_BATCH if settings["batch"] else API_OFFER,
                       flow_control=settings["flow_control"]))
    for r in report["rows"]:
        if r["status"] != "ok":
            print(f"\nFAILED {r['config']} {r['size']} B: {r['error']}")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, 1.5, "each writer sends")
    parser.set_defaults(repeat=None)  # REPEAT, or 1 with --quick
    parser.add_argument("--check", choices=tuple(CHECKS), default="every-byte",
                        help="what each reader checks of every message (default every-byte)")
    pages.add_page_option(parser)
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        default=SIZES, help="message sizes, comma-separated (default 32,1024)")
    parser.add_argument("--configs", default=",".join(CONFIG_NAMES),
                        help=f"configurations, comma-separated (default: all of "
                             f"{','.join(CONFIG_NAMES)})")
    parser.add_argument("--batch", action="store_true",
                        help="offer_many/poll_batch instead of per-message offer/poll")
    parser.add_argument("--subnet", type=int, default=SUBNET,
                        help=f"the hosts' addresses are 10.SUBNET.0.1..3 (default {SUBNET})")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    for size in args.sizes:
        if size < 16 or size % 8:
            parser.error(f"message size {size}: a multiple of 8, at least 16")
    unknown = set(args.configs.split(",")) - set(CONFIG_NAMES)
    if unknown:
        parser.error(f"--configs: unknown {', '.join(sorted(unknown))} (known: "
                     f"{', '.join(CONFIG_NAMES)})")
    return args


def _exit_on_sigterm(signum: int, frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Set up the hosts, run every measurement (progress on stderr), tear everything down;
    the report: settings and rows (the median of --repeat runs each, ratios added)."""
    duration = 0.3 if args.quick else args.duration
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else REPEAT)
    every_byte = args.check == "every-byte"
    opt = Options(duration_s=duration, timeout_s=args.timeout)
    configs = [CONFIG_NAMES[name] for name in args.configs.split(",")]
    plan = [(config, size) for size in args.sizes for config in configs]
    ctx = mp.get_context("spawn")
    ports = itertools.count(FIRST_PORT, 2)
    stream_ids = itertools.count(FIRST_STREAM_ID)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {key: [] for key in plan}
    load_before = os.getloadavg()
    print(f"fan-out bench: {duration} s per run, median of {repeat}, {os.cpu_count()} CPUs, "
          f"load {load_before[0]:.2f}; progress on stderr", file=sys.stderr, flush=True)
    # SIGTERM unwinds like Ctrl-C: drivers stopped, namespaces and bus directories removed
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    root = Path(tempfile.mkdtemp(prefix="shmbus-bench-fanout-", dir="/dev/shm"))
    try:
        with host_buses(root, 3, args.subnet) as net:
            addresses = [host.address for host in net.hosts]

            def run(config: str, size: int, run_opt: Options) -> dict[str, Any]:
                port = next(ports)
                channels = channels_for(config, addresses, port, port + 1)
                return {**fanout_key(config, size, channels),
                        "checks": CHECKS[args.check],
                        **attempt(lambda: run_fanout(ctx, net, channels, size, args.batch,
                                                     run_opt, next(stream_ids), every_byte))}

            # the drivers start their netbridges on the first udp channel: a short multicast
            # run starts all three, so that no measurement's bridge cpu includes a start
            warm_up = run(MULTICAST, args.sizes[0], Options(duration_s=0.1,
                                                            timeout_s=args.timeout))
            print(f"  warm-up: {warm_up['status']} {warm_up.get('error', '')}",
                  file=sys.stderr, flush=True)
            # repeats interleaved, so that a burst of load elsewhere hits every configuration
            for _ in range(repeat):
                for config, size in plan:
                    row = run(config, size, opt)
                    summary = (f"{row['msgs_per_s']:,.0f} msgs/s per receiver"
                               if row["status"] == "ok" else "FAILED: " + row["error"])
                    print(f"  {config:12s} {size:5d} B  {summary}", file=sys.stderr, flush=True)
                    runs[(config, size)].append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous_handler)
    rows = [median_row(runs[key]) for key in plan]
    for row, key in zip(rows, plan, strict=True):
        first = runs[key][0]
        row.update(size=first["size"], receivers=first["receivers"])  # not medians
        if row["status"] == "ok":  # each host's netbridge CPU: the median over the runs
            row["bridge_cpu_s"] = [statistics.median(cpu) for cpu in zip(
                *(r["bridge_cpu_s"] for r in runs[key]), strict=True)]
        found = pages.spread(r.get("msgs_per_s") for r in runs[key] if r["status"] == "ok")
        row["msgs_spread"] = vars(found) if found else None
        row["runs_msgs_per_s"] = [r.get("msgs_per_s") for r in runs[key]]
    # x unicast: msgs/s over the unicast row's at the same size
    add_ratios(rows, "x_unicast", lambda r: r["config"] == UNICAST, lambda r: r["size"],
               lambda r, unicast: r["msgs_per_s"] / unicast["msgs_per_s"])
    return {"settings": {"duration_s": duration, "repeat": repeat, "sizes": list(args.sizes),
                         "check": CHECKS[args.check],
                         "configs": configs, "batch": args.batch, "subnet": args.subnet,
                         "flow_control": FAN_OUT_FLOW_CONTROL, "cpus": os.cpu_count(),
                         "load_before": load_before, "load_after": os.getloadavg(),
                         "python": platform.python_version(), "platform": platform.platform()},
            "rows": rows}


PAGE_ROWS = """\
Three hosts are network namespaces on a Linux bridge, each with its own driver and netbridge.
One publisher on host 0 sends to one receiver (unicast) or to two (multicast, MDC manual, MDC
dynamic) for {duration:g} s a run; each row runs {repeat} times, interleaved with the other
rows. *msgs/s per receiver* is the median run, in brackets the lowest and the highest; the
other figures are medians.

Every receiver gets every message, in order, and checks {checks} of each (the *check*
column): {how}. A lost, repeated, reordered or corrupted message fails the run.
*x unicast* is the row's messages a second over the unicast row's at the same size: unicast
is the one-receiver base of the same channel machinery.
"""


def page_body(report: dict[str, Any], plot: str) -> str:
    """The page's body: what each row does and checks, the table, the notes, the plot."""
    settings = report["settings"]
    every = settings["check"] == CHECKS["every-byte"]
    how = (("its sequence number and a CRC-32 of every byte" if not settings["batch"] else
            "the sequence number at its head and its tail, and that every byte between is "
            "zero") if every else "the sequence number at its head and its tail only")
    notes = NOTES.format(channels=_channel_templates(settings["configs"]),
                         api=API_BATCH if settings["batch"] else API_OFFER,
                         flow_control=settings["flow_control"])
    return "\n".join([
        PAGE_ROWS.format(duration=settings["duration_s"], repeat=settings["repeat"],
                         checks=settings["check"], how=how),
        "## Rates\n", markdown_table(HEADERS, table_lines(report["rows"]), range(1, 8)), "",
        f"![messages a second per receiver]({plot})", "", "## Notes\n", "```", notes, "```"])


def plot_rates(path: Path, rows: list[dict[str, Any]]) -> Path:
    """A PNG of msgs/s per receiver of every ok row: a bar at the median, a line from the
    lowest to the highest run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and r.get("msgs_spread")]
    figure, ax = plt.subplots(figsize=(7, 4))
    spreads = [_spread(r["msgs_spread"]) for r in ok]
    medians = [s.median for s in spreads if s]
    low = [s.median - s.low for s in spreads if s]
    high = [s.high - s.median for s in spreads if s]
    ax.bar(range(len(ok)), medians, yerr=[low, high], capsize=3)
    ax.set_xticks(range(len(ok)), [f"{r['config']}\n{size_name(r['size'])}" for r in ok],
                  fontsize=7)
    ax.set_ylabel("messages/s per receiver")
    ax.set_title("Fan-out over UDP, every receiver getting every message")
    return pages.save_plot(figure, path)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the report, write it as JSON with --json and the page with --page; 1 if
    any row failed."""
    args = parse_args(argv)
    setting = pages.started(argv)
    report = measure(args)
    print()
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.page:
        plot = plot_rates(Path(args.page) / "fanout.png", report["rows"])
        page = pages.write_page(args.page, "fanout", "Fan-out across hosts", "tools.bench.fanout",
                                setting, page_body(report, plot.name))
        print(f"page: {page}")
    return 1 if any(r["status"] != "ok" for r in report["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
