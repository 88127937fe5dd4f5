"""What a test needs of the machine: a tmpfs of a given size (root, as CI and this machine
have), the room left on a file system, and whether the kernel has io_uring futex waits."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: "512k", "24m") mounted on the new directory
    ``mount_point`` while the block runs (needs root, as CI and this machine have)."""
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                   check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def free_bytes(path: Path) -> int:
    """The bytes an unprivileged writer may still take on the file system of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def io_uring_futex_waits() -> bool:
    """Whether this kernel lets a FutexRing be made (io_uring with futex waits, Linux 6.7+),
    so that shmbus.shm.log_watchers picks it over the LogWatcher thread."""
    from shmbus.shm._native import FutexRing

    try:
        FutexRing().close()
    except OSError:
        return False
    return True
