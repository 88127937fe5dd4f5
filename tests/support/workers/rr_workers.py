"""Spawn targets for tests/shmbus/calls/test_request_reply.py: responders and requesters.

Each runs in a process of its own (multiprocessing "spawn"), connects with the Context it is
given and reports through a multiprocessing queue as dicts (``kind`` says which report).
Loops are bounded by deadlines.

A request is ``HEAD = (requester u16, thread u16, seq u32, crc32(body) u32)`` then a body;
the reply is the request with every body byte XOR 0x5A, then the responder's pid (u32), so a
requester checks that the reply answers exactly its request, byte for byte. A body starting
with ``b"raise"`` makes the handler raise ValueError; ``b"hang"`` makes it report
``in-hand`` and sleep (a test kills it meanwhile); ``b"slow"`` makes it sleep 0.5 s.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from typing import Any

import shmbus

CHANNEL = "aeron:ipc"
HEAD = struct.Struct("<HHII")
PID = struct.Struct("<I")


def make_request(requester: int, thread: int, seq: int, size: int) -> bytes:
    body = bytes((seq * 7 + i * 13 + requester) & 0xFF for i in range(max(0, size - HEAD.size)))
    return HEAD.pack(requester, thread, seq, zlib.crc32(body)) + body


def make_command(requester: int, seq: int, body: bytes) -> bytes:
    """A request whose body tells the handler what to do (``raise``, ``hang``, ``slow``)."""
    return HEAD.pack(requester, 0, seq, zlib.crc32(body)) + body


def answer(request: bytes) -> bytes:
    """The reply a responder gives: the body XOR 0x5A, then its pid."""
    head, body = request[:HEAD.size], request[HEAD.size:]
    return head + bytes(b ^ 0x5A for b in body) + PID.pack(os.getpid())


def check_reply(request: bytes, reply: bytes) -> int:
    """The pid of the responder that answered ``request`` with ``reply``; AssertionError if
    the reply does not answer exactly that request."""
    head, body = request[:HEAD.size], request[HEAD.size:]
    assert reply[:HEAD.size] == head, "reply to another request"
    assert len(reply) == len(request) + PID.size, f"reply length {len(reply)}"
    got = bytes(b ^ 0x5A for b in reply[HEAD.size:-PID.size])
    assert zlib.crc32(got) == HEAD.unpack_from(head)[3] and got == body, "reply body"
    return int(PID.unpack_from(reply, len(reply) - PID.size)[0])


def responder(context: shmbus.Context, stream_id: int, results: Any, seconds: float,
              name: str = "responder", channel: str = CHANNEL) -> None:
    """Serve ``stream_id`` on ``channel`` for ``seconds``; report ``ready``, then ``served``
    with the count."""
    def handler(request: bytes) -> bytes:
        body = request[HEAD.size:]
        if body.startswith(b"raise"):
            raise ValueError(f"refused {body[:10]!r}")
        if body.startswith(b"hang"):
            results.put({"kind": "in-hand", "name": name, "pid": os.getpid()})
            time.sleep(60)  # parked with the request in hand, until the test kills it
        if body.startswith(b"slow"):
            time.sleep(0.5)  # a slow handler: what the test times its calls against
        return answer(request)

    with shmbus.connect(context) as bus, bus.add_responder(channel, stream_id, handler) as svc:
        results.put({"kind": "ready", "name": name, "pid": os.getpid()})
        served = svc.serve(timeout=seconds)
        results.put({"kind": "served", "name": name, "pid": os.getpid(), "served": served})


def requester(context: shmbus.Context, stream_id: int, results: Any, index: int,
              threads: int, calls: int, size: int, pipeline: int = 1,
              channel: str = CHANNEL) -> None:
    """``threads`` threads share one requester, each making ``calls`` calls (``pipeline`` in
    flight at a time with submit()); report ``calls`` with the per-responder tallies and any
    problem."""
    problems: list[str] = []
    by_pid: dict[int, int] = {}
    lock = threading.Lock()
    with shmbus.connect(context) as bus, bus.add_requester(channel, stream_id) as client:
        def run(thread: int) -> None:
            seq = 0
            while seq < calls:
                batch = [make_request(index, thread, s, size)
                         for s in range(seq, min(calls, seq + pipeline))]
                futures = [client.submit(r, timeout=30.0) for r in batch]
                for request, future in zip(batch, futures, strict=True):
                    try:
                        pid = check_reply(request, future.result())
                    except (AssertionError, shmbus.ShmbusError) as error:
                        with lock:
                            problems.append(f"{HEAD.unpack_from(request)[:3]}: {error!r}")
                        continue
                    with lock:
                        by_pid[pid] = by_pid.get(pid, 0) + 1
                seq += len(batch)

        workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        results.put({"kind": "calls", "index": index, "by_pid": by_pid,
                     "problems": problems[:20], "problem_count": len(problems),
                     "in_flight": client.in_flight})


def hanging_requester(context: shmbus.Context, stream_id: int, results: Any, calls: int
                      ) -> None:
    """Submit ``calls`` slow requests, report ``submitted``, then wait to be killed."""
    with shmbus.connect(context) as bus, bus.add_requester(CHANNEL, stream_id) as client:
        futures = [client.submit(make_command(9, s, b"slow"), timeout=60)
                   for s in range(calls)]
        results.put({"kind": "submitted", "pid": os.getpid(), "calls": len(futures)})
        time.sleep(60)  # parked with its calls in flight, until the test kills it
