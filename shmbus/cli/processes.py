"""What the operating system says about the processes a bus names (its driver, its clients),
looked up with psutil: alive or gone, and for a live one its name, command line, CPU% and RSS.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

#: A process's start time is known to about a second (boot time has 1 s resolution).
_CREATE_TIME_SLACK_MS = 2000


@dataclass(frozen=True)
class ProcessInfo:
    """What psutil says about one pid. ``alive`` is False for a missing, zombie or reused pid."""

    pid: int
    alive: bool
    reason: str | None = None
    name: str | None = None
    cmdline: tuple[str, ...] = ()
    cpu_percent: float | None = None
    rss: int | None = None
    status: str | None = None

    def to_json(self) -> dict[str, Any] | None:
        """A client's ``process`` in ``shmbus clients --json``: None for a process that is
        not alive."""
        if not self.alive:
            return None
        return {"name": self.name, "cmdline": list(self.cmdline),
                "cpu_percent": self.cpu_percent, "rss": self.rss, "status": self.status}


def probe_processes(pids: Mapping[int, int | None], cpu_interval: float = 0.0
                    ) -> dict[int, ProcessInfo]:
    """Look up processes: ``pids`` maps a pid to an epoch ms by which it must have existed.

    A process started after that time has only reused the pid: it counts as gone. With
    ``cpu_interval`` > 0, CPU% is measured over that many seconds (one sleep for all).
    """
    out: dict[int, ProcessInfo] = {}
    live: dict[int, psutil.Process] = {}
    for pid, existed_by_ms in pids.items():
        try:
            process = psutil.Process(pid)
            status = process.status()
            create_ms = int(process.create_time() * 1000)
        except psutil.NoSuchProcess:
            out[pid] = ProcessInfo(pid, False, "process is gone (no such pid)")
            continue
        except psutil.AccessDenied:
            out[pid] = ProcessInfo(pid, True, "details not readable (access denied)")
            continue
        if status == psutil.STATUS_ZOMBIE:
            out[pid] = ProcessInfo(pid, False, "process has exited (a zombie its parent has "
                                               "not reaped)", status=status)
            continue
        if existed_by_ms is not None and create_ms > existed_by_ms + _CREATE_TIME_SLACK_MS:
            out[pid] = ProcessInfo(pid, False, "process is gone (its pid now belongs to a "
                                               "process started later)")
            continue
        if cpu_interval > 0:
            try:
                process.cpu_percent(None)
            except psutil.Error:
                pass
        live[pid] = process
    if live and cpu_interval > 0:
        time.sleep(cpu_interval)
    for pid, process in live.items():
        try:
            with process.oneshot():
                out[pid] = ProcessInfo(
                    pid, True, None, process.name(), tuple(process.cmdline()),
                    process.cpu_percent(None) if cpu_interval > 0 else None,
                    process.memory_info().rss, process.status())
        except psutil.NoSuchProcess:
            out[pid] = ProcessInfo(pid, False, "process is gone (no such pid)")
        except psutil.Error as e:
            out[pid] = ProcessInfo(pid, True, f"details not readable ({type(e).__name__})")
    return out
