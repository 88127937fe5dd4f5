"""The peers the benchmarks measure shmbus beside, as member functions (each runs in a spawned
member process, see harness.run_processes): multiprocessing.Queue and Pipe, posix_ipc message
queues, pyzmq (PAIR over ipc:// and its asyncio API; PUSH/PULL and PAIR over tcp://),
iceoryx2 and eclipse-zenoh (pub/sub between two peer sessions over tcp loopback, reliable,
congestion control BLOCK). A missing package raises ImportError in the member: the row reads "n/a".

On one host (ipc.py) a link is made in the parent (make_peer_link) and each member opens its
end (open_peer) as send / recv / close; messages are harness.Checked, sent and checked a round
at a time (tools/bench/rounds.py, every byte checked). Over TCP (netbridge.py) messages are
harness.Checked (sequence number and CRC-32 of every byte, checked per message), optionally
with CURVE security (curve_keys, CurveKeys).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.bench.harness import (
    RTT_SIZE,
    STOP,
    BenchError,
    Checked,
    Unavailable,
    async_round_trips,
    deadline_after,
    ping_loop,
    ping_or_pong,
    pong_loop,
)
from tools.bench.rounds import Rounds
from tools.bench.user_loop import Consumer, write

QUEUE = "mp.Queue"
PIPE = "mp.Pipe"
POSIX = "posix_ipc MessageQueue"
ZMQ = "zmq PAIR ipc://"
ICEORYX = "iceoryx2"
ZENOH = "zenoh pub/sub tcp loopback"
QUEUE_DEPTH = 1024  # mp.Queue maxsize, iceoryx2 subscriber buffer: bounded like a log window


# ---------------------------------------------------------------------------------------------
# On one host: one process's end of a link, as send / recv / close
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerEnd:
    """Where one process sends (tx) and receives (rx); made in the parent."""

    kind: str
    tx: Any = None
    rx: Any = None
    bind: bool = False  # zmq: this end binds; zenoh: this end's session listens
    endpoint: str = ""  # zenoh: the listening session's locator


def make_peer_link(ctx: Any, kind: str, root: Path, name: str,
                   two_way: bool) -> tuple[PeerEnd, PeerEnd, Callable[[], None]]:
    """(a, b, cleanup): a sends to b, and with two_way b sends back to a."""
    if kind == QUEUE:
        fwd = ctx.Queue(maxsize=QUEUE_DEPTH)
        back = ctx.Queue(maxsize=QUEUE_DEPTH) if two_way else None
        return PeerEnd(kind, fwd, back), PeerEnd(kind, back, fwd), lambda: None
    if kind == PIPE:
        fwd_r, fwd_w = ctx.Pipe(duplex=False)
        back_r, back_w = ctx.Pipe(duplex=False) if two_way else (None, None)
        return PeerEnd(kind, fwd_w, back_r), PeerEnd(kind, back_w, fwd_r), lambda: None
    if kind == POSIX:
        import posix_ipc

        names = [f"/shmbus-bench-{os.getpid()}-{name}-{d}" for d in ("f", "b")[:1 + two_way]]
        for n in names:
            posix_ipc.MessageQueue(n, posix_ipc.O_CREX).close()

        def cleanup() -> None:
            for n in names:
                with contextlib.suppress(posix_ipc.ExistentialError):
                    posix_ipc.unlink_message_queue(n)

        back = names[1] if two_way else None
        return PeerEnd(kind, names[0], back), PeerEnd(kind, back, names[0]), cleanup
    if kind == ZMQ:
        endpoint = f"ipc://{root}/{name}.zmq"
        return (PeerEnd(kind, endpoint, endpoint if two_way else None),
                PeerEnd(kind, endpoint if two_way else None, endpoint, bind=True), lambda: None)
    if kind == ICEORYX:
        fwd, back = f"shmbus-bench/{os.getpid()}/{name}/f", f"shmbus-bench/{os.getpid()}/{name}/b"
        back_name = back if two_way else None
        return PeerEnd(kind, fwd, back_name), PeerEnd(kind, back_name, fwd), lambda: None
    if kind == ZENOH:
        with socket.socket() as probe:  # a free port for the reader's session to listen on
            probe.bind(("127.0.0.1", 0))
            endpoint = f"tcp/127.0.0.1:{probe.getsockname()[1]}"
        fwd, back = f"shmbus-bench/{os.getpid()}/{name}/f", f"shmbus-bench/{os.getpid()}/{name}/b"
        back_key = back if two_way else None
        return (PeerEnd(kind, fwd, back_key, endpoint=endpoint),
                PeerEnd(kind, back_key, fwd, bind=True, endpoint=endpoint), lambda: None)
    raise ValueError(f"unknown peer {kind!r}")


def open_peer(end: PeerEnd, size: int, timeout_s: float
              ) -> tuple[Callable[[Any], Any], Callable[[], bytes], Callable[[], None]]:
    """(send, recv, close) of this end, in the member's process; recv returns bytes."""
    if end.kind == QUEUE:
        return (end.tx.put if end.tx is not None else None,
                end.rx.get if end.rx is not None else _no_recv, lambda: None)
    if end.kind == PIPE:
        return (end.tx.send_bytes if end.tx is not None else None,
                end.rx.recv_bytes if end.rx is not None else _no_recv, lambda: None)
    if end.kind == POSIX:
        return _open_posix(end, timeout_s)
    if end.kind == ZMQ:
        return _open_zmq(end, timeout_s)
    if end.kind == ICEORYX:
        return _open_iceoryx(end, size, timeout_s)
    if end.kind == ZENOH:
        return _open_zenoh(end, timeout_s)
    raise ValueError(f"unknown peer {end.kind!r}")


