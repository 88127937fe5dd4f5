"""Recordings: the recorder's files, reading them without a bus, crash recovery, disk full,
and the ``shmbus record`` / ``shmbus replay`` commands.

The first tests drive the recorder's writer from an in-memory log (tests/shmbus/
recording_helpers.py) and need no bus; the later ones record real streams through a driver.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shmbus
from shmbus.archive.catalog import (
    CATALOG_FILE,
    INDEX_DTYPE,
    STOPPED,
    DiskFullError,
    RecordingError,
    encode_position,
    find_recording,
    live_position,
    read_catalog,
)
from shmbus.archive.recorder import recover_directory, recover_recording
from shmbus.archive.recording_reader import RecordingReader, scan_frames
from shmbus.shm.log_buffer import HEADER_LENGTH, encode_data_header
from tests.support.recording_helpers import FakeLog, bus_env, random_payloads, start_recording
from tests.support.waits import wait_until

DEADLINE_S = 20.0


def finish(catalog, writer, reason: str = "test"):
    entry = writer.finish(reason)
    catalog.put(entry)
    catalog.close()
    return entry


def recorded_bytes(root: Path, d, start: int, stop: int) -> bytes:
    """The recording's bytes [start, stop) read from its segment files."""
    out = bytearray()
    position = start
    while position < stop:
        base = d.segment_base(position)
        end = min(stop, base + d.segment_length)
        with open(d.segment_path(root, base), "rb") as f:
            f.seek(position - base)
            out += f.read(end - position)
        position = end
    return bytes(out)


# -- the writer, without a bus ------------------------------------------------------------------


