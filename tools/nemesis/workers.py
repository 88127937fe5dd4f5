"""The processes tools/nemesis/run.py starts (multiprocessing spawn targets): writers and readers.

Progress the orchestrator must read even after it SIGKILLs a writer lives in a shared
:class:`Ledger` (an mmapped file read through ``shmbus.AtomicBuffer``); readers hand their
:class:`~tools.nemesis.check.SubscriberCheck` back through a queue when asked to stop.

The rebuild pattern (until ``connect`` can reconnect by itself): a worker runs its whole client
inside ``while not stop: try: with shmbus.connect(...) ... except REBUILD: ...``. When the
driver dies (DriverTimeoutError), times the client out (ClientTimeoutError, e.g. after a
SIGSTOP), is being replaced (DriverUnavailableError), or cannot create a log now
(RegistrationError: the disk is full), the client is dropped and a new one built: a new
publication is a new session, so a writer starts a new incarnation, sequence 0. A writer learns
that the driver died by polling a subscription now and then (any client call checks the
driver's heartbeat; ``offer`` alone does not).
"""

from __future__ import annotations

import errno
import faulthandler
import itertools
import mmap
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import shmbus
from tools.aeron_c.message import encode_message
from tools.nemesis.check import (
    CLOSED,
    DRIVER_LOST,
    FINISHED,
    HEAD,
    PUBLICATION_FAILED,
    REFUSED,
    TIMED_OUT,
    AeronFormatCheck,
    SubscriberCheck,
    aeron_publisher_id,
    encode,
    payload_block,
)

REBUILD = (shmbus.DriverTimeoutError, shmbus.ClientTimeoutError, shmbus.DriverUnavailableError,
           shmbus.ClientClosedError, shmbus.RegistrationError, shmbus.PublicationError)
PROBE_STREAM = 9  # the stream a writer polls to hear of a dead driver (nobody publishes on it)
IDLE_S = 0.001
PACED_S = 0.005  # a paced writer ahead of its rate sleeps this long
#: the pause after a rebuild; doubled (up to the max) after each incarnation that sent nothing
REBUILD_PAUSE_S, REBUILD_PAUSE_MAX_S = 0.05, 0.4
BATCH = 64
#: a batch of messages this long or longer (large ones, each encoded before the offer and
#: offered alone) is a few messages
LARGE_BATCH_FROM, LARGE_BATCH = 65_536, 4


# -- the ledger ---------------------------------------------------------------------------------

MAX_INCARNATIONS = 4096
WRITER_HEADER = 64  # incarnations started (i64), phase (i64), hold-claim request (i64)
INCARNATION_RECORD = 32  # acked (i64), attempted (i64), ending (i64)
IDLE, OFFERING, HOLDING_CLAIM = 0, 1, 2
#: how often the orchestrator looks at a writer's phase to kill it in one (a phase lasts
#: microseconds to milliseconds)
PHASE_POLL_S = 0.0002


