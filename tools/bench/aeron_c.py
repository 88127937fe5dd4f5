"""Aeron C as the reference beside shmbus in tools/bench/netbridge.py: its media driver and its
C samples, run from a build directory (``--aeron-bin DIR`` holding aeronmd, streaming_publisher,
rate_subscriber, cping and cpong), in the benchmark's parent process.

The layout mirrors the shmbus runs: two drivers (bus A and bus B, each its own aeron.dir,
threading mode SHARED: one thread doing conductor, sender and receiver work, like a driver with
its netbridge), the publisher or pinger on A, the subscriber or ponger on B, UDP over
127.0.0.1 between them. Everything else is Aeron's default (term 16 MiB, mtu 1408, receiver
window 128 KiB, back-off idle strategies in the drivers; the samples busy-spin).

* throughput: ``streaming_publisher -L size -m N`` to ``rate_subscriber``; the figure is the
  publisher's own total (N messages over the time it took to offer them all; the receiver
  window keeps it within 128 KiB of what the subscriber has). N is sized so the run takes
  about ``duration_s`` at 250 MB/s (at most 3 M messages a second).
* round trip: ``cping`` / ``cpong``, back-to-back (cping sends the next ping as soon as the
  pong is in: the samples have no pacing), its HdrHistogram percentiles in microseconds.

CPU: the drivers and the long-lived sample (subscriber, ponger) are sampled with psutil when
the short-lived one (publisher, pinger) starts and when it exits; the short-lived one's CPU is
its whole life, from its rusage. Parsing the samples' output is pure (the parse_* functions).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.bench.harness import BenchError, Unavailable, cpu_seconds, stop_process

BINARIES = ("aeronmd", "streaming_publisher", "rate_subscriber", "cping", "cpong")
TARGET_BYTES_PER_S = 250e6  # sizes a throughput run's message count (see the docstring)
MAX_MESSAGES_PER_S = 3e6
PING_STREAM, PONG_STREAM = 1002, 1003

_TOTAL = re.compile(r"^Total: (\d+)ms, ([\d.e+]+) msgs/sec, ([\d.e+]+) bytes/sec, totals (\d+) "
                    r"messages", re.M)
_MAX = re.compile(r"^#\[Max\s*=\s*([\d.]+), Total count\s*=\s*(\d+)\]", re.M)


# ---------------------------------------------------------------------------------------------
# The samples' output
# ---------------------------------------------------------------------------------------------


def parse_publisher_total(output: str) -> dict[str, float]:
    """streaming_publisher's closing ``Total:`` line: messages, seconds, msgs/s, MB/s (10^6
    payload bytes); ValueError naming the output's tail when it has none."""
    match = _TOTAL.search(output)
    if match is None:
        raise ValueError(f"no 'Total:' line in streaming_publisher's output: {output[-500:]!r}")
    ms, msgs_per_s, bytes_per_s, messages = match.groups()
    return {"messages": int(messages), "seconds": int(ms) / 1e3,
            "msgs_per_s": float(msgs_per_s), "mb_per_s": float(bytes_per_s) / 1e6}


def parse_ping_histogram(output: str) -> dict[str, float]:
    """cping's percentile table (values in microseconds): p50, p90, p99, max and the count of
    round trips; ValueError when the table is missing or incomplete."""
    rows = []
    for line in output.splitlines():
        fields = line.split()  # value, percentile, count, 1/(1-percentile)
        if len(fields) == 4 and fields[2].isdigit():
            rows.append((float(fields[1]), float(fields[0])))
    summary = _MAX.search(output)
    if not rows or summary is None:
        raise ValueError(f"no percentile table in cping's output: {output[-500:]!r}")

    def at(percentile: float) -> float:
        return next(value for p, value in rows if p >= percentile)

    return {"p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99),
            "max_us": float(summary.group(1)), "round_trips": int(summary.group(2))}


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def find_binaries(directory: Path) -> dict[str, Path]:
    """The executables this module runs, by name, from ``directory``; Unavailable naming the
    missing ones."""
    paths = {name: directory / name for name in BINARIES}
    missing = [name for name, path in paths.items() if not os.access(path, os.X_OK)]
    if missing:
        raise Unavailable(f"--aeron-bin {directory}: no executable {', '.join(missing)}")
    return paths


@dataclass
class _Started:
    process: subprocess.Popen[str]
    log: Path


