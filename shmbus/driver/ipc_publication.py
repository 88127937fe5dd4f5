"""The driver's side of one IPC publication log: its subscribers, limit, tethering, unblocking
and end of life (docs/protocol.md, IPC flow control).

Pure state and rules over the log and positions; the conductor gives it the time (``now_ms``)
and turns the events it returns into broadcasts. No I/O here besides the log memory itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from shmbus.driver.group_claims import IDLE, SubscriptionGroup
from shmbus.driver.ipc_flow_control import IpcFlowControl
from shmbus.driver.log_unblocker import unblock
from shmbus.shm.block_ring import BlockRing, pid_alive
from shmbus.shm.log_buffer import PARTITION_COUNT, LogBuffer
from shmbus.shm.position import Position


class LinkState(enum.Enum):
    """An untethered subscriber's state; tethered ones stay ACTIVE."""

    ACTIVE = "active"
    LINGER = "linger"     # told its image is unavailable, still counted for one timeout
    RESTING = "resting"   # not counted; rejoins after the resting timeout


@dataclass
class SubscriberLink:
    """One subscription reading this publication: its sub-pos counter and tether state."""

    link_id: int                 # also the image's correlation id on the client side
    subscription_id: int
    client_id: int
    counter_id: int
    position: Position
    tethered: bool
    state: LinkState = LinkState.ACTIVE
    time_of_last_change_ms: int = 0
    #: the consumer group it is a member of: its counter is then its claim record
    group: str | None = None


@dataclass
class PublicationOwner:
    """A client's handle on the publication (one per add_publication call)."""

    registration_id: int
    client_id: int


class PublicationState(enum.Enum):
    ACTIVE = "active"
    DRAINING = "draining"        # no owner left: subscribers read to the end, then it is gone
    DONE = "done"


@dataclass
class Timeouts:
    """Timeouts in ms that IPC publications use."""

    unblock_ms: int
    linger_ms: int
    window_limit_ms: int
    resting_ms: int


@dataclass
class ImageEvent:
    """Tell a subscriber its image became available (True: its position counter holds where
    it joins) or unavailable (False)."""

    available: bool
    link: SubscriberLink


