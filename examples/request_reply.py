"""Request/reply on the bus: three responder processes serve "square", the parent calls it.

Each call goes to one responder (the pool shares the requests) and its reply only to the
caller, matched by correlation id: from threads sharing one requester, pipelined with
submit(), and from asyncio. A handler that raises is an answer too: the caller gets
RemoteError naming the remote exception.

    .venv/bin/python examples/request_reply.py
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import struct
import threading
from typing import Any

import shmbus

SERVICE = 5001
RESPONDERS = 3
REQUEST = struct.Struct("<q")         # the number to square
REPLY = struct.Struct("<qqi")         # the number, its square, the responder's pid


def square(request: bytes) -> bytes:
    (n,) = REQUEST.unpack(request)
    if n < 0:
        raise ValueError(f"no negative numbers here: {n}")
    return REPLY.pack(n, n * n, os.getpid())


def responder(context: shmbus.Context, ready: Any, stop: Any) -> None:
    with shmbus.connect(context) as bus, bus.add_responder("aeron:ipc", SERVICE, square) as svc:
        ready.release()
        while not stop.is_set():
            svc.serve(timeout=0.2)    # sleeps while no request comes


def main() -> None:
    spawn = mp.get_context("spawn")
    with shmbus.connect() as bus:
        ready, stop = spawn.Semaphore(0), spawn.Event()
        pool = [spawn.Process(target=responder, args=(bus.context, ready, stop))
                for _ in range(RESPONDERS)]
        for process in pool:
            process.start()
        for _ in pool:
            if not ready.acquire(timeout=60):
                raise SystemExit("a responder did not start")

        client = bus.add_requester("aeron:ipc", SERVICE)
        by_responder: dict[int, int] = {}
        wrong = 0
        lock = threading.Lock()

        def caller(start: int) -> None:
            nonlocal wrong
            for n in range(start, start + 1000):
                got, result, pid = REPLY.unpack(client.request(REQUEST.pack(n), timeout=5))
                with lock:
                    wrong += (got, result) != (n, n * n)
                    by_responder[pid] = by_responder.get(pid, 0) + 1

        threads = [threading.Thread(target=caller, args=(i * 1000,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        calls = [client.submit(REQUEST.pack(n)) for n in range(100)]     # 100 in flight
        wrong += sum(REPLY.unpack(call.result())[1] != n * n for n, call in enumerate(calls))

        async def ask() -> list[bytes]:
            return await asyncio.gather(*(client.request_async(REQUEST.pack(n))
                                          for n in range(50)))

        wrong += sum(REPLY.unpack(r)[1] != n * n for n, r in enumerate(asyncio.run(ask())))
        try:
            client.request(REQUEST.pack(-1))
        except shmbus.RemoteError as error:
            print(f"remote error: {error.remote}")
        stop.set()
        for process in pool:
            process.join(10)
        client.close()
    print(f"{4000 + 100 + 50} calls answered, {wrong} wrong; per responder: "
          f"{sorted(by_responder.values())}")


if __name__ == "__main__":
    main()
