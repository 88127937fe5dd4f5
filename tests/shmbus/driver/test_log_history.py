"""The log as history: ``join-position`` / ``from_position`` on aeron:ipc subscriptions, with a
driver process, a publisher process at full speed and a recorder process (a subscriber that
keeps the publication connected; its recording tells which message starts where)."""

from __future__ import annotations

import random
import time

import pytest

import shmbus
from shmbus.archive.catalog import RecordingError
from shmbus.archive.recording_reader import RecordingReader
from tests.support.processes import CTX, Processes
from tests.support.waits import wait_until
from tests.support.workers import late_join_workers as lw

pytestmark = pytest.mark.timeout(300)

STREAM = 1001


def read_run(sub: shmbus.Subscription, n: int, timeout: float = 20.0) -> list[tuple[int, int]]:
    """The first ``n`` messages of ``sub`` (checked: crc, length), as (writer, seq)."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} messages"
        for m in sub.messages(timeout=0.1):
            got.append(lw.check(m))
            if len(got) == n:
                break
    return got


def recorded_to(directory) -> int:
    """How far recording 0 has got; 0 until the recorder has seen the image and catalogued it."""
    try:
        return RecordingReader(directory, 0).stop_position
    except RecordingError:
        return 0


def assert_consecutive(got: list[tuple[int, int]]) -> None:
    writers = {w for w, _ in got}
    assert len(writers) == 1, writers
    seqs = [s for _, s in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap or duplicate"


def test_joins_inside_the_log_under_load_start_at_a_whole_message(
        bus_context, driver, procs: Processes, shm_dir) -> None:
    """A publisher at full speed; subscriptions join at 'earliest' and at recorded message
    starts: each gets whole, checked messages with consecutive sequence numbers, the one at
    a strict position exactly the recorded message there."""
    directory = shm_dir / "rec"
    stop, ready = CTX.Event(), CTX.Event()
    procs.start(lw.record, bus_context, str(directory), "aeron:ipc", STREAM, stop, ready,
                procs.queue)
    assert ready.wait(30)
    started = CTX.Event()
    procs.start(lw.publish, bus_context, "aeron:ipc", STREAM, 0, stop, procs.queue, started)
    assert started.wait(30)
    rng = random.Random(3)
    exact = gone = 0
    try:
        with shmbus.connect(bus_context) as bus:
            wait_until(lambda: recorded_to(directory) >= 256 * 1024, 30,
                       "the recorder to record 256 KiB")
            for _ in range(100):
                with bus.add_subscription("aeron:ipc", STREAM, from_position="start") as sub:
                    got = read_run(sub, 100)
                    assert sub.images[0].join_position % 32 == 0
                assert_consecutive(got)
                reader = RecordingReader(directory, 0)
                end = reader.stop_position
                positions = reader.read_batch(end - rng.choice([4096, 16384]), end).positions
                position = int(rng.choice(positions))
                try:
                    sub = bus.add_subscription("aeron:ipc", STREAM, from_position=position)
                except shmbus.RegistrationError as e:
                    assert "is gone" in str(e) and "holds positions" in str(e)
                    gone += 1
                    continue
                with sub:
                    assert sub.images[0].join_position == position
                    got = read_run(sub, 50)
                assert_consecutive(got)
                first = next(reader.messages(position, position + 32))
                assert got[0] == lw.check(first.payload)
                exact += 1
    finally:
        stop.set()
        procs.wait("recorded", timeout=30)
    assert exact > 0, f"every strict join was refused ({gone})"


def test_a_position_the_log_no_longer_holds_is_refused_naming_the_range(
        bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", STREAM)
        reader = bus.add_subscription("aeron:ipc", STREAM)
        starts = []
        for seq in range(2000):
            starts.append(pub.position)
            pub.publish(lw.message(0, seq), timeout=5)
            if seq % 50 == 49:
                for _ in reader.messages(timeout=0):
                    pass
        for _ in reader.messages(timeout=0):
            pass
        # the reader read everything, so the log was cleaned up to near its end
        end = pub.position
        with pytest.raises(shmbus.RegistrationError, match=r"join-position \d+ is gone: .*"
                                                           r"holds positions"):
            bus.add_subscription("aeron:ipc", STREAM, from_position=starts[10])
        with pytest.raises(shmbus.RegistrationError, match="past the end of the stream"):
            bus.add_subscription("aeron:ipc", STREAM, from_position=end + 4096)
        # the driver checks the channel: its refusal names the parameter
        with pytest.raises(shmbus.RegistrationError, match="multiple of 32"):
            bus.add_subscription("aeron:ipc?join-position=100", STREAM)
        with pytest.raises(shmbus.RegistrationError, match="for aeron:ipc subscriptions only"):
            bus.add_subscription("aeron:udp?endpoint=127.0.0.1:40999|join-position=0", STREAM)
        with pytest.raises(ValueError, match="from_position"):
            bus.add_subscription("aeron:ipc", STREAM, from_position="yesterday")
        # the end itself is fine: the next message is the first
        with bus.add_subscription("aeron:ipc", STREAM, from_position=end) as sub:
            pub.publish(lw.message(0, 2000), timeout=5)
            assert read_run(sub, 1) == [(0, 2000)]
        # a refused subscription joined nothing: the publisher is held by the reader only
        assert len(bus.add_subscription("aeron:ipc", STREAM + 1).images) == 0


def test_a_subscriber_not_reading_keeps_history_for_later_joiners_and_groups(
        bus_context, driver) -> None:
    """What a slow subscriber has not read stays in the log: a new subscriber can start at
    any message in it, and a new group too (members joining later share the group's
    position)."""
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", STREAM)
        slow = bus.add_subscription("aeron:ipc", STREAM)
        while not pub.is_connected:
            slow.wait(0.01)
        starts = []
        seq = 0
        while pub.position < bus_context.ipc_term_length // 4:
            starts.append(pub.position)
            pub.publish(lw.message(0, seq), timeout=5)
            seq += 1
        rng = random.Random(9)
        for _ in range(20):
            i = rng.randrange(len(starts))
            with bus.add_subscription("aeron:ipc", STREAM, from_position=starts[i]) as sub:
                got = read_run(sub, seq - i)
            assert got == [(0, s) for s in range(i, seq)]
        i = rng.randrange(len(starts))
        first = bus.add_subscription("aeron:ipc", STREAM, group="replay",
                                     from_position=starts[i])
        # a second member names another position: the group's own position wins
        second = bus.add_subscription("aeron:ipc", STREAM, group="replay",
                                      from_position=starts[0])
        got = read_run(first, (seq - i) // 2) + read_run(second, 0)
        got += [lw.check(m) for sub in (first, second) for m in sub.messages(timeout=0.2)]
        assert sorted(got) == [(0, s) for s in range(i, seq)]
        first.close()
        second.close()
        assert [lw.check(m) for m in slow.messages(timeout=0.2)] == [(0, s) for s in range(seq)]
