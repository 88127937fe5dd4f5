"""A late joiner: what it missed from the recording, then live, with no gap and no duplicate.

A publisher process writes numbered ticks without pause and a recorder process records the
stream. A while later this process subscribes with ``history=shmbus.Recording(dir)`` from the
start: it gets every recorded tick, then the live ones, and checks that the numbers run on by
one across the seam.

    .venv/bin/python examples/late_joiner.py
"""

from __future__ import annotations

import multiprocessing as mp
import struct
import tempfile
import time
from typing import Any

import shmbus

STREAM = 4001
TICK = struct.Struct("<qd")  # number, time


def publisher(context: shmbus.Context, stop: Any) -> None:
    with shmbus.connect(context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", STREAM)
        n = 0
        while not stop.is_set():
            if pub.offer(TICK.pack(n, time.time())) > 0:
                n += 1
            else:
                time.sleep(0.0001)  # back-pressured, or nobody subscribes yet


def recorder(context: shmbus.Context, directory: str, stop: Any) -> None:
    with shmbus.connect(context) as bus, bus.add_recorder(directory, "aeron:ipc", STREAM) as rec:
        rec.run(stop=stop)


def read_ticks(bus: shmbus.Client, directory: str) -> tuple[int, int]:
    """Join from the start; check the tick numbers run on by one; (replayed, live) counts."""
    replayed = live = 0
    expected = 0

    def on_tick(payload: memoryview, info: shmbus.MessageInfo) -> None:
        nonlocal replayed, live, expected
        n, _ = TICK.unpack(payload)
        assert n == expected, f"tick {n} came where {expected} was due"
        expected += 1
        if info.replayed:
            replayed += 1
        else:
            live += 1

    # catch_up: a publisher faster than this reader would keep the replay chasing it; after
    # 2 s the live subscription joins anyway and holds the publisher until the replay
    # reaches it
    with bus.add_subscription("aeron:ipc", STREAM, history=shmbus.Recording(directory),
                              from_position="start", catch_up=2.0) as sub:
        deadline = time.monotonic() + 60
        while live < 20_000 and time.monotonic() < deadline:
            if not sub.poll(on_tick, 4096):
                time.sleep(0.001)
    return replayed, live


def main() -> None:
    spawn = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as directory, shmbus.connect() as bus:
        stop = spawn.Event()
        processes = [spawn.Process(target=recorder, args=(bus.context, directory, stop)),
                     spawn.Process(target=publisher, args=(bus.context, stop))]
        for process in processes:
            process.start()
        try:
            time.sleep(2)  # the stream runs without us for a while
            replayed, live = read_ticks(bus, directory)
        finally:
            stop.set()
            for process in processes:
                process.join(10)
    assert live >= 20_000, f"only {live} live ticks in 60 s"
    print(f"{replayed} ticks from the recording, then {live} live: every number once, in order")


if __name__ == "__main__":
    main()
