"""Finding the live driver of a bus directory, or starting an embedded one.

A driver is live while its cnc.dat heartbeat is younger than ``Context.driver_timeout`` and its
process exists. With ``embedded_driver`` a client that finds none starts one (a process of its
own session, ``Context.driver_command()``); a lock file in the directory makes the clients that
race to do so start one between them, the others then finding it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from shmbus.settings.context import Context
from shmbus.settings.errors import DriverUnavailableError
from shmbus.shm._native import epoch_ms
from shmbus.shm.bus_directory import prepare_directory
from shmbus.shm.cnc import CncError, CncFile, CncLayoutError

#: the file of the bus directory whose lock a client holds while it looks for and starts a driver
LAUNCH_LOCK = "launch.lock"
#: the embedded drivers this process started and has not seen exit yet
_launched: list[subprocess.Popen[bytes]] = []


def open_or_launch(context: Context) -> CncFile:
    """The cnc.dat of the live driver in ``context.dir``, which is made (mode 0700) if missing;
    without one, a driver started for it (``embedded_driver``).

    Raises DriverUnavailableError when no driver is live and ``embedded_driver`` is False, or
    when the one started exits or does not serve within ``max(driver_timeout, 5)`` seconds;
    CncLayoutError for a cnc.dat of another layout (an Aeron media driver's, or another shmbus
    version's); PermissionError for a directory of another user.
    """
    directory = Path(context.dir)
    prepare_directory(directory)
    cnc = try_open(directory, context)
    if cnc is not None:
        return cnc
    if not context.embedded_driver:
        raise DriverUnavailableError(
            f"no live driver in {directory}: start one with `shmbus driver --dir {directory}`, "
            f"or connect with embedded_driver=True")
    lock_fd = os.open(directory / LAUNCH_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # one launcher at a time; the others then find it
        cnc = try_open(directory, context)
        if cnc is None:
            cnc = _launch(context)
        return cnc
    finally:
        os.close(lock_fd)


def try_open(directory: Path, context: Context) -> CncFile | None:
    """The cnc.dat in ``directory`` if its driver is live (see :func:`driver_alive`), else None
    (none there, half written, or its driver dead). CncLayoutError for another layout."""
    try:
        cnc = CncFile.open(directory)
    except CncLayoutError:
        raise
    except CncError:
        return None
    if driver_alive(cnc, context):
        return cnc
    cnc.close()
    return None


def driver_alive(cnc: CncFile, context: Context) -> bool:
    """Whether the driver of ``cnc`` heartbeated within ``context.driver_timeout`` and its
    process exists."""
    age = epoch_ms() - cnc.driver_heartbeat_ms()
    return age <= context.driver_timeout * 1000 and psutil.pid_exists(cnc.pid)


def reap_launched() -> None:
    """Forget (and reap) the embedded drivers this process started that have exited."""
    for process in list(_launched):
        if process.poll() is not None:
            _launched.remove(process)


def _launch(context: Context) -> CncFile:
    """Start a driver for ``context.dir`` and wait until its cnc.dat names it."""
    directory = Path(context.dir)
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            context.driver_command(),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True)
        _launched.append(process)
        deadline = time.monotonic() + max(context.driver_timeout, 5.0)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                stderr.seek(0)
                detail = stderr.read().decode(errors="replace").strip().splitlines()
                raise DriverUnavailableError(
                    f"the embedded driver for {directory} exited with {process.returncode}: "
                    f"{detail[-1] if detail else 'no message'}")
            try:
                cnc = CncFile.open(directory)
            except CncError:
                time.sleep(0.005)
                continue
            if cnc.pid == process.pid:
                return cnc
            cnc.close()
            time.sleep(0.005)
    process.kill()
    raise DriverUnavailableError(f"the embedded driver for {directory} did not start within "
                                 f"{max(context.driver_timeout, 5.0)} s")
