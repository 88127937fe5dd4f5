"""Aeron's own C client and media driver, and small C programs written against ``aeronc.h``
(tests/support/aeron_c/), run by tests as real processes; and the checked message those
programs exchange, in Python, so shmbus's own publishers and subscribers can speak it too.

``make aeron-c`` builds libaeron.so, its headers and aeronmd into build/aeron/
(tools/aeron_c/build.sh). :func:`build_programs` compiles the programs with ``cc`` into
build/aeron/bin/ when a binary is missing or older than its sources; without the Aeron build it
raises :class:`AeronCNotBuilt`, which says to run ``make aeron-c`` (the tests never skip).

The message (little-endian; tests/support/aeron_c/message.h is the C side)::

    @0   u32  publisher id
    @4   u32  length of the whole message (>= 20)
    @8   u64  sequence number within its publisher: 0, 1, 2, ...
    @16  u32  zlib.crc32 of bytes [20, length)
    @20  payload: byte i (counted from the start of the message) is
         (sequence * 31 + i + publisher id) & 0xFF
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: where ``make aeron-c`` builds Aeron (lib/, include/, bin/aeronmd)
AERON_BUILD = ROOT / "build" / "aeron"
#: the C programs' sources
SOURCES = Path(__file__).resolve().parent / "aeron_c"
PROGRAMS = ("aeron_publish", "aeron_subscribe", "aeron_stat")
_SHARED_HEADERS = ("common.h", "message.h")

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


class AeronCNotBuilt(RuntimeError):
    """libaeron, its headers or aeronmd are missing from build/aeron/: ``make aeron-c``."""


@dataclass(frozen=True)
class AeronC:
    """The built media driver and the compiled programs."""

    aeronmd: Path
    publish: Path
    subscribe: Path
    stat: Path


def build_programs(build: Path = AERON_BUILD) -> AeronC:
    """aeronmd and the programs of tests/support/aeron_c/, each compiled against
    ``build``'s libaeron into ``build``/bin/ when missing or older than its sources (its .c,
    the shared headers, aeronc.h, libaeron.so). AeronCNotBuilt when Aeron is not built;
    RuntimeError with the compiler's output when a program does not compile."""
    lib = build / "lib" / "libaeron.so"
    header = build / "include" / "aeronc.h"
    aeronmd = build / "bin" / "aeronmd"
    missing = [str(path) for path in (lib, header, aeronmd) if not path.exists()]
    if missing:
        raise AeronCNotBuilt(f"Aeron's C client and driver are not built (no {', '.join(missing)}):"
                             f" run `make aeron-c` in {ROOT}")
    lib_dir = lib.parent.resolve()
    binaries = {name: _compile(SOURCES / f"{name}.c", build / "bin" / name,
                               [f"-I{build / 'include'}"],
                               [f"-L{lib_dir}", "-laeron", f"-Wl,-rpath,{lib_dir}"], [lib, header])
                for name in PROGRAMS}
    return AeronC(aeronmd=aeronmd, publish=binaries["aeron_publish"],
                  subscribe=binaries["aeron_subscribe"], stat=binaries["aeron_stat"])


def build_message_probe(build: Path = AERON_BUILD) -> Path:
    """message_probe (message.h's encoder and checker from the command line), compiled into
    ``build``/bin/ when stale; it needs no Aeron, only ``cc``."""
    return _compile(SOURCES / "message_probe.c", build / "bin" / "message_probe", [], [], [])


