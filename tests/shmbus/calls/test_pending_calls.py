"""The pending-calls table, driven directly (sans-IO): every call settles exactly once, with
its own reply or a documented error; anything for a call no longer open is dropped and counted.
A Hypothesis state machine checks it against a model under any interleaving."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shmbus.calls.pending_calls import PendingCall, PendingCalls
from shmbus.settings.errors import (
    NoResponderError,
    RemoteError,
    RequestTimeoutError,
    ResponderLostError,
)
from shmbus.shm import call_header


def test_a_reply_settles_its_call_only():
    table = PendingCalls("aeron:ipc stream 7")
    one, two = table.open(1, 10.0), table.open(2, 10.0)
    assert table.on_reply(call_header.REPLY, 2, b"two") is two
    assert two.settled and two.reply == b"two" and two.error is None
    assert not one.settled and len(table) == 1 and 1 in table


def test_an_error_reply_names_the_remote_error():
    table = PendingCalls("aeron:ipc stream 7")
    call = table.open(1, 10.0)
    table.on_reply(call_header.ERROR, 1, b"KeyError: 'k'")
    assert isinstance(call.error, RemoteError)
    assert call.error.remote == "KeyError: 'k'"
    assert str(call.error) == "the responder of aeron:ipc stream 7 raised KeyError: 'k'"
    assert table.counts.failed == 1


def test_a_lost_reply_says_the_request_may_have_run():
    table = PendingCalls("svc")
    call = table.open(5, 10.0)
    table.on_reply(call_header.LOST, 5, b"")
    assert isinstance(call.error, ResponderLostError)
    assert "may or may not have run" in str(call.error)


def test_expiry_times_out_due_calls_and_their_late_replies_are_counted():
    table = PendingCalls("svc")
    early, late = table.open(1, 1.0), table.open(2, 3.0)
    assert table.next_deadline() == 1.0
    assert table.expire(2.0) == [early]
    assert isinstance(early.error, RequestTimeoutError)
    assert table.on_reply(call_header.REPLY, 1, b"too late") is None
    assert early.reply is None and table.counts.late == 1 and table.counts.timed_out == 1
    assert not late.settled and table.next_deadline() == 3.0


def test_fail_all_and_the_settled_callback():
    table = PendingCalls("svc")
    seen: list[int] = []
    calls = [table.open(i, 9.0) for i in range(3)]
    for call in calls:
        call.on_settled = lambda c: seen.append(c.correlation_id)
    table.fail_all(lambda call: table.no_responder())
    assert seen == [0, 1, 2] and len(table) == 0
    assert all(isinstance(c.error, NoResponderError) for c in calls)
    assert table.fail(0, table.no_responder()) is None  # settled once only


def test_an_open_id_cannot_be_opened_again():
    table = PendingCalls("svc")
    table.open(1, 1.0)
    with pytest.raises(ValueError, match="call 1 is open already"):
        table.open(1, 1.0)


class PendingCallsModel(RuleBasedStateMachine):
    """Random opens, replies (to open, settled and unknown ids), failures and expiries."""

    def __init__(self) -> None:
        super().__init__()
        self.table = PendingCalls("svc")
        self.now = 0.0
        self.next_id = 1
        self.calls: dict[int, PendingCall] = {}
        self.settlements: dict[int, int] = {}
        self.expected_late = 0

    def _count(self, call: PendingCall) -> None:
        self.settlements[call.correlation_id] = self.settlements.get(call.correlation_id, 0) + 1

    @rule(lifetime=st.floats(0.1, 5.0))
    def open(self, lifetime: float) -> None:
        call = self.table.open(self.next_id, self.now + lifetime)
        call.on_settled = self._count
        self.calls[self.next_id] = call
        self.next_id += 1

    @precondition(lambda self: self.next_id > 1)
    @rule(pick=st.integers(0, 10 ** 6), kind=st.sampled_from(
        [call_header.REPLY, call_header.ERROR, call_header.LOST]), body=st.binary(max_size=8))
    def reply(self, pick: int, kind: int, body: bytes) -> None:
        correlation_id = 1 + pick % (self.next_id + 2)  # sometimes an id never opened
        was_open = correlation_id in self.table
        call = self.table.on_reply(kind, correlation_id, body)
        if not was_open:
            assert call is None
            self.expected_late += 1
        else:
            assert call is self.calls[correlation_id]
            assert (call.reply == body) == (kind == call_header.REPLY)

    @precondition(lambda self: self.next_id > 1)
    @rule(pick=st.integers(0, 10 ** 6))
    def fail(self, pick: int) -> None:
        self.table.fail(1 + pick % (self.next_id - 1), self.table.no_responder())

    @rule(step=st.floats(0.0, 2.0))
    def advance(self, step: float) -> None:
        self.now += step
        for call in self.table.expire(self.now):
            assert call.deadline <= self.now

    @invariant()
    def each_call_settles_once_with_one_outcome(self) -> None:
        assert all(n == 1 for n in self.settlements.values())
        for call in self.calls.values():
            if call.settled:
                assert (call.reply is None) != (call.error is None)
                assert call.correlation_id not in self.table
            else:
                assert call.correlation_id in self.table and call.deadline > self.now
        counts = self.table.counts
        assert counts.answered + counts.failed + counts.timed_out == len(self.settlements)
        assert counts.late == self.expected_late
        assert len(self.table) == len(self.calls) - len(self.settlements)


TestPendingCallsModel = PendingCallsModel.TestCase
TestPendingCallsModel.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
