"""Keyring files for keyed channels (shmbus/settings/keyring.py), mode 0600 from the start."""

from __future__ import annotations

import os
from pathlib import Path

from shmbus.settings.keyring import new_key_line


def keyring_at(path: Path, *lines: str) -> Path:
    """The keyring file ``path`` (made or rewritten, mode 0600) holding ``lines``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write("".join(line + "\n" for line in lines))
    return path


def write_keyring(folder: Path, name: str) -> str:
    """The path of a new keyring ``folder``/keyring holding a fresh key ``name``."""
    return str(keyring_at(folder / "keyring", new_key_line(name)))
