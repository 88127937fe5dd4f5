"""The one timeout rule of every call that can wait, in every process.

``timeout=None`` waits forever; ``timeout=0`` tries once and never sleeps; a number is a
deadline, in seconds from the call. A call may keep a number as its default, and its
docstring names it. A negative or NaN timeout is refused with a ValueError that names it.
"""

from __future__ import annotations

import math
import time


def deadline_after(timeout: float | None) -> float:
    """The ``time.monotonic()`` second at which a call given ``timeout`` gives up: ``inf`` for
    None, now for 0. ValueError for a negative or NaN timeout."""
    if timeout is None:
        return math.inf
    if not timeout >= 0:  # (also refuses NaN)
        raise ValueError(f"timeout must be None (forever) or >= 0 seconds, not {timeout!r}")
    return time.monotonic() + timeout
