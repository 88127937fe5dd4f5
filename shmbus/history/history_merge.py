"""The handover rule of a late joiner, per publishing session: recorded history first, then the
live image, by stream position, with no gap and no duplicate.

Sans-IO: a small state machine told what the recording holds and where the live image joined;
it answers how far to replay and where the live image must start. ``shmbus.history.late_join`` does
the reading.

Positions are stream positions of the session. ``position`` is always the end of the last
message handed out (the start of the next one): the recording is read in ranges that end at
its readable end (the end of a whole message) or at the live image's join position, and
the live image starts at ``position`` (moved there when it joined before it) or, having
joined after it, once the replay reached its join position. A message the replay handed out
that straddles the join position is completed from the recording; its remaining fragments,
the first the live image sees, have no begin flag and are dropped by the reassembly.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from shmbus.settings.errors import ShmbusError


class Phase(enum.Enum):
    """Where a session's messages come from now."""

    REPLAY = "replay"   # from the recording
    LIVE = "live"       # from the live image
    DONE = "done"       # the session ended and every message was handed out


class HistoryGapError(ShmbusError):
    """Neither the recording nor the live log holds a range of a session: the message names
    the session and the positions."""


@dataclass
class SessionMerge:
    """The handover state of one publishing session."""

    session_id: int
    #: the end of the last message handed out: where the next one starts
    position: int
    phase: Phase = Phase.REPLAY
    #: the live image's join position while the replay has not reached it
    live_join: int | None = None

    def replay_range(self, recorded: int) -> tuple[int, int] | None:
        """The range [from, to) of message starts to read from the recording now, which is
        readable up to ``recorded`` (a whole-message end); None when there is nothing."""
        if self.phase is not Phase.REPLAY:
            return None
        end = recorded if self.live_join is None else min(recorded, self.live_join)
        return (self.position, end) if end > self.position else None

    def replayed(self, to: int) -> bool:
        """The messages starting before ``to`` were handed out. True when that reached the live
        image's join position: read the live image from here on (it is at its join)."""
        self.position = max(self.position, to)
        if self.live_join is not None and self.position >= self.live_join:
            self.phase = Phase.LIVE
            self.live_join = None
            return True
        return False

    def image_joined(self, join: int) -> int | None:
        """A live image of the session joined at ``join``. Returns the position to move the
        image to and read it from at once (the replay already passed its join), or None: the
        image waits at its join until the replay reaches it."""
        if join <= self.position:
            self.phase = Phase.LIVE
            self.live_join = None
            return self.position
        self.phase = Phase.REPLAY
        self.live_join = join
        return None

    def delivered_live(self, end: int) -> None:
        """A live message ending at ``end`` was handed out."""
        self.position = end

    def image_lost(self) -> None:
        """The live image went away (its publisher ended, or the subscriber was dropped): what
        it did not hand out comes from the recording."""
        self.phase = Phase.REPLAY
        self.live_join = None

    def source(self, recordings: Sequence[tuple[int, int, bool]]) -> int | None:
        """Which of the session's recordings, given as (start, readable end, active), holds
        the next position: its index, or None when none does yet. A session whose recordings
        all stopped at or before the position, with no live image, is DONE.

        Raises HistoryGapError when a later recording or the live image's join shows that the
        range from the position on was lost (recorded nowhere, and gone from the log).
        """
        if self.phase is not Phase.REPLAY:
            return None
        for index, (start, end, active) in enumerate(recordings):
            if start <= self.position and (active or end > self.position):
                return index
        later = [start for start, _, _ in recordings if start > self.position]
        if self.live_join is not None:
            later.append(self.live_join)
        if later:
            raise HistoryGapError(
                f"session {self.session_id}: positions {self.position} to {min(later)} are in "
                f"no recording and no longer in the live log")
        if recordings and not any(active for _, _, active in recordings):
            self.phase = Phase.DONE
        return None
