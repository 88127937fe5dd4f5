"""Read-only views of a bus: what ``shmbus stat``, ``streams``, ``clients`` and ``errors`` show.

Everything starts from a :class:`~shmbus.cli.snapshot.BusSnapshot` that
:func:`shmbus.cli.snapshot.read_snapshot` takes: cnc.dat and the logs opened read-only, the
counters copied, and each publication's and network image's positions read live in an order
that makes them agree (pub-pos is the log's tail; see that module). Every command computes
its view from one snapshot, so ``stat`` and ``streams`` (and their ``--json``) show the same
positions. Nothing here writes to the bus directory, sends a command or registers a client,
so looking at a bus never disturbs it. The rest are pure functions over snapshots (and, for
processes, over :class:`ProcessInfo` records that :func:`probe_processes` takes with psutil),
so the CLI only parses options and prints.

Bus states
----------

``running``: cnc.dat is there, the driver's heartbeat is younger than the driver timeout and
its pid is alive (and was not reused). ``stale``: cnc.dat is there but the heartbeat is old or
the driver process is gone (it crashed or was killed; the next driver cleans up). With no
directory or no cnc.dat, ``read_snapshot`` raises ``BusNotFoundError``, whose message
names where it looked and how to start a driver.

Exit codes of the commands: 0 running bus, 1 no bus (no directory, no cnc.dat, not ready or
another layout version; a message on stderr, nothing on stdout), 3 stale bus (what it holds is
still shown). 2 is typer's code for a usage error.

JSON shapes (``--json``)
------------------------

Every document is one JSON object on one line, with these common keys::

    "command":    "stat" | "streams" | "clients" | "errors"
    "time_ms":    epoch ms when the sample was taken
    "directory":  the bus directory
    "bus": {
        "state": "running" | "stale",
        "reason": null | "why it is stale",
        "cnc": "<dir>/cnc.dat",
        "layout_version": 1,
        "driver_pid": 4242,
        "driver_start_time_ms": epoch ms,
        "heartbeat_ms": epoch ms of the driver's last heartbeat,
        "heartbeat_age_ms": 12,
        "client_liveness_timeout_ms": 10000
    }

``stat`` adds ``"counters"``, in counter id order (after the filters)::

    {"id": 9, "type": "pub-lmt", "type_id": 1, "label": "pub-lmt: 5 -77 7 aeron:ipc",
     "value": 43008, "rate": 2048.0 | null,        # per second since the previous sample
     "registration_id": 5, "owner_id": 3, "reference_id": -77,
     "stream_id": 7 | null, "session_id": -77 | null, "channel": "aeron:ipc" | null,
     "client_pid": 4242 | null, "client_name": "worker-3" | null}   # the owning client

``rate`` is null in the first sample (``--once``, or the first line of ``--interval``).
:data:`STAT_JSON_EXAMPLE` is a complete example (``shmbus stat --help`` prints it).

``streams`` adds ``"streams"``, one per stream and session: the publications (``kind``
"publication"; on a udp channel with a ``sender``), then the network images (``kind``
"image", with a ``receiver``)::

    {"kind": "publication" | "image",
     "stream_id": 7, "session_id": -77, "channel": "aeron:ipc", "registration_id": 5,
     "authentication": null | "plaintext" | "key prod-a",   # udp: sealed with that key?
     "publisher_pid": 4240 | null, "publisher_name": "pub" | null,
     "pub_pos": 43008 | null, "pub_lmt": 43008 | null,      # null for an image
     "position_source": "log" | "counter",  # pub-pos (an image: rcv-pos) read live from
                                            # the log, or (log unreadable) the counter
     "window": 32768 | null, "term_length": 65536 | null,
     "free": 20480 | null,      # room before the publisher is held (with state "free")
     "sender": null | {"position": snd-pos, "limit": snd-lmt, "back_pressure_events": snd-bpe,
                       "connected": true | false | null,
                       "at_limit": true | false,   # less than one mtu of room under snd-lmt
                       "flow_control": "max" | "min" | "tagged" | "unicast" | "unknown",
                       "fc_receivers": 2 | null,   # receivers that take part in snd-lmt
                       "receivers": [{"receiver_id": 123, "address": "10.0.0.2:40123",
                                      "position": 40960, "counted": true}],
                       "holding_receiver": null | the receiver that sets snd-lmt},
     "receiver": null | {"hwm": rcv-hwm, "position": rcv-pos, "source": "127.0.0.1:40123"},
     "state": "held" | "free" | "not-connected" | "receiving" | "unknown",
     "held_by": [4242],         # pids of the slowest counted subscribers, when held
     "held_by_sender": false,   # the sender is the slowest (a network publication): it waits
                                # at snd-lmt for the sender's holding_receiver
     "verdict": "held by subscriber pid 4242 (worker-3), 32 KiB behind; window 32 KiB",
     "subscribers": [{"subscription_id": 4, "client_id": 2, "pid": 4242, "name": "worker-3",
                      "counter_id": 11, "position": 10240, "lag": 32768,
                      "counted": true}],
     "groups": [...],           # consumer groups on the log (see GroupView)
     "large_message_bytes": 0,      # IPC: shared memory its block ring holds (the file's
                                    # allocated bytes: blocks, and warm pages kept for reuse)
     "large_message_in_use": 0,     # of which blocks not yet read by every counted subscriber
     "large_message_warm_bound": 0, # the most the ring keeps warm: a share of the bus
                                    # filesystem's free space (at most 64 MiB), or two of its
                                    # longest message; 0: not measured (no block placed
                                    # since the ring was idle or gave its warm pages back)
     "large_message_warm_bytes": 0} # the bytes of its warm beginning kept allocated now

A subscriber's ``lag`` is pub-pos (an image: rcv-pos) minus its position; ``counted`` is
whether the log's flow control counts it (a resting untethered subscriber does not hold the
publisher). The publisher is held when pub-pos >= pub-lmt or its slowest counted reader is a
window behind; ``free`` is then null, otherwise window - (pub-pos - slowest counted position):
the publisher raises pub-lmt itself up to there, so that is what it can still write. The
positions agree by construction (:func:`shmbus.cli.snapshot.read_publication`): lag >= 0,
free <= window, and pub-pos - pub-lmt is below one claim (a message may end past the limit).

``window`` is the window the log's flow control raises pub-lmt by, from the log file's
metadata (term length / 2 unless the driver runs with a smaller ``ipc_window``; a log without
flow-control fields gives the publication window the driver announced, else term length / 2).

``clients`` adds ``"clients"``::

    {"client_id": 2, "pid": 4242, "name": "worker-3", "heartbeat_ms": epoch ms,
     "heartbeat_age_ms": 80, "state": "alive" | "gone" | "timed-out",
     "reason": null | "why it is gone or timed out",
     "process": null | {"name": "python", "cmdline": ["python", "..."], "cpu_percent": 1.5,
                        "rss": 31457280, "status": "sleeping"},
     "publications": [{"stream_id": 7, "session_id": -77}], "subscriptions": [7]}

``errors`` adds ``"errors"``, oldest first::

    {"count": 3, "first_ms": epoch ms, "last_ms": epoch ms, "text": "type: message\\n stack"}
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
from rich import box
from rich.table import Table
from rich.text import Text

from shmbus.cli.snapshot import BusSnapshot
from shmbus.cli.snapshot import read_snapshot as read_snapshot  # its home before snapshot.py
from shmbus.settings.channel_uri import ChannelUri, ChannelUriError
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
    TYPE_NAMES,
    Counter,
)
from shmbus.shm.error_log import ErrorObservation

#: The ``shmbus stat --json`` document, as ``shmbus stat --help`` shows it (valid JSON).
STAT_JSON_EXAMPLE = """\
{"command": "stat", "time_ms": 1718000000123,
 "directory": "/dev/shm/shmbus-me",
 "bus": {"state": "running", "reason": null,
         "cnc": "/dev/shm/shmbus-me/cnc.dat", "layout_version": 1,
         "driver_pid": 4200, "driver_start_time_ms": 1717999990000,
         "heartbeat_ms": 1718000000111, "heartbeat_age_ms": 12,
         "client_liveness_timeout_ms": 10000},
 "counters": [
   {"id": 9, "type": "pub-lmt", "type_id": 1,
    "label": "pub-lmt: 5 -77 7 aeron:ipc", "value": 43008, "rate": 2048.0,
    "registration_id": 5, "owner_id": 3, "reference_id": -77,
    "stream_id": 7, "session_id": -77, "channel": "aeron:ipc",
    "client_pid": 4240, "client_name": "pub"}]}"""

EXIT_OK = 0
EXIT_NO_BUS = 1
EXIT_STALE = 3

RUNNING = "running"
STALE = "stale"

#: A process's start time is known to about a second (boot time has 1 s resolution).
_CREATE_TIME_SLACK_MS = 2000


# -- processes (psutil) ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessInfo:
    """What psutil says about one pid. ``alive`` is False for a missing, zombie or reused pid."""

    pid: int
    alive: bool
    reason: str | None = None
    name: str | None = None
    cmdline: tuple[str, ...] = ()
    cpu_percent: float | None = None
    rss: int | None = None
    status: str | None = None

    def to_json(self) -> dict[str, Any] | None:
        if not self.alive:
            return None
        return {"name": self.name, "cmdline": list(self.cmdline),
                "cpu_percent": self.cpu_percent, "rss": self.rss, "status": self.status}


def probe_processes(pids: Mapping[int, int | None], cpu_interval: float = 0.0
                    ) -> dict[int, ProcessInfo]:
    """Look up processes: ``pids`` maps a pid to an epoch ms by which it must have existed.

    A process started after that time has only reused the pid: it counts as gone. With
    ``cpu_interval`` > 0, CPU% is measured over that many seconds (one sleep for all).
    """
    out: dict[int, ProcessInfo] = {}
    live: dict[int, psutil.Process] = {}
    for pid, existed_by_ms in pids.items():
        try:
            process = psutil.Process(pid)
            status = process.status()
            create_ms = int(process.create_time() * 1000)
        except psutil.NoSuchProcess:
            out[pid] = ProcessInfo(pid, False, "process is gone (no such pid)")
            continue
        except psutil.AccessDenied:
            out[pid] = ProcessInfo(pid, True, "details not readable (access denied)")
            continue
        if status == psutil.STATUS_ZOMBIE:
            out[pid] = ProcessInfo(pid, False, "process has exited (a zombie its parent has "
                                               "not reaped)", status=status)
            continue
        if existed_by_ms is not None and create_ms > existed_by_ms + _CREATE_TIME_SLACK_MS:
            out[pid] = ProcessInfo(pid, False, "process is gone (its pid now belongs to a "
                                               "process started later)")
            continue
        if cpu_interval > 0:
            try:
                process.cpu_percent(None)
            except psutil.Error:
                pass
        live[pid] = process
    if live and cpu_interval > 0:
        time.sleep(cpu_interval)
    for pid, process in live.items():
        try:
            with process.oneshot():
                out[pid] = ProcessInfo(
                    pid, True, None, process.name(), tuple(process.cmdline()),
                    process.cpu_percent(None) if cpu_interval > 0 else None,
                    process.memory_info().rss, process.status())
        except psutil.NoSuchProcess:
            out[pid] = ProcessInfo(pid, False, "process is gone (no such pid)")
        except psutil.Error as e:
            out[pid] = ProcessInfo(pid, True, f"details not readable ({type(e).__name__})")
    return out


# -- bus state ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BusStatus:
    state: str
    reason: str | None
    heartbeat_age_ms: int

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.state == RUNNING else EXIT_STALE


def assess_bus(snapshot: BusSnapshot, driver_timeout_ms: int,
               driver_process: ProcessInfo) -> BusStatus:
    """Running or stale, from the heartbeat age and the driver's process."""
    driver = snapshot.driver
    age = max(0, snapshot.time_ms - driver.heartbeat_ms)
    reasons = []
    if not driver_process.alive:
        reasons.append(f"driver pid {driver.pid}: {driver_process.reason}")
    if age > driver_timeout_ms:
        reasons.append(f"driver heartbeat is {format_duration(age)} old (timeout "
                       f"{format_duration(driver_timeout_ms)})")
    if reasons:
        reason = "; ".join(reasons) + (f"; a new driver (shmbus driver --dir "
                                       f"{snapshot.directory}) cleans up the old files")
        return BusStatus(STALE, reason, age)
    return BusStatus(RUNNING, None, age)


