"""Aeron's own C client and media driver, and the C programs written against ``aeronc.h``
(tools/aeron_c/c/, built by tools/aeron_c/programs.py), run by tests as real processes; and
the checked message those programs exchange (tools/aeron_c/message.py) with a checker of the
sequence rules of aeron_subscribe's counted mode, in Python, so shmbus's own publishers and
subscribers can speak it too.

``make aeron-c`` builds libaeron.so, its headers and aeronmd into build/aeron/; without them
:func:`build_programs` raises :class:`AeronCNotBuilt`, which says to run ``make aeron-c`` (the
tests never skip).
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import wait_until
from tools.aeron_c.message import (
    HEADER_LENGTH,
    MESSAGE_HEADER,
    MessageError,
    check_message,
    encode_message,
    message_payload,
)
from tools.aeron_c.programs import (
    AERON_BUILD,
    AeronC,
    AeronCNotBuilt,
    build_message_probe,
    build_programs,
)

__all__ = ["AERON_BUILD", "AERONMD_SETTINGS", "HEADER_LENGTH", "MESSAGE_HEADER", "AeronC",
           "AeronCNotBuilt", "Finished", "MessageError", "Program", "Programs",
           "SequenceChecker", "build_message_probe", "build_programs", "check_message",
           "cnc_ready", "encode_message", "message_payload", "running_aeronmd"]

#: aeronmd's settings for tests (``-Dname=value``, aeronmd.h names them): one thread doing the
#: conductor's, sender's and receiver's work, sleeping 1 ms when idle (the machine has 2 cores
#: and the programs sleep between retries too); 1 MiB IPC terms instead of 64 MiB so a log is
#: 3 MiB of /dev/shm (max message 128 KiB); the directory removed at start and at shutdown.
AERONMD_SETTINGS = (
    "aeron.threading.mode=SHARED",
    "aeron.shared.idle.strategy=sleep-ns",
    "aeron.shared.idle.strategy.init.args=1ms",
    "aeron.ipc.term.buffer.length=1m",
    "aeron.dir.delete.on.start=true",
    "aeron.dir.delete.on.shutdown=true",
)


# ---------------------------------------------------------------------------------------------
# The media driver
# ---------------------------------------------------------------------------------------------


def cnc_ready(aeron_dir: Path) -> bool:
    """Whether ``aeron_dir``/cnc.dat is there with its version written (aeronmd writes the
    version last, once the file is usable)."""
    try:
        with (aeron_dir / "cnc.dat").open("rb") as cnc:
            head = cnc.read(4)
    except FileNotFoundError:
        return False
    return len(head) == 4 and struct.unpack("<i", head)[0] != 0


@contextmanager
def running_aeronmd(aeronmd: Path, aeron_dir: Path, log: Path,
                    timeout: float = 20.0) -> Iterator[subprocess.Popen[bytes]]:
    """Aeron's C media driver serving ``aeron_dir`` (:data:`AERONMD_SETTINGS`) for the block,
    its output in ``log``: yielded once its CnC file is ready (the test fails naming the log
    if it is not within ``timeout`` s). Stopped at the end with SIGTERM (aeronmd closes and
    removes its directory), SIGKILL after 10 s."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(aeronmd), f"-Daeron.dir={aeron_dir}",
             *(f"-D{setting}" for setting in AERONMD_SETTINGS)],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: process.poll() is not None or cnc_ready(aeron_dir), timeout,
                   lambda: f"aeronmd to make {aeron_dir}/cnc.dat; its log: {_tail(log)}")
        if process.returncode is not None:
            pytest.fail(f"aeronmd exited with {process.returncode}: {_tail(log)}")
        yield process
    finally:
        _stop(process, signal.SIGTERM, 10.0)


def _stop(process: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: Path, limit: int = 2000) -> str:
    return path.read_text(errors="replace")[-limit:] if path.exists() else "(no output)"


