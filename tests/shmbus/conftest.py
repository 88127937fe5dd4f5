"""Fixtures of the client's multi-process tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.shmbus.driver.test_driver_processes import Processes


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Spawned member processes and their result queue; every one stopped after the test."""
    processes = Processes()
    try:
        yield processes
    finally:
        processes.close()
