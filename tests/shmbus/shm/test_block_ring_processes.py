"""A reader maps a block ring while another process writes and frees it (the driver's part):
shmbus/shm/block_ring.py across processes, for a bounded time.

The child process is a writer and the driver at once: it reserves blocks of random lengths,
fills them (their sequence number first and last, a byte of it between), commits each at
stream position 64 * seq, publishes (ring position, length, seq) in a shared table, and frees
every block the reader's position has passed, or, while the reader says it is dropped, every
block it committed (as the driver does once it no longer counts a reader).

The reader (this process) reads the blocks in order, holding each view for a while and checking
its bytes before and after, then moves its position on. Now and then it plays dropped: it views
blocks the child is freeing and reusing (through its own mapping and through one opened anew),
then rejoins.

Properties: a counted reader's view is exactly its block, and stays so while held, whatever the
child frees and reuses meanwhile; a dropped reader's views are its block, or None once freed,
and never fault; a reference a writer made is never refused as corrupt (ValueError), however
the freeing races the look.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import random
import time
from pathlib import Path

import numpy as np

from shmbus.shm import block_ring as br
from shmbus.shm._native import AtomicBuffer
from tests.support.waits import time_left, wait_until

MAX_MESSAGE = 256 * 1024
RUN_S = 2.0
#: at least this many blocks read (and one dropped spell) however loaded the machine is,
#: within HARD_STOP_S
LEAST = 20
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


def wait_for(ctl: AtomicBuffer, word: int, value: int, deadline: float) -> None:
    """Wait until the child has set control word ``word`` to ``value`` or more; it failed
    (its ERROR word set) fails the test at once."""
    def reached() -> bool:
        assert not ctl.get_int64_acquire(ERROR), "the child failed"
        return ctl.get_int64_acquire(word) >= value

    # a handshake step: the child answers within microseconds unless descheduled
    wait_until(reached, time_left(deadline), f"the child to set word {word} to {value}",
               longest_pause=0.0005)


def test_views_stay_exact_while_the_driver_frees_and_reuses_around_them(shm_dir: Path) -> None:
    ring_file = shm_dir / "1.blocks"
    br.BlockRing.create(ring_file, MAX_MESSAGE).close()
    control_file = shm_dir / "control"
    with open(control_file, "wb") as f:
        f.truncate(TABLE + 24 * SLOTS)
    mapping, ctl = control(control_file)
    ring = br.BlockRing.open(ring_file)
    child = multiprocessing.get_context("spawn").Process(
        target=writer_and_driver, args=(str(ring_file), str(control_file), 35))
    child.start()
    rng = random.Random(35)
    counted = dropped_views = freed_seen = spells = 0
    try:
        hard_stop = time.monotonic() + HARD_STOP_S
        wait_for(ctl, SEQ, 1, hard_stop)
        end = time.monotonic() + RUN_S
        seq = 1
        while time.monotonic() < end or counted < LEAST or not spells:
            wait_for(ctl, SEQ, seq, hard_stop)
            where = entry(ctl, seq)
            assert where is not None, f"block {seq} left the table while counted"
            view = ring.view(br.encode_reference(*where))
            assert view is not None, f"block {seq} freed while this reader held it"
            assert holds(view, seq), f"block {seq}: not its bytes"
            # hold it while the child frees what lies before it and fills what lies after
            loops = ctl.get_int64_acquire(LOOPS)
            wait_for(ctl, LOOPS, loops + rng.choice([0, 1, 5, 50]), hard_stop)
            assert holds(view, seq), f"block {seq} changed while held"
            view.release()
            ctl.put_int64_release(POSITION, 64 * seq)
            counted += 1
            seq += 1
            if rng.random() < 0.05 or (counted >= LEAST // 2 and not spells):
                # play dropped for a while, then rejoin
                spells += 1
                ctl.put_int64_release(DROPPED, 1)
                again = br.BlockRing.open(ring_file)  # a reader mapping the ring anew
                try:
                    for _ in range(rng.randrange(20, 200)):
                        latest = ctl.get_int64_acquire(SEQ)
                        # mostly the blocks being freed and reused right now
                        old = max(1, latest - rng.choice([0, 0, 0, 1, 2, rng.randrange(SLOTS)]))
                        where = entry(ctl, old)
                        if where is None:
                            continue
                        for mapped in (ring, again):
                            view = mapped.view(br.encode_reference(*where))
                            if view is None:
                                freed_seen += 1
                                continue
                            # (it may be freed and reused under the view: it must not fault)
                            assert len(view) == where[1]
                            np.frombuffer(view, np.uint8).sum()
                            view.release()
                            dropped_views += 1
                finally:
                    again.close()
                ctl.put_int64_release(POSITION, 64 * ctl.get_int64_acquire(SEQ))
                ctl.put_int64_release(DROPPED, 0)
                loops = ctl.get_int64_acquire(LOOPS)
                wait_for(ctl, LOOPS, loops + 2, hard_stop)  # it saw the rejoin
                seq = ctl.get_int64_acquire(SEQ) + 1
                ctl.put_int64_release(POSITION, 64 * (seq - 1))
    finally:
        ctl.put_int64_release(STOP, 1)
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
        ring.close()
        ctl.release()
        mapping.close()
    assert child.exitcode == 0, f"the writer exited with {child.exitcode}"
    assert counted >= LEAST and spells and dropped_views + freed_seen > 0