# ---------------------------------------------------------------------------------------------
# The programs as processes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """A program that ran to its end: exit status and output."""

    name: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict[str, Any]:
        """The last line of stdout as JSON (the programs end with a one-line summary);
        AssertionError naming the output when it is not JSON."""
        lines = self.stdout.strip().splitlines()
        try:
            value = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            raise AssertionError(f"{self.name}: no JSON summary; stdout {self.stdout[-1000:]!r},"
                                 f" stderr {self.stderr[-1000:]!r}") from None
        assert isinstance(value, dict), value
        return value

    def json_lines(self) -> list[dict[str, Any]]:
        """Every line of stdout as JSON (aeron_stat's output)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


class Program:
    """One started program, its stdout and stderr in files under the test's log folder; with
    ``piped_stdin`` its stdin is a pipe the test writes with :meth:`send_line`, else
    /dev/null."""

    def __init__(self, name: str, command: Sequence[str], logs: Path,
                 piped_stdin: bool = False) -> None:
        self.name = name
        self.command = list(command)
        self._stdout = logs / f"{name}.out"
        self._stderr = logs / f"{name}.err"
        with self._stdout.open("wb") as out, self._stderr.open("wb") as err:
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE if piped_stdin else subprocess.DEVNULL,
                stdout=out, stderr=err)

    def send_line(self, line: str) -> None:
        """Write ``line`` and a newline to the program's piped stdin, flushed."""
        assert self.process.stdin is not None, f"{self.name} was started without piped stdin"
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def close_stdin(self) -> None:
        """Close the program's piped stdin: it reads the end of its input."""
        assert self.process.stdin is not None, f"{self.name} was started without piped stdin"
        self.process.stdin.close()

    def stdout(self) -> str:
        """What the program printed to stdout so far."""
        return self._stdout.read_text(errors="replace")

    def stderr(self) -> str:
        """What the program printed to stderr so far."""
        return self._stderr.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Return once the program printed its ``READY`` line; the test fails if it exits
        first or does not print it within ``timeout`` s."""
        wait_until(lambda: self.process.poll() is not None or "READY\n" in self.stdout(),
                   timeout, lambda: f"{self.name} to print READY; stderr: {self.stderr()}")
        if "READY\n" not in self.stdout():
            pytest.fail(f"{self.name} exited with {self.process.returncode} before READY; "
                        f"stderr: {self.stderr()}")

    def finish(self, timeout: float = 60.0) -> Finished:
        """Wait for the program's end (the test fails, and the program is killed, if it
        runs past ``timeout`` s) and return its exit status and output."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} still running after {timeout:g} s; stderr: {self.stderr()}")
        return Finished(self.name, self.process.returncode, self.stdout(), self.stderr())

    def stop(self) -> None:
        """SIGTERM the program (a long-running mode stops at it and prints its summary)."""
        self.process.send_signal(signal.SIGTERM)

    def summary_printed(self) -> bool:
        """Whether the program printed its closing JSON line (a publisher holding its
        publication open after it stopped has)."""
        return '"ended": ' in self.stdout()

    def kill(self) -> None:
        """SIGKILL the program if it still runs, and reap it; its piped stdin closed."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()


class Programs:
    """The C programs of one test, run against the driver of ``aeron_dir``; every program
    started is killed at :meth:`close` if still running."""

    def __init__(self, aeron: AeronC, aeron_dir: Path, logs: Path) -> None:
        self.aeron = aeron
        self.aeron_dir = aeron_dir
        self.logs = logs
        self._started: list[Program] = []

    def _start(self, name: str, command: Sequence[str], piped_stdin: bool = False) -> Program:
        program = Program(f"{name}-{len(self._started)}", command, self.logs, piped_stdin)
        self._started.append(program)
        return program

    def publish(self, *, stream: int, count: int, length: int, publisher_id: int,
                exclusive: bool = False, corrupt_sequence: int | None = None,
                await_go: bool = False, channel: str = "aeron:ipc",
                timeout_s: int = 60) -> Program:
        """Start aeron_publish (tools/aeron_c/c/aeron_publish.c states its contract); with
        ``await_go`` it prints READY once connected and offers after the line
        :meth:`Program.send_line` writes."""
        command = [str(self.aeron.publish), "--dir", str(self.aeron_dir), "--channel", channel,
                   "--stream", str(stream), "--count", str(count), "--length", str(length),
                   "--publisher-id", str(publisher_id), "--timeout-s", str(timeout_s)]
        if exclusive:
            command.append("--exclusive")
        if corrupt_sequence is not None:
            command += ["--corrupt-sequence", str(corrupt_sequence)]
        if await_go:
            command.append("--await-go")
        return self._start(f"aeron_publish-{publisher_id}", command, piped_stdin=await_go)

    def subscribe(self, *, stream: int, expect: Mapping[int, int], await_images: int = 0,
                  delay_us: int = 0, channel: str = "aeron:ipc",
                  timeout_s: int = 60) -> Program:
        """Start aeron_subscribe expecting ``expect`` (publisher id: message count);
        tools/aeron_c/c/aeron_subscribe.c states its contract."""
        command = [str(self.aeron.subscribe), "--dir", str(self.aeron_dir), "--channel", channel,
                   "--stream", str(stream), "--await-images", str(await_images),
                   "--delay-us", str(delay_us), "--timeout-s", str(timeout_s)]
        for publisher_id, count in expect.items():
            command += ["--expect", f"{publisher_id}:{count}"]
        return self._start("aeron_subscribe", command)

    def publish_until_stopped(self, *, stream: int, publisher_id: int, length: int,
                              max_length: int | None = None, rate: int = 0,
                              exclusive: bool = False, hold_s: int = 0,
                              corrupt_sequence: int | None = None,
                              driver_timeout_ms: int | None = None,
                              progress: tuple[Path, int, int] | None = None,
                              hold_at: int | None = None, await_go: bool = False,
                              channel: str = "aeron:ipc") -> Program:
        """Start aeron_publish --until-stopped (stopped with :meth:`Program.stop`);
        ``progress`` is (file, record offset, phase offset), ``hold_at`` the offset of its
        hold request in that file; ``await_go`` as :meth:`publish`'s."""
        command = [str(self.aeron.publish), "--dir", str(self.aeron_dir), "--channel", channel,
                   "--stream", str(stream), "--until-stopped", "--publisher-id",
                   str(publisher_id), "--length", str(length), "--rate", str(rate),
                   "--hold-s", str(hold_s)]
        if max_length is not None:
            command += ["--max-length", str(max_length)]
        if exclusive:
            command.append("--exclusive")
        if corrupt_sequence is not None:
            command += ["--corrupt-sequence", str(corrupt_sequence)]
        command += _long_running_options(driver_timeout_ms, progress)
        if hold_at is not None:
            command += ["--progress-hold", str(hold_at)]
        if await_go:
            command.append("--await-go")
        return self._start(f"aeron_publish-{publisher_id}", command, piped_stdin=await_go)

    def subscribe_until_stopped(self, *, stream: int, driver_timeout_ms: int | None = None,
                                progress: tuple[Path, int, int] | None = None,
                                channel: str = "aeron:ipc") -> Program:
        """Start aeron_subscribe --until-stopped (stopped with :meth:`Program.stop`);
        ``progress`` is (file, record offset, phase offset)."""
        command = [str(self.aeron.subscribe), "--dir", str(self.aeron_dir), "--channel", channel,
                   "--stream", str(stream), "--until-stopped",
                   *_long_running_options(driver_timeout_ms, progress)]
        return self._start("aeron_subscribe", command)

    def stat(self, timeout_s: int = 10) -> Finished:
        """Run aeron_stat to its end: its first JSON line the CnC file, then one per counter."""
        return self._start("aeron_stat", [str(self.aeron.stat), "--dir", str(self.aeron_dir),
                                          "--timeout-s", str(timeout_s)]).finish(timeout_s + 10)

    def close(self) -> None:
        """Kill every program still running."""
        for program in self._started:
            program.kill()


