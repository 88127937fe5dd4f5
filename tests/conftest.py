"""Shared fixtures: a fresh directory under /dev/shm for each test that needs one."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis' per-example deadline measures this machine's load, not the code: off everywhere.
settings.register_profile("shmbus", deadline=None)
settings.load_profile("shmbus")


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory in /dev/shm, removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="shmbus-test-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs mounted for the test."""
    with mounted_tmpfs(tmp_path / "tiny", "512k") as mount_point:
        yield mount_point


@pytest.fixture
def bus_context(shm_dir: Path):
    """Settings for a test bus in a fresh directory, with short timeouts."""
    from shmbus import Context

    return Context(dir=str(shm_dir / "bus"), driver_timeout=5.0, client_liveness_timeout=2.0,
                   keepalive_interval=0.1, publication_unblock_timeout=1.0,
                   publication_linger_timeout=1.0, untethered_window_limit_timeout=0.5,
                   untethered_resting_timeout=1.0, ipc_term_length=65536,
                   driver_idle_timeout=600.0, timer_interval=0.02, embedded_driver=False)


def io_uring_futex_waits() -> bool:
    """Whether this kernel lets a FutexRing be made (io_uring with futex waits, Linux 6.7+),
    so that shmbus.shm.log_watchers picks it over the LogWatcher thread."""
    from shmbus.shm._native import FutexRing

    try:
        FutexRing().close()
    except OSError:
        return False
    return True


def driver_serves(context, pid: int) -> bool:
    """True once the driver process ``pid`` serves ``context.dir`` (its CnC file is ready and
    names it)."""
    import os

    from shmbus.client.driver_launch import try_open as _try_open

    cnc = _try_open(Path(context.dir), context) if os.path.isdir(context.dir) else None
    if cnc is None:
        return False
    try:
        return cnc.pid == pid
    finally:
        cnc.close()


def start_driver(context, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start a driver process for ``context.dir`` and wait until it serves (20 s at most).

    ``prefix`` runs it through another command, e.g. ``("ip", "netns", "exec", name)``.
    """
    import time

    process = subprocess.Popen([*prefix, *context.driver_command()])
    deadline = time.monotonic() + 20
    while True:
        if driver_serves(context, process.pid):
            return process
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"test driver did not start (exit code {process.returncode})")
        time.sleep(0.01)


def stop_driver(process: subprocess.Popen) -> int | None:
    """SIGTERM a driver (it removes its files and stops its netbridge), SIGKILL if stuck;
    returns its exit code."""
    import signal

    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@pytest.fixture
def driver(bus_context):
    """A driver process serving ``bus_context.dir``; stopped (SIGTERM) after the test.

    Yields the subprocess.Popen; tests may kill it. Clients connect with
    ``shmbus.connect(bus_context)``.
    """
    process = start_driver(bus_context)
    try:
        yield process
    finally:
        stop_driver(process)
