"""cnc.dat: the command-and-control file of a bus directory, in Aeron's layout
(``aeron_cnc_file_descriptor.h``, CnC version 0.2.0), so that Aeron's own clients attach to it.

Layout (sections follow each other with no gap; the file is rounded up to a 4096-byte page)::

    0        header (128 bytes)
    128      to-driver ring buffer    ManyToOneRingBuffer: clients -> driver commands
    ...      to-clients broadcast     Aeron's responses, for Aeron's clients
    ...      counters metadata        512-byte records (see shmbus.shm.counters)
    ...      counters values          128-byte records
    ...      error log                DistinctErrorLog
    ...      events broadcast         shmbus's own (64-byte aligned): every response the
                                      driver sends, Aeron's and shmbus's, for shmbus's clients

Aeron's clients read only the header's first 52 bytes and the five sections it names, so
shmbus's own fields live in the header's second cache line and in the events broadcast after
the error log (Aeron's client exits on a broadcast message it does not know: shmbus's events
never go on the to-clients buffer).

Header fields (the driver writes them; clients only read, except the doorbells)::

    0    CnC version (i32)           0x200 (Aeron's 0.2.0), written last, with release: a
                                     reader that sees it sees the rest of the header
    4    to-driver length (i32)
    8    to-clients length (i32)
    12   counters metadata length (i32)
    16   counters values length (i32)
    20   error log length (i32)
    24   client liveness timeout (i64, ns)
    32   driver start time (i64, epoch ms)
    40   driver pid (i64)
    48   file page size (i32)
    64   shmbus magic (i32, "SHMB")  absent from an Aeron media driver's cnc.dat
    68   shmbus layout version (i32)
    72   events broadcast length (i32)
    96   driver doorbell (i32): rung by a shmbus client after it writes a command; the driver
         sleeps on it when it has nothing to do (see shmbus.shm.doorbell)
    112  clients' doorbell (i32): rung by the driver after it broadcasts; shmbus's client
         conductors sleep on it

The driver's liveness is the to-driver ring's consumer heartbeat, as Aeron's clients read it.
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
from shmbus.shm.ring_buffer import CONSUMER_HEARTBEAT_OFFSET, ring_buffer_length
from shmbus.shm.ring_buffer import TRAILER_LENGTH as RING_TRAILER_LENGTH

CNC_FILE = "cnc.dat"
#: Aeron's CnC version 0.2.0 (major << 16 | minor << 8 | patch): clients compare the major
CNC_VERSION = 0x200
#: "SHMB", little-endian: a shmbus driver's cnc.dat
SHMBUS_MAGIC = int.from_bytes(b"SHMB", "little")
SHMBUS_LAYOUT_VERSION = 2
HEADER_LENGTH = 128
FILE_PAGE_SIZE = 4096
EVENTS_ALIGNMENT = 64

VERSION_OFFSET = 0
TO_DRIVER_LENGTH_OFFSET = 4
TO_CLIENTS_LENGTH_OFFSET = 8
COUNTERS_METADATA_LENGTH_OFFSET = 12
COUNTERS_VALUES_LENGTH_OFFSET = 16
ERROR_LOG_LENGTH_OFFSET = 20
CLIENT_LIVENESS_TIMEOUT_OFFSET = 24
START_TIME_OFFSET = 32
PID_OFFSET = 40
FILE_PAGE_SIZE_OFFSET = 48
SHMBUS_MAGIC_OFFSET = 64
SHMBUS_LAYOUT_VERSION_OFFSET = 68
EVENTS_LENGTH_OFFSET = 72
DRIVER_DOORBELL_OFFSET = 96
CLIENTS_DOORBELL_OFFSET = 112

_AERON_HEADER = struct.Struct("<iiiiiiqqqi")
_SHMBUS_HEADER = struct.Struct("<iii")


def cnc_major(version: int) -> int:
    """The major of a CnC version: what Aeron's clients compare."""
    return (version >> 16) & 0xFF


class CncError(RuntimeError):
    """cnc.dat is missing, not ready, or of another layout version."""


class CncLayoutError(CncError):
    """cnc.dat is of another layout: an Aeron media driver's, another CnC major, or another
    shmbus layout version."""


class CncCorruptError(CncError):
    """cnc.dat's header describes a layout no driver writes, or more bytes than the file has."""


@dataclass(frozen=True)
class CncLengths:
    """Section sizes in bytes. Ring and broadcast capacities are powers of two."""

    to_driver_capacity: int = 1 << 20
    to_clients_capacity: int = 1 << 20
    counters: int = 2048
    error_log: int = 1 << 20
    events_capacity: int = 1 << 20

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

    @property
    def events(self) -> int:
        return broadcast_buffer_length(self.events_capacity)


