"""The congestion-control state machines (netbridge.congestion_control), driven by a fake
clock: the static window, and CUBIC's bounds, growth, back-off and recovery."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netbridge.congestion_control import (
    CUBIC_BETA,
    CUBIC_C,
    MIN_UPDATE_INTERVAL_NS,
    CubicCongestionControl,
    StaticWindowCongestionControl,
    congestion_control_for,
)

MTU = 1408
MAX_WINDOW = 128 * 1024
MS = 1_000_000
S = 1_000_000_000

# one event: (time step in ns, what happens: tick, loss or an RTT measurement of ns)
events = st.lists(st.tuples(
    st.integers(0, 50 * MS),
    st.one_of(st.just("tick"), st.just("loss"), st.integers(1, 20 * MS))), max_size=300)


def cubic(now_ns: int = 0, max_window: int = MAX_WINDOW, mtu: int = MTU) -> CubicCongestionControl:
    return CubicCongestionControl(mtu=mtu, max_window=max_window, now_ns=now_ns)


def apply(cc: CubicCongestionControl, now: int, event: str | int) -> None:
    if event == "tick":
        cc.on_tick(now)
    elif event == "loss":
        cc.on_loss(now)
    else:
        cc.on_rtt(now, event)  # type: ignore[arg-type]


def test_the_static_window_never_moves() -> None:
    cc = StaticWindowCongestionControl(mtu=MTU, max_window=MAX_WINDOW)
    for now in range(0, 10 * S, S // 3):
        cc.on_loss(now)
        cc.on_rtt(now, 5 * MS)
        assert cc.on_tick(now) == MAX_WINDOW == cc.window
    assert cc.next_deadline() is None


def test_cubic_starts_at_ten_mtus_as_aerons_does() -> None:
    cc = cubic()
    # as in Aeron's first status message with cc=cubic (docs/protocol.md, Congestion control)
    assert cc.window == cc.on_tick(0) == 10 * MTU == 14080
    assert cc.next_deadline() == MIN_UPDATE_INTERVAL_NS


def test_the_strategy_is_chosen_by_name_and_an_unknown_one_is_an_error() -> None:
    assert isinstance(congestion_control_for("static", mtu=MTU, max_window=MAX_WINDOW,
                                             now_ns=0), StaticWindowCongestionControl)
    assert isinstance(congestion_control_for("cubic", mtu=MTU, max_window=MAX_WINDOW,
                                             now_ns=0), CubicCongestionControl)
    with pytest.raises(ValueError, match="cc='reno'"):
        congestion_control_for("reno", mtu=MTU, max_window=MAX_WINDOW, now_ns=0)
    with pytest.raises(ValueError, match="below the mtu"):
        cubic(max_window=MTU - 32)


@given(events, st.integers(MTU, 1 << 20))
def test_cubic_window_stays_between_one_mtu_and_the_static_window(
        steps: list[tuple[int, str | int]], max_window: int) -> None:
    cc = cubic(max_window=max_window)
    now = 0
    for step, event in steps:
        now += step
        apply(cc, now, event)
        assert MTU <= cc.window <= max_window
        assert cc.window == cc.cwnd * MTU


@given(st.lists(st.tuples(st.integers(0, 200 * MS), st.one_of(st.just("tick"),
                                                              st.integers(1, 20 * MS))),
                max_size=300), st.integers(0, 20))
def test_without_loss_cubic_never_shrinks(steps: list[tuple[int, str | int]],
                                          losses_before: int) -> None:
    cc = cubic()
    now = 0
    for _ in range(losses_before):  # wherever earlier losses left it
        now += 2 * MS
        cc.on_loss(now)
    window = cc.window
    for step, event in steps:
        now += step
        apply(cc, now, event)
        assert cc.window >= window
        window = cc.window


def test_without_loss_cubic_grows_to_the_static_window_and_then_stops_waking() -> None:
    cc = cubic()
    now = 0
    seen = [cc.window]
    while cc.next_deadline() is not None:
        now = cc.next_deadline()  # type: ignore[assignment]
        seen.append(cc.on_tick(now))
        assert now < 10 * S
    assert seen == sorted(seen) and seen[-1] == (MAX_WINDOW // MTU) * MTU
    # 10 + C t^3 reaches 93 MTUs at t = cbrt(83 / C): Aeron's growth without slow start
    assert abs(now / S - math.cbrt((MAX_WINDOW // MTU - 10) / CUBIC_C)) < 0.01


@given(events, st.integers(0, 50 * MS))
def test_a_loss_cuts_the_window_by_beta_once_per_update_interval(
        steps: list[tuple[int, str | int]], gap: int) -> None:
    cc = cubic()
    now = 0
    for step, event in steps:
        now += step
        apply(cc, now, event)
    now += MIN_UPDATE_INTERVAL_NS + max(cc.rtt_ns, gap)  # well past the last event
    before, events_before = cc.cwnd, cc.congestion_events
    cc.on_loss(now)
    assert cc.congestion_events == events_before + 1
    assert cc.cwnd == max(1, int(before * (1 - CUBIC_BETA)))
    assert cc.w_max == before
    # another gap within the same interval is the same congestion event
    cc.on_loss(now + cc.update_interval_ns - 1)
    assert (cc.cwnd, cc.congestion_events) == (max(1, int(before * (1 - CUBIC_BETA))),
                                               events_before + 1)


@given(st.integers(2, 93), st.integers(1, 20 * MS))
def test_after_a_loss_cubic_regains_its_old_window_after_k_seconds(
        grow_to: int, rtt: int) -> None:
    cc = cubic()
    now = 0
    while cc.cwnd < grow_to:  # grow without loss
        now += cc.update_interval_ns
        cc.on_tick(now)
    w_max = cc.cwnd
    cc.on_rtt(now, rtt)
    cc.on_loss(now)
    assert cc.window < w_max * MTU
    k_ns = int(cc.k * S)
    assert abs(cc.k - math.cbrt(w_max * CUBIC_BETA / CUBIC_C)) < 1e-9
    # concave: below w_max until K, and growing
    previous = cc.window
    while now + cc.update_interval_ns < cc._epoch_ns + k_ns:
        now += cc.update_interval_ns
        assert previous <= cc.on_tick(now) <= w_max * MTU
        previous = cc.window
    cc.on_tick(cc._epoch_ns + k_ns + cc.update_interval_ns)
    assert cc.window >= w_max * MTU


def test_an_rtt_measurement_sets_the_update_interval() -> None:
    cc = cubic()
    cc.on_rtt(0, 5 * MS)
    assert (cc.rtt_ns, cc.update_interval_ns, cc.next_deadline()) == (5 * MS, 5 * MS, 5 * MS)
    cc.on_rtt(0, 10_000)  # faster than the floor: the floor
    assert cc.update_interval_ns == MIN_UPDATE_INTERVAL_NS
    cc.on_rtt(0, 0)  # nonsense is ignored
    assert cc.rtt_ns == 10_000
