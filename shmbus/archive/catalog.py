"""Recording directories: the catalog, segment files, time indexes and live positions.

A recording directory holds any number of recordings (one per publishing session the
recorder saw) and one catalog::

    <dir>/catalog.json                 the catalog (JSON; replaced atomically: temp + rename)
    <dir>/.recorder.lock               flock held by the recorder writing into <dir>
    <dir>/.reserve                     space kept free for the last catalog write (disk full)
    <dir>/<id>/<base>.seg              segment files, <base> = start position, 20 digits
    <dir>/<id>/<base>.idx              time index of that segment: (position, time ns) int64 pairs
    <dir>/<id>/<base>.large            payloads of that segment's large messages (see
                                       shmbus.archive.large_payloads)
    <dir>/<id>/position                live position: (position, time ns, check) int64

Segments are fixed-size files (``segment_length``, a power of two and a multiple of the term
length, preallocated) holding the frames exactly as they were in the log: 32-byte headers,
32-byte alignment, so the frame at stream position ``p`` is at offset ``p - base`` of the
segment whose ``base = p - p % segment_length``. Frames never span terms, terms never span
segments. PAD frames are kept as a 32-byte PAD header (the recorder writes one per run of
padding, so positions stay stream positions); the rest of the padding is zeros in the file.

Readers never lock: they read ``catalog.json`` (always whole, thanks to the rename) and, for an
active recording, the ``position`` file, which the recorder rewrites after every write with the
end of the last whole message written (data up to there is in the segment files).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import struct
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from shmbus.settings.errors import ShmbusError

CATALOG_FILE = "catalog.json"
LOCK_FILE = ".recorder.lock"
RESERVE_FILE = ".reserve"
POSITION_FILE = "position"
CATALOG_VERSION = 1
SEGMENT_SUFFIX = ".seg"
INDEX_SUFFIX = ".idx"
#: default segment length (at least one term)
SEGMENT_LENGTH_DEFAULT = 32 * 1024 * 1024
SEGMENT_LENGTH_MAX = 1 << 30
#: bytes kept in reserve so that the final catalog can be written on a full file system
RESERVE_MIN = 64 * 1024

ACTIVE = "active"
STOPPED = "stopped"

_POSITION = struct.Struct("<qqq")
_POSITION_CHECK = 0x5348_4D42_5553_5053  # "SHMBUSPS"
INDEX_DTYPE = np.dtype([("position", "<i8"), ("time_ns", "<i8")])


class RecordingError(ShmbusError):
    """A recording cannot be written or read; the message says which file and why."""


class DiskFullError(RecordingError):
    """The file system of a recording directory is full: the recording was stopped cleanly."""


@dataclass(frozen=True)
class RecordingDescriptor:
    """One recording, as the catalog holds it.

    ``stop_position`` and ``stop_time_ns`` are None while the recording is active; then
    :func:`live_position` gives how far it got. Positions are stream positions of the recorded
    session's log: ``(term_id - initial_term_id) * term_length + term_offset``.
    """

    recording_id: int
    channel: str
    stream_id: int
    session_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    segment_length: int
    start_position: int
    stop_position: int | None
    start_time_ns: int
    stop_time_ns: int | None
    state: str = ACTIVE
    stop_reason: str | None = None
    source_identity: str = "ipc"

    @property
    def is_active(self) -> bool:
        return self.state == ACTIVE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordingDescriptor:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def with_(self, **changes: Any) -> RecordingDescriptor:
        return replace(self, **changes)

    # -- geometry --------------------------------------------------------------------------

    @property
    def position_bits(self) -> int:
        return self.term_length.bit_length() - 1

    def segment_base(self, position: int) -> int:
        """Start position of the segment holding ``position``."""
        return position - position % self.segment_length

    def term_id_at(self, position: int) -> int:
        """The term id of the term holding ``position`` (wrapped to int32)."""
        return _wrap32(self.initial_term_id + (position >> self.position_bits))

    def directory(self, root: str | os.PathLike[str]) -> Path:
        return Path(root) / str(self.recording_id)

    def segment_path(self, root: str | os.PathLike[str], base: int) -> Path:
        return self.directory(root) / f"{base:020d}{SEGMENT_SUFFIX}"

    def index_path(self, root: str | os.PathLike[str], base: int) -> Path:
        return self.directory(root) / f"{base:020d}{INDEX_SUFFIX}"


def _wrap32(value: int) -> int:
    return ((value + 2**31) % 2**32) - 2**31


def check_segment_length(segment_length: int, term_length: int) -> None:
    """Raise RecordingError unless segment_length is a power of two >= term_length, <= 1 GiB."""
    if (not isinstance(segment_length, int) or segment_length & (segment_length - 1)
            or not term_length <= segment_length <= SEGMENT_LENGTH_MAX):
        raise RecordingError(
            f"segment length {segment_length!r} must be a power of two from the term length "
            f"({term_length}) to 1 GiB")


def default_segment_length(term_length: int) -> int:
    return max(SEGMENT_LENGTH_DEFAULT, term_length)


# -- the catalog file -----------------------------------------------------------------------


def read_catalog(directory: str | os.PathLike[str]) -> list[RecordingDescriptor]:
    """Every recording in ``directory``'s catalog, by recording id (empty if there is none)."""
    return _read_catalog_state(Path(directory))[1]


