"""The ``shmbus`` command in a test: through typer's runner in this process, or the installed
entry point of this interpreter's environment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from shmbus.cli.app import app

runner = CliRunner()


def run(*args: str) -> Any:
    """Run a command through typer's runner; stdout and stderr are kept apart."""
    return runner.invoke(app, list(args), catch_exceptions=False)


def shmbus_executable() -> str:
    """The installed ``shmbus`` script of this interpreter's environment (.venv/bin/shmbus)."""
    script = Path(sys.executable).with_name("shmbus")
    assert script.exists(), f"no shmbus script next to {sys.executable}: run `make test`"
    return str(script)