def _sections(lengths: tuple[int, ...]) -> tuple[list[tuple[int, int]], int]:
    """(offset, length) of each section, and the file's length: Aeron's five back to back
    from the header, then the events broadcast, 64-byte aligned; the file a whole page."""
    sections = []
    offset = HEADER_LENGTH
    for length in lengths[:ERROR_LOG + 1]:
        sections.append((offset, length))
        offset += length
    offset = -(-offset // EVENTS_ALIGNMENT) * EVENTS_ALIGNMENT
    sections.append((offset, lengths[EVENTS]))
    end = offset + lengths[EVENTS]
    return sections, -(-end // FILE_PAGE_SIZE) * FILE_PAGE_SIZE


class CncFile:
    """A mapped cnc.dat, with an AtomicBuffer per section.

    ``create`` is for the driver only; ``open`` for everyone else (it checks the version). The
    sections, by index: TO_DRIVER, TO_CLIENTS, COUNTERS_METADATA, COUNTERS_VALUES, ERROR_LOG
    and EVENTS.
    """

    def __init__(self, path: Path, mapping: mmap.mmap, writable: bool) -> None:
        self.path = path
        self._mmap = mapping
        self.writable = writable
        self.buffer = AtomicBuffer(mapping) if writable else None
        (self.version, to_driver, to_clients, meta, values, errors, liveness_ns,
         self.start_time_ms, self.pid, self.page_size) = _AERON_HEADER.unpack_from(mapping, 0)
        self.magic, self.layout_version, events = _SHMBUS_HEADER.unpack_from(
            mapping, SHMBUS_MAGIC_OFFSET)
        self.client_liveness_timeout_ns = liveness_ns
        self.lengths = (to_driver, to_clients, meta, values, errors, events)
        self._sections, self.total_length = _sections(self.lengths)
        to_driver_offset = self._sections[TO_DRIVER][0]
        self._heartbeat_offset = (to_driver_offset + to_driver - RING_TRAILER_LENGTH
                                  + CONSUMER_HEARTBEAT_OFFSET)
        self._views: list[memoryview] = []

    # -- creation (driver) -------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, lengths: CncLengths, *, pid: int, start_time_ms: int,
               client_liveness_timeout_ns: int) -> CncFile:
        """Create cnc.dat (mode 0600), replacing any old one; the version is written last,
        after the driver's first heartbeat, as Aeron's driver does."""
        path = directory / CNC_FILE
        sizes = (lengths.to_driver, lengths.to_clients, lengths.counters_metadata,
                 lengths.counters_values, lengths.error_log, lengths.events)
        total = _sections(sizes)[1]
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
        _AERON_HEADER.pack_into(mapping, 0, 0, *sizes[:ERROR_LOG + 1],
                                client_liveness_timeout_ns, start_time_ms, pid, FILE_PAGE_SIZE)
        _SHMBUS_HEADER.pack_into(mapping, SHMBUS_MAGIC_OFFSET, SHMBUS_MAGIC,
                                 SHMBUS_LAYOUT_VERSION, sizes[EVENTS])
        os.replace(tmp, path)
        cnc = cls(path, mapping, writable=True)
        assert cnc.buffer is not None
        cnc.buffer.put_int64_release(cnc._heartbeat_offset, start_time_ms)
        cnc.buffer.put_int32_release(VERSION_OFFSET, CNC_VERSION)
        cnc.version = CNC_VERSION
        return cnc

    # -- opening (clients, tools) ------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, *, writable: bool = True) -> CncFile:
        """Map an existing cnc.dat; raise CncError if it is missing, not ready or foreign
        (an Aeron media driver's, or another shmbus layout).

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
        problem = _version_problem(mapping)
        if problem is not None:
            mapping.close()
            raise (CncError if version == 0 else CncLayoutError)(f"{path} {problem}")
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
        """An AtomicBuffer over one section (TO_DRIVER .. EVENTS); needs a writable map."""
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
        """The driver's last heartbeat (the to-driver ring's consumer heartbeat), epoch ms;
        -1 once the driver closed."""
        if self.buffer is not None:
            return self.buffer.get_int64_acquire(self._heartbeat_offset)
        heartbeat: int = struct.unpack_from("<q", self._mmap, self._heartbeat_offset)[0]
        return heartbeat

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


TO_DRIVER, TO_CLIENTS, COUNTERS_METADATA, COUNTERS_VALUES, ERROR_LOG, EVENTS = range(6)


def _version_problem(mapping: mmap.mmap) -> str | None:
    """What keeps a shmbus client from this cnc.dat's header (None: nothing)."""
    version = struct.unpack_from("<i", mapping, VERSION_OFFSET)[0]
    if version == 0:
        return "is not ready yet (the driver is still creating it)"
    if cnc_major(version) != cnc_major(CNC_VERSION):
        return (f"has CnC version 0x{version & 0xFFFFFFFF:x}; this shmbus speaks Aeron's CnC 0.2.0 "
                f"(0x{CNC_VERSION:x})")
    magic, layout = struct.unpack_from("<ii", mapping, SHMBUS_MAGIC_OFFSET)
    if magic != SHMBUS_MAGIC:
        return ("is an Aeron media driver's (it has no shmbus header): shmbus clients need "
                "a shmbus driver on their bus directory")
    if layout != SHMBUS_LAYOUT_VERSION:
        return (f"has shmbus layout version {layout}; this shmbus speaks version "
                f"{SHMBUS_LAYOUT_VERSION}: use the same shmbus version for driver and clients")
    return None


def _layout_problem(lengths: tuple[int, ...]) -> str | None:
    """What is wrong with the section lengths of a header (None: a layout a driver writes)."""
    to_driver, to_clients, metadata, values, error_log, events = lengths
    checks = (
        ("to-driver", to_driver, RING_TRAILER_LENGTH),
        ("to-clients", to_clients, BROADCAST_TRAILER_LENGTH),
        ("events", events, BROADCAST_TRAILER_LENGTH),
    )
    for name, length, trailer in checks:
        capacity = length - trailer
        if capacity < 64 or capacity & (capacity - 1):
            return (f"the {name} section is {length} bytes, not a power of two >= 64 plus a "
                    f"{trailer}-byte trailer")
    if metadata <= 0 or metadata % METADATA_LENGTH:
        return (f"the counters metadata section is {metadata} bytes, not a positive multiple "
                f"of {METADATA_LENGTH}")
    if values != metadata // METADATA_LENGTH * COUNTER_LENGTH:
        return (f"the counters values section is {values} bytes; {metadata // METADATA_LENGTH}"
                f" counters take {metadata // METADATA_LENGTH * COUNTER_LENGTH}")
    if error_log <= 0 or error_log % 64:
        return f"the error log section is {error_log} bytes, not a positive multiple of 64"
    return None
