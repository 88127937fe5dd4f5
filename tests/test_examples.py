"""The examples run as a user would run them, and say they succeeded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(("script", "expected"), [
    ("demo.py", "nothing lost, nothing reordered, nothing corrupted"),
    ("numpy_pool.py", "300 results, 0 wrong"),
    ("request_reply.py", "4150 calls answered, 0 wrong"),
    ("late_joiner.py", "live: every number once, in order"),
])
def test_example_runs(shm_dir, script: str, expected: str) -> None:
    result = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                            text=True, timeout=240, env={"SHMBUS_DIR": str(shm_dir / "bus"),
                                                         "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert expected in result.stdout
