"""Request/reply between processes: shmbus requesters and responders beside pyzmq REQ/REP,
pyzmq DEALER/ROUTER, a multiprocessing Pipe RPC and iceoryx2's request-response, in one run.

    python -m tools.bench.request_reply [--quick] [--duration 1] [--runs 5] [--only udp|1->1]
                                        [--page DIR]

Every row says how its two sides wait for the other ("waits"), and is compared only with the
peers that wait the same way: ``x peer`` is its calls per second over those of the strongest
peer (most calls per second) of the same case, size and way of waiting, the median of the
per-run ratios (runs are interleaved, so run i of every row ran at about the same time).

* ``blocks``: shmbus ``blocking`` (Context.wait_spin 0: every wait sleeps on the futex at
  once); zmq REQ/REP and DEALER/ROUTER (blocking recv and poll); Pipe (blocking recv and
  poll); shmbus ``udp`` (wait_spin 0).
* ``busy-polls``: shmbus ``busy`` (wait_spin 1 s: both sides spin, yielding, instead of
  sleeping); iceoryx2 (its Python API has no blocking receive: the client and the server
  poll). iceoryx2 runs 1->1 only, where the ``iceoryx2`` package is installed (``.[bench]``),
  else reads n/a. A zmq socket polled with NOBLOCK is no busy-polling peer: its I/O thread
  still sleeps in epoll, and on 2 cores eight such processes starve each other. So 4->4 has
  no busy-polling peer, and its busy row no ratio.
* ``spins 20 us, then blocks``: shmbus ``default`` (the default wait_spin), 1->1 only; no peer
  waits this way, so it has no ratio.

The cases:

* ``1->1``: one requester process calls one responder process back to back, 32 B: each
  call's round trip is timed (percentiles) and the calls per second counted.
* ``4->4``: four requester processes call a pool of four responder processes, 32 B and
  4 KiB: calls per second over all. shmbus: the four responders share the service (each
  call to one of them); zmq DEALER/ROUTER: every client connects to every worker (zmq spreads
  the requests round-robin); Pipe: four client/worker pairs (a Pipe is point to point).
* ``udp 1->1``: across hosts, on loopback: the requester on bus A calls the responder on bus
  B over ``aeron:udp`` (each bus with its own driver, which starts its netbridge: request ->
  log A -> netbridge A -> UDP -> netbridge B -> image B -> responder, and the reply back the
  same way to the requester's response endpoint), 32 B; beside zmq DEALER/ROUTER over
  ``tcp://127.0.0.1``. CPU counts both drivers and both netbridges.
* ``udp 4->4``: the same across hosts with four requester processes on bus A (each with its
  own response endpoint) and four responder processes sharing the service on bus B, 32 B and
  4 KiB, beside zmq DEALER/ROUTER over ``tcp://127.0.0.1`` (every client connected to every
  worker).

Every request carries its sequence number and a CRC-32 (tools/bench/harness.py, Checked), the
responders echo it, and the requester checks every byte of every reply against the request
it sent: a wrong or missing reply fails the run. CPU of every process (members and the
driver) is counted: ``cpu/call`` is their CPU seconds over the calls. Each row runs
``--runs`` times (default 5), interleaved with the other rows; figures are the median and
the spread (lowest-highest) of the runs. ``--page DIR`` writes DIR/request_reply.md and the
percentile curves of its round trips, DIR/request_reply.png.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench import pages
from tools.bench.curves import curve_us, plot_curves
from tools.bench.harness import (
    BenchError,
    Checked,
    Member,
    Unavailable,
    median_row,
    percentiles_us,
    run_interleaved,
    run_processes,
    start_driver,
    stop_driver,
)
from tools.bench.network import free_tcp_port, free_udp_ports
from tools.bench.peers import iceoryx_node
from tools.bench.report import markdown_table, size_name, text_table

SERVICE = 5001
CHANNEL = "aeron:ipc"
WAITS = {"busy": 1.0, "default": 20e-6, "blocking": 0.0}  # shmbus wait_spin, seconds
POOL = 4
SIZES = (32, 4096)
RUNS = 5
DURATION_S = 1.0

BLOCKS, BUSY, SPIN_THEN_BLOCK = "blocks", "busy-polls", "spins 20 us, then blocks"
#: how each transport's requesters and responders wait for the other side
WAITING = {"shmbus blocking": BLOCKS, "shmbus busy": BUSY, "shmbus default": SPIN_THEN_BLOCK,
           "zmq REQ/REP": BLOCKS, "zmq DEALER/ROUTER": BLOCKS,
           "Pipe": BLOCKS, "iceoryx2": BUSY, "shmbus udp": BLOCKS,
           "zmq DEALER/ROUTER tcp": BLOCKS}


# -- members: the call loop is the same for every transport -------------------------------------

def call_loop(call: Callable[[bytearray], bytes], size: int, duration_s: float
              ) -> dict[str, Any]:
    """Call back to back for ``duration_s``: time each call, check each reply is the request's
    echo (length, CRC, sequence). Returns samples (ns), calls, errors and elapsed_s (from the
    first call to the end of the last)."""
    checked = Checked(size)
    message = checked.message()
    samples = np.empty(2_000_000, np.int64)
    clock = time.perf_counter_ns
    began = clock()
    end = began + int(duration_s * 1e9)
    calls = errors = 0
    while calls < len(samples):
        checked.write(message, calls)
        t0 = clock()
        reply = call(message)
        t1 = clock()
        samples[calls] = t1 - t0
        seq, ok = checked.check(reply)
        errors += not ok or seq != calls
        calls += 1
        if t1 >= end:
            break
    return {"samples": samples[:calls].tobytes(), "calls": calls, "errors": errors,
            "elapsed_s": (clock() - began) / 1e9}


def finished(done: Any) -> None:
    with done.get_lock():
        done.value += 1


def shm_responder(start: Any, directory: str, wait_spin: float, requesters: int,
                  done: Any, channel: str = CHANNEL) -> dict[str, Any]:
    import shmbus

    with shmbus.connect(dir=directory, wait_spin=wait_spin) as bus, \
            bus.add_responder(channel, SERVICE, lambda request: request) as responder:
        start.ready(bus.driver_pid)
        served = 0
        while done.value < requesters:
            served += responder.serve(timeout=0.05)
    return {"served": served}


def shm_requester(start: Any, directory: str, wait_spin: float, size: int, duration_s: float,
                  done: Any, channel: str = CHANNEL) -> dict[str, Any]:
    import shmbus

    with shmbus.connect(dir=directory, wait_spin=wait_spin) as bus, \
            bus.add_requester(channel, SERVICE) as client:
        deadline = time.monotonic() + 30
        # until a responder is there: a call then stays in flight (the responders wait for
        # the start, so it is answered after it) instead of failing at once
        while (probe := client.submit(bytes(16), timeout=60)).done():
            if time.monotonic() > deadline:
                raise BenchError("no responder within 30 s")
            time.sleep(0.01)
        start.ready(bus.driver_pid)
        probe.result()
        try:
            return call_loop(lambda m: client.request(m, timeout=10), size, duration_s)
        finally:
            finished(done)


def zmq_responder(start: Any, endpoint: str, kind: str, requesters: int,
                  done: Any) -> dict[str, Any]:
    """Echo every request on a REP (``kind`` "req") or ROUTER socket bound to ``endpoint``
    until ``requesters`` requesters are done, blocking in poll. Returns served."""
    try:
        import zmq
    except ImportError as e:
        raise Unavailable(f"pyzmq: {e}") from None
    context = zmq.Context()
    socket = context.socket(zmq.REP if kind == "req" else zmq.ROUTER)
    socket.bind(endpoint)
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    start.ready()
    served = 0
    try:
        while done.value < requesters:
            if not poller.poll(50):
                continue
            if kind == "req":
                socket.send(socket.recv(copy=True))
            else:
                socket.send_multipart(socket.recv_multipart(copy=True))
            served += 1
    finally:
        socket.close(linger=0)
        context.term()
    return {"served": served}


def zmq_requester(start: Any, endpoints: list[str], kind: str, size: int, duration_s: float,
                  done: Any) -> dict[str, Any]:
    """call_loop over a REQ (``kind`` "req") or DEALER socket connected to every endpoint;
    each reply awaited in a blocking recv."""
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.REQ if kind == "req" else zmq.DEALER)
    for endpoint in endpoints:
        socket.connect(endpoint)
    time.sleep(0.2)  # every connection up, so the requests spread over all workers
    start.ready()
    send, recv = socket.send, socket.recv

    def call(message: bytearray) -> bytes:
        send(message)
        return recv(copy=True)

    try:
        return call_loop(call, size, duration_s)
    finally:
        finished(done)
        socket.close(linger=0)
        context.term()


def _iceoryx_service(name: str, size: int) -> tuple[Any, Any, Any]:
    """(module, node, request-response service ``name`` of byte slices); Unavailable without
    iceoryx2."""
    import ctypes

    iox2, node = iceoryx_node()
    service = (node.service_builder(iox2.ServiceName.new(name))
               .request_response(iox2.Slice[ctypes.c_uint8], iox2.Slice[ctypes.c_uint8])
               .open_or_create())
    return iox2, node, service


def iceoryx_responder(start: Any, name: str, size: int, requesters: int, done: Any
                      ) -> dict[str, Any]:
    """An iceoryx2 server echoing every request, busy-polling (iceoryx2's Python API has no
    blocking receive for servers)."""
    import ctypes

    _, node, service = _iceoryx_service(name, size)
    server = service.server_builder().initial_max_slice_len(size).create()
    receive, memmove = server.receive, ctypes.memmove
    start.ready()
    served = spins = 0
    while True:
        active = receive()
        if active is None:
            spins += 1
            if not spins & 1023 and done.value >= requesters:
                break
            continue
        data = bytes(active.payload().as_memory_view())
        response = active.loan_slice_uninit(len(data))
        memmove(response.payload_ptr, data, len(data))
        response.assume_init().send()
        active.delete()
        served += 1
    server.delete()
    return {"served": served}


def iceoryx_requester(start: Any, name: str, size: int, duration_s: float, done: Any
                      ) -> dict[str, Any]:
    import ctypes

    _, node, service = _iceoryx_service(name, size)
    client = service.client_builder().initial_max_slice_len(size).create()
    deadline = time.monotonic() + 30
    while service.dynamic_config.number_of_servers == 0:
        if time.monotonic() > deadline:
            raise BenchError("iceoryx2: no server within 30 s")
        time.sleep(0.002)
    loan, memmove = client.loan_slice_uninit, ctypes.memmove
    start.ready()

    def call(message: bytearray) -> bytes:
        request = loan(len(message))
        memmove(request.payload_ptr, bytes(message), len(message))
        pending = request.assume_init().send()
        while (response := pending.receive()) is None:
            pass
        reply = bytes(response.payload().as_memory_view())
        response.delete()
        pending.delete()
        return reply

    try:
        return call_loop(call, size, duration_s)
    finally:
        finished(done)
        client.delete()


def pipe_responder(start: Any, connection: Any, requesters: int, done: Any) -> dict[str, Any]:
    start.ready()
    served = 0
    while done.value < requesters:
        if connection.poll(0.05):
            connection.send_bytes(connection.recv_bytes())
            served += 1
    return {"served": served}


def pipe_requester(start: Any, connection: Any, size: int, duration_s: float, done: Any
                   ) -> dict[str, Any]:
    start.ready()

    def call(message: bytearray) -> bytes:
        connection.send_bytes(message)
        return bytes(connection.recv_bytes())

    try:
        return call_loop(call, size, duration_s)
    finally:
        finished(done)


# -- one measurement ----------------------------------------------------------------------------

def measure(ctx: Any, root: Path, case: str, transport: str, pool: int, size: int,
            duration_s: float, timeout_s: float) -> dict[str, Any]:
    """One run: ``pool`` requesters and ``pool`` responders of ``transport``."""
    done = ctx.Value("i", 0)
    run_dir = Path(tempfile.mkdtemp(dir=root))
    driver = None
    drivers = []
    members: list[Member] = []
    try:
        if transport == "shmbus udp":
            import shmbus

            wait_spin = WAITS["blocking"]
            contexts = [shmbus.Context(dir=str(run_dir / side), embedded_driver=False)
                        for side in "ab"]
            drivers = [start_driver(context) for context in contexts]
            service, *answers = free_udp_ports(1 + pool)
            channel = f"aeron:udp?endpoint=127.0.0.1:{service}"
            # the responders share the service on bus B; each requester on bus A has its own
            # response endpoint
            members += [Member(f"responder-{i}", shm_responder,
                               (contexts[1].dir, wait_spin, pool, done, channel))
                        for i in range(pool)]
            members += [Member(f"requester-{i}", shm_requester,
                               (contexts[0].dir, wait_spin, size, duration_s, done,
                                f"{channel}|response-endpoint=127.0.0.1:{answer}"))
                        for i, answer in enumerate(answers)]
        elif transport.startswith("shmbus"):
            import shmbus

            wait_spin = WAITS[transport.split()[1]]
            context = shmbus.Context(dir=str(run_dir / "bus"), embedded_driver=False)
            driver = start_driver(context)
            members += [Member(f"responder-{i}", shm_responder,
                               (context.dir, wait_spin, pool, done)) for i in range(pool)]
            members += [Member(f"requester-{i}", shm_requester,
                               (context.dir, wait_spin, size, duration_s, done))
                        for i in range(pool)]
        elif transport.startswith("zmq"):
            kind = "dealer" if "DEALER" in transport else "req"
            endpoints = ([f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(pool)]
                         if transport.endswith("tcp") else
                         [f"ipc://{run_dir}/w{i}.zmq" for i in range(pool)])
            members += [Member(f"responder-{i}", zmq_responder, (e, kind, pool, done))
                        for i, e in enumerate(endpoints)]
            members += [Member(f"requester-{i}", zmq_requester,
                               (endpoints, kind, size, duration_s, done))
                        for i in range(pool)]
        elif transport == "iceoryx2":
            name = f"shmbus-bench-rr/{run_dir.name}"
            members += [Member("responder-0", iceoryx_responder, (name, size, pool, done)),
                        Member("requester-0", iceoryx_requester, (name, size, duration_s, done))]
        else:
            for i in range(pool):
                a, b = ctx.Pipe()
                members += [Member(f"responder-{i}", pipe_responder, (b, pool, done)),
                            Member(f"requester-{i}", pipe_requester,
                                   (a, size, duration_s, done))]
        if driver is not None:
            drivers.append(driver)
        watch = (lambda: {"driver": {d.pid for d in drivers}}) if drivers else None
        out = run_processes(ctx, members, duration_s + timeout_s, watch=watch)
    finally:
        for process in drivers:
            stop_driver(process)
        shutil.rmtree(run_dir, ignore_errors=True)
    requesters = [r for role, r in out.results.items() if role.startswith("requester")]
    calls = sum(r["calls"] for r in requesters)
    errors = sum(r["errors"] for r in requesters)
    served = sum(r["served"] for role, r in out.results.items() if role.startswith("responder"))
    if errors or served < calls:
        raise BenchError(f"{transport}: {calls} calls, {served} served, {errors} bad replies")
    samples = np.concatenate([np.frombuffer(r["samples"], np.int64) for r in requesters])
    cpu = sum(c for c in out.cores.values() if c is not None) * out.wall_s
    # the requesters' own clocks: the start and the end of the measured window take no part
    seconds = max(r["elapsed_s"] for r in requesters)
    return {"case": case, "transport": transport, "size": size,
            **percentiles_us(samples), "curve_us": curve_us(samples),
            "calls_per_s": calls / seconds,
            "cpu_us_per_call": cpu / calls * 1e6, "errors": errors,
            "processes": sum(len(pids) for pids in out.pids.values())}


def plan(sizes: tuple[int, ...], only: str | None = None) -> list[tuple[str, str, int, int]]:
    """(case, transport, pool, size) of every measurement (``only="udp"``: the udp cases;
    ``only="1->1"``: the one-host 1->1 rows)."""
    udp = [("udp 1->1", t, 1, 32) for t in ("shmbus udp", "zmq DEALER/ROUTER tcp")]
    for size in sizes:
        udp += [("udp 4->4", t, POOL, size) for t in ("shmbus udp", "zmq DEALER/ROUTER tcp")]
    if only == "udp":
        return udp
    rows = [("1->1", t, 1, 32) for t in (
        "shmbus blocking", "zmq REQ/REP", "zmq DEALER/ROUTER", "Pipe",
        "shmbus busy", "iceoryx2", "shmbus default")]
    if only == "1->1":
        return rows
    for size in sizes:
        rows += [("4->4", t, POOL, size) for t in (
            "shmbus blocking", "zmq DEALER/ROUTER", "Pipe", "shmbus busy")]
    return rows + udp


#: the figures of a row reported as median and spread
SPREAD_KEYS = ("calls_per_s", "p50_us", "p99_us", "cpu_us_per_call")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of a measurement's runs: harness.median_row (the median of every figure and
    of every point of the percentile curve), ``waits``, ``spread`` (pages.Spread of each of
    SPREAD_KEYS) and ``per_run_calls`` (calls/s of each run, None for a failed one, in run
    order, for the per-run ratios)."""
    row = median_row(runs)
    row.update(case=runs[0]["case"], transport=runs[0]["transport"], size=runs[0]["size"])
    row["waits"] = WAITING[row["transport"]]
    ok = [r for r in runs if r["status"] == "ok"]
    row["spread"] = {key: pages.spread(r[key] for r in ok) for key in SPREAD_KEYS}
    row["per_run_calls"] = [r.get("calls_per_s") if r["status"] == "ok" else None
                            for r in runs]
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Set ``base`` (the transport of the strongest peer: the non-shmbus ok row of the same
    case, size and ``waits`` with the most calls/s) and ``ratio`` (pages.Spread of the
    per-run ratios of calls/s to the base's) on every ok row that has such a peer."""
    for row in rows:
        if row["status"] != "ok":
            continue
        peers = [r for r in rows if r["status"] == "ok" and not r["transport"].startswith(
            "shmbus") and (r["case"], r["size"], r["waits"]) == (row["case"], row["size"],
                                                                 row["waits"])]
        if not peers:
            continue
        base = max(peers, key=lambda r: r["calls_per_s"])
        row["base"] = base["transport"]
        row["ratio"] = pages.spread(
            a / b if a is not None and b else None
            for a, b in zip(row["per_run_calls"], base["per_run_calls"], strict=False))


def _cells(row: dict[str, Any]) -> list[str]:
    """The figures of an ok row as table cells: p50, p99, calls/s, x peer, cpu/call."""
    spread = row["spread"]
    ratio = (f"{pages.fmt_spread(row['ratio'], lambda v: f'{v:.2f}')} x {row['base']}"
             if row.get("ratio") else "-")
    return [pages.fmt_spread(spread["p50_us"], lambda v: f"{v:.1f}"),
            pages.fmt_spread(spread["p99_us"], lambda v: f"{v:.1f}"),
            pages.fmt_spread(spread["calls_per_s"], lambda v: f"{v:,.0f}"), ratio,
            pages.fmt_spread(spread["cpu_us_per_call"], lambda v: f"{v:.1f}")]


HEADERS = ["case", "transport", "waits", "size", "p50 us", "p99 us", "calls/s",
           "x strongest peer (same waits)", "cpu us/call"]


def table_lines(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The cells of every row under HEADERS (a failed or n/a row says so in its figures)."""
    lines = []
    for row in rows:
        head = [row["case"], row["transport"], row["waits"], size_name(row["size"])]
        if row["status"] != "ok":
            lines.append(head + [f"{row['status']}: {row.get('error', '')}"[:60], "", "", "",
                                 ""])
        else:
            lines.append(head + _cells(row))
    return lines


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table, median (lowest-highest) of the runs, with their ratios
    (add_ratios must have run)."""
    return text_table(HEADERS, table_lines(rows), range(4, 9),
                      [(r["case"], r["size"]) for r in rows])


PAGE_TITLE = "Request/reply"
PAGE_ROWS = """\
Each row is one way of calling a service between processes on this machine (or over UDP on
loopback), run {runs} times for {duration:g} s each, interleaved with the other rows. The
figures are the median of the runs, and in brackets the lowest and highest run.

Every request carries its sequence number and a CRC-32 over every byte; the responder echoes
it and the requester checks every byte of every reply against the request it sent. A wrong,
missing or surplus reply fails the run. Every row checks the same way.

How each row waits for the other side:

* **blocks**: shmbus `blocking` sets `wait_spin=0`, so every wait sleeps on the futex at
  once. zmq REQ/REP and DEALER/ROUTER block in `recv` and `poll`. Pipe blocks in `recv_bytes`
  and `poll`. shmbus `udp` blocks as `blocking` does.
* **busy-polls**: shmbus `busy` sets `wait_spin=1`: both sides spin, yielding, instead of
  sleeping. iceoryx2's Python API has no blocking receive, so its client and server poll.
  It runs 1->1 only; 4->4 has no busy-polling peer, so its busy rows have no ratio.
* **spins 20 us, then blocks**: shmbus `default`, the default `wait_spin`. No peer waits this
  way, so the row has no ratio.

*x strongest peer* is the row's calls per second over those of the peer with the most calls
per second among the rows of the same case, size and way of waiting: the median and spread of
the per-run ratios. *cpu us/call* is the CPU seconds of every process involved (requesters,
responders, drivers and netbridges) over the calls.

The cases:

* *1->1*: one requester process calls one responder process back to back with 32 B requests.
* *4->4*: four requester processes call a pool of four responder processes. shmbus's four
  responders share the service. Every zmq client connects to every worker, and zmq spreads
  the requests round-robin. Pipe runs four client/worker pairs, because a Pipe is point to
  point.
* *udp 1->1* and *udp 4->4*: the requesters on bus A call the responders on bus B over
  `aeron:udp` on 127.0.0.1. Each bus has its own driver and netbridge, and their CPU is
  counted. The peer is zmq DEALER/ROUTER over `tcp://127.0.0.1`.
"""


def page_body(rows: list[dict[str, Any]], runs: int, duration_s: float,
              plot: str | None) -> str:
    """The page's body: what each row does and checks, the table, and the plot's link."""
    parts = [PAGE_ROWS.format(runs=runs, duration=duration_s), "## Calls\n",
             markdown_table(HEADERS, table_lines(rows), range(4, 9)), ""]
    if plot:
        parts += ["## Round-trip percentiles\n",
                  "Each line is one row's round trips at each percentile (the median over "
                  "its runs), in microseconds on a log scale.", "", f"![round trips]({plot})",
                  ""]
    return "\n".join(parts)


def plot_panels(rows: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, dict[str,
                                                                                    float]]]]]:
    """One panel per case and size, one line per ok row: "transport (waits)"."""
    panels: dict[tuple[str, int], list[tuple[str, dict[str, float]]]] = {}
    for row in rows:
        if row["status"] == "ok" and row.get("curve_us"):
            panels.setdefault((row["case"], row["size"]), []).append(
                (f"{row['transport']} ({row['waits']})", row["curve_us"]))
    return [(f"{case}, {size_name(size)}", lines) for (case, size), lines in panels.items()]