def check_bus(snapshot: BusSnapshot, driver_timeout_ms: int) -> BusStatus:
    """:func:`assess_bus` with the driver's process looked up now."""
    driver = snapshot.driver
    process = probe_processes({driver.pid: driver.start_time_ms})[driver.pid]
    return assess_bus(snapshot, driver_timeout_ms, process)


def bus_json(snapshot: BusSnapshot, status: BusStatus) -> dict[str, Any]:
    driver = snapshot.driver
    return {
        "state": status.state,
        "reason": status.reason,
        "cnc": driver.cnc_path,
        "layout_version": driver.layout_version,
        "driver_pid": driver.pid,
        "driver_start_time_ms": driver.start_time_ms,
        "heartbeat_ms": driver.heartbeat_ms,
        "heartbeat_age_ms": status.heartbeat_age_ms,
        "client_liveness_timeout_ms": driver.client_liveness_timeout_ms,
    }


def document(command: str, snapshot: BusSnapshot, status: BusStatus,
             **body: Any) -> dict[str, Any]:
    """A JSON document of the shape in the module docstring."""
    return {"command": command, "time_ms": snapshot.time_ms, "directory": snapshot.directory,
            "bus": bus_json(snapshot, status), **body}


def header_line(command: str, snapshot: BusSnapshot, status: BusStatus) -> str:
    """``shmbus stat - <dir> - driver pid 42, heartbeat age 5 ms, layout v1, up 3 s``."""
    driver = snapshot.driver
    clock = time.strftime("%H:%M:%S", time.localtime(snapshot.time_ms / 1000))
    up = format_duration(max(0, snapshot.time_ms - driver.start_time_ms))
    line = (f"{clock} - shmbus {command} - {snapshot.directory} - driver pid {driver.pid}, "
            f"heartbeat age {format_duration(status.heartbeat_age_ms)}, layout v"
            f"{driver.layout_version}, up {up}")
    if status.state != RUNNING:
        line += f"\nSTALE: {status.reason}"
    return line


