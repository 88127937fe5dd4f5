"""Who is asleep, read from the outside: the words of a log's metadata that count its sleeping
readers and writers (shmbus/shm/log_buffer.py: data waiters, progress waiters), the driver's
timer heartbeat in cnc.dat, and the CPU a process has used. A test that needs another thread or
process asleep (or past a point) waits for these, never for a fixed time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from shmbus.shm.cnc import CncFile
from shmbus.shm.log_buffer import DATA_WAITERS_OFFSET, PROGRESS_WAITERS_OFFSET
from tests.support.waits import wait_until


def readers_asleep(log: Any) -> int:
    """How many readers ``log`` (a LogBuffer) counts as asleep on its data word: a writer
    wakes them when it commits."""
    return int(log.buffer.get_int32_acquire(log.meta_offset + DATA_WAITERS_OFFSET))


def writers_asleep(log: Any) -> int:
    """How many publishers ``log`` counts as asleep at their limit: a reader (or the driver)
    that moves wakes them."""
    return int(log.buffer.get_int32_acquire(log.meta_offset + PROGRESS_WAITERS_OFFSET))


def subscription_sleepers(subscription: Any) -> int:
    """The readers asleep on the logs of ``subscription``'s images (its own and any other
    subscription's on the same logs)."""
    return sum(readers_asleep(image.log) for image in subscription.images)


def driver_heartbeat_ms(context: Any) -> int:
    """The time the driver of ``context.dir`` last ran its timers (cnc.dat's heartbeat)."""
    cnc = CncFile.open(Path(context.dir), writable=False)
    try:
        return cnc.driver_heartbeat_ms()
    finally:
        cnc.close()


def wait_for_driver_timers(context: Any, runs: int = 2, timeout: float = 10.0) -> None:
    """Wait until the driver of ``context.dir`` has run its timers ``runs`` times from now
    (the second run is a whole timer pass after the call)."""
    for run in range(runs):
        seen = driver_heartbeat_ms(context)
        wait_until(lambda seen=seen: driver_heartbeat_ms(context) > seen, timeout,
                   f"timer run {run + 1} of the driver of {context.dir}")


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, every thread) process ``pid`` has used."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def cpu_demand(pid: int) -> float:
    """The seconds process ``pid`` (every thread) has been running or runnable, waiting for a
    CPU (/proc/<pid>/task/*/schedstat): a process that spins wants the CPU all the time, however
    loaded the machine is and however little of the CPU it gets; one asleep wants none."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            running, waiting = (task / "schedstat").read_text().split()[:2]
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        total += int(running) + int(waiting)
    return total / 1e9
