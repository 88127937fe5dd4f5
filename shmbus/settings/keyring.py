"""The keyring of authenticated channels: which secret seals a channel named ``key=<name>``.

A keyring is a text file of the user's own (mode 0600, refused otherwise), one key a line::

    # name      id          secret (32 bytes, base64)                      [receive-only]
    prod-a      2817263411  3q2+7w0K...=
    prod-a      90311       Xk0d9Rbm...=                                   receive-only

* ``name`` is what a channel names (``aeron:udp?endpoint=...|key=prod-a``); a name may have
  several keys, which is how a key is rotated with nothing lost.
* ``id`` (1 to 2**32-1, unique in the file) travels in every sealed datagram, so a receiver
  knows which key opens it; every host that shares the key has the same line.
* a channel seals with the *last* key of its name that is not ``receive-only``, and opens
  datagrams sealed with any key of its name.

Rotation: add the new key as ``receive-only`` on every host, then drop the marker (hosts switch
as they reread the file, and each already opens the other's datagrams), then remove the old
key. A running netbridge rereads the file when it changes.

Pure but :func:`load_keyring` (reads and checks the file) and :func:`new_key_line` (draws a
secret). A secret never appears in an error, a repr, a counter label or a log line.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from shmbus.settings.channel_uri import KEY_NAME

#: bytes in a secret (an AES-256 key)
SECRET_LENGTH = 32
_RECEIVE_ONLY = "receive-only"


class KeyringError(ValueError):
    """A keyring that cannot be used, or a key it does not hold; the message names the file
    and line (never a secret)."""


@dataclass(frozen=True)
class Key:
    """One line of a keyring."""

    name: str
    key_id: int
    secret: bytes = field(repr=False)
    #: False for a ``receive-only`` key: it opens datagrams but never seals one
    seals: bool = True


@dataclass(frozen=True)
class Keyring:
    """The keys of one keyring file, in file order."""

    keys: tuple[Key, ...]
    origin: str = "<keyring>"

    def keys_of(self, name: str) -> tuple[Key, ...]:
        """The keys a channel named ``key=name`` uses, the sealing one last. KeyringError when
        the keyring has no key of that name, or none that may seal."""
        found = tuple(k for k in self.keys if k.name == name)
        if not found:
            raise KeyringError(f"keyring {self.origin} holds no key named {name!r} (add one "
                               f"with: shmbus keygen {name})")
        sealing = [k for k in found if k.seals]
        if not sealing:
            raise KeyringError(f"keyring {self.origin}: every key named {name!r} is "
                               f"{_RECEIVE_ONLY}, so no channel can seal with it")
        last = sealing[-1]
        return tuple(k for k in found if k is not last) + (last,)


def parse_keyring(text: str, origin: str = "<keyring>") -> Keyring:
    """The keys of a keyring's text. KeyringError names the line that is wrong."""
    keys: list[Key] = []
    ids: set[int] = set()
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"keyring {origin} line {number}"
        if len(words) not in (3, 4) or (len(words) == 4 and words[3] != _RECEIVE_ONLY):
            raise KeyringError(f"{where}: expected 'name id secret [{_RECEIVE_ONLY}]', got "
                               f"{len(words)} fields")
        name, id_text, encoded = words[:3]
        if not KEY_NAME.fullmatch(name):
            raise KeyringError(f"{where}: {name!r} is not a key name (1 to 64 of A-Z a-z "
                               f"0-9 . _ -)")
        if not id_text.isdigit() or not 0 < int(id_text) < 2**32:
            raise KeyringError(f"{where}: key id {id_text!r} is not 1 to 4294967295")
        key_id = int(id_text)
        if key_id in ids:
            raise KeyringError(f"{where}: key id {key_id} is already used by another key")
        try:
            secret = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise KeyringError(f"{where}: the secret is not base64") from None
        if len(secret) != SECRET_LENGTH:
            raise KeyringError(f"{where}: the secret is {len(secret)} bytes, not "
                               f"{SECRET_LENGTH}")
        ids.add(key_id)
        keys.append(Key(name, key_id, secret, seals=len(words) == 3))
    return Keyring(tuple(keys), origin)


def keyring_path(setting: str) -> Path:
    """The keyring file a ``Context.keyring`` setting names (empty: the default)."""
    if setting:
        return Path(setting).expanduser()
    return Path.home() / ".config" / "shmbus" / "keyring"


def load_keyring(path: Path) -> Keyring:
    """Read and parse the keyring at ``path``. KeyringError when it is missing, is not a
    regular file of this user, or others may read or write it (mode must be 0600 or 0400)."""
    try:
        with open(path, "rb") as file:
            info = os.fstat(file.fileno())
            data = file.read()
    except OSError as e:
        raise KeyringError(f"keyring {path}: {e.strerror} (set Context.keyring or "
                           f"SHMBUS_KEYRING, or create it with: shmbus keygen NAME)") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyringError(f"keyring {path} is not a regular file")
    if info.st_uid != os.getuid():
        raise KeyringError(f"keyring {path} belongs to uid {info.st_uid}, not to this user "
                           f"({os.getuid()})")
    if info.st_mode & 0o077:
        raise KeyringError(f"keyring {path} has mode {stat.S_IMODE(info.st_mode):04o}: others "
                           f"may read or change its secrets; chmod 600 it")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise KeyringError(f"keyring {path} is not UTF-8 text") from None
    return parse_keyring(text, str(path))


def new_key_line(name: str, taken: set[int] | None = None) -> str:
    """A keyring line with a fresh random secret and id (not one of ``taken``)."""
    if not KEY_NAME.fullmatch(name):
        raise KeyringError(f"{name!r} is not a key name (1 to 64 of A-Z a-z 0-9 . _ -)")
    taken = taken or set()
    key_id = 0
    while key_id == 0 or key_id in taken:
        key_id = secrets.randbits(32)
    secret = base64.b64encode(secrets.token_bytes(SECRET_LENGTH)).decode()
    return f"{name} {key_id} {secret}"
