"""Spawn targets for tests/shmbus/client/test_reclaimed_counters.py: readers whose client the
driver times out (one stops itself inside a handler) and the reader that gets their counter
ids next. Messages carry a sequence and its crc32."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import struct
import time
import zlib

import shmbus
from shmbus.shm.counters import SUB_POS

STREAM = 5
MESSAGE = struct.Struct("<QI")  # sequence, crc32 of the sequence's bytes


def _wait_for_image(subscription: shmbus.Subscription, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not subscription.images:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no image within {timeout} s")
        time.sleep(0.01)


def message(seq: int) -> bytes:
    return MESSAGE.pack(seq, zlib.crc32(struct.pack("<Q", seq)))


def check(data: bytes) -> int:
    """The sequence number of a whole, uncorrupted message; -1 otherwise."""
    if len(data) != MESSAGE.size:
        return -1
    seq, crc = MESSAGE.unpack(data)
    return seq if crc == zlib.crc32(data[:8]) else -1


def counter_ids(bus: shmbus.Client, subscription: shmbus.Subscription) -> set[int]:
    """The client's heartbeat counter and the subscription's sub-pos counters."""
    found = {c.counter_id for c in bus.counters.counters()
             if c.type_id == SUB_POS and c.registration_id == subscription.registration_id}
    return found | {bus.heartbeat_counter_id}


def stopping_reader(context: shmbus.Context, stop_at: int, report: mp.Queue) -> None:
    """Reads in order and stops itself (SIGSTOP) inside the handler of message ``stop_at``;
    once resumed, reports how its polls ended and what each delivered after the stop."""
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription("aeron:ipc", STREAM)
        _wait_for_image(subscription)
        report.put(counter_ids(bus, subscription))
        seen: list[tuple[int, int]] = []  # (poll number, sequence)
        polls = 0

        def handler(buffer: memoryview, header: shmbus.Header) -> None:
            seq = check(bytes(buffer))
            seen.append((polls, seq))
            if seq == stop_at:
                os.kill(os.getpid(), signal.SIGSTOP)

        deadline = time.monotonic() + 60
        outcome = "no error"
        try:
            while time.monotonic() < deadline:
                polls += 1
                subscription.poll(handler, 16, timeout=0.1)
        except shmbus.ClientTimeoutError:
            outcome = "ClientTimeoutError"
        sequences = [seq for _, seq in seen]
        stopped = sequences.index(stop_at) if stop_at in sequences else len(seen)
        report.put((outcome, sequences[:stopped + 1] == list(range(stop_at + 1)),
                    seen[stopped][0] if stopped < len(seen) else -1, polls, seen[stopped + 1:]))


def steady_reader(context: shmbus.Context, count: int, report: mp.Queue) -> None:
    """Joins late and reads until message ``count - 1``, checking order and checksums."""
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription("aeron:ipc", STREAM)
        _wait_for_image(subscription)
        report.put(counter_ids(bus, subscription))
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while (not seen or seen[-1] < count - 1) and time.monotonic() < deadline:
            subscription.poll(lambda buffer, header: seen.append(check(bytes(buffer))), 64,
                              timeout=0.1)
        report.put(seen)
