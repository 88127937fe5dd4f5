"""Request/reply between processes: shmbus requesters and responders beside pyzmq REQ/REP,
pyzmq DEALER/ROUTER and a multiprocessing Pipe RPC, in one run.

    python -m tools.bench.request_reply [--quick] [--duration 3] [--repeat 3] [--only udp|1->1]

* ``1->1``: one requester process calls one responder process back to back, 32 B: each
  call's round trip is timed (p50/p90/p99) and the calls per second counted. shmbus runs
  ``busy`` (Context.wait_spin = 1 s: both sides spin, yielding, instead of sleeping),
  ``default`` (wait_spin 20 us, then sleep) and ``blocking`` (wait_spin 0: every wait
  sleeps on the futex at once); the peers block in their receive calls.
* ``4->4``: four requester processes call a pool of four responder processes, 32 B and
  4 KiB: calls per second over all. shmbus: the four responders share the service (each
  call to one of them); zmq REQ/REP and DEALER/ROUTER: every client connects to every
  worker (zmq spreads the requests round-robin); Pipe: four client/worker pairs (a Pipe is
  point to point).
* ``udp 1->1``: across hosts, on loopback: the requester on bus A calls the responder on bus
  B over ``aeron:udp`` (each bus with its own driver, which starts its netbridge: request ->
  log A -> netbridge A -> UDP -> netbridge B -> image B -> responder, and the reply back the
  same way to the requester's response endpoint), 32 B, default waits; beside zmq REQ/REP over
  ``tcp://127.0.0.1``. CPU counts both drivers and both netbridges.
* ``udp 4->4``: the same across hosts with four requester processes on bus A (each with its
  own response endpoint) and four responder processes sharing the service on bus B, 32 B and
  4 KiB, beside zmq DEALER/ROUTER over ``tcp://127.0.0.1`` (every client connected to every
  worker).

Every request carries its sequence number and a CRC (tools/bench/harness.py, Checked), the
responders echo it, and the requester checks every byte of every reply against the request
it sent: a wrong or missing reply fails the run. CPU of every process (members and the
driver) is counted: ``cpu/call`` is their CPU seconds over the calls. iceoryx2's
request-response (1->1 only: one server busy-polling, as its Python API has no blocking
receive) runs where the ``iceoryx2`` package is installed (``.[bench]``), else reads n/a.
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

from tools.bench.harness import (
    BenchError,
    Checked,
    Member,
    Unavailable,
    add_run_options,
    attempt,
    median_row,
    percentiles_us,
    run_processes,
    start_driver,
    stop_driver,
)
from tools.bench.network import free_tcp_port, free_udp_ports
from tools.bench.peers import iceoryx_node

SERVICE = 5001
CHANNEL = "aeron:ipc"
WAITS = {"busy": 1.0, "default": 20e-6, "blocking": 0.0}
POOL = 4
SIZES = (32, 4096)


# -- members: the call loop is the same for every transport -------------------------------------

def call_loop(call: Callable[[bytearray], bytes], size: int, duration_s: float
              ) -> dict[str, Any]:
    """Call back to back for ``duration_s``: time each call, check each reply is the request's
    echo (length, CRC, sequence). Returns samples (ns), calls, errors."""
    checked = Checked(size)
    message = checked.message()
    samples = np.empty(2_000_000, np.int64)
    clock = time.perf_counter_ns
    end = clock() + int(duration_s * 1e9)
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
    return {"samples": samples[:calls].tobytes(), "calls": calls, "errors": errors}


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


def zmq_responder(start: Any, endpoint: str, kind: str, requesters: int, done: Any
                  ) -> dict[str, Any]:
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
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.REQ if kind == "req" else zmq.DEALER)
    for endpoint in endpoints:
        socket.connect(endpoint)
    time.sleep(0.2)  # every connection up, so the requests spread over all workers
    start.ready()

    def call(message: bytearray) -> bytes:
        socket.send(message)
        return socket.recv(copy=True)

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

            wait_spin = WAITS["default"]
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
                               (endpoints, kind, size, duration_s, done)) for i in range(pool)]
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
    seconds = out.wall_s
    return {"case": case, "transport": transport, "size": size,
            **percentiles_us(samples), "calls_per_s": calls / seconds,
            "cpu_us_per_call": cpu / calls * 1e6, "errors": errors,
            "processes": sum(len(pids) for pids in out.pids.values())}


def plan(sizes: tuple[int, ...], only: str | None = None) -> list[tuple[str, str, int, int]]:
    """(case, transport, pool, size) of every measurement (``only="udp"``: the udp cases;
    ``only="1->1"``: the one-host 1->1 rows)."""
    udp = [("udp 1->1", "shmbus udp", 1, 32), ("udp 1->1", "zmq REQ/REP tcp", 1, 32)]
    for size in sizes:
        udp += [("udp 4->4", t, POOL, size) for t in ("shmbus udp", "zmq DEALER/ROUTER tcp")]
    if only == "udp":
        return udp
    rows = [("1->1", f"shmbus {wait}", 1, 32) for wait in WAITS]
    rows += [("1->1", peer, 1, 32) for peer in ("zmq REQ/REP", "zmq DEALER/ROUTER", "Pipe",
                                                 "iceoryx2")]
    if only == "1->1":
        return rows
    for size in sizes:
        rows += [("4->4", t, POOL, size) for t in ("shmbus default", "shmbus busy",
                                                   "zmq REQ/REP", "zmq DEALER/ROUTER", "Pipe")]
    return rows + udp


def table(rows: list[dict[str, Any]]) -> str:
    """The rows with ratios: calls/s against zmq REQ/REP (1->1), DEALER/ROUTER (4->4),
    REQ/REP over tcp (udp 1->1) or DEALER/ROUTER over tcp (udp 4->4) of the same case and
    size."""
    def peer(row: dict[str, Any]) -> float | None:
        name = {"1->1": "zmq REQ/REP", "4->4": "zmq DEALER/ROUTER",
                "udp 4->4": "zmq DEALER/ROUTER tcp"}.get(row["case"], "zmq REQ/REP tcp")
        match = [r for r in rows if r["case"] == row["case"] and r["size"] == row["size"]
                 and r["transport"] == name and r["status"] == "ok"]
        return match[0]["calls_per_s"] if match else None

    lines = [f"{'case':<9}{'transport':<20}{'size':>6}{'p50 us':>9}{'p99 us':>9}"
             f"{'calls/s':>11}{'x zmq':>7}{'cpu us/call':>13}"]
    for row in rows:
        head = f"{row['case']:<9}{row['transport']:<20}{row['size']:>6}"
        if row["status"] != "ok":
            lines.append(f"{head}  {row['status']}: {row.get('error', '')}")
            continue
        base = peer(row)
        ratio = f"{row['calls_per_s'] / base:.1f}" if base else "-"
        lines.append(f"{head}{row['p50_us']:>9.1f}{row['p99_us']:>9.1f}"
                     f"{row['calls_per_s']:>11,.0f}{ratio:>7}{row['cpu_us_per_call']:>13.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_options(parser, 3.0, "each run calls")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="request sizes of the 4->4 runs, bytes (default 32,4096)")
    parser.add_argument("--only", choices=("udp", "1->1"), default=None,
                        help="run only the udp cases (1->1 and 4->4, and their zmq tcp peers), "
                             "or only the one-host 1->1 rows")
    args = parser.parse_args(argv)
    duration = 0.3 if args.quick else args.duration
    sizes = tuple(int(s) for s in args.sizes.split(","))
    ctx = multiprocessing.get_context("spawn")
    root = Path(tempfile.mkdtemp(prefix="rr-bench-", dir="/dev/shm"))
    try:
        runs: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            for key in plan(sizes, args.only):
                case, transport, pool, size = key
                row = attempt(lambda key=key: measure(ctx, root, *key, duration,
                                                      args.timeout))
                row.update(case=case, transport=transport, size=size)
                runs.setdefault(key, []).append(row)
        rows = [median_row(r) for r in runs.values()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(rows))
    return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
