"""The views of ``shmbus streams`` built from one snapshot: one :class:`StreamView` per log,
with its subscribers, subscription groups, sender (with the receivers its flow control knows)
or receiver, and its verdict.

Pure: computed from a :class:`~shmbus.cli.snapshot.BusSnapshot`, whose positions were read
live in an order that makes them agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from shmbus.cli.counter_labels import (
    GROUP_TYPES,
    IDLE_CLAIM,
    LOG_TYPES,
    ClientRef,
    client_of,
    clients_by_id,
    label_fields,
    logs_by_registration,
)
from shmbus.cli.snapshot import BusSnapshot
from shmbus.cli.stream_views import (
    FlowReceiverView,
    GroupMemberView,
    GroupView,
    ReceiverView,
    SenderView,
    StreamView,
    SubscriberView,
)
from shmbus.cli.verdicts import image_verdict, verdict
from shmbus.settings.channel_uri import ChannelUri, ChannelUriError
from shmbus.shm.counters import (
    FC_RCV_POS,
    FC_RECEIVERS,
    GROUP_CLAIM,
    GROUP_ORPHAN,
    GROUP_POS,
    GROUP_REDELIVERED,
    PUB_LIMIT,
    PUB_POS,
    RCV_HWM,
    RCV_POS,
    SND_BPE,
    SND_LMT,
    SND_POS,
    SUB_POS,
    Counter,
)

_RECEIVER_IN_LABEL = re.compile(
    r"^receiver (?P<id>-?\d+) at (?P<address>\S+)(?P<uncounted> \(not counted\))?$")
_GROUP_IN_LABEL = re.compile(r"(?:^| )group=(?P<group>\S+)")


def _flow_receiver(c: Counter) -> FlowReceiverView | None:
    fields = label_fields(c.label)
    match = _RECEIVER_IN_LABEL.match(fields[4]) if fields is not None else None
    if match is None:
        return None
    return FlowReceiverView(int(match["id"]), match["address"], c.value,
                            match["uncounted"] is None)


def _flow_control(channel: str | None) -> str:
    """The flow-control strategy of a network publication's channel ("unknown" without one)."""
    try:
        return ChannelUri.parse(channel or "").flow_control
    except ChannelUriError:  # none, or cut short in a counter label
        return "unknown"


