"""The driver's side of an image the netbridge rebuilds from the network.

The netbridge writes the log and owns rcv-hwm and rcv-pos; the driver owns the file, the
subscriber links (sub-pos counters) and the image's end of life: after the netbridge closes
the image, subscribers may read what is left until they reach rcv-pos or the linger timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shmbus.driver.ipc_publication import SubscriberLink
from shmbus.shm.log_buffer import LogBuffer
from shmbus.shm.position import Position


@dataclass
class NetworkImage:
    """One remote publisher's session as received on a channel."""

    image_id: int
    channel: str
    session_id: int
    stream_id: int
    source_identity: str
    log: LogBuffer
    log_file: str
    rcv_hwm_counter_id: int
    rcv_pos_counter_id: int
    rcv_pos: Position
    join_position: int
    subscribers: dict[int, SubscriberLink] = field(default_factory=dict)
    closing_since_ms: int | None = None

    def is_done(self, now_ms: int, linger_ms: int) -> bool:
        """Closed by the netbridge, and every subscriber has read to the end (or lingered)."""
        if self.closing_since_ms is None:
            return False
        end = self.rcv_pos.get()
        drained = all(s.position.get() >= end for s in self.subscribers.values())
        return drained or now_ms - self.closing_since_ms > linger_ms

    def subscriber_counter_ids(self) -> str:
        return ",".join(str(s.counter_id) for s in self.subscribers.values())
