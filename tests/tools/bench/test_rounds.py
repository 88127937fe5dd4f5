"""tools/bench/rounds.py: the rounds are exactly harness.Checked's messages, and the round
check finds every lost, reordered, duplicated, corrupt or resized message."""

from __future__ import annotations

import pytest

from tools.bench.harness import STOP, Checked
from tools.bench.rounds import RoundCheck, Rounds, read_rounds, round_count


@pytest.mark.parametrize("size", [16, 32, 256, 4096])
def test_a_round_is_checked_messages_in_sequence(size: int) -> None:
    rounds, checked = Rounds(size), Checked(size)
    message = checked.message()
    for round_no in (0, 1, 7, 3_000_000_000 // rounds.count):
        got = rounds.messages(round_no)
        assert len(got) == rounds.count
        for i, data in enumerate(got):
            seq = round_no * rounds.count + i
            checked.write(message, seq)
            assert data == bytes(message)
            assert checked.check(data) == (seq, True)
    assert checked.check(rounds.stop) == (STOP, True)


def test_round_counts_are_powers_of_two_within_64_kib() -> None:
    assert [round_count(size) for size in (16, 32, 256, 4096, 65536)] == [
        4096, 2048, 256, 16, 16]
    with pytest.raises(ValueError, match="a power of two"):
        Rounds(32, count=100)


def _stream(rounds: Rounds, count: int) -> list[bytes]:
    out: list[bytes] = []
    for round_no in range(count):
        out.extend(rounds.messages(round_no))
    return [*out, rounds.stop]


def test_an_intact_stream_reads_clean_by_iterator_and_by_handler() -> None:
    rounds = Rounds(32, count=64)
    stream = _stream(rounds, 5)
    tally = read_rounds(iter(stream), rounds)
    assert (tally.expected, tally.errors, tally.stopped) == (320, 0, True)
    check, got = RoundCheck(rounds), []
    for start in range(0, len(stream), 37):  # handed over in pieces that straddle rounds
        got.extend(stream[start:start + 37])
        check.take(got)
    assert (check.tally.expected, check.tally.errors, check.tally.stopped) == (320, 0, True)
    assert got == []


@pytest.mark.parametrize("damage, first_bad", [
    (lambda s: s.pop(100), "expected 100, got 101: out of order"),
    (lambda s: s.insert(100, s[99]), "expected 100, got 99: out of order"),
    (lambda s: s.__setitem__(70, s[70][:-1] + bytes([s[70][-1] ^ 1])),
     "expected 70, got 70: bad checksum"),
    (lambda s: s.__setitem__(5, s[5] + b"x"), "expected 5, got -2: out of order"),
    (lambda s: s.__setitem__(64, s[65]), "expected 64, got 65: out of order"),
])
def test_a_damaged_stream_is_counted_and_named(damage, first_bad: str) -> None:
    rounds = Rounds(32, count=64)
    stream = _stream(rounds, 4)
    damage(stream)
    tally = read_rounds(iter(stream), rounds)
    assert tally.errors >= 1 and tally.first_bad == first_bad
    assert tally.stopped


def test_a_stream_that_ends_without_stop_is_not_stopped() -> None:
    rounds = Rounds(32, count=64)
    tally = read_rounds(iter(_stream(rounds, 2)[:-10]), rounds)
    assert not tally.stopped and tally.expected == 119 and tally.errors == 0
