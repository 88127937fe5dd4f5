"""Join positions against a model (shmbus/driver/log_history.py: retained_range, check_join;
shmbus/settings/channel_uri.py: the join-position parameter).

In one process, the driver's part played by the test: a log written with messages of random
lengths (fragmented ones, padding at term ends), cleaned behind a reader to a random position.
The model knows where each message starts and ends and where padding lies. Property, for
positions before, at and after term boundaries, the clean position, the retained range's
ends, fragment boundaries and anywhere:

* check_join takes a position exactly when it is in the retained range (earliest..end) and is
  the start of a whole message, of padding, or the end; anything else is JoinPositionGone
  naming the position, why, and the range the log holds;
* a reader started at a taken position gets exactly the model's messages from there on; one
  started at ``earliest`` gets the whole messages that start at or after it (a message the
  cleaning cut is not handed out in part);
* the join-position parameter is 'earliest' or a stream position (a multiple of 32, at least 0,
  below 2**63); anything else is a ChannelUriError naming the parameter.
"""

from __future__ import annotations

import mmap
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shmbus import ExclusivePublication, Image, Subscription
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.driver.log_history import (
    JoinPositionGone,
    check_join,
    clean_position,
    retained_range,
)
from shmbus.settings.channel_uri import ChannelUri, ChannelUriError
from shmbus.shm._native import AtomicBuffer
from shmbus.shm.log_buffer import FRAME_ALIGNMENT, HEADER_LENGTH, LogBuffer, align
from shmbus.shm.position import Position

TERM = 64 * 1024
MTU = 1408
MAX_PAYLOAD = MTU - HEADER_LENGTH


def frames_length(n: int) -> int:
    """The log bytes of a message of ``n`` bytes: its fragments' frames, aligned."""
    if n == 0:
        return align(HEADER_LENGTH)
    whole, rest = divmod(n, MAX_PAYLOAD)
    return whole * align(HEADER_LENGTH + MAX_PAYLOAD) + (align(HEADER_LENGTH + rest)
                                                         if rest else 0)


