"""The handover rule (shmbus.history.history_merge) against a model: a session's messages (some of
several frames), a recording that grows by whole messages, a live image that joins at any
frame boundary the log holds, replay steps cut at any message, and live reads. Whatever the
order, every message from the requested position on is handed out once, in order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmbus.history.history_merge import HistoryGapError, Phase, SessionMerge

FRAME = 32


def layout(frame_counts: list[int]) -> list[tuple[int, int, list[int]]]:
    """(start, end, frame starts) of consecutive messages of the given frame counts."""
    messages, position = [], 0
    for count in frame_counts:
        frames = [position + FRAME * k for k in range(count)]
        messages.append((position, position + FRAME * count, frames))
        position += FRAME * count
    return messages


class Model:
    def __init__(self, messages: list[tuple[int, int, list[int]]], first: int) -> None:
        self.messages = messages
        self.merge = SessionMerge(7, messages[first][0])
        self.expected = [m[0] for m in messages[first:]]
        self.recorded = messages[first][0]   # readable end of the recording
        self.produced = messages[-1][1]      # the whole stream is in the log already
        self.live_at: int | None = None      # the live image's read position
        self.delivered: list[int] = []

    def record(self) -> None:
        ends = [end for _, end, _ in self.messages if end > self.recorded]
        if ends:
            self.recorded = ends[0]

    def join(self, boundary: int) -> None:
        if self.live_at is not None:
            return
        frames = [f for _, _, fs in self.messages for f in fs] + [self.produced]
        join = frames[boundary % len(frames)]
        move = self.merge.image_joined(join)
        self.live_at = join if move is None else move

    def replay(self, limit: int) -> None:
        span = self.merge.replay_range(self.recorded)
        if span is None:
            self.merge.replayed(self.merge.position)
            return
        start, end = span
        batch = [m for m in self.messages if start <= m[0] < end]
        assert all(m[1] <= self.recorded for m in batch), "a message read past the recording"
        if len(batch) > limit:
            batch = batch[:limit]
            end = batch[-1][1]
        self.delivered += [m[0] for m in batch]
        self.merge.replayed(max([end] + [m[1] for m in batch]))

    def live(self) -> None:
        if self.merge.phase is not Phase.LIVE or self.live_at is None:
            return
        for start, end, _frames in self.messages:
            if end <= self.live_at:
                continue
            if start >= self.live_at:  # whole messages; one begun before is dropped
                self.delivered.append(start)
                self.merge.delivered_live(end)
        self.live_at = self.produced


@given(st.lists(st.integers(1, 4), min_size=2, max_size=40), st.data())
def test_every_message_from_the_position_once_in_order(frame_counts: list[int],
                                                       data: st.DataObject) -> None:
    messages = layout(frame_counts)
    first = data.draw(st.integers(0, len(messages) - 1))
    model = Model(messages, first)
    steps = data.draw(st.lists(st.tuples(st.sampled_from(["record", "join", "replay", "live"]),
                                         st.integers(0, 200)), max_size=80))
    for action, n in steps:
        if action == "record":
            for _ in range(n % 5 + 1):
                model.record()
        elif action == "join":
            model.join(n)
        elif action == "replay":
            model.replay(n % 7 + 1)
        else:
            model.live()
    # then the recorder catches up, the image joins if it has not, and both are drained
    while model.recorded < model.produced:
        model.record()
    model.join(data.draw(st.integers(0, 200)))
    for _ in range(len(messages) + 2):
        model.replay(1000)
        model.live()
    assert model.merge.phase is Phase.LIVE
    assert model.delivered == model.expected


def test_source_picks_the_recording_that_holds_the_position_and_names_a_gap() -> None:
    merge = SessionMerge(5, 1024)
    assert merge.source([(0, 512, False), (512, 4096, True)]) == 1
    assert merge.source([(0, 2048, False)]) == 0
    with pytest.raises(HistoryGapError, match="session 5: positions 1024 to 1536"):
        merge.source([(0, 1024, False), (1536, 4096, True)])
    merge.image_joined(8192)
    with pytest.raises(HistoryGapError, match="positions 1024 to 8192"):
        merge.source([(0, 1024, False)])
    done = SessionMerge(6, 1024)
    assert done.source([(0, 1024, False)]) is None and done.phase is Phase.DONE
    waiting = SessionMerge(7, 1024)
    assert waiting.source([]) is None and waiting.phase is Phase.REPLAY


def test_an_image_lost_mid_stream_falls_back_to_the_recording() -> None:
    merge = SessionMerge(8, 0)
    assert merge.image_joined(0) == 0 and merge.phase is Phase.LIVE
    merge.delivered_live(640)
    merge.image_lost()
    assert merge.phase is Phase.REPLAY and merge.replay_range(1024) == (640, 1024)