class Ledger:
    """Per writer: how many incarnations it started, what it is doing now (phase), a request
    from the orchestrator to hold its next claim open; per incarnation: messages acked and
    attempted, and how it ended. A writer writes its own fields; the orchestrator writes the
    hold request, and the ending of an incarnation whose process it killed. The Aeron C writer
    (tools/nemesis/aeron_pair.py) is given its phase, hold request and record offsets: it stores
    its phase, acked and attempted itself, and clears the hold request once it let its held
    claim go; the orchestrator begins and ends its incarnations."""

    def __init__(self, path: str, writers: int, *, create: bool = False) -> None:
        size = writers * (WRITER_HEADER + MAX_INCARNATIONS * INCARNATION_RECORD)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buffer = shmbus.AtomicBuffer(self._mmap)

    def _writer(self, writer: int) -> int:
        return writer * (WRITER_HEADER + MAX_INCARNATIONS * INCARNATION_RECORD)

    def _record(self, writer: int, incarnation: int) -> int:
        if not 0 <= incarnation < MAX_INCARNATIONS:
            raise ValueError(f"writer {writer}: incarnation {incarnation} is outside the "
                             f"ledger's 0..{MAX_INCARNATIONS - 1}")
        return self._writer(writer) + WRITER_HEADER + incarnation * INCARNATION_RECORD

    def incarnations(self, writer: int) -> int:
        return self.buffer.get_int64_acquire(self._writer(writer))

    def begin(self, writer: int) -> int:
        """A new incarnation of ``writer`` (only the process that runs the writer calls this:
        the writer itself, or the orchestrator for the Aeron C writer it starts)."""
        incarnation = self.incarnations(writer)
        self._record(writer, incarnation)
        self.buffer.put_int64_release(self._writer(writer), incarnation + 1)
        return incarnation

    def phase_offset(self, writer: int) -> int:
        """Where ``writer``'s phase (i64) is in the ledger file."""
        return self._writer(writer) + 8

    def hold_offset(self, writer: int) -> int:
        """Where ``writer``'s hold-claim request (i64) is in the ledger file."""
        return self._writer(writer) + 16

    def record_offset(self, writer: int, incarnation: int) -> int:
        """Where an incarnation's acked (i64), then attempted (i64), are in the ledger file."""
        return self._record(writer, incarnation)

    def phase(self, writer: int) -> int:
        return self.buffer.get_int64_acquire(self._writer(writer) + 8)

    def set_phase(self, writer: int, phase: int) -> None:
        self.buffer.put_int64_release(self._writer(writer) + 8, phase)

    def hold_requested(self, writer: int) -> bool:
        return self.buffer.get_int64_acquire(self._writer(writer) + 16) != 0

    def request_hold(self, writer: int, hold: bool) -> None:
        self.buffer.put_int64_release(self._writer(writer) + 16, int(hold))

    def counts(self, writer: int, incarnation: int) -> tuple[int, int, int]:
        """(acked, attempted, ending) of one incarnation."""
        at = self._record(writer, incarnation)
        return (self.buffer.get_int64_acquire(at), self.buffer.get_int64_acquire(at + 8),
                self.buffer.get_int64_acquire(at + 16))

    def attempt(self, writer: int, incarnation: int, attempted: int) -> None:
        self.buffer.put_int64_release(self._record(writer, incarnation) + 8, attempted)

    def ack(self, writer: int, incarnation: int, acked: int) -> None:
        self.buffer.put_int64_release(self._record(writer, incarnation), acked)

    def end(self, writer: int, incarnation: int, ending: int) -> None:
        self.buffer.put_int64_release(self._record(writer, incarnation) + 16, ending)

    def close(self) -> None:
        del self.buffer  # the mapping cannot close while a buffer exports it
        self._mmap.close()


# -- writers -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WriterSpec:
    """What one writer does: its channel and stream, exclusive or concurrent publication,
    message lengths (larger than the MTU's payload: fragmented), and whether it offers batches
    (offer_many) or claims one message at a time; its messages' format ("nemesis": check.encode,
    or "aeron": the C programs' message, publisher id check.aeron_publisher_id) and the
    program that runs it ("shmbus": run_writer, or "aeron-c": aeron_publish, started by
    tools/nemesis/aeron_pair.py, which reads only channel, stream, exclusive, lengths and
    rate)."""

    name: str
    channel: str
    stream_id: int
    exclusive: bool
    min_length: int
    max_length: int
    batch: bool
    #: messages a second at most (0: as many as the readers take)
    rate: float = 0.0
    message_format: str = "nemesis"
    program: str = "shmbus"


def run_writer(context: shmbus.Context, ledger_path: str, writers: int, writer: int,
               spec: WriterSpec, seed: int, stop: Any, leave: Any, errors: Any) -> None:
    """Publish until ``stop`` is set, rebuilding the client when the bus fails under it; then
    mark the incarnation finished and keep its publication open until ``leave`` is set (so
    readers can drain it)."""
    ledger = Ledger(ledger_path, writers)
    block = payload_block(seed)
    pause = REBUILD_PAUSE_S
    try:
        while not stop.is_set():
            incarnation = ledger.begin(writer)
            try:
                with shmbus.connect(context) as client:
                    _publish(client, ledger, writer, incarnation, spec, block, stop)
                    ledger.end(writer, incarnation, FINISHED)
                    leave.wait(120)
            except REBUILD as e:
                ledger.end(writer, incarnation, _ending(e))
                ledger.set_phase(writer, IDLE)
                # an incarnation that sent nothing (the disk full, the driver starting): wait
                # longer before the next, up to REBUILD_PAUSE_MAX_S, rather than spin clients
                sent = ledger.counts(writer, incarnation)[0]
                pause = REBUILD_PAUSE_S if sent else min(2 * pause, REBUILD_PAUSE_MAX_S)
                time.sleep(pause)
    except BaseException as e:
        errors.put(f"writer {writer} ({spec.name}): {type(e).__name__}: {e}")
        raise


