"""Late joiners with real processes: publishers at full speed and a recorder in their own
processes, a driver process, and subscribers joining at random moments from random positions
(history from the recording, then live). Every message a joiner gets is checked (crc32, body)
and, per session, its sequence numbers run on by one from the message at the position it
asked for: nothing lost, duplicated or reordered at the seam.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

import shmbus
from shmbus.archive.catalog import read_catalog
from shmbus.archive.recording_reader import RecordingReader, replay
from shmbus.shm.log_buffer import max_message_length
from tests.support.drivers import stop_driver
from tests.support.networks import bus_pair, free_udp_port
from tests.support.processes import CTX, Processes
from tests.support.waits import time_left, wait_until
from tests.support.workers import late_join_workers as lw

pytestmark = pytest.mark.timeout(600)

STREAM = 1001
#: how long a joiner chases publishers faster than its checks before it holds them back
CATCH_UP = 1.0
#: joins of the stress test (the issue's target)
STRESS_JOINS = 1000


@dataclass
class Seen:
    """What a joiner got from one session."""

    first: int | None = None
    last: int | None = None
    writer: int | None = None
    count: int = 0
    live: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, writer: int, seq: int, replayed: bool) -> None:
        if self.first is None:
            self.first, self.writer = seq, writer
        elif writer != self.writer or seq != self.last + 1:  # type: ignore[operator]
            self.errors.append(f"after ({self.writer}, {self.last}) came ({writer}, {seq})")
        self.last = seq
        self.count += 1
        self.live += not replayed


def first_seq(directory: Path, session_id: int, position: int | str) -> int | None:
    """The sequence number of the first recorded message of a session at or after
    ``position`` ('start': its first), from the recording itself."""
    for d in read_catalog(directory):
        if d.session_id == session_id:
            start = d.start_position if position == "start" else max(int(position),
                                                                     d.start_position)
            for m in RecordingReader(directory, d).messages(start, start + 65536):
                return lw.check(m.payload)[1]
    return None


def pick_position(directory: Path, rng: random.Random, span: int) -> tuple[int, int]:
    """(session, the start of a random recorded message in the last ``span`` bytes)."""
    recordings = [d for d in read_catalog(directory) if d.is_active]
    d = rng.choice(recordings)
    reader = RecordingReader(directory, d)
    end = reader.stop_position
    positions = reader.read_batch(max(d.start_position, end - span), end).positions
    return d.session_id, int(rng.choice(positions)) if len(positions) else end


def join(bus: shmbus.Client, directory: Path, channel: str, from_position: int | str | None,
         live_wanted: int, timeout: float = 60.0, **kwargs: Any) -> dict[int, Seen]:
    """Join with history, read until every session is live with ``live_wanted`` live messages
    (or done); return what came per session, every message checked."""
    seen: dict[int, Seen] = {}

    def handler(payload: memoryview, info: shmbus.MessageInfo) -> None:
        writer, seq = lw.check(payload)
        seen.setdefault(info.session_id, Seen()).add(writer, seq, info.replayed)

    with bus.add_subscription(channel, STREAM, history=shmbus.Recording(directory),
                              from_position=from_position, catch_up=CATCH_UP,
                              **kwargs) as sub:

        def live() -> bool:
            states = sub.positions()
            return bool(sub.is_live and states and all(
                phase == "done" or seen.get(sid, Seen()).live >= live_wanted
                for sid, (phase, _) in states.items()))

        wait_until(live, timeout,
                   lambda: f"live with {live_wanted} live messages per session: "
                           f"{sub.positions()}, behind {sub.behind}",
                   poll=lambda: sub.poll(handler, 4096), longest_pause=0.0002)
    return seen


def check_joined(directory: Path, seen: dict[int, Seen], from_position: int | str,
                 sessions_at_join: set[int], only: int | None = None) -> None:
    """Per session: no error, and the first message is the one at the position asked for."""
    for sid, s in seen.items():
        assert not s.errors, f"session {sid}: {s.errors[:3]}"
        if only is not None:
            assert sid == only
        expected = first_seq(directory, sid, from_position if sid in sessions_at_join
                             else "start")
        assert s.first == expected, (f"session {sid}: first message seq {s.first}, the "
                                     f"recording has {expected} at {from_position}")


class Stream:
    """Publishers at full speed and a recorder, each in its own process."""

    def __init__(self, procs: Processes, context: shmbus.Context, directory: Path,
                 channel: str, writers: int,
                 publisher_context: shmbus.Context | None = None, rate: float = 0) -> None:
        self.procs, self.directory, self.channel, self.rate = procs, directory, channel, rate
        self.context = publisher_context or context
        self.stop = CTX.Event()
        ready = CTX.Event()
        procs.start(lw.record, context, str(directory), channel, STREAM, self.stop, ready,
                    procs.queue)
        assert ready.wait(30), "recorder did not start"
        self.publishers: dict[int, Any] = {}
        # each publisher stops on an Event of its own: one the test SIGKILLs may die holding
        # its Event's lock (is_set takes it), and setting that Event would then block for good
        self.publisher_stops: dict[int, Any] = {}
        self.private_reports: list[Any] = []
        for writer in range(writers):
            self.start_publisher(writer)

    def start_publisher(self, writer: int) -> Any:
        started, stop = CTX.Event(), CTX.Event()
        # a publisher the test kills reports on a queue of its own (see Processes)
        reports = self.procs.private()
        self.private_reports.append(reports)
        process = self.procs.start(lw.publish, self.context, self.channel, STREAM, writer,
                                   stop, reports.queue, started, self.rate)
        assert started.wait(30), f"publisher {writer} did not start"
        self.publishers[writer], self.publisher_stops[writer] = process, stop
        return process

    def wait_recorded(self, sessions: int, nbytes: int, timeout: float = 30) -> None:
        def grown() -> bool:
            active = [d for d in read_catalog(self.directory) if d.is_active]
            return len(active) >= sessions and all(
                RecordingReader(self.directory, d).stop_position - d.start_position >= nbytes
                for d in active)

        wait_until(grown, timeout, lambda: "the recording to grow: ends " + str(
            [RecordingReader(self.directory, d).stop_position
             for d in read_catalog(self.directory) if d.is_active]))

    def close(self) -> None:
        for writer, process in self.publishers.items():
            if process.is_alive():
                self.publisher_stops[writer].set()
        self.stop.set()
        self.procs.wait("recorded", timeout=30)


def test_joins_from_random_positions_get_history_then_live_exactly_once(
        bus_context, driver, procs, shm_dir) -> None:
    directory = shm_dir / "rec"
    stream = Stream(procs, bus_context, directory, "aeron:ipc", writers=2)
    rng = random.Random(28)
    try:
        stream.wait_recorded(2, 256 * 1024)
        with shmbus.connect(bus_context) as bus:
            for i in range(40):
                sid, position = pick_position(directory, rng, rng.choice([1 << 16, 1 << 20]))
                channel = f"aeron:ipc?session-id={sid}"
                seen = join(bus, directory, channel, position, live_wanted=50)
                check_joined(directory, seen, position, {sid}, only=sid)
                assert seen[sid].live >= 50 and seen[sid].count > seen[sid].live
                if i % 10 == 0:  # every session, from the last messages
                    sessions = {d.session_id for d in read_catalog(directory)}
                    seen = join(bus, directory, "aeron:ipc", None, live_wanted=20,
                                last=rng.randrange(0, 2000))
                    assert set(seen) == sessions
                    for sid, s in seen.items():
                        assert not s.errors, f"session {sid}: {s.errors[:3]}"
    finally:
        stream.close()


def test_a_session_that_ended_is_replayed_in_full_and_a_restarted_one_merged(
        bus_context, driver, procs, shm_dir) -> None:
    """Publisher 0 is SIGKILLed mid-stream and started again (a new session); joiners from
    the start get the dead session's every recorded message and the new session's live.
    (Paced publishers: each join replays everything recorded since the start.)"""
    directory = shm_dir / "rec"
    stream = Stream(procs, bus_context, directory, "aeron:ipc", writers=2, rate=20_000)
    rng = random.Random(7)
    try:
        stream.wait_recorded(2, 64 * 1024)
        with shmbus.connect(bus_context) as bus:
            for _ in range(3):
                stream.publishers[0].kill()
                stream.publishers[0].join(10)
                time.sleep(rng.uniform(0, 0.3))  # a join at a random moment: the point
                joined_at = {d.session_id for d in read_catalog(directory)}
                seen = join(bus, directory, "aeron:ipc", "start", live_wanted=30)
                check_joined(directory, seen, "start", joined_at)
                stream.start_publisher(0)
                stream.wait_recorded(2, 32 * 1024)
                # every session the joiner saw and has ended: replayed to its last message
                for d in read_catalog(directory):
                    if not d.is_active and d.session_id in seen:
                        last = list(RecordingReader(directory, d).messages())[-1]
                        assert seen[d.session_id].last == lw.check(last.payload)[1]
            sessions = {d.session_id for d in read_catalog(directory)}
            assert len(sessions) == 5
            seen = join(bus, directory, "aeron:ipc", "start", live_wanted=30)
            assert set(seen) == sessions
            check_joined(directory, seen, "start", sessions)
    finally:
        stream.close()


def test_stress_a_thousand_random_joins_under_load(bus_context, driver, procs,
                                                   shm_dir) -> None:
    """STRESS_JOINS joins at random moments from random recent positions while two
    publishers run at full speed: zero gaps, zero duplicates."""
    directory = shm_dir / "rec"
    stream = Stream(procs, bus_context, directory, "aeron:ipc", writers=2)
    rng = random.Random(1000)
    messages = 0
    try:
        stream.wait_recorded(2, 128 * 1024)
        with shmbus.connect(bus_context) as bus:
            for _ in range(STRESS_JOINS):
                time.sleep(rng.uniform(0, 0.002))  # joins at random moments: the point
                sid, position = pick_position(directory, rng, rng.choice([1 << 12, 1 << 16]))
                seen = join(bus, directory, f"aeron:ipc?session-id={sid}", position,
                            live_wanted=5)
                check_joined(directory, seen, position, {sid}, only=sid)
                messages += seen[sid].count
    finally:
        stream.close()
    assert messages > STRESS_JOINS * 5


def test_a_joiner_that_dies_holding_the_publisher_lets_it_go(
        bus_context, driver, procs, shm_dir) -> None:
    """A joiner whose live image waits ahead of its replay holds the publisher (tethered, as
    any subscriber); SIGKILLed there, the driver times its client out and the publisher goes
    on."""
    directory = shm_dir / "rec"
    stream = Stream(procs, bus_context, directory, "aeron:ipc", writers=1)
    window = bus_context.ipc_term_length // 2
    try:
        stream.wait_recorded(1, 1 << 20)
        reports = procs.private()
        holder = procs.start(lw.hold, bus_context, str(directory), reports.queue)
        [held] = reports.wait("holding")
        assert held["join"] > held["replayed_to"], "the live image did not join ahead"
        reader = RecordingReader(directory, 0)
        # the publisher runs up to a window past the live image's join, and no further
        wait_until(lambda: reader.stop_position >= held["join"] + window - 4096, 30,
                   "the publisher to reach the holder's window")
        assert reader.stop_position <= held["join"] + window + 4096, "publisher not held"
        holder.kill()
        holder.join(10)
        wait_until(lambda: reader.stop_position >= held["join"] + window + (1 << 20), 20,
                   "the publisher to go on after the kill")
    finally:
        stream.close()


def test_a_joiner_stopped_past_its_liveness_in_a_live_message_raises(
        bus_context, driver, procs, shm_dir) -> None:
    """A joiner stopped (SIGSTOP) inside the handler of a live message, past its client
    liveness timeout, is dropped by the driver and the publisher laps the log under it: the
    message it then reads may be torn, so the poll it was stopped in must raise
    ClientTimeoutError (as a plain subscription's does), never return as if it were whole.
    The nemesis' late joiner met this as a corrupt message (issue 35)."""
    directory = shm_dir / "rec"
    stream = Stream(procs, bus_context, directory, "aeron:ipc", writers=1)
    try:
        stream.wait_recorded(1, 256 * 1024)
        reports = procs.private()
        joiner = procs.start(lw.stop_in_live, bus_context, str(directory), reports.queue)
        deadline = time.monotonic() + 60
        wait_until(lambda: psutil.Process(joiner.pid).status() == psutil.STATUS_STOPPED, 60,
                   "the joiner to stop itself")
        # dropped by the driver, its log lapped by the publisher (which the recorder paces)
        recorded = RecordingReader(directory, 0).stop_position
        reader = RecordingReader(directory, 0)
        wait_until(lambda: reader.stop_position >= recorded + 4 * bus_context.ipc_term_length,
                   time_left(deadline), "the publisher to lap the stopped joiner's log")
        os.kill(joiner.pid, signal.SIGCONT)
        [report] = reports.wait("stopped-in-live")
    finally:
        stream.close()
    assert report["outcome"] == "ClientTimeoutError", (
        f"the poll returned after its client was timed out (the message read after the stop "
        f"was {'whole' if report['whole'] else 'torn'}; later polls handed out "
        f"{report['later']})")
    assert report["later"] == [], "a poll after the one it was stopped in handed messages out"


def test_a_replay_that_ends_in_a_large_message_goes_on_from_its_reference_frame(
        bus_context, driver, shm_dir) -> None:
    """A large message is a 64-byte reference frame in the log and in the recording, whatever
    its length: a replay whose batch ends with one goes on (and goes live) just after that
    frame. (It took the message's length for its frames, jumped that far ahead and handed
    out nothing more.) Each message's end_position is the end of its frame."""
    directory = shm_dir / "rec"
    large = max_message_length(bus_context.ipc_term_length) + 1000

    def payload(i: int) -> bytes:
        return i.to_bytes(4, "little") * ((large if i % 10 == 9 else 48) // 4)

    with shmbus.connect(bus_context) as bus, \
            bus.add_recorder(directory, "aeron:ipc", STREAM) as recorder:
        pub = bus.add_exclusive_publication("aeron:ipc", STREAM)
        sent: list[int] = []  # the position after each message
        deadline = time.monotonic() + 30

        def publish_to(count: int) -> None:
            while len(sent) < count:
                assert time.monotonic() < deadline, "the publisher was never connected"
                result = pub.offer(payload(len(sent)))
                if result > 0:
                    sent.append(result)
                recorder.poll()

        publish_to(40)  # the 40th (index 39) is large: the recording ends with it
        while max(recorder.positions.values()) < sent[-1]:
            assert time.monotonic() < deadline, "not recorded"
            recorder.poll()
        got: list[tuple[int, int, bool]] = []
        with bus.add_subscription("aeron:ipc", STREAM, history=shmbus.Recording(directory),
                                  from_position="start") as late:
            while len(got) < 80:
                assert time.monotonic() < deadline, f"only {len(got)} messages: {got[-3:]}"
                late.poll(lambda p, info: got.append((int.from_bytes(p[:4], "little"),
                                                      info.end_position, info.replayed)), 100)
                publish_to(min(80, len(sent) + 1))
                recorder.poll()
    assert [i for i, _, _ in got] == list(range(80))
    assert [end for _, end, _ in got] == sent, "an end_position is not its frame's end"
    assert got[39][2] and not got[-1][2], "not replayed, then live"


def test_over_udp_with_loss(procs, shm_dir) -> None:
    """Publishers on one bus, the recorder and the joiners on another, across two netbridges
    dropping, duplicating and reordering datagrams: the same exactly-once seam."""
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, "drop=0.03,dup=0.02,reorder=0.03,seed=28")
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    directory = shm_dir / "rec"
    rng = random.Random(17)
    stream = None
    try:
        stream = Stream(procs, ctx_b, directory, channel, writers=2, publisher_context=ctx_a)
        stream.wait_recorded(2, 256 * 1024)
        with shmbus.connect(ctx_b) as bus:
            for i in range(20):
                if i % 10 == 9:
                    seen = join(bus, directory, channel, "start" if i == 9 else None,
                                live_wanted=20, **({} if i == 9 else {"last": 500}))
                    for sid, s in seen.items():
                        assert not s.errors, f"session {sid}: {s.errors[:3]}"
                    continue
                sid, position = pick_position(directory, rng, rng.choice([1 << 16, 1 << 20]))
                seen = join(bus, directory, f"{channel}|session-id={sid}", position,
                            live_wanted=30)
                check_joined(directory, seen, position, {sid}, only=sid)
                assert seen[sid].live >= 30
        with shmbus.connect(ctx_b) as bus:
            counters = {c.label.split(":")[0]: c.value for c in bus.counters.counters()
                        if c.type_id >= 100}
        assert counters["naks sent"] > 0, "no loss was injected"
    finally:
        if stream is not None:
            stream.close()
        for process in drivers:
            stop_driver(process)


def test_a_pool_of_workers_reprocesses_a_range_of_a_recording(
        bus_context, driver, procs, shm_dir) -> None:
    """A new group from a position in the recording: the range [from, to) replayed onto a
    stream that a subscription group of worker processes reads; each message of the range
    goes to exactly one worker, each worker's in order."""
    directory = shm_dir / "rec"
    stream = Stream(procs, bus_context, directory, "aeron:ipc", writers=1, rate=20_000)
    try:
        stream.wait_recorded(1, 128 * 1024)
    finally:
        stream.close()
    reader = RecordingReader(directory, read_catalog(directory)[0])
    recorded = list(reader.messages())
    first, end = len(recorded) // 4, 3 * len(recorded) // 4
    wanted = [lw.check(m.payload) for m in recorded[first:end]]
    stop = CTX.Event()
    for _ in range(3):
        joined = CTX.Event()
        procs.start(lw.reprocess, bus_context, 3001, "reprocess", joined, stop, procs.queue)
        assert joined.wait(30), "a worker did not join"
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_exclusive_publication("aeron:ipc", 3001)
        assert replay(reader, publication, recorded[first].position,
                      recorded[end].position) == len(wanted)
        by_worker: dict[int, list[tuple[int, int]]] = {}
        while sum(map(len, by_worker.values())) < len(wanted):
            report = procs.wait("taken", timeout=60)[0]
            by_worker.setdefault(report["pid"], []).extend(map(tuple, report["taken"]))
    stop.set()
    assert sorted(t for worker in by_worker.values() for t in worker) == sorted(wanted)
    assert all(worker == sorted(worker) for worker in by_worker.values())


def test_bad_requests_name_what_is_wrong(bus_context, driver, shm_dir) -> None:
    directory = shm_dir / "rec"
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", STREAM)
        with bus.add_recorder(directory, "aeron:ipc", STREAM) as recorder:
            for i in range(100):
                pub.publish(lw.message(0, i), timeout=5)
            deadline = time.monotonic() + 10
            while recorder.poll() or RecordingReader(directory, 0).stop_position < pub.position:
                assert time.monotonic() < deadline
            history = shmbus.Recording(directory)
            with pytest.raises(ValueError, match="past the end"):
                bus.add_subscription("aeron:ipc", STREAM, history=history,
                                     from_position=pub.position + 4096)
            with pytest.raises(ValueError, match="not the start of a message"):
                bus.add_subscription("aeron:ipc", STREAM, history=history, from_position=96)
            with pytest.raises(ValueError, match="multiple of 32"):
                bus.add_subscription("aeron:ipc", STREAM, history=history, from_position=33)
            with pytest.raises(ValueError, match="from_position or last"):
                bus.add_subscription("aeron:ipc", STREAM, history=history, from_position=0,
                                     last=3)
            with pytest.raises(ValueError, match="need a history"):
                bus.add_subscription("aeron:ipc", STREAM, last=3)
            with pytest.raises(shmbus.ChannelUriError, match="join-position"):
                bus.add_subscription("aeron:ipc?join-position=64", STREAM, history=history)
            with pytest.raises(shmbus.RecordingError, match="does not exist"):
                bus.add_subscription("aeron:ipc", STREAM,
                                     history=shmbus.Recording(shm_dir / "nothing"))
