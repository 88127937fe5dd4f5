"""Spawn target for tests/shmbus/shm/test_broadcast.py: a transmitter in another process,
paced so that the test's slow receiver is lapped."""

from __future__ import annotations

import mmap
import struct
import time
import zlib

from shmbus import AtomicBuffer
from shmbus.shm.broadcast import BroadcastTransmitter, broadcast_buffer_length

MSG_TYPE = 7
MP_CAPACITY = 4096
#: each message: its sequence number and the crc32 of its body
PREFIX = struct.Struct("<qI")


def transmit(path: str, count: int, start_flag_offset: int) -> None:
    """Child process: wait for the go flag, then transmit ``count`` checksummed messages."""
    with open(path, "r+b") as f:
        memory = mmap.mmap(f.fileno(), 0)
    buffer = AtomicBuffer(memory)
    transmitter = BroadcastTransmitter(buffer, 0, broadcast_buffer_length(MP_CAPACITY))
    deadline = time.monotonic() + 20
    while buffer.get_int64_acquire(start_flag_offset) == 0:
        if time.monotonic() > deadline:
            raise SystemExit(3)
        time.sleep(0.001)
    for seq in range(count):
        body = bytes([seq % 251]) * (seq % 97)
        transmitter.transmit(MSG_TYPE, PREFIX.pack(seq, zlib.crc32(body)) + body)
        if seq % 100 == 99:
            time.sleep(0.0005)                 # paced, so the receiver is lapped many times
    buffer.release()
    memory.close()