@pytest.mark.parametrize("initial_term_id", [7, 2**31 - 3])
def test_files_hold_the_log_byte_for_byte_across_terms_pads_and_segments(
        tmp_path, initial_term_id) -> None:
    log = FakeLog(initial_term_id=initial_term_id)
    catalog, writer = start_recording(tmp_path, log, segment_length=131072)
    rng = random.Random(3)
    for i, payload in enumerate(random_payloads(1, 700)):
        log.append(payload, reserved_value=i * 1000 - 7)
        if i % 97 == 50:
            log.pad(96)  # a PAD in the middle of a term (an unblocked publication)
        if rng.random() < 0.3:
            log.poll_into(writer, fragment_limit=rng.choice([1, 3, 7, 64]))
    log.drain_into(writer, fragment_limit=5)
    entry = finish(catalog, writer)
    d = entry
    assert d.stop_position == log.position
    assert log.position > 7 * d.segment_length  # many terms and segments
    # byte for byte: every term as the log had it (PAD bodies are zeros in both)
    for index in range(log.position // log.term_length + 1):
        lo = index * log.term_length
        hi = min(log.position, lo + log.term_length)
        if hi > lo:
            assert recorded_bytes(tmp_path, d, lo, hi) == log.terms[index][:hi - lo].tobytes()
    # segments: fixed size, named by start position; the last one cut at the stop position
    seg_files = sorted(d.directory(tmp_path).glob("*.seg"))
    assert [int(p.stem) for p in seg_files] == list(range(0, log.position, d.segment_length))
    assert all(p.stat().st_size == d.segment_length for p in seg_files[:-1])
    assert seg_files[-1].stat().st_size == log.position - int(seg_files[-1].stem)
    # whole messages back, with their positions and reserved values
    reader = RecordingReader(tmp_path, d.recording_id)
    got = [(m.position, m.payload, m.reserved_value) for m in reader.messages()]
    assert got == log.messages
    batch = reader.read_batch()
    assert batch.positions.tolist() == [m[0] for m in log.messages]
    assert batch.lengths.tolist() == [len(m[1]) for m in log.messages]
    assert batch.payloads() == [m[1] for m in log.messages]
    term_ids = (initial_term_id + batch.positions // log.term_length + 2**31) % 2**32 - 2**31
    assert batch.term_ids.tolist() == term_ids.tolist()
    assert batch.term_offsets.tolist() == (batch.positions % log.term_length).tolist()
    # record times: known, ordered, within the recording's times
    assert np.all(np.diff(batch.record_times) >= 0)
    assert batch.record_times[0] >= d.start_time_ns and batch.record_times[-1] <= d.stop_time_ns


def test_consecutive_ranges_read_every_message_exactly_once(tmp_path) -> None:
    log = FakeLog(start_position=3 * 65536 + 4096)  # joined mid-term
    catalog, writer = start_recording(tmp_path, log, segment_length=65536)
    for payload in random_payloads(2, 400):
        log.append(payload)
    log.drain_into(writer, fragment_limit=9)
    d = finish(catalog, writer)
    reader = RecordingReader(tmp_path, d.recording_id)
    rng = random.Random(5)
    for _ in range(5):
        cuts = sorted(rng.sample(range(d.start_position, d.stop_position), 30))
        bounds = [None, *cuts, None]
        got = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            got.extend((m.position, m.payload) for m in reader.messages(lo, hi))
        assert got == [(p, m) for p, m, _ in log.messages]
    # a range inside one message's fragments gives nothing; from its start gives it
    fragmented = next(p for p, m, _ in log.messages if len(m) > 3000)
    assert list(reader.messages(fragmented + 32, fragmented + 1500)) == []
    assert next(reader.messages(fragmented, fragmented + 1)).position == fragmented


def test_padding_longer_than_a_read_chunk(tmp_path) -> None:
    log = FakeLog(term_length=262144)
    catalog, writer = start_recording(tmp_path, log, segment_length=262144)
    log.append(b"before")
    log.pad(200_000)  # an unblocked publication padded most of a term
    log.append(b"after" * 100)
    log.drain_into(writer)
    d = finish(catalog, writer)
    reader = RecordingReader(tmp_path, d)
    for chunk in (1, 70_000, 1 << 20):  # at least 2 x max message: 68 KiB here
        got = [(b.positions.tolist(), b.payloads())
               for b in reader.read_batches(chunk_length=chunk)]
        assert [(p, m) for ps, ms in got for p, m in zip(ps, ms, strict=True)] == [
            (p, m) for p, m, _ in log.messages]
    (entry,) = [recover_recording(tmp_path, d.with_(state="active", stop_position=None))]
    assert entry.stop_position == d.stop_position


def test_payload_bytes_that_look_like_headers_are_not_frames(tmp_path) -> None:
    log = FakeLog(mtu=4096)
    catalog, writer = start_recording(tmp_path, log)
    log.append(b"first")
    for _ in range(3):
        # the next message's payload starts at p; its slot k is at p + 32 k: put there a header
        # that is right for that position, as a recording of a recording might
        p = log.position + HEADER_LENGTH
        payload = bytearray(2000)
        for k, length in ((1, 64), (5, 3000), (20, 40)):
            at = p + 32 * k
            term_id = log.initial_term_id + at // log.term_length
            payload[32 * k:32 * k + 32] = encode_data_header(
                length, 0xC0, 1, at % log.term_length, log.session_id, log.stream_id, term_id)
        log.append(bytes(payload))
        log.append(b"after")
    log.drain_into(writer)
    d = finish(catalog, writer)
    got = [(m.position, m.payload) for m in RecordingReader(tmp_path, d).messages()]
    assert got == [(p, m) for p, m, _ in log.messages]


def test_live_reads_see_whole_messages_only(tmp_path) -> None:
    log = FakeLog()
    catalog, writer = start_recording(tmp_path, log)
    reader = RecordingReader(tmp_path, 0)
    seen = 0
    for i, payload in enumerate(random_payloads(4, 300, max_length=7000)):
        log.append(payload, reserved_value=i)
        log.poll_into(writer, fragment_limit=2)  # batches often end inside a message
        live = live_position(tmp_path, find_recording(tmp_path, 0))
        assert live <= writer.stop
        got = [(m.position, m.payload) for m in reader.messages()]
        assert got == [(p, m) for p, m, _ in log.messages[:len(got)]]
        assert len(got) >= seen
        seen = len(got)
    log.drain_into(writer)
    assert len(list(reader.messages())) == len(log.messages)
    finish(catalog, writer)


class Killed(BaseException):
    pass


@pytest.mark.parametrize("torn", [False, True])
def test_killed_at_any_write_recovers_what_was_written(tmp_path, monkeypatch, torn) -> None:
    """Stop the writer (as SIGKILL would) at each of its writes in turn, torn or not: the
    recovered recording is exactly the frames committed, messages a prefix of the stream."""
    payloads = random_payloads(6, 60, max_length=5000)

    def run(root: Path, kill_at: int | None) -> tuple[FakeLog, int]:
        calls = [0]
        real = os.pwrite

        def pwrite(fd, data, offset):
            calls[0] += 1
            if kill_at is not None and calls[0] == kill_at:
                if torn and len(data) > 1:
                    real(fd, memoryview(data).cast("B")[:len(data) // 2], offset)
                raise Killed
            return real(fd, data, offset)

        log = FakeLog()
        catalog, writer = start_recording(root, log, segment_length=65536)
        committed = log.position
        monkeypatch.setattr(os, "pwrite", pwrite)
        try:
            for payload in payloads:
                log.append(payload)
                log.poll_into(writer, fragment_limit=3)
                committed = writer.stop
            log.drain_into(writer, fragment_limit=3)
            committed = writer.stop
        except Killed:
            pass
        finally:
            monkeypatch.setattr(os, "pwrite", real)
            for segment in (writer._segment, *writer._retired):
                if segment is not None:
                    os.close(segment.fd)
                    os.close(segment.index_fd)
            os.close(writer._position_fd)
            catalog.close()
        return log, committed if kill_at is not None else calls[0]

    _, total_calls = run(tmp_path / "count", None)
    points = sorted(set(range(1, 40)) | set(range(40, total_calls + 1, 7)))
    for kill_at in points:
        root = tmp_path / f"k{kill_at}"
        log, committed = run(root, kill_at)
        (entry,) = recover_directory(root)
        assert entry.state == STOPPED and entry.stop_reason.startswith("recovered")
        # nothing committed is lost; at most the frames of the write in progress are extra
        assert committed <= entry.stop_position <= log.position
        got = [(m.position, m.payload) for m in RecordingReader(root, 0).messages()]
        assert got == [(p, m) for p, m, _ in log.messages[:len(got)]]
        expected_whole = sum(1 for p, m, _ in log.messages
                             if p + HEADER_LENGTH + len(m) <= entry.stop_position)
        assert len(got) >= expected_whole - 1
        d = find_recording(root, 0)
        if entry.stop_position > d.start_position:
            last = d.segment_path(root, d.segment_base(entry.stop_position - 1))
            assert last.stat().st_size == entry.stop_position - d.segment_base(
                entry.stop_position - 1)
        assert recover_directory(root) == []  # recovering twice changes nothing


def test_recovery_cuts_a_torn_frame_and_garbage_off(tmp_path) -> None:
    log = FakeLog()
    catalog, writer = start_recording(tmp_path, log, segment_length=65536)
    for payload in random_payloads(8, 20, max_length=800):
        log.append(payload)
    log.drain_into(writer)
    stop = writer.stop
    fd = writer._segment.fd
    d = writer.descriptor
    # a frame whose header was written but names another term (torn / stale bytes), then junk
    bad = encode_data_header(200, 0xC0, 1, stop % d.term_length, d.session_id, d.stream_id,
                             d.initial_term_id + 5)
    os.pwrite(fd, bad + b"\xff" * 300, stop)
    os.close(fd)
    os.close(writer._segment.index_fd)
    os.close(writer._position_fd)
    catalog.close()
    entry = recover_recording(tmp_path, d)
    assert entry.stop_position == stop
    path = d.segment_path(tmp_path, 0)
    assert path.stat().st_size == stop
    assert len(list(RecordingReader(tmp_path, entry).messages())) == len(log.messages)


def test_a_second_writer_of_a_directory_is_refused(tmp_path) -> None:
    log = FakeLog()
    catalog, writer = start_recording(tmp_path, log)
    with pytest.raises(RecordingError, match=f"in use by another recorder .pid {os.getpid()}"):
        recover_directory(tmp_path)
    finish(catalog, writer)
    assert recover_directory(tmp_path) == []


def test_scan_finds_nothing_in_zeros_and_stops_at_damage(tmp_path) -> None:
    log = FakeLog()
    catalog, writer = start_recording(tmp_path, log)
    for payload in random_payloads(9, 10, max_length=300):
        log.append(payload)
    log.drain_into(writer)
    d = finish(catalog, writer)
    block = np.frombuffer(recorded_bytes(tmp_path, d, 0, d.stop_position), np.uint8)
    assert scan_frames(block, 0, d).end == d.stop_position
    assert scan_frames(np.zeros(4096, np.uint8), 0, d).end == 0
    damaged = block.copy()
    second = int(scan_frames(block, 0, d).slots[1]) * HEADER_LENGTH
    damaged[second + 12:second + 16] = 0xEE  # the second frame's session id
    assert scan_frames(damaged, 0, d).end == second


def test_position_file_and_index_formats(tmp_path) -> None:
    from shmbus.archive.catalog import read_position_file

    path = tmp_path / "position"
    path.write_bytes(encode_position(4096, 123))
    assert read_position_file(path) == (4096, 123)
    assert INDEX_DTYPE.itemsize == 16


# -- through the bus ----------------------------------------------------------------------------


def test_records_every_session_with_fragments_and_term_rotations(bus_context, driver,
                                                                 tmp_path) -> None:
    with shmbus.connect(bus_context) as bus:
        recorder = bus.add_recorder(tmp_path / "rec", "aeron:ipc", 31, segment_length=131072,
                                    fsync="segment")
        publications = [bus.add_exclusive_publication("aeron:ipc", 31) for _ in range(3)]
        wait_until(lambda: len(recorder.recordings) == 3, DEADLINE_S, "3 images",
                   poll=recorder.poll)
        sent: dict[int, list[tuple[bytes, int]]] = {p.session_id: [] for p in publications}
        rng = random.Random(11)
        for i, payload in enumerate(random_payloads(12, 1500, max_length=8000)):
            publication = rng.choice(publications)
            deadline = time.monotonic() + DEADLINE_S
            while publication.offer(payload, reserved_value=i) < 0:
                recorder.poll()
                assert time.monotonic() < deadline, "back-pressured for too long"
            sent[publication.session_id].append((payload, i))
        ends = {p.session_id: p.position for p in publications}
        wait_until(lambda: all(recorder.positions[r.recording_id] >= ends[r.session_id]
                               for r in recorder.recordings), DEADLINE_S,
                   "everything recorded", poll=recorder.poll)
        for publication in publications:
            publication.close()
        wait_until(lambda: not recorder.recordings, DEADLINE_S,
                   "recordings stopped when their images went away", poll=recorder.poll)
        recorder.close()
        logs = {p.session_id: p.log.descriptor for p in publications}
    catalog = read_catalog(tmp_path / "rec")
    assert len(catalog) == 3
    for d in catalog:
        log = logs[d.session_id]
        assert (d.channel, d.stream_id, d.state) == ("aeron:ipc", 31, STOPPED)
        assert d.stop_reason in ("end of stream", "image unavailable")
        assert (d.initial_term_id, d.term_length, d.mtu) == (log.initial_term_id,
                                                             log.term_length, log.mtu)
        assert d.start_position == 0 and d.stop_position == ends[d.session_id]
        assert d.stop_position > 5 * d.term_length  # rotated through terms more than once
        assert d.start_time_ns <= d.stop_time_ns
        got = [(m.payload, m.reserved_value) for m in RecordingReader(tmp_path / "rec",
                                                                       d).messages()]
        assert got == sent[d.session_id]


def test_sigkilled_recorder_loses_nothing_it_wrote(bus_context, driver, tmp_path) -> None:
    directory = tmp_path / "rec"
    command = [sys.executable, "-m", "shmbus", "record", str(directory), "--stream", "32",
               "--segment-length", "65536"]
    recorder = subprocess.Popen(command, env=bus_env(bus_context), stderr=subprocess.PIPE)
    try:
        with shmbus.connect(bus_context) as bus:
            publication = bus.add_exclusive_publication("aeron:ipc", 32)
            wait_until(lambda: publication.is_connected, DEADLINE_S, "the recorder subscribed")
            sent = []
            seen_live = 0
            deadline = time.monotonic() + DEADLINE_S
            for i in range(100_000):
                payload = i.to_bytes(4, "little") * (1 + i % 600)  # up to 2400 bytes
                publication.publish(payload, timeout=DEADLINE_S)
                sent.append(payload)
                if i % 200 == 0 and os.path.exists(directory / CATALOG_FILE):
                    seen_live = live_position(directory, read_catalog(directory)[0])
                    if seen_live > 5 * 65536:
                        break
                assert time.monotonic() < deadline
            os.kill(recorder.pid, signal.SIGKILL)  # while the publisher is still going
            recorder.wait(DEADLINE_S)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
    (entry,) = read_catalog(directory)
    assert entry.state == "active"  # as the killed recorder left it
    (recovered,) = recover_directory(directory)
    assert recovered.stop_position >= seen_live
    got = [m.payload for m in RecordingReader(directory, recovered).messages()]
    assert got == sent[:len(got)] and len(got) > 100
    base = recovered.segment_base(recovered.stop_position - 1)
    assert (recovered.segment_path(directory, base).stat().st_size
            == recovered.stop_position - base)

    # a restarted recorder records on (a new recording); SIGTERM stops it cleanly
    recorder = subprocess.Popen(command, env=bus_env(bus_context), stderr=subprocess.PIPE)
    try:
        with shmbus.connect(bus_context) as bus:
            publication = bus.add_exclusive_publication("aeron:ipc", 32)
            wait_until(lambda: len(read_catalog(directory)) == 2 if os.path.exists(
                directory / CATALOG_FILE) else False, DEADLINE_S, "the second recording")
            for i in range(50):
                publication.publish(i.to_bytes(4, "little"), timeout=DEADLINE_S)
            second = read_catalog(directory)[1]
            wait_until(lambda: live_position(directory, second) >= publication.position,
                       DEADLINE_S, "recorded")
            recorder.send_signal(signal.SIGTERM)
            _, err = recorder.communicate(timeout=DEADLINE_S)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
    assert recorder.returncode == 0, err.decode()
    second = read_catalog(directory)[1]
    assert second.state == STOPPED and second.stop_reason == "recorder closed"
    assert [m.payload for m in RecordingReader(directory, second).messages()] == [
        i.to_bytes(4, "little") for i in range(50)]


def test_full_file_system_stops_the_recording_cleanly(bus_context, driver, tiny_tmpfs) -> None:
    directory = tiny_tmpfs / "rec"
    sent = []
    with shmbus.connect(bus_context) as bus:
        recorder = bus.add_recorder(directory, "aeron:ipc", 33, segment_length=65536)
        publication = bus.add_exclusive_publication("aeron:ipc", 33)
        wait_until(lambda: recorder.recordings, DEADLINE_S, "the image", poll=recorder.poll)
        error = None
        deadline = time.monotonic() + DEADLINE_S
        while error is None:
            payload = len(sent).to_bytes(4, "little") * 300  # 1200 bytes
            while publication.offer(payload) < 0:
                try:
                    recorder.poll()
                except DiskFullError as e:
                    error = e
                    break
                assert time.monotonic() < deadline, "the file system never filled up"
            else:
                sent.append(payload)
        recorder.close()  # closing a stopped recorder is fine
    assert "file system is full" in str(error)
    assert not (directory / (CATALOG_FILE + ".tmp")).exists()
    (entry,) = read_catalog(directory)  # the catalog is whole and says what happened
    assert entry.state == STOPPED and entry.stop_reason.startswith("disk full")
    assert entry.stop_position > 4 * 65536
    got = [m.payload for m in RecordingReader(directory, entry).messages()]
    assert got == sent[:len(got)] and len(got) >= len(sent) - 64
    last = entry.segment_base(entry.stop_position - 1)
    assert entry.segment_path(directory, last).stat().st_size == entry.stop_position - last
    assert not list(entry.directory(directory).glob(f"{entry.stop_position:020d}.seg"))


def test_replay_republishes_from_a_position(bus_context, driver, tmp_path) -> None:
    log = FakeLog(term_length=65536)
    catalog, writer = start_recording(tmp_path / "rec", log)
    for i, payload in enumerate(random_payloads(13, 200, max_length=3000)):
        log.append(payload, reserved_value=i)
    log.drain_into(writer)
    finish(catalog, writer)
    start = log.messages[50][0]
    with shmbus.connect(bus_context) as bus:
        subscription = bus.add_subscription("aeron:ipc", 34)
        replay = subprocess.Popen(
            [sys.executable, "-m", "shmbus", "replay", str(tmp_path / "rec"), "--recording", "0",
             "--stream", "34", "--from-position", str(start)], env=bus_env(bus_context),
            stderr=subprocess.PIPE)
        got = []
        assembler = shmbus.FragmentAssembler(
            lambda b, h: got.append((bytes(b), h.reserved_value)))
        try:
            wait_until(lambda: len(got) >= 150, DEADLINE_S, "the replayed messages",
                       poll=lambda: subscription.poll(assembler, 100))
            _, err = replay.communicate(timeout=DEADLINE_S)
        finally:
            if replay.poll() is None:
                replay.kill()
                replay.wait()
    assert replay.returncode == 0, err.decode()
    assert b"replayed 150 messages" in err
    assert got == [(m, rv) for _, m, rv in log.messages[50:]]
