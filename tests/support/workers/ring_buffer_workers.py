"""Spawn target for tests/shmbus/shm/test_ring_buffer.py: producers writing checksummed
messages into one ManyToOneRingBuffer from processes of their own."""

from __future__ import annotations

import mmap
import os
import random
import struct
import time
import zlib

from shmbus import AtomicBuffer
from shmbus.shm.ring_buffer import ManyToOneRingBuffer

MP_CAPACITY = 64 * 1024
#: each message: producer, sequence, crc32 of both and the body
PREFIX = struct.Struct("<iiI")


def message_of(producer_id: int, seq: int, rng: random.Random) -> bytes:
    body = rng.randbytes(rng.randrange(0, 48))
    crc = zlib.crc32(struct.pack("<ii", producer_id, seq) + body)
    return PREFIX.pack(producer_id, seq, crc) + body


def produce(path: str, producer_id: int, count: int, timeout_s: float) -> None:
    """Child process: write ``count`` messages, backing off while the ring is full."""
    deadline = time.monotonic() + timeout_s
    with open(path, "r+b") as f:
        memory = mmap.mmap(f.fileno(), 0)
    buffer = AtomicBuffer(memory)
    ring = ManyToOneRingBuffer(buffer)
    rng = random.Random(producer_id)
    for seq in range(count):
        message = message_of(producer_id, seq, rng)
        failures = 0
        while not ring.write(producer_id + 1, message):
            failures += 1
            if failures & 0xFF == 0 and time.monotonic() > deadline:
                raise SystemExit(3)
            if failures < 20:
                os.sched_yield()
            else:
                time.sleep(0.0002)
    buffer.release()
    memory.close()
