"""Test helpers for recordings: a log laid out in memory as a publisher lays it out, polled the
way ``Image.poll_batch`` polls it, so the recorder's writer is tested without a bus; and the
environment a ``shmbus`` command needs to find a test's bus.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from shmbus.archive.catalog import ACTIVE, CatalogWriter, RecordingDescriptor
from shmbus.archive.recorder import _RecordingWriter
from shmbus.shm.log_buffer import (
    BEGIN_FLAG,
    END_FLAG,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    HEADER_LENGTH,
    UNFRAGMENTED,
    align,
    encode_data_header,
)
from shmbus.streams.image import FragmentBatch


class FakeLog:
    """One session's stream as a publisher writes it: fragments, PAD at term ends."""

    def __init__(self, term_length: int = 65536, initial_term_id: int = 7, mtu: int = 1408,
                 session_id: int = 42, stream_id: int = 10, start_position: int = 0) -> None:
        self.term_length = term_length
        self.initial_term_id = initial_term_id
        self.mtu = mtu
        self.session_id = session_id
        self.stream_id = stream_id
        self.terms: dict[int, np.ndarray] = {}
        self.position = start_position
        #: (start position, payload, reserved value) of every message appended
        self.messages: list[tuple[int, bytes, int]] = []

    def _term(self, index: int) -> np.ndarray:
        if index not in self.terms:
            self.terms[index] = np.zeros(self.term_length, np.uint8)
        return self.terms[index]

    def _put(self, position: int, data: bytes) -> None:
        term = self._term(position // self.term_length)
        offset = position % self.term_length
        term[offset:offset + len(data)] = np.frombuffer(data, np.uint8)

    def _header(self, position: int, length: int, flags: int, kind: int, reserved: int) -> bytes:
        term_id = (self.initial_term_id + position // self.term_length + 2**31) % 2**32 - 2**31
        return encode_data_header(length, flags, kind, position % self.term_length,
                                  self.session_id, self.stream_id, term_id, reserved)

    def pad(self, length: int) -> None:
        """A PAD frame of ``length`` bytes here (like an unblocked publication's)."""
        self._put(self.position, self._header(self.position, length, UNFRAGMENTED, HDR_TYPE_PAD,
                                              0))
        self.position += align(length)

    def append(self, payload: bytes, reserved_value: int = 0) -> int:
        """Append one message (fragmented past mtu - 32); returns its start position."""
        chunk = self.mtu - HEADER_LENGTH
        pieces = [payload[i:i + chunk] for i in range(0, len(payload), chunk)] or [b""]
        total = sum(align(len(p) + HEADER_LENGTH) for p in pieces)
        assert total <= self.term_length // 8 + self.mtu
        offset = self.position % self.term_length
        if offset + total > self.term_length:
            self.pad(self.term_length - offset)
        start = self.position
        for i, piece in enumerate(pieces):
            flags = (BEGIN_FLAG if i == 0 else 0) | (END_FLAG if i == len(pieces) - 1 else 0)
            self._put(self.position + HEADER_LENGTH, piece)
            self._put(self.position, self._header(self.position, len(piece) + HEADER_LENGTH,
                                                  flags, HDR_TYPE_DATA, reserved_value))
            self.position += align(len(piece) + HEADER_LENGTH)
        self.messages.append((start, payload, reserved_value))
        return start

    def poll_into(self, writer: _RecordingWriter, fragment_limit: int = 64) -> int:
        """What Recorder.poll does with an image: batch the next frames of the current term
        into writer.on_batch, then writer.pad_to past trailing padding."""
        position = writer.stop
        if position >= self.position:
            return 0
        term = self._term(position // self.term_length)
        term_offset = offset = position % self.term_length
        offsets, lengths, flags = [], [], []
        while len(offsets) < fragment_limit and offset < self.term_length:
            header = term[offset:offset + HEADER_LENGTH].view(np.int32)
            length = int(header[0])
            if length <= 0:
                break
            kind = int(term[offset + 6]) | int(term[offset + 7]) << 8
            if kind != HDR_TYPE_PAD:
                offsets.append(offset + HEADER_LENGTH)
                lengths.append(length - HEADER_LENGTH)
                flags.append(int(term[offset + 5]))
            offset += align(length)
        if offsets:
            term_view = term.view()
            term_view.flags.writeable = False
            writer.on_batch(FragmentBatch(term_view, np.array(offsets, np.int64),
                                          np.array(lengths, np.int32), np.array(flags, np.uint8),
                                          position, self.session_id))
        new_position = position + (offset - term_offset)
        if new_position > writer.stop:
            writer.pad_to(new_position)
        return len(offsets)

    def drain_into(self, writer: _RecordingWriter, fragment_limit: int = 64) -> None:
        while writer.stop < self.position:
            self.poll_into(writer, fragment_limit)


def start_recording(root: Path, log: FakeLog, *, segment_length: int = 131072,
                    recording_id: int | None = None, fsync: str = "none",
                    time_resolution_ns: int = 0) -> tuple[CatalogWriter, _RecordingWriter]:
    """A catalog with one active recording of ``log`` and its writer (no bus involved)."""
    catalog = CatalogWriter(root)
    descriptor = RecordingDescriptor(
        recording_id=catalog.allocate_id() if recording_id is None else recording_id,
        channel="aeron:ipc", stream_id=log.stream_id, session_id=log.session_id,
        initial_term_id=log.initial_term_id, term_length=log.term_length, mtu=log.mtu,
        segment_length=segment_length, start_position=log.position, stop_position=None,
        start_time_ns=time.time_ns(), stop_time_ns=None, state=ACTIVE)
    catalog.put(descriptor)
    return catalog, _RecordingWriter(root, descriptor, fsync, time_resolution_ns)


def random_payloads(seed: int, count: int, max_length: int = 6000) -> list[bytes]:
    """Payloads of mixed lengths: empty, tiny, around the mtu, fragmented."""
    rng = random.Random(seed)
    lengths = [0, 1, 31, 32, 100, 1375, 1376, 1377, 2800, max_length]
    return [rng.randbytes(rng.choice(lengths)) for _ in range(count)]


def bus_env(context: Any) -> dict[str, str]:
    """This process's environment with ``context``'s settings as SHMBUS_* variables: a
    ``shmbus`` command run with it (``shmbus record``, ``shmbus replay``) uses that bus."""
    env = dict(os.environ)
    for name, value in dataclasses.asdict(context).items():
        env[f"SHMBUS_{name.upper()}"] = str(int(value)) if isinstance(value, bool) else str(value)
    return env
