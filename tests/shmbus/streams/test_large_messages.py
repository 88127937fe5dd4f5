"""Messages longer than the log takes, across real processes on a real bus directory.

The test bus has 64 KiB terms (a max message of 8 KiB in the log), so most messages here take
the large-message path: a block in the publication's block ring, a reference in the log. Every
message is checked byte for byte (crc32) and in order per writer by the reading process.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shmbus
from shmbus.driver.system_counters import SystemCounter
from shmbus.shm.block_ring import BlockRing
from tests.support.drivers import (
    TINY_LENGTHS,
    driver_serves,
    running_driver,
    start_driver,
    stop_driver,
    system_counter,
)
from tests.support.sleepers import wait_for_driver_timers
from tests.support.system import free_bytes, mounted_tmpfs
from tests.support.waits import holds_for, wait_until
from tests.support.workers import driver_workers as dw
from tests.support.workers import large_workers as lw

pytestmark = pytest.mark.timeout(180)

SIZES = [100, 8_000, 9_000, 70_000, 300_000, 2_000_000, 40, 1_500, 65_536, 5_000_000]


@pytest.fixture
def small_ring_context(bus_context):
    """A driver whose block rings take messages up to 1 MiB (rings of about 2 MiB)."""
    context = bus_context.with_(max_large_message_length=1 << 20)
    with running_driver(context):
        yield context


def rings(context: shmbus.Context) -> list[Path]:
    return sorted((Path(context.dir) / "logs").glob("*.blocks"))


def ring_in_use(context: shmbus.Context) -> int:
    total = 0
    for path in rings(context):
        ring = BlockRing.open(path)
        total += ring.in_use()
        ring.close()
    return total


@contextlib.contextmanager
def driver_on_a_24_mib_tmpfs(bus_context: shmbus.Context, procs: Any, tmp_path: Path
                             ) -> Iterator[tuple[shmbus.Context, Path, Any]]:
    """A driver process (small lengths) on a bus directory in a 24 MiB tmpfs mounted for the
    test: yields (its context, the mount point, the driver process); the driver is stopped and
    the tmpfs unmounted after."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        context = bus_context.with_(dir=str(mount / "bus"))
        driver = procs.start(dw.run_driver, context, TINY_LENGTHS)
        wait_until(lambda: driver_serves(context, driver.pid) or not driver.is_alive(), 20,
                   "the driver on the small tmpfs")
        assert driver.is_alive(), f"the driver exited with {driver.exitcode}"
        yield context, mount, driver
        driver.terminate()
        driver.join(10)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def connected(pub: shmbus.Publication, subs: int = 1) -> None:
    wait_until(lambda: pub.is_connected, 10, "a subscriber")


def test_two_writer_processes_to_three_reader_processes_every_byte_in_order(
        bus_context, driver, procs):
    context = bus_context
    sizes = SIZES * 3
    expected = {1: len(sizes), 2: len(sizes)}
    for mode in ("messages", "views", "poll"):
        procs.start(lw.reader, context, 11, expected, mode, procs.queue)
    procs.wait("ready", 3)
    for writer_id in expected:
        procs.start(lw.writer, context, 11, writer_id, sizes, 3, procs.queue)
    procs.wait("sent", 2, timeout=120)
    reports = procs.wait("read", 3, timeout=120)
    for report in reports:
        assert report["count"] == 2 * len(sizes), report
        assert report["next"] == {1: len(sizes), 2: len(sizes)}, report
    wait_until(lambda: ring_in_use(context) == 0, 10, "every block freed")


def test_default_settings_take_the_issue_s_256_kib_array(shm_dir):
    context = shmbus.Context(dir=str(shm_dir / "bus"), driver_idle_timeout=1.0)
    with shmbus.connect(context) as bus:
        pub = bus.add_publication("aeron:ipc", 5)
        sub = bus.add_subscription("aeron:ipc", 5)
        connected(pub)
        array = np.random.rand(32_768)
        assert pub.max_message_length < array.nbytes
        assert pub.publish(array) > 0
        [got] = list(sub.messages(timeout=0.5))
        assert got == array.tobytes()


