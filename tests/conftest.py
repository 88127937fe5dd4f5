"""Fixtures of every test: a fresh bus directory and its settings, a driver process, a tiny
tmpfs, Aeron's C client and the test programs built on it. What tests share beyond fixtures is
in tests/support/."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.aeron_c import AeronC, build_programs
from tests.support.drivers import running_driver
from tests.support.system import mounted_tmpfs

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


@pytest.fixture(scope="session")
def aeron_c() -> AeronC:
    """aeronmd and the programs of tools/aeron_c/c/, compiled when stale; an error (not
    a skip) telling to run ``make aeron-c`` when Aeron is not built."""
    return build_programs()


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


@pytest.fixture
def driver(bus_context):
    """A driver process serving ``bus_context.dir``; stopped (SIGTERM) after the test.

    Yields the subprocess.Popen; tests may kill it. Clients connect with
    ``shmbus.connect(bus_context)``.
    """
    with running_driver(bus_context) as process:
        yield process
