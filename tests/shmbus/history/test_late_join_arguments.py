"""A late joiner's from_position and last, whatever a caller passes (shmbus/history/late_join.py):
taken exactly when from_position is a stream position (an int, not a bool, 0 <= p < 2**63, a
multiple of 32) or 'start', and last an int >= 0; anything else is a ValueError naming the
argument, before anything is read (a float used to mean 'from the start')."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus.history.late_join import LateJoinSubscription, Recording
from shmbus.settings.channel_uri import ChannelUriError

#: a channel a late joiner refuses after its arguments are checked: reaching this refusal
#: means the arguments were taken
TAKEN = "aeron:ipc?join-position=0"

values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                   st.integers(0, 2**20).map(lambda n: 32 * n),
                   st.sampled_from([2**63 - 32, 2**63, 32.0, float("nan"), "start", "Start",
                                    "0", "earliest", b"start", [0]]),
                   st.floats(allow_nan=False), st.text(max_size=5))


def outcome(**arguments: Any) -> str:
    try:
        LateJoinSubscription(None, TAKEN, 1, Recording("/nonexistent"),  # type: ignore[arg-type]
                             **arguments)
    except ChannelUriError as e:
        assert "sets join-position itself" in str(e), str(e)
        return "taken"
    except ValueError as e:
        return str(e)
    raise AssertionError("a late joiner was made without a client")


def position(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**63 and value % 32 == 0


@given(values)
@settings(max_examples=300)
def test_from_position_is_a_stream_position_or_start(value: Any) -> None:
    got = outcome(from_position=value)
    if value is None or value == "start" or position(value):
        assert got == "taken", got
    else:
        assert got.startswith(f"from_position={value!r}") or \
            got.startswith(f"from_position={value}"), got


@given(values)
@settings(max_examples=200)
def test_last_is_an_int_of_at_least_zero(value: Any) -> None:
    got = outcome(last=value)
    if value is None or (type(value) is int and value >= 0):
        assert got == "taken", got
    else:
        assert got.startswith(f"last={value!r}"), got
