"""The ``shmbus`` command line (``app``) and the read-only monitoring it shows (``stat``)."""

from shmbus.cli.app import app, main

__all__ = ["app", "main"]
