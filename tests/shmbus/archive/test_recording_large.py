"""Recordings keep large messages (kept in shared memory on the bus, referred to from the log):
the payload goes into the segment's side file, the frame stays at its stream position, and
RecordingReader, replay and the Spark source hand out the original bytes, in stream order.

Real processes: a writer of small and large (300 KB, 5 MB) messages, a recorder process and a
live subscriber; then the recording is read, replayed to a live subscriber process and read by
Spark. Every message is checked by length and crc32 against what the writer published.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from typing import Any

import pytest

import shmbus
from shmbus import RecordingReader
from shmbus.archive.catalog import (
    CATALOG_FILE,
    STOPPED,
    DiskFullError,
    live_position,
    read_catalog,
)
from shmbus.archive.large_payloads import (
    RECORDED_REFERENCE_LENGTH,
    decode_recorded_reference,
    large_path,
)
from shmbus.archive.recorder import recover_directory
from shmbus.archive.recording_reader import _read_block, replay
from shmbus.shm.log_buffer import HEADER_LENGTH, max_message_length
from tests.support.processes import CTX
from tests.support.recording_helpers import bus_env
from tests.support.waits import wait_until
from tests.support.workers import large_recording_workers as lw

pytestmark = pytest.mark.timeout(300)

LIVE_STREAM, REPLAY_STREAM = 51, 52
SEED = 7
#: a reference frame: its header and the 32-byte reference, on the bus and in a recording
REFERENCE_FRAME = 2 * HEADER_LENGTH


def test_large_messages_are_recorded_read_replayed_and_read_by_spark(
        bus_context, driver, procs, tmp_path, spark) -> None:  # noqa: F811
    directory = tmp_path / "rec"
    expected = lw.expected_mix(SEED)
    max_message = max_message_length(bus_context.ipc_term_length)
    assert sum(len(p) > max_message for p in expected) == 4  # the mix has large messages

    stop = CTX.Event()
    go = CTX.Event()
    procs.start(lw.record, bus_context, str(directory), LIVE_STREAM, stop, procs.queue)
    procs.start(lw.collect, bus_context, LIVE_STREAM, len(expected), procs.queue)
    procs.start(lw.publish_mix, bus_context, LIVE_STREAM, SEED, go, stop, procs.queue)
    procs.wait("publication")
    procs.wait("subscribed")
    procs.wait("recording")
    go.set()
    [published] = procs.wait("published", timeout=120)
    [live] = procs.wait("collected", timeout=120)
    assert live["crcs"] == lw.crcs(expected)  # the live subscriber saw the mix
    ends = published["ends"]

    def recorded_to_the_end() -> Any:
        [entry] = read_catalog(directory)
        return entry if RecordingReader(directory, entry).stop_position >= ends[-1] else None

    entry = wait_until(recorded_to_the_end, 60,
                       f"the recorder to reach the writer's last position {ends[-1]}")
    stop.set()
    [recorded] = procs.wait("recorded", timeout=60)
    assert recorded["positions"] == {entry.recording_id: ends[-1]}

    # RecordingReader: the original bytes, at the live stream's positions
    reader = RecordingReader(directory, entry.recording_id)
    assert reader.descriptor.state == STOPPED and reader.stop_position == ends[-1]
    messages = list(reader.messages())
    assert lw.crcs([m.payload for m in messages]) == lw.crcs(expected)
    assert [m.payload for m in messages] == expected
    assert [m.reserved_value for m in messages] == list(range(len(expected)))
    starts = [0, *ends[:-1]]
    for message, start, end, payload in zip(messages, starts, ends, expected, strict=True):
        assert start <= message.position < end
        if len(payload) > max_message:  # still its 64-byte reference frame, at its position
            assert (message.position, end) == (start, start + REFERENCE_FRAME)
    # the payloads are out of line: the segment holds the frames, the side file the payloads
    base = entry.segment_base(0)
    segment = _read_block(entry.segment_path(directory, base), 0, ends[-1])
    side = large_path(entry, directory, base)
    large = [(m, p) for m, p in zip(messages, expected, strict=True) if len(p) > max_message]
    assert side.stat().st_size == sum(len(p) for _, p in large)
    for message, payload in large:
        at = message.position + HEADER_LENGTH
        offset, length = decode_recorded_reference(
            segment[at:at + RECORDED_REFERENCE_LENGTH].tobytes())
        assert length == len(payload)
        with open(side, "rb") as f:
            f.seek(offset)
            assert zlib.crc32(f.read(length)) == zlib.crc32(payload)
    # one message per read range: ranges that split the stream read every message once
    halves = [*reader.messages(0, ends[3]), *reader.messages(ends[3])]
    assert [m.payload for m in halves] == expected

    # replay onto a new IPC publication: a live subscriber process gets the same bytes, and
    # the large messages travel as large messages again (the same positions as the original)
    procs.start(lw.collect, bus_context, REPLAY_STREAM, len(expected), procs.queue)
    procs.wait("subscribed")
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", REPLAY_STREAM)
        wait_until(lambda: pub.is_connected, 30, "the replay's subscriber")
        assert replay(reader, pub) == len(expected)
        assert pub.position == ends[-1]
        [replayed] = procs.wait("collected", timeout=120)
    assert replayed["crcs"] == lw.crcs(expected)

    # the Spark source reads the same bytes in stream order
    rows = (spark.read.format("shmbus").option("path", str(directory)).load()
            .select("position", "reserved_value", "payload").orderBy("position").collect())
    assert [r.position for r in rows] == [m.position for m in messages]
    assert [r.reserved_value for r in rows] == list(range(len(expected)))
    assert lw.crcs([bytes(r.payload) for r in rows]) == lw.crcs(expected)


def test_a_damaged_side_file_is_a_clear_error(bus_context, driver, tmp_path) -> None:
    directory = tmp_path / "rec"
    payload = lw.mix_payload(1, 0, 100_000)
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 53)
        with bus.add_recorder(directory, "aeron:ipc", 53) as recorder:
            wait_until(lambda: pub.is_connected, 10, "the recorder's subscription")
            end = pub.publish(payload)
            wait_until(lambda: recorder.positions and max(recorder.positions.values()) >= end,
                       10, "the recording", poll=recorder.poll)
    [entry] = read_catalog(directory)
    assert [m.payload for m in RecordingReader(directory, entry).messages()] == [payload]
    side = large_path(entry, directory, 0)
    with open(side, "r+b") as f:
        f.truncate(50_000)
    with pytest.raises(shmbus.RecordingError, match="cut short.*ends at 50000"):
        list(RecordingReader(directory, entry).messages())
    side.unlink()
    with pytest.raises(shmbus.RecordingError, match="missing.*does not exist"):
        list(RecordingReader(directory, entry).messages())


def test_a_full_disk_during_a_large_message_stops_cleanly(bus_context, driver,
                                                          tiny_tmpfs) -> None:
    """The 512 KiB file system fills up while a large payload is written: DiskFullError, and
    every message recorded before it reads back exactly; the side file holds no stray bytes."""
    directory = tiny_tmpfs / "rec"
    sent: list[bytes] = []
    with shmbus.connect(bus_context) as bus:
        recorder = bus.add_recorder(directory, "aeron:ipc", 54, segment_length=65536)
        pub = bus.add_exclusive_publication("aeron:ipc", 54)
        wait_until(lambda: recorder.recordings, 10, "the image", poll=recorder.poll)
        error = None
        deadline = time.monotonic() + 30
        while error is None:
            i = len(sent)
            payload = lw.mix_payload(2, i, 150_000 if i % 2 else 3000)
            while pub.offer(payload) < 0:
                assert time.monotonic() < deadline, "the file system never filled up"
                try:
                    recorder.poll()
                except DiskFullError as e:
                    error = e
                    break
            else:
                sent.append(payload)
            try:
                recorder.poll()
            except DiskFullError as e:
                error = e
        assert recorder.recordings == []  # every recording stopped
        recorder.close()
    assert "file system is full" in str(error)
    [entry] = read_catalog(directory)
    assert entry.state == STOPPED and entry.stop_reason.startswith("disk full")
    got = [m.payload for m in RecordingReader(directory, entry).messages()]
    assert len(got) >= 3 and got == sent[:len(got)]
    assert sum(len(p) > 100_000 for p in got) >= 1
    side = large_path(entry, directory, 0)
    assert side.stat().st_size == sum(len(p) for p in got if len(p) > 100_000)


def test_a_recorder_keeps_up_with_large_messages_from_a_thread(bus_context, driver,
                                                                tmp_path) -> None:
    """A concurrent writer thread and a recorder run together (the recorder holds each block
    only while it copies it); every message comes back in order."""
    directory = tmp_path / "rec"
    payloads = [lw.mix_payload(3, i, n) for i, n in enumerate([7000, 10, 5000, 1_000_000] * 10)]
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 55)
        with bus.add_recorder(directory, "aeron:ipc", 55, segment_length=65536) as rec:
            wait_until(lambda: pub.is_connected, 10, "the recorder's subscription")
            ends: list[int] = []
            writer = threading.Thread(
                target=lambda: ends.extend(pub.publish(p, timeout=30) for p in payloads))
            writer.start()
            wait_until(lambda: len(ends) == len(payloads) and max(rec.positions.values())
                       >= ends[-1], 60, "the recording", poll=rec.poll)
            writer.join(10)
    [entry] = read_catalog(directory)
    got = list(RecordingReader(directory, entry).messages())
    assert [m.payload for m in got] == payloads
    # a segment of 64 KiB holds 64-byte reference frames; the payloads are in side files
    assert len(list(entry.directory(directory).glob("*.large"))) >= 2


def test_a_sigkilled_recorder_keeps_every_large_message_it_committed(bus_context, driver,
                                                                      tmp_path) -> None:
    """``shmbus record`` SIGKILLed while large and small messages stream in (possibly in the
    middle of a payload): recovery keeps a prefix of the stream, every message exact."""
    directory = tmp_path / "rec"
    command = [sys.executable, "-m", "shmbus", "record", str(directory), "--stream", "56",
               "--segment-length", "65536"]
    recorder = subprocess.Popen(command, env=bus_env(bus_context), stderr=subprocess.PIPE)
    sent: list[bytes] = []
    try:
        with shmbus.connect(bus_context) as bus:
            pub = bus.add_exclusive_publication("aeron:ipc", 56)
            wait_until(lambda: pub.is_connected, 30, "the recorder subscribed")
            deadline = time.monotonic() + 60
            seen_live = 0
            for i in range(100_000):
                payload = lw.mix_payload(4, i, (3000, 200_000, 50, 2_000_000)[i % 4])
                pub.publish(payload, timeout=30)
                sent.append(payload)
                if i % 8 == 7 and (directory / CATALOG_FILE).exists():
                    seen_live = live_position(directory, read_catalog(directory)[0])
                    if seen_live > 2 * 65536 and i > 40:
                        break
                assert time.monotonic() < deadline, "the recorder did not get far in 60 s"
            for _ in range(2):  # kill it mid-stream
                pub.publish(lw.mix_payload(4, len(sent), 3_000_000), timeout=30)
                sent.append(lw.mix_payload(4, len(sent), 3_000_000))
            os.kill(recorder.pid, signal.SIGKILL)
            recorder.wait(30)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
    (recovered,) = recover_directory(directory)
    assert recovered.stop_position >= seen_live
    got = [m.payload for m in RecordingReader(directory, recovered).messages()]
    assert len(got) > 40 and got == sent[:len(got)]
