"""Multi-destination-cast destination tracking and multicast NAK delay/suppression."""

from __future__ import annotations

import random

from netbridge.destinations import DestinationTracker
from netbridge.loss_detector import LossDetector, multicast_nak_delay


def test_manual_destinations_are_added_and_removed() -> None:
    tracker = DestinationTracker(dynamic=False)
    tracker.add(("10.0.0.2", 4000))
    tracker.add(("10.0.0.3", 4000))
    assert tracker.changes() == ([("10.0.0.2", 4000), ("10.0.0.3", 4000)], [])
    tracker.on_status_message(("10.0.0.9", 1), now_ns=5)  # manual: SMs add nobody
    tracker.remove(("10.0.0.2", 4000))
    tracker.on_idle(10**12)  # manual destinations never time out
    assert tracker.changes() == ([], [("10.0.0.2", 4000)])
    assert tracker.destinations == [("10.0.0.3", 4000)]


def test_dynamic_destinations_join_by_status_message_and_time_out() -> None:
    tracker = DestinationTracker(dynamic=True, timeout_ns=5_000)
    tracker.on_status_message("a", 0)
    tracker.on_status_message("b", 1_000)
    assert tracker.changes() == (["a", "b"], [])
    tracker.on_status_message("a", 4_000)  # a refreshes, b stays silent
    tracker.on_idle(6_500)
    assert tracker.changes() == ([], ["b"])
    tracker.on_status_message("b", 7_000)  # back again: added anew (gets a SETUP)
    assert tracker.changes() == (["b"], [])


def test_multicast_nak_delay_is_spread_over_the_back_off() -> None:
    delay = multicast_nak_delay(random.Random(1), group_size=10, max_backoff_ns=10_000_000)
    delays = [delay() for _ in range(2000)]
    assert 0 <= min(delays) and max(delays) <= 10_000_000
    assert len(set(delays)) > 1000  # random, not one fixed value
    assert sum(d < 5_000_000 for d in delays) < sum(d >= 5_000_000 for d in delays)


def test_a_heard_nak_suppresses_our_own() -> None:
    detector = LossDetector(0, 65536, nak_delay=lambda: 5_000, nak_retry_ns=10_000)
    detector.on_data(0, 0, 64)
    detector.on_data(0, 128, 192)  # gap [64, 128)
    detector.on_data(0, 256, 320)  # gap [192, 256)
    assert detector.poll(4_000) == []  # not yet due
    assert detector.on_nak_heard(4_500, 64, 64) == 1  # someone else NAKed the first gap
    naks = detector.poll(5_000)
    assert [(n.position, n.length) for n in naks] == [(192, 64)]
    naks = detector.poll(14_500)
    assert [(n.position, n.length) for n in naks] == [(64, 64)]  # retried only after silence
