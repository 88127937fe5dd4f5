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
            timeout: float, rate: float = 0.0) -> int:
    """Publish ``count`` messages once connected (at most ``rate`` a second when given);
    returns how many were published."""
    deadline = time.monotonic() + timeout
    with shmbus.connect(context) as bus:
        publication = bus.add_exclusive_publication(channel, stream_id)
        sequence = publish_range(publication, 0, count, deadline, rate)
        # stay until the bridge has sent everything (the subscriber says when it is done)
        while time.monotonic() < deadline and not publication.is_closed:
            time.sleep(0.05)
            if publication.position <= _sent(bus, publication):
                break
        return sequence


def publish_range(publication: shmbus.Publication, start: int, stop: int, deadline: float,
                  rate: float = 0.0) -> int:
    """Offer messages ``start`` .. ``stop - 1`` from this process until ``deadline``
    (time.monotonic()), at most ``rate`` a second when given; returns the next sequence."""
    idle = shmbus.idle_strategies.BackoffIdleStrategy()
    began = time.monotonic()
    sequence = start
    while sequence < stop and time.monotonic() < deadline:
        if rate and sequence % 100 == 0:
            ahead = began + (sequence - start) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        result = publication.offer(message(sequence))
        if result > 0:
            sequence += 1
            idle.reset()
        elif result == shmbus.codes.ADMIN_ACTION:
            continue
        else:
            idle.idle(0)
    return sequence


def wait_sent(bus: shmbus.Client, publication: shmbus.Publication, timeout: float) -> bool:
    """Wait until the netbridge has sent everything published (snd-pos reached the
    publication's position); False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _sent(bus, publication) >= publication.position:
            return True
        time.sleep(0.01)
    return False


def _sent(bus: shmbus.Client, publication: shmbus.Publication) -> int:
    from shmbus.shm.counters import SND_POS

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
    idle = shmbus.idle_strategies.BackoffIdleStrategy()
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(
            channel, stream_id, on_available_image=lambda image: summary.__setitem__(
                "images", summary["images"] + 1))
        ready.set()
        assembler = shmbus.FragmentAssembler(on_message)
        while summary["received"] < count and time.monotonic() < deadline:
            idle.idle(subscription.poll(assembler, 256))
    return summary


def subscribe_sessions(context: shmbus.Context, channel: str, stream_id: int, count: int,
                       timeout: float, ready) -> dict[int, dict[str, int]]:  # noqa: ANN001
    """Receive until ``count`` messages in all, or timeout; check each one against its own
    publisher's sequence (one per session); return a summary per session."""
    summaries: dict[int, dict[str, int]] = {}
    expected: dict[int, int] = {}
    total = 0

    def on_message(buffer: memoryview, header: shmbus.Header) -> None:
        nonlocal total
        summary = summaries.setdefault(
            header.session_id, {"received": 0, "out_of_order": 0, "bad_checksum": 0})
        data = bytes(buffer)
        sequence = int.from_bytes(data[:8], "little")
        crc = int.from_bytes(data[8:12], "little")
        if zlib.crc32(data[12:]) != crc or data[12:] != message(sequence)[12:]:
            summary["bad_checksum"] += 1
        if sequence != expected.get(header.session_id, 0):
            summary["out_of_order"] += 1
        expected[header.session_id] = sequence + 1
        summary["received"] += 1
        total += 1

    deadline = time.monotonic() + timeout
    idle = shmbus.idle_strategies.BackoffIdleStrategy()
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(channel, stream_id)
        ready.set()
        assembler = shmbus.FragmentAssembler(on_message)
        while total < count and time.monotonic() < deadline:
            idle.idle(subscription.poll(assembler, 256))
    return summaries


def receive(context: shmbus.Context, channel: str, stream_id: int, count: int, timeout: float,
            ready, stop=None, sleep: float = 0.0,  # noqa: ANN001
            fragment_limit: int = 256, catch_up: bool = False) -> dict[str, int]:
    """Receive until message ``count - 1`` arrived, ``stop`` (an Event) is set, or timeout.

    ``sleep`` > 0 makes a slow subscriber: it sleeps that long after each poll of at most
    ``fragment_limit`` fragments (with ``catch_up``, only until an image goes unavailable;
    from then on it reads at full speed). Returns a summary: ``received``, ``first`` and ``last``
    sequence (-1 before any), ``gaps`` (forward jumps in the sequence), ``backwards``
    (a sequence at or below the previous one), ``bad_checksum``, ``images`` and
    ``unavailable`` (image callbacks), ``position`` (the subscriber position at the end).
    """
    summary = {"received": 0, "first": -1, "last": -1, "gaps": 0, "backwards": 0,
               "bad_checksum": 0, "images": 0, "unavailable": 0, "position": 0}

    def on_message(buffer: memoryview, header: shmbus.Header) -> None:
        data = bytes(buffer)
        sequence = int.from_bytes(data[:8], "little")
        crc = int.from_bytes(data[8:12], "little")
        if zlib.crc32(data[12:]) != crc or data[12:] != message(sequence)[12:]:
            summary["bad_checksum"] += 1
        last = summary["last"]
        if last == -1:
            summary["first"] = sequence
        elif sequence <= last:
            summary["backwards"] += 1
        elif sequence != last + 1:
            summary["gaps"] += 1
        summary["last"] = sequence
        summary["received"] += 1

    def count_image(key: str) -> None:
        summary[key] += 1

    deadline = time.monotonic() + timeout
    idle = shmbus.idle_strategies.BackoffIdleStrategy()
    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(
            channel, stream_id, on_available_image=lambda image: count_image("images"),
            on_unavailable_image=lambda image: count_image("unavailable"))
        ready.set()
        assembler = shmbus.FragmentAssembler(on_message)
        while (summary["last"] < count - 1 and time.monotonic() < deadline
               and not (stop is not None and stop.is_set())):
            slow = not (catch_up and summary["unavailable"])
            fragments = subscription.poll(assembler, fragment_limit if slow else 256)
            if sleep and slow:
                time.sleep(sleep)
            else:
                idle.idle(fragments)
        summary["position"] = max((image.position for image in subscription.images),
                                  default=0)
    return summary


def channel_stats(context: shmbus.Context) -> dict[str, int]:
    """The netbridge's channel statistics of a bus (counter type ids >= 100), by name, summed
    over its channels: {"naks sent": ..., "datagrams received": ..., ...}."""
    stats: dict[str, int] = {}
    with shmbus.connect(context) as bus:
        for counter in bus.counters.counters():
            if counter.type_id >= 100:
                name = counter.label.split(":")[0]
                stats[name] = stats.get(name, 0) + counter.value
    return stats