@dataclass
class AeronC:
    """Two Aeron C drivers under ``root`` (aeron.dir a and b) and the samples run against
    them, inside ``running()`` (or between ``start`` and ``stop``)."""

    binaries: dict[str, Path]
    root: Path
    drivers: list[_Started] = field(default_factory=list)
    _runs: int = 0

    def start(self, timeout_s: float = 20.0) -> None:
        """Both drivers, once each has written its CnC file; BenchError if one does not."""
        for side in ("a", "b"):
            aeron_dir = self.root / side
            self.drivers.append(self._launch(
                f"aeronmd-{side}", [str(self.binaries["aeronmd"]), f"-Daeron.dir={aeron_dir}",
                                    "-Daeron.threading.mode=SHARED",
                                    "-Daeron.dir.delete.on.start=true",
                                    "-Daeron.dir.delete.on.shutdown=true"]))
        deadline = time.monotonic() + timeout_s
        for side, driver in zip(("a", "b"), self.drivers, strict=True):
            while not (self.root / side / "cnc.dat").exists():
                if driver.process.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"aeronmd ({side}) did not start: {_tail(driver.log)}")
                time.sleep(0.01)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Both drivers up for the block only: left up, their back-off idle loops would share
        the two cores with the other transports' runs."""
        self.start()
        try:
            yield
        finally:
            self.stop()

    def stop(self) -> None:
        for driver in self.drivers:
            _interrupt(driver.process, 10.0)
        self.drivers.clear()

    @property
    def driver_pids(self) -> dict[str, int]:
        return {f"driver {side}": d.process.pid for side, d in zip("AB", self.drivers,
                                                                    strict=True)}

    def throughput(self, channel: str, size: int, duration_s: float,
                   timeout_s: float) -> dict[str, Any]:
        """streaming_publisher (bus A) -> rate_subscriber (bus B) on ``channel``: msgs/s,
        MB/s and cores by process (see the module docstring)."""
        messages = max(1000, int(duration_s * min(MAX_MESSAGES_PER_S, TARGET_BYTES_PER_S / size)))
        stream = str(1000 + self._next_run())
        subscriber = self._launch("rate_subscriber", [
            str(self.binaries["rate_subscriber"]), "-p", str(self.root / "b"), "-c", channel,
            "-s", stream])
        try:
            output, cores = self._run_against(subscriber, "publisher", [
                str(self.binaries["streaming_publisher"]), "-p", str(self.root / "a"),
                "-c", channel, "-s", stream, "-L", str(size), "-m", str(messages)],
                timeout_s + duration_s)
        finally:
            _interrupt(subscriber.process, 5.0)
        return {**parse_publisher_total(output), "cores": cores}

    def ping_pong(self, ping_channel: str, pong_channel: str, round_trips: int,
                  timeout_s: float) -> dict[str, Any]:
        """cping (bus A) <-> cpong (bus B), ``round_trips`` back-to-back after a tenth as many
        warm-up ones: percentiles in microseconds and cores by process."""
        ponger = self._launch("cpong", [
            str(self.binaries["cpong"]), "-p", str(self.root / "b"), "-c", ping_channel,
            "-C", pong_channel, "-s", str(PING_STREAM), "-S", str(PONG_STREAM)])
        try:
            output, cores = self._run_against(ponger, "pinger", [
                str(self.binaries["cping"]), "-p", str(self.root / "a"), "-c", ping_channel,
                "-C", pong_channel, "-s", str(PING_STREAM), "-S", str(PONG_STREAM),
                "-L", "32", "-m", str(round_trips), "-w", str(max(1, round_trips // 10))],
                timeout_s)
        finally:
            _interrupt(ponger.process, 5.0)
        return {**parse_ping_histogram(output), "cores": cores}

    def _run_against(self, partner: _Started, role: str, command: Sequence[str],
                     timeout_s: float) -> tuple[str, dict[str, float | None]]:
        """Run ``command`` to its end while ``partner`` and the drivers run: its output and
        the cores of every process (``role``, the partner's name, driver A, driver B)."""
        watched = {**self.driver_pids, Path(partner.process.args[0]).name: partner.process.pid}
        before = {label: cpu_seconds(pid) for label, pid in watched.items()}
        t0 = time.monotonic()
        started = self._launch(role, command)
        usage = _wait_with_usage(started.process, timeout_s)
        wall = time.monotonic() - t0
        output = started.log.read_text()
        if started.process.returncode != 0:
            raise BenchError(f"{Path(command[0]).name} exited with "
                             f"{started.process.returncode}: {output[-500:]!r}")
        cores: dict[str, float | None] = {role: (usage.ru_utime + usage.ru_stime) / wall}
        for label, pid in watched.items():
            after = cpu_seconds(pid)
            spent = before[label]
            cores[label] = None if after is None or spent is None else (after - spent) / wall
        return output, cores

    def _launch(self, name: str, command: Sequence[str]) -> _Started:
        log = self.root / f"{name}-{self._next_run()}.log"
        self.root.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)
        return _Started(process, log)

    def _next_run(self) -> int:
        self._runs += 1
        return self._runs


def _wait_with_usage(process: subprocess.Popen[str], timeout_s: float) -> Any:
    """Reap ``process`` (SIGKILL at the deadline: BenchError) and return its rusage."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return usage
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise BenchError(f"{process.args[0]} did not finish within {timeout_s:.0f} s")
        time.sleep(0.02)


def _interrupt(process: subprocess.Popen[str], timeout_s: float) -> None:
    """SIGINT (the samples and aeronmd stop cleanly on it), SIGKILL if still there."""
    stop_process(process, signal.SIGINT, timeout_s)


def _tail(path: Path) -> str:
    return path.read_text()[-500:] if path.exists() else "(no output)"