def write_report_page(directory: str | Path, setting: pages.Setting,
                      rows: list[dict[str, Any]], runs: int, duration_s: float) -> Path:
    """Write DIR/request_reply.md and its plot DIR/request_reply.png (no plot without an ok
    row); the page's path."""
    panels = plot_panels(rows)
    plot = None
    if panels:
        plot_curves(Path(directory) / "request_reply.png", panels,
                    "Request/reply round trips by percentile")
        plot = "request_reply.png"
    return pages.write_page(directory, "request_reply", PAGE_TITLE, "tools.bench.request_reply",
                            setting, page_body(rows, runs, duration_s, plot))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke pass: 0.3 s per run, 1 run unless --runs says otherwise")
    parser.add_argument("--duration", type=float, default=DURATION_S,
                        help=f"seconds each run calls (default {DURATION_S:g})")
    parser.add_argument("--runs", "--repeat", dest="runs", type=int, default=None,
                        help=f"runs of each row, interleaved; median and spread reported "
                             f"(default {RUNS})")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="deadline of each run beyond its duration, seconds (default 30)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="request sizes of the 4->4 runs, bytes (default 32,4096)")
    parser.add_argument("--only", choices=("udp", "1->1"), default=None,
                        help="run only the udp cases (1->1 and 4->4, and their zmq tcp peers), "
                             "or only the one-host 1->1 rows")
    pages.add_page_option(parser)
    args = parser.parse_args(argv)
    duration = 0.3 if args.quick else args.duration
    runs = args.runs if args.runs is not None else (1 if args.quick else RUNS)
    if runs < 1:
        parser.error("--runs: at least 1")
    sizes = tuple(int(s) for s in args.sizes.split(","))
    ctx = multiprocessing.get_context("spawn")
    root = Path(tempfile.mkdtemp(prefix="rr-bench-", dir="/dev/shm"))
    setting = pages.started(argv)
    try:
        keys = plan(sizes, args.only)
        measurements = [({"case": key[0], "transport": key[1], "size": key[3]},
                         lambda key=key: measure(ctx, root, *key, duration, args.timeout))
                        for key in keys]

        def report(row: dict[str, Any]) -> None:
            figure = (f"{row['calls_per_s']:,.0f} calls/s" if row["status"] == "ok"
                      else f"{row['status']}: {row.get('error', '')}")
            print(f"  {row['case']:<9}{row['transport']:<24}{row['size']:>6}  {figure}",
                  file=sys.stderr, flush=True)

        rows = [summarise(r) for r in run_interleaved(measurements, runs, report)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    add_ratios(rows)
    print(table(rows))
    if args.page:
        print(f"page: {write_report_page(args.page, setting, rows, runs, duration)}")
    return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
