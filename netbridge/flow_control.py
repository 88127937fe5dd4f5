"""Sender flow-control strategies: how a publication turns receivers' status messages into its
sender limit (docs/protocol.md, Flow control).

A strategy is pure state over positions and nanosecond timestamps, with no clock and no I/O.
The :class:`~netbridge.sender.NetworkSender` owns one instance and calls it as follows:

* :meth:`FlowControl.initialize` once, before anything else, with the stream's geometry;
* :meth:`FlowControl.on_status_message` for every status message without the SETUP flag that
  names the sender's session and stream; the result becomes the new sender limit;
* :meth:`FlowControl.on_idle` on every sender poll (it may expire receivers); the result
  becomes the new sender limit;
* :meth:`FlowControl.has_required_receivers` when the sender reports whether it is connected.

Every strategy keeps the receivers it hears from (:class:`Receiver`: position, window, source,
last heard), so the process layer can count them and publish a position for each.

Positions are stream positions (bytes from the start of the initial term). A status message's
position is its consumption term id and offset converted with :func:`sm_position`; the limit a
receiver allows is that position plus its advertised window.

Strategies: :class:`UnicastFlowControl` (the unicast default), :class:`MaxFlowControl` (the
fastest receiver sets the pace; the multicast default), :class:`MinFlowControl` (the slowest
live receiver sets the pace) and :class:`TaggedFlowControl` (the slowest live receiver of a
tagged group). A new strategy subclasses :class:`FlowControl`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Final

from netbridge.frames import SM_FLAG_EOS, StatusMessage
from shmbus.settings.channel_uri import ChannelUri, parse_flow_control
from shmbus.shm.log_buffer import compute_position

__all__ = [
    "RECEIVER_TIMEOUT_NS_DEFAULT",
    "FlowControl",
    "MaxFlowControl",
    "MinFlowControl",
    "Receiver",
    "TaggedFlowControl",
    "UnicastFlowControl",
    "sm_position",
    "strategy_for",
]

#: How long a min/tagged strategy keeps a receiver that sends no status message (Aeron: 5 s).
RECEIVER_TIMEOUT_NS_DEFAULT: Final = 5_000_000_000


def sm_position(sm: StatusMessage, initial_term_id: int, term_length: int) -> int:
    """The stream position a status message reports as consumed."""
    return compute_position(
        sm.consumption_term_id, sm.consumption_term_offset, term_length, initial_term_id
    )


@dataclass(slots=True)
class Receiver:
    """What a sender knows of one receiver (by receiver id) from its status messages.

    ``position`` is the highest consumption position it reported, ``window`` its latest
    receiver window, ``source`` where its status messages come from (the socket layer's
    address), ``counted`` whether it takes part in the strategy's limit (tagged: only
    receivers of the group)."""

    receiver_id: int
    source: object
    position: int
    window: int
    last_seen_ns: int
    counted: bool

    @property
    def limit(self) -> int:
        """How far this receiver lets the sender go."""
        return self.position + self.window


class FlowControl(ABC):
    """The interface every strategy implements (see the module docstring for the call order).

    Every strategy keeps :attr:`receivers`, each receiver heard from within
    ``receiver_timeout_ns`` (an end-of-stream status message forgets it at once), so that the
    process layer can show who is there and where; a strategy decides the limit from them in
    :meth:`_limit`.

    Contract: ``on_status_message`` and ``on_idle`` return the sender limit to use from now on;
    they may return a limit below the current sender position (the sender then waits).
    Strategies never raise on odd input: a status message with a negative window is ignored
    (the current limit is returned).
    """

    initial_term_id: int = 0
    term_length: int = 0

    def __init__(self, *, receiver_timeout_ns: int = RECEIVER_TIMEOUT_NS_DEFAULT,
                 group_min_size: int = 0) -> None:
        if receiver_timeout_ns <= 0:
            raise ValueError(f"receiver_timeout_ns {receiver_timeout_ns} must be positive")
        if group_min_size < 0:
            raise ValueError(f"group_min_size {group_min_size} must not be negative")
        self.receiver_timeout_ns = receiver_timeout_ns
        self.group_min_size = group_min_size
        self.receivers: dict[int, Receiver] = {}
        #: no receiver can expire at or before this time (a lower bound; the sender polls
        #: often, so on_idle looks at the receivers only when one may have expired)
        self._next_expiry_ns: int | None = None

    def initialize(self, *, initial_term_id: int, term_length: int) -> None:
        """Bind the strategy to one stream's geometry; called once by the sender."""
        self.initial_term_id = initial_term_id
        self.term_length = term_length

    def position_of(self, sm: StatusMessage) -> int:
        """The consumption position of ``sm`` in this stream."""
        return sm_position(sm, self.initial_term_id, self.term_length)

    def counts(self, sm: StatusMessage) -> bool:
        """Whether the receiver that sent ``sm`` takes part in the limit (default: all)."""
        return True

    def on_status_message(
        self,
        sm: StatusMessage,
        sender_position: int,
        now_ns: int,
        *,
        sender_limit: int,
        source: object = None,
    ) -> int:
        """A status message (without the SETUP flag) arrived from ``source``; return the new
        sender limit given the current ``sender_limit``."""
        if sm.receiver_window < 0:
            return sender_limit
        if sm.flags & SM_FLAG_EOS:
            self.receivers.pop(sm.receiver_id, None)
            return self._limit(sm, sender_limit)
        position = self.position_of(sm)
        receiver = self.receivers.get(sm.receiver_id)
        if receiver is None:
            self.receivers[sm.receiver_id] = Receiver(
                sm.receiver_id, source, position, sm.receiver_window, now_ns, self.counts(sm))
            expiry = now_ns + self.receiver_timeout_ns
            if self._next_expiry_ns is None or expiry < self._next_expiry_ns:
                self._next_expiry_ns = expiry
        else:
            # a reordered, older status message does not pull one receiver's position back
            receiver.position = max(receiver.position, position)
            receiver.window = sm.receiver_window
            receiver.last_seen_ns = now_ns
            receiver.source = source
        return self._limit(sm, sender_limit)

    @abstractmethod
    def _limit(self, sm: StatusMessage | None, sender_limit: int) -> int:
        """The limit after :attr:`receivers` changed, on status message ``sm`` (None when
        receivers timed out)."""

    def on_idle(self, now_ns: int, sender_limit: int, sender_position: int) -> int:
        """Called on every sender poll: forget receivers silent past the receiver timeout;
        return the sender limit."""
        if self._next_expiry_ns is None or now_ns <= self._next_expiry_ns:
            return sender_limit
        timeout = self.receiver_timeout_ns
        expired = [receiver_id for receiver_id, receiver in self.receivers.items()
                   if now_ns - receiver.last_seen_ns > timeout]
        self._next_expiry_ns = min(
            (r.last_seen_ns + timeout for r in self.receivers.values()
             if now_ns - r.last_seen_ns <= timeout), default=None)
        if not expired:
            return sender_limit
        for receiver_id in expired:
            del self.receivers[receiver_id]
        return self._limit(None, sender_limit)

    def counted_receivers(self) -> int:
        """How many live receivers take part in the limit."""
        return sum(1 for receiver in self.receivers.values() if receiver.counted)

    def has_required_receivers(self) -> bool:
        """Whether enough receivers are known for the publication to count as connected."""
        return self.counted_receivers() >= self.group_min_size