# -- counters ----------------------------------------------------------------------------------

_STREAM_LABEL = re.compile(
    r"^[\w-]+(?: \([^)]*\))?: (?P<registration>-?\d+) (?P<session>-?\d+) (?P<stream>-?\d+) "
    r"(?P<channel>\S+) ?(?P<rest>.*)$", re.DOTALL)
_CLIENT_LABEL = re.compile(r"^client-heartbeat: (?P<client>-?\d+) pid=(?P<pid>\d+) ?(?P<name>.*)$",
                           re.DOTALL)
_RECEIVER_IN_LABEL = re.compile(
    r"^receiver (?P<id>-?\d+) at (?P<address>\S+)(?P<uncounted> \(not counted\))?$")
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
_GROUP_IN_LABEL = re.compile(r"(?:^| )group=(?P<group>\S+)")


@dataclass(frozen=True)
class ClientRef:
    """A client as its heartbeat counter describes it."""

    client_id: int
    pid: int
    name: str
    heartbeat_ms: int
    counter_id: int


@dataclass(frozen=True)
class CounterView:
    """A counter with what stat derives from it: its stream, its owner's process, its rate."""

    counter: Counter
    stream_id: int | None = None
    session_id: int | None = None
    channel: str | None = None
    client_pid: int | None = None
    client_name: str | None = None
    rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        c = self.counter
        return {"id": c.counter_id, "type": c.type_name, "type_id": c.type_id, "label": c.label,
                "value": c.value, "rate": self.rate, "registration_id": c.registration_id,
                "owner_id": c.owner_id, "reference_id": c.reference_id,
                "stream_id": self.stream_id, "session_id": self.session_id,
                "channel": self.channel, "client_pid": self.client_pid,
                "client_name": self.client_name}


