"""The driver's side of an image the netbridge rebuilds from the network.

The netbridge writes the log and owns rcv-hwm and rcv-pos; the driver owns the file, the
subscriber links (sub-pos counters) and the image's end of life: after the netbridge closes
the image, subscribers may read what is left until they reach rcv-pos or the linger timeout.

Subscription groups work on an image as on an IPC publication's log (group_claims.py): the
members claim from the image's log, and the netbridge's receiver counts the group's flow
counters (grp-pos, grp-orphan, the claim records; idle ones read above any position) among the
subscriber positions its window and term cleaning follow, so a claim not done is never
overwritten. This is what lets a pool of responders serve a service over UDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shmbus.driver.group_claims import SubscriptionGroup
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
    groups: dict[str, SubscriptionGroup] = field(default_factory=dict)

    @property
    def registration_id(self) -> int:
        """The image's id (what a group's counters name, as a publication's registration id)."""
        return self.image_id

    def is_done(self, now_ms: int, linger_ms: int) -> bool:
        """Closed by the netbridge, and every subscriber has read to the end (or lingered)."""
        if self.closing_since_ms is None:
            return False
        end = self.rcv_pos.get()
        drained = (all(s.position.get() >= end for s in self.subscribers.values())
                   and all(g.position.get() >= end for g in self.groups.values()))
        return drained or now_ms - self.closing_since_ms > linger_ms

    def subscriber_counter_ids(self) -> str:
        """The counters the netbridge's receiver follows: plain subscribers' sub-pos, and each
        group's flow counters (its members' claim records among them)."""
        ids = [s.counter_id for s in self.subscribers.values() if s.group is None]
        for group in self.groups.values():
            ids.extend(counter_id for counter_id, _ in group.flow_counters())
        return ",".join(str(counter_id) for counter_id in ids)
