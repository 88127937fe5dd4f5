"""Spawn targets for the end-to-end netbridge tests (top-level, importable functions)."""

from __future__ import annotations

import time
import zlib

import shmbus


def message(sequence: int) -> bytes:
    """Message ``sequence``: mostly small, every 1000th fragmented; (sequence, crc32, body)."""
    size = 3000 if sequence % 1000 == 999 else 8 + (sequence * 37) % 120
    body = (sequence.to_bytes(8, "little") * (size // 8 + 1))[:size]
    return sequence.to_bytes(8, "little") + zlib.crc32(body).to_bytes(4, "little") + body


def publish(context: shmbus.Context, channel: str, stream_id: int, count: int,
            timeout: float) -> int:
    """Publish ``count`` messages once connected; returns how many were published."""
    deadline = time.monotonic() + timeout
    idle = shmbus.BackoffIdleStrategy()
    with shmbus.connect(context) as bus:
        publication = bus.add_exclusive_publication(channel, stream_id)
        sequence = 0
        while sequence < count and time.monotonic() < deadline:
            result = publication.offer(message(sequence))
            if result > 0:
                sequence += 1
                idle.reset()
            elif result == shmbus.ADMIN_ACTION:
                continue
            else:
                idle.idle(0)
        # stay until the bridge has sent everything (the subscriber says when it is done)
        while time.monotonic() < deadline and not publication.is_closed:
            time.sleep(0.05)
            if publication.position() <= _sent(bus, publication):
                break
        return sequence


def _sent(bus: shmbus.Client, publication: shmbus.Publication) -> int:
    from shmbus.counters import SND_POS

    for counter in bus.counters.counters():
        if counter.type_id == SND_POS and counter.reference_id == publication.session_id:
            return counter.value
    return -1


def subscribe(context: shmbus.Context, channel: str, stream_id: int, count: int,
              timeout: float, ready) -> dict[str, int]:  # noqa: ANN001
    """Receive until ``count`` messages or timeout; check each one; return a summary."""
    summary = {"received": 0, "out_of_order": 0, "bad_checksum": 0, "images": 0}
    expected = 0

    def on_message(buffer: memoryview, header: shmbus.Header) -> None:
        nonlocal expected
        data = bytes(buffer)
        sequence = int.from_bytes(data[:8], "little")
        crc = int.from_bytes(data[8:12], "little")
        if zlib.crc32(data[12:]) != crc or data[12:] != message(sequence)[12:]:
            summary["bad_checksum"] += 1
        if sequence != expected:
            summary["out_of_order"] += 1
        expected = sequence + 1
        summary["received"] += 1

    deadline = time.monotonic() + timeout
    idle = shmbus.BackoffIdleStrategy()
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(
            channel, stream_id, on_available_image=lambda image: summary.__setitem__(
                "images", summary["images"] + 1))
        ready.set()
        assembler = shmbus.FragmentAssembler(on_message)
        while summary["received"] < count and time.monotonic() < deadline:
            idle.idle(subscription.poll(assembler, 256))
    return summary