def test_a_view_holds_its_block_until_released(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 6)
        sub = bus.add_subscription("aeron:ipc", 6)
        connected(pub)
        first, second = lw.message(1, 0, 300_000), lw.message(1, 1, 20)
        pub.publish(first)
        pub.publish(second)
        view = sub.take_view()
        assert view is not None and view.zero_copy
        assert view.buffer.readonly and view.buffer == first
        image = sub.images[0]
        held_at = image.position
        assert held_at < view.position
        assert sub.take_view() is None, "the image is held: its next message waits"
        wait_for_driver_timers(bus_context)  # whole timer passes of the driver: the block stays
        assert ring_in_use(bus_context) > 0
        assert image.position == held_at
        with pytest.raises(TypeError):
            view.buffer[0] = 1  # read-only
        view.release()
        assert image.position == view.position
        nxt = sub.take_view()
        assert nxt is not None and not nxt.zero_copy and bytes(nxt.buffer) == second
        nxt.release()
        wait_until(lambda: ring_in_use(bus_context) == 0, 5, "the block freed")


def test_group_members_take_large_and_small_messages_each_once_in_order(bus_context, driver):
    sizes = [40, 300_000, 9_000, 2_000_000, 100, 70_000] * 4
    with shmbus.connect(bus_context) as bus:
        members = [bus.add_subscription("aeron:ipc", 9, group="big") for _ in range(2)]
        pub = bus.add_exclusive_publication("aeron:ipc", 9)
        connected(pub)
        wait_until(lambda: all(m.images for m in members), 10, "both members' images")
        got: list[list[int]] = [[], []]
        assembler = shmbus.FragmentAssembler(lambda b, h: got[1].append(lw.check(b)[1]))

        def read(member: int) -> bool:
            """Member 0 reads with messages() (copies), member 1 with poll (views)."""
            if member == 0:
                got[0].extend(lw.check(m)[1] for m in members[0].messages(timeout=0))
            else:
                members[1].poll(assembler, 10)
            return sum(map(len, got)) == len(sizes)

        for seq, size in enumerate(sizes):
            pub.publish(lw.message(1, seq, size), timeout=10)
            read(seq % 2)
        wait_until(lambda: read(0) or read(1), 10, "every message")
        assert sorted(got[0] + got[1]) == list(range(len(sizes)))
        assert all(seqs == sorted(seqs) for seqs in got) and all(got)
        wait_until(lambda: ring_in_use(bus_context) == 0, 5, "the blocks freed")


def test_a_ring_file_removed_under_a_live_stream_goes_on_in_the_mapped_ring(
        bus_context, driver):
    """A restarted driver removes the files of the one before while that one's clients still
    hold them (until they hear it died): what they mapped goes on working."""
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 10)
        sub = bus.add_subscription("aeron:ipc", 10)
        connected(pub)
        wait_until(lambda: sub.images, 10, "the image")
        for ring in rings(bus_context):
            ring.unlink()
        message = lw.message(1, 0, 300_000)
        pub.publish(message, timeout=10)
        got = list(sub.messages(timeout=5))
        assert len(got) == 1 and lw.check(got[0]) == (1, 0) and got[0] == message
        # the ring and its log removed before the client mapped the ring (the race with a
        # restarted driver): not connected, as a publication whose driver is gone
        pub._blocks.close()
        pub._blocks = None
        log_path = pub.log.path
        pub.log.path = str(log_path) + ".gone"
        try:
            assert pub.offer(message) == shmbus.codes.NOT_CONNECTED
            with pytest.raises(shmbus.PublicationError, match="block ring is gone"):
                pub.publish(message)
        finally:
            pub.log.path = log_path
        assert pub.offer(b"small messages go on") > 0