class UnicastFlowControl(FlowControl):
    """One receiver: limit = max(current limit, consumption position + receiver window).

    The limit never moves back, so a reordered (older) status message cannot pull it down.
    """

    def _limit(self, sm: StatusMessage | None, sender_limit: int) -> int:
        if sm is None or sm.flags & SM_FLAG_EOS:
            return sender_limit
        return max(sender_limit, self.position_of(sm) + sm.receiver_window)


class MaxFlowControl(UnicastFlowControl):
    """Many receivers, the fastest sets the pace: limit = max over status messages of
    position + window (Aeron's default for multicast and MDC). A slow receiver that falls
    behind loses data and eventually its image; it never holds the sender back."""


class MinFlowControl(FlowControl):
    """Many receivers, the slowest live one sets the pace.

    The limit is the minimum of position + window over the receivers heard from within
    ``receiver_timeout_ns``; with none, the current limit is kept. A receiver that sends an
    end-of-stream status message has left and is forgotten. :meth:`has_required_receivers` is
    true once ``group_min_size`` receivers are live (0 by default: always true).
    """

    def _limit(self, sm: StatusMessage | None, sender_limit: int) -> int:
        limits = [receiver.limit for receiver in self.receivers.values() if receiver.counted]
        if limits:
            return min(limits)
        if sm is not None and not self.counts(sm) and not sm.flags & SM_FLAG_EOS:
            # tagged, before any receiver of the group: move like max
            return max(sender_limit, self.position_of(sm) + sm.receiver_window)
        return sender_limit


class TaggedFlowControl(MinFlowControl):
    """The slowest live receiver whose status messages carry ``group_tag`` sets the pace.

    Status messages without the tag (or with another) do not take part in the minimum; while no
    tagged receiver is live they advance the limit as :class:`MaxFlowControl` would, so the
    stream is not held back before the tagged group has joined.
    """

    def __init__(
        self,
        group_tag: int,
        *,
        receiver_timeout_ns: int = RECEIVER_TIMEOUT_NS_DEFAULT,
        group_min_size: int = 0,
    ) -> None:
        super().__init__(receiver_timeout_ns=receiver_timeout_ns, group_min_size=group_min_size)
        self.group_tag = group_tag

    def counts(self, sm: StatusMessage) -> bool:
        return sm.group_tag == self.group_tag


def strategy_for(uri: ChannelUri) -> FlowControl:
    """The strategy of a publication on ``uri`` (:attr:`ChannelUri.flow_control`: its ``fc``
    parameter, else max for multicast and multi-destination-cast and unicast otherwise)."""
    strategy = uri.flow_control
    if strategy == "unicast":
        return UnicastFlowControl()
    spec = parse_flow_control(uri.params["fc"]) if "fc" in uri.params else None
    timeout = (spec and spec.receiver_timeout_ns) or RECEIVER_TIMEOUT_NS_DEFAULT
    if spec is None or strategy == "max":
        return MaxFlowControl(receiver_timeout_ns=timeout)
    if strategy == "min":
        return MinFlowControl(receiver_timeout_ns=timeout, group_min_size=spec.group_min_size)
    assert spec.group_tag is not None  # the channel parser requires it for tagged
    return TaggedFlowControl(spec.group_tag, receiver_timeout_ns=timeout,
                             group_min_size=spec.group_min_size)