def analyse_streams(snapshot: BusSnapshot) -> list[StreamView]:
    """One view per log (publications, then network images, each in counter id order)."""
    clients = clients_by_id(snapshot)
    logs = logs_by_registration(snapshot)
    by_type: dict[int, dict[int, Counter]] = {t: {} for t in LOG_TYPES}
    subs: dict[int, list[Counter]] = {}
    group_counters: list[Counter] = []
    fc_receivers: dict[int, int] = {}
    flow_receivers: dict[int, list[FlowReceiverView]] = {}
    for c in snapshot.counters:
        if c.type_id in LOG_TYPES:
            by_type[c.type_id].setdefault(c.registration_id, c)
        elif c.type_id == SUB_POS:
            subs.setdefault(c.reference_id, []).append(c)
        elif c.type_id in GROUP_TYPES or c.type_id == GROUP_CLAIM:
            group_counters.append(c)
        elif c.type_id == FC_RECEIVERS:
            fc_receivers[c.registration_id] = c.value
        elif c.type_id == FC_RCV_POS:
            flow_receiver = _flow_receiver(c)
            if flow_receiver is not None:
                flow_receivers.setdefault(c.registration_id, []).append(flow_receiver)

    def value(type_id: int, registration_id: int) -> int | None:
        c = by_type[type_id].get(registration_id)
        return c.value if c is not None else None

    def first_counter(registration_id: int, types: Iterable[int]) -> Counter:
        return min((by_type[t][registration_id] for t in types
                    if registration_id in by_type[t]), key=lambda c: c.counter_id)

    publications = set(by_type[PUB_LIMIT]) | set(by_type[PUB_POS])
    images = (set(by_type[RCV_HWM]) | set(by_type[RCV_POS])) - publications
    views = []
    for kind, ids, types in (("publication", publications, (PUB_LIMIT, PUB_POS)),
                             ("image", images, (RCV_HWM, RCV_POS))):
        for registration_id in sorted(ids, key=lambda r: first_counter(r, types).counter_id):
            first = first_counter(registration_id, types)
            ref = logs.get(registration_id)
            info = snapshot.logs.get(registration_id)
            if kind == "publication":
                head = value(PUB_POS, registration_id)
                pub_lmt = value(PUB_LIMIT, registration_id)
            else:
                head, pub_lmt = value(RCV_POS, registration_id), None
            live = snapshot.live.get(registration_id)
            counted = live.counted if live is not None else None
            subscribers = []
            for c in subs.get(registration_id, []):
                pid, name = client_of(c, clients)
                subscribers.append(SubscriberView(
                    c.registration_id, c.owner_id, pid, name, c.counter_id, c.value,
                    (head - c.value) if head is not None else 0,
                    counted=counted is None or c.counter_id in counted))
            groups = _groups(registration_id, group_counters, clients)
            # a group holds the publisher back as one subscriber, at its oldest unfinished claim
            subscribers.extend(SubscriberView(
                0, 0, None, None, g.counter_id, g.position,
                (head - g.position) if head is not None else 0, g.name) for g in groups)
            subscribers.sort(key=lambda s: (s.position, s.counter_id))
            window = info.window if info else None
            sender: SenderView | None = None
            receiver: ReceiverView | None = None
            if kind == "publication":
                if registration_id in by_type[SND_POS]:
                    sender = SenderView(value(SND_POS, registration_id),
                                        value(SND_LMT, registration_id),
                                        value(SND_BPE, registration_id),
                                        info.is_connected if info else None,
                                        _flow_control(ref.channel if ref else None),
                                        fc_receivers.get(registration_id),
                                        tuple(flow_receivers.get(registration_id, ())),
                                        info.mtu if info else 0)
                result = verdict(head, pub_lmt, window, subscribers, sender)
                publisher = clients.get(first.owner_id)
            else:
                receiver = ReceiverView(value(RCV_HWM, registration_id), head,
                                        ref.rest if ref else "")
                result = image_verdict(receiver, subscribers)
                publisher = None
            views.append(StreamView(
                kind, ref.stream_id if ref else (info.stream_id if info else None),
                first.reference_id, ref.channel if ref else None, registration_id,
                (publisher.pid or None) if publisher else None,  # 0: an Aeron client's
                publisher.name if publisher else None,
                head if kind == "publication" else None, pub_lmt, window,
                info.term_length if info else None, sender, receiver, tuple(subscribers),
                result, groups,
                "log" if registration_id in snapshot.live or registration_id in
                snapshot.live_images else "counter",
                info.large_message_bytes if info else 0,
                info.large_message_in_use if info else 0,
                info.large_message_warm_bound if info else 0,
                info.large_message_warm_bytes if info else 0))
    return views


def _groups(registration_id: int, counters: Iterable[Counter],
            clients: Mapping[int, ClientRef]) -> tuple[GroupView, ...]:
    """The subscription groups on the log ``registration_id``, from their counters."""
    found: dict[str, dict[int, Counter]] = {}
    members: dict[str, list[GroupMemberView]] = {}
    for c in counters:
        match = _GROUP_IN_LABEL.search(c.label)
        if match is None:
            continue
        name = match["group"]
        if c.type_id == GROUP_CLAIM and c.reference_id == registration_id:
            pid, client_name = client_of(c, clients)
            members.setdefault(name, []).append(GroupMemberView(
                c.registration_id, pid, client_name, c.counter_id,
                None if c.value == IDLE_CLAIM else c.value))
        elif c.type_id != GROUP_CLAIM and c.registration_id == registration_id:
            found.setdefault(name, {})[c.type_id] = c
    views = []
    for name, by_type in found.items():
        if GROUP_POS not in by_type:
            continue
        orphan = by_type.get(GROUP_ORPHAN)
        redelivered = by_type.get(GROUP_REDELIVERED)
        views.append(GroupView(
            name, by_type[GROUP_POS].counter_id, by_type[GROUP_POS].value,
            None if orphan is None or orphan.value == IDLE_CLAIM else orphan.value,
            redelivered.value if redelivered is not None else 0,
            tuple(sorted(members.get(name, ()), key=lambda m: m.counter_id))))
    return tuple(views)