def test_try_claim_past_the_log_fills_a_block_in_place(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_publication("aeron:ipc", 7)
        sub = bus.add_subscription("aeron:ipc", 7)
        connected(pub)
        data = lw.message(3, 0, 1 << 20)
        with pub.try_claim(len(data), reserved_value=42) as claim:
            assert isinstance(claim, shmbus.LargeClaim)
            claim.buffer[:] = data
        assert claim.result > 0
        aborted = pub.try_claim(100_000)
        aborted.abort()
        got: list[tuple[bytes, int]] = []
        wait_until(lambda: sub.poll(lambda b, h: got.append((bytes(b), h.reserved_value)), 10)
                   or bool(got), 5, "the claimed message")
        assert got == [(data, 42)]
        assert list(sub.messages(timeout=0.2)) == []  # the aborted one never appears
        wait_until(lambda: ring_in_use(bus_context) == 0, 5, "both blocks freed")


def test_a_publication_closed_under_a_large_offer_or_claim_refuses_cleanly(small_ring_context):
    """Another thread closes the publication (as the client's conductor does when it rebinds
    it to a restarted driver's log) while a publish waits for room in the ring and while a
    claim is being filled: each ends with PublicationError(CLOSED), not a failure inside the
    unmapped ring, and the reader sees only the messages committed before."""
    with shmbus.connect(small_ring_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 8)
        sub = bus.add_subscription("aeron:ipc", 8)  # reads nothing until the end
        connected(pub)
        sent = [lw.message(4, i, 700_000) for i in range(2)]
        for data in sent:
            pub.publish(data)
        claim = pub.try_claim(300_000)
        assert isinstance(claim, shmbus.LargeClaim) and claim.buffer is not None
        claim.buffer[:1000] = b"x" * 1000  # half-filled when the publication goes
        outcome: list[BaseException] = []

        def publish_third() -> None:
            try:
                pub.publish(lw.message(4, 2, 700_000), timeout=30)
            except BaseException as error:
                outcome.append(error)

        writer = threading.Thread(target=publish_third)
        writer.start()
        # (it waits for room: the ring holds two of these and the claim)
        wait_until(lambda: pub._blocks.writer_waiting(), 10, "the writer waiting for room")
        assert not outcome and writer.is_alive()
        pub.close()
        writer.join(10)
        assert not writer.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], shmbus.PublicationError), outcome
        assert outcome[0].code == shmbus.settings.codes.CLOSED
        with pytest.raises(shmbus.PublicationError) as info:
            claim.commit()
        assert info.value.code == shmbus.settings.codes.CLOSED
        got = [bytes(m) for m in sub.messages(timeout=0.5)]
        assert got == sent


def test_a_reference_frame_unblocked_by_the_driver_is_appended_again(small_ring_context):
    """A writer descheduled between claiming a large message's reference frame and committing
    it, past publication_unblock_timeout: the driver pads the frame over, and the offer
    appends the reference again, so the message arrives once and whole."""
    context = small_ring_context
    with shmbus.connect(context) as bus:
        pub = bus.add_publication("aeron:ipc", 9)
        sub = bus.add_subscription("aeron:ipc", 9)
        connected(pub)
        claim_view = pub._claim_view
        stalls = []
        unblocked = system_counter(bus, SystemCounter.UNBLOCKED_PUBLICATIONS)

        def stalled_claim_view(frame_offset: int, length: int) -> memoryview:
            if not stalls:  # the first reference only: stall until the driver unblocks it
                stalls.append(frame_offset)
                wait_until(lambda: system_counter(bus, SystemCounter.UNBLOCKED_PUBLICATIONS)
                           > unblocked, context.publication_unblock_timeout + 10,
                           "the driver to pad over the stalled reference frame")
            return claim_view(frame_offset, length)

        pub._claim_view = stalled_claim_view
        data = lw.message(5, 0, 500_000)
        assert pub.offer(data) > 0
        pub.publish(b"after")
        got = [bytes(m) for m in sub.messages(timeout=1.0)]
        assert stalls and got == [data, b"after"]
        wait_until(lambda: ring_in_use(context) == 0, 5, "the block freed")


