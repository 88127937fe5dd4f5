"""Dated benchmark pages for the docs site (docs/benchmarks/), and the spread of repeated runs.

Runs in a benchmark's parent process. A benchmark program that is given ``--page DIR`` calls
:func:`write_page` once its runs are done: the page is ``DIR/<name>.md`` with a head that says
when, where and how it ran (date, CPU model and count, load before and after, Python and the
versions of the packages measured, the command that re-runs it) followed by the program's own
body (what each row measures, then its tables). Plots go beside it as ``DIR/<name>*.png`` and
the body links them. ``make bench`` runs every program this way.

Figures of repeated runs are reported as a median and a spread: :func:`spread` gives the
median, the minimum and the maximum, :func:`fmt_spread` the table cell ``12.0 M (11.1-12.6)``.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: packages whose versions a page names when they are installed
PACKAGES = ("shmbus", "numpy", "pyzmq", "posix_ipc", "iceoryx2", "eclipse-zenoh", "pyaeron",
            "pyspark", "psutil", "matplotlib")


@dataclass(frozen=True)
class Spread:
    """A figure over repeated runs: its median, lowest and highest value, and how many runs."""

    median: float
    low: float
    high: float
    runs: int


def spread(values: Iterable[float | None]) -> Spread | None:
    """The spread of ``values`` (Nones, from failed runs, left out); None if none is left."""
    kept = sorted(v for v in values if v is not None)
    if not kept:
        return None
    return Spread(statistics.median(kept), kept[0], kept[-1], len(kept))


def fmt_spread(s: Spread | None, fmt: Callable[[float], str]) -> str:
    """``median (low-high)`` with each figure formatted by ``fmt``; "-" for None; the median
    alone for a single run."""
    if s is None:
        return "-"
    if s.runs == 1:
        return fmt(s.median)
    return f"{fmt(s.median)} ({fmt(s.low)}-{fmt(s.high)})"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def versions(packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` (those not installed are left out)."""
    found = {}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


@dataclass(frozen=True)
class Setting:
    """Where and when a run started: taken by :func:`started` before the first measurement."""

    when: dt.datetime
    load: float
    argv: tuple[str, ...]


def started(argv: Sequence[str] | None = None) -> Setting:
    """Note the start of a run: the time (UTC), the 1-minute load, the command line."""
    args = tuple(sys.argv[1:] if argv is None else argv)
    return Setting(dt.datetime.now(dt.UTC), os.getloadavg()[0], args)


def head(title: str, module: str, setting: Setting) -> str:
    """The page's head: title, date, machine, load, versions and the command that re-runs it."""
    end_load = os.getloadavg()[0]
    listed = ", ".join(f"{k} {v}" for k, v in versions().items())
    command = " ".join(("python -m", module, *map(shlex.quote, _without_page(setting.argv))))
    return "\n".join([
        f"# {title}",
        "",
        f"Run {setting.when:%Y-%m-%d %H:%M} UTC on {os.cpu_count()} x {cpu_model()}, "
        f"{platform.system()} {platform.release()}; load {setting.load:.1f} at the start, "
        f"{end_load:.1f} at the end.",
        f"Python {platform.python_version()}; {listed}.",
        "",
        "Re-run it from the repository root:",
        "",
        "```",
        command,
        "```",
        "",
        "",
    ])


def _without_page(argv: Sequence[str]) -> list[str]:
    """The command line less ``--page DIR`` (or ``--page=DIR``): where the page went."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--page":
            skip = True
        elif not arg.startswith("--page="):
            kept.append(arg)
    return kept


def write_page(directory: str | os.PathLike[str], name: str, title: str, module: str,
               setting: Setting, body: str) -> Path:
    """Write ``directory/name.md``: :func:`head` then ``body``. Returns the page's path."""
    path = Path(directory) / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head(title, module, setting) + body.rstrip() + "\n")
    return path


def save_plot(figure: Any, path: str | os.PathLike[str]) -> Path:
    """Lay out a matplotlib ``figure``, save it as ``path`` (a PNG; its folder made) and close
    it. Returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def add_page_option(parser: Any) -> None:
    """``--page DIR``: write the dated page (and its plots) into DIR, e.g. docs/benchmarks."""
    parser.add_argument("--page", metavar="DIR", default=None,
                        help="write the dated page and its plots into DIR (docs/benchmarks)")
