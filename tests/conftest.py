"""Shared fixtures: a fresh directory under /dev/shm for each test that needs one."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory in /dev/shm, removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="shmbus-test-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
