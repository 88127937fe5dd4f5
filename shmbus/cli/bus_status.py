"""Whether a bus is running or stale, and the exit code each monitoring command ends with.

``running``: cnc.dat is there, the driver's heartbeat is younger than the driver timeout and
its pid is alive (and was not reused). ``stale``: cnc.dat is there but the heartbeat is old or
the driver process is gone (it crashed or was killed; the next driver cleans up). With no
directory or no cnc.dat, :func:`shmbus.cli.snapshot.read_snapshot` raises
``BusNotFoundError``, whose message names where it looked and how to start a driver.

Exit codes of ``shmbus stat``, ``streams``, ``clients`` and ``errors``: 0 running bus, 1 no
bus (no directory, no cnc.dat, not ready or another layout version; a message on stderr,
nothing on stdout), 3 stale bus (what it holds is still shown). 2 is typer's code for a usage
error.
"""

from __future__ import annotations

from dataclasses import dataclass

from shmbus.cli.formatting import format_duration
from shmbus.cli.processes import ProcessInfo, probe_processes
from shmbus.cli.snapshot import BusSnapshot

EXIT_OK = 0
EXIT_NO_BUS = 1
EXIT_STALE = 3

RUNNING = "running"
STALE = "stale"


@dataclass(frozen=True)
class BusStatus:
    """A bus's state (:data:`RUNNING` or :data:`STALE`), why it is stale (None when running)
    and the age of the driver's heartbeat when the snapshot was taken."""

    state: str
    reason: str | None
    heartbeat_age_ms: int

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.state == RUNNING else EXIT_STALE


def assess_bus(snapshot: BusSnapshot, driver_timeout_ms: int,
               driver_process: ProcessInfo) -> BusStatus:
    """Running or stale, from the heartbeat age and the driver's process."""
    driver = snapshot.driver
    age = max(0, snapshot.time_ms - driver.heartbeat_ms)
    reasons = []
    if not driver_process.alive:
        reasons.append(f"driver pid {driver.pid}: {driver_process.reason}")
    if age > driver_timeout_ms:
        reasons.append(f"driver heartbeat is {format_duration(age)} old (timeout "
                       f"{format_duration(driver_timeout_ms)})")
    if reasons:
        reason = "; ".join(reasons) + (f"; a new driver (shmbus driver --dir "
                                       f"{snapshot.directory}) cleans up the old files")
        return BusStatus(STALE, reason, age)
    return BusStatus(RUNNING, None, age)


def check_bus(snapshot: BusSnapshot, driver_timeout_ms: int) -> BusStatus:
    """:func:`assess_bus` with the driver's process looked up now."""
    driver = snapshot.driver
    process = probe_processes({driver.pid: driver.start_time_ms})[driver.pid]
    return assess_bus(snapshot, driver_timeout_ms, process)
