"""The driver's system counters: one counter each, allocated when the driver starts."""

from __future__ import annotations

import enum

from shmbus.shm.counters import SYSTEM, CountersManager


class SystemCounter(enum.IntEnum):
    """System counters; the value is the order they are allocated in (their counter id)."""

    #: bytes appended to IPC logs, frame headers and padding included
    BYTES_PUBLISHED = 0
    #: commands refused and internal errors (each also in the error log)
    ERRORS = 1
    #: clients declared dead because their heartbeat stopped
    CLIENT_TIMEOUTS = 2
    #: logs padded over a frame whose writer died mid-append
    UNBLOCKED_PUBLICATIONS = 3
    #: to-driver commands padded over because their writer died mid-write
    UNBLOCKED_COMMANDS = 4
    #: publication logs created
    PUBLICATIONS = 5
    #: subscriptions added
    SUBSCRIPTIONS = 6
    #: bytes of block rings' warm pages given back so that a file of the bus could be created
    #: (a log or block ring that did not fit at first)
    WARM_BYTES_GIVEN_BACK = 7

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


def allocate_system_counters(counters: CountersManager) -> None:
    """Allocate every system counter; they take ids 0..n-1 in a fresh counters section."""
    for counter in SystemCounter:
        counter_id = counters.allocate(counter.label, SYSTEM, key=counter.value.to_bytes(4,
                                                                                        "little"))
        if counter_id != counter.value:
            raise RuntimeError(f"system counter {counter.name} got id {counter_id}")