def _no_recv() -> bytes:
    raise BenchError("this end does not receive")


def _open_posix(end: PeerEnd, timeout_s: float) -> Any:
    import posix_ipc

    txq = posix_ipc.MessageQueue(end.tx) if end.tx else None
    rxq = posix_ipc.MessageQueue(end.rx) if end.rx else None

    def send(message: Any) -> None:
        txq.send(message, timeout_s)

    def recv() -> bytes:
        return rxq.receive(timeout_s)[0]

    def close() -> None:
        for q in (txq, rxq):
            if q is not None:
                q.close()

    return send, recv, close


def _open_zmq(end: PeerEnd, timeout_s: float) -> Any:
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.PAIR)
    ms = int(timeout_s * 1000)
    for option in (zmq.LINGER, zmq.SNDTIMEO, zmq.RCVTIMEO):
        sock.setsockopt(option, ms)
    # connected, both ways, before the clock starts
    if end.bind:
        sock.bind(end.tx or end.rx)
        if sock.recv() != b"hello":
            raise BenchError("zmq: no hello")
        sock.send(b"hello")
    else:
        sock.connect(end.tx or end.rx)
        sock.send(b"hello")
        if sock.recv() != b"hello":
            raise BenchError("zmq: no hello back")

    def close() -> None:
        sock.close()
        context.term()

    return sock.send, sock.recv, close


def iceoryx_node() -> tuple[Any, Any]:
    """(the iceoryx2 module, an IPC node of this process), iceoryx2 logging only errors unless
    its environment sets a level; Unavailable without the iceoryx2 package."""
    try:
        import iceoryx2 as iox2
    except ImportError as e:
        raise Unavailable(f"iceoryx2 not installed: {e}") from None
    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
    return iox2, iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)


