"""The Aeron pair of tools/nemesis/run.py: Aeron's own C client, a writer (aeron_publish) and a
reader (aeron_subscribe) of tools/aeron_c/c/ in their long-running modes, run as processes on
the Aeron stream beside a shmbus writer and reader of the same stream (workers.py).

The C writer is a writer of the ledger (its phase, acked and attempted stored by the program
itself at the offsets it is given; the nemesis begins each incarnation and writes how it
ended), publishing with publisher id ``check.aeron_publisher_id(writer, incarnation)``, so a
restarted writer is a new publisher starting at sequence 0. The C reader checks each image
itself (aeron_subscribe.c states the rule) and counts what it checked in a progress file (so a
SIGKILLed incarnation's count is kept); its report is the JSON line it prints when it exits.

A monitor thread starts each program again when it exits: after the client's end (the
driver's death: Aeron's client ends once the driver's heartbeat is older than the driver
timeout; the driver timing it out) or a kill by the nemesis, both expected; any other exit
(status 1: a message broke a rule, or a client error; status 2; a signal the nemesis did not
send) is a breach, reported with the program's output.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import shmbus
from tools.aeron_c.programs import AeronC
from tools.nemesis.check import (
    DRIVER_LOST,
    FAILED,
    FINISHED,
    KILLED_MID_CLAIM,
    KILLED_MID_OFFER,
    REFUSED,
    TIMED_OUT,
    SubscriberCheck,
    Track,
    aeron_key,
    aeron_publisher_id,
)
from tools.nemesis.workers import HOLDING_CLAIM, OFFERING, PHASE_POLL_S, Ledger, WriterSpec
from tools.polling import poll_until

#: the programs' exit status when their client ended or could not start (common.h)
CLIENT_ENDED = 3
#: Aeron's client error codes (aeronc.h): the driver lost, the client timed out by the driver
DRIVER_TIMEOUT, CLIENT_TIMEOUT = 1000, 1001
#: the pause before a program is started again; doubled (up to the max) while incarnations
#: end before they ran a second (the driver being replaced, the disk full)
RESTART_PAUSE_S, RESTART_PAUSE_MAX_S = 0.1, 1.0
#: the reader's progress file: its phase (1 while in a poll), then messages checked by
#: incarnation
READER_PHASE = 0
MAX_READER_INCARNATIONS = 4096
POLLING = 1


def _ending_reason(status: int | None, summary: dict[str, Any] | None, killed: str,
                   stopped: bool) -> str:
    """How an incarnation ended, in a word or two: "killed mid-offer" or "killed mid-claim"
    (the writer), "killed mid-poll" (the reader), "stopped", "driver lost", "timed out" (by
    the driver), "client ended" (another end of Aeron's client), "refused" (it could not
    connect or add its publication or subscription), "failed" (a breach). ``stopped``: the
    nemesis sent it SIGTERM (one that came before it watched for it ended it at once)."""
    if killed:
        return f"killed {killed}"
    if status == 0 or (stopped and status == -signal.SIGTERM):
        return "stopped"
    if status == CLIENT_ENDED:
        if summary is None:
            return "refused"
        error = summary.get("error") or ""
        if f"error {DRIVER_TIMEOUT}:" in error:
            return "driver lost"
        if f"error {CLIENT_TIMEOUT}:" in error:
            return "timed out"
        return "client ended"
    return "failed"


@dataclass
class Incarnation:
    """One run of a C program."""

    number: int
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    started: float
    #: monotonic seconds it printed READY (a reader: its subscription added), None before
    ready_at: float | None = None
    #: killed by the nemesis: "mid-offer" or "mid-claim" (the writer), "mid-poll" (the
    #: reader); "" while not
    killed: str = ""
    #: the nemesis sent it SIGTERM (to stop it at the end)
    stopped: bool = False
    status: int | None = None
    summary: dict[str, Any] | None = None
    reason: str = ""

    def output(self) -> str:
        """Its stdout's and stderr's last lines (for a breach's report)."""
        out = self.stdout.read_text(errors="replace")[-1500:] if self.stdout.exists() else ""
        err = self.stderr.read_text(errors="replace")[-1500:] if self.stderr.exists() else ""
        return f"stdout {out.strip()!r}, stderr {err.strip()!r}"


@dataclass
class Program:
    """A C program the monitor keeps running: ``command(incarnation)`` starts it."""

    name: str
    command: Callable[[int], list[str]]
    logs: Path
    incarnations: list[Incarnation] = field(default_factory=list)
    pause: float = RESTART_PAUSE_S
    restart_at: float = 0.0

    @property
    def current(self) -> Incarnation | None:
        return self.incarnations[-1] if self.incarnations else None

    def start(self) -> Incarnation:
        number = len(self.incarnations)
        stdout = self.logs / f"{self.name}-{number}.out"
        stderr = self.logs / f"{self.name}-{number}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(self.command(number), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=err, start_new_session=True)
        incarnation = Incarnation(number, process, stdout, stderr, time.monotonic())
        self.incarnations.append(incarnation)
        return incarnation


class ReaderProgress:
    """The C reader's progress file: its phase, and messages checked by incarnation (the
    program stores them; the nemesis reads them, also after a SIGKILL)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        size = 8 + 8 * MAX_READER_INCARNATIONS
        with path.open("wb") as f:
            f.truncate(size)
        fd = os.open(path, os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buffer = shmbus.AtomicBuffer(self._mmap)

    @staticmethod
    def record_offset(incarnation: int) -> int:
        if not 0 <= incarnation < MAX_READER_INCARNATIONS:
            raise ValueError(f"reader incarnation {incarnation} is outside the progress "
                             f"file's 0..{MAX_READER_INCARNATIONS - 1}")
        return 8 + 8 * incarnation

    def phase(self) -> int:
        return self.buffer.get_int64_acquire(READER_PHASE)

    def checked(self, incarnation: int) -> int:
        return self.buffer.get_int64_acquire(self.record_offset(incarnation))

    def close(self) -> None:
        del self.buffer  # the mapping cannot close while a buffer exports it
        self._mmap.close()


class AeronPair:
    """The Aeron C writer (writer ``writer`` of the ledger, run as ``spec`` says) and reader on
    the bus of ``context``: started by :meth:`start`, kept running by a monitor thread, killed
    by :meth:`kill_writer` and :meth:`kill_reader`, stopped by :meth:`stop_writing`,
    :meth:`stop_reading` and :meth:`leave` (as the shmbus workers are); the findings by
    :meth:`breaches`, the reader's checks by :meth:`reader_check`.

    ``tamper``: the writer's first incarnation flips a bit of its message of that sequence
    (after its CRC): a self-test of the run, which must report the breach."""

    def __init__(self, programs: AeronC, context: shmbus.Context, ledger: Ledger,
                 ledger_path: str, writer: int, spec: WriterSpec, logs: Path,
                 tamper: int | None = None) -> None:
        self.context, self.ledger, self.writer, self.spec = context, ledger, writer, spec
        self.tamper = tamper
        logs.mkdir(parents=True, exist_ok=True)
        self.progress = ReaderProgress(logs / "reader-progress")
        driver_timeout_ms = str(int(context.driver_timeout * 1000))
        common = ["--dir", context.dir, "--channel", spec.channel, "--stream",
                  str(spec.stream_id), "--until-stopped", "--driver-timeout-ms",
                  driver_timeout_ms, "--timeout-s", "10"]

        def writer_command(number: int) -> list[str]:
            incarnation = ledger.begin(writer)
            assert incarnation == number, (incarnation, number)
            command = [str(programs.publish), *common,
                       "--publisher-id", str(aeron_publisher_id(writer, incarnation)),
                       "--length", str(spec.min_length), "--max-length", str(spec.max_length),
                       "--rate", str(int(spec.rate)), "--hold-s", "300",
                       "--progress", ledger_path,
                       "--progress-record", str(ledger.record_offset(writer, incarnation)),
                       "--progress-phase", str(ledger.phase_offset(writer)),
                       "--progress-hold", str(ledger.hold_offset(writer))]
            if spec.exclusive:
                command.append("--exclusive")
            if tamper is not None and number == 0:
                command += ["--corrupt-sequence", str(tamper)]
            return command

        def reader_command(number: int) -> list[str]:
            return [str(programs.subscribe), *common, "--progress", str(self.progress.path),
                    "--progress-record", str(self.progress.record_offset(number)),
                    "--progress-phase", str(READER_PHASE)]

        self.writer_program = Program("aeron-c-writer", writer_command, logs)
        self.reader_program = Program("aeron-c-reader", reader_command, logs)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._writing = self._reading = True
        #: monotonic seconds the writers were told to stop
        self.stopped_writing_at: float | None = None
        self.findings: list[str] = []
        self._checked = 0
        self._monitor = threading.Thread(target=self._run, name="aeron-pair", daemon=True)

    # -- the processes -------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self.reader_program.start()
            self.writer_program.start()
        self._monitor.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with self._lock:
                for program, running in ((self.writer_program, self._writing),
                                         (self.reader_program, self._reading)):
                    self._look_after(program, running)

    def _look_after(self, program: Program, running: bool) -> None:
        """Note the current incarnation's READY and exit; start the next once due."""
        current = program.current
        if current is None:
            return
        if current.status is None:
            if current.ready_at is None and "READY\n" in _read(current.stdout):
                current.ready_at = time.monotonic()
            if current.process.poll() is None:
                return
            self._ended(program, current)
            ran = time.monotonic() - current.started
            program.pause = RESTART_PAUSE_S if ran > 1.0 or current.killed else min(
                2 * program.pause, RESTART_PAUSE_MAX_S)
            program.restart_at = time.monotonic() + program.pause
        if running and time.monotonic() >= program.restart_at:
            program.start()

    def _ended(self, program: Program, incarnation: Incarnation) -> None:
        incarnation.status = incarnation.process.returncode
        incarnation.summary = _summary(incarnation.stdout)
        incarnation.reason = _ending_reason(incarnation.status, incarnation.summary,
                                            incarnation.killed, incarnation.stopped)
        what = f"{program.name} incarnation {incarnation.number}"
        if incarnation.reason == "failed":
            self.findings.append(f"{what} exited with status {incarnation.status}: "
                                 f"{incarnation.output()}")
        if program is self.writer_program:
            self._end_writer(incarnation)

    def _end_writer(self, incarnation: Incarnation) -> None:
        """Write how the writer's run ended into the ledger (its n-th run is its ledger
        incarnation n: the nemesis begins one per run, and only for the runs it starts)."""
        ending = {"killed mid-offer": KILLED_MID_OFFER, "killed mid-claim": KILLED_MID_CLAIM,
                  "stopped": FINISHED, "driver lost": DRIVER_LOST,
                  "timed out": TIMED_OUT, "client ended": DRIVER_LOST, "refused": REFUSED,
                  "failed": FAILED}[incarnation.reason]
        self.ledger.end(self.writer, incarnation.number, ending)

    def kill_writer(self, mid_claim: bool, timeout: float = 5.0) -> bool:
        """SIGKILL the writer while it offers (its phase in the ledger), or with ``mid_claim``
        once it holds a claim it was asked to hold (the ledger's hold request), within
        ``timeout`` seconds; the monitor starts it again. Whether it was killed."""
        if mid_claim:
            self.ledger.request_hold(self.writer, True)
        phase, how = (HOLDING_CLAIM, "mid-claim") if mid_claim else (OFFERING, "mid-offer")
        try:
            return bool(poll_until(lambda: self.ledger.phase(self.writer) == phase
                                   and self._kill(self.writer_program, how), timeout, PHASE_POLL_S))
        finally:
            self.ledger.request_hold(self.writer, False)

    def kill_reader(self, timeout: float = 5.0) -> bool:
        """SIGKILL the reader inside a poll (its phase in the progress file), within
        ``timeout`` seconds; the monitor starts it again. Whether it was killed."""
        return bool(poll_until(lambda: self.progress.phase() == POLLING
                               and self._kill(self.reader_program, "mid-poll"), timeout,
                               PHASE_POLL_S))

    def _kill(self, program: Program, how: str) -> bool:
        with self._lock:
            current = program.current
            if current is None or current.status is not None or current.process.poll() is not None:
                return False
            current.killed = how
            current.process.kill()
            current.process.wait()
            return True

    def stop_writing(self) -> None:
        """SIGTERM the writer: it stops offering, reports, and holds its publication open
        until :meth:`leave`; no writer is started again."""
        with self._lock:
            self._writing = False
            self.stopped_writing_at = time.monotonic()
            self._signal(self.writer_program, signal.SIGTERM)

    def stop_reading(self) -> None:
        """SIGTERM the reader and wait (up to 30 s) for it to exit and its report."""
        with self._lock:
            self._reading = False
            self._signal(self.reader_program, signal.SIGTERM)
        self._await_exit(self.reader_program, 30)

    def leave(self) -> None:
        """Signal the writer again (it closes its publication and exits), wait for it, stop
        the monitor."""
        with self._lock:
            self._signal(self.writer_program, signal.SIGTERM)
        self._await_exit(self.writer_program, 30)
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join()
        for program in (self.writer_program, self.reader_program):
            current = program.current
            if current is not None and current.status is None:
                current.process.kill()
                current.process.wait()
                self._ended(program, current)
                self.findings.append(f"{program.name} incarnation {current.number} did not "
                                     f"exit when stopped: killed")
        self._checked = sum(self.progress.checked(i.number)
                            for i in self.reader_program.incarnations)
        self.progress.close()

    def close(self) -> None:
        """Stop the monitor and SIGKILL whatever C program still runs (a run that ended on an
        error; after :meth:`leave` nothing does)."""
        with self._lock:
            self._writing = self._reading = False
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join()
        for program in (self.writer_program, self.reader_program):
            current = program.current
            if current is not None and current.process.poll() is None:
                current.process.kill()
                current.process.wait()

    @staticmethod
    def _signal(program: Program, sig: int) -> None:
        current = program.current
        if current is not None and current.process.poll() is None:
            current.stopped = True
            current.process.send_signal(sig)

    def _await_exit(self, program: Program, timeout: float) -> None:
        def exited() -> bool:
            with self._lock:
                current = program.current
                if current is None or current.status is not None:
                    return True
                if current.process.poll() is not None:
                    self._ended(program, current)
                    return True
                return False
        poll_until(exited, timeout, 0.05)

    def await_following(self, seconds: float, timeout: float) -> bool:
        """Wait (up to ``timeout`` s) until the writer and the reader have both run for
        ``seconds`` (the reader since its READY); whether they have."""
        def following() -> bool:
            with self._lock:
                writer, reader = self.writer_program.current, self.reader_program.current
                since = time.monotonic() - seconds
                return (writer is not None and reader is not None and writer.status is None
                        and reader.status is None and writer.started <= since
                        and reader.ready_at is not None and reader.ready_at <= since)
        return bool(poll_until(following, timeout, 0.05))

    def cpu_seconds(self) -> list[tuple[str, float]]:
        """(name, CPU seconds) of the C programs alive now."""
        found = []
        for program in (self.writer_program, self.reader_program):
            current = program.current
            if current is not None and current.process.poll() is None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = psutil.Process(current.process.pid).cpu_times()
                    found.append((program.name, float(times.user + times.system)))
        return found

    # -- what they saw -------------------------------------------------------------------------

    def reader_check(self) -> SubscriberCheck:
        """Every reader incarnation's report summed (received, skipped, first, last per writer
        incarnation; an incarnation killed before it reported counts what its progress says,
        under no writer); ``rebuilds`` counts how the incarnations that did not run to the
        end ended."""
        total = SubscriberCheck()
        for incarnation in self.reader_program.incarnations:
            if incarnation.reason not in ("", "stopped"):
                total.rebuilds[incarnation.reason] += 1
            for key, track in _tracks(incarnation.summary).items():
                into = total.tracks.setdefault(key, Track())
                into.received += track.received
                into.skipped += track.skipped
                into.interrupted += track.interrupted
                into.first = track.first if into.first < 0 else min(into.first, track.first)
                into.last = max(into.last, track.last)
        return total

    def checked(self) -> int:
        """Messages the reader's incarnations checked (their progress: killed ones too), as
        :meth:`leave` found them."""
        return self._checked

    def final_reader(self) -> SubscriberCheck | None:
        """The check of the reader's last incarnation, when it was stopped at the end after
        following the stream since at least 1 s before the writers stopped (so every live
        writer sent it something); None otherwise."""
        last = self.reader_program.current
        if last is None or last.reason != "stopped" or last.ready_at is None \
                or self.stopped_writing_at is None \
                or last.ready_at > self.stopped_writing_at - 1.0:
            return None
        check = SubscriberCheck()
        check.tracks.update(_tracks(last.summary))
        return check

    def endings(self, program: Program) -> Counter[str]:
        return Counter(i.reason or "running" for i in program.incarnations)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _summary(stdout: Path) -> dict[str, Any] | None:
    """The program's closing JSON line, or None (killed, or it never got that far)."""
    for line in reversed(_read(stdout).splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _tracks(summary: dict[str, Any] | None) -> dict[tuple[int, int], Track]:
    """A reader summary's publishers as tracks by (writer, incarnation); images after the
    first are interruptions."""
    tracks = {}
    for publisher_id, seen in ((summary or {}).get("publishers") or {}).items():
        tracks[aeron_key(int(publisher_id))] = Track(
            received=seen["received"], skipped=seen["skipped"], first=seen["first"],
            last=seen["last"], interrupted=max(0, seen["images"] - 1))
    return tracks

