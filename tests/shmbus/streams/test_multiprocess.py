"""The data plane across real processes: concurrent writers, a fast exclusive writer, a writer
killed mid-append and a reader killed mid-stream.

Every process is started with the "spawn" context and opens the stream by path
(:class:`StandaloneStream` in the ``shm_dir`` fixture); the spawn targets live in
``tests/support/workers/mp_workers.py``. Checksums are verified end to end in the reading
process, which reports a summary back through a queue. Every wait is bounded by a deadline.
"""

from __future__ import annotations

import bisect
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus.shm.log_buffer import HDR_TYPE_DATA, HDR_TYPE_PAD, align
from tests.support.standalone_stream import StandaloneStream, reader_offset
from tests.support.waits import holds_for, wait_until
from tests.support.workers import mp_workers

CTX = mp.get_context("spawn")
SEED = 20240603

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def start_process() -> Iterator[Callable[..., Any]]:
    """Starts spawn processes; any still alive at teardown is killed."""
    started: list[Any] = []

    def start(target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        process = CTX.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        if process.is_alive():
            process.kill()
        process.join(10)


def collect(results: Any, count: int, processes: list[Any], timeout: float) -> list[dict]:
    """``count`` reports from ``results`` within ``timeout`` seconds, failing early when every
    process that could still report has died without doing so."""
    reports: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(reports) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"{len(reports)} of {count} reports within {timeout} s; exit codes "
                        f"{[p.exitcode for p in processes]}")
        try:
            reports.append(results.get(timeout=min(remaining, 0.5)))
        except queue.Empty:
            if all(not p.is_alive() for p in processes):
                try:  # a last report may still be in the pipe
                    reports.append(results.get(timeout=1.0))
                except queue.Empty:
                    pytest.fail(f"processes exited without reporting: exit codes "
                                f"{[p.exitcode for p in processes]}")
    return reports


