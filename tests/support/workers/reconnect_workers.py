"""Spawn targets for tests/shmbus/client/test_reconnect.py: clients that outlive their driver.

Each connects with the test's pickled Context (``reconnect=True``), streams or reads the
sequenced, crc'd messages of :mod:`tests.support.workers.driver_workers`, and reports through a
queue as plain dicts: ``*-ready``, ``*-reconnected`` (the Reconnected report as a dict) and a
final ``pub``/``sub`` summary with the first and last sequence number seen per session. Every
loop is bounded by a deadline; nothing busy-spins.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import shmbus
from tests.support.workers import driver_workers as dw


def _on_reconnect(results: Any, kind: str) -> Any:
    def report(reconnected: shmbus.Reconnected) -> None:
        results.put({"kind": kind, "thread": threading.current_thread().name,
                     "report": dataclasses.asdict(reconnected)})
    return report


def reconnecting_publisher(context: shmbus.Context, stream_id: int, writer: int, stop: Any,
                           results: Any, timeout: float) -> None:
    """Offers writer ``writer``'s messages in order (about 20 per ms) until ``stop``, then a
    LAST one. A refused offer is retried with the same sequence number. Reports, per session,
    the first and last sequence number accepted into it (the session is read before and after
    each offer; ``ambiguous`` counts offers during which it changed)."""
    name = f"publisher-{writer}"
    deadline = time.monotonic() + timeout

    def run() -> None:
        with shmbus.connect(context) as bus:
            bus.on_reconnect = _on_reconnect(results, "pub-reconnected")
            pub = bus.add_exclusive_publication("aeron:ipc", stream_id)
            results.put({"kind": "pub-ready", "name": name, "session_id": pub.session_id})
            sessions: dict[int, list[int]] = {}
            refused: dict[str, int] = {}
            ambiguous = 0
            seq = 0
            while True:
                last = stop.is_set()
                message = dw.make_message(writer, seq, dw.LAST if last else 0)
                session_id = dw.offer_counted(pub, message, deadline, refused, f"seq {seq}")
                ambiguous += pub.session_id != session_id
                sessions.setdefault(session_id, [seq, seq])[1] = seq
                seq += 1
                if last:
                    break
                if seq % 20 == 0:
                    time.sleep(0.001)
            results.put({"kind": "pub", "name": name, "sent": seq, "sessions": sessions,
                         "refused": refused, "ambiguous": ambiguous,
                         "reconnects": bus.reconnects})

    dw._report_errors(results, "pub", name, run)


def reconnecting_subscriber(context: shmbus.Context, stream_id: int, streaming: int,
                            results: Any, timeout: float) -> None:
    """Reads (sleeping in poll while there is nothing) until a LAST message, checking every
    message (a jump forward is recorded as a gap, anything else is an error). Reports
    ``sub-streaming`` after ``streaming`` messages, and ``sub-resumed`` after ``streaming``
    more from a session other than the first."""
    name = "subscriber"
    deadline = time.monotonic() + timeout

    def run() -> None:
        checker = dw.Checker(allow_gaps=True, stream_id=stream_id)
        sessions: dict[int, list[int]] = {}  # session -> [first seq, last seq, count]
        unavailable: list[tuple[int, int]] = []

        def on_fragment(buffer: memoryview, header: Any) -> None:
            errors = checker.error_count
            checker(buffer, header)
            if checker.error_count == errors:
                entry = sessions.setdefault(header.session_id, [checker.last_seq, 0, 0])
                entry[1] = checker.last_seq
                entry[2] += 1

        with shmbus.connect(context) as bus:
            bus.on_reconnect = _on_reconnect(results, "sub-reconnected")
            sub = bus.add_subscription(
                "aeron:ipc", stream_id,
                on_unavailable_image=lambda i: unavailable.append((i.session_id, i.position)))
            results.put({"kind": "sub-ready", "name": name})
            told = set()
            while not checker.finished and time.monotonic() < deadline:
                sub.poll(on_fragment, 100, timeout=0.05)
                counts = [entry[2] for entry in sessions.values()]
                if "streaming" not in told and counts and counts[0] >= streaming:
                    told.add("streaming")
                    results.put({"kind": "sub-streaming", "name": name})
                if "resumed" not in told and len(counts) > 1 and counts[-1] >= streaming:
                    told.add("resumed")
                    results.put({"kind": "sub-resumed", "name": name})
            results.put({"kind": "sub", "name": name, "timed_out": not checker.finished,
                         "by_session": sessions, "unavailable": unavailable,
                         "reconnects": bus.reconnects, **checker.summary()})

    dw._report_errors(results, "sub", name, run)
