"""The block ring's memory rules, against a model (shmbus/shm/block_ring.py).

Random reserve / fill / commit / free sequences on a real ring file in /dev/shm: every live
block keeps its bytes; the warm beginning's allocation mark only ever covers allocated pages
(no hole below it, it never passes the warm limit: WARM_BYTES, or two of the longest block
reserved), so writers may skip allocating there; once every block is freed, the ring holds no
memory past the warm beginning, and once the empty ring has been idle, none past WARM_BYTES.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus.shm import block_ring as br

MIB = 1 << 20
SIZES = [100, 300_000, 5 * MIB, 20 * MIB, 39 * MIB]
#: ring of about 80 MiB: past WARM_BYTES, so both the warm beginning and the rest are used
MAX_MESSAGE = 40 * MIB


def union_length(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, 0
    for start, stop in sorted(intervals):
        start = max(start, end)
        if stop > start:
            total += stop - start
            end = stop
    return total


def allocated_at_least(ring: br.BlockRing, mark: int,
                       live: list[tuple[int, int, int, int]]) -> bool:
    """Whether the file holds at least the pages below the warm mark and those of every live
    block (tmpfs counts allocated pages in st_blocks; SEEK_HOLE and mincore(2) would count
    allocated pages never written as holes)."""
    spans = [(start % ring.capacity, start % ring.capacity + -(-(br.BLOCK_HEADER + length)
                                                           // br.PAGE) * br.PAGE)
             for start, length, _, _ in live]
    return (os.fstat(ring._fd).st_blocks * 512
            >= br.HEADER_PAGE + union_length([(0, mark), *spans]))


def warm_mark(ring: br.BlockRing) -> int:
    return ring.buffer.get_int64_acquire(br._WARM_ALLOCATED)


@given(st.lists(st.tuples(st.sampled_from(SIZES), st.integers(0, 3)), min_size=1,
                max_size=25))
@settings(max_examples=30, deadline=None)
def test_blocks_keep_their_bytes_and_the_warm_mark_covers_only_allocated_pages(ops) -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        ring = br.BlockRing.create(Path(tmp) / "x.blocks", MAX_MESSAGE)
        try:
            live: list[tuple[int, int, int, int]] = []  # (start, length, release at, tag)
            position = 0
            for tag, (length, free_count) in enumerate(ops):
                try:
                    start = ring.reserve(length, os.getpid())
                except br.BlockRingFullError:
                    start = -1
                if start >= 0:
                    payload = ring.payload(start, length)
                    payload[0] = payload[-1] = tag % 251
                    payload.release()
                    position += 64
                    ring.commit(start, position)
                    live.append((start, length, position, tag))
                # readers move past the oldest free_count blocks (all when the ring was full)
                done = len(live) if start < 0 else min(free_count, len(live))
                if done:
                    ring.reclaim(live[done - 1][2], position)
                    live = live[done:]
                mark = warm_mark(ring)
                longest = max((ln for ln, _ in ops[:tag + 1]), default=0)
                assert ring.warm_limit() == max(br.WARM_BYTES, min(
                    ring.capacity, 2 * -(-(br.BLOCK_HEADER + longest) // br.PAGE) * br.PAGE))
                assert mark <= ring.warm_limit()
                assert allocated_at_least(ring, mark, live), "a hole below the warm mark"
                for start, length, _, tag in live:
                    view = ring.payload(start, length)
                    assert view[0] == view[-1] == tag % 251, f"block {tag} changed"
                    view.release()
            ring.reclaim(position, position)
            assert ring.in_use() == 0
            held = os.fstat(ring._fd).st_blocks * 512
            assert held <= br.HEADER_PAGE + ring.warm_limit(), f"{held} bytes held, all freed"
            # idle: the driver gives back the warm beginning past WARM_BYTES
            ring._tail_moved_at -= br.WARM_IDLE_S + 1
            ring.reclaim(position, position)
            assert ring.warm_limit() == br.WARM_BYTES
            assert warm_mark(ring) <= br.WARM_BYTES
            held = os.fstat(ring._fd).st_blocks * 512
            assert held <= br.HEADER_PAGE + br.WARM_BYTES, f"{held} bytes held once idle"
            # and writers start over from there: blocks keep their bytes
            start = ring.reserve(SIZES[-1], os.getpid(), populate=True)
            payload = ring.payload(start, SIZES[-1])
            payload[0] = payload[-1] = 7
            assert payload[0] == payload[-1] == 7
            payload.release()
            assert allocated_at_least(ring, warm_mark(ring), [(start, SIZES[-1], 0, 0)])
        finally:
            ring.close()


def test_a_zombie_is_not_alive() -> None:
    import multiprocessing

    process = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    process.start()
    pid = process.pid
    assert pid is not None
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, left a zombie
        assert not br.pid_alive(pid)
    finally:
        process.join()
    assert br.pid_alive(os.getpid())


def test_small_blocks_go_round_in_the_cycle_once_free_and_a_refused_writer_is_woken() -> None:
    """1 MiB blocks: past the ring's first CYCLE_BYTES a block goes on into the warm beginning
    while readers are still in the cycle (a burst keeps the whole warm beginning), and goes
    round to 0 once they have left all of it. A refusal marks a writer waiting, and the
    driver's next free bumps the room word (what the writer sleeps on) once; a free with
    nobody waiting does not."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        ring = br.BlockRing.create(Path(tmp) / "x.blocks", MAX_MESSAGE)
        try:
            pid, position, blocks = os.getpid(), 0, []
            span = br._span(MIB)
            in_cycle = br.CYCLE_BYTES // span

            def reserve() -> int:
                nonlocal position
                start = ring.reserve(MIB, pid)
                position += 64
                ring.commit(start, position)
                blocks.append((start, position))
                return start % ring.capacity

            assert [reserve() for _ in range(in_cycle)] == [i * span for i in range(in_cycle)]
            assert reserve() == in_cycle * span, "held: on past the cycle"
            assert ring.writer_waiting(), "readers moving on should wake the driver"
            ring.reclaim(blocks[in_cycle - 1][1], position)  # readers left all but one
            assert reserve() == (in_cycle + 1) * span, "a reader still in the cycle: on"
            ring.reclaim(blocks[in_cycle][1], position)  # readers left the whole cycle
            assert reserve() == 0, "the cycle freed: round to its start"
            assert reserve() == span
            seen = ring.room_seen()
            while True:
                try:
                    reserve()
                except br.BlockRingFullError:
                    break
                assert len(blocks) < 200, "never refused"
            assert all(start % ring.capacity + span <= br.WARM_BYTES for start, _ in blocks)
            assert ring.writer_waiting() and ring.room_seen() == seen
            ring.reclaim(blocks[in_cycle + 1][1], position)  # the oldest held block freed
            assert not ring.writer_waiting() and ring.room_seen() == seen + 1
            ring.reclaim(blocks[in_cycle + 2][1], position)  # nobody waiting: no wake-up
            assert ring.room_seen() == seen + 1
            ring.wait_for_room(seen, 10.0)  # the word moved: returns at once
        finally:
            ring.close()
