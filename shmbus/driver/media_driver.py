"""The driver process: owns a bus directory, its cnc.dat and its log files.

Start one with ``shmbus driver`` (foreground, Ctrl-C stops it and removes its files), or let
``shmbus.connect()`` start an embedded one (``python -m shmbus.driver '<context json>'``), which
exits on its own after ``driver_idle_timeout`` seconds without a client.

A driver holds an exclusive flock on ``driver.lock`` for its whole life: a second driver on a
live directory is refused, and a dead driver's lock is released by the kernel, so the next
driver knows the directory's files are stale and cleans them up (first giving back the warm
pages of their block rings, which its clients may still map).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import threading
from pathlib import Path

from shmbus.driver.conductor import DriverConductor
from shmbus.driver.log_files import LOGS_DIR
from shmbus.driver.system_counters import allocate_system_counters
from shmbus.settings.context import Context
from shmbus.settings.errors import ShmbusError
from shmbus.shm._native import epoch_ms
from shmbus.shm.block_ring import BlockRing
from shmbus.shm.broadcast import BroadcastTransmitter
from shmbus.shm.bus_directory import prepare_directory
from shmbus.shm.cnc import (
    CLIENTS_DOORBELL_OFFSET,
    COUNTERS_METADATA,
    COUNTERS_VALUES,
    DRIVER_DOORBELL_OFFSET,
    ERROR_LOG,
    EVENTS,
    TO_CLIENTS,
    TO_DRIVER,
    CncFile,
    CncLengths,
)
from shmbus.shm.counters import CountersManager
from shmbus.shm.error_log import DistinctErrorLog
from shmbus.shm.ring_buffer import ManyToOneRingBuffer

DRIVER_LOCK = "driver.lock"


class DriverAlreadyRunningError(ShmbusError):
    """Another driver is alive in the bus directory."""


class Driver:
    """A driver over ``context.dir``. ``start()`` takes the directory, ``run()`` serves it."""

    def __init__(self, context: Context, *, embedded: bool = False,
                 lengths: CncLengths | None = None) -> None:
        self.context = context
        self.embedded = embedded
        self.lengths = lengths or CncLengths()
        self.directory = Path(context.dir)
        self._stop = threading.Event()
        self._lock_fd: int | None = None
        self.cnc: CncFile | None = None
        self.conductor: DriverConductor | None = None

    def start(self) -> None:
        """Take the directory: lock it, clean a dead driver's files, create cnc.dat.

        Raises DriverAlreadyRunningError when a live driver holds it, PermissionError when
        the directory belongs to another user, OSError (with sizes) when it is full.
        """
        prepare_directory(self.directory)
        fd = os.open(self.directory / DRIVER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DriverAlreadyRunningError(
                f"a driver is already running in {self.directory} (pid "
                f"{_read_pid(self.directory)}); stop it or use another directory") from None
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            self._give_back_dead_rings()
            self._remove_files()
            (self.directory / LOGS_DIR).mkdir(mode=0o700)  # before clients can find the bus
            now = epoch_ms()
            self.cnc = CncFile.create(
                self.directory, self.lengths, pid=os.getpid(), start_time_ms=now,
                client_liveness_timeout_ns=int(self.context.client_liveness_timeout * 1e9))
            counters = CountersManager(self.cnc.section(COUNTERS_METADATA),
                                       self.cnc.section(COUNTERS_VALUES), clock=epoch_ms)
            allocate_system_counters(counters)
            self.conductor = DriverConductor(
                self.context, self.directory,
                ManyToOneRingBuffer(self.cnc.section(TO_DRIVER)),
                BroadcastTransmitter(self.cnc.section(EVENTS)),
                BroadcastTransmitter(self.cnc.section(TO_CLIENTS)),
                counters,
                DistinctErrorLog(self.cnc.section(ERROR_LOG), clock=epoch_ms),
                self.cnc.doorbell(CLIENTS_DOORBELL_OFFSET).ring)
            # ids start at 1: 0 is the counters' "no owner"
            self.conductor.to_driver.next_correlation_id()
        except BaseException:
            self.close()
            raise

    def run(self) -> None:
        """Serve until stop() (or, embedded, until idle with no client); then close()."""
        assert self.conductor is not None and self.cnc is not None, "start() first"
        # asleep while there is nothing to do: clients ring after each command, and the
        # timers say when to wake at the latest (publishers raise their own limits)
        doorbell = self.cnc.doorbell(DRIVER_DOORBELL_OFFSET)
        idle_limit_ms = int(self.context.driver_idle_timeout * 1000)
        try:
            while not self._stop.is_set():
                seen = doorbell.value()
                now = epoch_ms()
                work = self.conductor.do_work(now)
                if self.embedded and self.conductor.idle_for_ms(now) > idle_limit_ms:
                    break
                if not work:
                    doorbell.wait(seen, self.conductor.ms_until_due(now) / 1000)
        finally:
            self.close()

    def stop(self) -> None:
        """Ask run() to return (safe from a signal handler or another thread)."""
        self._stop.set()
        if self.cnc is not None and self.cnc.buffer is not None:
            self.cnc.doorbell(DRIVER_DOORBELL_OFFSET).ring()

    def close(self) -> None:
        """Unmap and remove the directory's files, then release the lock. Idempotent."""
        if self.conductor is not None:
            self.conductor.close()
            self.conductor = None
        if self.cnc is not None:
            self.cnc.close()
            self.cnc = None
        if self._lock_fd is not None:
            self._remove_files()
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _give_back_dead_rings(self) -> None:
        """A dead driver's block rings stay in memory while its clients map them (until they
        hear of the new driver and let go): their warm pages, which no writer will reuse, go
        back before the files are removed, so they do not hold the room the new cnc.dat and
        logs need (BlockRing.give_back_warm)."""
        for path in sorted((self.directory / LOGS_DIR).glob("*.blocks")):
            try:
                ring = BlockRing.open(path)
            except (OSError, ValueError):  # gone meanwhile, or not a ring
                continue
            try:
                ring.give_back_warm()
            finally:
                ring.close()

    def _remove_files(self) -> None:
        (self.directory / "cnc.dat").unlink(missing_ok=True)
        shutil.rmtree(self.directory / LOGS_DIR, ignore_errors=True)


def _read_pid(directory: Path) -> str:
    try:
        return (directory / DRIVER_LOCK).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def run_driver(context: Context, *, embedded: bool = False) -> None:
    """Start a driver and serve until SIGINT/SIGTERM (or idle, when embedded)."""
    driver = Driver(context, embedded=embedded)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: driver.stop())
    driver.start()
    driver.run()
