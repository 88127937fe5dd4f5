"""The snapshot's pure parts: the tail's position, an image's contiguous data, live values
put into the counters, the verdicts over counted readers, and the rules a snapshot's streams
must keep."""

from __future__ import annotations

import dataclasses

import pytest

from shmbus.cli import snapshot as bussnapshot
from shmbus.cli.stream_views import StreamView, SubscriberView, Verdict
from shmbus.cli.verdicts import stream_problems, verdict
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.counters import Counter
from shmbus.shm.log_buffer import (
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    UNFRAGMENTED,
    encode_data_header,
    log_length,
)

T = 65536
KIB = 1024


def raw(term_id: int, offset: int) -> int:
    value = ((term_id & 0xFFFFFFFF) << 32) | offset
    return value - 2**64 if value >= 2**63 else value  # as an acquire load returns it


@pytest.mark.parametrize("term_count, term_id, offset, initial, expected", [
    (0, 0, 4096, 0, 4096),
    (2, 7, 100, 5, 2 * T + 100),
    (1, 1, T + 224, 0, 2 * T),               # a claim past the term's end: capped
    (3, 2, 96, 0, 3 * T),                    # rotation half done: the new term's start
    (1, -(2**31), 32, 2**31 - 1, T + 32),    # the term id wraps around int32
    (4, -3, 64, -7, 4 * T + 64),             # negative ids
])
def test_tail_position(term_count: int, term_id: int, offset: int, initial: int,
                       expected: int) -> None:
    assert bussnapshot.tail_position(term_count, raw(term_id, offset), T, initial) == expected


def counter(counter_id: int, type_id: int, value: int, registration_id: int = 5,
            reference_id: int = -77, label: str = "x: 5 -77 7 aeron:ipc") -> Counter:
    return Counter(counter_id, type_id, label, value, registration_id, 3, reference_id, b"")


def test_live_values_replace_the_copied_ones() -> None:
    copied = (counter(1, 1, 1000), counter(2, 12, 10), counter(3, 4, 50, 9, 5),
              counter(4, 4, 70, 10, 6), counter(5, 2, 30))
    assert bussnapshot.reader_counters(copied, 5) == [3, 5]
    live = {5: bussnapshot.LivePositions({3: 900, 5: 950}, 1200, 1100, frozenset({3}))}
    values = {c.counter_id: c.value for c in bussnapshot.with_live_values(copied, live)}
    # pub-lmt, pub-pos (the tail), the log's readers; another log's reader is left alone
    assert values == {1: 1100, 2: 1200, 3: 900, 4: 70, 5: 950}


def test_live_image_rcv_pos_replaces_the_netbridge_mirror() -> None:
    copied = (counter(1, 5, 1000, 20, -5), counter(2, 4, 900, 21, 20), counter(3, 3, 1100, 20))
    live = bussnapshot.with_live_values(copied, {}, {20: bussnapshot.LiveImage({2: 1500}, 1600)})
    assert [c.value for c in live] == [1600, 1500, 1100]  # rcv-pos, sub-pos; rcv-hwm as copied