def join_all(processes: list[Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        assert process.exitcode == 0, f"{process.name} exit code {process.exitcode}"


def frame_at(stream: StandaloneStream, position: int) -> tuple[int, int, int]:
    """(frame length, type, flags) of the frame at a stream position, read from the log."""
    term_length = stream.log.term_length
    at = (position // term_length) % 3 * term_length + position % term_length
    buffer = stream.log.buffer
    length = buffer.get_int32_acquire(at)
    word = buffer.get_int32(at + 4)  # version, flags, type (u16)
    return length, (word >> 16) & 0xFFFF, (word >> 8) & 0xFF


# -- 1. four processes on one concurrent publication ---------------------------------------

WRITERS = 4
PER_WRITER = 200_000
MAX_LENGTH = 4000


def test_four_concurrent_writer_processes(shm_dir, start_process):
    stream = StandaloneStream(shm_dir, create=True, term_length=1 << 20)
    max_payload = stream.publication().max_payload_length
    stream.close()
    assert MAX_LENGTH > max_payload  # the long messages are fragmented
    ready, start, results = CTX.Event(), CTX.Event(), CTX.Queue()
    reader = start_process(mp_workers.tagged_reader, str(shm_dir), WRITERS, PER_WRITER, SEED,
                           MAX_LENGTH, ready, results, 150.0)
    assert ready.wait(30), "reader did not start"
    writers = [start_process(mp_workers.concurrent_writer, str(shm_dir), w, PER_WRITER, SEED,
                             MAX_LENGTH, start, results, 150.0) for w in range(WRITERS)]
    start.set()
    reports = collect(results, WRITERS + 1, [reader, *writers], 170.0)
    join_all([reader, *writers])

    writer_reports = sorted((r for r in reports if r["kind"] == "writer"),
                            key=lambda r: r["writer"])
    (summary,) = [r for r in reports if r["kind"] == "reader"]
    for report in writer_reports:
        assert report["error"] is None, report
        assert report["sent"] == PER_WRITER
        assert report["admin"] > 0, report  # every writer met a term rotation
    assert sum(r["back_pressured"] for r in writer_reports) > 0  # the reader held them back
    assert summary["error"] is None, summary
    assert summary["errors"] == 0, summary["samples"]
    assert summary["counts"] == [PER_WRITER] * WRITERS
    assert summary["messages"] == WRITERS * PER_WRITER  # nothing extra, nothing twice
    assert summary["fragments"] > summary["messages"]  # reassembly happened
    assert summary["position"] == summary["producer_position"]


# -- 2. one exclusive publication, two million small messages ------------------------------


@pytest.mark.parametrize(("count", "batch"), [(2_000_000, 0), (2_000_000, 256)],
                         ids=["offer", "offer_many"])
def test_exclusive_writer_two_million_small_messages(shm_dir, start_process, count, batch):
    StandaloneStream(shm_dir, create=True, term_length=1 << 20).close()
    ready, start, results = CTX.Event(), CTX.Event(), CTX.Queue()
    reader = start_process(mp_workers.small_reader, str(shm_dir), count, SEED, ready, results,
                           90.0)
    assert ready.wait(30), "reader did not start"
    writer = start_process(mp_workers.exclusive_writer, str(shm_dir), count, SEED, batch, start,
                           results, 90.0)
    start.set()
    reports = collect(results, 2, [reader, writer], 110.0)
    join_all([reader, writer])

    (sent,) = [r for r in reports if r["kind"] == "writer"]
    (summary,) = [r for r in reports if r["kind"] == "reader"]
    assert sent["error"] is None, sent
    assert sent["sent"] == count
    assert sent["admin"] > 0  # many term rotations
    assert summary["error"] is None, summary
    assert summary["errors"] == 0, summary["samples"]
    assert (summary["first"], summary["next"], summary["messages"]) == (0, count, count)
    assert summary["position"] == sent["position"]


# -- 3. a writer killed in the middle of a claim -------------------------------------------

CLAIM_LENGTH = 1000
COMPLETE_BEFORE = 150
AFTER = 12
MAX_LENGTH_3 = 3000  # fragmented messages before and after the blocked frame


def test_writer_killed_mid_claim_blocks_readers_at_its_frame(shm_dir, start_process):
    stream = StandaloneStream(shm_dir, create=True, term_length=128 * 1024)
    ready, stop, results = CTX.Event(), CTX.Event(), CTX.Queue()
    claimed, claimer_results = CTX.Event(), CTX.Queue()
    reader = start_process(mp_workers.watching_reader, str(shm_dir), 2, SEED, MAX_LENGTH_3,
                           ready, stop, results, 60.0)
    assert ready.wait(30), "reader did not start"
    claimer = start_process(mp_workers.claiming_writer, str(shm_dir), 0, COMPLETE_BEFORE,
                            CLAIM_LENGTH, SEED, MAX_LENGTH_3, claimed, claimer_results, 60.0)
    assert claimed.wait(30), "the claiming writer did not claim"
    (claim,) = collect(claimer_results, 1, [claimer], 10.0)
    assert claim["error"] is None, claim
    claimer.kill()
    claimer.join(10)
    assert claimer.exitcode == -9
    claim_start, claim_end = claim["claim_start"], claim["claim_end"]
    assert claim_start >= 128 * 1024  # the complete messages crossed a term boundary

    # the reader delivers everything before the claim and stops at it
    def reader_position() -> int:
        return stream.positions.get_int64_acquire(reader_offset(0))

    wait_until(lambda: reader_position() == claim_start, 20.0,
               "the reader to reach the blocked frame")

    # another publication appends after the blocked frame
    pub = stream.publication()
    block = memoryview(mp_workers.random_block(SEED))
    rng = mp_workers.tagged_rng(SEED, 1)
    ends = []
    deadline = time.monotonic() + 10.0
    for seq in range(AFTER):
        parts, reserved = mp_workers.make_tagged(
            block, 1, seq, *mp_workers.next_tagged_shape(rng, MAX_LENGTH_3))
        while (result := pub.offer(*parts, reserved_value=reserved)) <= 0:
            assert time.monotonic() < deadline, f"offer after the blocked frame: {result}"
            time.sleep(0.0005)
        ends.append(result)
    pub.close()
    assert ends[0] > claim_end

    # those frames are committed in the log: walk them from the end of the blocked frame
    length, frame_type, _ = frame_at(stream, claim_start)
    assert (length, frame_type) == (-(CLAIM_LENGTH + 32), HDR_TYPE_DATA)  # still unfinished
    position, messages = claim_end, 0
    while position < ends[-1]:
        length, frame_type, flags = frame_at(stream, position)
        assert length > 0, f"uncommitted frame at {position}"
        assert frame_type in (HDR_TYPE_DATA, HDR_TYPE_PAD)
        if frame_type == HDR_TYPE_DATA and flags & 0x40:
            messages += 1
        position += align(length)
    assert (position, messages) == (ends[-1], AFTER)

    # ... and still the reader delivers none of them: a negative check, watched for 0.3 s
    # (the reader polls on; no state shows it looked and found nothing)
    holds_for(lambda: reader_position() == claim_start, 0.3,
              "the reader held at the blocked frame")
    stop.set()
    (summary,) = collect(results, 1, [reader], 20.0)
    join_all([reader])
    assert summary["error"] is None, summary
    assert summary["errors"] == 0, summary["samples"]  # nothing garbled was delivered
    assert summary["counts"] == [COMPLETE_BEFORE, 0]
    assert summary["messages"] == COMPLETE_BEFORE
    assert summary["position"] == claim_start
    stream.close()


# -- 4. a reader killed mid-stream ---------------------------------------------------------

STREAM_4 = 300_000
TERM_4 = 64 * 1024


def test_reader_killed_mid_stream_a_new_reader_resumes(shm_dir, start_process):
    # The flow control (the driver's part) runs in a process of its own that outlives both
    # readers, as the driver would. Handing it from the dead reader to the new one would
    # build a second IpcFlowControl, which starts cleaning at the producer position and so
    # never cleans what lies between the saved position and there: stale frames after the
    # log wraps (see the report on IpcFlowControl._start_position).
    stream = StandaloneStream(shm_dir, create=True, term_length=TERM_4)
    stop = CTX.Event()
    flow_ready = CTX.Event()
    flow = start_process(mp_workers.flow_control_loop, str(shm_dir), [0], flow_ready, stop, 60.0)
    assert flow_ready.wait(30), "flow control did not start"
    ready_a, start, results_a = CTX.Event(), CTX.Event(), CTX.Queue()
    progress = CTX.Value("q", 0, lock=False)
    first_reader = start_process(mp_workers.small_reader, str(shm_dir), STREAM_4, SEED, ready_a,
                                 results_a, 60.0, flow_control=False, progress=progress)
    assert ready_a.wait(30), "first reader did not start"
    writer_results = CTX.Queue()
    writer = start_process(mp_workers.exclusive_writer, str(shm_dir), STREAM_4, SEED, 0, start,
                           writer_results, 60.0, report_positions=True)
    start.set()
    wait_until(lambda: progress.value >= STREAM_4 // 3, 30.0, "the first reader's progress")
    first_reader.kill()
    first_reader.join(10)
    assert first_reader.exitcode == -9

    saved = stream.positions.get_int64_acquire(reader_offset(0))
    assert 0 < saved
    # the writer is held back by the dead reader: it runs up to a window ahead, no further.
    # The limit moves in steps of at least a trip gain (window / 8), so the last step, taken
    # before the reader died, may have left it up to that much short of saved + window.
    window = TERM_4 // 2
    wait_until(lambda: stream.log.producer_position() >= saved + window - window // 8 - 128,
               30, "the writer to reach the dead reader's window")
    assert writer.is_alive() and writer_results.empty()
    assert stream.log.producer_position() <= saved + window + 128

    ready_b, results_b = CTX.Event(), CTX.Queue()
    second_reader = start_process(mp_workers.small_reader, str(shm_dir), STREAM_4, SEED,
                                  ready_b, results_b, 60.0, flow_control=False, first=None)
    (sent,) = collect(writer_results, 1, [writer], 60.0)
    (summary,) = collect(results_b, 1, [second_reader], 60.0)
    stop.set()
    join_all([writer, second_reader, flow])

    assert sent["error"] is None, sent
    positions = sent["positions"].tolist()
    expected_first = bisect.bisect_right(positions, saved)  # first message not consumed
    assert saved in set(positions) or saved % TERM_4 == 0  # a frame boundary
    assert STREAM_4 // 3 <= expected_first < STREAM_4  # killed mid-stream
    assert summary["error"] is None, summary
    assert summary["start_position"] == saved
    assert summary["errors"] == 0, summary["samples"]
    assert summary["first"] == expected_first
    assert summary["next"] == STREAM_4
    assert summary["messages"] == STREAM_4 - expected_first  # the remainder, exactly once
    assert summary["position"] == sent["position"] == positions[-1]
    stream.close()
