"""A tiny pub/sub against an installed shmbus: how a built wheel shows that it works.

``python -P wheel_smoke.py`` (-P: the script's folder, tests/, whose shmbus/ is the tests'
package, does not go on sys.path), by tests/test_packaging.py in a fresh venv and by
cibuildwheel's test-command. This process starts an embedded driver in a temporary bus directory
and publishes 1,000 messages of 1 to 2,000 bytes (the larger ones fragmented); a spawned
subscriber process receives them. Prints where shmbus and its C extensions were loaded from, then
"1000 messages received exactly" and exits 0 when every message arrived once, in order and
intact and the driver then exited by itself; otherwise exits 1 saying what went wrong.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import shmbus
from netbridge import _io
from shmbus.shm import _native

STREAM = 1001
COUNT = 1000


def message(sequence: int) -> bytes:
    """Message ``sequence``: 1 + sequence * 7 % 2000 bytes (a length no other message has)."""
    return bytes((sequence + i) % 251 for i in range(1 + sequence * 7 % 2000))


def subscribe(context: shmbus.Context, results: mp.Queue) -> None:
    """The subscriber process: says it is ready, then sends back the messages it received."""
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription("aeron:ipc", STREAM)
        results.put("ready")
        received = []
        for payload in subscription.messages(timeout=10):
            received.append(payload)
            if len(received) == COUNT:
                break
        results.put(received)


def main() -> int:
    print(f"shmbus from {shmbus.__file__}")
    print(f"native core from {_native.__file__}")
    print(f"netbridge natives from {_io.__file__}")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="shmbus-wheel-smoke-", dir=shm) as tmp:
        bus_dir = Path(tmp) / "bus"
        received = _exchange(bus_dir)
        # An embedded driver exits by itself once idle, removing its cnc file.
        deadline = time.monotonic() + 10
        while (bus_dir / "cnc.dat").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if (bus_dir / "cnc.dat").exists():
            print("the embedded driver did not exit within 10 s of its last client")
            return 1
    expected = [message(sequence) for sequence in range(COUNT)]
    if received != expected:
        wrong = [i for i in range(min(len(received), COUNT)) if received[i] != expected[i]]
        print(f"received {len(received)} of {COUNT} messages; wrong ones: {wrong[:10]}")
        return 1
    print(f"{COUNT} messages received exactly")
    return 0


def _exchange(bus_dir: Path) -> list[bytes]:
    """Publish the messages to a spawned subscriber; returns what it received."""
    spawn = mp.get_context("spawn")
    with shmbus.connect(dir=str(bus_dir), driver_idle_timeout=0.5) as bus:
        results = spawn.Queue()
        subscriber = spawn.Process(target=subscribe, args=(bus.context, results))
        subscriber.start()
        try:
            results.get(timeout=60)  # "ready": subscribed
            publication = bus.add_publication("aeron:ipc", STREAM)
            for sequence in range(COUNT):
                publication.publish(message(sequence), timeout=10)
            return results.get(timeout=60)
        finally:
            subscriber.join(timeout=30)
            if subscriber.is_alive():
                subscriber.kill()


if __name__ == "__main__":
    sys.exit(main())
