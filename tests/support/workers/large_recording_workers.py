"""Spawn targets of the large-message recording tests: a writer of small and large messages,
a recorder process and a collecting subscriber; each reports on a queue (dicts with ``kind``).

Message ``i`` of the mix is ``mix_payload(seed, i, length)``: a 4-byte sequence number, then
random bytes; readers check every one by its crc32 against :func:`expected_mix`.
"""

from __future__ import annotations

import random
import time
import traceback
import zlib
from typing import Any

#: message lengths of the mix: small, a fragmented one, large (past the test log's 8 KiB max)
MIX_LENGTHS = (100, 300_000, 24, 5_000_000, 7000, 300_000, 1, 4000, 5_000_000, 500)


def mix_payload(seed: int, i: int, length: int) -> bytes:
    body = random.Random(seed * 1_000_003 + i).randbytes(max(0, length - 4))
    return (i.to_bytes(4, "little") + body)[:length]


def expected_mix(seed: int, lengths: tuple[int, ...] = MIX_LENGTHS) -> list[bytes]:
    return [mix_payload(seed, i, n) for i, n in enumerate(lengths)]


def crcs(payloads: list[bytes]) -> list[tuple[int, int]]:
    return [(len(p), zlib.crc32(p)) for p in payloads]


def _report(reports: Any, kind: str, **fields: Any) -> None:
    reports.put({"kind": kind, "name": kind, **fields})


def publish_mix(context: Any, stream_id: int, seed: int, go: Any, done: Any,
                reports: Any) -> None:
    """Once ``go`` is set (every reader subscribed), publish the mix; report each publish's
    new position; keep the publication until ``done`` is set (the readers have it all)."""
    import shmbus

    try:
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", stream_id)
            _report(reports, "publication")
            if not go.wait(30):
                raise TimeoutError("not told to go within 30 s")
            ends = [pub.publish(p, timeout=30.0, reserved_value=i)
                    for i, p in enumerate(expected_mix(seed))]
            _report(reports, "published", ends=ends)
            if not done.wait(120):
                raise TimeoutError("not told the readers were done within 120 s")
    except BaseException:
        _report(reports, "published", exception=traceback.format_exc())


def record(context: Any, directory: str, stream_id: int, stop: Any, reports: Any) -> None:
    """Record the stream into ``directory`` until ``stop`` is set."""
    import shmbus

    try:
        with shmbus.connect(context) as bus, \
                bus.add_recorder(directory, "aeron:ipc", stream_id) as recorder:
            idle = shmbus.idle_strategies.BackoffIdleStrategy()
            deadline = time.monotonic() + 30
            while not recorder.recordings:
                if time.monotonic() > deadline:
                    raise TimeoutError("no image within 30 s")
                idle.idle(recorder.poll())
            _report(reports, "recording")
            recorder.run(duration=60, stop=stop, idle=idle)
            positions = recorder.positions
        _report(reports, "recorded", positions=positions)
    except BaseException:
        _report(reports, "recorded", exception=traceback.format_exc())


def collect(context: Any, stream_id: int, count: int, reports: Any) -> None:
    """Subscribe, report ``subscribed``, read ``count`` messages; report their crcs."""
    import shmbus

    try:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream_id)
            _report(reports, "subscribed")
            got = []
            for message in sub.messages(timeout=30.0):
                got.append(message)
                if len(got) == count:
                    break
            _report(reports, "collected", crcs=crcs(got))
    except BaseException:
        _report(reports, "collected", exception=traceback.format_exc())
