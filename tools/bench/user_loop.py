"""The loops a user writes, the same for every transport a throughput benchmark measures.

Runs in the writer and reader members of tools/bench/ipc.py and pyaeron.py (each a spawned
process). The writer is :func:`write`: one call of the transport's send per message
(``pub.publish``, ``sock.send``, ``queue.put``, ...), the messages made a round at a time
(tools/bench/rounds.py); :func:`write_count` is the same loop for a fixed number of rounds.
The reader is :meth:`Consumer.read`::

    for message in source:
        consume(message)

with ``source`` the transport's iterator (``sub.messages()``, ``iter(sock.recv, None)``) and
``consume`` the :class:`Consumer`'s, one Python function shared by every transport. A
transport with no iterator (pyaeron's ``poll(handler)``) calls the same ``consume`` from
:meth:`Consumer.handler`.

``consume(message)`` reads the message's sequence number and length and checks them against
the next expected, then keeps the message; when a round is complete it compares the round's
bytes, end to end, with the round it computes, so every byte of every message is checked
(sequence number and CRC-32 included) at a few tens of nanoseconds a message. The first
message out of place switches the check to one message at a time (the format's check),
counting and naming errors.
A STOP message (sequence number harness.STOP) ends the reading, or the end of ``source``.
The messages are harness.Checked ones made a round at a time (rounds.Rounds), or any other
rounds.RoundFormat (tools/bench/aeron_rounds.py: those of Aeron's C programs).

Each member's result names the loop functions that drove it (``loop_write``, ``loop_read``,
``loop_consume``), so a test can check that shmbus and every peer ran the same ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tools.bench.harness import SEQUENCE, STOP, Counter
from tools.bench.rounds import RoundFormat, Rounds


class Stopped(Exception):
    """Raised by ``consume`` at the STOP message: the end of the run."""


class Consumer:
    """``consume`` (the per-message function every reader calls) and its ``tally``
    (harness.Counter: ``stopped`` once STOP came). Call :meth:`result` once reading ends."""

    def __init__(self, rounds: RoundFormat) -> None:
        self.tally = Counter()
        self.consume, self._finish = _consume_and_finish(rounds, self.tally)
        self.loop_read: str | None = None  # the reader loop that called consume

    def read(self, source: Iterable[Any]) -> bool:
        """The user's reader loop, ``for message in source: consume(message)``, until STOP:
        True if STOP came, False if ``source`` ended first."""
        self.loop_read = _name(Consumer.read)
        consume = self.consume
        try:
            for message in source:
                consume(message)
        except Stopped:
            return True
        return False

    def handler(self) -> Callable[[Any, Any], None]:
        """A poll handler ``(buffer, header)`` for a transport with no iterator: copies the
        fragment (or reassembled message) as bytes and consumes it; STOP sets ``stopped``."""
        self.loop_read = _name(Consumer.handler)
        consume = self.consume

        def handler(buffer: Any, header: Any) -> None:
            try:
                consume(bytes(buffer))
            except Stopped:
                pass

        return handler

    def result(self, t1: int) -> dict[str, Any]:
        """The reader's result (harness.Counter.result, ``t1`` its end in CLOCK_MONOTONIC ns)
        and the loop functions that ran; the messages of an unfinished round checked first."""
        self._finish()
        return {**self.tally.result(t1), "loop_read": self.loop_read,
                "loop_consume": _name(Consumer)}


def _consume_and_finish(rounds: RoundFormat, tally: Counter
                        ) -> tuple[Callable[[Any], None], Callable[[], None]]:
    size, offset, count = rounds.size, rounds.seq_offset, rounds.count
    mask = count - 1
    unpack_from, check = SEQUENCE.unpack_from, rounds.check
    got: list[bytes] = []
    append, join = got.append, b"".join
    expected = 0  # the next sequence number, while every message has been in place
    one_by_one = False

    def consume(message: Any) -> None:
        nonlocal expected
        if one_by_one or len(message) != size or unpack_from(message, offset)[0] != expected:
            slow(message)
            return
        expected += 1
        append(message)
        if not expected & mask:
            if join(got) != rounds.block(expected // count - 1):
                walk()
            got.clear()

    def walk() -> None:
        """Check the kept messages one at a time, from the first of their round."""
        nonlocal expected
        tally.expected = expected - len(got)
        for message in got:
            one(message)
        got.clear()
        expected = tally.expected

    def finish() -> None:
        """Check the kept messages of an unfinished round; the tally then holds every one."""
        nonlocal one_by_one
        if not one_by_one:
            first = expected - len(got)
            if join(got) == rounds.block(first // count)[:len(got) * size]:
                tally.expected = expected
                got.clear()
            else:
                walk()
            one_by_one = True

    def one(message: bytes) -> None:
        seq, ok = check(message)
        if seq == tally.expected and ok:
            tally.expected += 1
        else:
            tally.bad(seq, "bad checksum" if seq == tally.expected else
                      "wrong length" if seq == -2 else "out of order")

    def slow(message: Any) -> None:
        finish()
        message = bytes(message)
        if check(message) == (STOP, True):
            tally.stopped = True
            raise Stopped
        one(message)

    return consume, finish


def write(send: Callable[[bytes], object], rounds: Rounds, duration_s: float
          ) -> dict[str, Any]:
    """``send(message)`` for each checked message, a round at a time, until ``duration_s``
    has passed at the end of a round, then STOP. Call it once the member is ready. Returns the
    writer's result: messages sent before STOP, the CLOCK_MONOTONIC ns at the start, and the
    loop functions it ran."""
    t0 = time.monotonic_ns()
    end_ns = t0 + int(duration_s * 1e9)
    round_no = 0
    while True:
        for message in rounds.messages(round_no):
            send(message)
        round_no += 1
        if time.monotonic_ns() >= end_ns:
            break
    send(rounds.stop)
    return {"sent": round_no * rounds.count, "t0": t0, "loop_write": _name(write)}


def write_count(send: Callable[[bytes], object], rounds: RoundFormat, round_count: int
                ) -> dict[str, Any]:
    """``send(message)`` for each message of rounds 0 to ``round_count - 1``, and no STOP: the
    reader reads ``round_count * rounds.count`` messages (a run beside a writer that cannot
    send STOP, such as Aeron's C publisher, which sends a count). Call it once the member is
    ready. Returns the writer's result, as write's."""
    t0 = time.monotonic_ns()
    for round_no in range(round_count):
        for message in rounds.messages(round_no):
            send(message)
    return {"sent": round_count * rounds.count, "t0": t0, "loop_write": _name(write_count)}


def _name(function: Any) -> str:
    """A function's or class's full name, as the members' results name the loops they ran."""
    return f"{function.__module__}.{function.__qualname__}"
