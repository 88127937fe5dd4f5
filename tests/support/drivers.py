"""Driver processes for a test bus: started until they serve, stopped with SIGTERM.

The ``driver`` fixture (tests/conftest.py) runs one for ``bus_context``; a test that needs a
second bus, a driver in a network namespace or one it kills and restarts uses these.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shmbus.client.driver_launch import try_open as _try_open
from shmbus.shm.cnc import CncLengths
from tests.support.waits import wait_until

#: cnc.dat small enough for a tiny tmpfs (the default one is ~5 MiB)
TINY_LENGTHS = CncLengths(to_driver_capacity=16384, to_clients_capacity=16384, counters=64,
                          error_log=8192, events_capacity=16384)


def driver_serves(context: Any, pid: int) -> bool:
    """True once the driver process ``pid`` serves ``context.dir`` (its CnC file is ready and
    names it). Reads cnc.dat only: no client connects."""
    cnc = _try_open(Path(context.dir), context) if os.path.isdir(context.dir) else None
    if cnc is None:
        return False
    try:
        return cnc.pid == pid
    finally:
        cnc.close()


def start_driver(context: Any, prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """Start a driver process for ``context.dir`` and wait until it serves (20 s at most).

    ``prefix`` runs it through another command, e.g. ``("ip", "netns", "exec", name)``.
    """
    process = subprocess.Popen([*prefix, *context.driver_command()])
    try:
        wait_until(lambda: process.poll() is not None or driver_serves(context, process.pid),
                   20, f"a driver to serve {context.dir}")
    except BaseException:
        process.kill()
        process.wait()
        raise
    if process.returncode is not None:
        pytest.fail(f"test driver did not start (exit code {process.returncode})")
    return process


@contextmanager
def running_driver(context: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A driver process serving ``context.dir`` (:func:`start_driver`) for the ``with`` block,
    stopped (:func:`stop_driver`) when it ends."""
    process = start_driver(context)
    try:
        yield process
    finally:
        stop_driver(process)


def stop_driver(process: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM a driver (it removes its files and stops its netbridge), SIGKILL if stuck;
    returns its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def system_counter(bus: Any, counter: Any) -> int:
    """The value of the driver's system counter ``counter`` (a SystemCounter)."""
    return int(bus.counters.get_value(counter.value))
