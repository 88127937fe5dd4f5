"""Request/reply services as ``shmbus streams`` shows them, from the ``rr-*`` counters.

A service is a channel and stream id. Each requester and each responder keeps its own
counters (shmbus/calls/call_counters.py; their labels carry stream, channel and role), and the
driver frees them when their client goes away, so the live responders of a service are the
responders with counters, and the totals are over the live requesters and responders.
Pure: computed from one snapshot's counters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shmbus.shm.counters import (
    RR_ANSWERED,
    RR_FAILED,
    RR_HANDLER_ERRORS,
    RR_IN_FLIGHT,
    RR_LATE,
    RR_REFLECTIONS_REFUSED,
    RR_REPLIES_DROPPED,
    RR_SERVED,
    RR_TIMED_OUT,
    Counter,
)

_LABEL = re.compile(r"^rr-[\w-]+: 0 0 (?P<stream>-?\d+) (?P<channel>\S+) "
                    r"(?P<role>requester|responder) pid=(?P<pid>\d+)$")
_REQUESTER_TOTALS = {RR_IN_FLIGHT: "in_flight", RR_ANSWERED: "answered", RR_FAILED: "failed",
                     RR_TIMED_OUT: "timed_out", RR_LATE: "late_dropped"}
_RESPONDER_TOTALS = {RR_SERVED: "served", RR_HANDLER_ERRORS: "handler_errors",
                     RR_REPLIES_DROPPED: "replies_dropped",
                     RR_REFLECTIONS_REFUSED: "reflections_refused"}


@dataclass
class ServiceView:
    """One service: its live responders and requesters (pids) and their counters' totals."""

    channel: str
    stream_id: int
    responder_pids: list[int] = field(default_factory=list)
    requester_pids: list[int] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        [*_REQUESTER_TOTALS.values(), *_RESPONDER_TOTALS.values()], 0))

    def to_json(self) -> dict[str, Any]:
        return {"channel": self.channel, "stream_id": self.stream_id,
                "responders": sorted(self.responder_pids),
                "requesters": sorted(self.requester_pids), **self.totals}

    def line(self) -> str:
        t = self.totals
        pids = ", ".join(str(p) for p in sorted(self.responder_pids))
        return (f"service {self.channel} stream {self.stream_id}: "
                f"{len(self.responder_pids)} responder(s) [{pids}], "
                f"{len(self.requester_pids)} requester(s); in flight {t['in_flight']}, "
                f"answered {t['answered']}, failed {t['failed']}, timed out {t['timed_out']}, "
                f"late replies dropped {t['late_dropped']}; served {t['served']}, handler "
                f"errors {t['handler_errors']}, replies dropped {t['replies_dropped']}, "
                f"reflections refused {t['reflections_refused']}")


def analyse_services(counters: Iterable[Counter]) -> list[ServiceView]:
    """The services the ``rr-*`` counters describe, by (channel, stream id)."""
    services: dict[tuple[str, int], ServiceView] = {}
    for c in counters:
        names = _REQUESTER_TOTALS if c.type_id in _REQUESTER_TOTALS else _RESPONDER_TOTALS
        if c.type_id not in names:
            continue
        match = _LABEL.match(c.label)
        if match is None:
            continue
        key = (match["channel"], int(match["stream"]))
        view = services.setdefault(key, ServiceView(*key))
        view.totals[names[c.type_id]] += c.value
        pid = int(match["pid"])
        if c.type_id == RR_SERVED:
            view.responder_pids.append(pid)
        elif c.type_id == RR_IN_FLIGHT:
            view.requester_pids.append(pid)
    return sorted(services.values(), key=lambda v: (v.stream_id, v.channel))
