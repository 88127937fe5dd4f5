"""What ``shmbus streams`` shows of one log (a publication or a network image): its
positions, its subscribers and groups, its sender or receiver on a network channel, and the
verdict on what limits it now; each view's one-line text form and its JSON form (``streams``
in ``schema/streams.schema.json``).

The views are plain data: :mod:`shmbus.cli.stream_analysis` builds them from a snapshot and
:mod:`shmbus.cli.verdicts` decides the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shmbus.cli.formatting import format_bytes
from shmbus.settings.channel_uri import ChannelUri, ChannelUriError

#: The states of a verdict (:attr:`Verdict.state`, a stream's ``state`` in its JSON).
HELD = "held"
FREE = "free"
NOT_CONNECTED = "not-connected"
RECEIVING = "receiving"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class SubscriberView:
    """A subscriber of a log; ``lag`` is how far it is behind pub-pos (or an image's
    rcv-pos)."""

    subscription_id: int
    client_id: int
    pid: int | None
    name: str | None
    counter_id: int
    position: int
    lag: int
    #: a subscription group counted as one subscriber (at its oldest unfinished claim)
    group: str | None = None
    #: the log's flow control counts it (False: an untethered subscriber resting)
    counted: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"subscription_id": self.subscription_id, "client_id": self.client_id,
                "pid": self.pid, "name": self.name, "counter_id": self.counter_id,
                "position": self.position, "lag": self.lag, "group": self.group,
                "counted": self.counted}

    @property
    def who(self) -> str:
        if self.group is not None:
            return f"group {self.group}"
        pid = f"pid {self.pid}" if self.pid is not None else f"client {self.client_id}"
        return f"{pid} ({self.name})" if self.name else pid


@dataclass(frozen=True)
class GroupMemberView:
    """A member of a subscription group on one log: ``claim`` is the start of the claim it
    has not finished (None between claims)."""

    subscription_id: int
    pid: int | None
    name: str | None
    counter_id: int
    claim: int | None

    def to_json(self) -> dict[str, Any]:
        return {"subscription_id": self.subscription_id, "pid": self.pid, "name": self.name,
                "counter_id": self.counter_id, "claim": self.claim}

    @property
    def who(self) -> str:
        pid = f"pid {self.pid}" if self.pid is not None else f"subscription {self.subscription_id}"
        return f"{pid} ({self.name})" if self.name else pid


@dataclass(frozen=True)
class GroupView:
    """A subscription group on one log: its claim position, its members, the claim waiting to
    be handed on from a member that left (None: none) and how many messages were handed on.
    ``position`` is what flow control counts: the oldest unfinished claim, else the claim
    position."""

    name: str
    counter_id: int  # grp-pos
    claimed: int
    orphan: int | None
    redelivered: int
    members: tuple[GroupMemberView, ...]

    @property
    def position(self) -> int:
        starts = [m.claim for m in self.members if m.claim is not None]
        return min([self.claimed, *starts, *([self.orphan] if self.orphan is not None else [])])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "claimed": self.claimed, "position": self.position,
                "orphan": self.orphan, "redelivered": self.redelivered,
                "members": [m.to_json() for m in self.members]}

    def line(self) -> str:
        members = ", ".join(f"{m.who} " + ("idle" if m.claim is None else
                                           f"claim at {m.claim:,}") for m in self.members)
        handed = f", claim at {self.orphan:,} to hand on" if self.orphan is not None else ""
        return (f"group {self.name} claimed to {self.claimed:,} ({len(self.members)} members: "
                f"{members or 'none'}{handed}; {self.redelivered} redelivered)")


@dataclass(frozen=True)
class FlowReceiverView:
    """A receiver of a network publication as the sender's flow control knows it (an
    fc-rcv-pos counter): its position from its status messages, and whether it takes part in
    the sender limit (under tagged flow control only the group's receivers do)."""

    receiver_id: int
    address: str
    position: int
    counted: bool

    def to_json(self) -> dict[str, Any]:
        return {"receiver_id": self.receiver_id, "address": self.address,
                "position": self.position, "counted": self.counted}

    @property
    def who(self) -> str:
        return f"receiver {self.address} (id {self.receiver_id})"


@dataclass(frozen=True)
class SenderView:
    """The netbridge's side of a network publication: snd-pos, snd-lmt, snd-bpe, its flow
    control (the strategy, from the channel's ``fc``) and the receivers it knows."""

    position: int | None
    limit: int | None
    back_pressure_events: int | None
    connected: bool | None  # the log's is-connected flag (a receiver answers); None: unknown
    flow_control: str = "unicast"
    fc_receivers: int | None = None
    receivers: tuple[FlowReceiverView, ...] = ()
    mtu: int = 0  # the log's: the largest frame the sender may be waiting to send

    @property
    def at_limit(self) -> bool:
        """The sender has less than one frame (at most an mtu) of room under snd-lmt: it
        waits for the receivers."""
        return (self.position is not None and self.limit is not None
                and self.limit - self.position < max(self.mtu, 1))

    @property
    def holding_receiver(self) -> FlowReceiverView | None:
        """The receiver whose status messages set snd-lmt: the slowest counted one under min
        and tagged flow control, the fastest under max and unicast (None: none known)."""
        counted = [r for r in self.receivers if r.counted]
        if not counted:
            return None
        pick = min if self.flow_control in ("min", "tagged") else max
        return pick(counted, key=lambda r: r.position)

    def to_json(self) -> dict[str, Any]:
        holder = self.holding_receiver
        return {"position": self.position, "limit": self.limit,
                "back_pressure_events": self.back_pressure_events, "connected": self.connected,
                "at_limit": self.at_limit, "flow_control": self.flow_control,
                "fc_receivers": self.fc_receivers,
                "receivers": [r.to_json() for r in self.receivers],
                "holding_receiver": holder.to_json() if holder else None}


@dataclass(frozen=True)
class ReceiverView:
    """The netbridge's side of a network image: rcv-hwm, rcv-pos and where it comes from."""

    hwm: int | None
    position: int | None
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"hwm": self.hwm, "position": self.position, "source": self.source}