def test_past_the_context_limit_the_error_names_the_setting(small_ring_context):
    context = small_ring_context
    with shmbus.connect(context) as bus:
        pub = bus.add_publication("aeron:ipc", 8)
        bus.add_subscription("aeron:ipc", 8)
        connected(pub)
        limit = BlockRing.open(rings(context)[0]).max_message_length
        with pytest.raises(ValueError, match=r"Context\.max_large_message_length"):
            pub.offer(bytes(limit + 1))
        assert pub.offer(bytes(limit)) > 0


def test_a_udp_channel_refuses_past_its_own_max_naming_the_setting(bus_context, driver):
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_publication("aeron:udp?endpoint=127.0.0.1:40931", 9)
        with pytest.raises(ValueError, match=r"term-length.*Context\.udp_term_length"):
            pub.offer(bytes(pub.max_message_length + 1))


def test_a_reader_killed_holding_a_view_is_dropped_and_its_block_freed(small_ring_context,
                                                                      procs):
    context = small_ring_context
    holder_reports = procs.private()
    holder = procs.start(lw.holder, context, 12, holder_reports.queue)
    holder_reports.wait("ready")
    with shmbus.connect(context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 12)
        sub = bus.add_subscription("aeron:ipc", 12)
        connected(pub)
        size = 700_000
        seq = 0
        pub.publish(lw.message(1, seq, size), timeout=5)
        holding = holder_reports.wait("holding")[0]
        assert holding["zero_copy"] and holding["seq"] == 0
        # the live reader reads on, the holder holds block 0: the ring (two 1 MiB messages)
        # fills and the writer is back-pressured
        read = 0
        refused = None
        deadline = time.monotonic() + 20
        while refused is None:
            assert time.monotonic() < deadline, "the writer was never held back"
            for m in sub.messages(timeout=0):
                assert lw.check(m) == (1, read)
                read += 1
            result = pub.offer(lw.message(1, seq + 1, size))
            if result > 0:
                seq += 1
            else:
                refused = result
        assert refused == shmbus.codes.BACK_PRESSURED
        assert ring_in_use(context) > 0
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(5)
        # the driver drops the dead client (client_liveness_timeout), its block is freed and
        # the writer goes on
        killed_at = time.monotonic()
        for _ in range(6):
            seq += 1
            pub.publish(lw.message(1, seq, size), timeout=20)
            for m in sub.messages(timeout=0.2):
                assert lw.check(m) == (1, read)
                read += 1
        assert time.monotonic() - killed_at < 20
        for m in sub.messages(timeout=0.5):
            assert lw.check(m) == (1, read)
            read += 1
        assert read == seq + 1, "nothing lost"
        wait_until(lambda: ring_in_use(context) == 0, 5, "every block freed")
        pub.close()
        sub.close()
        logs = Path(context.dir) / "logs"
        wait_until(lambda: not any(logs.iterdir()), 10, "the log and its block ring deleted")


def test_full_dev_shm_refuses_a_large_message_with_sizes_and_loses_nothing(bus_context,
                                                                          procs, tmp_path):
    with driver_on_a_24_mib_tmpfs(bus_context, procs, tmp_path) as (context, mount, _):
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", 13)
            sub = bus.add_subscription("aeron:ipc", 13)
            connected(pub)
            before = lw.message(1, 0, 4 << 20)
            pub.publish(before)
            assert [lw.check(m) for m in sub.messages(timeout=0.3)] == [(1, 0)]
            wait_until(lambda: ring_in_use(context) == 0, 5, "the first block freed")
            free = free_bytes(mount)
            too_big = lw.message(1, 1, 32 << 20)
            with pytest.raises(OSError) as info:
                pub.publish(too_big)
            match = re.search(r"(\d+) bytes needed, (\d+) bytes free", str(info.value))
            assert match, str(info.value)
            assert int(match[2]) <= free
            assert free_bytes(mount) == free, "nothing half-made"
            assert ring_in_use(context) == 0
            after = lw.message(1, 1, 3 << 20)
            pub.publish(after)
            assert [lw.check(m) for m in sub.messages(timeout=0.3)] == [(1, 1)]


