"""Spawn targets for tests/shmbus/shm/test_block_ring_processes.py: the writer and the driver
of a block ring in one process, and the control file it shares with the test's reader (words
at fixed offsets, then a table of the blocks it published); and a reader of a ring the
test's process cuts short."""

from __future__ import annotations

import mmap
import os
import random
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from shmbus.shm import block_ring as br
from shmbus.shm._native import AtomicBuffer

MAX_MESSAGE = 256 * 1024
HARD_STOP_S = 30.0
SLOTS = 256
#: the writer keeps at most this many blocks ahead of a counted reader (the table's room)
AHEAD = SLOTS // 2
# the control file's words
SEQ, POSITION, DROPPED, STOP, LOOPS, ERROR = 0, 64, 128, 192, 256, 320
TABLE = 512  # SLOTS entries of (ring position, length, seq)


def control(path: Path) -> tuple[mmap.mmap, AtomicBuffer]:
    fd = os.open(path, os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, TABLE + 24 * SLOTS)
    finally:
        os.close(fd)
    return mapping, AtomicBuffer(mapping)


def fill(payload: memoryview, seq: int) -> None:
    array = np.frombuffer(payload, np.uint8)
    array[8:-8] = seq % 251
    array[:8] = array[-8:] = np.frombuffer(seq.to_bytes(8, "little"), np.uint8)


def holds(view: memoryview, seq: int) -> bool:
    array = np.frombuffer(view, np.uint8)
    mark = seq.to_bytes(8, "little")
    return (bytes(view[:8]) == mark and bytes(view[-8:]) == mark
            and bool((array[8:-8:509] == seq % 251).all()))


def writer_and_driver(ring_path: str, control_path: str, seed: int) -> None:
    """The child: write, commit, publish, free; until told to stop (or HARD_STOP_S)."""
    rng = random.Random(seed)
    ring = br.BlockRing.open(ring_path)
    mapping, ctl = control(Path(control_path))
    pid = os.getpid()
    seq = 0
    deadline = time.monotonic() + HARD_STOP_S
    try:
        while not ctl.get_int64_acquire(STOP) and time.monotonic() < deadline:
            dropped = ctl.get_int64_acquire(DROPPED)
            reader = ctl.get_int64_acquire(POSITION)
            ring.reclaim(64 * seq if dropped else reader, 64 * seq)
            ctl.put_int64_release(LOOPS, ctl.get_int64(LOOPS) + 1)
            if not dropped and seq - reader // 64 >= AHEAD:
                os.sched_yield()
                continue
            length = rng.choice([64, 1000, 4096 - br.BLOCK_HEADER, 20_000, 100_000,
                                 MAX_MESSAGE])
            try:
                start = ring.reserve(length, pid)
            except br.BlockRingFullError:
                os.sched_yield()
                continue
            payload = ring.payload(start, length)
            fill(payload, seq + 1)
            payload.release()
            seq += 1
            ring.commit(start, 64 * seq)
            slot = TABLE + 24 * (seq % SLOTS)
            ctl.put_int64_release(slot + 16, -1)  # (a seqlock: the reader sees no torn entry)
            ctl.put_int64(slot, start)
            ctl.put_int64(slot + 8, length)
            ctl.put_int64_release(slot + 16, seq)
            ctl.put_int64_release(SEQ, seq)
    except BaseException as e:
        ctl.put_int64_release(ERROR, 1)
        raise SystemExit(f"writer: {e!r}") from e
    finally:
        ctl.release()
        mapping.close()
        ring.close()


def entry(ctl: AtomicBuffer, seq: int) -> tuple[int, int] | None:
    """(ring position, length) of block ``seq`` from the table, None if overwritten."""
    slot = TABLE + 24 * (seq % SLOTS)
    if ctl.get_int64_acquire(slot + 16) != seq:
        return None
    start, length = ctl.get_int64(slot), ctl.get_int64(slot + 8)
    if ctl.get_int64_acquire(slot + 16) != seq:
        return None
    return start, length


def view_before_and_after_a_cut(ring_path: str, reference: bytes, end: int,
                                conn: Connection) -> None:
    """The reader of test_a_ring_cut_short_under_its_reader_is_refused_by_name: it maps the
    ring, views the block (sends its length), waits to hear the file was cut short, views it
    again and sends what that gave (the error's message, or the view's length)."""
    ring = br.BlockRing.open(ring_path)
    try:
        view = ring.view(reference, end)
        conn.send(None if view is None else len(view))
        if view is not None:
            view.release()
        if not conn.poll(HARD_STOP_S):
            return
        conn.recv()
        try:
            view = ring.view(reference, end)
        except br.CorruptReferenceError as e:
            conn.send(str(e))
            return
        conn.send(None if view is None else len(bytes(view)))
    finally:
        ring.close()
        conn.close()