def _ending(error: BaseException) -> int:
    if isinstance(error, shmbus.ClientTimeoutError):
        return TIMED_OUT
    if isinstance(error, shmbus.DriverTimeoutError | shmbus.DriverUnavailableError):
        return DRIVER_LOST
    if isinstance(error, shmbus.ClientClosedError):
        return CLOSED
    if isinstance(error, shmbus.PublicationError):
        return PUBLICATION_FAILED
    return REFUSED


def _publish(client: shmbus.Client, ledger: Ledger, writer: int, incarnation: int,
             spec: WriterSpec, block: bytes, stop: Any) -> None:
    add = client.add_exclusive_publication if spec.exclusive else client.add_publication
    encoder = _encoder(spec, block)
    publication = add(spec.channel, spec.stream_id)
    probe = client.add_subscription("aeron:ipc", PROBE_STREAM)
    lengths = _lengths(spec, writer)
    sequence = 0
    #: messages encoded from ``sequence`` on and not accepted yet: a refused (back-pressured)
    #: batch is offered again as it is, not encoded again
    pending: list[bytes] = []
    began = time.monotonic()
    while not stop.is_set():
        probe.poll(_ignore, 1)  # raises DriverTimeoutError when the driver is gone
        if ledger.hold_requested(writer):
            _hold_claim(publication, ledger, writer, incarnation, sequence, encoder,
                        spec.max_length)
        if spec.rate and sequence > (time.monotonic() - began) * spec.rate:
            time.sleep(PACED_S)
            continue
        # a batch writer offers them in one offer_many; another claims (or offers) them one
        # by one until one is refused
        count = BATCH if spec.max_length <= LARGE_BATCH_FROM else LARGE_BATCH
        pending += [encoder(writer, incarnation, sequence + i,
                            lengths[(sequence + i) % len(lengths)])
                    for i in range(len(pending), count)]
        messages = pending if len(pending) == count else pending[:count]
        ledger.attempt(writer, incarnation, sequence + count)
        ledger.set_phase(writer, OFFERING)
        try:
            if spec.batch:  # (large messages mixed in go alone, in order)
                result = publication.offer_many(messages)
                accepted = result if result > 0 else 0
            elif spec.max_length <= publication.max_payload_length:
                accepted = 0
                while accepted < count and _claim_and_commit(publication, messages[accepted]):
                    accepted += 1
            else:
                accepted = 0
                while accepted < count and publication.offer(messages[accepted]) > 0:
                    accepted += 1
        except OSError as e:  # a large message, the disk full: refused, nothing sent
            if e.errno != errno.ENOSPC:
                raise
            accepted = 0
        ledger.set_phase(writer, IDLE)
        if accepted:
            sequence += accepted
            del pending[:accepted]
            ledger.ack(writer, incarnation, sequence)
        else:
            ledger.attempt(writer, incarnation, sequence)
            time.sleep(IDLE_S)
        if publication.is_closed:
            raise shmbus.ClientClosedError("the publication was closed under the writer")


def _claim_and_commit(publication: shmbus.Publication, message: bytes) -> int:
    claim = publication.try_claim(len(message))
    if not claim:
        return 0
    assert claim.buffer is not None
    claim.buffer[:] = message
    try:
        claim.commit()
    except ValueError:  # descheduled past publication_unblock_timeout: the driver padded it
        return 0
    return 1


