"""Result codes of Publication.offer and friends, with Aeron's values, and the poll actions."""

from __future__ import annotations

import enum

#: No subscriber is connected (may be transient).
NOT_CONNECTED = -1
#: The slowest subscriber is a full window behind: retry later.
BACK_PRESSURED = -2
#: The log rotated to a new term during the call: retry at once.
ADMIN_ACTION = -3
#: The publication is closed.
CLOSED = -4
#: The stream reached term length * 2^31 bytes: close and re-create the publication.
MAX_POSITION_EXCEEDED = -5

_NAMES = {
    NOT_CONNECTED: "NOT_CONNECTED",
    BACK_PRESSURED: "BACK_PRESSURED",
    ADMIN_ACTION: "ADMIN_ACTION",
    CLOSED: "CLOSED",
    MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
}


def result_name(result: int) -> str:
    """A readable name for an offer result: the code's name, or 'position N'."""
    return _NAMES.get(result, f"position {result}" if result >= 0 else f"unknown code {result}")


class Action(enum.IntEnum):
    """What a controlled-poll handler tells the image to do with the fragment it was given."""

    #: Not consumed: stop polling; the fragment is delivered again on the next poll.
    ABORT = 1
    #: Consumed: stop polling after this fragment.
    BREAK = 2
    #: Consumed: save the position now and continue.
    COMMIT = 3
    #: Consumed: continue (returning None means the same).
    CONTINUE = 4