def find_recording(directory: str | os.PathLike[str], recording_id: int) -> RecordingDescriptor:
    """The catalog entry of one recording; RecordingError if there is none."""
    for descriptor in read_catalog(directory):
        if descriptor.recording_id == recording_id:
            return descriptor
    raise RecordingError(f"no recording {recording_id} in {directory}")


def _read_catalog_state(directory: Path) -> tuple[int, list[RecordingDescriptor]]:
    path = directory / CATALOG_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        if not directory.is_dir():
            raise RecordingError(f"recording directory {directory} does not exist") from None
        return 0, []
    try:
        data = json.loads(text)
        if data.get("version") != CATALOG_VERSION:
            raise RecordingError(f"{path}: catalog version {data.get('version')!r}, this "
                                 f"shmbus reads version {CATALOG_VERSION}")
        recordings = [RecordingDescriptor.from_json(r) for r in data["recordings"]]
        return int(data["next_recording_id"]), sorted(recordings, key=lambda r: r.recording_id)
    except (ValueError, KeyError, TypeError) as e:
        raise RecordingError(f"{path} is not a shmbus catalog: {e}") from None


def _catalog_bytes(next_id: int, recordings: list[RecordingDescriptor]) -> bytes:
    data = {"version": CATALOG_VERSION, "next_recording_id": next_id,
            "recordings": [r.to_json() for r in sorted(recordings,
                                                        key=lambda r: r.recording_id)]}
    return (json.dumps(data, indent=1) + "\n").encode()


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