def clients_by_id(snapshot: BusSnapshot) -> dict[int, ClientRef]:
    """The clients with a heartbeat counter, by client id."""
    clients = {}
    for c in snapshot.counters:
        if c.type_id != CLIENT_HEARTBEAT:
            continue
        match = _CLIENT_LABEL.match(c.label)
        name = match["name"] if match else ""
        clients[c.registration_id] = ClientRef(c.registration_id, c.reference_id, name, c.value,
                                               c.counter_id)
    return clients


@dataclass(frozen=True)
class _LogRef:
    session_id: int
    stream_id: int
    channel: str
    rest: str  # what the label has after the channel (a network image: its source)


def _label_fields(label: str) -> tuple[int, int, int, str, str] | None:
    """(registration, session, stream, channel, rest) of a stream counter's label."""
    match = _STREAM_LABEL.match(label)
    if match is None:
        return None
    return (int(match["registration"]), int(match["session"]), int(match["stream"]),
            match["channel"], match["rest"])


def _logs_by_registration(snapshot: BusSnapshot) -> dict[int, _LogRef]:
    """Session, stream and channel of every log the counters name, by registration id."""
    logs: dict[int, _LogRef] = {}
    for c in snapshot.counters:
        if c.type_id in LOG_TYPES and c.registration_id not in logs:
            fields = _label_fields(c.label)
            if fields is not None:
                logs[c.registration_id] = _LogRef(c.reference_id, fields[2], fields[3],
                                                  fields[4])
    return logs


