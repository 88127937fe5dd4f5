"""What the benchmarks in tools/ share: processes under a watchdog, their CPU, medians, tables.

Runs in the parent process of a benchmark (and, for :class:`Start`, in each spawned member).
Imports only the public API of shmbus, psutil and numpy; nothing from tests/.

A measurement runs each member (a role, a function, its arguments) in a process of its own
(multiprocessing spawn). A member sets itself up, then calls ``start.ready()`` (naming the
driver it is connected to, if any), which waits until every member and the parent are ready;
its work is then timed and accounted from that moment. The member's function returns a dict
of results. The parent takes the CPU time (user + system, all threads) of every process
involved when all are ready and again when the last member has returned (the members wait,
idle, until it has): the members, the driver of each bus a member named, and the driver's
child processes (netbridges), plus any processes the caller names. ``cores`` of a process is
its CPU seconds over those wall seconds (1.0 = one core busy all the time).

Every wait has a deadline: a member that fails reports its traceback, one that overruns is
terminated, and the measurement raises :class:`BenchError` (or :class:`Unavailable` when the
thing measured does not exist here: a missing package or API).
"""

from __future__ import annotations

import os
import platform
import queue
import statistics
import struct
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

STOP = -1  # sequence number of the message that ends a throughput run
READY_TIMEOUT_S = 60.0  # for every member to set up (spawn, imports, connect) and say ready


class BenchError(RuntimeError):
    """A measurement that failed: a member crashed, overran, or got wrong messages."""


class Unavailable(BenchError):
    """A measurement that cannot run here: a package, or an API it measures, is missing."""


#: exceptions that, raised by a member, mean "not available here" rather than "failed"
UNAVAILABLE_ERRORS = ("Unavailable", "ImportError", "ModuleNotFoundError")


def codec(size: int) -> struct.Struct:
    """A message of ``size`` bytes (at least 16): an int64 at its head and one at its tail."""
    if size < 16:
        raise ValueError(f"message size {size}: at least 16 bytes (head and tail words)")
    return struct.Struct(f"<q{size - 16}xq")


# ---------------------------------------------------------------------------------------------
# Members
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One process of a measurement: ``fn(start, *args) -> dict`` runs in it, as ``role``."""

    role: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Start:
    """A member's handle on the start of the measurement (picklable into spawned members)."""

    role: str
    messages: Any  # the parent's queue
    barrier: Any  # members + the parent
    timeout_s: float

    def ready(self, driver_pid: int | None = None) -> None:
        """Say this member is set up (connected to the bus whose driver is ``driver_pid``),
        then wait for the others and the parent; BenchError if they are not all there within
        the timeout."""
        self.messages.put({"role": self.role, "ready": True, "pid": os.getpid(),
                           "driver_pid": driver_pid})
        try:
            self.barrier.wait(self.timeout_s)
        except Exception as e:  # BrokenBarrierError: another member failed, or timed out
            raise BenchError(f"the measurement did not start: {type(e).__name__}") from None


def _member_main(member: Member, start: Start, release: Any) -> None:
    """Entry point of every member process: run, report the result or the error, then wait
    (idle) until the parent has taken its CPU sample."""
    try:
        out = member.fn(start, *member.args)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the run
        out = {"error": traceback.format_exc(limit=6), "error_type": type(e).__name__,
               "error_message": str(e)}
    out["role"] = member.role
    start.messages.put(out)
    release.wait(start.timeout_s)


@dataclass
class Outcome:
    """What a measurement returns: each member's result by role, the wall seconds between
    the start and the last result, the processes accounted by label (member roles,
    ``driver``, ``netbridge``, and the labels of ``watch``) and the cores each label used
    meanwhile (several processes under one label add up; None when one could not be read)."""

    results: dict[str, dict[str, Any]]
    wall_s: float
    pids: dict[str, set[int]] = field(default_factory=dict)
    cores: dict[str, float | None] = field(default_factory=dict)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (all its threads); None if gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return times.user + times.system