def _compile(source: Path, binary: Path, cflags: list[str], ldflags: list[str],
             dependencies: list[Path]) -> Path:
    inputs = [source, *(SOURCES / name for name in _SHARED_HEADERS), *dependencies]
    newest = max(path.stat().st_mtime for path in inputs)
    if binary.exists() and binary.stat().st_mtime >= newest:
        return binary
    cc = shutil.which("cc")
    if cc is None:
        raise RuntimeError(f"no C compiler (cc) on PATH to build {binary.name}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    # Compiled beside, then renamed: another test run never executes a half-written binary.
    partial = binary.with_name(f".{binary.name}.{os.getpid()}")
    command = [cc, "-std=c99", "-O2", "-g", "-Wall", "-Wextra", f"-I{SOURCES}", *cflags,
               str(source), "-o", str(partial), *ldflags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr}")
    os.replace(partial, binary)
    return binary


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
    """One started program, its stdout and stderr in files under the test's log folder."""

    def __init__(self, name: str, command: Sequence[str], logs: Path) -> None:
        self.name = name
        self.command = list(command)
        self._stdout = logs / f"{name}.out"
        self._stderr = logs / f"{name}.err"
        with self._stdout.open("wb") as out, self._stderr.open("wb") as err:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=err)

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

    def kill(self) -> None:
        """SIGKILL the program if it still runs, and reap it."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Programs:
    """The C programs of one test, run against the driver of ``aeron_dir``; every program
    started is killed at :meth:`close` if still running."""

    def __init__(self, aeron: AeronC, aeron_dir: Path, logs: Path) -> None:
        self.aeron = aeron
        self.aeron_dir = aeron_dir
        self.logs = logs
        self._started: list[Program] = []

    def _start(self, name: str, command: Sequence[str]) -> Program:
        program = Program(f"{name}-{len(self._started)}", command, self.logs)
        self._started.append(program)
        return program

    def publish(self, *, stream: int, count: int, length: int, publisher_id: int,
                exclusive: bool = False, corrupt_sequence: int | None = None,
                channel: str = "aeron:ipc", timeout_s: int = 60) -> Program:
        """Start aeron_publish (tests/support/aeron_c/aeron_publish.c states its contract)."""
        command = [str(self.aeron.publish), "--dir", str(self.aeron_dir), "--channel", channel,
                   "--stream", str(stream), "--count", str(count), "--length", str(length),
                   "--publisher-id", str(publisher_id), "--timeout-s", str(timeout_s)]
        if exclusive:
            command.append("--exclusive")
        if corrupt_sequence is not None:
            command += ["--corrupt-sequence", str(corrupt_sequence)]
        return self._start(f"aeron_publish-{publisher_id}", command)

    def subscribe(self, *, stream: int, expect: Mapping[int, int], await_images: int = 0,
                  delay_us: int = 0, channel: str = "aeron:ipc",
                  timeout_s: int = 60) -> Program:
        """Start aeron_subscribe expecting ``expect`` (publisher id: message count);
        tests/support/aeron_c/aeron_subscribe.c states its contract."""
        command = [str(self.aeron.subscribe), "--dir", str(self.aeron_dir), "--channel", channel,
                   "--stream", str(stream), "--await-images", str(await_images),
                   "--delay-us", str(delay_us), "--timeout-s", str(timeout_s)]
        for publisher_id, count in expect.items():
            command += ["--expect", f"{publisher_id}:{count}"]
        return self._start("aeron_subscribe", command)

    def stat(self, timeout_s: int = 10) -> Finished:
        """Run aeron_stat to its end: its first JSON line the CnC file, then one per counter."""
        return self._start("aeron_stat", [str(self.aeron.stat), "--dir", str(self.aeron_dir),
                                          "--timeout-s", str(timeout_s)]).finish(timeout_s + 10)

    def close(self) -> None:
        """Kill every program still running."""
        for program in self._started:
            program.kill()


# ---------------------------------------------------------------------------------------------
# The message, in Python
# ---------------------------------------------------------------------------------------------

#: publisher id, length, sequence number, CRC-32 of the payload
MESSAGE_HEADER = struct.Struct("<IIQI")
HEADER_LENGTH = MESSAGE_HEADER.size
_RAMP = bytes(range(256))


class MessageError(ValueError):
    """A message that is not intact, or not the one its publisher was to send next."""


def message_payload(publisher_id: int, sequence: int, length: int) -> bytes:
    """Bytes [20, ``length``) of message ``sequence`` of ``publisher_id``."""
    start = (sequence * 31 + publisher_id + HEADER_LENGTH) & 0xFF
    size = length - HEADER_LENGTH
    return (_RAMP * ((start + size) // 256 + 1))[start:start + size]


def encode_message(publisher_id: int, sequence: int, length: int) -> bytes:
    """Message ``sequence`` of ``publisher_id``, ``length`` bytes (at least 20), as
    aeron_publish writes it."""
    if length < HEADER_LENGTH:
        raise ValueError(f"a message is at least {HEADER_LENGTH} bytes, not {length}")
    payload = message_payload(publisher_id, sequence, length)
    return MESSAGE_HEADER.pack(publisher_id, length, sequence, zlib.crc32(payload)) + payload


def check_message(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """The publisher id and sequence number of an intact message; MessageError saying what is
    wrong otherwise (too short, length field, CRC, payload pattern)."""
    data = bytes(data)
    if len(data) < HEADER_LENGTH:
        raise MessageError(f"message of {len(data)} bytes: shorter than the 20-byte header")
    publisher_id, length, sequence, crc = MESSAGE_HEADER.unpack_from(data)
    where = f"publisher {publisher_id}: message of {len(data)} bytes with sequence {sequence}"
    if length != len(data):
        raise MessageError(f"{where}: length field {length} differs from the length received")
    if crc != zlib.crc32(data[HEADER_LENGTH:]):
        raise MessageError(f"{where}: CRC-32 of the payload differs from the CRC field")
    if data[HEADER_LENGTH:] != message_payload(publisher_id, sequence, length):
        raise MessageError(f"{where}: payload differs from the pattern of its publisher id and "
                           f"sequence")
    return publisher_id, sequence


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