def _client_of(c: Counter, clients: Mapping[int, ClientRef]) -> tuple[int | None, str | None]:
    """(pid, name) of the client a counter belongs to, if any (system counters: none)."""
    if c.type_id == CLIENT_HEARTBEAT:
        client = clients.get(c.registration_id)
    elif c.type_id != SYSTEM:
        client = clients.get(c.owner_id)  # the first client's id is 0, as NULL_ID is
    else:
        client = None
    if client is not None:
        return client.pid, client.name
    if c.type_id in READER_TYPES:  # its client is gone: the label still names it
        match = _PID_IN_LABEL.search(c.label)
        if match is not None:
            return int(match["pid"]), match["name"]
    return None, None


def describe_counters(snapshot: BusSnapshot,
                      previous: BusSnapshot | None = None) -> list[CounterView]:
    """Every counter with its stream, owning client and (given ``previous``) rate per second."""
    clients = clients_by_id(snapshot)
    logs = _logs_by_registration(snapshot)
    rates = counter_rates(previous, snapshot) if previous is not None else {}
    views = []
    for c in snapshot.counters:
        stream_id = session_id = channel = None
        if c.type_id in STREAM_TYPES:
            log = logs.get(c.reference_id if c.type_id in READER_TYPES else c.registration_id)
            if log is not None:
                session_id, stream_id, channel = log.session_id, log.stream_id, log.channel
            elif (fields := _label_fields(c.label)) is not None:
                _, session_id, stream_id, channel, _ = fields
        pid, name = _client_of(c, clients)
        views.append(CounterView(c, stream_id, session_id, channel, pid, name,
                                 rates.get(c.counter_id)))
    return views


def _identity(c: Counter) -> tuple[int, int, int, int, str]:
    return (c.type_id, c.registration_id, c.owner_id, c.reference_id, c.label)


def counter_rates(previous: BusSnapshot, current: BusSnapshot) -> dict[int, float]:
    """Change per second of each counter id that is the same counter in both snapshots."""
    dt = current.monotonic_s - previous.monotonic_s
    if dt <= 0 or previous.driver.start_time_ms != current.driver.start_time_ms:
        return {}
    before = {c.counter_id: c for c in previous.counters}
    rates = {}
    for c in current.counters:
        old = before.get(c.counter_id)
        if old is not None and _identity(old) == _identity(c):
            rates[c.counter_id] = (c.value - old.value) / dt
    return rates


def parse_type(text: str) -> int:
    """A counter type id from a name (``pub-lmt``) or a number; ValueError lists the names."""
    text = text.strip()
    try:
        return int(text, 0)
    except ValueError:
        pass
    for type_id, name in TYPE_NAMES.items():
        if name == text.lower():
            return type_id
    raise ValueError(f"unknown counter type {text!r}: use a type id or one of "
                     f"{', '.join(TYPE_NAMES.values())}")