def test_a_writer_killed_mid_fill_publishes_nothing_torn_and_its_block_is_reclaimed(
        bus_context, procs, shm_dir):
    """Writer 1 publishes three messages, claims a block past the log's max (a LargeClaim),
    writes half of its fourth message and is SIGKILLed before committing. Writer 2, on the
    same publication (one log, one ring), is held back by the half-made block at the ring's
    head until the driver sees its writer dead; then it goes on, and writer 1 restarted goes
    on from its fourth message. Both readers get every committed message whole and in order,
    and nothing else; every block is freed, and nothing is left in /dev/shm once the bus
    closes. The killed writer is not reaped until the end: a zombie is dead too."""
    context = bus_context.with_(max_large_message_length=1 << 20)
    driver = start_driver(context)
    try:
        size = 700_000
        first, rest, other = [size, 40, size], [size, 9_000, size, size], [size] * 8
        expected = {1: len(first) + len(rest), 2: len(other)}
        for mode in ("views", "messages"):
            procs.start(lw.reader, context, 14, expected, mode, procs.queue, 1.0)
        procs.wait("ready", 2)
        dying_reports = procs.private()
        dying = procs.start(lw.half_filled_writer, context, 14, 1, first, 900_000,
                            dying_reports.queue)
        filling = dying_reports.wait("filling")[0]
        assert "exception" not in filling, filling["exception"]
        assert ring_in_use(context) > 0
        procs.start(lw.writer, context, 14, 2, other, 2, procs.queue)
        # a negative check, watched for 1.5 s: the half-made block at the ring's head holds
        # writer 2 back (no state shows a writer that stays held; one that got past says so)
        holds_for(lambda: procs.poll("sent") is None, 1.5,
                  "writer 2 held behind a live writer's unfinished block", pause=0.05)
        os.kill(dying.pid, signal.SIGKILL)
        procs.start(lw.writer, context, 14, 1, rest, 2, procs.queue, len(first))
        for report in procs.wait("sent", 2, timeout=60):
            assert "exception" not in report, report["exception"]
        for report in procs.wait("read", 2, timeout=60):
            assert "exception" not in report, report["exception"]
            assert report["count"] == sum(expected.values()), report
            assert report["next"] == expected, report
        wait_until(lambda: ring_in_use(context) == 0, 10, "every block freed")
        dying.join(5)
        logs = Path(context.dir) / "logs"
        wait_until(lambda: not any(logs.iterdir()), 20,
                   "the log and its block ring deleted once its clients are gone")
    finally:
        stop_driver(driver)
    # (driver.lock, a pid, stays by design: removing a flocked file would race the next driver)
    left = [p for p in shm_dir.rglob("*") if p.is_file() and p.name != "driver.lock"]
    assert not left, f"left in /dev/shm after the bus closed: {left}"
    assert (Path(context.dir) / "driver.lock").stat().st_size < 16  # (the last pid)


def test_publish_many_mixes_large_and_small_messages_in_stream_order(bus_context, driver,
                                                                     procs):
    """Batches of small, fragmented and large messages (each large one alone on the
    large-message path) and a 2-D array of large rows reach both reader processes whole and in
    order, beside another writer's publish()."""
    context = bus_context
    sizes = [40, 300_000, 100, 9_000, 2_000_000, 2_000_000, 70_000, 40, 40, 500_000] * 3
    rows = 3
    expected = {1: len(sizes) + rows, 2: len(SIZES)}
    for mode in ("messages", "views"):
        procs.start(lw.reader, context, 15, expected, mode, procs.queue, 0.5)
    procs.wait("ready", 2)
    procs.start(lw.batch_writer, context, 15, 1, sizes, 4, rows, procs.queue)
    procs.start(lw.writer, context, 15, 2, SIZES, 2, procs.queue)
    for report in procs.wait("sent", 2, timeout=120):
        assert "exception" not in report, report["exception"]
    for report in procs.wait("read", 2, timeout=120):
        assert report["count"] == sum(expected.values()), report
        assert report["next"] == expected, report
    wait_until(lambda: ring_in_use(context) == 0, 10, "every block freed")