def _long_running_options(driver_timeout_ms: int | None,
                          progress: tuple[Path, int, int] | None) -> list[str]:
    options = []
    if driver_timeout_ms is not None:
        options += ["--driver-timeout-ms", str(driver_timeout_ms)]
    if progress is not None:
        path, record, phase = progress
        options += ["--progress", str(path), "--progress-record", str(record),
                    "--progress-phase", str(phase)]
    return options


# ---------------------------------------------------------------------------------------------
# The sequence rules, in Python
# ---------------------------------------------------------------------------------------------

class SequenceChecker:
    """aeron_subscribe's rules in Python: every message intact, from an expected publisher,
    its sequence numbers 0, 1, 2, ... up to its expected count, nothing lost, duplicated or
    reordered."""

    def __init__(self, expected: Mapping[int, int]) -> None:
        self.expected = dict(expected)
        self.received = dict.fromkeys(self.expected, 0)

    def check(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        """Check the next message received; its publisher id and sequence number, or
        MessageError naming the publisher and the expected and got sequence."""
        publisher_id, sequence = check_message(data)
        if publisher_id not in self.expected:
            raise MessageError(f"publisher {publisher_id}: not expected, got its sequence "
                               f"{sequence}")
        next_sequence = self.received[publisher_id]
        if sequence != next_sequence:
            how = "lost" if sequence > next_sequence else "duplicated or reordered"
            raise MessageError(f"publisher {publisher_id}: expected sequence {next_sequence}, "
                               f"got sequence {sequence} ({how})")
        if next_sequence >= self.expected[publisher_id]:
            raise MessageError(f"publisher {publisher_id}: expected "
                               f"{self.expected[publisher_id]} messages, got sequence {sequence} "
                               f"beyond them")
        self.received[publisher_id] = next_sequence + 1
        return publisher_id, sequence

    @property
    def complete(self) -> bool:
        """Whether every expected publisher's messages all arrived."""
        return all(self.received[p] >= count for p, count in self.expected.items())