def _open_iceoryx(end: PeerEnd, size: int, timeout_s: float) -> Any:
    iox2, node = iceoryx_node()

    def service(name: str) -> Any:
        # no loss: a full subscriber buffer makes the publisher retry (back-pressure)
        return (node.service_builder(iox2.ServiceName.new(name))
                .publish_subscribe(iox2.Slice[ctypes.c_uint8])
                .enable_safe_overflow(False).subscriber_max_buffer_size(QUEUE_DEPTH)
                .max_publishers(1).max_subscribers(1).open_or_create())

    ports: list[Any] = []
    send: Any = None
    recv: Any = _no_recv
    if end.rx:  # subscribers first: each side's publisher then waits for the other's
        subscriber = service(end.rx).subscriber_builder().buffer_size(QUEUE_DEPTH).create()
        ports.append(subscriber)
        receive = subscriber.receive
        deadline_rx = deadline_after(timeout_s + 60)

        def recv() -> bytes:
            spins = 0
            while True:
                sample = receive()
                if sample is not None:
                    data = bytes(sample.payload().as_memory_view())
                    sample.delete()
                    return data
                spins += 1
                if not spins & 4095 and time.monotonic_ns() > deadline_rx:
                    raise BenchError("iceoryx2: receive timed out")

    if end.tx:
        tx_service = service(end.tx)
        publisher = (tx_service.publisher_builder().initial_max_slice_len(size)
                     .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
                     .create())
        ports.append(publisher)
        loan = publisher.loan_slice_uninit

        def send(message: Any) -> None:
            sample = loan(len(message))
            ctypes.memmove(sample.payload_ptr, bytes(message), len(message))
            sample.assume_init().send()

        # a sample published before the subscriber is there would be lost: wait for it
        deadline = deadline_after(timeout_s)
        while tx_service.dynamic_config.number_of_subscribers == 0:
            if time.monotonic_ns() > deadline:
                raise BenchError("iceoryx2: no subscriber")
            time.sleep(0.002)
        publisher.update_connections()

    def close() -> None:
        for port in ports:
            port.delete()

    return send, recv, close


def _open_zenoh(end: PeerEnd, timeout_s: float) -> Any:
    import zenoh

    config = zenoh.Config()
    config.insert_json5("mode", '"peer"')
    config.insert_json5("scouting/multicast/enabled", "false")
    config.insert_json5("listen/endpoints" if end.bind else "connect/endpoints",
                        json.dumps([end.endpoint]))
    deadline = deadline_after(timeout_s)
    while True:  # the connecting end may start before the listening one
        try:
            session = zenoh.open(config)
            break
        except zenoh.ZError:
            if time.monotonic_ns() > deadline:
                raise
            time.sleep(0.01)
    recv: Any = _no_recv
    if end.rx:  # subscribers first: each side's publisher then waits for the other's
        receive = session.declare_subscriber(end.rx, zenoh.handlers.FifoChannel(QUEUE_DEPTH)).recv

        def recv() -> bytes:
            return bytes(receive().payload.to_bytes())

    send: Any = None
    if end.tx:
        publisher = session.declare_publisher(
            end.tx, congestion_control=zenoh.CongestionControl.BLOCK,
            reliability=zenoh.Reliability.RELIABLE)
        # a sample put before the subscriber is known would be dropped: wait for it
        while not publisher.matching_status.matching:
            if time.monotonic_ns() > deadline:
                raise BenchError("zenoh: no subscriber")
            time.sleep(0.002)
        put = publisher.put

        def send(message: Any) -> None:
            put(bytes(message))

    return send, recv, session.close


def peer_writer(start: Any, end: PeerEnd, size: int, duration_s: float, timeout_s: float,
                done: Any) -> dict[str, Any]:
    """Send checked messages for duration_s, then STOP, in the user's writer loop
    (user_loop.write): one call of the peer's send per message."""
    send, _, close = open_peer(end, size, timeout_s)
    rounds = Rounds(size)
    start.ready()
    try:
        out = write(send, rounds, duration_s)
    except Exception as e:
        raise BenchError(f"send failed: {e!r}") from e
    done.wait(timeout_s)  # zmq and iceoryx2 may drop what is unread when an end closes
    close()
    return out


