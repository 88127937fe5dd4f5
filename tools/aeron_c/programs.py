"""The C programs of tools/aeron_c/c/ (aeron_publish, aeron_subscribe, aeron_stat, written
against Aeron's ``aeronc.h``), compiled against the Aeron build ``make aeron-c`` leaves in
build/aeron/ (tools/aeron_c/build.sh): libaeron.so, its headers and aeronmd.

:func:`build_programs` compiles each program with ``cc`` into build/aeron/bin/ when its binary
is missing or older than its sources; without the Aeron build it raises :class:`AeronCNotBuilt`,
which says to run ``make aeron-c``. Each program's source file states its options, its output
and its exit statuses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: where ``make aeron-c`` builds Aeron (lib/, include/, bin/aeronmd)
AERON_BUILD = ROOT / "build" / "aeron"
#: the C programs' sources
SOURCES = Path(__file__).resolve().parent / "c"
PROGRAMS = ("aeron_publish", "aeron_subscribe", "aeron_stat")
_SHARED_HEADERS = ("common.h", "message.h")


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
    """aeronmd and the programs of tools/aeron_c/c/, each compiled against ``build``'s
    libaeron into ``build``/bin/ when missing or older than its sources (its .c, the shared
    headers, aeronc.h, libaeron.so). AeronCNotBuilt when Aeron is not built; RuntimeError with
    the compiler's output when a program does not compile."""
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
    # Compiled beside, then renamed: another run never executes a half-written binary.
    partial = binary.with_name(f".{binary.name}.{os.getpid()}")
    command = [cc, "-std=c99", "-O2", "-g", "-Wall", "-Wextra", f"-I{SOURCES}", *cflags,
               str(source), "-o", str(partial), *ldflags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr}")
    os.replace(partial, binary)
    return binary
