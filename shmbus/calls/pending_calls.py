"""The calls a requester has in flight, matched to their replies by correlation id (sans-IO).

A requester opens a call per request, then settles it exactly once: with the reply, with the
error the responder sent, with a failure it detects itself (no responder, the responders
left), or by its deadline. What arrives for a call that is no longer open (its deadline
passed, or it never was this requester's) is dropped and counted, never delivered. Pure state:
the requester holds its lock around every method and does the waiting and the I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shmbus.settings.errors import (
    NoResponderError,
    RemoteError,
    RequestTimeoutError,
    ResponderLostError,
    ShmbusError,
)
from shmbus.shm import call_header


@dataclass(slots=True)
class PendingCall:
    """One call: open until settled with ``reply`` or ``error`` (exactly one of them)."""

    correlation_id: int
    deadline: float  # monotonic seconds; inf: none
    idempotent: bool = False
    reply: bytes | None = None
    error: ShmbusError | None = None
    settled: bool = False
    on_settled: Callable[[PendingCall], None] | None = field(default=None, repr=False)


@dataclass
class CallCounts:
    """What became of the calls: each call ends in exactly one of answered, failed, timed_out;
    ``late`` counts replies that came for no open call (dropped)."""

    answered: int = 0
    failed: int = 0
    timed_out: int = 0
    late: int = 0


class PendingCalls:
    """The open calls of one requester, by correlation id."""

    def __init__(self, service: str) -> None:
        self.service = service  # named in errors: "aeron:ipc stream 5001"
        self._open: dict[int, PendingCall] = {}
        self.counts = CallCounts()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, correlation_id: int) -> bool:
        return correlation_id in self._open

    def open(self, correlation_id: int, deadline: float, *, idempotent: bool = False
             ) -> PendingCall:
        """Start a call; ValueError if ``correlation_id`` is open already."""
        if correlation_id in self._open:
            raise ValueError(f"call {correlation_id} is open already")
        call = PendingCall(correlation_id, deadline, idempotent)
        self._open[correlation_id] = call
        return call

    def on_reply(self, kind: int, correlation_id: int, body: bytes) -> PendingCall | None:
        """Settle the call a reply of ``kind`` answers: REPLY with ``body``, ERROR with a
        RemoteError naming the remote error, LOST with a ResponderLostError. Returns the call,
        or None when no call is open under that id (the reply is dropped and counted late)."""
        call = self._open.pop(correlation_id, None)
        if call is None:
            self.counts.late += 1
            return None
        if kind == call_header.REPLY:
            call.reply = body
            self.counts.answered += 1
        elif kind == call_header.ERROR:
            call.error = RemoteError(body.decode("utf-8", "replace"), self.service)
            self.counts.failed += 1
        else:
            call.error = ResponderLostError(
                f"the responder of {self.service} that held call {correlation_id} left "
                f"(died or was timed out) before answering; the request may or may not have "
                f"run (mark a request idempotent to have it run again instead)")
            self.counts.failed += 1
        _settle(call)
        return call

    def fail(self, correlation_id: int, error: ShmbusError) -> PendingCall | None:
        """Settle an open call with ``error`` (counted failed); None if it is not open."""
        call = self._open.pop(correlation_id, None)
        if call is None:
            return None
        call.error = error
        self.counts.failed += 1
        _settle(call)
        return call

    def fail_all(self, error: Callable[[PendingCall], ShmbusError]) -> list[PendingCall]:
        """Settle every open call with ``error(call)`` (counted failed)."""
        calls = list(self._open.values())
        for call in calls:
            self.fail(call.correlation_id, error(call))
        return calls

    def expire(self, now: float) -> list[PendingCall]:
        """Settle every open call whose deadline is at or before ``now`` with a
        RequestTimeoutError (counted timed out); a reply that comes later is dropped."""
        due = [call for call in self._open.values() if call.deadline <= now]
        for call in due:
            del self._open[call.correlation_id]
            call.error = RequestTimeoutError(
                f"call {call.correlation_id} to {self.service} got no reply before its "
                f"deadline")
            self.counts.timed_out += 1
            _settle(call)
        return due

    def next_deadline(self) -> float:
        """The earliest deadline of an open call (inf when none is open)."""
        return min((call.deadline for call in self._open.values()), default=float("inf"))

    def no_responder(self) -> NoResponderError:
        """The error of a call made while no responder is connected."""
        return NoResponderError(f"no responder is connected to {self.service}")


def _settle(call: PendingCall) -> None:
    call.settled = True
    if call.on_settled is not None:
        call.on_settled(call)
