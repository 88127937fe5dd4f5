"""The bus-watching commands on a corrupt cnc.dat: one line on stderr naming the file and what
is wrong, exit code 1 (no bus), never a traceback. Also through the installed script."""

from __future__ import annotations

import os
import random
import re
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from shmbus.cli.bus_status import EXIT_NO_BUS
from shmbus.shm._native import epoch_ms
from shmbus.shm.cnc import (
    CNC_FILE,
    COUNTERS_METADATA_LENGTH_OFFSET,
    COUNTERS_VALUES_LENGTH_OFFSET,
    ERROR_LOG_LENGTH_OFFSET,
    SHMBUS_LAYOUT_VERSION_OFFSET,
    SHMBUS_MAGIC_OFFSET,
    TO_CLIENTS_LENGTH_OFFSET,
    TO_DRIVER_LENGTH_OFFSET,
    VERSION_OFFSET,
    CncFile,
    CncLengths,
)
from tests.support.commands import run, shmbus_executable

LENGTHS = CncLengths(to_driver_capacity=1024, to_clients_capacity=1024, counters=16,
                     error_log=4096)
COMMANDS = (["stat", "--once"], ["stat", "--once", "--json"], ["streams"], ["errors"],
            ["clients"])


def put_int32(offset: int, value: int) -> Callable[[Path], None]:
    def corrupt(path: Path) -> None:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(struct.pack("<i", value))
    return corrupt


def truncate(size: int) -> Callable[[Path], None]:
    return lambda path: os.truncate(path, size)


def random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(16).randbytes(path.stat().st_size))


CORRUPTIONS = {  # name: (corruption, what the message must say)
    "empty": (truncate(0), "is 0 bytes, less than its 128-byte header"),
    "cut-in-header": (truncate(100), "is 100 bytes, less than its 128-byte header"),
    "cut-in-sections": (truncate(9000), r"corrupt: it is 9000 bytes, its header describes \d+ "
                                        r"\(truncated\)"),
    "random-bytes": (random_bytes, "has CnC version 0x[0-9a-f]+; this shmbus speaks Aeron's "
                                   r"CnC 0.2.0 \(0x200\)"),
    "cnc-version": (put_int32(VERSION_OFFSET, 0x30200), "has CnC version 0x30200"),
    "layout-version": (put_int32(SHMBUS_LAYOUT_VERSION_OFFSET, 1),
                       "has shmbus layout version 1; this shmbus speaks version 2"),
    "aeron-driver": (put_int32(SHMBUS_MAGIC_OFFSET, 0),
                     "is an Aeron media driver's \\(it has no shmbus header\\)"),
    "ring-length": (put_int32(TO_DRIVER_LENGTH_OFFSET, 1000),
                    "corrupt: the to-driver section is 1000 bytes, not a power of two"),
    "broadcast-length": (put_int32(TO_CLIENTS_LENGTH_OFFSET, -1),
                         "corrupt: the to-clients section is -1 bytes"),
    "metadata-length": (put_int32(COUNTERS_METADATA_LENGTH_OFFSET, -(2**31)),
                        "corrupt: the counters metadata section is -2147483648 bytes, not a "
                        "positive multiple of 512"),
    "values-length": (put_int32(COUNTERS_VALUES_LENGTH_OFFSET, 2**31 - 1),
                      "corrupt: the counters values section is 2147483647 bytes; 16 counters "
                      "take 2048"),
    "error-log-length": (put_int32(ERROR_LOG_LENGTH_OFFSET, 0),
                         "corrupt: the error log section is 0 bytes"),
    "huge-error-log": (put_int32(ERROR_LOG_LENGTH_OFFSET, 2**30),
                       r"corrupt: it is \d+ bytes, its header describes \d+ \(truncated\)"),
}


def corrupt_bus(directory: Path, corruption: Callable[[Path], None]) -> Path:
    directory.mkdir()
    cnc = CncFile.create(directory, LENGTHS, pid=os.getpid(), start_time_ms=epoch_ms(),
                         client_liveness_timeout_ns=10**10)
    cnc.close()
    corruption(directory / CNC_FILE)
    return directory


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_corrupt_cnc_file_is_one_clear_line_and_exit_1(shm_dir: Path, name: str) -> None:
    corruption, expected = CORRUPTIONS[name]
    directory = corrupt_bus(shm_dir / name, corruption)
    for command in COMMANDS:
        result = run(*command, "--dir", str(directory))
        assert result.exit_code == EXIT_NO_BUS, (command, result.output)
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (command, lines)
        assert lines[0].startswith(f"error: no bus at {directory}: {directory / CNC_FILE} ")
        assert re.search(expected, lines[0]), (command, lines[0])


def test_the_installed_script_says_the_same_without_a_traceback(shm_dir: Path) -> None:
    for name in ("random-bytes", "metadata-length", "cut-in-sections"):
        directory = corrupt_bus(shm_dir / name, CORRUPTIONS[name][0])
        for command in COMMANDS:
            result = subprocess.run([shmbus_executable(), *command, "--dir", str(directory)],
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == EXIT_NO_BUS, (command, result.stderr)
            assert "Traceback" not in result.stderr
            assert result.stderr.count("\n") == 1 and str(directory / CNC_FILE) in result.stderr
