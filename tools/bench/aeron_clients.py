"""Aeron's own C client on the shmbus driver, beside shmbus's clients on the same driver.

    python -m tools.bench.aeron_clients [--quick] [--runs N] [--messages N] [--idle S]
                                        [--json PATH] [--page DIR]        # from the repo root

Needs ``make aeron-c`` (Aeron's C client, built from source into build/aeron/); the C programs
of tools/aeron_c/c/ are compiled against it when stale (tools/aeron_c/programs.py).

Every measurement runs on a fresh bus directory served by a real driver process (``python -m
shmbus.driver``, harness.start_driver; default settings: IPC term 1 MiB, window half a term,
mtu 1408), on ``aeron:ipc``, one exclusive publication, messages of 32 bytes in the checked
format of the C programs (tools/aeron_c/message.py: publisher id, length, sequence number,
CRC-32 of the payload, a payload pattern). Three rows, each ``--messages`` messages:

1. shmbus -> shmbus, the baseline: a writer member ``pub.publish(message)`` per message
   (user_loop.write_count), a reader member ``for m in sub.messages(): consume(m)``
   (user_loop.Consumer, the messages made and compared a round at a time by
   aeron_rounds.AeronRounds, so every byte of every message is checked);
2. Aeron C -> shmbus: ``aeron_publish --exclusive`` (Aeron's ``offer``, retried after a sleep
   of 1 us doubling to 1 ms while refused) to the same reader loop;
3. shmbus -> Aeron C: the same writer loop to ``aeron_subscribe`` (Aeron's ``poll`` with its
   fragment assembler, 64 fragments a poll, a sleep of 1 us doubling to 1 ms after an empty
   poll), which checks every message in C (length, CRC, every payload byte, sequence).

Diagnosis rows: rows 1 and 2 again with ``term-length=16m`` on the channel (a window of 8 MiB
instead of 512 KiB). An Aeron publisher never raises its own limit and never wakes shmbus's
sleeping readers (a shmbus publisher does both, at memory speed): shmbus's readers of its log
raise its limit as they store their positions (the driver marks the log:
shmbus/shm/native/flow_control.c, fc_raise_for_writer), and the driver wakes those readers on its
cycle, 1 ms while an Aeron client's stream moves (shmbus/driver/aeron_client_streams.py). A
window that outlasts a late cycle shows what a reader asleep until then costs row 2.

A member process (harness.run_processes) runs the shmbus side and starts the C program as its
child: the C program is connected (aeron_publish's READY with ``--await-go``, aeron_subscribe's
READY once it has the image) before the member says ready, and aeron_publish offers only
after the go line the member writes once every process is ready. Rate = messages / (the
reader's last message - the writer's first send), both CLOCK_MONOTONIC (the C programs report
theirs). CPU: every process from the start of the measurement to its end (the members and the
driver sampled by the harness; the C program from the member's sample at ready to its rusage
at exit), in CPU seconds per million messages. A message lost, reordered or corrupted, or a
count short, fails the run.

Idle: the driver alone for ``--idle`` seconds with no client, then ``--idle`` seconds with one
Aeron client attached and idle (``aeron_subscribe --until-stopped`` on a stream nobody
publishes, stopped with SIGTERM after): the driver's CPU in % of a core in each, and the
difference, the cost an attached Aeron client adds (the driver then wakes by time:
shmbus/driver/aeron_client_streams.py).

Each measurement runs --runs times (default 5), interleaved; tables give the median and the
spread (lowest-highest). Output: a markdown report on stdout; --json PATH the rows; --page DIR
the dated page DIR/aeron_clients.md. Exit status 1 if a measurement failed, 2 without the
Aeron build.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.aeron_c.programs import AeronC, AeronCNotBuilt, build_programs
from tools.bench.aeron_rounds import AeronRounds
from tools.bench.harness import (
    BenchError,
    Measurement,
    Member,
    Outcome,
    cpu_seconds,
    deadline_after,
    median_row,
    run_count,
    run_interleaved,
    run_processes,
    start_driver,
    stop_driver,
    stop_process,
)
from tools.bench.members import await_image
from tools.bench.pages import add_page_option, fmt_spread, spread, started, write_page
from tools.bench.report import fmt_rate, markdown_table
from tools.bench.user_loop import Consumer, write_count
from tools.polling import poll_until

CHANNEL = "aeron:ipc"
DIAGNOSIS_TERM = "16m"  # term-length of the diagnosis rows: a window of 8 MiB
STREAM = 1001
SIZE = 32
PUBLISHER_ID = 1
#: how often a wait for a program's READY or a connection looks again (not measured time)
WAIT_POLL_S = 0.002
#: the issue's targets: each Aeron row at least this share of the shmbus pair's msg/s, and an
#: attached idle Aeron client at most this many cores more of the idle driver
MIN_RATIO = 0.8
MAX_IDLE_ADDED_CORES = 0.01

SHM_SHM = "shmbus -> shmbus"
AERON_SHM = "Aeron C -> shmbus"
SHM_AERON = "shmbus -> Aeron C"
ROWS = (SHM_SHM, AERON_SHM, SHM_AERON)
DIAGNOSIS_ROWS = (SHM_SHM, AERON_SHM)
DEFAULT_TERM = "default"
#: each row's publisher and subscriber, as its table names them
ENDS = {SHM_SHM: ("shmbus publish()", "shmbus messages()"),
        AERON_SHM: ("aeron_publish", "shmbus messages()"),
        SHM_AERON: ("shmbus publish()", "aeron_subscribe")}


@dataclass(frozen=True)
class Settings:
    """How the measurements run (picklable: the members get parts of it)."""

    messages: int  # per throughput run: a whole number of rounds
    idle_s: float  # each half of the idle measurement
    timeout_s: float  # deadline of a run beyond what it should take
    root: Path  # a fresh bus directory per measurement under it
    aeron: AeronC


# ---------------------------------------------------------------------------------------------
# A C program beside a member
# ---------------------------------------------------------------------------------------------


class Child:
    """A C program started by a member (or the parent), its stdout in ``log`` (stderr in
    ``log``.err); with ``piped_stdin`` the member writes its go line (:meth:`go`)."""

    def __init__(self, command: Sequence[str], log: Path, piped_stdin: bool = False) -> None:
        self.name = Path(command[0]).name
        self.log = log
        with log.open("wb") as out, log.with_suffix(".err").open("wb") as err:
            self.process = subprocess.Popen(
                list(command), stdin=subprocess.PIPE if piped_stdin else subprocess.DEVNULL,
                stdout=out, stderr=err)
        self.cpu_at_start: float | None = None

    def output(self) -> str:
        """What the program printed to stdout so far."""
        return self.log.read_text(errors="replace")

    def errors(self) -> str:
        """The tail of what the program printed to stderr so far."""
        return self.log.with_suffix(".err").read_text(errors="replace")[-1000:]

    def wait_ready(self, deadline_ns: int) -> None:
        """Return once the program printed READY; BenchError if it exits first or does not
        by deadline_ns."""
        def ready() -> bool:
            if "READY\n" in self.output():
                return True
            if self.process.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.process.returncode} before "
                                 f"READY: {self.errors()}")
            return False
        if not poll_until(ready, (deadline_ns - time.monotonic_ns()) / 1e9, WAIT_POLL_S):
            raise BenchError(f"{self.name} not ready before the deadline: {self.errors()}")

    def start(self, go: bool = False) -> None:
        """The measurement starts: note the program's CPU so far; with ``go``, write the go
        line on its stdin (aeron_publish --await-go)."""
        self.cpu_at_start = cpu_seconds(self.process.pid)
        if go:
            assert self.process.stdin is not None
            self.process.stdin.write(b"go\n")
            self.process.stdin.flush()

    def finish(self, timeout_s: float) -> tuple[dict[str, Any], float | None]:
        """Wait for the program's end (SIGKILL after timeout_s: BenchError): its closing
        JSON summary, and the CPU seconds it spent since :meth:`start` (rusage at exit, all
        its threads; None if its CPU at the start could not be read). BenchError if it
        failed."""
        watchdog = threading.Timer(timeout_s, self.process.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(self.process.pid, 0)
        finally:
            watchdog.cancel()
        self.process.returncode = os.waitstatus_to_exitcode(status)
        if self.process.stdin is not None:
            self.process.stdin.close()
        lines = self.output().strip().splitlines()
        if self.process.returncode != 0 or not lines or not lines[-1].startswith("{"):
            raise BenchError(f"{self.name} exited with {self.process.returncode}: "
                             f"{self.errors() or self.output()[-500:]}")
        spent = None if self.cpu_at_start is None else (
            usage.ru_utime + usage.ru_stime - self.cpu_at_start)
        return json.loads(lines[-1]), spent

    def kill(self) -> None:
        """SIGKILL the program if it still runs, and reap it."""
        if self.process.returncode is None:
            stop_process(self.process, signal.SIGKILL, 5.0)
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()


@contextmanager
def _child(command: Sequence[str] | None, log: Path, piped_stdin: bool = False
           ) -> Iterator[Child | None]:
    """A Child for ``command`` (None: none) for the block, killed at its end if still there."""
    if command is None:
        yield None
        return
    child = Child(command, log, piped_stdin)
    try:
        yield child
    finally:
        child.kill()


def channel(term: str) -> str:
    """The channel of a row whose term is ``term`` (DEFAULT_TERM: the driver's)."""
    return CHANNEL if term == DEFAULT_TERM else f"{CHANNEL}?term-length={term}"


def publish_command(aeron: AeronC, bus_dir: str, uri: str, messages: int, timeout_s: float
                    ) -> list[str]:
    """aeron_publish's command line: ``messages`` checked messages, exclusive, after go."""
    return [str(aeron.publish), "--dir", bus_dir, "--channel", uri, "--stream", str(STREAM),
            "--count", str(messages), "--length", str(SIZE), "--publisher-id",
            str(PUBLISHER_ID), "--exclusive", "--await-go", "--timeout-s",
            str(int(timeout_s) + 1)]


def subscribe_command(aeron: AeronC, bus_dir: str, uri: str, messages: int, await_images: int,
                      timeout_s: float) -> list[str]:
    """aeron_subscribe's command line: ``messages`` of PUBLISHER_ID expected, READY once it
    has ``await_images`` images."""
    return [str(aeron.subscribe), "--dir", bus_dir, "--channel", uri, "--stream",
            str(STREAM), "--expect", f"{PUBLISHER_ID}:{messages}", "--await-images",
            str(await_images), "--timeout-s", str(int(timeout_s) + 1)]


def idle_subscriber_command(aeron: AeronC, bus_dir: str) -> list[str]:
    """aeron_subscribe's command line for an idle client: subscribed to STREAM (nobody
    publishes it), polling until SIGTERM (--until-stopped)."""
    return [str(aeron.subscribe), "--dir", bus_dir, "--channel", CHANNEL, "--stream",
            str(STREAM), "--until-stopped"]


# ---------------------------------------------------------------------------------------------
# Members: shmbus's side, each with its C peer as a child where the row has one
# ---------------------------------------------------------------------------------------------


def shm_writer(start: Any, context: Any, uri: str, messages: int,
               subscriber: list[str] | None, log: str, timeout_s: float,
               done: Any) -> dict[str, Any]:
    """``publish()`` each checked message (user_loop.write_count), to the reader member
    (``subscriber`` None: keep the publication until ``done``) or to the aeron_subscribe
    child started from ``subscriber`` (wait for its end, take its summary)."""
    import shmbus

    rounds = AeronRounds(SIZE, PUBLISHER_ID)
    with shmbus.connect(context) as bus, _child(subscriber, Path(log)) as child:
        deadline = deadline_after(timeout_s)
        publication = bus.add_exclusive_publication(uri, STREAM)
        if child is not None:
            child.wait_ready(deadline)  # it has this publication's image
        if not poll_until(lambda: publication.is_connected,
                          (deadline - time.monotonic_ns()) / 1e9, WAIT_POLL_S):
            raise BenchError(f"publication on {uri} stream {STREAM} never connected")
        start.ready(bus.driver_pid)
        if child is not None:
            child.start()
        out = write_count(publication.publish, rounds, messages // rounds.count)
        if child is None:
            done.wait(timeout_s)  # keep the publication until the reader has everything
            return out
        summary, cpu_s = child.finish(timeout_s)
    return {**out, "peer": summary, "peer_cpu_s": cpu_s}


def shm_reader(start: Any, context: Any, uri: str, messages: int,
               publisher: list[str] | None, log: str, timeout_s: float,
               done: Any) -> dict[str, Any]:
    """``for m in sub.messages(): consume(m)`` (user_loop.Consumer) over ``messages``
    messages, from the writer member (``publisher`` None) or from the aeron_publish child
    started from ``publisher`` (its go line written once every process is ready; then wait
    for its end and take its summary)."""
    import shmbus

    consumer = Consumer(AeronRounds(SIZE, PUBLISHER_ID))
    with shmbus.connect(context) as bus, _child(publisher, Path(log), True) as child:
        deadline = deadline_after(timeout_s)
        subscription = bus.add_subscription(uri, STREAM)
        if child is not None:
            child.wait_ready(deadline)  # its publication connected to this subscription
        await_image(subscription, deadline)
        start.ready(bus.driver_pid)
        if child is not None:
            child.start(go=True)
        consumer.read(itertools.islice(subscription.messages(timeout=timeout_s), messages))
        t1 = time.monotonic_ns()
        done.set()
        peer = child.finish(timeout_s) if child is not None else None
    out = {**consumer.result(t1)}
    if peer is not None:
        out["peer"], out["peer_cpu_s"] = peer
    return out


# ---------------------------------------------------------------------------------------------
# The parent: one measurement each
# ---------------------------------------------------------------------------------------------

_run_ids = itertools.count(1)


@contextmanager
def driver_process(s: Settings) -> Iterator[tuple[Any, Any]]:
    """A fresh bus directory and its driver process (default settings; no idle exit, so the
    idle measurement can leave it without a client), for the block: (context, process)."""
    import shmbus

    bus_dir = s.root / f"run{next(_run_ids)}"
    context = shmbus.Context(dir=str(bus_dir), embedded_driver=False,
                             driver_idle_timeout=3600.0)
    driver = start_driver(context)
    try:
        yield context, driver
    finally:
        stop_driver(driver)
        shutil.rmtree(bus_dir, ignore_errors=True)


def throughput(ctx: Any, row: str, term: str, s: Settings) -> dict[str, Any]:
    """One run of ``row`` with the channel's ``term``: msg/s, CPU seconds per million
    messages by process and in all, messages checked; BenchError if one was lost, reordered
    or corrupted."""
    done = ctx.Event()
    uri = channel(term)
    with driver_process(s) as (context, _):
        log = str(Path(context.dir).parent / f"{Path(context.dir).name}-peer.log")
        members = []
        if row in (SHM_SHM, AERON_SHM):
            publisher = (publish_command(s.aeron, context.dir, uri, s.messages, s.timeout_s)
                         if row == AERON_SHM else None)
            members.append(Member("reader", shm_reader, (context, uri, s.messages, publisher,
                                                         log, s.timeout_s, done)))
        if row in (SHM_SHM, SHM_AERON):
            subscriber = (subscribe_command(s.aeron, context.dir, uri, s.messages, 1,
                                            s.timeout_s) if row == SHM_AERON else None)
            members.append(Member("writer", shm_writer, (context, uri, s.messages, subscriber,
                                                         log, s.timeout_s, done)))
        out = run_processes(ctx, members, s.timeout_s * 2)
    return throughput_row(row, out, s.messages)


def throughput_row(row: str, out: Outcome, messages: int) -> dict[str, Any]:
    """The figures of one run of ``row`` from its members' results (see throughput)."""
    results = out.results
    if row == SHM_AERON:
        peer = results["writer"]["peer"]
        if not peer["ok"] or peer["messages"] != messages or peer["errors"]:
            raise BenchError(f"aeron_subscribe: {peer['messages']} of {messages}: "
                             f"{peer['error']}")
        t0, t1, checked = results["writer"]["t0"], int(peer["last_message_at"] * 1e9), messages
    else:
        reader = results["reader"]
        if reader["errors"] or reader["received"] != messages:
            raise BenchError(f"reader: {reader['received']} of {messages} in order, "
                             f"{reader['errors']} bad; first: {reader['first_bad']}")
        if row == AERON_SHM:
            peer = reader["peer"]
            if not peer["ok"] or peer["sent"] != messages:
                raise BenchError(f"aeron_publish sent {peer['sent']} of {messages}")
            t0 = int(peer["first_offer_at"] * 1e9)
        else:
            t0 = results["writer"]["t0"]
        t1, checked = reader["t1"], reader["received"]
    cpu = {label: None if c is None else c * out.wall_s for label, c in out.cores.items()}
    if row == AERON_SHM:
        cpu["writer"] = results["reader"]["peer_cpu_s"]
    elif row == SHM_AERON:
        cpu["reader"] = results["writer"]["peer_cpu_s"]
    by_end = {"publisher": cpu["writer"], "subscriber": cpu["reader"],
              "driver": cpu.get("driver")}
    per_million = {k: None if v is None else v / messages * 1e6 for k, v in by_end.items()}
    known = [v for v in per_million.values() if v is not None]
    return {"msgs_per_s": messages / ((t1 - t0) / 1e9), "messages": messages,
            "checked": checked, "errors": 0,
            "publisher_cpu_s_per_m": per_million["publisher"],
            "subscriber_cpu_s_per_m": per_million["subscriber"],
            "driver_cpu_s_per_m": per_million["driver"],
            "all_cpu_s_per_m": sum(known) if len(known) == 3 else None}


def idle(s: Settings) -> dict[str, Any]:
    """The driver with no client for s.idle_s, then with one idle Aeron client attached for
    s.idle_s: the driver's cores in each, their difference, and the client's own cores."""
    with driver_process(s) as (context, driver):
        no_client = _cores(driver.pid, s.idle_s)
        log = Path(context.dir).parent / f"{Path(context.dir).name}-idle.log"
        with _child(idle_subscriber_command(s.aeron, context.dir), log) as child:
            assert child is not None
            child.wait_ready(deadline_after(s.timeout_s))
            client_before = cpu_seconds(child.process.pid)
            t0 = time.monotonic()
            attached = _cores(driver.pid, s.idle_s)
            client_after = cpu_seconds(child.process.pid)
            if child.process.poll() is not None:
                raise BenchError(f"the idle Aeron client exited with "
                                 f"{child.process.returncode}: {child.errors()}")
            client = (None if client_before is None or client_after is None
                      else (client_after - client_before) / (time.monotonic() - t0))
            child.process.send_signal(signal.SIGTERM)
            summary, _ = child.finish(s.timeout_s)
            if summary["messages"] != 0:
                raise BenchError(f"the idle Aeron client read {summary['messages']} messages")
    return {"driver_no_client_cores": no_client, "driver_aeron_client_cores": attached,
            "added_cores": attached - no_client, "aeron_client_cores": client, "errors": 0}


def _cores(pid: int, seconds: float) -> float:
    """The cores process ``pid`` uses over the next ``seconds`` (it is the measurement, so
    this process sleeps through it); BenchError if the process is gone."""
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    after, wall = cpu_seconds(pid), time.monotonic() - t0
    if before is None or after is None:
        raise BenchError(f"process {pid} is gone")
    return (after - before) / wall


def plan(ctx: Any, s: Settings) -> list[Measurement]:
    """Every measurement as (its key fields, a thunk that runs it once)."""
    rows = [*((row, DEFAULT_TERM) for row in ROWS),
            *((row, DIAGNOSIS_TERM) for row in DIAGNOSIS_ROWS)]
    out: list[Measurement] = [({"test": "throughput", "row": row, "term": term},
                               lambda row=row, term=term: throughput(ctx, row, term, s))
                              for row, term in rows]
    out.append(({"test": "idle", "row": "driver", "term": DEFAULT_TERM}, lambda: idle(s)))
    return out


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def add_ratios(rows: list[dict[str, Any]], runs: list[list[dict[str, Any]]]) -> None:
    """On each Aeron row: ``x_shmbus``, its median msg/s over the shmbus pair's at the same
    term, and ``x_shmbus_runs``, the ratio run by run (the rows of one run are interleaved).
    ``runs``: each row's runs, in the order of ``rows``."""
    for r, its_runs in zip(rows, runs, strict=True):
        if r["test"] != "throughput" or r["row"] == SHM_SHM:
            continue
        i = next(i for i, b in enumerate(rows)
                 if b["test"] == "throughput" and b["row"] == SHM_SHM and b["term"] == r["term"])
        base, base_runs = rows[i], runs[i]
        if r["status"] == "ok" and base["status"] == "ok":
            r["x_shmbus"] = r["msgs_per_s"] / base["msgs_per_s"]
            r["x_shmbus_runs"] = [a["msgs_per_s"] / b["msgs_per_s"]
                                  for a, b in zip(its_runs, base_runs, strict=True)
                                  if a["status"] == b["status"] == "ok"]


def _status(row: dict[str, Any]) -> str | None:
    if row["status"] == "ok":
        return None
    reason = str(row["error"]).strip().splitlines()[0]
    return f"{'n/a' if row['status'] == 'n/a' else 'FAILED'}: {reason}"


def _samples(row: dict[str, Any], key: str) -> list[float | None]:
    return row.get("samples", {}).get(key, [row.get(key)])


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def throughput_table(rows: list[dict[str, Any]], term: str) -> str:
    """The throughput rows of ``term``: msg/s (median and spread), over the shmbus pair's,
    CPU seconds per million messages by process and in all, messages checked."""
    window = "term 1 MiB, window 512 KiB" if term == DEFAULT_TERM else (
        f"term {term[:-1]} MiB, window {int(term[:-1]) // 2} MiB")
    headers = [f"32 B, {window}", "publisher", "subscriber",
               "msg/s (lowest-highest)", "x shmbus pair; run by run (lowest-highest)",
               "CPU s per M msgs: publisher / subscriber / driver", "all", "checked"]
    lines = []
    for r in rows:
        if r["test"] != "throughput" or r["term"] != term:
            continue
        named = [r["row"], *ENDS[r["row"]]]
        status = _status(r)
        if status is not None:
            lines.append([*named, status, "", "", "", ""])
            continue
        ratio = "1" if r["row"] == SHM_SHM else (
            "-" if "x_shmbus" not in r else
            f"{r['x_shmbus']:.2f}; {fmt_spread(spread(r['x_shmbus_runs']), _two)}")
        lines.append([*named, fmt_spread(spread(_samples(r, "msgs_per_s")), fmt_rate), ratio,
                      " / ".join(_cpu(r[f"{end}_cpu_s_per_m"])
                                 for end in ("publisher", "subscriber", "driver")),
                      _cpu(r["all_cpu_s_per_m"]), f"{r['checked']:,} of {r['messages']:,}"])
    return markdown_table(headers, lines, (3, 4, 5, 6, 7))


def _two(value: float) -> str:
    return f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def idle_table(rows: list[dict[str, Any]]) -> str:
    headers = ["the driver, idle", "driver CPU (lowest-highest)", "the Aeron client's own CPU"]
    lines = []
    for r in rows:
        if r["test"] != "idle":
            continue
        status = _status(r)
        if status is not None:
            lines.append(["idle", status, ""])
            continue
        lines += [
            ["no client", fmt_spread(spread(_samples(r, "driver_no_client_cores")), _percent),
             ""],
            ["one idle Aeron client attached (aeron_subscribe, nothing published)",
             fmt_spread(spread(_samples(r, "driver_aeron_client_cores")), _percent),
             fmt_spread(spread(_samples(r, "aeron_client_cores")), _percent)],
            ["added by the Aeron client",
             fmt_spread(spread(_samples(r, "added_cores")), _percent), ""]]
    return markdown_table(headers, lines, (1, 2))


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, each PASS or FAIL with its figure (or n/a)."""
    out = []
    for name in (AERON_SHM, SHM_AERON):
        r = next(r for r in rows if r["row"] == name and r["term"] == DEFAULT_TERM)
        ratio = r.get("x_shmbus")
        wide = next((r.get("x_shmbus") for r in rows
                     if r["row"] == name and r["term"] == DIAGNOSIS_TERM), None)
        out.append(f"* {name} at least {MIN_RATIO}x the shmbus pair's msg/s: " + (
            "n/a" if ratio is None else
            f"{'PASS' if ratio >= MIN_RATIO else 'FAIL'} ({ratio:.2f}x" + (
                "" if wide is None else
                f"; {wide:.2f}x with a {DIAGNOSIS_TERM[:-1]} MiB term, see the diagnosis") + ")"))
    r = next(r for r in rows if r["test"] == "idle")
    added = r.get("added_cores") if r["status"] == "ok" else None
    out.append(f"* an attached idle Aeron client adds at most {MAX_IDLE_ADDED_CORES:.0%} of a "
               f"core to the idle driver: " + (
                   "n/a" if added is None else
                   f"{'PASS' if added <= MAX_IDLE_ADDED_CORES else 'FAIL'} ({added:.2%})"))
    return out


NOTES = f"""\
* One driver process per measurement (`python -m shmbus.driver`, default settings: IPC term
  1 MiB, window half a term, mtu 1408), a fresh bus directory, `{CHANNEL}`, one exclusive
  publication, 32-byte messages in the checked format of the C programs
  (tools/aeron_c/message.py: publisher id, length, sequence number, CRC-32 of the payload, a
  payload pattern).
* shmbus's side is the user's loop (tools/bench/user_loop.py): `pub.publish(message)` per
  message; `for m in sub.messages(): consume(m)`, `consume` checking each message's sequence
  number and length and comparing every byte of each round of messages with the round it
  computes. Rows 1 and 2 read with the same loop over the same messages.
* Aeron C: `aeron_publish --exclusive` (`aeron_exclusive_publication_offer`, retried after a
  sleep of 1 us doubling to 1 ms while refused) and `aeron_subscribe`
  (`aeron_subscription_poll` with Aeron's fragment assembler, 64 fragments a poll, a sleep of
  1 us doubling to 1 ms after an empty poll; every message checked in C: length, CRC, every
  payload byte, sequence), tools/aeron_c/c/, on Aeron's C client from the pyaeron 0.1.0
  sdist (`make aeron-c`).
* msg/s: messages over the time from the writer's first send to the reader's last message
  (CLOCK_MONOTONIC in every process). x shmbus pair: the row's median over the shmbus
  pair's at the same term; then the same ratio run by run (each run's rows are interleaved),
  its median and spread.
* CPU s per M msgs: CPU seconds (user + system, all threads) of each process from the start
  of the measurement to its end, over the messages, times a million.
* Diagnosis: rows 1 and 2 with `term-length={DIAGNOSIS_TERM}` on the channel. A shmbus
  publisher raises its own limit at memory speed and wakes a sleeping reader itself; an Aeron
  publisher does neither. shmbus's readers of a log an Aeron client writes raise its limit as
  they store their positions (the driver marks the log; shmbus/shm/native/flow_control.c,
  fc_raise_for_writer), so the limit follows them as they read, not the driver's cycle; but a
  reader that caught up and sleeps is woken only by the driver's cycle, every 1 ms while an
  Aeron client's stream moves (shmbus/driver/aeron_client_streams.py). With the default
  window of 512 KiB (8,192 messages of 32 B, 64 B a frame) a cycle that comes late leaves the
  reader asleep and the publisher at its limit; a window of 8 MiB outlasts it.
* Idle: the same driver, {{idle}} s with no client, then {{idle}} s with one Aeron client attached
  (`aeron_subscribe --until-stopped` subscribed to a stream nobody publishes, polling with its
  back-off up to 1 ms): the driver's CPU in % of a core; the client's own CPU beside it."""


def report_markdown(rows: list[dict[str, Any]], runs: int, s: Settings) -> str:
    """The report's body: the settings, the targets, the tables, what each row does."""
    return "\n".join([
        f"Median and spread (lowest-highest) of {runs} runs, interleaved; {s.messages:,} "
        f"messages per throughput run, {s.idle_s:g} s per idle half.", "",
        "## Targets", "", *targets(rows), "",
        "## Throughput", "", throughput_table(rows, DEFAULT_TERM), "",
        "## Idle driver", "", idle_table(rows), "",
        "## Diagnosis: a larger window", "", throughput_table(rows, DIAGNOSIS_TERM), "",
        "## What each row does", "", NOTES.replace("{idle}", f"{s.idle_s:g}")])


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke pass: 1 run, 4,096 messages, 0.3 s per idle half")
    parser.add_argument("--runs", type=run_count, default=5,
                        help="runs of each measurement, interleaved; the median and the spread "
                             "are reported (default 5)")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages per throughput run, rounded up to whole rounds of "
                             "2,048 (default 3,000,000; --quick 4,096)")
    parser.add_argument("--idle", type=float, default=None,
                        help="seconds of each half of the idle measurement (default 10; "
                             "--quick 0.3)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="deadline of each run, seconds (default 60)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="write the rows (with every run's figures) as JSON to PATH")
    add_page_option(parser)
    args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        aeron = build_programs()
    except AeronCNotBuilt as e:
        print(e, file=sys.stderr)
        return 2
    runs = 1 if args.quick else args.runs
    count = AeronRounds(SIZE, PUBLISHER_ID).count
    wanted = args.messages or (4096 if args.quick else 3_000_000)
    setting = started(argv)
    root = Path(tempfile.mkdtemp(prefix="shmbus-bench-aeron-",
                                 dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    s = Settings(messages=-(-wanted // count) * count,
                 idle_s=args.idle if args.idle is not None else 0.3 if args.quick else 10.0,
                 timeout_s=args.timeout, root=root, aeron=aeron)
    measurements = plan(mp.get_context("spawn"), s)
    print(f"Aeron's C client on the shmbus driver: {len(measurements)} measurements x {runs} "
          f"runs; progress on stderr", file=sys.stderr, flush=True)
    try:
        results = run_interleaved(measurements, runs, _progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [median_row(r) for r in results]
    add_ratios(rows, results)
    markdown = report_markdown(rows, runs, s)
    print(markdown)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "messages": s.messages,
                                         "idle_s": s.idle_s, "rows": rows}, indent=2) + "\n")
    if args.page:
        write_page(args.page, "aeron_clients",
                   "Aeron's C client on the shmbus driver: tools/bench/aeron_clients.py",
                   "tools.bench.aeron_clients", setting, markdown)
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def _progress(row: dict[str, Any]) -> None:
    what = f"  {row['test']:10s} {row['row']:20s} term {row['term']:8s}"
    if row["status"] != "ok":
        print(f"{what}: {_status(row)}", file=sys.stderr, flush=True)
    elif row["test"] == "throughput":
        print(f"{what}: {row['msgs_per_s']:,.0f} msg/s, CPU s per M msgs: publisher "
              f"{_cpu(row['publisher_cpu_s_per_m'])}, subscriber "
              f"{_cpu(row['subscriber_cpu_s_per_m'])}, driver {_cpu(row['driver_cpu_s_per_m'])}",
              file=sys.stderr, flush=True)
    else:
        print(f"{what}: driver {row['driver_no_client_cores']:.2%} with no client, "
              f"{row['driver_aeron_client_cores']:.2%} with an idle Aeron client",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