def filter_counters(views: Iterable[CounterView], *, types: Iterable[int] = (),
                    streams: Iterable[int] = (), sessions: Iterable[int] = (),
                    channel: str | None = None) -> list[CounterView]:
    """The views that pass every given filter (a counter with no stream fails a stream,
    session or channel filter). ``channel`` is a substring of the channel."""
    types, streams, sessions = set(types), set(streams), set(sessions)
    out = []
    for view in views:
        if types and view.counter.type_id not in types:
            continue
        if streams and view.stream_id not in streams:
            continue
        if sessions and view.session_id not in sessions:
            continue
        if channel is not None and (view.channel is None or channel not in view.channel):
            continue
        out.append(view)
    return out


# -- streams -----------------------------------------------------------------------------------

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
            pub = f" by pid {self.publisher_pid}" if self.publisher_pid is not None else ""
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


def verdict(pub_pos: int | None, pub_lmt: int | None, window: int | None,
            subscribers: Sequence[SubscriberView],
            sender: SenderView | None = None) -> Verdict:
    """What limits one publisher now.

    Its limit is the slowest of its counted subscribers (and, on a network channel, of its
    sender once a receiver is connected) plus the window; the publisher raises pub-lmt up to
    there itself. It is held, by the slowest, once its position reaches pub-lmt or the
    slowest is a window behind; otherwise it is free, with window - (pub-pos - slowest) left
    to write (without a window: pub-lmt - pub-pos). Subscribers that are not counted never
    hold it.
    """
    counted = [s for s in subscribers if s.counted]
    sender_counts = sender is not None and sender.position is not None and (
        sender.connected is not False)
    if not counted and not sender_counts:
        if sender is not None:
            return Verdict(NOT_CONNECTED, "not connected: no receiver has answered the sender")
        return Verdict(NOT_CONNECTED, "not connected: no subscriber")
    if pub_pos is None or pub_lmt is None:
        return Verdict(UNKNOWN, "unknown: the pub-pos or pub-lmt counter is missing")
    positions = [s.position for s in counted]
    if sender_counts:
        assert sender is not None and sender.position is not None
        positions.append(sender.position)
    slowest = min(positions)
    room = window - (pub_pos - slowest) if window is not None else pub_lmt - pub_pos
    if pub_pos < pub_lmt and room > 0:
        return Verdict(FREE, f"free: {format_bytes(room)} of window left", free=room)
    held_by = tuple(s for s in counted if s.position == slowest)
    by_sender = sender_counts and sender is not None and sender.position == slowest
    names = []
    if by_sender:
        assert sender is not None
        holder = sender.holding_receiver
        if not sender.at_limit:
            names.append("the sender")
        elif holder is None:
            names.append("the sender (waiting at snd-lmt for the receivers)")
        else:
            names.append(f"the sender (waiting at snd-lmt for {holder.who} at "
                         f"{holder.position:,}, fc {sender.flow_control})")
    if held_by:
        noun = "subscriber" if len(held_by) == 1 else "subscribers"
        names.append(f"{noun} " + ", ".join(s.who for s in held_by))
    window_text = f"; window {format_bytes(window)}" if window is not None else ""
    sentence = (f"held by {' and '.join(names)}, {format_bytes(pub_pos - slowest)} "
                f"behind{window_text}")
    return Verdict(HELD, sentence, held_by, by_sender)