def _hold_claim(publication: shmbus.Publication, ledger: Ledger, writer: int,
                incarnation: int, sequence: int, encoder: Encoder, max_length: int) -> None:
    """Claim the next message and hold it, half written, until the orchestrator kills us
    (bounded: once it withdraws the request, or after 30 s, the claim is aborted). A writer
    of large messages claims a large one: a block of its block ring (LargeClaim), killed
    mid-fill; on a full disk that claim raises OSError (ENOSPC) and is tried again."""
    length = max_length if max_length > publication.max_message_length else HEAD.size + 64
    message = encoder(writer, incarnation, sequence, length)
    deadline = time.monotonic() + 30

    def holding() -> bool:
        return time.monotonic() < deadline and ledger.hold_requested(writer)

    while holding():
        ledger.attempt(writer, incarnation, sequence + 1)
        try:
            claim: shmbus.BufferClaim | shmbus.LargeClaim | None = \
                publication.try_claim(len(message))
        except OSError as e:  # a large claim, the disk full: refused, nothing reserved
            if e.errno != errno.ENOSPC:
                raise
            claim = None
        if claim:
            assert claim.buffer is not None
            half = max(HEAD.size, length // 2)
            claim.buffer[:half] = message[:half]
            ledger.set_phase(writer, HOLDING_CLAIM)
            while holding():
                time.sleep(0.01)
            try:
                claim.abort()
            except ValueError:  # held past publication_unblock_timeout: the driver padded it
                pass
            break
        time.sleep(IDLE_S)
    ledger.attempt(writer, incarnation, sequence)
    ledger.set_phase(writer, IDLE)
    ledger.request_hold(writer, False)


Encoder = Callable[[int, int, int, int], bytes]


def _encoder(spec: WriterSpec, block: bytes) -> Encoder:
    """(writer, incarnation, sequence, length) -> the message, in the spec's format."""
    if spec.message_format == "aeron":
        return lambda writer, incarnation, sequence, length: encode_message(
            aeron_publisher_id(writer, incarnation), sequence, length)
    return lambda writer, incarnation, sequence, length: encode(
        block, writer, incarnation, sequence, length)


def _lengths(spec: WriterSpec, writer: int) -> list[int]:
    rng = random.Random(writer)
    return [rng.randint(spec.min_length, spec.max_length) for _ in range(1009)]


def _ignore(buffer: memoryview, header: shmbus.Header) -> None:
    pass


# -- readers -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReaderSpec:
    name: str
    #: tethered, untethered, spy, network, recorder, late-joiner (see check.SubscriberReport)
    kind: str
    channel: str
    stream_id: int
    directory: str = ""  # a recorder's: where its recording windows go
    #: "nemesis" (check.encode) or "aeron" (the C programs' message: AeronFormatCheck)
    message_format: str = "nemesis"


def stack_file(pid: int) -> Path:
    """Where reader ``pid`` writes its threads' stacks when sent SIGUSR1 (see run_reader)."""
    return Path(tempfile.gettempdir()) / f"nemesis-reader-{pid}.stacks"


def run_reader(context: shmbus.Context, spec: ReaderSpec, stop: Any, results: Any,
               errors: Any) -> None:
    """Read and check until ``stop`` is set, then drain (until 1 s passes with nothing) and put
    (name, SubscriberCheck) on ``results``. The client is rebuilt when the bus fails.
    SIGUSR1 writes every thread's stack to :func:`stack_file`, so a reader that sends no
    report can say where it is stuck."""
    faulthandler.register(signal.SIGUSR1,
                          file=open(stack_file(os.getpid()), "w"),  # noqa: SIM115 (lives on)
                          all_threads=True)
    if spec.kind == "recorder":
        run_recorder(context, spec, stop, results, errors)
        return
    if spec.kind == "late-joiner":
        run_late_joiner(context, spec, stop, results, errors)
        return
    check = AeronFormatCheck() if spec.message_format == "aeron" else SubscriberCheck()
    assembler = shmbus.FragmentAssembler(
        lambda buffer, header: check.on_message(header.session_id, buffer))
    idle = shmbus.idle_strategies.SleepingIdleStrategy(IDLE_S)

    def new_image(image: shmbus.Image) -> None:
        assembler.free_session(image.session_id)  # a rejoin may start mid-message
        check.on_new_image(image.session_id)

    try:
        drained_at: float | None = None
        while drained_at is None:
            try:
                with shmbus.connect(context) as client:
                    subscription = client.add_subscription(
                        spec.channel, spec.stream_id, on_available_image=new_image)
                    quiet_since = time.monotonic()
                    while True:
                        work = subscription.poll(assembler, 1024)
                        check.on_poll_done()
                        now = time.monotonic()
                        if work:
                            quiet_since = now
                        elif stop.is_set() and now - quiet_since > 1.0:
                            drained_at = now
                            break
                        idle.idle(work)
            except REBUILD as e:
                check.on_rebuild(type(e).__name__)
                time.sleep(0.05)
        check.finish()
        results.put((spec.name, check))
    except BaseException as e:
        errors.put(f"reader {spec.name}: {type(e).__name__}: {e}")
        raise


# -- the late joiner ----------------------------------------------------------------------------

LATE_JOIN_WINDOW_S = 2.0  # one recording window of the late joiner
#: while a window's recordings hold at most LATE_JOIN_START_MAX bytes, this share of joins is
#: from the start (which replays all of it: a check per message, and the live image holds the
#: writers until the replay reaches it); the others, and all later, from a random recorded
#: position
LATE_JOIN_FROM_START, LATE_JOIN_START_MAX = 0.3, 8 << 20
LATE_JOIN_LIVE = 200      # live messages a join reads (per session) before it leaves
LATE_JOIN_READ_S = 3.0    # the longest one join reads
LATE_JOIN_PAUSE_S = 0.1  # between two joins (it only records then)


def run_late_joiner(context: shmbus.Context, spec: ReaderSpec, stop: Any, results: Any,
                    errors: Any) -> None:
    """Record the stream (its own Recorder, in windows of LATE_JOIN_WINDOW_S, each deleted
    after) and, meanwhile, join it again and again with history from a random recorded
    position (shmbus.Recording, from_position) or from the start: each join is checked as
    one image per session (no loss, duplicate or reordering from its start on), its checks
    summed into the one reported. A fault that breaks a join (the driver gone, the client
    timed out, the recorder stopped by a full disk: HistoryGapError) rebuilds it."""
    total = SubscriberCheck()
    rng = random.Random(os.getpid())
    idle = shmbus.idle_strategies.SleepingIdleStrategy(IDLE_S)
    try:
        for window in itertools.count():
            last = stop.is_set()
            directory = Path(spec.directory) / f"window-{window}"
            try:
                with shmbus.connect(context) as client, client.add_recorder(
                        directory, spec.channel, spec.stream_id) as recorder:
                    deadline = time.monotonic() + LATE_JOIN_WINDOW_S
                    while time.monotonic() < deadline:
                        # between joins: recording only (the recorder holds the writers)
                        pause_until = time.monotonic() + LATE_JOIN_PAUSE_S
                        while time.monotonic() < pause_until:
                            idle.idle(recorder.poll())
                        check = SubscriberCheck()
                        try:
                            _late_join(client, recorder, directory, spec, rng, check)
                        except shmbus.ClientTimeoutError:
                            # paused past its liveness in a poll: what that poll handed out
                            # may have been reused under it (torn), as for any reader
                            check.on_rebuild("ClientTimeoutError")
                            raise
                        finally:
                            _add_check(total, check)
            except (*REBUILD, shmbus.HistoryGapError, shmbus.RecordingError) as e:
                total.on_rebuild(type(e).__name__)
                time.sleep(0.05)
            shutil.rmtree(directory, ignore_errors=True)
            if last:
                break
        total.finish()
        results.put((spec.name, total))
    except BaseException as e:
        errors.put(f"reader {spec.name}: {type(e).__name__}: {e}")
        raise


def recorded_bytes(directory: str) -> int:
    """The bytes every recording in ``directory`` holds, stopped ones too (ids run from 0)."""
    total = 0
    for recording_id in itertools.count():
        try:
            reader = shmbus.RecordingReader(directory, recording_id)
        except shmbus.RecordingError:
            return total
        total += reader.stop_position - reader.start_position
    return total


def _late_join(client: shmbus.Client, recorder: shmbus.Recorder, directory: Path,
               spec: ReaderSpec, rng: random.Random, check: SubscriberCheck) -> None:
    """One join from a random position of a random recording (or the start), read while the
    recorder keeps recording, until every session is live with LATE_JOIN_LIVE messages; none
    while nothing is being recorded (the recorder has no image yet)."""
    recordings = recorder.recordings
    if not recordings:
        return  # (the recorder has no image yet, or lost them: nothing to join from)
    channel, position = spec.channel, "start"
    # from the start only while the window's recordings (those it stopped too: a join from the
    # start replays them whole) are short
    if rng.random() >= LATE_JOIN_FROM_START or recorded_bytes(directory) > LATE_JOIN_START_MAX:
        d = rng.choice(recordings)
        reader = shmbus.RecordingReader(directory, d)
        end = reader.stop_position
        positions = reader.read_batch(max(d.start_position, end - rng.choice([4096, 65536])),
                                      end).positions
        if not len(positions):
            return  # nothing recorded there yet
        channel = f"{spec.channel}?session-id={d.session_id}"
        position = int(rng.choice(positions))
    check.joins += 1
    live: dict[int, int] = {}

    def handler(payload: memoryview, info: shmbus.MessageInfo) -> None:
        check.on_message(info.session_id, payload)
        if not info.replayed:
            live[info.session_id] = live.get(info.session_id, 0) + 1

    with client.add_subscription(channel, spec.stream_id, history=shmbus.Recording(directory),
                                 from_position=position, catch_up=1.0) as sub:
        deadline = time.monotonic() + LATE_JOIN_READ_S
        idle = shmbus.idle_strategies.SleepingIdleStrategy(IDLE_S)
        while time.monotonic() < deadline:
            work = sub.poll(handler, 1024)
            check.on_poll_done()
            idle.idle(work + recorder.poll())
            states = sub.positions()
            if sub.is_live and all(phase == "done" or live.get(sid, 0) >= LATE_JOIN_LIVE
                                   for sid, (phase, _) in states.items()):
                return


def _add_check(total: SubscriberCheck, join: SubscriberCheck) -> None:
    """Sum one join's checks into the late joiner's report (each join is its own images)."""
    join.finish()
    total.joins += join.joins
    total.corrupt += join.corrupt
    total.torn += join.torn
    for key, track in join.tracks.items():
        into = total.tracks.setdefault(key, type(track)())
        into.received += track.received
        into.lost += track.lost
        into.duplicated += track.duplicated
        into.reordered += track.reordered
        into.first = track.first if into.first < 0 else min(into.first, track.first)
        into.last = max(into.last, track.last)


# -- the recorder -------------------------------------------------------------------------------

RECORD_WINDOW_S = 2.0  # one recording window (the disk holds one window at a time)
RECORD_GAP_S = 1.0


def run_recorder(context: shmbus.Context, spec: ReaderSpec, stop: Any, results: Any,
                 errors: Any) -> None:
    """Record the stream with shmbus.Recorder in windows of RECORD_WINDOW_S, each into a fresh
    directory; after each window read every recording back, check it as one image, delete
    it. A recorder the bus fails under is closed and its window checked like any other; one
    window more is recorded after ``stop`` is set. Puts (name, SubscriberCheck) on
    ``results``."""
    check = SubscriberCheck()
    idle = shmbus.idle_strategies.SleepingIdleStrategy(IDLE_S)
    try:
        for window in itertools.count():
            last = stop.is_set()
            directory = Path(spec.directory) / f"window-{window}"
            failure = None
            try:
                with shmbus.connect(context) as client, client.add_recorder(
                        directory, spec.channel, spec.stream_id) as recorder:
                    deadline = time.monotonic() + RECORD_WINDOW_S
                    while time.monotonic() < deadline:
                        idle.idle(recorder.poll())
            except REBUILD as e:
                failure = type(e).__name__
            _check_recordings(check, directory)
            if failure is not None:
                check.on_rebuild(failure)
            shutil.rmtree(directory, ignore_errors=True)
            if last:
                break
            time.sleep(RECORD_GAP_S)
        check.finish()
        results.put((spec.name, check))
    except BaseException as e:
        errors.put(f"reader {spec.name}: {type(e).__name__}: {e}")
        raise


def _check_recordings(check: SubscriberCheck, directory: Path) -> None:
    """Feed every recording of ``directory`` (ids 0, 1, ...) to ``check``, one image each."""
    for recording_id in itertools.count():
        try:
            reader = shmbus.RecordingReader(directory, recording_id)
        except (shmbus.RecordingError, FileNotFoundError):
            return
        session_id = reader.descriptor.session_id
        check.on_new_image(session_id)
        on_message = check.on_message
        for batch in reader.read_batches():  # RecordingError on a damaged one: a breach
            data = batch.data.data  # zero-copy slices
            offsets = batch.offsets.tolist()
            for i in range(len(offsets) - 1):
                on_message(session_id, data[offsets[i]:offsets[i + 1]])
        check.on_poll_done()


# -- a reader that holds a large message and dies -------------------------------------------------

def run_view_holder(context: shmbus.Context, stream_id: int, holding: Any, errors: Any) -> None:
    """Subscribe, take a zero-copy view of the first large message and hold it (holding its
    block and its position) until killed; ``holding`` is set once it does."""
    try:
        client = shmbus.connect(context)
        subscription = client.add_subscription("aeron:ipc", stream_id)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            view = subscription.take_view()
            if view is None:
                subscription.wait(0.05)
            elif view.zero_copy:
                holding.set()
                time.sleep(600)
            else:
                view.release()
    except REBUILD:
        pass  # the bus failed under it (another fault): it held nothing
    except BaseException as e:
        errors.put(f"view holder: {type(e).__name__}: {e}")
        raise