def peer_reader(start: Any, end: PeerEnd, size: int, timeout_s: float,
                done: Any) -> dict[str, Any]:
    """Receive until STOP in the user's loop (user_loop.read): ``for message in iter(recv,
    None): consume(message)``, every message checked."""
    _, recv, close = open_peer(end, size, timeout_s)
    consumer = Consumer(Rounds(size))
    start.ready()
    try:
        stopped = consumer.read(iter(recv, None))
    except Exception as e:
        raise BenchError(f"receive failed after {consumer.tally.expected} messages: "
                         f"{e!r}") from e
    t1 = time.monotonic_ns()
    done.set()
    close()
    if not stopped:
        raise BenchError(f"the stream ended after {consumer.tally.expected} messages")
    return consumer.result(t1)


def peer_rtt(start: Any, end: PeerEnd, pinger: bool, rate: int | None, duration_s: float,
             timeout_s: float, done: Any) -> dict[str, Any]:
    """A peer's pinger (pinger=True) or ponger."""
    send, recv, close = open_peer(end, RTT_SIZE, timeout_s)
    start.ready()
    out = ping_or_pong(pinger, send, recv, duration_s, rate, done, timeout_s)
    close()
    return out


def zmq_async_rtt(start: Any, end: PeerEnd, pinger: bool, rate: int | None, duration_s: float,
                  timeout_s: float, done: Any) -> dict[str, Any]:
    """A zmq.asyncio PAIR pinger or ponger: pyzmq's own asyncio API, the peer of
    messages_async."""
    import zmq
    import zmq.asyncio

    async def main() -> dict[str, Any]:
        context = zmq.asyncio.Context()
        sock = context.socket(zmq.PAIR)
        sock.setsockopt(zmq.LINGER, int(timeout_s * 1000))
        if end.bind:  # connected, both ways, before the clock starts
            sock.bind(end.tx or end.rx)
            if await asyncio.wait_for(sock.recv(), timeout_s) != b"hello":
                raise BenchError("zmq: no hello")
            await sock.send(b"hello")
        else:
            sock.connect(end.tx or end.rx)
            await sock.send(b"hello")
            if await asyncio.wait_for(sock.recv(), timeout_s) != b"hello":
                raise BenchError("zmq: no hello back")
        start.ready()
        try:
            return await async_round_trips(pinger, sock.send, sock.recv, duration_s, rate)
        finally:
            sock.close()
            context.term()

    out = asyncio.run(main())
    if not pinger:
        done.set()
    done.wait(timeout_s)
    return out


# ---------------------------------------------------------------------------------------------
# Over TCP: pyzmq PUSH/PULL and PAIR on tcp://127.0.0.1
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurveKeys:
    """The CURVE keys of one pyzmq connection (Z85, as zmq.curve_keypair() makes them): the
    server's (the end that binds) and the client's (the end that connects). Made in the
    parent with :func:`curve_keys` and handed to both members."""

    server_public: bytes
    server_secret: bytes = field(repr=False)
    client_public: bytes = b""
    client_secret: bytes = field(default=b"", repr=False)


def curve_keys() -> CurveKeys:
    """Fresh server and client key pairs; Unavailable when pyzmq or its libzmq lacks CURVE."""
    try:
        import zmq
    except ImportError as e:
        raise Unavailable(f"pyzmq: {e}") from None
    if not zmq.has("curve"):
        raise Unavailable(f"libzmq {zmq.zmq_version()} was built without CURVE")
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return CurveKeys(server_public, server_secret, client_public, client_secret)


def _zmq_socket(kind: str, endpoint: str, bind: bool, timeout_s: float,
                curve: CurveKeys | None = None) -> tuple[Any, Any]:
    """A pyzmq socket of ``kind`` bound to (bind) or connected to ``endpoint``, with timeouts;
    with ``curve``, CURVE security set before it binds (the server) or connects (the client)."""
    import zmq

    zctx = zmq.Context()
    sock = zctx.socket(getattr(zmq, kind))
    ms = int(timeout_s * 1000)
    sock.setsockopt(zmq.LINGER, ms)
    sock.setsockopt(zmq.SNDTIMEO, ms)
    sock.setsockopt(zmq.RCVTIMEO, ms)
    if curve is not None and bind:
        sock.curve_server = True
        sock.curve_secretkey = curve.server_secret
        sock.curve_publickey = curve.server_public
    elif curve is not None:
        sock.curve_serverkey = curve.server_public
        sock.curve_publickey = curve.client_public
        sock.curve_secretkey = curve.client_secret
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    return zctx, sock


