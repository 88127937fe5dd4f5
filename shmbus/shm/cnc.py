"""cnc.dat: the command-and-control file of a bus directory.

Layout (every section starts on a 4096-byte boundary)::

    0        header (4096 bytes)
    4096     to-driver ring buffer    ManyToOneRingBuffer: clients -> driver commands
    ...      to-clients broadcast     BroadcastTransmitter/Receiver: driver -> clients
    ...      counters metadata        512-byte records (see shmbus.shm.counters)
    ...      counters values          one 64-bit value per 64-byte slot
    ...      error log                DistinctErrorLog

Header fields (the driver writes them; clients only read)::

    0    layout version (i32)        written last, with release: a reader that sees it sees
                                     the rest of the header
    4    to-driver length (i32)
    8    to-clients length (i32)
    12   counters metadata length (i32)
    16   counters values length (i32)
    20   error log length (i32)
    24   client liveness timeout (i64, ns)
    32   driver start time (i64, epoch ms)
    40   driver pid (i64)
    128  driver heartbeat (i64, epoch ms; its own cache line, written every timer tick)
    192  driver doorbell (i32): rung by a client after it writes a command; the driver sleeps
         on it when it has nothing to do (see shmbus.shm.doorbell)
    256  clients' doorbell (i32): rung by the driver after it broadcasts; client conductors
         sleep on it
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from shmbus.shm._native import AtomicBuffer
from shmbus.shm.broadcast import TRAILER_LENGTH as BROADCAST_TRAILER_LENGTH
from shmbus.shm.broadcast import broadcast_buffer_length
from shmbus.shm.counters import COUNTER_LENGTH, METADATA_LENGTH
from shmbus.shm.doorbell import Doorbell
from shmbus.shm.ring_buffer import TRAILER_LENGTH as RING_TRAILER_LENGTH
from shmbus.shm.ring_buffer import ring_buffer_length

CNC_FILE = "cnc.dat"
CNC_VERSION = 1
HEADER_LENGTH = 4096
SECTION_ALIGNMENT = 4096

VERSION_OFFSET = 0
TO_DRIVER_LENGTH_OFFSET = 4
TO_CLIENTS_LENGTH_OFFSET = 8
COUNTERS_METADATA_LENGTH_OFFSET = 12
COUNTERS_VALUES_LENGTH_OFFSET = 16
ERROR_LOG_LENGTH_OFFSET = 20
CLIENT_LIVENESS_TIMEOUT_OFFSET = 24
START_TIME_OFFSET = 32
PID_OFFSET = 40
HEARTBEAT_OFFSET = 128
DRIVER_DOORBELL_OFFSET = 192
CLIENTS_DOORBELL_OFFSET = 256


class CncError(RuntimeError):
    """cnc.dat is missing, not ready, or of another layout version."""


class CncCorruptError(CncError):
    """cnc.dat's header describes a layout no driver writes, or more bytes than the file has."""


@dataclass(frozen=True)
class CncLengths:
    """Section sizes in bytes. Ring and broadcast capacities are powers of two."""

    to_driver_capacity: int = 1 << 20
    to_clients_capacity: int = 1 << 20
    counters: int = 2048
    error_log: int = 1 << 20

    @property
    def to_driver(self) -> int:
        return ring_buffer_length(self.to_driver_capacity)

    @property
    def to_clients(self) -> int:
        return broadcast_buffer_length(self.to_clients_capacity)

    @property
    def counters_metadata(self) -> int:
        return self.counters * METADATA_LENGTH

    @property
    def counters_values(self) -> int:
        return self.counters * COUNTER_LENGTH


def _aligned(n: int) -> int:
    return (n + SECTION_ALIGNMENT - 1) & -SECTION_ALIGNMENT