def stream_problems(view: StreamView, max_claim: int) -> list[str]:
    """How a publication's view breaks the rules its snapshot guarantees (empty: none).

    The rules, for a view whose positions were read live (``position_source`` "log"): every
    subscriber's lag is >= 0 (an image's too), and the sender's; while connected, pub-pos -
    pub-lmt is below ``max_claim`` (the longest claim a publisher makes: one message's
    frames, rounded up); free is within (0, window]; a held verdict names the slowest counted
    reader, and only it.
    """
    if view.position_source != "log":
        return []
    head = "rcv-pos" if view.kind == "image" else "pub-pos"
    problems = [f"{s.who} is {format_bytes(-s.lag)} ahead of {head}"
                for s in view.subscribers if s.lag < 0]
    if view.pub_pos is None:
        return problems
    sender = view.sender
    if sender is not None and sender.position is not None and sender.position > view.pub_pos:
        problems.append(f"snd-pos {sender.position:,} is ahead of pub-pos {view.pub_pos:,}")
    v = view.verdict
    if v.state in (HELD, FREE) and view.pub_lmt is not None and (
            view.pub_pos - view.pub_lmt >= max_claim):
        problems.append(f"pub-pos {view.pub_pos:,} is a claim or more past pub-lmt "
                        f"{view.pub_lmt:,}")
    if v.state == FREE and (v.free is None or not 0 < v.free <= (view.window or 0)):
        problems.append(f"free {v.free} is not within the window {view.window}")
    if v.state == HELD:
        counted = [s.position for s in view.subscribers if s.counted]
        if v.held_by_sender and sender is not None and sender.position is not None:
            counted.append(sender.position)
        slowest = min(counted, default=None)
        if not (v.held_by or v.held_by_sender):
            problems.append(f"held, but the verdict names no holder: {v.sentence}")
        elif any(s.position != slowest for s in v.held_by):
            problems.append(f"the verdict names a holder that is not the slowest counted "
                            f"reader (at {slowest}): {v.sentence}")
    return problems


def image_verdict(receiver: ReceiverView, subscribers: Sequence[SubscriberView]) -> Verdict:
    """How the subscribers of a network image keep up with what the netbridge received."""
    gap = ""
    if receiver.hwm is not None and receiver.position is not None and (
            receiver.hwm > receiver.position):
        gap = (f"; {format_bytes(receiver.hwm - receiver.position)} between rcv-pos and "
               f"rcv-hwm (loss being repaired)")
    if not subscribers:
        return Verdict(NOT_CONNECTED, f"no subscriber{gap}")
    slowest = subscribers[0]  # sorted by position
    held_by = tuple(s for s in subscribers if s.position == slowest.position)
    return Verdict(RECEIVING, f"receiving; slowest subscriber {slowest.who}, "
                              f"{format_bytes(slowest.lag)} behind rcv-pos{gap}", held_by)


def _flow_receiver(c: Counter) -> FlowReceiverView | None:
    fields = _label_fields(c.label)
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
    logs = _logs_by_registration(snapshot)
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
                pid, name = _client_of(c, clients)
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
                publisher.pid if publisher else None, publisher.name if publisher else None,
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
            pid, client_name = _client_of(c, clients)
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


# -- clients -----------------------------------------------------------------------------------

ALIVE = "alive"
GONE = "gone"
TIMED_OUT = "timed-out"


@dataclass(frozen=True)
class ClientView:
    client: ClientRef
    heartbeat_age_ms: int
    state: str
    reason: str | None
    process: ProcessInfo | None
    publications: tuple[tuple[int | None, int], ...]
    subscriptions: tuple[int | None, ...]

    def to_json(self) -> dict[str, Any]:
        c = self.client
        return {"client_id": c.client_id, "pid": c.pid, "name": c.name,
                "heartbeat_ms": c.heartbeat_ms, "heartbeat_age_ms": self.heartbeat_age_ms,
                "state": self.state, "reason": self.reason,
                "process": self.process.to_json() if self.process else None,
                "publications": [{"stream_id": s, "session_id": session}
                                 for s, session in self.publications],
                "subscriptions": list(self.subscriptions)}


def client_processes_wanted(snapshot: BusSnapshot) -> dict[int, int]:
    """pid -> the client's last heartbeat: the argument :func:`probe_processes` needs."""
    wanted: dict[int, int] = {}
    for client in clients_by_id(snapshot).values():
        wanted[client.pid] = max(wanted.get(client.pid, 0), client.heartbeat_ms)
    return wanted


