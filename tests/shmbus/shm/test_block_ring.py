"""The block ring's memory rules, against a model (shmbus/shm/block_ring.py).

Random reserve / fill / commit / free sequences on a real ring file in /dev/shm: every live
block keeps its bytes; the warm beginning's allocation mark only ever covers allocated pages
(no hole below it, it never passes the warm limit: at most WARM_BYTES, or two of the longest
block reserved), so writers may skip allocating there; once every block is freed, the ring
holds no memory past the warm beginning, and once the empty ring has been idle, none past
WARM_BYTES. The warm beginning's bound (warm_bound) on small tmpfs mounts: a share of the free
space, and what the driver takes back when the room is needed (give_back_warm).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus.shm import block_ring as br
from tests.support.system import free_bytes, mounted_tmpfs

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
                floor = min(ring.capacity, 2 * br._span(longest))
                # (at most WARM_BYTES where /dev/shm's free space allows: it is shared)
                assert floor <= ring.warm_limit() <= max(br.WARM_BYTES, floor)
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
            assert ring.warm_limit() == 0, "to be measured again by the next writer"
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


# -- the warm beginning's bound ------------------------------------------------------------------

def test_warm_bound_is_a_share_of_the_free_space_at_most_warm_bytes() -> None:
    gib = 1 << 30
    assert br.warm_bound(gib, 0.25, 0) == br.WARM_BYTES, "plenty free: WARM_BYTES"
    assert br.warm_bound(100 * MIB, 0.25, 0) == 25 * MIB
    assert br.warm_bound(100 * MIB, 0.5, 0) == 50 * MIB
    assert br.warm_bound(100 * MIB, 1.0, 0) == br.WARM_BYTES
    assert br.warm_bound(0, 0.25, 0) == 0
    assert br.warm_bound(-5, 0.25, 0) == 0, "a failed measurement is no room"
    # whole pages, rounded down
    assert br.warm_bound(10 * br.PAGE + 3, 1.0, 0) == 10 * br.PAGE
    assert br.warm_bound(4 * br.PAGE - 1, 0.25, 0) == 0


def test_warm_bound_never_leaves_less_than_two_of_the_longest_message_nor_more_than_the_ring(
        ) -> None:
    two = 2 * br._span(MIB)
    assert two == 2 * (MIB + br.PAGE)  # (its 64-byte header takes a page more)
    assert br.warm_bound(4 * MIB, 0.25, MIB) == two, "a quarter is less than two blocks"
    assert br.warm_bound(0, 0.25, MIB) == two, "no room at all: still the floor"
    assert br.warm_bound(100 * MIB, 0.25, MIB) == 25 * MIB
    assert br.warm_bound(1 << 40, 0.25, 40 * MIB) == 2 * br._span(40 * MIB), "past WARM_BYTES"
    assert br.warm_bound(1 << 40, 0.25, 1, capacity=8 * MIB) == 8 * MIB
    assert br.warm_bound(0, 0.25, 40 * MIB, capacity=50 * MIB) == 50 * MIB
    assert br.warm_bound(1 << 40, 0.25, 0, capacity=None) == br.WARM_BYTES


def test_unused_ring_offsets_are_those_outside_the_live_blocks() -> None:
    assert br._unused(0, 0, 100) == [(0, 100)]
    assert br._unused(250, 0, 100) == [(0, 100)], "empty: all of it"
    assert br._unused(210, 30, 100) == [(0, 10), (40, 100)]
    assert br._unused(200, 30, 100) == [(30, 100)]
    assert br._unused(270, 30, 100) == [(0, 70)]
    assert br._unused(280, 40, 100) == [(20, 80)], "wrapped"
    assert br._unused(280, 100, 100) == [], "full"


def held(ring: br.BlockRing) -> int:
    return os.fstat(ring._fd).st_blocks * 512


def test_on_a_small_tmpfs_the_warm_beginning_is_a_quarter_of_the_free_space(tmp_path) -> None:
    """A 32 MiB tmpfs: 1 MiB blocks stay in a warm beginning of a quarter of what is free (the
    ring's own pages counted), so at most that much is kept once they are freed; a longer
    message raises it to two of it, and smaller ones after never lower it below that."""
    with mounted_tmpfs(tmp_path / "small", "32m") as mount:
        ring = br.BlockRing.create(mount / "x.blocks", 8 * MIB)
        try:
            pid, position = os.getpid(), 0
            span = br._span(MIB)
            blocks: list[tuple[int, int]] = []
            for _ in range(40):  # writer far ahead of its readers: the warm beginning fills
                try:
                    start = ring.reserve(MIB, pid)
                except br.BlockRingFullError:
                    break
                position += 64
                ring.commit(start, position)
                blocks.append((start, position))
            quarter = br.warm_bound(free_bytes(mount) + held(ring), 0.25, 0)
            assert 7 * MIB <= quarter <= 8 * MIB
            warm = ring.warm_limit()
            # (measured as it grew: within a block of the quarter of what is free now)
            assert quarter - span <= warm <= quarter + span, (warm, quarter)
            assert all(start % ring.capacity + span <= warm for start, _ in blocks)
            assert len(blocks) == warm // span, "back-pressured at the end of the warm beginning"
            ring.reclaim(position, position)
            assert held(ring) <= br.HEADER_PAGE + warm
            # a longer message: two of it, more than the quarter
            start = ring.reserve(6 * MIB, pid)
            position += 64
            ring.commit(start, position)
            assert ring.warm_limit() == 2 * br._span(6 * MIB)
            ring.reclaim(position, position)
            for _ in range(30):
                start = ring.reserve(MIB, pid)
                position += 64
                ring.commit(start, position)
                ring.reclaim(position, position)
                assert ring.warm_limit() >= 2 * br._span(6 * MIB)
        finally:
            ring.close()


def test_a_ring_measured_on_a_fuller_tmpfs_keeps_less(tmp_path) -> None:
    """A quarter of what is free where the ring grows: another file taking most of the room
    first leaves the ring a smaller warm beginning; the driver, idle, keeps a quarter of what
    is free then."""
    with mounted_tmpfs(tmp_path / "small", "32m") as mount:
        filler = mount / "filler"
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, 24 * MIB)
        ring = br.BlockRing.create(mount / "x.blocks", 8 * MIB)
        try:
            pid, position = os.getpid(), 0
            for _ in range(20):
                try:
                    start = ring.reserve(300_000, pid)
                except br.BlockRingFullError:
                    break
                position += 64
                ring.commit(start, position)
            assert ring.warm_limit() <= br.warm_bound(8 * MIB, 0.25, 0) + br._span(300_000)
            ring.reclaim(position, position)
            assert held(ring) <= br.HEADER_PAGE + 2 * MIB + br._span(300_000)
            # the filler goes; idle, the driver keeps what a quarter of it allows (here all),
            # and the next writer measures the limit again: a quarter of the room there is now
            filler.unlink()
            before, mark = held(ring), warm_mark(ring)
            ring._tail_moved_at -= br.WARM_IDLE_S + 1
            ring.reclaim(position, position)
            assert (held(ring), warm_mark(ring), ring.warm_limit()) == (before, mark, 0)
            start = ring.reserve(300_000, pid)
            position += 64
            ring.commit(start, position)
            assert ring.warm_limit() == br.warm_bound(free_bytes(mount) + held(ring), 0.25,
                                                      300_000)
            assert ring.warm_limit() > 7 * MIB
            ring.reclaim(position, position)
            # a new filler: idle, the driver gives back past a quarter of what is free now
            with open(filler, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, 28 * MIB)
            start = ring.reserve(300_000, pid)
            position += 64
            ring.commit(start, position)
            ring.reclaim(position, position)
            ring.reclaim(position, position)
            ring._tail_moved_at -= br.WARM_IDLE_S + 1
            ring.reclaim(position, position)
            quarter = br.warm_bound(free_bytes(mount) + held(ring), 0.25, 0)
            assert quarter < 2 * MIB
            assert ring.warm_limit() == 0 and warm_mark(ring) <= quarter
            assert held(ring) <= br.HEADER_PAGE + quarter
        finally:
            ring.close()


def commit_tagged(ring: br.BlockRing, start: int, position: int, tag: int,
                  live: list[tuple[int, int, int, int]]) -> int:
    """Marks the first and last byte of the MIB block reserved at ``start`` with ``tag``,
    commits it at the next stream position (64 on from ``position``), records it in ``live``
    as (start, length, position, tag) and returns that position."""
    payload = ring.payload(start, MIB)
    payload[0] = payload[-1] = tag
    payload.release()
    position += 64
    ring.commit(start, position)
    live.append((start, MIB, position, tag))
    return position


def test_give_back_warm_keeps_live_blocks_and_lets_writers_start_over(tmp_path) -> None:
    """What the driver does when a file of the bus does not fit: every page no live block
    holds goes back (warm ones too), live blocks keep their bytes, and writers go on: the
    next one measures the warm beginning again and allocates the pages it uses."""
    with mounted_tmpfs(tmp_path / "small", "32m") as mount:
        ring = br.BlockRing.create(mount / "x.blocks", 4 * MIB)
        try:
            pid, position = os.getpid(), 0
            live: list[tuple[int, int, int, int]] = []
            for tag in range(6):
                start = ring.reserve(MIB, pid)
                position = commit_tagged(ring, start, position, tag, live)
            ring.reclaim(live[3][2], position)  # the first four freed, kept warm
            live = live[4:]
            assert warm_mark(ring) >= 6 * br._span(MIB)
            before = held(ring)
            freed = ring.give_back_warm()
            assert freed == before - held(ring) == 4 * br._span(MIB)
            assert warm_mark(ring) == 0 and ring.warm_limit() == 0
            assert allocated_at_least(ring, 0, live)
            for start, length, _, tag in live:
                view = ring.payload(start, length)
                assert view[0] == view[-1] == tag
                view.release()
            assert ring.give_back_warm() == 0, "nothing more to give"
            for tag in range(6, 16):  # writers go on, every block's pages allocated
                start = ring.reserve(MIB, pid, populate=True)
                assert ring.warm_limit() >= 2 * br._span(MIB)
                assert allocated_at_least(ring, warm_mark(ring), [*live, (start, MIB, 0, 0)])
                position = commit_tagged(ring, start, position, tag, live)
                ring.reclaim(live[-3][2], position)
                live = live[-2:]
                for start, length, _, tag in live:
                    view = ring.payload(start, length)
                    assert view[0] == view[-1] == tag
                    view.release()
        finally:
            ring.close()


def test_give_back_warm_waits_for_no_writer_and_skips_a_ring_never_used(tmp_path) -> None:
    with mounted_tmpfs(tmp_path / "small", "8m") as mount:
        ring = br.BlockRing.create(mount / "x.blocks", MIB)
        try:
            assert ring.give_back_warm() == 0
            assert held(ring) == 0, "looking allocated nothing"
            start = ring.reserve(300_000, os.getpid())
            ring.commit(start, 64)
            ring.reclaim(64, 64)
            assert held(ring) > br.HEADER_PAGE
            # a live writer (this process, another thread) holds the reserve lock: no change
            ring.buffer.put_int64_release(br._LOCK, os.getpid())
            assert ring.give_back_warm() == 0
            ring.buffer.put_int64_release(br._LOCK, 0)
            assert ring.give_back_warm() > 0
            assert held(ring) == br.HEADER_PAGE
        finally:
            ring.close()