def zmq_push_writer(start: Any, endpoint: str, size: int, duration_s: float,
                    timeout_s: float, done: Any, curve: CurveKeys | None = None
                    ) -> dict[str, Any]:
    """PUSH (connects; with ``curve`` a CURVE client) size-byte Checked messages (sequence
    number and CRC-32, harness.Checked) for duration_s, then STOP: sent, t0."""
    zctx, sock = _zmq_socket("PUSH", endpoint, False, timeout_s, curve)
    send = sock.send
    send(b"hello")  # connected (and, with CURVE, the handshake done) before the clock starts
    messages = Checked(size)
    write = messages.write
    message = messages.message()
    start.ready()
    t0 = time.monotonic_ns()
    end_ns = t0 + int(duration_s * 1e9)
    seq = 0
    try:
        while True:
            write(message, seq)
            send(message)
            seq += 1
            if not seq & 127 and time.monotonic_ns() >= end_ns:
                break
        write(message, STOP)
        send(message)
    except Exception as e:
        raise BenchError(f"send failed after {seq} messages: {e!r}") from e
    done.wait(timeout_s)
    sock.close()
    zctx.term()
    return {"sent": seq, "t0": t0}


def zmq_pull_reader(start: Any, endpoint: str, size: int, timeout_s: float,
                    done: Any, curve: CurveKeys | None = None) -> dict[str, Any]:
    """PULL (binds; with ``curve`` a CURVE server) until STOP, checking every message's
    sequence number and CRC-32 (recv(copy=False) from 4 KiB): received, errors, first_bad,
    t1."""
    zctx, sock = _zmq_socket("PULL", endpoint, True, timeout_s, curve)
    sock_recv = sock.recv
    if sock_recv() != b"hello":
        raise BenchError("no hello")
    if size >= 4096:
        def recv() -> Any:
            return sock_recv(copy=False)
    else:
        recv = sock_recv
    check = Checked(size).check
    start.ready()
    expected = errors = 0
    first_bad = None
    try:
        while True:
            seq, ok = check(recv())
            if seq == expected and ok:
                expected += 1
            elif seq == STOP and ok:
                break
            else:
                errors += 1
                first_bad = first_bad or f"expected {expected}, got {seq} (CRC ok: {ok})"
                expected = seq + 1
    except Exception as e:
        raise BenchError(f"receive failed after {expected} messages: {e!r}") from e
    t1 = time.monotonic_ns()
    done.set()
    sock.close()
    zctx.term()
    return {"received": expected, "errors": errors, "first_bad": first_bad, "t1": t1}


def zmq_tcp_rtt(start: Any, endpoint: str, pinger: bool, rate: int | None, duration_s: float,
                timeout_s: float, done: Any, curve: CurveKeys | None = None,
                checked: bool = False) -> dict[str, Any]:
    """A PAIR pinger (pinger=True: connects; harness.ping_loop at ``rate`` pings a second,
    None: back-to-back) or ponger (binds; harness.pong_loop) over tcp://, a hello each way
    before the clock starts; with ``curve`` CURVE security (the ponger the server), with
    ``checked`` Checked pings (sequence number and CRC-32, see harness.ping_loop)."""
    zctx, sock = _zmq_socket("PAIR", endpoint, not pinger, timeout_s, curve)
    send, recv = sock.send, sock.recv
    if pinger:
        send(b"hello")
    if recv() != b"hello":
        raise BenchError("no hello")
    if not pinger:
        send(b"hello")
    start.ready()
    out = (ping_loop(send, recv, duration_s, rate, checked) if pinger
           else pong_loop(send, recv, checked))
    if not pinger:
        done.set()
    done.wait(timeout_s)
    sock.close()
    zctx.term()
    return out