@dataclass(frozen=True)
class Verdict:
    """What limits a publisher now, in a word (``state``) and in a sentence."""

    state: str
    sentence: str
    held_by: tuple[SubscriberView, ...] = ()
    held_by_sender: bool = False
    #: bytes the publisher can still write before it is held (state "free" only)
    free: int | None = None


@dataclass(frozen=True)
class StreamView:
    """One log, stream + session: a publication (``kind`` "publication", with a ``sender``
    when it goes to the network) or a network image (``kind`` "image", with a ``receiver``)."""

    kind: str
    stream_id: int | None
    session_id: int
    channel: str | None
    registration_id: int
    publisher_pid: int | None
    publisher_name: str | None
    pub_pos: int | None
    pub_lmt: int | None
    window: int | None
    term_length: int | None
    sender: SenderView | None
    receiver: ReceiverView | None
    subscribers: tuple[SubscriberView, ...]
    verdict: Verdict
    groups: tuple[GroupView, ...] = ()
    #: "log": pub-pos (an image: rcv-pos) was read live from the log (the tail; the
    #: contiguous data); "counter": the counter's value (the log could not be read)
    position_source: str = "counter"
    #: shared memory the stream's large messages hold (their blocks, and the warm beginning
    #: of the block ring kept for reuse)
    large_message_bytes: int = 0
    #: bytes of blocks not yet read by every counted subscriber
    large_message_in_use: int = 0
    #: the bound of the block ring's warm beginning: the most it keeps allocated for reuse (a
    #: share of the bus filesystem's free space, or two of the longest message; 0: not
    #: measured, as after the ring was idle or gave its warm pages back)
    large_message_warm_bound: int = 0
    #: the bytes of the warm beginning the ring keeps allocated now
    large_message_warm_bytes: int = 0

    @property
    def state(self) -> str:
        return self.verdict.state

    @property
    def authentication(self) -> str | None:
        """On a udp channel, "key <name>" when its datagrams are sealed with that keyring
        entry, else "plaintext"; None on IPC (or an unknown channel)."""
        try:
            uri = ChannelUri.parse(self.channel or "")
        except ChannelUriError:
            return None
        if uri.is_ipc:
            return None
        return f"key {uri.key}" if uri.key else "plaintext"

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {"kind": self.kind, "stream_id": self.stream_id, "session_id": self.session_id,
                "channel": self.channel, "authentication": self.authentication,
                "registration_id": self.registration_id,
                "publisher_pid": self.publisher_pid, "publisher_name": self.publisher_name,
                "pub_pos": self.pub_pos, "pub_lmt": self.pub_lmt,
                "position_source": self.position_source, "window": self.window,
                "term_length": self.term_length, "free": v.free,
                "sender": self.sender.to_json() if self.sender else None,
                "receiver": self.receiver.to_json() if self.receiver else None,
                "state": v.state, "held_by": [s.pid for s in v.held_by],
                "held_by_sender": v.held_by_sender, "verdict": v.sentence,
                "subscribers": [s.to_json() for s in self.subscribers],
                "groups": [g.to_json() for g in self.groups],
                "large_message_bytes": self.large_message_bytes,
                "large_message_in_use": self.large_message_in_use,
                "large_message_warm_bound": self.large_message_warm_bound,
                "large_message_warm_bytes": self.large_message_warm_bytes}

    def line(self) -> str:
        """The one-line text form ``shmbus streams`` prints."""
        subs = "; ".join(f"{s.who} at {s.position:,} (lag {format_bytes(s.lag)})"
                         + ("" if s.counted else " (not counted)")
                         for s in self.subscribers) or "none"
        head = (f"stream {_opt(self.stream_id)} session {self.session_id} "
                f"{self.channel or '?'}")
        if self.authentication is not None:
            head += (f" (authenticated, {self.authentication})"
                     if self.authentication != "plaintext" else " (plaintext)")
        if self.receiver is not None:
            r = self.receiver
            head += (f" image from {r.source or '?'}: rcv-pos {_num(r.position)}, rcv-hwm "
                     f"{_num(r.hwm)}")
        else:
            pub = (f" by pid {self.publisher_pid}" if self.publisher_pid is not None
                   else f" by {self.publisher_name}" if self.publisher_name else "")
            head += f"{pub}: pub-pos {_num(self.pub_pos)}, pub-lmt {_num(self.pub_lmt)}"
            if self.sender is not None:
                head += (f", snd-pos {_num(self.sender.position)}, snd-lmt "
                         f"{_num(self.sender.limit)}, fc {self.sender.flow_control}")
                receivers = "; ".join(
                    f"{r.address} at {r.position:,}" + ("" if r.counted else " (not counted)")
                    for r in self.sender.receivers)
                if receivers:
                    head += f", receivers: {receivers}"
        if self.large_message_bytes:
            slowest = next((s for s in self.subscribers if s.counted), None)
            held = (f", held by {slowest.who}" if slowest and self.large_message_in_use
                    else "")
            bound = (f" of at most {format_bytes(self.large_message_warm_bound)}"
                     if self.large_message_warm_bound else "")
            head += (f", large messages {format_bytes(self.large_message_in_use)} in use"
                     f"{held} ({format_bytes(self.large_message_bytes)} of shared memory, "
                     f"{format_bytes(self.large_message_warm_bytes)} kept warm{bound})")
        groups = "".join(f"; {g.line()}" for g in self.groups)
        return f"{head}; subscribers: {subs}{groups} => {self.verdict.sentence}"


def _opt(value: object) -> str:
    return "?" if value is None else str(value)


def _num(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"
