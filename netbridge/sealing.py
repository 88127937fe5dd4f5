"""Authenticated channels in the netbridge: which sockets seal, with which keys, and what is
said about the datagrams they drop (docs/protocol.md, Sealed datagrams).

A channel that names ``key=<name>`` has a :class:`netbridge._io.Sealer` on each of its sockets:
it seals every datagram the socket sends (DATA, SETUP, status messages, NAKs, RTT measurements,
announcements) and opens every datagram it receives, natively in the batch paths
(netbridge/native/sealing.c). An endpoint is keyed or not by its first channel; a datagram
that does not open is dropped before any protocol rule sees it, and counted by kind.

Pure but :class:`KeyringWatch` (it stats and reads the keyring file) and
:class:`ChannelSealers` (the bridge's use of it). Runs in the netbridge process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from netbridge._io import Sealer
from shmbus.settings.channel_uri import ChannelUri
from shmbus.settings.keyring import Keyring, KeyringError, load_keyring

#: what each of the Sealer's drop kinds (receive_batch's ``dropped``) is called in counters
#: and the error log, by kind number (netbridge/native/io.h, SEAL_*)
DROP_KINDS = {1: "plaintext", 2: "unknown key", 3: "bad tag", 4: "replayed"}
#: the channel counters of an authenticated channel: the drops of each kind, and how many
#: times the channel took its keys (1 when it opened, 1 more each time the keyring was reread:
#: how an operator sees that a rotation step reached this bridge)
SEAL_STATS = (*(f"dropped {kind}" for kind in DROP_KINDS.values()), "keyring loads")
#: how many drops of one source the error log hears of a second, and of all sources
REPORTS_PER_SOURCE = 3
REPORTS_PER_SECOND = 20


def new_sealer(keyring: Keyring, name: str) -> Sealer:
    """A Sealer for a channel named ``key=name`` (KeyringError when the keyring cannot seal
    it)."""
    return Sealer(_sealer_keys(keyring, name))


def rekey(sealer: Sealer, keyring: Keyring, name: str) -> None:
    """Give ``sealer`` the keys of ``name`` in a reread ``keyring`` (KeyringError, keys
    unchanged, when it no longer can seal that name)."""
    sealer.set_keys(_sealer_keys(keyring, name))


def _sealer_keys(keyring: Keyring, name: str) -> list[tuple[int, bytes, bool]]:
    return [(k.key_id, k.secret, k.seals) for k in keyring.keys_of(name)]


def seal_counts(sealer: Sealer) -> dict[str, int]:
    """The channel counters of SEAL_STATS from a Sealer's own counts."""
    counts = (sealer.plaintext, sealer.unknown_key, sealer.bad_tag, sealer.replayed,
              sealer.key_sets)
    return dict(zip(SEAL_STATS, counts, strict=True))


class KeyringWatch:
    """The keyring file, reread when it changes (its size, mtime or inode)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._keyring: Keyring | None = None

    def keyring(self) -> Keyring:
        """The keyring as last read (read now if never). KeyringError when it cannot be."""
        if self._keyring is None:
            self._keyring = load_keyring(self.path)
            self._seen = self._stat()
        return self._keyring

    def changed(self) -> Keyring | None:
        """The keyring reread if the file changed since it was last read, else None.
        KeyringError when it changed into something that cannot be used (the keys in use
        stay as they were)."""
        seen = self._stat()
        if self._keyring is None or seen == self._seen:
            return None
        self._seen = seen
        self._keyring = load_keyring(self.path)
        return self._keyring

    def _stat(self) -> tuple[int, int, int]:
        try:
            info = os.stat(self.path)
        except OSError:
            return (0, 0, 0)
        return (info.st_size, info.st_mtime_ns, info.st_ino)


@dataclass
class DropReports:
    """Which drops the error log hears of: at most REPORTS_PER_SOURCE a second from one source
    and REPORTS_PER_SECOND from all (a flood costs the driver nothing); the rest are only
    counted. Times in ns from any monotonic clock."""

    _second: int = -1
    _total: int = 0
    _by_source: dict[object, int] = field(default_factory=dict)

    def reports(self, now_ns: int, channel: str,
                dropped: Iterable[tuple[int, object]]) -> list[str]:
        """The error-log lines for ``dropped`` ((kind, source) pairs) that are due now."""
        second = now_ns // 1_000_000_000
        if second != self._second:
            self._second, self._total = second, 0
            self._by_source.clear()
        lines = []
        for kind, source in dropped:
            seen = self._by_source.get(source, 0)
            if seen >= REPORTS_PER_SOURCE or self._total >= REPORTS_PER_SECOND:
                continue
            self._by_source[source] = seen + 1
            self._total += 1
            lines.append(f"{channel}: dropped a datagram from {_address(source)}: "
                         f"{DROP_KINDS.get(kind, f'kind {kind}')}")
        return lines


def _address(source: object) -> str:
    if isinstance(source, tuple) and len(source) == 2:
        return f"{source[0]}:{source[1]}"
    return str(source)


class KeyedChannel(Protocol):
    """A bridge channel as its sealing sees it: the channel text, and for an authenticated one
    the key it names and its sockets' sealer (both None for plaintext)."""

    @property
    def channel(self) -> str: ...

    @property
    def key(self) -> str | None: ...

    @property
    def sealer(self) -> Sealer | None: ...


class ChannelSealers:
    """The keyring as the bridge's channels use it: a Sealer for each keyed channel it opens,
    the keys of a keyring file that changed for all of them, and the error-log lines
    (``report``) about datagrams that did not open."""

    def __init__(self, keyring: KeyringWatch, report: Callable[[str], None]) -> None:
        self._keyring = keyring
        self._report = report
        self._drop_reports = DropReports()

    def sealer(self, uri: ChannelUri) -> Sealer | None:
        """A new Sealer for an authenticated channel, None for plaintext (KeyringError when
        the keyring cannot seal its key)."""
        return None if uri.key is None else new_sealer(self._keyring.keyring(), uri.key)

    def reread(self, channels: Iterable[KeyedChannel]) -> None:
        """Give every keyed channel the keys of a keyring file that changed (its keys stay
        as they were, and the error log says why, when the new file cannot be used)."""
        try:
            keyring = self._keyring.changed()
        except KeyringError as e:
            self._report(f"keyring not reread: {e}")
            return
        if keyring is None:
            return
        for channel in channels:
            if channel.sealer is not None and channel.key is not None:
                try:
                    rekey(channel.sealer, keyring, channel.key)
                except KeyringError as e:
                    self._report(f"{channel.channel}: keys unchanged: {e}")

    def drops_of(self, channel: KeyedChannel, now: int
                 ) -> Callable[[list[tuple[int, object]]], None] | None:
        """What a keyed channel's receive does with the datagrams that did not open: the
        error log hears of a few (DropReports); the Sealer counted them all."""
        if channel.sealer is None:
            return None

        def report(dropped: list[tuple[int, object]]) -> None:
            for line in self._drop_reports.reports(now, channel.channel, dropped):
                self._report(line)
        return report


__all__ = ["DROP_KINDS", "SEAL_STATS", "ChannelSealers", "DropReports", "KeyedChannel",
           "KeyringError", "KeyringWatch", "new_sealer", "rekey", "seal_counts"]