def test_offer_many_takes_a_large_message_alone_and_stops_a_batch_before_one(bus_context,
                                                                              driver):
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 16)
        sub = bus.add_subscription("aeron:ipc", 16)
        connected(pub)
        small, large = lw.message(1, 0, 50), lw.message(1, 1, 300_000)
        assert pub.offer_many([small, small, large, small]) == 2, "ends before the large one"
        assert pub.offer_many([large, small]) == 1, "a large one first goes alone"
        assert pub.offer_many(np.zeros((2, 300_000), np.uint8)) == 1
        got = [bytes(m) for m in sub.messages(timeout=0.3)]
        assert got == [small, small, large, bytes(300_000)]
        assert pub.offer_many([large]) == 1
        sub.close()
        wait_until(lambda: not pub.is_connected, 5, "no subscriber")
        assert pub.offer_many([large, small]) == shmbus.codes.NOT_CONNECTED


def test_publish_many_names_the_message_a_channel_cannot_take(small_ring_context):
    context = small_ring_context
    with shmbus.connect(context) as bus:
        pub = bus.add_publication("aeron:ipc", 17)
        sub = bus.add_subscription("aeron:ipc", 17)
        connected(pub)
        batch = [b"a", b"b", bytes(3 << 20), b"c"]
        with pytest.raises(ValueError, match=r"message 2 of 4 \(3145728 bytes; the 2 before it "
                           r"were appended\).*Context\.max_large_message_length"):
            pub.publish_many(batch)
        assert list(sub.messages(timeout=0.3)) == [b"a", b"b"]
        assert pub.publish_many(batch[3:]) == 1
        assert list(sub.messages(timeout=0.3)) == [b"c"]
        udp = bus.add_publication("aeron:udp?endpoint=127.0.0.1:40932", 17)
        with pytest.raises(ValueError, match=r"message 0 of 2 .*Context\.udp_term_length"):
            udp.publish_many([bytes(udp.max_message_length + 1), b"x"])


def ring_bytes_held(context: shmbus.Context) -> int:
    """The /dev/shm bytes the bus's block rings hold (tmpfs counts allocated pages)."""
    return sum(path.stat().st_blocks * 512 for path in rings(context))