class Written:
    """The log and the model of what is in it."""

    def __init__(self, directory: Path, lengths: list[int], clean_at: float) -> None:
        self.log = LogBuffer.create(directory / "1.log", term_length=TERM, initial_term_id=-3,
                                    mtu=MTU, session_id=11, stream_id=12)
        self.positions = AtomicBuffer(mmap.mmap(-1, 4096))
        limit = Position(self.positions, 0)
        flow = IpcFlowControl(self.log, limit)
        self.log.is_connected = True
        publication = ExclusivePublication(self.log, limit)
        #: (start, end, payload) of each message; padding's (start, end)
        self.messages: list[tuple[int, int, bytes]] = []
        self.padding: list[tuple[int, int]] = []
        for n, length in enumerate(lengths):
            payload = bytes([n % 251]) * length
            before = publication.position
            # a reader keeps up a term behind (at a message start, as readers are); cleaned
            # behind it as the driver does
            limit.set(before + TERM)
            behind = [start for start, _, _ in self.messages if start <= before - TERM]
            if behind:
                flow.clean_to(behind[-1])
            end = publication.offer(payload)
            if end < 0:  # term rotation: offered again
                end = publication.offer(payload)
            assert end > 0, end
            start = end - frames_length(length)
            if start != before:
                self.padding.append((before, start))
            self.messages.append((start, end, payload))
        self.end = publication.position
        # readers moved on to some frame (a reader is always at one): cleaned behind them
        boundaries = sorted(self.frame_starts() | {self.end})
        flow.clean_to(boundaries[min(len(boundaries) - 1, int(clean_at * len(boundaries)))])
        self.clean = clean_position(self.log)
        self.publication = publication

    def frame_starts(self) -> set[int]:
        starts = {start for start, _ in self.padding}
        for start, _, payload in self.messages:
            fragments = max(1, -(-len(payload) // MAX_PAYLOAD))
            starts |= {start + k * align(HEADER_LENGTH + MAX_PAYLOAD) for k in range(fragments)}
        return starts

    def valid(self, position: int) -> bool:
        """Whether a strict join at ``position`` is one: in the retained range, at the start
        of a whole message or of padding, or the end."""
        earliest, end = retained_range(self.log)
        if not earliest <= position <= end:
            return False
        return position == end or any(start == position for start, _, _ in self.messages) or \
            any(start == position for start, _ in self.padding)

    def from_(self, position: int) -> list[bytes]:
        """The messages a reader starting at ``position`` gets: those starting there or later."""
        return [payload for start, _, payload in self.messages if start >= position]

    def candidates(self) -> list[int]:
        """Positions worth trying: every edge the log has, and its neighbours."""
        earliest, end = retained_range(self.log)
        edges = {0, earliest, end, self.clean, 2**62}
        edges |= {k * TERM for k in range(end // TERM + 2)}
        edges |= self.frame_starts()  # fragment boundaries inside messages among them
        near = {p + d for p in edges for d in (-FRAME_ALIGNMENT, -1, 0, 1, FRAME_ALIGNMENT)}
        return sorted(p for p in near if p >= 0)

    def read_from(self, join: int) -> list[bytes]:
        self.positions.put_int64(64, join)
        sub = Subscription("aeron:ipc", 12)
        sub.images = (Image(self.log, Position(self.positions, 64)),)
        got = []
        for _ in range(10_000):
            message = sub._take()
            if message is None:
                return got
            got.append(message)
        raise AssertionError("never ran dry")

    def close(self) -> None:
        self.publication.close()
        self.log.close()


lengths = st.lists(st.one_of(st.integers(0, 200), st.integers(MAX_PAYLOAD - 40, 3 * MTU),
                             st.integers(3 * MTU, 8 * 1024)), min_size=5, max_size=80)


@given(lengths=lengths, clean_at=st.floats(0, 1), picks=st.lists(st.integers(0, 10**6),
                                                                   max_size=20))
# a log gone round its three terms, with padding at most term ends, cleaned half way / not
@example(lengths=[8000] * 30 + [100] * 7, clean_at=0.5, picks=[])
@example(lengths=[7000, 3000, 40] * 12, clean_at=0.0, picks=[])
@settings(max_examples=100)
def test_check_join_takes_exactly_the_message_starts_in_the_retained_range(
        lengths: list[int], clean_at: float, picks: list[int]) -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        written = Written(Path(tmp), lengths, clean_at)
        try:
            earliest, end = retained_range(written.log)
            assert written.clean <= earliest or earliest == 0 or earliest >= end - 2 * TERM
            assert earliest <= end == written.end
            candidates = written.candidates()
            tried = candidates if len(candidates) <= 200 else \
                [candidates[p % len(candidates)] for p in picks] + candidates[-40:]
            for position in tried:
                try:
                    taken = check_join(written.log, position)
                except JoinPositionGone as e:
                    assert not written.valid(position), f"{position} refused: {e}"
                    text = str(e)
                    assert f"join-position {position} " in text, text
                    assert f"holds positions {earliest} to {end}" in text, text
                    continue
                assert written.valid(position), f"{position} taken, not a message start"
                assert taken == position
                assert written.read_from(position) == written.from_(position), position
            # 'earliest': whole messages from there, none cut by the cleaning in part
            assert written.read_from(earliest) == written.from_(earliest)
        finally:
            written.close()


@given(st.one_of(st.text(max_size=30), st.sampled_from(
    ["earliest", "0", "32", "33", "-32", "+32", " 32", "32 ", "0x20", "1e3", "²", "٣٢",
     "3" + "2" * 19, str(2**63 - 32), str(2**63), str(2**64), "9" * 5000, "", "Earliest"])))
@settings(max_examples=300)
def test_the_join_position_parameter_is_earliest_or_a_stream_position(value: str) -> None:
    uri = "aeron:ipc?join-position=" + value
    try:
        parsed = ChannelUri.parse(uri)
    except ChannelUriError as e:
        assert "join-position" in str(e) or "|" in value or "=" in value or \
            not value.isprintable(), str(e)
        return
    position = parsed.join_position
    if position == "earliest":
        assert value == "earliest"
        return
    assert isinstance(position, int) and 0 <= position < 2**63 and position % 32 == 0
    assert value.isascii() and value.isdigit()


@pytest.mark.parametrize("value", ["²", "9" * 5000, str(2**63)])
def test_a_join_position_no_int64_holds_is_named(value: str) -> None:
    with pytest.raises(ChannelUriError, match="join-position"):
        ChannelUri.parse("aeron:ipc?join-position=" + value)
