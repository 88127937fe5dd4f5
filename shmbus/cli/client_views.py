"""The clients as ``shmbus clients`` shows them: each attached client with its process, its
heartbeat age, whether it is alive, gone (its process) or timed out (its heartbeat), and the
streams it publishes and subscribes to. The JSON form is ``clients`` in
``schema/clients.schema.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shmbus.cli.counter_labels import ClientRef, clients_by_id
from shmbus.cli.counter_views import describe_counters
from shmbus.cli.formatting import format_duration
from shmbus.cli.processes import ProcessInfo
from shmbus.cli.snapshot import BusSnapshot
from shmbus.shm.counters import PUB_LIMIT, SUB_POS

#: A client's state: its process lives and its heartbeat is recent; its process is gone; its
#: heartbeat is older than the client liveness timeout (the driver is about to remove it).
ALIVE = "alive"
GONE = "gone"
TIMED_OUT = "timed-out"


@dataclass(frozen=True)
class ClientView:
    """One client: ``publications`` are its (stream id, session id) pairs, ``subscriptions``
    the stream ids it subscribes to (None: a stream its counters do not name)."""

    client: ClientRef
    heartbeat_age_ms: int
    state: str
    reason: str | None
    process: ProcessInfo | None
    publications: tuple[tuple[int | None, int], ...]
    subscriptions: tuple[int | None, ...]

    def to_json(self) -> dict[str, Any]:
        c = self.client
        return {"client_id": c.client_id, "pid": c.pid, "name": c.name,
                "heartbeat_ms": c.heartbeat_ms, "heartbeat_age_ms": self.heartbeat_age_ms,
                "state": self.state, "reason": self.reason,
                "process": self.process.to_json() if self.process else None,
                "publications": [{"stream_id": s, "session_id": session}
                                 for s, session in self.publications],
                "subscriptions": list(self.subscriptions)}


def client_processes_wanted(snapshot: BusSnapshot) -> dict[int, int]:
    """pid -> the client's last heartbeat: the argument :func:`probe_processes` needs."""
    wanted: dict[int, int] = {}
    for client in clients_by_id(snapshot).values():
        if client.pid:  # 0: an Aeron client, which does not say
            wanted[client.pid] = max(wanted.get(client.pid, 0), client.heartbeat_ms)
    return wanted


def list_clients(snapshot: BusSnapshot,
                 processes: Mapping[int, ProcessInfo]) -> list[ClientView]:
    """The clients attached to the bus, flagged gone (process) or timed out (heartbeat)."""
    views = describe_counters(snapshot)
    timeout_ms = snapshot.driver.client_liveness_timeout_ms
    out = []
    for client in clients_by_id(snapshot).values():
        age = max(0, snapshot.time_ms - client.heartbeat_ms)
        process = processes.get(client.pid) if client.pid else None
        if process is not None and not process.alive:
            state, reason = GONE, process.reason
        elif age > timeout_ms:
            state, reason = TIMED_OUT, (f"no heartbeat for {format_duration(age)} (liveness "
                                        f"timeout {format_duration(timeout_ms)})")
        else:
            state, reason = ALIVE, None
        owned = [v for v in views if v.counter.owner_id == client.client_id]
        publications = tuple((v.stream_id, v.counter.reference_id) for v in owned
                             if v.counter.type_id == PUB_LIMIT)
        subscriptions = tuple(v.stream_id for v in owned if v.counter.type_id == SUB_POS)
        out.append(ClientView(client, age, state, reason, process, publications,
                              subscriptions))
    return out
