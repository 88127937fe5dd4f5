"""Flow-control strategies (netbridge.flow_control): pure functions of status messages and time."""

from __future__ import annotations

import pytest

from netbridge.flow_control import (
    MaxFlowControl,
    MinFlowControl,
    TaggedFlowControl,
    UnicastFlowControl,
    sm_position,
    strategy_for,
)
from netbridge.frames import SM_FLAG_EOS, StatusMessage
from shmbus.settings.channel_uri import ChannelUri

TERM = 64 * 1024
INITIAL = 100
SECOND = 1_000_000_000


def sm(position: int, window: int = 32 * 1024, *, receiver_id: int = 1, flags: int = 0,
       group_tag: int | None = None, initial: int = INITIAL) -> StatusMessage:
    term_id = ((initial + position // TERM + 2**31) % 2**32) - 2**31
    return StatusMessage(
        flags=flags, session_id=7, stream_id=1001, consumption_term_id=term_id,
        consumption_term_offset=position % TERM, receiver_window=window, receiver_id=receiver_id,
        group_tag=group_tag,
    )


def make(strategy, initial: int = INITIAL):
    strategy.initialize(initial_term_id=initial, term_length=TERM)
    return strategy


def test_sm_position_converts_term_id_and_offset_across_the_int32_wrap() -> None:
    assert sm_position(sm(0), INITIAL, TERM) == 0
    assert sm_position(sm(3 * TERM + 96), INITIAL, TERM) == 3 * TERM + 96
    initial = 2**31 - 2  # term ids wrap from 2**31 - 1 to -2**31
    message = sm(5 * TERM + 64, initial=initial)
    assert message.consumption_term_id < 0
    assert sm_position(message, initial, TERM) == 5 * TERM + 64


def test_unicast_limit_is_consumption_plus_window_and_never_moves_back() -> None:
    fc = make(UnicastFlowControl())
    assert fc.on_status_message(sm(0, 1000), 0, 0, sender_limit=0) == 1000
    limit = fc.on_status_message(sm(TERM + 64, 4096), 0, 1, sender_limit=1000)
    assert limit == TERM + 64 + 4096
    # an older (reordered) status message does not pull the limit back
    assert fc.on_status_message(sm(64, 4096), 0, 2, sender_limit=limit) == limit
    # a negative window is nonsense: ignored
    assert fc.on_status_message(sm(2 * TERM, -5), 0, 3, sender_limit=limit) == limit
    assert fc.on_idle(10 * SECOND, limit, 0) == limit
    assert fc.has_required_receivers()


def test_max_follows_the_fastest_receiver() -> None:
    fc = make(MaxFlowControl())
    limit = fc.on_status_message(sm(1000 * 32, 100, receiver_id=1), 0, 0, sender_limit=0)
    limit = fc.on_status_message(sm(10 * 32, 100, receiver_id=2), 0, 0, sender_limit=limit)
    assert limit == 1000 * 32 + 100
    assert fc.on_idle(60 * SECOND, limit, 0) == limit  # no receiver timeout for max


def test_min_follows_the_slowest_live_receiver() -> None:
    fc = make(MinFlowControl(receiver_timeout_ns=5 * SECOND, group_min_size=2))
    assert not fc.has_required_receivers()
    limit = fc.on_status_message(sm(6400, 1000, receiver_id=1), 0, 0, sender_limit=0)
    assert limit == 7400
    assert not fc.has_required_receivers()
    limit = fc.on_status_message(sm(640, 1000, receiver_id=2), 0, 1, sender_limit=limit)
    assert limit == 1640  # the slow receiver holds the sender back
    assert fc.has_required_receivers()
    # receiver 2 advances; receiver 1 is still ahead
    limit = fc.on_status_message(sm(9600, 1000, receiver_id=2), 0, 2, sender_limit=limit)
    assert limit == 7400
    # an older status message from receiver 1 does not pull its limit back
    assert fc.on_status_message(sm(32, 1000, receiver_id=1), 0, 3, sender_limit=limit) == 7400
    # receiver 1 falls silent: after the timeout only receiver 2 counts
    assert fc.on_idle(4 * SECOND, limit, 0) == 7400
    fc.on_status_message(sm(9600, 1000, receiver_id=2), 0, 4 * SECOND, sender_limit=limit)
    assert fc.on_idle(5 * SECOND + 4, limit, 0) == 10600
    assert set(fc.receivers) == {2}
    assert not fc.has_required_receivers()


def test_min_without_receivers_keeps_the_limit_and_forgets_a_receiver_at_end_of_stream() -> None:
    fc = make(MinFlowControl())
    assert fc.on_idle(0, 1234, 0) == 1234
    fc.on_status_message(sm(3200, 1000, receiver_id=1), 0, 0, sender_limit=0)
    limit = fc.on_status_message(sm(320, 1000, receiver_id=2), 0, 0, sender_limit=4200)
    assert limit == 1320
    limit = fc.on_status_message(sm(320, 1000, receiver_id=2, flags=SM_FLAG_EOS), 0, 1,
                                 sender_limit=limit)
    assert limit == 4200 and set(fc.receivers) == {1}


def test_min_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        MinFlowControl(receiver_timeout_ns=0)
    with pytest.raises(ValueError):
        MinFlowControl(group_min_size=-1)


def test_tagged_counts_only_receivers_of_its_group() -> None:
    fc = make(TaggedFlowControl(99, group_min_size=1))
    # before any tagged receiver, untagged status messages move the limit like max
    limit = fc.on_status_message(sm(3200, 1000, receiver_id=5), 0, 0, sender_limit=0)
    assert limit == 4200
    assert not fc.has_required_receivers()
    limit = fc.on_status_message(sm(640, 1000, receiver_id=1, group_tag=99), 0, 0,
                                 sender_limit=limit)
    assert limit == 1640 and fc.has_required_receivers()
    # now an untagged, faster receiver does not matter, nor does another group's tag
    assert fc.on_status_message(sm(9600, 1000, receiver_id=5), 0, 1, sender_limit=limit) == 1640
    assert fc.on_status_message(sm(9600, 1000, receiver_id=6, group_tag=7), 0, 1,
                                sender_limit=limit) == 1640
    assert {r.receiver_id for r in fc.receivers.values() if r.counted} == {1}
    assert set(fc.receivers) == {1, 5, 6}  # the others are known, not counted


@pytest.mark.parametrize("strategy", [MaxFlowControl, MinFlowControl, UnicastFlowControl])
def test_every_strategy_knows_its_receivers_positions_and_sources(strategy) -> None:
    fc = make(strategy(receiver_timeout_ns=5 * SECOND))
    fc.on_status_message(sm(640, 1000, receiver_id=1), 0, 0, sender_limit=0, source="a")
    fc.on_status_message(sm(3200, 1000, receiver_id=2), 0, SECOND, sender_limit=0, source="b")
    fc.on_status_message(sm(320, 2000, receiver_id=1), 0, SECOND, sender_limit=0, source="a")
    known = {r.receiver_id: (r.position, r.window, r.source, r.limit)
             for r in fc.receivers.values()}
    # an older position (reordered) does not move a receiver back; its window is the latest
    assert known == {1: (640, 2000, "a", 2640), 2: (3200, 1000, "b", 4200)}
    assert fc.counted_receivers() == 2
    fc.on_idle(6 * SECOND, 0, 0)  # receiver 1 was last heard at 1 s, receiver 2 too
    assert set(fc.receivers) == {1, 2}
    fc.on_status_message(sm(960, 1000, receiver_id=1), 0, 5 * SECOND, sender_limit=0)
    fc.on_idle(6 * SECOND + 1, 0, 0)  # receiver 2 has been silent for 5 s + 1 ns
    assert set(fc.receivers) == {1}
    fc.on_status_message(sm(960, 1000, receiver_id=1, flags=SM_FLAG_EOS), 0, 7 * SECOND,
                         sender_limit=0)
    assert not fc.receivers  # it said goodbye


@pytest.mark.parametrize("channel, strategy", [
    ("aeron:udp?endpoint=10.0.0.2:40", UnicastFlowControl),
    ("aeron:udp?endpoint=10.0.0.2:40|fc=min", MinFlowControl),
    ("aeron:udp?endpoint=224.0.1.1:40", MaxFlowControl),
    ("aeron:udp?control=10.0.0.1:41|control-mode=dynamic", MaxFlowControl),
    ("aeron:udp?endpoint=224.0.1.1:40|fc=tagged,g:7/2,t:1s", TaggedFlowControl),
])
def test_the_channel_chooses_the_strategy(channel: str, strategy: type) -> None:
    fc = strategy_for(ChannelUri.parse(channel))
    assert type(fc) is strategy
    if strategy is TaggedFlowControl:
        assert (fc.group_tag, fc.group_min_size, fc.receiver_timeout_ns) == (7, 2, SECOND)
