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

A reader (another process) whose ring file this process cuts short under its mapping gets a
named error, not a SIGBUS.

Properties: a counted reader's view is exactly its block, and stays so while held, whatever the
child frees and reuses meanwhile; a dropped reader's views are its block, or None once freed,
and never fault; a reference a writer made is never refused as corrupt (ValueError), however
the freeing races the look.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest

from shmbus.shm import block_ring as br
from shmbus.shm._native import AtomicBuffer
from tests.support.waits import time_left, wait_until
from tests.support.workers.block_ring_workers import (
    DROPPED,
    ERROR,
    HARD_STOP_S,
    LOOPS,
    MAX_MESSAGE,
    POSITION,
    SEQ,
    SLOTS,
    STOP,
    TABLE,
    control,
    entry,
    fill,
    holds,
    view_before_and_after_a_cut,
    writer_and_driver,
)

RUN_S = 2.0
#: at least this many blocks read (and one dropped spell) however loaded the machine is,
#: within HARD_STOP_S
LEAST = 20


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
            view = ring.view(br.encode_reference(*where), 64 * seq)
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
                            view = mapped.view(br.encode_reference(*where), 64 * old)
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


@pytest.mark.parametrize("cut", ["empty", "inside the block", "past the block"])
def test_a_ring_cut_short_under_its_reader_is_refused_by_name(shm_dir: Path, cut: str) -> None:
    """A reader (a process of its own) has mapped a ring and viewed a block; this process
    truncates the file. The reader's next view does not touch the mapping past the file's
    end (a SIGBUS would kill it): it raises CorruptReferenceError naming the ring, its size
    now and the mapping's, and the reader lives on."""
    ring_file = shm_dir / "cut.blocks"
    writer = br.BlockRing.create(ring_file, MAX_MESSAGE)
    length = 100_000
    start = writer.reserve(length, os.getpid())
    payload = writer.payload(start, length)
    fill(payload, 1)
    payload.release()
    writer.bind(start, 64)
    writer.commit(start, 64)
    size = {"empty": 0, "inside the block": br.HEADER_PAGE + br.PAGE,
            "past the block": br.HEADER_PAGE + writer.capacity - br.PAGE}[cut]
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    reader = spawn.Process(target=view_before_and_after_a_cut,
                           args=(str(ring_file), br.encode_reference(start, length), 64, theirs))
    reader.start()
    theirs.close()  # (so a reader that died is heard at once: the pipe ends)

    def answer() -> object:
        try:
            return ours.recv() if ours.poll(HARD_STOP_S) else "nothing"
        except EOFError:
            reader.join(HARD_STOP_S)
            return f"nothing: it exited with {reader.exitcode}"

    try:
        assert answer() == length
        os.truncate(ring_file, size)  # (this process: not the reader's)
        ours.send("cut")
        said = answer()
        reader.join(HARD_STOP_S)
    finally:
        if reader.is_alive():
            reader.kill()
            reader.join()
        writer.close()
    assert isinstance(said, str), f"the reader got {said!r} from a ring cut short"
    assert reader.exitcode == 0, f"the reader exited with {reader.exitcode}"
    assert str(ring_file) in said and f"{size} bytes" in said and "cut short" in said, said
    assert f"{br.HEADER_PAGE + writer.capacity} bytes" in said, said