def child_pids(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def run_processes(ctx: Any, members: Sequence[Member], timeout_s: float,
                  watch: Callable[[], Mapping[str, Iterable[int]]] | None = None) -> Outcome:
    """Run each member in a spawned process of its own (roles unique) and account the CPU of
    every process involved (see the module docstring); ``watch``, called once every member is
    ready (so it sees what their setting up started, e.g. a netbridge), adds processes by label.

    ``timeout_s`` bounds the measured part (from the start to the last result). Raises
    BenchError if a member fails or overruns (all are then terminated), Unavailable if a
    member failed with one of UNAVAILABLE_ERRORS.
    """
    messages = ctx.Queue()
    barrier = ctx.Barrier(len(members) + 1)
    release = ctx.Event()
    procs = [ctx.Process(target=_member_main,
                         args=(m, Start(m.role, messages, barrier, READY_TIMEOUT_S + timeout_s),
                               release), daemon=True)
             for m in members]
    for p in procs:
        p.start()
    try:
        ready = _collect(messages, procs, len(members), READY_TIMEOUT_S, barrier, want_ready=True)
        labelled: dict[str, set[int]] = {m.role: {p.pid} for m, p in zip(members, procs,
                                                                          strict=True)}
        drivers = {r["driver_pid"] for r in ready.values() if r.get("driver_pid")}
        labelled["driver"] = drivers
        labelled["netbridge"] = {c for d in drivers for c in child_pids(d)}
        for label, pids in (watch() if watch else {}).items():
            labelled.setdefault(label, set()).update(pids)
        labelled = {label: pids for label, pids in labelled.items() if pids}
        before = {pid: cpu_seconds(pid) for pids in labelled.values() for pid in pids}
        t0 = time.monotonic()
        barrier.wait(READY_TIMEOUT_S)
        results = _collect(messages, procs, len(members), timeout_s, barrier, want_ready=False)
        wall = time.monotonic() - t0
        after = {pid: cpu_seconds(pid) for pid in before}
    finally:
        release.set()
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        messages.close()
        messages.cancel_join_thread()
    cores: dict[str, float | None] = {}
    for label, pids in labelled.items():
        spent = [(before[pid], after[pid]) for pid in pids]
        cores[label] = (None if any(a is None or b is None for a, b in spent)
                        else sum(b - a for a, b in spent) / wall)  # type: ignore[operator]
    return Outcome(results, wall, labelled, cores)


def _collect(messages: Any, procs: list[Any], count: int, timeout_s: float, barrier: Any,
             *, want_ready: bool) -> dict[str, dict[str, Any]]:
    """The next ``count`` messages of the members (ready messages, or results), by role."""
    collected: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(collected) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            barrier.abort()
            raise BenchError(f"timed out after {timeout_s:.0f} s "
                             f"({'setting up' if want_ready else 'measuring'}; "
                             f"{count - len(collected)} member(s) not done)")
        try:
            out = messages.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if not dead:
                continue
            try:
                out = messages.get(timeout=1.0)  # a report may still be on its way
            except queue.Empty:
                barrier.abort()
                raise BenchError(f"a member died (exit code {dead[0].exitcode})") from None
        if "error" in out:
            barrier.abort()
            if out.get("error_type") in UNAVAILABLE_ERRORS:
                raise Unavailable(f"{out['role']}: {out['error_message']}")
            raise BenchError(f"{out['role']}: {out['error'].strip().splitlines()[-1]}")
        if bool(out.get("ready")) != want_ready:
            raise BenchError(f"{out['role']}: unexpected message {sorted(out)}")
        collected[out["role"]] = out
    return collected


# ---------------------------------------------------------------------------------------------
# Repeated runs, bounded loops
# ---------------------------------------------------------------------------------------------


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated runs of a measurement: the median of every numeric field, errors
    summed, the first failure if any run failed (``status`` "failed" beats "n/a")."""
    for status in ("failed", "n/a"):
        bad = [r for r in runs if r["status"] == status]
        if bad:
            return dict(bad[0], runs=len(runs))
    row = dict(runs[0], runs=len(runs))
    for key, value in runs[0].items():
        if isinstance(value, float | int) and not isinstance(value, bool):
            values = [r[key] for r in runs if r.get(key) is not None]
            row[key] = sum(values) if key == "errors" else statistics.median(values)
        elif isinstance(value, dict):  # cores by label
            labels = {label for r in runs for label in r[key]}
            row[key] = {label: _median_or_none([r[key].get(label) for r in runs])
                        for label in labels}
    return row


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def attempt(thunk: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one measurement; its row with ``status`` "ok", or "n/a" / "failed" and ``error``."""
    try:
        row = thunk()
    except Unavailable as e:
        return {"status": "n/a", "error": str(e)}
    except BenchError as e:
        return {"status": "failed", "error": str(e)}
    row.setdefault("status", "ok")
    return row


def offer_until_accepted(offer: Callable[[Any], int], message: Any, idle: Any,
                         deadline_ns: int) -> None:
    """Offer ``message`` with a shmbus publication's ``offer`` until accepted: ``idle`` (a
    shmbus idle strategy) backs off while back-pressured, a rotation (ADMIN_ACTION) is retried
    at once. BenchError when the publication refuses for good or at ``deadline_ns``."""
    from shmbus import ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED, result_name

    while True:
        result = offer(message)
        if result > 0:
            idle.reset()
            return
        if result in (CLOSED, MAX_POSITION_EXCEEDED):
            raise BenchError(f"offer failed: {result_name(result)}")
        if result != ADMIN_ACTION:
            idle.idle(0)
            if time.monotonic_ns() > deadline_ns:
                raise BenchError(f"offer not accepted before the deadline: {result_name(result)}")


def deadline_after(seconds: float) -> int:
    """CLOCK_MONOTONIC in ns, ``seconds`` from now (loops compare time.monotonic_ns() to it)."""
    return time.monotonic_ns() + int(seconds * 1e9)


def percentiles_us(samples_ns: Sequence[int] | Any, warmup_fraction: float = 0.1,
                   max_warmup: int = 1000) -> dict[str, float]:
    """p50/p90/p99/max in microseconds of round-trip samples in ns, the first
    ``warmup_fraction`` (at most ``max_warmup``) dropped."""
    import numpy as np

    samples = np.asarray(samples_ns, dtype=np.int64)
    if len(samples) < 10:
        raise BenchError(f"only {len(samples)} round trips")
    kept = samples[min(max_warmup, int(len(samples) * warmup_fraction)):] / 1000.0
    p50, p90, p99 = np.percentile(kept, [50, 90, 99])
    return {"round_trips": int(len(kept)), "p50_us": float(p50), "p90_us": float(p90),
            "p99_us": float(p99), "max_us": float(kept.max())}


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 0) -> str:
    """A table cell: "-" for None, floats with thousands separators and ``digits`` decimals."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_rate(value: float | None) -> str:
    """A rate as 2.13 M / 180 k / 6.4 k / 950."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.{0 if value >= 1e4 else 1}f} k"
    return f"{value:.0f}"


def markdown_table(headers: Sequence[str], lines: Sequence[Sequence[str]],
                   right: Iterable[int] = ()) -> str:
    """A markdown (GitHub) table; columns whose index is in ``right`` right-aligned."""
    right = set(right)
    rule = [("---:" if i in right else "---") for i in range(len(headers))]

    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([row(headers), "| " + " | ".join(rule) + " |", *map(row, lines)])


def text_table(headers: Sequence[str], lines: Sequence[Sequence[str]], right: Iterable[int],
               groups: Sequence[Any]) -> str:
    """A plain text table: headers, a rule, one line per row, the columns whose index is in
    ``right`` right-aligned; a blank line where the group key (one per row) changes."""
    right = set(right)
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def render(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [render(headers), render(["-" * w for w in widths])]
    previous = None
    for group, line in zip(groups, lines, strict=True):
        if previous is not None and group != previous:
            out.append("")
        previous = group
        out.append(render(line))
    return "\n".join(out)


def machine() -> dict[str, Any]:
    """Where a benchmark ran: python, platform, CPUs and the load average now."""
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