class CncFile:
    """A mapped cnc.dat, with an AtomicBuffer per section.

    ``create`` is for the driver only; ``open`` for everyone else (it checks the version). The
    sections: ``to_driver`` (buffer, offset, length), ``to_clients`` (same), and AtomicBuffers
    ``counters_metadata``, ``counters_values`` and ``error_log``.
    """

    def __init__(self, path: Path, mapping: mmap.mmap, writable: bool) -> None:
        self.path = path
        self._mmap = mapping
        self.writable = writable
        self.buffer = AtomicBuffer(mapping) if writable else None
        header = struct.unpack_from("<iiiiiiqqq", mapping, 0)
        (self.version, to_driver, to_clients, meta, values, errors, liveness_ns,
         self.start_time_ms, self.pid) = header
        self.client_liveness_timeout_ns = liveness_ns
        self.lengths = (to_driver, to_clients, meta, values, errors)
        offset = HEADER_LENGTH
        self._sections: list[tuple[int, int]] = []
        for length in self.lengths:
            self._sections.append((offset, length))
            offset = _aligned(offset + length)
        self.total_length = offset
        self._views: list[memoryview] = []

    # -- creation (driver) -------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, lengths: CncLengths, *, pid: int, start_time_ms: int,
               client_liveness_timeout_ns: int) -> CncFile:
        """Create cnc.dat (mode 0600), replacing any old one; the version is written last."""
        path = directory / CNC_FILE
        sizes = (lengths.to_driver, lengths.to_clients, lengths.counters_metadata,
                 lengths.counters_values, lengths.error_log)
        total = HEADER_LENGTH
        for size in sizes:
            total = _aligned(total + size)
        tmp = directory / (CNC_FILE + ".new")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, total)
            except OSError as e:
                st = os.statvfs(directory)
                raise OSError(e.errno, f"cannot create {path}: {total} bytes needed, "
                              f"{st.f_bavail * st.f_frsize} bytes free ({e.strerror})") from e
            mapping = mmap.mmap(fd, total)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        struct.pack_into("<iiiiiiqqq", mapping, 0, 0, *sizes, client_liveness_timeout_ns,
                         start_time_ms, pid)
        os.replace(tmp, path)
        cnc = cls(path, mapping, writable=True)
        assert cnc.buffer is not None
        cnc.buffer.put_int64_release(HEARTBEAT_OFFSET, start_time_ms)
        cnc.buffer.put_int32_release(VERSION_OFFSET, CNC_VERSION)
        cnc.version = CNC_VERSION
        return cnc

    # -- opening (clients, tools) ------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, *, writable: bool = True) -> CncFile:
        """Map an existing cnc.dat; raise CncError if it is missing, not ready or foreign.

        ``writable=False`` is for tools that must not disturb the bus: the file is opened
        read-only and mapped private (``ACCESS_COPY``), so nothing done through the map can
        reach the file, while loads see the bus's pages as they change (Linux maps a private
        page that was never written to the shared page itself). :meth:`load_view` gives
        acquire loads over it.
        """
        path = directory / CNC_FILE
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise CncError(f"no bus in {directory}: {path} does not exist") from None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_LENGTH:  # the driver renames it into place at its full size
                raise CncCorruptError(f"{path} is {size} bytes, less than its "
                                      f"{HEADER_LENGTH}-byte header: truncated or not a cnc "
                                      f"file")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_COPY
            mapping = mmap.mmap(fd, size, access=access)
        finally:
            os.close(fd)
        version = struct.unpack_from("<i", mapping, VERSION_OFFSET)[0]
        if version != CNC_VERSION:
            mapping.close()
            if version == 0:
                raise CncError(f"{path} is not ready yet (the driver is still creating it)")
            raise CncError(f"{path} has layout version {version}; this shmbus speaks version "
                           f"{CNC_VERSION}: use the same shmbus version for driver and clients")
        cnc = cls(path, mapping, writable)
        problem = _layout_problem(cnc.lengths)
        if problem is None and cnc.total_length > size:
            problem = (f"it is {size} bytes, its header describes {cnc.total_length} "
                       f"(truncated)")
        if problem is not None:
            mapping.close()
            raise CncCorruptError(f"{path} is corrupt: {problem}")
        return cnc

    # -- sections ----------------------------------------------------------------------------

    def section(self, index: int) -> AtomicBuffer:
        """An AtomicBuffer over one section (TO_DRIVER .. ERROR_LOG); needs a writable map."""
        if not self.writable:
            raise CncError(f"{self.path} is mapped read-only: read sections with snapshot()")
        return self._section_buffer(index)

    def load_view(self, index: int) -> AtomicBuffer:
        """An AtomicBuffer over one section of a read-only open, for acquire loads of what
        others write (a tool reading counters live); nothing stored through it leaves this
        process (the map is private)."""
        if self.writable:
            raise CncError(f"{self.path} is mapped writable: use section()")
        return self._section_buffer(index)

    def _section_buffer(self, index: int) -> AtomicBuffer:
        """An AtomicBuffer over one section of the map (its view is released on close)."""
        offset, length = self._sections[index]
        view = memoryview(self._mmap)[offset:offset + length]
        self._views.append(view)
        return AtomicBuffer(view)

    def doorbell(self, offset: int) -> Doorbell:
        """The driver's (DRIVER_DOORBELL_OFFSET) or the clients' (CLIENTS_DOORBELL_OFFSET)
        doorbell; needs a writable map."""
        if self.buffer is None:
            raise CncError(f"{self.path} is mapped read-only: it has no doorbells to ring")
        return Doorbell(self.buffer, offset)

    def snapshot(self, index: int) -> bytes:
        """A copy of one section's bytes (for read-only tools)."""
        offset, length = self._sections[index]
        return bytes(self._mmap[offset:offset + length])

    def driver_heartbeat_ms(self) -> int:
        """The driver's last heartbeat, epoch ms."""
        if self.buffer is not None:
            return self.buffer.get_int64_acquire(HEARTBEAT_OFFSET)
        heartbeat: int = struct.unpack_from("<q", self._mmap, HEARTBEAT_OFFSET)[0]
        return heartbeat

    def set_driver_heartbeat(self, now_ms: int) -> None:
        assert self.buffer is not None
        self.buffer.put_int64_release(HEARTBEAT_OFFSET, now_ms)

    def close(self) -> None:
        for view in self._views:
            try:
                view.release()
            except BufferError:
                pass  # an AtomicBuffer over it is still alive
        self._views.clear()
        if self.buffer is not None:
            self.buffer.release()
        try:
            self._mmap.close()
        except BufferError:
            pass  # a section buffer is still referenced; unmapped with its last reference