def frame(log: bytearray, position: int, length: int, term_id: int,
          frame_type: int = HDR_TYPE_DATA) -> None:
    offset = (position // T) % 3 * T + position % T
    header = encode_data_header(length, UNFRAGMENTED, frame_type, position % T, -5, 7, term_id)
    log[offset:offset + len(header)] = header


def test_contiguous_end_stops_at_a_gap_or_a_stale_term() -> None:
    log = bytearray(log_length(T))
    frame(log, 0, 132, 10)                    # 160 bytes aligned
    frame(log, 160, 64, 10)
    frame(log, 224 + 32, 64, 10)              # after a 32-byte gap
    buffer = AtomicBuffer(log)
    assert bussnapshot.contiguous_end(buffer, 0, T, 10, 10 * T) == 224
    assert bussnapshot.contiguous_end(buffer, 224, T, 10, 10 * T) == 224
    assert bussnapshot.contiguous_end(buffer, 0, T, 10, 100) == 160  # at most the limit
    # padding to the term's end, then the next term (id 11); term 2 still holds term 9's
    frame(log, T - 128, 128, 10, HDR_TYPE_PAD)
    frame(log, T, 32, 11)
    frame(log, T + 32, 32, 9)                 # left from three terms before
    assert bussnapshot.contiguous_end(buffer, T - 128, T, 10, 10 * T) == T + 32


def sub(pid: int, position: int, pub_pos: int, counted: bool = True) -> SubscriberView:
    return SubscriberView(pid, pid, pid, f"w{pid}", pid, position, pub_pos - position,
                          counted=counted)


def test_free_is_the_room_the_counted_readers_leave_and_never_exceeds_the_window() -> None:
    window = 512 * KIB
    # the driver's old sample would say 18.5 MiB "left"; the live tail leaves 100 KiB
    free = verdict(1000 * KIB, 1024 * KIB, window, [sub(1, 588 * KIB, 1000 * KIB)])
    assert (free.state, free.free) == ("free", 100 * KIB)
    assert free.sentence == "free: 100 KiB of window left"
    # pub-lmt not raised yet (publishers raise it when they reach it): the room is the window's
    lazy = verdict(1000 * KIB, 1001 * KIB, window, [sub(1, 1000 * KIB, 1000 * KIB)])
    assert lazy.free == window


def test_held_at_the_limit_or_a_window_ahead_names_the_slowest_counted_reader() -> None:
    window = 32 * KIB
    at_limit = verdict(100 * KIB + 32, 100 * KIB, window,
                       [sub(1, 100 * KIB, 100 * KIB + 32), sub(2, 68 * KIB, 100 * KIB)])
    assert at_limit.state == "held" and [s.pid for s in at_limit.held_by] == [2]
    assert at_limit.free is None
    # below a limit the slowest reader has not caught up with: it is still a window behind
    window_behind = verdict(100 * KIB, 101 * KIB, window, [sub(2, 68 * KIB, 100 * KIB)])
    assert window_behind.state == "held" and [s.pid for s in window_behind.held_by] == [2]
    # a resting (uncounted) subscriber holds nobody, however far behind
    resting = verdict(100 * KIB, 100 * KIB, window,
                      [sub(3, 0, 100 * KIB, counted=False), sub(4, 90 * KIB, 100 * KIB)])
    assert [s.pid for s in resting.held_by] == [4]
    alone = verdict(100 * KIB, 100 * KIB, window, [sub(3, 0, 100 * KIB, counted=False)])
    assert alone.state == "not-connected"


def stream(subscribers: list[SubscriberView], pub_pos: int, pub_lmt: int,
           window: int = 32 * KIB, source: str = "log") -> StreamView:
    result = verdict(pub_pos, pub_lmt, window, subscribers)
    return StreamView("publication", 7, -77, "aeron:ipc", 5, 42, "pub", pub_pos,
                      pub_lmt, window, 2 * window, None, None, tuple(subscribers),
                      result, (), source)


def test_the_rules_pass_a_consistent_view_and_name_each_break() -> None:
    good = stream([sub(1, 68 * KIB, 100 * KIB + 128)], 100 * KIB + 128, 100 * KIB)
    assert stream_problems(good, max_claim=160) == []
    assert stream_problems(stream([sub(1, 90 * KIB, 100 * KIB)], 100 * KIB,
                                  110 * KIB), 160) == []

    ahead = stream([sub(1, 2241209792, 2221867168)], 2221867168, 2241268544, 512 * KIB)
    assert stream_problems(ahead, 160) == [  # the stale-sample snapshot
        "pid 1 (w1) is 18.4 MiB ahead of pub-pos",
        "free 19866912 is not within the window 524288"]

    past = stream([sub(1, 60 * KIB, 100 * KIB)], 100 * KIB, 99 * KIB)
    assert stream_problems(past, 160) == [
        "pub-pos 102,400 is a claim or more past pub-lmt 101,376"]

    too_free = dataclasses.replace(good, verdict=Verdict("free", "free", free=64 * KIB))
    assert stream_problems(too_free, 160) == [
        "free 65536 is not within the window 32768"]

    wrong = dataclasses.replace(good, subscribers=(*good.subscribers, sub(2, 0, good.pub_pos)))
    assert stream_problems(wrong, 160) == [
        "the verdict names a holder that is not the slowest counted reader (at 0): held by "
        "subscriber pid 1 (w1), 32.1 KiB behind; window 32 KiB"]

    nobody = dataclasses.replace(good, verdict=Verdict("held", "held by ?"))
    assert stream_problems(nobody, 160) == ["held, but the verdict names no holder: "
                                            "held by ?"]
    # the driver's sample promises nothing: no rules
    assert stream_problems(dataclasses.replace(ahead, position_source="counter"),
                           160) == []