def list_clients(snapshot: BusSnapshot,
                 processes: Mapping[int, ProcessInfo]) -> list[ClientView]:
    """The clients attached to the bus, flagged gone (process) or timed out (heartbeat)."""
    views = describe_counters(snapshot)
    timeout_ms = snapshot.driver.client_liveness_timeout_ms
    out = []
    for client in clients_by_id(snapshot).values():
        age = max(0, snapshot.time_ms - client.heartbeat_ms)
        process = processes.get(client.pid)
        if process is not None and not process.alive:
            state, reason = GONE, process.reason
        elif age > timeout_ms:
            state, reason = TIMED_OUT, (f"no heartbeat for {format_duration(age)} (liveness "
                                        f"timeout {format_duration(timeout_ms)})")
        else:
            state, reason = ALIVE, None
        owned = [v for v in views if v.counter.owner_id == client.client_id]
        publications = tuple((v.stream_id, v.counter.reference_id) for v in owned
                             if v.counter.type_id == PUB_LIMIT)
        subscriptions = tuple(v.stream_id for v in owned if v.counter.type_id == SUB_POS)
        out.append(ClientView(client, age, state, reason, process, publications,
                              subscriptions))
    return out


# -- formatting --------------------------------------------------------------------------------


def format_bytes(n: int) -> str:
    """``512 B``, ``32 KiB``, ``3.9 MiB`` (binary units, one decimal where it matters)."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{sign}{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(ms: int) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 5 s``, ``3 h 2 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def format_time(ms: int) -> str:
    """Local wall-clock time of an epoch ms, with milliseconds."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


# -- rendering (rich) --------------------------------------------------------------------------


def counters_table(views: Sequence[CounterView], title: str | None = None) -> Table:
    """The ``shmbus stat`` table: one row per counter, with its rate of change."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", justify="right")
    table.add_column("type")
    table.add_column("value", justify="right")
    table.add_column("rate/s", justify="right")
    table.add_column("stream", justify="right")
    table.add_column("session", justify="right")
    table.add_column("client")
    table.add_column("label", overflow="fold")
    for view in views:
        c = view.counter
        rate = "" if view.rate is None else f"{view.rate:,.0f}"
        client = "" if view.client_pid is None else f"{view.client_pid} {view.client_name or ''}"
        table.add_row(str(c.counter_id), c.type_name, f"{c.value:,}", rate,
                      "" if view.stream_id is None else str(view.stream_id),
                      "" if view.session_id is None else str(view.session_id),
                      client.strip(), c.label)
    return table


def clients_table(clients: Sequence[ClientView]) -> Table:
    """The ``shmbus clients`` table; gone and timed-out clients are flagged in red."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("pid", "right"), ("name", "left"), ("state", "left"),
                          ("heartbeat age", "right"), ("CPU%", "right"), ("RSS", "right"),
                          ("streams", "left"), ("command line", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for view in clients:
        process = view.process
        state = view.state.upper() if view.state != ALIVE else view.state
        if view.reason:
            state += f": {view.reason}"
        style = "bold red" if view.state != ALIVE else ""
        cpu = "" if process is None or process.cpu_percent is None else (
            f"{process.cpu_percent:.1f}")
        rss = "" if process is None or process.rss is None else format_bytes(process.rss)
        streams = [f"pub {s}/{session}" for s, session in view.publications]
        streams += [f"sub {s}" for s in view.subscriptions]
        cmdline = " ".join(process.cmdline) if process is not None else ""
        table.add_row(str(view.client.pid), view.client.name, Text(state, style=style),
                      format_duration(view.heartbeat_age_ms), cpu, rss, ", ".join(streams),
                      cmdline)
    return table


def error_lines(errors: Sequence[ErrorObservation]) -> list[str]:
    """The ``shmbus errors`` text: a summary line, then each error with its count and times."""
    if not errors:
        return ["no errors"]
    total = sum(e.observation_count for e in errors)
    lines = [f"{len(errors)} distinct error{'s' if len(errors) != 1 else ''}, "
             f"{total} observation{'s' if total != 1 else ''}"]
    for e in errors:
        lines.append("")
        lines.append(f"{e.observation_count} x, first {format_time(e.first_observation_ms)}, "
                     f"last {format_time(e.last_observation_ms)}")
        lines.extend(f"    {line}" for line in e.text.splitlines() or [""])
    return lines


def errors_json(errors: Sequence[ErrorObservation]) -> list[dict[str, Any]]:
    return [{"count": e.observation_count, "first_ms": e.first_observation_ms,
             "last_ms": e.last_observation_ms, "text": e.text} for e in errors]
