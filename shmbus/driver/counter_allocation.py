"""The driver's small uses of its counters section: a counter as a position, several counters
allocated all or none, and freeing them."""

from __future__ import annotations

from collections.abc import Iterable

from shmbus.shm.counters import CountersFullError, CountersManager
from shmbus.shm.position import Position


def position(counters: CountersManager, counter_id: int) -> Position:
    """The counter ``counter_id`` as a position the driver reads and writes."""
    return Position(counters.values, counters.counter_offset(counter_id))


def allocate_all(counters: CountersManager, labelled: list[tuple[str, int]], *,
                 registration_id: int, owner_id: int, reference_id: int) -> list[int]:
    """Allocate (label, type id) counters with the same ids, all or none (CountersFullError
    when they do not all fit)."""
    allocated: list[int] = []
    try:
        for label, type_id in labelled:
            allocated.append(counters.allocate(
                label, type_id, registration_id=registration_id, owner_id=owner_id,
                reference_id=reference_id))
    except CountersFullError:
        free_all(counters, allocated)
        raise
    return allocated


def free_all(counters: CountersManager, counter_ids: Iterable[int]) -> None:
    """Free each of ``counter_ids``."""
    for counter_id in counter_ids:
        counters.free(counter_id)
