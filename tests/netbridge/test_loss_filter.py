"""The loss filter: seeded drops, duplicates, reordering and delays."""

from __future__ import annotations

import pytest

from netbridge.loss_filter import LossFilter, LossSpec, LossSpecError


def run(spec: LossSpec, count: int = 10_000) -> list[int]:
    loss = LossFilter(spec)
    out: list[int] = []
    for i in range(count):
        out += [int.from_bytes(d, "little") for d, _ in loss.send(i, i.to_bytes(4, "little"), 0)]
    out += [int.from_bytes(d, "little") for d, _ in loss.due(10**18)]
    return out


def test_rates_are_close_to_the_spec_and_seeded() -> None:
    spec = LossSpec(drop=0.05, dup=0.05, reorder=0.05, seed=9)
    out = run(spec)
    assert out == run(spec)  # the same seed, the same datagrams
    missing = 10_000 - len(set(out))
    assert 350 < missing < 650
    assert 350 < len(out) - len(set(out)) < 650
    assert sum(1 for a, b in zip(out, out[1:], strict=False) if b < a) > 200  # reordered


def test_delayed_datagrams_come_out_when_due() -> None:
    loss = LossFilter(LossSpec(reorder=1.0, delay=0.001, seed=1))
    assert loss.send(0, b"x", "d") == []
    assert loss.next_deadline() == 1_000_000
    assert loss.due(999_999) == []
    assert loss.due(1_000_000) == [(b"x", "d")]


def test_nothing_is_lost_without_rates() -> None:
    assert run(LossSpec()) == list(range(10_000))


def test_loss_applies_only_between_start_and_stop_after_the_first_datagram() -> None:
    spec = LossSpec.parse("drop=1,start=2,stop=4.5")
    assert spec == LossSpec(drop=1.0, start=2.0, stop=4.5)
    loss = LossFilter(spec)
    first = 7_000_000_000  # whenever the channel's first datagram goes
    passed = [second for second in range(8)
              if loss.send(first + second * 1_000_000_000, b"x", "d")]
    assert passed == [0, 1, 5, 6, 7]
    assert loss.dropped == 3


@pytest.mark.parametrize("text", ["drop=2", "drop=x", "lose=0.1", "direction=up", "drop",
                                  "start=3,stop=1", "start=-1"])
def test_bad_specs_name_the_bad_part(text: str) -> None:
    with pytest.raises(LossSpecError, match="loss spec"):
        LossSpec.parse(text)
