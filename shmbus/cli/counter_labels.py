"""Which stream and which client each counter belongs to, read from its ids and its label.

A log's counters (a publication's or a network image's) have the log's registration id and,
as reference id, its session id; their label names the stream and channel. A reader's
counters have the log's registration id as reference id. A client's heartbeat counter names
its pid and name, and every other counter a client owns has that client's id as owner id.
Pure functions over a snapshot's counters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from shmbus.cli.snapshot import BusSnapshot
from shmbus.shm.counters import (
    CLIENT_HEARTBEAT,
    FC_RCV_POS,
    FC_RECEIVERS,
    GROUP_CLAIM,
    GROUP_MEMBERS,
    GROUP_ORPHAN,
    GROUP_POS,
    GROUP_REDELIVERED,
    PUB_LIMIT,
    PUB_POS,
    RCV_CC_WINDOW,
    RCV_HWM,
    RCV_POS,
    REQUESTER_COUNTERS,
    RESPONDER_COUNTERS,
    SND_BPE,
    SND_LMT,
    SND_POS,
    SUB_POS,
    SYSTEM,
    Counter,
)

_STREAM_LABEL = re.compile(
    r"^[\w-]+(?: \([^)]*\))?: (?P<registration>-?\d+) (?P<session>-?\d+) (?P<stream>-?\d+) "
    r"(?P<channel>\S+) ?(?P<rest>.*)$", re.DOTALL)
_CLIENT_LABEL = re.compile(r"^client-heartbeat: (?P<client>-?\d+) pid=(?P<pid>\d+) ?(?P<name>.*)$",
                           re.DOTALL)
#: An Aeron client's heartbeat: the driver's label, to which the client appends its name,
#: version and commit (Aeron's C client does)
_AERON_CLIENT_LABEL = re.compile(r"^client-heartbeat: id=-?\d+(?: name=(?P<name>\S*))?"
                                 r"(?: version=(?P<version>\S*))?")
_PID_IN_LABEL = re.compile(r" pid=(?P<pid>\d+) ?(?P<name>.*)$", re.DOTALL)

#: Counters of one log (publication or network image): registration id = the log's
#: registration id, reference id = its session id; stream and channel are in the label.
LOG_TYPES = frozenset({PUB_LIMIT, PUB_POS, SND_POS, SND_LMT, SND_BPE, RCV_HWM, RCV_POS})
#: A subscription group's counters on one log: registration id = the log's registration id.
GROUP_TYPES = frozenset({GROUP_POS, GROUP_ORPHAN, GROUP_MEMBERS, GROUP_REDELIVERED})
#: Counters of one reader of a log: reference id = the registration id of the log it reads.
READER_TYPES = frozenset({SUB_POS, GROUP_CLAIM})
#: A requester's or responder's counters (request/reply): stream and channel in the label.
CALL_TYPES = frozenset(REQUESTER_COUNTERS + RESPONDER_COUNTERS)
#: Every counter that belongs to a stream.
STREAM_TYPES = LOG_TYPES | GROUP_TYPES | READER_TYPES | {FC_RECEIVERS, FC_RCV_POS,
                                                           RCV_CC_WINDOW} | CALL_TYPES
#: A group member's claim record between claims (its start), and an empty orphan record.
IDLE_CLAIM = (1 << 63) - 1


@dataclass(frozen=True)
class ClientRef:
    """A client as its heartbeat counter describes it."""

    client_id: int
    pid: int
    name: str
    heartbeat_ms: int
    counter_id: int


@dataclass(frozen=True)
class LogRef:
    """A log as its counters' labels name it."""

    session_id: int
    stream_id: int
    channel: str
    rest: str  # what the label has after the channel (a network image: its source)


def clients_by_id(snapshot: BusSnapshot) -> dict[int, ClientRef]:
    """The clients with a heartbeat counter, by client id."""
    clients = {}
    for c in snapshot.counters:
        if c.type_id != CLIENT_HEARTBEAT:
            continue
        match = _CLIENT_LABEL.match(c.label)
        name = match["name"] if match else _aeron_client_name(c.label)
        clients[c.registration_id] = ClientRef(c.registration_id, c.reference_id, name, c.value,
                                               c.counter_id)
    return clients


def _aeron_client_name(label: str) -> str:
    """``aeron <name> <version>`` from an Aeron client's heartbeat label ("" for another)."""
    match = _AERON_CLIENT_LABEL.match(label)
    if match is None:
        return ""
    return " ".join(part for part in ("aeron", match["name"], match["version"]) if part)


def label_fields(label: str) -> tuple[int, int, int, str, str] | None:
    """(registration, session, stream, channel, rest) of a stream counter's label; None for a
    label of another shape."""
    match = _STREAM_LABEL.match(label)
    if match is None:
        return None
    return (int(match["registration"]), int(match["session"]), int(match["stream"]),
            match["channel"], match["rest"])


def logs_by_registration(snapshot: BusSnapshot) -> dict[int, LogRef]:
    """Session, stream and channel of every log the counters name, by registration id."""
    logs: dict[int, LogRef] = {}
    for c in snapshot.counters:
        if c.type_id in LOG_TYPES and c.registration_id not in logs:
            fields = label_fields(c.label)
            if fields is not None:
                logs[c.registration_id] = LogRef(c.reference_id, fields[2], fields[3],
                                                 fields[4])
    return logs


def client_of(c: Counter, clients: Mapping[int, ClientRef]) -> tuple[int | None, str | None]:
    """(pid, name) of the client a counter belongs to, if any (system counters: none)."""
    if c.type_id == CLIENT_HEARTBEAT:
        client = clients.get(c.registration_id)
    elif c.type_id != SYSTEM:
        client = clients.get(c.owner_id)  # the first client's id is 0, as NULL_ID is
    else:
        client = None
    if client is not None:  # an Aeron client does not say its pid
        return client.pid or None, client.name
    if c.type_id in READER_TYPES:  # its client is gone: the label still names it
        match = _PID_IN_LABEL.search(c.label)
        if match is not None:
            return int(match["pid"]), match["name"]
    return None, None
