"""A nemesis: a seeded schedule of faults while writers and readers stream checked messages.

    python -m tools.nemesis.run [--minutes 10 | --seconds 60] [--seed 1] [--publishers 7]
                                [--subscribers 8] [--faults F,F,...] [--no-aeron]
                                [--tamper-aeron SEQUENCE]

Runs as root (it mounts a small tmpfs for the bus directory). Writers (tools/nemesis/workers.py)
publish on an IPC stream and on an authenticated UDP stream (``key=``: every datagram sealed)
through the netbridge: exclusive and concurrent
publications, whole messages in offer_many batches or claimed one at a time, and fragmented
ones, and large ones (100 B to 200 KB, paced at 200 a second); every message carries writer
id, incarnation, sequence number and CRC32. Readers: a
tethered and an untethered IPC subscriber, a UDP subscriber, a spy on the UDP publication, a
recorder (shmbus.Recorder on the IPC stream, in 2-second windows, each read back with
RecordingReader and checked, then deleted: the disk holds one window), a tethered reader and
a recorder of the large-message stream (payloads recorded out of line, read back the same
way); a late joiner (its own Recorder, in 2-second windows, and joins one after another, 0.1 s
apart, with history from a random recorded position or, while the window holds at most 8 MiB,
often from the start, then live: shmbus.Recording); more
tethered ones beyond.

The Aeron pair (tools/nemesis/aeron_pair.py; it needs ``make aeron-c``, ``--no-aeron`` runs
without it): on the Aeron stream (IPC, one concurrent publication) Aeron's own C client writes
(tools/aeron_c/c/aeron_publish.c --until-stopped: 20 B to 3 KB, fragmented ones among them)
beside a shmbus writer (offer_many batches of whole messages), each paced at AERON_RATE, both
in the C programs' message (tools/aeron_c/message.py: publisher id ``writer << 16 |
incarnation``, length, sequence, CRC-32, a payload pattern); Aeron's C reader (aeron_subscribe
--until-stopped, checking each of its images itself) and a tethered shmbus reader read it. Their
clients wait for a silent driver as long as shmbus's do (3 s). ``--tamper-aeron N`` is a
self-test: the Aeron C writer's first incarnation corrupts its message N, which the run must
report as a breach.

``udp-loss``: the UDP path drops, duplicates, reorders and delays datagrams both ways for the
whole run (the netbridge's loss filter; it counts as fired once the
netbridge's receivers report gaps, read with ``shmbus stat``). In shuffled rounds, with pauses
of 2 to 5 s between faults (each fault's window is short: the data path carries most of the
run; every round runs to its end, so every fault fires at least once, and another starts while
one as long as the last can end by the deadline), the nemesis:

* ``kill-writer-mid-offer``: SIGKILLs a writer inside offer/offer_many, starts it again;
* ``kill-writer-mid-claim``: has an IPC writer claim and half-fill a message, SIGKILLs it
  holding the claim (the driver unblocks the log; for the large-message writer, a block of
  its ring: the driver frees it once it sees the writer dead), starts it again;
* ``stop-subscriber``: SIGSTOPs a reader past the client liveness timeout, then SIGCONTs it
  (the driver has dropped it; it sees ClientTimeoutError and rebuilds its client);
* ``kill-driver``: SIGKILLs the driver and starts a new one (clients see DriverTimeoutError
  and rebuild; the Aeron C programs' clients end, they exit and are started again);
* ``kill-netbridge``: SIGKILLs the netbridge (the driver starts another);
* ``fill-disk``: fills the bus tmpfs with a ballast file for FILL_HOLD_S (1 s), then frees
  it. The tmpfs (TMPFS_MB) is sized for the bus's own memory, so that only the ballast fills
  it: the large stream's block ring keeps up to 64 MiB warm, and an old ring stays until
  every process that mapped it lets go (after a driver kill, two or three at once). A large
  offer or claim on the full disk raises OSError (ENOSPC): refused, tried again.
* ``kill-responder``: SIGKILLs one of the request/reply responders, two on aeron:ipc and two
  on authenticated aeron:udp through the netbridge (tools/nemesis/calls.py), while a caller
  on each keeps
  calling; starts it again;
* ``kill-aeron-writer``: SIGKILLs the Aeron C writer inside an offer (from its first attempt
  at a message until accepted: its phase, which it stores in the ledger), or, half the time
  (at random), holding a claim half written (aeron_publication_try_claim, asked for through
  the ledger's hold request, as kill-writer-mid-claim does): its frame of the concurrent
  publication is claimed and never written, which the driver must unblock for the shmbus
  writer and the readers; starts it again;
* ``kill-aeron-reader``: SIGKILLs the Aeron C reader inside a poll (its phase, in its progress
  file): the driver times its client out and frees its position; starts it again.

``--faults`` schedules only those named. A restarted or rebuilt writer is a new publication: a
new incarnation, sequence from 0.

The rules (a breach of any is printed and the exit status is 1):

1. Never corrupt: every message received has its CRC. Except a message a reader was handed
   just before it was paused past its liveness timeout: the driver drops the reader, and the
   writer may reuse the memory under its handler (*torn*); the poll it was paused in raises
   ClientTimeoutError when it resumes (a client checks its heartbeat counter is still its own
   before and after each poll), so the messages of the poll that raises are torn.
2. Within one image, never lost, duplicated or reordered: each writer incarnation's sequence
   goes up by one, for every kind of reader (an untethered reader or a spy that falls behind
   gets a new image instead; the jump between images is *skipped*, not lost). A recording is
   one image: what it holds is exact.
3. A tethered IPC reader and the UDP reader get every message a live writer's offer accepted
   while the driver lived: for the incarnations alive at the end, the last acked message
   arrives.
4. A writer killed mid-offer or mid-claim: every message acked before the kill arrives at the
   tethered and UDP readers that were following it (not dropped by the driver meanwhile);
   what was in the killed call (one batch, or the claimed message) may be lost.
5. Across a driver restart (or any rebuild of the writer's client): a tethered or UDP reader
   following it may miss at most one term's worth of messages the writer had acked when its
   client was dropped (term length / smallest frame).
6. Request/reply (tools/nemesis/calls.py): every call is answered with the reply to that very
   request, or fails with a documented error; none is left unsettled.
7. A late joiner's every join (history, then live) is one image per session: rule 2 from the
   position it asked for on; a join a fault breaks is made again.
8. Large messages: once every reader has drained, no block of a large message is still held
   (the driver freed what every counted reader had passed, or dropped).
9. No process dies unless the nemesis killed it (a writer, reader or driver that does is
   started again, and reported). An Aeron C program whose client ended (the driver's death,
   or a timeout: exit status 3, or it could not connect or add its publication or subscription
   while the driver was being replaced or the disk was full) is started again, not a breach;
   any other exit (a rule broken or an Aeron client error other than its end: status 1; a
   setup error: 2; a signal the nemesis did not send) is.

On the Aeron stream, both writers are writers as any (rules 2 to 5 for what they acked; the C
writer's phase, acked and attempted are in the ledger as the others'), and the shmbus reader
is a tethered reader (rules 1 to 5). The Aeron C reader keeps rules 1 and 2 itself, from the
first message it sees of each publisher in each image on, and stops at the first breach (the
nemesis reports it with the reader's output). It does not outlive its client: a driver's death
ends it, and its next incarnation joins where the stream is. So rules 3 and 4 apply to its
last incarnation (alive at the end, following the stream from 1 s before the writers stopped;
if it is not, that is a breach): it gets the last acked message of every writer incarnation
on the stream that finished, and of every one killed mid-offer that it was following. Rule 5
does not apply to it.

At the end it prints, per writer incarnation and per reader: sent, received, lost, duplicated,
reordered, skipped, corrupt (a writer's incarnations that sent nothing on one line, by how they
ended), the late joiner's joins; the Aeron pair's line: what each writer of the Aeron stream
sent, in how many incarnations, by how they ended, and what each of its readers checked (the C
reader's incarnations by how they ended, its killed ones' counts included); how often each
fault fired, the UDP loss statistics and the driver's DRIVER_STATS; the messages sent, how
many a minute the writers streamed and in how many of its seconds they sent any; per
request/reply service the calls answered (the reply, or the RemoteError the request asked
for; their mean time) and failed, by error; the bus tmpfs's peak use between faults; the CPU
seconds of each process alive at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import shmbus
from tools.aeron_c.programs import AeronCNotBuilt, build_programs
from tools.bench.network import free_udp_ports
from tools.nemesis import calls
from tools.nemesis.aeron_pair import AeronPair
from tools.nemesis.check import (
    ENDINGS,
    KILLED_MID_CLAIM,
    KILLED_MID_OFFER,
    Key,
    Sent,
    SubscriberCheck,
    SubscriberReport,
    Track,
    breaches,
    final_reader_breaches,
)
from tools.nemesis.flags import Flag
from tools.nemesis.workers import (
    HOLDING_CLAIM,
    OFFERING,
    PHASE_POLL_S,
    Ledger,
    ReaderSpec,
    WriterSpec,
    run_reader,
    run_view_holder,
    run_writer,
    stack_file,
)
from tools.polling import poll_until

SCHEDULED = ("kill-writer-mid-offer", "kill-writer-mid-claim", "stop-subscriber", "kill-driver",
             "kill-netbridge", "fill-disk", "kill-view-holder", "kill-responder",
             "kill-aeron-writer", "kill-aeron-reader")
#: the faults that need the Aeron pair
AERON_FAULTS = ("kill-aeron-writer", "kill-aeron-reader")
#: udp-loss is standing; it fired when the netbridge's receivers counted gaps
FAULTS = (*SCHEDULED, "udp-loss")
UDP_STATS = ("retransmits", "gaps", "naks sent")
#: the driver's system counters the summary sums over the drivers: logs padded over a frame a
#: dead writer left claimed (a kill mid-claim, or an Aeron C writer's mid-offer), commands
#: likewise, clients timed out
DRIVER_STATS = ("unblocked publications", "unblocked commands", "client timeouts")
IPC_STREAM, UDP_STREAM = 1001, 2001
#: large messages (past the log's max message: shared-memory blocks) on a stream of their own
LARGE_STREAM = 1003
#: the Aeron pair's stream: the C programs' message, one concurrent publication shared by the
#: Aeron C writer and a shmbus writer, read by the Aeron C reader and a shmbus reader
AERON_STREAM = 1005
#: messages a second of each of the Aeron stream's two writers
AERON_RATE = 5000.0
TERM_LENGTH = 256 * 1024
#: large messages a second at most (of 100 B to 200 KB)
LARGE_RATE = 200.0
MIN_FRAME = 64  # the smallest message (24 bytes) takes a 64-byte frame
#: the bus tmpfs: the logs (a few MiB), the CnC file (4 MiB), and the large-message stream's
#: block ring, which keeps up to 64 MiB warm (shmbus/shm/block_ring.py) for each publication
#: that wrote one: after a driver kill, or a rebuilt large writer, the old ring stays until
#: every process that mapped it lets go, so two or three of them at once
TMPFS_MB = 320
#: how long fill-disk holds the bus tmpfs full
FILL_HOLD_S = 1.0
#: the pause between two faults (uniform): the data path carries most of the run
PAUSE_S = (2.0, 5.0)
LOSS = "drop=0.02,dup=0.02,reorder=0.02,delay=0.002,direction=both"
#: the keyring entry the UDP channels are sealed with
KEY_NAME = "nemesis"


def udp_channel(port: int) -> str:
    """The UDP stream's and service's channel: authenticated (every datagram sealed)."""
    return f"aeron:udp?endpoint=127.0.0.1:{port}|key={KEY_NAME}"


def write_keyring(directory: Path) -> Path:
    """A keyring (mode 0600) with the key the UDP channels name, made as a user makes it."""
    path = directory / "keyring"
    subprocess.run([sys.executable, "-m", "shmbus", "keygen", KEY_NAME, "--keyring", str(path)],
                   check=True, capture_output=True, timeout=60)
    return path


def call_channels(port: int, response_port: int) -> list[tuple[str, str, str]]:
    """The request/reply services: (caller name, requester's channel, responders' channel),
    on aeron:ipc and across the netbridge (the responders on the UDP endpoint, the caller's
    replies back on its own)."""
    udp = udp_channel(port)
    return [("caller", "aeron:ipc", "aeron:ipc"),
            ("caller-udp", f"{udp}|response-endpoint=127.0.0.1:{response_port}", udp)]


def writer_specs(count: int, port: int) -> list[WriterSpec]:
    """``count`` writers cycling through the kinds (two concurrent IPC writers share a log)."""
    udp = udp_channel(port)
    kinds = [
        WriterSpec("ipc-exclusive-batch", "aeron:ipc", IPC_STREAM, True, 24, 200, True),
        WriterSpec("ipc-concurrent-claim", "aeron:ipc", IPC_STREAM, False, 24, 300, False),
        WriterSpec("udp-exclusive-batch", udp, UDP_STREAM, True, 24, 200, True),
        WriterSpec("ipc-exclusive-fragmented", "aeron:ipc", IPC_STREAM, True, 2000, 9000,
                   False),
        WriterSpec("ipc-concurrent-batch", "aeron:ipc", IPC_STREAM, False, 24, 400, True),
        WriterSpec("udp-concurrent-fragmented", udp, UDP_STREAM, False, 1500, 6000, False),
        # large messages (most past the log's max, 32 KiB) mixed with small ones in offer_many
        # batches; paced: each costs a copy and CRCs of up to 200 KB in Python
        WriterSpec("ipc-exclusive-large", "aeron:ipc", LARGE_STREAM, True, 100, 200_000, True,
                   rate=LARGE_RATE),
    ]
    return [kinds[i % len(kinds)] for i in range(count)]


def aeron_writer_specs() -> list[WriterSpec]:
    """The Aeron stream's writers, both on one concurrent publication: a shmbus writer of
    offer_many batches (whole messages) and the Aeron C writer (fragmented ones among them:
    Aeron's MTU is 1408 B)."""
    return [
        WriterSpec("aeron-stream-shmbus-batch", "aeron:ipc", AERON_STREAM, False, 20, 1300,
                   True, rate=AERON_RATE, message_format="aeron"),
        WriterSpec("aeron-stream-aeron-c", "aeron:ipc", AERON_STREAM, False, 20, 3000, False,
                   rate=AERON_RATE, message_format="aeron", program="aeron-c"),
    ]


#: the shmbus reader of the Aeron stream (the Aeron C reader is run by aeron_pair.py)
AERON_READER = ReaderSpec("aeron-shmbus", "tethered", "aeron:ipc", AERON_STREAM,
                          message_format="aeron")
#: the Aeron C reader's name in the summary and the breaches
AERON_C_READER = "aeron-c"


def reader_specs(count: int, port: int, recordings: Path) -> list[ReaderSpec]:
    udp = udp_channel(port)
    kinds = [
        ReaderSpec("tethered", "tethered", "aeron:ipc", IPC_STREAM),
        ReaderSpec("untethered", "untethered", "aeron:ipc?tether=false", IPC_STREAM),
        ReaderSpec("udp", "network", udp, UDP_STREAM),
        ReaderSpec("spy", "spy", f"aeron-spy:{udp}", UDP_STREAM),
        ReaderSpec("recorder", "recorder", "aeron:ipc", IPC_STREAM, str(recordings)),
        ReaderSpec("large", "tethered", "aeron:ipc", LARGE_STREAM),
        ReaderSpec("late-joiner", "late-joiner", "aeron:ipc", IPC_STREAM,
                   str(recordings / "late-joiner")),
        # large messages recorded with their payloads (side files), read back and checked
        ReaderSpec("recorder-large", "recorder", "aeron:ipc", LARGE_STREAM,
                   str(recordings / "large")),
    ]
    return [kinds[i] if i < len(kinds) else
            ReaderSpec(f"tethered-{i}", "tethered", "aeron:ipc", IPC_STREAM)
            for i in range(count)]


# -- the bus under attack ------------------------------------------------------------------------

def cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU seconds of process ``pid`` (None: it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, ValueError):
        return None
    return float(times.user + times.system)


@contextlib.contextmanager
def small_tmpfs(root: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` mounted on ``root``/fs (root may mount; others get a clear
    error), unmounted at the end."""
    mount_point = root / "fs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"nemesis: cannot mount a tmpfs on {mount_point} (run as root): "
                         f"{result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@dataclass
class Bus:
    """The driver process the nemesis runs (and replaces), and its context."""

    context: shmbus.Context
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    #: drivers that exited at once (see start)
    restarts_refused: int = 0

    def start(self) -> None:
        """Start a driver and wait until a client can connect (bounded: 30 s). A driver that
        exits at once (a full bus tmpfs: the old driver's logs stay until every process that
        mapped them lets go) is started again until the deadline."""
        deadline = time.monotonic() + 30
        while True:
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.context.driver_command(), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=log, start_new_session=True)
            self.starts += 1
            while self.process.poll() is None:
                try:
                    shmbus.connect(self.context).close()
                    return
                except (shmbus.DriverUnavailableError, shmbus.DriverTimeoutError):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            if time.monotonic() > deadline:
                self.process.kill()
                free = shutil.disk_usage(self.context.dir).free
                raise SystemExit(
                    f"nemesis: no driver started within 30 s (last exit code "
                    f"{self.process.poll()}, {free} bytes free on the bus tmpfs; their output: "
                    f"{self.keep_log()})")
            self.restarts_refused += 1
            time.sleep(0.5)

    def cpu_seconds(self) -> list[tuple[str, float]]:
        """(name, CPU seconds) of the driver and its netbridge now."""
        if self.process is None:
            return []
        found = [("driver", cpu_seconds(self.process.pid))]
        found += [("netbridge", cpu_seconds(b.pid)) for b in self.netbridges()]
        return [(name, seconds) for name, seconds in found if seconds is not None]

    def keep_log(self) -> Path:
        """A copy of the drivers' output that outlives the run's directory."""
        kept = Path(tempfile.gettempdir()) / f"nemesis-driver-{os.getpid()}.log"
        shutil.copy(self.log_path, kept)
        return kept

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def netbridges(self) -> list[psutil.Process]:
        assert self.process is not None
        try:
            return [p for p in psutil.Process(self.process.pid).children(recursive=True)
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Workers:
    """The writer and reader processes, restartable by index."""

    context: shmbus.Context
    ledger: Ledger
    ledger_path: str
    seed: int
    writers: list[WriterSpec]
    readers: list[ReaderSpec]
    mp: Any = field(default_factory=lambda: multiprocessing.get_context("spawn"))
    writer_processes: list[Any] = field(default_factory=list)
    reader_processes: list[Any] = field(default_factory=list)
    responder_processes: list[Any] = field(default_factory=list)
    #: (caller name, the requester's channel, the responders' channel) per service
    call_channels: list[tuple[str, str, str]] = field(
        default_factory=lambda: [("caller", "aeron:ipc", "aeron:ipc")])
    caller_processes: list[Any] = field(default_factory=list)
    #: the Aeron C writer and reader (None: the run has no Aeron pair)
    aeron: AeronPair | None = None

    def __post_init__(self) -> None:
        self.call_tallies: dict[str, dict[str, int]] = {}
        #: the threads' stacks of each reader that sent no report, by name
        self.stuck: dict[str, str] = {}
        self.stop_writing = Flag(self.mp)
        self.leave = Flag(self.mp)
        self.stop_reading = Flag(self.mp)
        self.results = self.mp.Queue()
        self.errors = self.mp.Queue()
        #: monotonic seconds: the workers started; the writers were told to stop
        self.started_at = self.stopped_at = 0.0

    def cpu_seconds(self) -> list[tuple[str, float]]:
        """(name, CPU seconds) of each worker process alive now (a process killed and
        started again counts from its new start)."""
        named = ([(f"writer-{i}", p) for i, p in enumerate(self.writer_processes)
                  if p is not None]
                 + [(spec.name, p) for spec, p in zip(self.readers, self.reader_processes,
                                                       strict=True)]
                 + [(f"responder-{i}", p) for i, p in enumerate(self.responder_processes)]
                 + [(self.call_channels[i][0], p) for i, p in enumerate(self.caller_processes)])
        return [(name, seconds) for name, process in named
                if (seconds := cpu_seconds(process.pid)) is not None] + (
                    self.aeron.cpu_seconds() if self.aeron is not None else [])

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.reader_processes = [self._reader(i) for i in range(len(self.readers))]
        self.writer_processes = [self._writer(i) if spec.program == "shmbus" else None
                                 for i, spec in enumerate(self.writers)]
        if self.aeron is not None:
            self.aeron.start()
        self.responder_processes = [self._responder(i)
                                    for i in range(2 * len(self.call_channels))]
        self.caller_processes = [self._caller(i) for i in range(len(self.call_channels))]

    def _responder(self, i: int) -> Any:
        """Responder ``i``: two per service (call_channels)."""
        process = self.mp.Process(target=calls.run_responder, name=f"responder-{i}",
                                  args=(self.context, self.leave, self.errors,
                                        self.call_channels[i // 2][2]), daemon=True)
        process.start()
        return process

    def _caller(self, i: int) -> Any:
        name, channel, _ = self.call_channels[i]
        process = self.mp.Process(target=calls.run_caller, name=name,
                                  args=(self.context, self.seed + i, self.stop_writing,
                                        self.results, self.errors, channel, name),
                                  daemon=True)
        process.start()
        return process

    def kill_responder(self, i: int) -> None:
        """SIGKILL responder ``i`` and start it again."""
        process = self.responder_processes[i]
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        self.responder_processes[i] = self._responder(i)

    def _writer(self, i: int) -> Any:
        process = self.mp.Process(
            target=run_writer, name=f"writer-{i}",
            args=(self.context, self.ledger_path, len(self.writers), i, self.writers[i],
                  self.seed, self.stop_writing, self.leave, self.errors), daemon=True)
        process.start()
        return process

    def _reader(self, i: int) -> Any:
        process = self.mp.Process(
            target=run_reader, name=f"reader-{self.readers[i].name}",
            args=(self.context, self.readers[i], self.stop_reading, self.results,
                  self.errors), daemon=True)
        process.start()
        return process

    def kill_writer(self, i: int, ending: int) -> None:
        """SIGKILL writer ``i``, note how its incarnation ended, start it again."""
        process = self.writer_processes[i]
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        incarnation = self.ledger.incarnations(i) - 1
        if incarnation >= 0 and self.ledger.counts(i, incarnation)[2] == 0:
            self.ledger.end(i, incarnation, ending)
        self.ledger.request_hold(i, False)
        self.writer_processes[i] = self._writer(i)

    def restart_the_dead(self) -> list[str]:
        """Start again any worker that died without being killed (each is a breach)."""
        deaths = []
        for i, process in enumerate(self.writer_processes):
            if process is not None and not process.is_alive():
                deaths.append(f"writer {i} ({self.writers[i].name}) died: exit code "
                              f"{process.exitcode}")
                self.writer_processes[i] = self._writer(i)
        for i, process in enumerate(self.reader_processes):
            if not process.is_alive():
                deaths.append(f"reader {self.readers[i].name} died: exit code "
                              f"{process.exitcode}")
                self.reader_processes[i] = self._reader(i)
        for i, process in enumerate(self.responder_processes):
            if not process.is_alive():
                deaths.append(f"responder {i} died: exit code {process.exitcode}")
                self.responder_processes[i] = self._responder(i)
        for i, process in enumerate(self.caller_processes):
            if not process.is_alive():
                deaths.append(f"the {self.call_channels[i][0]} died: exit code "
                              f"{process.exitcode}")
                self.caller_processes[i] = self._caller(i)
        return deaths

    def finish(self, drain_s: float) -> dict[str, SubscriberCheck]:
        """Stop writing, let readers drain, collect their checks, end every process."""
        self.stop_writing.set()
        if self.aeron is not None:
            self.aeron.stop_writing()
        self.stopped_at = time.monotonic()
        time.sleep(drain_s)
        self.stop_reading.set()
        if self.aeron is not None:
            self.aeron.stop_reading()
        checks: dict[str, SubscriberCheck] = {}
        deadline = time.monotonic() + 120  # a recorder checks its last windows first
        callers = {name for name, _, _ in self.call_channels}
        while (len(checks) < len(self.readers) or len(self.call_tallies) < len(callers)) \
                and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                name, check = self.results.get(timeout=1)
                if name in callers:
                    self.call_tallies[name] = check
                else:
                    checks[name] = check
        self.stuck = {spec.name: self._stacks(process)
                      for spec, process in zip(self.readers, self.reader_processes, strict=True)
                      if spec.name not in checks and process.is_alive()}
        self.leave.set()
        if self.aeron is not None:
            self.aeron.leave()
        for process in ([p for p in self.writer_processes if p is not None]
                        + self.reader_processes + self.responder_processes
                        + self.caller_processes):
            process.join(15)
            if process.is_alive():
                process.kill()
                process.join()
        for process in self.reader_processes:
            stack_file(process.pid).unlink(missing_ok=True)
        return checks

    @staticmethod
    def _stacks(process: Any) -> str:
        """The threads' stacks of a reader that sent no report (it dumps them on SIGUSR1)."""
        os.kill(process.pid, signal.SIGUSR1)
        time.sleep(1)
        try:
            return stack_file(process.pid).read_text() or "(it wrote no stack)"
        except OSError as e:
            return f"(no stack: {e})"

    def errors_seen(self) -> list[str]:
        found = []
        while True:
            try:
                found.append(self.errors.get_nowait())
            except Exception:
                return found


# -- faults --------------------------------------------------------------------------------------

class Nemesis:
    """Runs one fault at a time; ``fired`` counts the faults that took effect."""

    def __init__(self, bus: Bus, workers: Workers, disk: Path, rng: random.Random) -> None:
        self.bus = bus
        self.workers = workers
        self.disk = disk
        self.rng = rng
        self.fired: Counter[str] = Counter()
        self.stops: Counter[str] = Counter()
        self.notes: list[str] = []
        #: the netbridge's channel statistics, summed over the netbridges the nemesis killed
        self.udp: Counter[str] = Counter()
        #: the driver's DRIVER_STATS, summed over the drivers the nemesis killed
        self.driver: Counter[str] = Counter()

    def sample_udp(self, driver: bool = False) -> None:
        """Add the netbridge's loss statistics (read with ``shmbus stat``) before they go: call
        before killing the netbridge or the driver, and at the end; with ``driver``, the
        driver's DRIVER_STATS too (call before killing the driver, and at the end)."""
        result = subprocess.run([sys.executable, "-m", "shmbus", "stat", "--once", "--json",
                                 "--dir", self.bus.context.dir],
                                capture_output=True, text=True, timeout=60)
        if result.returncode:
            self.notes.append(f"shmbus stat failed: {result.stderr.strip()}")
            return
        for counter in json.loads(result.stdout)["counters"]:
            name = counter["label"].partition(":")[0]
            if name in UDP_STATS:
                self.udp[name] += counter["value"]
            elif driver and name in DRIVER_STATS:
                self.driver[name] += counter["value"]
        if self.udp["gaps"]:
            self.fired["udp-loss"] = 1

    def run(self, fault: str) -> None:
        getattr(self, fault.replace("-", "_"))()

    def _wait_for_phase(self, writer: int, phase: int, timeout: float) -> bool:
        return bool(poll_until(lambda: self.workers.ledger.phase(writer) == phase, timeout,
                               PHASE_POLL_S))

    def kill_writer_mid_offer(self) -> None:
        writer = self.rng.choice([i for i, s in enumerate(self.workers.writers)
                                  if s.program == "shmbus"])
        if self._wait_for_phase(writer, OFFERING, 5):
            self.workers.kill_writer(writer, KILLED_MID_OFFER)
            self.fired["kill-writer-mid-offer"] += 1

    def kill_writer_mid_claim(self) -> None:
        ipc = [i for i, s in enumerate(self.workers.writers)
               if s.channel == "aeron:ipc" and s.program == "shmbus"]
        if not ipc:
            return
        writer = self.rng.choice(ipc)
        self.workers.ledger.request_hold(writer, True)
        if self._wait_for_phase(writer, HOLDING_CLAIM, 5):
            self.workers.kill_writer(writer, KILLED_MID_CLAIM)
            self.fired["kill-writer-mid-claim"] += 1
        else:
            self.workers.ledger.request_hold(writer, False)

    def stop_subscriber(self) -> None:
        reader = self.rng.randrange(len(self.workers.readers))
        pid = self.workers.reader_processes[reader].pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep(self.bus.context.client_liveness_timeout * 1.5 + 0.5)
        os.kill(pid, signal.SIGCONT)
        self.fired["stop-subscriber"] += 1
        self.stops[self.workers.readers[reader].name] += 1

    def kill_driver(self) -> None:
        self.sample_udp(driver=True)
        self.bus.kill()
        self.bus.start()
        self.fired["kill-driver"] += 1

    def kill_netbridge(self) -> None:
        bridges = self.bus.netbridges()
        wait_until = time.monotonic() + 10  # early in a run it may still be starting
        while not bridges and time.monotonic() < wait_until:
            time.sleep(0.2)
            bridges = self.bus.netbridges()
        if not bridges:
            self.notes.append("kill-netbridge: no netbridge running")
            return
        self.sample_udp()
        for bridge in bridges:
            with contextlib.suppress(psutil.NoSuchProcess):  # it exited meanwhile (the
                bridge.kill()  # driver kills a netbridge it declared dead)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(b.pid not in {old.pid for old in bridges} for b in self.bus.netbridges()):
                self.fired["kill-netbridge"] += 1
                return
            time.sleep(0.1)
        self.notes.append("kill-netbridge: the driver did not start another within 20 s")

    def kill_view_holder(self) -> None:
        """A reader takes a zero-copy view of a large message (holding its block and its
        position) and is SIGKILLed holding it: the driver drops it, its block is freed and the
        large writer goes on (the large-memory rule checks the end)."""
        if not any(s.stream_id == LARGE_STREAM for s in self.workers.writers):
            return
        holding = Flag(self.workers.mp)
        process = self.workers.mp.Process(
            target=run_view_holder, name="view-holder",
            args=(self.bus.context, LARGE_STREAM, holding, self.workers.errors), daemon=True)
        process.start()
        if holding.wait(15):
            self.fired["kill-view-holder"] += 1
        else:
            self.notes.append("kill-view-holder: no large message to hold within 15 s")
        os.kill(process.pid, signal.SIGKILL)
        process.join()

    def kill_aeron_writer(self) -> None:
        """SIGKILL the Aeron C writer inside an offer, or (every other time, at random)
        holding a claim it was asked to hold (its phase in the ledger): its frame of the
        concurrent publication is left claimed and unwritten, which the driver must unblock;
        the monitor starts it again (a new incarnation, sequence from 0)."""
        if self.workers.aeron is None:
            return
        mid_claim = self.rng.random() < 0.5
        if self.workers.aeron.kill_writer(mid_claim):
            self.fired["kill-aeron-writer"] += 1
        else:
            self.notes.append(f"kill-aeron-writer: the Aeron C writer was not "
                              f"{'holding a claim' if mid_claim else 'offering'} within 5 s")

    def kill_aeron_reader(self) -> None:
        """SIGKILL the Aeron C reader inside a poll (its phase in its progress file): the
        driver times its client out and frees its position; the monitor starts it again."""
        if self.workers.aeron is None:
            return
        if self.workers.aeron.kill_reader():
            self.fired["kill-aeron-reader"] += 1
        else:
            self.notes.append("kill-aeron-reader: the Aeron C reader was not polling within 5 s")

    def kill_responder(self) -> None:
        self.workers.kill_responder(self.rng.randrange(len(self.workers.responder_processes)))
        self.fired["kill-responder"] += 1

    def fill_disk(self) -> None:
        """Fill the bus tmpfs with a ballast file, hold it full for FILL_HOLD_S, free it."""
        ballast = self.disk / "ballast"
        chunk = b"\xa5" * (1 << 20)
        with open(ballast, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        time.sleep(FILL_HOLD_S)
        self.fired["fill-disk"] += 1
        ballast.unlink()


# -- the run -------------------------------------------------------------------------------------

class FlowSampler:
    """Counts the seconds in which the writers' acked messages grew (a thread reading the
    ledger once a second): how much of the run the data path carried."""

    def __init__(self, ledger: Ledger, writers: int) -> None:
        self.ledger, self.writers = ledger, writers
        self.seconds = self.flowing = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flow-sampler", daemon=True)
        self._thread.start()

    def _total(self) -> int:
        return sum(self.ledger.counts(w, i)[0] for w in range(self.writers)
                   for i in range(self.ledger.incarnations(w)))

    def _run(self) -> None:
        last = self._total()
        while not self._stop.wait(1.0):
            now = self._total()
            self.seconds += 1
            self.flowing += now > last
            last = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def collect_sent(ledger: Ledger, writers: int) -> dict[Key, Sent]:
    sent = {}
    for w in range(writers):
        for i in range(ledger.incarnations(w)):
            sent[(w, i)] = Sent(*ledger.counts(w, i))
    return sent


def large_memory_held(context: shmbus.Context) -> list[tuple[int, int, int]]:
    """(stream, session, bytes) of publications whose block rings still hold blocks not freed
    (``shmbus streams --json``): after the drain, every block must have been freed."""
    result = subprocess.run([sys.executable, "-m", "shmbus", "streams", "--json",
                             "--dir", context.dir], capture_output=True, text=True, timeout=60)
    if result.returncode:
        return [(0, 0, -1)]
    return [(s["stream_id"], s["session_id"], s["large_message_in_use"])
            for s in json.loads(result.stdout)["streams"]
            if s["kind"] == "publication" and s["large_message_in_use"] > 0]


def aeron_summary(sent: dict[Key, Sent], reports: list[SubscriberReport],
                  specs: list[WriterSpec], pair: AeronPair) -> str:
    """The Aeron pair's line: what each writer of the Aeron stream sent (in how many
    incarnations, by how they ended), and what each of its readers checked."""
    parts = []
    for w, spec in enumerate(specs):
        if spec.stream_id != AERON_STREAM:
            continue
        mine = [s for (writer, _), s in sent.items() if writer == w]
        endings = Counter(ENDINGS[s.ending] for s in mine)
        parts.append(f"{spec.program} writer {w} sent {sum(s.acked for s in mine)} in "
                     f"{len(mine)} incarnations ("
                     + ", ".join(f"{e} {n}" for e, n in sorted(endings.items())) + ")")
    c_endings = pair.endings(pair.reader_program)
    parts.append(f"{AERON_C_READER} reader checked {pair.checked()} in "
                 f"{len(pair.reader_program.incarnations)} incarnations ("
                 + ", ".join(f"{e} {n}" for e, n in sorted(c_endings.items())) + ")")
    for r in reports:
        if r.kind != "aeron-c" and r.name == AERON_READER.name:
            received = sum(t.received for t in r.check.tracks.values())
            parts.append(f"{r.name} reader checked {received} (corrupt {r.check.corrupt}, "
                         f"rebuilt {r.check.rebuilds.total()})")
    return f"aeron pair (stream {AERON_STREAM}, one concurrent publication): " + "; ".join(parts)


def summary(sent: dict[Key, Sent], reports: list[SubscriberReport], specs: list[WriterSpec],
            nemesis: Nemesis) -> str:
    lines = ["writer incarnations (received/lost/dup/reordered/skipped summed over readers):",
             f"{'writer':<34}{'inc':>4}{'sent':>10}{'received':>11}{'lost':>6}{'dup':>5}"
             f"{'reord':>6}{'skipped':>9}  ending"]
    for w in sorted({w for w, _ in sent}):
        idle: Counter[str] = Counter()  # incarnations that sent nothing, by how they ended
        for i in sorted(i for writer, i in sent if writer == w):
            s = sent[(w, i)]
            tracks = [r.check.tracks.get((w, i), Track()) for r in reports]
            if not s.acked and not any(t.received for t in tracks):
                idle[ENDINGS[s.ending]] += 1
                continue
            lines.append(
                f"{w:>2} {specs[w].name:<31}{i:>4}{s.acked:>10}"
                f"{sum(t.received for t in tracks):>11}{sum(t.lost for t in tracks):>6}"
                f"{sum(t.duplicated for t in tracks):>5}{sum(t.reordered for t in tracks):>6}"
                f"{sum(t.skipped for t in tracks):>9}  {ENDINGS[s.ending]}")
        if idle:
            lines.append(f"{w:>2} {specs[w].name:<31} and {idle.total()} incarnations that "
                         f"sent nothing: " + ", ".join(f"{ending} {n}" for ending, n in
                                                      sorted(idle.items())))
    lines += ["", "readers:",
              f"{'reader':<16}{'kind':<12}{'received':>11}{'lost':>6}{'dup':>5}{'reord':>6}"
              f"{'skipped':>10}{'corrupt':>8}{'torn':>5}{'rebuilds':>9}{'stopped':>8}  why rebuilt"]
    for r in reports:
        tracks = list(r.check.tracks.values())
        lines.append(
            f"{r.name:<16}{r.kind:<12}{sum(t.received for t in tracks):>11}"
            f"{sum(t.lost for t in tracks):>6}{sum(t.duplicated for t in tracks):>5}"
            f"{sum(t.reordered for t in tracks):>6}{sum(t.skipped for t in tracks):>10}"
            f"{r.check.corrupt:>8}{r.check.torn:>5}{r.check.rebuilds.total():>9}"
            f"{nemesis.stops[r.name]:>8}  "
            + ", ".join(f"{reason} {n}" for reason, n in sorted(r.check.rebuilds.items())))
    lines += [f"{r.name}: {r.check.joins} joins" for r in reports if r.check.joins]
    if nemesis.workers.aeron is not None:
        lines += ["", aeron_summary(sent, reports, specs, nemesis.workers.aeron)]
    udp = ", ".join(f"{name} {nemesis.udp[name]}" for name in UDP_STATS)
    driver = ", ".join(f"{name} {nemesis.driver[name]}" for name in DRIVER_STATS)
    lines += ["", "faults fired: " + ", ".join(f"{f}={nemesis.fired[f]}" for f in FAULTS),
              f"udp-loss: {LOSS} ({udp})",
              f"driver counters (summed over the drivers): {driver}"]
    return "\n".join(lines)


def run(seconds: float, seed: int, publishers: int, subscribers: int,
        faults: tuple[str, ...] = SCHEDULED, aeron: bool = True,
        tamper_aeron: int | None = None) -> int:
    """One run (``faults``: those scheduled; ``aeron``: with the Aeron pair, which needs
    ``make aeron-c``; ``tamper_aeron``: the Aeron C writer's first incarnation corrupts its
    message of that sequence, a self-test the run must report as a breach). The exit status:
    1 on any breach, else 0."""
    rng = random.Random(seed)
    programs = None
    if aeron:
        try:
            programs = build_programs()
        except AeronCNotBuilt as e:
            raise SystemExit(f"nemesis: {e} (or run without the Aeron pair: --no-aeron)") from e
    scheduled = [f for f in faults if aeron or f not in AERON_FAULTS]
    port, response_port = free_udp_ports(2)
    with tempfile.TemporaryDirectory(prefix="nemesis-") as tmp, \
            small_tmpfs(Path(tmp), TMPFS_MB) as disk:
        context = shmbus.Context(
            dir=str(disk / "bus"), embedded_driver=False, driver_timeout=3.0,
            client_liveness_timeout=2.0, keepalive_interval=0.2,
            publication_unblock_timeout=1.0, publication_linger_timeout=1.0,
            untethered_window_limit_timeout=1.0, untethered_resting_timeout=1.0,
            ipc_term_length=TERM_LENGTH, udp_term_length=TERM_LENGTH,
            driver_idle_timeout=3600.0, keyring=str(write_keyring(Path(tmp))),
            netbridge_loss=f"{LOSS},seed={seed}")
        ledger_path = str(Path(tmp) / "ledger")
        specs = writer_specs(publishers, port) + (aeron_writer_specs() if aeron else [])
        ledger = Ledger(ledger_path, len(specs), create=True)
        bus = Bus(context, Path(tmp) / "driver.log")
        bus.start()
        pair = None
        if programs is not None:
            c_writer = next(i for i, spec in enumerate(specs) if spec.program == "aeron-c")
            pair = AeronPair(programs, context, ledger, ledger_path, c_writer, specs[c_writer],
                             Path(tmp) / "aeron", tamper=tamper_aeron)
        readers = reader_specs(subscribers, port, Path(tmp) / "recordings") + (
            [AERON_READER] if aeron else [])
        workers = Workers(context, ledger, ledger_path, seed, specs, readers,
                          call_channels=call_channels(port, response_port), aeron=pair)
        workers.start()
        flow = FlowSampler(ledger, len(specs))
        nemesis = Nemesis(bus, workers, disk, rng)
        try:
            deadline = time.monotonic() + seconds - 8  # the drain takes the rest
            round_: list[str] = []
            deaths: list[str] = []
            peak_used = 0  # bytes used on the bus tmpfs, sampled before each fault
            rounds, round_began = 0, 0.0
            time.sleep(2)
            while True:
                if not round_:
                    # every round runs to its end; another starts while one as long as the
                    # last can end by the deadline (so every fault fires at least once, and a
                    # run takes about as long as asked)
                    now = time.monotonic()
                    if rounds and now + (now - round_began) > deadline:
                        break
                    round_ = rng.sample(scheduled, len(scheduled))
                    rounds, round_began = rounds + 1, now
                fault = round_.pop()
                print(f"[{time.strftime('%H:%M:%S')}] {fault}", end="", flush=True)
                began = time.monotonic()
                nemesis.run(fault)
                print(f" ({time.monotonic() - began:.1f} s)", flush=True)
                deaths += workers.restart_the_dead()
                if bus.process is not None and bus.process.poll() is not None:
                    deaths.append(f"the driver died: exit code {bus.process.returncode}")
                    bus.start()
                time.sleep(min(rng.uniform(*PAUSE_S), max(0.0, deadline - time.monotonic())))
                peak_used = max(peak_used, shutil.disk_usage(disk).used)
            time.sleep(max(3.0, deadline - time.monotonic()))  # rebuilt clients settle
            if pair is not None and not pair.await_following(2.0, 20.0):
                deaths.append("the Aeron C writer and reader were not both running for 2 s "
                              "within 20 s after the last fault")
            nemesis.sample_udp(driver=True)
            deaths += workers.restart_the_dead()
            cpu = workers.cpu_seconds() + bus.cpu_seconds()
            flow.stop()
            checks = workers.finish(drain_s=3)
            sent = collect_sent(ledger, len(specs))
            held = large_memory_held(context)
        finally:
            flow.stop()
            if pair is not None:
                pair.close()
            bus.stop()
            ledger.close()
        found = deaths + workers.errors_seen()
        readers = workers.readers
        missing = [r.name for r in readers if r.name not in checks]
        found += [f"reader {name} sent no report; where it was:\n"
                  f"{workers.stuck.get(name, '(it had exited)')}" for name in missing]
        reports = [SubscriberReport(r.name, r.kind,
                                    frozenset(i for i, w in enumerate(specs)
                                              if w.stream_id == r.stream_id), checks[r.name])
                   for r in readers if r.name in checks]
        aeron_writers = frozenset(i for i, w in enumerate(specs) if w.stream_id == AERON_STREAM)
        if pair is not None:
            reports.append(SubscriberReport(AERON_C_READER, "aeron-c", aeron_writers,
                                            pair.reader_check()))
        found += breaches(sent, reports, driver_loss_bound=TERM_LENGTH // MIN_FRAME)
        if pair is not None:
            found += pair.findings
            final = pair.final_reader()
            if final is None:
                found.append(f"the {AERON_C_READER} reader's last incarnation did not follow the "
                             f"stream from 1 s before the writers stopped to the end")
            else:
                found += final_reader_breaches(AERON_C_READER, sent, aeron_writers, final)
        found += [f"stream {stream} session {session}: {held_bytes} bytes of large-message "
                  f"memory still held after every reader drained (a block never freed)"
                  for stream, session, held_bytes in held]
        for name, _, _ in workers.call_channels:
            found += calls.call_breaches(workers.call_tallies.get(name), name)
        print(summary(sent, reports, specs, nemesis))
        streamed = workers.stopped_at - workers.started_at
        print(f"messages sent: {sum(s.acked for s in sent.values())} in {streamed:.0f} s: "
              f"{sum(s.acked for s in sent.values()) / streamed * 60 / 1e6:.2f} M a minute; "
              f"they flowed in {flow.flowing} of {flow.seconds} seconds")
        for name, _, _ in workers.call_channels:
            print(calls.summary_line(workers.call_tallies.get(name), name))
        print(f"bus tmpfs: {TMPFS_MB} MiB, at most {peak_used / (1 << 20):.0f} MiB used "
              f"between faults")
        print("cpu s (processes alive at the end): "
              + ", ".join(f"{name} {seconds:.0f}" for name, seconds in
                          sorted(cpu, key=lambda c: -c[1])))
        for note in nemesis.notes:
            print(f"note: {note}")
        if bus.restarts_refused:
            print(f"note: {bus.restarts_refused} drivers exited as they started (their output: "
                  f"{bus.keep_log()}) and were started again")
        if found:
            print(f"\nthe drivers' output: {bus.keep_log()}")
            print(f"BREACHES ({len(found)}):")
            for line in found[:200]:
                print(f"  {line}")
            return 1
        print("\nno breach")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float)
    length.add_argument("--seconds", type=float)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--publishers", type=int, default=7)
    parser.add_argument("--subscribers", type=int, default=8)
    parser.add_argument("--faults", default=",".join(SCHEDULED),
                        help="the scheduled faults, comma-separated (default: all)")
    parser.add_argument("--no-aeron", action="store_true",
                        help="without the Aeron pair (it needs `make aeron-c`)")
    parser.add_argument("--tamper-aeron", type=int, metavar="SEQUENCE",
                        help="a self-test: the Aeron C writer's first incarnation corrupts its "
                             "message SEQUENCE, which the run must report as a breach")
    args = parser.parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = sorted(set(faults) - set(SCHEDULED))
    if unknown or not faults:
        parser.error(f"--faults: unknown {', '.join(unknown) or '(none given)'}; they are "
                     f"{', '.join(SCHEDULED)}")
    if args.no_aeron and args.tamper_aeron is not None:
        parser.error("--tamper-aeron needs the Aeron pair (without --no-aeron)")
    seconds = args.seconds if args.seconds is not None else 60 * (args.minutes or 10)
    if seconds < 20:
        parser.error("--seconds must be at least 20 (a fault round and the drain)")
    if not 1 <= args.publishers <= 64 or not 4 <= args.subscribers <= 32:
        parser.error("--publishers must be 1..64 and --subscribers 4..32")
    return run(seconds, args.seed, args.publishers, args.subscribers, faults,
               not args.no_aeron, args.tamper_aeron)


if __name__ == "__main__":
    sys.exit(main())