def test_messages_past_half_the_warm_beginning_reuse_two_blocks_then_give_them_back(
        bus_context, driver, procs):
    """A stream of 40 MiB messages (more than WARM_BYTES / 2) to two reader processes: the
    warm beginning grows to two such blocks and the stream reuses them (the ring holds no more
    than two blocks' pages while it runs and after); once the empty ring has been idle for
    WARM_IDLE_S the driver gives back what lies past WARM_BYTES, and the ring file goes with
    the publication."""
    from shmbus.shm import block_ring as br

    context = bus_context
    length = 40 << 20
    count = 6
    two_blocks = 2 * (-(-(br.BLOCK_HEADER + length) // br.PAGE) * br.PAGE)
    for mode in ("messages", "views"):
        procs.start(lw.reader, context, 17, {1: count}, mode, procs.queue)
    procs.wait("ready", 2)
    peak = 0

    def sample() -> None:
        nonlocal peak
        peak = max(peak, ring_bytes_held(context))

    with shmbus.connect(context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 17)
        wait_until(lambda: pub.is_connected and len(rings(context)) == 1, 10, "the readers")
        for seq in range(count):
            pub.publish(lw.message(1, seq, length), timeout=30)
            sample()
        for report in procs.wait("read", 2, timeout=120, between=sample):
            assert report["next"] == {1: count}, report
        # (and, for a moment, the page of the padding block's header that sends the writer
        # back to the beginning)
        assert peak <= br.HEADER_PAGE + two_blocks + br.PAGE, f"{peak} bytes, two of {length}"
        wait_until(lambda: ring_in_use(context) == 0, 10, "every block freed")
        held = ring_bytes_held(context)
        assert br.WARM_BYTES < held <= br.HEADER_PAGE + two_blocks, "two blocks kept warm"
        wait_until(lambda: ring_bytes_held(context) <= br.HEADER_PAGE + br.WARM_BYTES,
                   br.WARM_IDLE_S + 10, "the warm beginning past WARM_BYTES given back")
        # a stream that comes back grows it again, every message intact
        sub = bus.add_subscription("aeron:ipc", 17)
        pub.publish(lw.message(1, count, length), timeout=30)
        assert [lw.check(m) for m in sub.messages(timeout=2)] == [(1, count)]
        pub.close()
        wait_until(lambda: not rings(context), 10, "the ring file deleted with its publication")


def test_a_dev_shm_that_holds_one_block_takes_a_stream_of_them_one_at_a_time(bus_context,
                                                                             procs, tmp_path):
    """On a 24 MiB tmpfs a 12 MiB message fits once, a second one beside it does not: the
    writer waits until the ring is empty and reuses the first block (it used to fail with
    ENOSPC), and a reader process gets every message intact and in order."""
    with driver_on_a_24_mib_tmpfs(bus_context, procs, tmp_path) as (context, mount, driver):
        count = 5
        procs.start(lw.reader, context, 19, {1: count}, "views", procs.queue)
        procs.wait("ready", 1)
        procs.start(lw.writer, context, 19, 1, [12 << 20] * count, 1, procs.queue)
        procs.wait("sent", 1, timeout=120)
        (report,) = procs.wait("read", 1, timeout=120)
        assert report["next"] == {1: count}, report
        wait_until(lambda: ring_in_use(context) == 0, 10, "every block freed")
        driver.terminate()
        driver.join(10)
        assert not list((mount / "bus").rglob("*.blocks")), "a block ring left behind"


def small_stream(bus: shmbus.Client, stream_id: int, term_length: int | None = None
                 ) -> tuple[shmbus.Publication, shmbus.Subscription]:
    """A new stream (its own log: an exclusive publication) and a subscription to it, which
    reads one message, checked."""
    channel = "aeron:ipc" if term_length is None else f"aeron:ipc?term-length={term_length}"
    pub = bus.add_exclusive_publication(channel, stream_id)
    sub = bus.add_subscription("aeron:ipc", stream_id)
    connected(pub)
    pub.publish(lw.message(3, stream_id, 200), timeout=10)
    assert [lw.check(m) for m in sub.messages(timeout=1.0)] == [(3, stream_id)]
    return pub, sub


def test_a_full_speed_large_stream_on_a_64_mib_tmpfs_leaves_room_for_new_streams_and_a_driver(
        bus_context, procs, tmp_path):
    """Docker's 64 MiB /dev/shm: a writer process publishes 2 MiB messages as fast as a reader
    process takes them. Its block ring keeps warm at most a quarter of what is free; new
    streams with 3 MiB logs are created beside it until the tmpfs is full (the ring gives
    back its warm pages when a log does not fit: more are created than fit beside a quarter
    kept), and those that do not fit are refused with the sizes; they go, the driver is
    killed and a new one (a cnc.dat of 4 MiB) takes over; new streams fit again, and the
    large stream goes on in the new driver's log. Every message is checked (checksum, and
    sequence: in order, nothing lost within a log)."""
    from shmbus.driver.system_counters import SystemCounter
    from shmbus.shm import block_ring as br
    from shmbus.shm import control_protocol as cp
    from shmbus.shm.log_buffer import log_length
    from tests.support.processes import CTX

    mib = 1 << 20
    length = 2 * mib
    with mounted_tmpfs(tmp_path / "docker", "64m") as mount:
        # (a client is timed out after 10 s without a heartbeat, not 2: on a loaded 2-core
        # machine a process may wait that long for a CPU)
        context = bus_context.with_(dir=str(mount / "bus"), reconnect=True,
                                    client_liveness_timeout=10.0)
        logs = Path(context.dir) / "logs"
        driver = start_driver(context)  # (a cnc.dat of the default size)
        try:
            stop = CTX.Event()
            procs.start(lw.streaming_reader, context, 51, procs.queue, 150)
            procs.wait("reader-ready")
            procs.start(lw.streaming_writer, context, 51, length, stop, procs.queue, 150)
            procs.wait("writer-ready")
            procs.wait("reader-streaming")
            (ring,) = [p for p in rings(context) if br.ring_usage(p).warm_bound]
            # a quarter of what the cnc.dat and the stream's log leave free (measured where
            # the ring grew, a block at a time, so within a block of it)
            quarter = br.warm_bound(free_bytes(mount) + ring.stat().st_blocks * 512, 0.25,
                                    length)
            assert quarter < 16 * mib

            def warm_within_its_bound() -> None:
                usage = br.ring_usage(ring)
                assert usage.warm_bytes <= usage.warm_bound <= quarter + br._span(length), (
                    usage, quarter)

            warm_within_its_bound()
            with shmbus.connect(context) as bus:
                # new streams of 3 MiB logs (one every 0.2 s at most) until three tries in a row
                # (0.5 s apart: the reader may still hold blocks past a lowered bound) do not fit
                big = log_length(1 << 20)
                streams: list[tuple[shmbus.Publication, shmbus.Subscription]] = []
                refused: list[shmbus.RegistrationError] = []
                deadline = time.monotonic() + 60
                while len(refused) < 3 and time.monotonic() < deadline:
                    try:
                        streams.append(small_stream(bus, 60 + len(streams), 1 << 20))
                        refused.clear()
                    except shmbus.RegistrationError as e:
                        refused.append(e)
                        time.sleep(0.3)
                    warm_within_its_bound()
                    time.sleep(0.2)
                assert len(refused) == 3, f"{len(streams)} streams, {refused}"
                # the error names what was needed and what was free; free is measured after the
                # failed allocation, while the large stream's reader may be releasing blocks, so
                # it is not compared with what was needed
                for error in refused:
                    assert error.code == cp.STORAGE_SPACE
                    match = re.search(r"(\d+) bytes needed, (\d+) bytes free", str(error))
                    assert match and int(match[1]) == big and int(match[2]) < 64 * mib, str(error)
                    assert "cannot create log" in str(error)
                given = bus.counters.get_value(SystemCounter.WARM_BYTES_GIVEN_BACK.value)
                assert given > 0, "no warm pages given back"
                # beside a ring keeping a quarter of what the cnc.dat and the stream's log (and
                # this client's first) leave free, fewer fit (about 15 here); beside its live
                # blocks only, about 18
                beside_a_quarter = int((64 * mib - 4_337_664 - 2 * log_length(65536)) * 0.75
                                       ) // big
                assert len(streams) >= beside_a_quarter + 2, (len(streams), given)
                for pub, sub in streams:
                    pub.close()
                    sub.close()
                streams.clear()
                wait_until(lambda: len(list(logs.glob("*.log"))) <= 2, 10,
                           "the new streams' logs deleted")

                # the driver dies; a new one takes over, the clients reconnect
                driver.kill()
                driver.wait(10)
                driver = start_driver(context)
                wait_until(lambda: bus.reconnects == 1, 30, "this client's reconnection")
                for n in range(3):
                    streams.append(small_stream(bus, 80 + n))
                    streams.append(small_stream(bus, 90 + n, 1 << 20))
                wait_until(lambda: any(br.ring_usage(p).warm_bound for p in rings(context)), 20,
                           "the large stream in the new driver's log")
                (ring,) = [p for p in rings(context) if br.ring_usage(p).warm_bound]
                warm_within_its_bound()
            stop.set()
            (written,) = procs.wait("written", timeout=60)
            (read,) = procs.wait("read", timeout=60)
        finally:
            stop_driver(driver)
    assert written["reconnects"] == read["reconnects"] == 1, (written, read)
    assert read["last"] == written["count"] - 1, (written, read)
    assert len(read["sessions"]) == 2, read
    assert len(read["jumps"]) <= 1, read  # (what the dead driver's log held unread)
    assert read["count"] >= 20, read