@dataclass
class IpcPublication:
    """One log shared by its owners' publications and read in place by its subscribers."""

    registration_id: int
    session_id: int
    stream_id: int
    channel: str
    exclusive: bool
    log: LogBuffer
    log_file: str
    limit_counter_id: int
    limit: Position
    pub_pos_counter_id: int
    pub_pos: Position
    flow: IpcFlowControl
    endpoint_key: tuple[str, ...] = ("ipc",)
    owners: list[PublicationOwner] = field(default_factory=list)
    subscribers: dict[int, SubscriberLink] = field(default_factory=dict)
    groups: dict[str, SubscriptionGroup] = field(default_factory=dict)
    state: PublicationState = PublicationState.ACTIVE
    time_of_state_change_ms: int = 0
    #: where messages too long for the log go (IPC publications only)
    blocks: BlockRing | None = None
    #: what pub-pos was last set to (the counter itself is shared memory anyone can scribble on)
    _published_position: int = 0
    _last_consumer_position: int = 0
    _time_of_consumer_move_ms: int = 0

    # -- positions ----------------------------------------------------------------------------

    def producer_position(self) -> int:
        return self.log.producer_position()

    def join_position(self) -> int:
        """Where a subscriber that joins now starts: the current producer position."""
        return self.producer_position()

    def _reader_counters(self) -> list[tuple[int, Position]]:
        """The position counters (id, position) of this log's readers: its subscribers that
        are not resting, and its groups' (see SubscriptionGroup.flow_counters)."""
        counted = [(s.counter_id, s.position) for s in self.subscribers.values()
                   if s.state is not LinkState.RESTING and s.group is None]
        for group in self.groups.values():
            counted.extend(group.flow_counters())
        return counted

    def _held(self, position: int) -> int:
        """A consumer position held between the producer position and a log length behind it:
        consumers write their counters, and a position outside these bounds (a buggy client's
        scribble) must not send cleaning or the limit off to it."""
        producer = self.producer_position()
        return min(max(position, producer - PARTITION_COUNT * self.log.term_length), producer)

    def _flow_counters(self) -> list[tuple[int, Position]]:
        """The position counters (id, position) that hold the publisher back."""
        return self._reader_counters()

    def _flow_positions(self, counters: list[tuple[int, Position]] | None = None) -> list[int]:
        """The consumer positions that hold the publisher back (idle group records left out),
        each held between the producer and a log behind it (see _held)."""
        if counters is None:
            counters = self._flow_counters()
        return [self._held(value) for value in (position.get() for _, position in counters)
                if value != IDLE]

    def _update_connected(self, positions: list[int]) -> None:
        connected = bool(positions) and self.state is PublicationState.ACTIVE
        if connected != self.log.is_connected:
            self.log.is_connected = connected

    def _is_drained(self, end: int) -> bool:
        return all(position >= end for position in self._flow_positions(
            self._reader_counters()))

    def update_limit(self) -> int:
        """Sample pub-pos, set pub-lmt from the counted subscribers, clean behind them.

        Returns how many bytes were published since the last call (0: nothing happened).
        """
        producer = self.producer_position()
        published = producer - self._published_position
        if published:
            self._published_position = producer
            self.pub_pos.set(producer)
        counters = self._flow_counters()
        positions = self._flow_positions(counters)
        if self.state is PublicationState.ACTIVE:
            self.flow.set_counted([counter_id for counter_id, _ in counters])
            self.flow.update(positions)
        else:
            self.flow.set_counted(())
        self._update_connected(positions)
        self.reclaim_blocks(positions)
        return published

    def reclaim_blocks(self, positions: list[int], *, check_writers: bool = False) -> int:
        """Free the large-message blocks every counted reader has passed (with
        ``check_writers``, also those a dead writer left half-made). Returns bytes freed."""
        if self.blocks is None:
            return 0
        producer = self.producer_position()
        consumer = min(positions) if positions else producer
        return self.blocks.reclaim(consumer, producer, pid_alive if check_writers else None)

    # -- timers -------------------------------------------------------------------------------

    def on_timer(self, now_ms: int, timeouts: Timeouts) -> tuple[list[ImageEvent], bool]:
        """Tethering, unblocking and draining checks; returns (image events, unblocked)."""
        events = self._check_untethered(now_ms, timeouts)
        unblocked = self._check_blocked(now_ms, timeouts)
        self.flow.release_dead_lock(pid_alive)
        self.reclaim_blocks(self._flow_positions(), check_writers=True)
        if self.state is PublicationState.DRAINING:
            lingered = now_ms - self.time_of_state_change_ms > timeouts.linger_ms
            if self._is_drained(self.log.end_of_stream_position) or lingered:
                self.state = PublicationState.DONE
                events.extend(ImageEvent(False, s) for s in self.subscribers.values()
                              if s.state is LinkState.ACTIVE)
        return events, unblocked

    def _check_untethered(self, now_ms: int, timeouts: Timeouts) -> list[ImageEvent]:
        events: list[ImageEvent] = []
        untethered = [s for s in self.subscribers.values() if not s.tethered]
        if not untethered:
            return events
        window = self.flow.window
        consumer = max((self._held(s.position.get()) for s in self.subscribers.values()
                        if s.state is not LinkState.RESTING and s.group is None),
                       default=self.producer_position())
        window_floor = consumer - window + window // 8
        for link in untethered:
            if link.state is LinkState.ACTIVE:
                if self._held(link.position.get()) > window_floor:
                    link.time_of_last_change_ms = now_ms
                elif now_ms - link.time_of_last_change_ms > timeouts.window_limit_ms:
                    link.state = LinkState.LINGER
                    link.time_of_last_change_ms = now_ms
                    events.append(ImageEvent(False, link))
            elif link.state is LinkState.LINGER:
                if now_ms - link.time_of_last_change_ms > timeouts.window_limit_ms:
                    link.state = LinkState.RESTING
                    link.time_of_last_change_ms = now_ms
            elif now_ms - link.time_of_last_change_ms > timeouts.resting_ms:
                link.position.set(consumer)
                link.state = LinkState.ACTIVE
                link.time_of_last_change_ms = now_ms
                events.append(ImageEvent(True, link))
        return events

    def _check_blocked(self, now_ms: int, timeouts: Timeouts) -> bool:
        """Unblock a log stuck at a dead writer's frame (concurrent, or any while draining)."""
        positions = self._flow_positions()
        if not positions:
            return False
        consumer = min(positions)
        producer = self.producer_position()
        if consumer != self._last_consumer_position or producer <= consumer:
            self._last_consumer_position = consumer
            self._time_of_consumer_move_ms = now_ms
            return False
        if self.exclusive and self.state is PublicationState.ACTIVE:
            return False
        if now_ms - self._time_of_consumer_move_ms <= timeouts.unblock_ms:
            return False
        self._time_of_consumer_move_ms = now_ms
        return unblock(self.log, consumer, producer)

    # -- lifecycle ----------------------------------------------------------------------------

    def remove_owner(self, registration_id: int, now_ms: int) -> bool:
        """Drop one owner; at the last, start draining. True if the owner was known."""
        before = len(self.owners)
        self.owners = [o for o in self.owners if o.registration_id != registration_id]
        if len(self.owners) == before:
            return False
        if not self.owners and self.state is PublicationState.ACTIVE:
            self.state = PublicationState.DRAINING
            self.time_of_state_change_ms = now_ms
            end = self.producer_position()
            self.log.end_of_stream_position = end
            self.limit.set(end)
            self._update_connected([])
        return True


@dataclass
class NetworkPublication(IpcPublication):
    """A publication on a udp channel: the netbridge sends it and owns snd-pos and
    is-connected; the limit follows the sender position, and a term is kept behind it
    uncleaned for retransmits."""

    snd_pos_counter_id: int = 0
    snd_lmt_counter_id: int = 0
    snd_bpe_counter_id: int = 0
    snd_pos: Position | None = None

    #: a spy subscribed with ssc=true counts as a connection
    spies_simulate_connection: bool = False

    def _network_connected(self) -> bool:
        """The netbridge's sender hears receivers (it keeps the active transport count)."""
        return self.log.active_transport_count > 0

    def _flow_counters(self) -> list[tuple[int, Position]]:
        network = self._network_connected()
        spies = super()._flow_counters()
        if not network and not (spies and self.spies_simulate_connection):
            return []
        if network and self.snd_pos is not None:
            spies.append((self.snd_pos_counter_id, self.snd_pos))
        return spies

    def _is_drained(self, end: int) -> bool:
        return self.snd_pos is not None and self.snd_pos.get() >= end and super()._is_drained(
            end)
