"""The counters as ``shmbus stat`` lists them: each with its stream, its owning client and
its rate of change between two snapshots, and the filters ``stat`` takes.

Pure functions over snapshots (:mod:`shmbus.cli.snapshot`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shmbus.cli.counter_labels import (
    READER_TYPES,
    STREAM_TYPES,
    client_of,
    clients_by_id,
    label_fields,
    logs_by_registration,
)
from shmbus.cli.snapshot import BusSnapshot
from shmbus.shm.counters import TYPE_NAMES, Counter


@dataclass(frozen=True)
class CounterView:
    """A counter with what stat derives from it: its stream, its owner's process, its rate."""

    counter: Counter
    stream_id: int | None = None
    session_id: int | None = None
    channel: str | None = None
    client_pid: int | None = None
    client_name: str | None = None
    rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        """One of ``counters`` in ``shmbus stat --json``."""
        c = self.counter
        return {"id": c.counter_id, "type": c.type_name, "type_id": c.type_id, "label": c.label,
                "value": c.value, "rate": self.rate, "registration_id": c.registration_id,
                "owner_id": c.owner_id, "reference_id": c.reference_id,
                "stream_id": self.stream_id, "session_id": self.session_id,
                "channel": self.channel, "client_pid": self.client_pid,
                "client_name": self.client_name}


def describe_counters(snapshot: BusSnapshot,
                      previous: BusSnapshot | None = None) -> list[CounterView]:
    """Every counter with its stream, owning client and (given ``previous``) rate per second."""
    clients = clients_by_id(snapshot)
    logs = logs_by_registration(snapshot)
    rates = counter_rates(previous, snapshot) if previous is not None else {}
    views = []
    for c in snapshot.counters:
        stream_id = session_id = channel = None
        if c.type_id in STREAM_TYPES:
            log = logs.get(c.reference_id if c.type_id in READER_TYPES else c.registration_id)
            if log is not None:
                session_id, stream_id, channel = log.session_id, log.stream_id, log.channel
            elif (fields := label_fields(c.label)) is not None:
                _, session_id, stream_id, channel, _ = fields
        pid, name = client_of(c, clients)
        views.append(CounterView(c, stream_id, session_id, channel, pid, name,
                                 rates.get(c.counter_id)))
    return views


def _identity(c: Counter) -> tuple[int, int, int, int, str]:
    return (c.type_id, c.registration_id, c.owner_id, c.reference_id, c.label)


def counter_rates(previous: BusSnapshot, current: BusSnapshot) -> dict[int, float]:
    """Change per second of each counter id that is the same counter in both snapshots."""
    dt = current.monotonic_s - previous.monotonic_s
    if dt <= 0 or previous.driver.start_time_ms != current.driver.start_time_ms:
        return {}
    before = {c.counter_id: c for c in previous.counters}
    rates = {}
    for c in current.counters:
        old = before.get(c.counter_id)
        if old is not None and _identity(old) == _identity(c):
            rates[c.counter_id] = (c.value - old.value) / dt
    return rates


def parse_type(text: str) -> int:
    """A counter type id from a name (``pub-lmt``) or a number; ValueError lists the names."""
    text = text.strip()
    try:
        return int(text, 0)
    except ValueError:
        pass
    for type_id, name in TYPE_NAMES.items():
        if name == text.lower():
            return type_id
    raise ValueError(f"unknown counter type {text!r}: use a type id or one of "
                     f"{', '.join(TYPE_NAMES.values())}")


def filter_counters(views: Iterable[CounterView], *, types: Iterable[int] = (),
                    streams: Iterable[int] = (), sessions: Iterable[int] = (),
                    channel: str | None = None) -> list[CounterView]:
    """The views that pass every given filter (a counter with no stream fails a stream,
    session or channel filter). ``channel`` is a substring of the channel."""
    types, streams, sessions = set(types), set(streams), set(sessions)
    out = []
    for view in views:
        if types and view.counter.type_id not in types:
            continue
        if streams and view.stream_id not in streams:
            continue
        if sessions and view.session_id not in sessions:
            continue
        if channel is not None and (view.channel is None or channel not in view.channel):
            continue
        out.append(view)
    return out
