"""Settings of a bus: keyword arguments, then ``SHMBUS_*`` environment variables, then defaults.

A :class:`Context` is a frozen dataclass, so it pickles: pass it to multiprocessing workers and
they connect with the parent's settings (``shmbus.connect(context)``).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from shmbus.shm.block_ring import WARM_SHARE
from shmbus.shm.log_buffer import (
    MTU_DEFAULT,
    TERM_LENGTH_DEFAULT,
    UDP_TERM_LENGTH_DEFAULT,
    check_mtu,
    check_term_length,
)


def default_directory() -> str:
    """``/dev/shm/shmbus-<user>`` where /dev/shm exists, else the temp directory."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return os.path.join(base, f"shmbus-{getpass.getuser()}")


#: settings that may be 0 seconds (every other time must be positive)
_MAY_BE_ZERO = frozenset({"netbridge_busy_window", "wait_spin"})
#: float settings that are not times (checked on their own)
_NOT_TIMES = frozenset({"large_message_warm_share"})


@dataclass(frozen=True)
class Context:
    """Every setting of a bus client and its driver. Times are in seconds, sizes in bytes."""

    #: the bus directory (SHMBUS_DIR)
    dir: str = dataclasses.field(default_factory=default_directory)
    #: a client gives up on a driver whose heartbeat is older than this
    driver_timeout: float = 10.0
    #: the driver declares a client dead whose heartbeat is older than this
    client_liveness_timeout: float = 10.0
    #: how often a client's native thread writes its heartbeat
    keepalive_interval: float = 0.5
    #: a concurrent publication blocked this long by a dead writer is unblocked
    publication_unblock_timeout: float = 15.0
    #: an ended publication's log stays this long for slow subscribers
    publication_linger_timeout: float = 5.0
    #: a udp publication stops being connected when no receiver has sent it a status message
    #: for this long (Aeron: publicationConnectionTimeout): how long a requester waits to learn
    #: that its service's host went silent (its netbridge or host died, or the status messages
    #: saying its last responder left were all lost). A receiver that leaves says so at once
    publication_connection_timeout: float = 5.0
    #: an untethered subscriber this long at the bottom of the window goes unavailable
    untethered_window_limit_timeout: float = 5.0
    #: then rests this long before it rejoins
    untethered_resting_timeout: float = 10.0
    #: term length of IPC publications unless the channel sets term-length
    ipc_term_length: int = TERM_LENGTH_DEFAULT
    #: term length of udp publications unless the channel sets term-length (Aeron: 16 MiB). A
    #: receiver window is at most half a term, and through two Python bridges the window must
    #: cover what is in flight while status messages cross them, which a smaller term limits.
    #: A log is three terms: 12 MiB per publication and per image
    udp_term_length: int = UDP_TERM_LENGTH_DEFAULT
    #: IPC publication window (0: term length / 2)
    ipc_window: int = 0
    #: mtu of publications unless the channel sets mtu
    mtu: int = MTU_DEFAULT
    #: an embedded driver exits after this long with no client
    driver_idle_timeout: float = 10.0
    #: the driver's timer: liveness, heartbeats and tethering are checked at this period
    timer_interval: float = 0.1
    #: whether a client starts a driver when none is running
    embedded_driver: bool = True
    #: a client whose driver died waits for a new one (or starts it, with embedded_driver)
    #: and re-adds its publications and subscriptions, instead of failing (see Client)
    reconnect: bool = False
    #: subscriptions are tethers unless the channel says tether=false
    tether_subscriptions: bool = True
    #: the driver starts a netbridge when the first udp channel appears
    netbridge_auto_start: bool = True
    #: loss injection in the netbridge's sockets, for tests: "drop=0.05,dup=0.05,
    #: reorder=0.05,delay=0.001,seed=1" (rates per datagram; delay in seconds), optionally
    #: "start=2,stop=4" (only from 2 s to 4 s after each channel's first datagram); empty: off
    netbridge_loss: str = ""
    #: UDP socket buffer sizes of the netbridge (0: the system default)
    netbridge_socket_buffer: int = 2 * 1024 * 1024
    #: the netbridge closes a receive endpoint this long after its last subscription went (a
    #: quick new subscription reuses the socket; after it, another process may bind the address)
    netbridge_endpoint_linger: float = 0.5
    #: after it did work, the netbridge spins this long (natively, yielding the CPU at every
    #: turn) before it sleeps: a datagram or frame that comes sooner is taken without a
    #: wake-up, which shortens round trips at the cost of the CPU the spin takes after each
    #: burst (an idle bridge does not spin); 0: sleep at once
    netbridge_busy_window: float = 100e-6
    #: a reader waiting in poll(timeout=), wait(), messages() or messages_async(), and a
    #: back-pressured publish(), look again this long (yielding the CPU at every turn; a
    #: reader's first 2 us without a system call) before they sleep on the log's futex
    #: word, as Aeron's back-off idle strategy spins, yields and then parks: a stream that
    #: keeps coming never puts its reader to sleep, so the writer pays no wake-up, and a
    #: reply within it pays none either. Where messages come further apart than this, a
    #: waiter spends up to this much CPU on each; an idle bus none. 0: sleep at once
    wait_spin: float = 20e-6
    #: the longest message an IPC publication takes (offer, publish, try_claim, publish_array,
    #: publish_object). A message longer than its log's max message length (min(term length /
    #: 8, 16 MiB)) goes into a shared-memory block the driver hands out and reclaims, and the
    #: log carries a reference to it; each IPC publication's block ring reserves (sparse, no
    #: memory until used) twice this in address space. UDP channels are limited by their term
    #: length (term length / 8, at most 16 MiB)
    max_large_message_length: int = 1 << 30
    #: the share (0 < share <= 1) of the free space of the bus's filesystem (measured when a
    #: block ring grows, the ring's own pages counted as free) that each IPC publication's block
    #: ring may keep allocated for reuse: its "warm" beginning, at most 64 MiB, where a stream of
    #: large messages reuses the same pages (no allocation, zeroing or page faults per message),
    #: but never less than room for two of the stream's longest message. The rest is left for
    #: the driver's own files and new logs; the driver takes warm pages back when it cannot
    #: create a log for lack of room, and once a ring has been idle 5 s
    large_message_warm_share: float = WARM_SHARE
    #: the keyring file of authenticated channels (``key=`` in an aeron:udp channel; see
    #: shmbus/settings/keyring.py): read by the driver and its netbridge. Empty:
    #: ``~/.config/shmbus/keyring``. It must be the user's own, mode 0600
    keyring: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.max_large_message_length <= 1 << 40:
            raise ValueError(f"max_large_message_length must be 1 byte to 1 TiB, not "
                             f"{self.max_large_message_length!r}")
        if not 0 < self.large_message_warm_share <= 1:
            raise ValueError(f"large_message_warm_share must be a share of the free space, "
                             f"0 < share <= 1, not {self.large_message_warm_share!r}")
        for term_length in (self.ipc_term_length, self.udp_term_length):
            check_term_length(term_length)
            check_mtu(self.mtu, term_length)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _NOT_TIMES:
                continue
            if f.type == "float" and not (value > 0 or value == 0 and f.name in _MAY_BE_ZERO):
                raise ValueError(f"{f.name} must be a positive number of seconds, not {value!r}")

    @classmethod
    def resolve(cls, **overrides: Any) -> Context:
        """A context from keyword arguments, then ``SHMBUS_<NAME>`` variables, then defaults.

        Unknown keywords raise TypeError; an unparsable variable raises ValueError naming it.
        """
        known = {f.name: f for f in fields(cls)}
        for key in overrides:
            if key not in known:
                raise TypeError(f"unknown setting {key!r}; settings are {sorted(known)}")
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name in overrides and overrides[name] is not None:
                values[name] = overrides[name]
                continue
            env = os.environ.get(f"SHMBUS_{name.upper()}")
            if env is not None:
                values[name] = _parse(f"SHMBUS_{name.upper()}", f.type, env)
        return cls(**values)

    @property
    def path(self) -> Path:
        """The bus directory as a Path."""
        return Path(self.dir)

    def with_(self, **changes: Any) -> Context:
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        """The settings as one JSON object: how a driver or netbridge child process gets them."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Context:
        """The context ``to_json`` wrote; ValueError names a setting that is not valid."""
        return cls(**json.loads(text))

    def driver_command(self) -> list[str]:
        """The command line that runs a driver for this context in the foreground."""
        return [sys.executable, "-m", "shmbus.driver", self.to_json()]


def _parse(variable: str, kind: Any, text: str) -> Any:
    try:
        if kind == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text, 0)
        if kind == "float":
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"{variable}={text!r} is not a valid {kind}") from None
