"""Process targets for the nemesis's stop flag tests (tests/tools/nemesis/)."""

from __future__ import annotations

from typing import Any


def spin_on_flag(flag: Any) -> None:
    """Read ``flag`` in a loop until it is set (so that a kill lands inside ``is_set()``)."""
    while not flag.is_set():
        pass