class CatalogWriter:
    """The writing side of a recording directory: one per directory, held by a recorder.

    Takes the directory's lock (a second writer gets RecordingError naming the holder), keeps
    a reserve file so that the last catalog write succeeds on a full file system, and writes
    the catalog atomically (temp file, fsync, rename, fsync of the directory).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock_fd, 32, 0).decode(errors="replace").strip()
            os.close(self._lock_fd)
            raise RecordingError(f"recording directory {self.directory} is in use by another "
                                 f"recorder (pid {holder or '?'})") from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        self.next_recording_id, recordings = _read_catalog_state(self.directory)
        self.recordings: dict[int, RecordingDescriptor] = {r.recording_id: r
                                                           for r in recordings}
        self._reserve_size = 0

    def ensure_reserve(self) -> None:
        """Grow the reserve file to cover two catalogs; raises OSError(ENOSPC) when it can't."""
        needed = max(RESERVE_MIN, 2 * len(_catalog_bytes(self.next_recording_id,
                                                         list(self.recordings.values()))))
        if needed <= self._reserve_size:
            return
        fd = os.open(self.directory / RESERVE_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, needed)
        finally:
            os.close(fd)
        self._reserve_size = needed

    def release_reserve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / RESERVE_FILE)
        self._reserve_size = 0

    def allocate_id(self) -> int:
        recording_id = self.next_recording_id
        self.next_recording_id += 1
        return recording_id

    def put(self, descriptor: RecordingDescriptor) -> None:
        """Store ``descriptor`` and write the catalog (retrying on the reserve's space)."""
        self.recordings[descriptor.recording_id] = descriptor
        self.write()

    def write(self) -> None:
        data = _catalog_bytes(self.next_recording_id, list(self.recordings.values()))
        try:
            self._write(data)
        except OSError as e:
            if not is_disk_full(e):
                raise
            # the file system is full: give the reserve back and write the catalog into it
            self.release_reserve()
            self._write(data)

    def _write(self, data: bytes) -> None:
        temp = self.directory / (CATALOG_FILE + ".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.close(fd)
        os.replace(temp, self.directory / CATALOG_FILE)
        fsync_directory(self.directory)

    def close(self) -> None:
        if self._lock_fd < 0:
            return
        self.release_reserve()
        os.close(self._lock_fd)
        self._lock_fd = -1


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- live position and time index ------------------------------------------------------------


def encode_position(position: int, time_ns: int) -> bytes:
    return _POSITION.pack(position, time_ns, position ^ time_ns ^ _POSITION_CHECK)


def read_position_file(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(position, time ns) from a live position file, or None when there is none yet."""
    for _ in range(100):
        try:
            with open(path, "rb") as f:
                raw = f.read(_POSITION.size)
        except FileNotFoundError:
            return None
        if len(raw) < _POSITION.size:
            return None
        position, time_ns, check = _POSITION.unpack(raw)
        if position ^ time_ns ^ _POSITION_CHECK == check:
            return position, time_ns
        # read while the recorder rewrote it: read again
    raise RecordingError(f"{path}: live position file is corrupt")


def live_position(root: str | os.PathLike[str], descriptor: RecordingDescriptor) -> int:
    """How far a recording is readable: its stop position, or while it is active the end of
    the last whole message the recorder wrote."""
    if not descriptor.is_active and descriptor.stop_position is not None:
        return descriptor.stop_position
    live = read_position_file(descriptor.directory(root) / POSITION_FILE)
    return descriptor.start_position if live is None else max(live[0],
                                                              descriptor.start_position)


def read_index(path: str | os.PathLike[str]) -> np.ndarray:
    """A segment's time index: an INDEX_DTYPE array sorted by position (empty if missing)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return np.empty(0, INDEX_DTYPE)
    whole = len(raw) - len(raw) % INDEX_DTYPE.itemsize
    return np.frombuffer(raw[:whole], INDEX_DTYPE)


def record_times(root: str | os.PathLike[str], descriptor: RecordingDescriptor, base: int,
                 positions: np.ndarray) -> np.ndarray:
    """Record time (ns since the epoch) of messages starting at ``positions`` in segment
    ``base``: when the recorder had written them (to the recorder's time resolution).

    -1 where unknown.
    """
    index = read_index(descriptor.index_path(root, base))
    times = np.full(len(positions), -1, np.int64)
    if len(index):
        at = np.searchsorted(index["position"], positions, side="right")
        found = at < len(index)
        times[found] = index["time_ns"][at[found]]
    missing = times < 0
    if missing.any():
        fallback = None
        if descriptor.is_active:
            live = read_position_file(descriptor.directory(root) / POSITION_FILE)
            if live is not None:
                fallback = live[1]
        elif descriptor.stop_time_ns is not None:
            fallback = descriptor.stop_time_ns
        if fallback is not None:
            times[missing] = fallback
    return times