TO_DRIVER, TO_CLIENTS, COUNTERS_METADATA, COUNTERS_VALUES, ERROR_LOG = range(5)


def _layout_problem(lengths: tuple[int, ...]) -> str | None:
    """What is wrong with the section lengths of a header (None: a layout a driver writes)."""
    to_driver, to_clients, metadata, values, error_log = lengths
    checks = (
        ("to-driver", to_driver, RING_TRAILER_LENGTH, "a power of two >= 64 plus a "
         f"{RING_TRAILER_LENGTH}-byte trailer"),
        ("to-clients", to_clients, BROADCAST_TRAILER_LENGTH, "a power of two >= 64 plus a "
         f"{BROADCAST_TRAILER_LENGTH}-byte trailer"),
    )
    for name, length, trailer, rule in checks:
        capacity = length - trailer
        if capacity < 64 or capacity & (capacity - 1):
            return f"the {name} section is {length} bytes, not {rule}"
    if metadata <= 0 or metadata % METADATA_LENGTH:
        return (f"the counters metadata section is {metadata} bytes, not a positive multiple "
                f"of {METADATA_LENGTH}")
    if values != metadata // METADATA_LENGTH * COUNTER_LENGTH:
        return (f"the counters values section is {values} bytes; {metadata // METADATA_LENGTH}"
                f" counters take {metadata // METADATA_LENGTH * COUNTER_LENGTH}")
    if error_log <= 0 or error_log % 8:
        return f"the error log section is {error_log} bytes, not a positive multiple of 8"
    return None
