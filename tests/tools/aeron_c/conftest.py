"""Fixtures of the tests of Aeron's C client and driver (tools/aeron_c/build.sh builds them):
the compiled test programs, and Aeron's own C media driver on a directory in /dev/shm with the
programs of one test run against it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.aeron_c import (
    AeronC,
    Programs,
    build_message_probe,
    running_aeronmd,
)


@pytest.fixture(scope="session")
def message_probe() -> Path:
    """message_probe (tools/aeron_c/c/message_probe.c), compiled when stale; needs only
    ``cc``, not the Aeron build."""
    return build_message_probe()


@pytest.fixture
def aeron_dir(shm_dir: Path) -> Path:
    """The driver directory (aeron.dir) of the test, under /dev/shm."""
    return shm_dir / "aeron"


@pytest.fixture
def aeronmd(aeron_c: AeronC, aeron_dir: Path,
            tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Aeron's C media driver serving ``aeron_dir``, stopped after the test."""
    with running_aeronmd(aeron_c.aeronmd, aeron_dir, tmp_path / "aeronmd.log") as process:
        yield process


@pytest.fixture
def programs(aeron_c: AeronC, aeron_dir: Path, aeronmd: subprocess.Popen[bytes],
             tmp_path: Path) -> Iterator[Programs]:
    """The C programs run against the ``aeronmd`` driver; those still running at the end of
    the test are killed."""
    started = Programs(aeron_c, aeron_dir, tmp_path)
    try:
        yield started
    finally:
        started.close()
