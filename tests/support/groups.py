"""Subscription groups across processes (shmbus/streams/subscription_group.py): the records
members keep of the tasks they were handed (tests/support/workers/group_workers.py), the waits
on them and the rule a killed member must keep."""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shmbus
from shmbus.shm.counters import GROUP_MEMBERS, GROUP_REDELIVERED
from tests.support.processes import CTX
from tests.support.waits import wait_until
from tests.support.workers import group_workers as gw

#: the stream of the subscription group tests
STREAM = 4001


def read_records(paths: list[Path]) -> dict[Path, list[tuple[int, int]]]:
    """The (publisher, seq) of every task each member recorded, by the member's file."""
    records = {}
    for path in paths:
        data = path.read_bytes() if path.exists() else b""
        size = len(data) - len(data) % gw.RECORD.size
        records[path] = [gw.RECORD.unpack_from(data, i) for i in range(0, size, gw.RECORD.size)]
    return records


def wait_for_tasks(paths: list[Path], expected: set[tuple[int, int]], timeout: float,
                   processes: list[Any]) -> dict[Path, list[tuple[int, int]]]:
    """Wait until every expected task has been recorded by some member; the records."""
    def every_task_handed() -> dict[Path, list[tuple[int, int]]] | None:
        records = read_records(paths)
        done = {task for tasks in records.values() for task in tasks}
        return records if expected <= done else None

    def left() -> str:
        done = {task for tasks in read_records(paths).values() for task in tasks}
        return (f"the last {len(expected - done)} of {len(expected)} tasks to be handed out; "
                f"exit codes {[p.exitcode for p in processes]}")

    return wait_until(every_task_handed, timeout, left, longest_pause=0.05)


def collect(results: Any, count: int, timeout: float) -> list[dict[str, Any]]:
    """``count`` reports from the queue ``results`` within ``timeout`` seconds."""
    reports = []
    deadline = time.monotonic() + timeout
    while len(reports) < count:
        try:
            reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            pytest.fail(f"{len(reports)} of {count} reports within {timeout} s")
    return reports


def counter_values(bus: shmbus.Client, type_id: int) -> list[int]:
    """The values of the bus's counters of ``type_id``."""
    return [c.value for c in bus.counters.counters() if c.type_id == type_id]


def all_tasks(publishers: int, tasks: int) -> set[tuple[int, int]]:
    """Every (publisher, seq) of ``publishers`` publishing ``tasks`` tasks each."""
    return {(p, s) for p in range(publishers) for s in range(tasks)}


def finish(stop: Any, results: Any, processes: list[Any], reports_expected: int
           ) -> list[dict[str, Any]]:
    """Stop the members and publishers (the Event ``stop``), take their reports, join them;
    no report names an error."""
    stop.set()
    reports = collect(results, reports_expected, 60)
    for process in processes:
        process.join(30)
    errors = [e for r in reports for e in r.get("errors", [])]
    assert errors == []
    return reports


def redelivered_once_members_are(context: shmbus.Context, members: int) -> list[int]:
    """Wait (10 s at most) until the group has ``members`` members (the driver timed a killed
    one's client out); then the group's redelivered counters."""
    with shmbus.connect(context) as bus:
        wait_until(lambda: counter_values(bus, GROUP_MEMBERS) == [members], 10,
                   lambda: f"{members} members (members: {counter_values(bus, GROUP_MEMBERS)})")
        return counter_values(bus, GROUP_REDELIVERED)


def assert_only_the_task_in_hand_went_twice(
        records: dict[Path, list[tuple[int, int]]], expected: set[tuple[int, int]],
        in_hand: tuple[int, int], victim: Path, victim_tasks: int,
        redelivered: list[int]) -> None:
    """The rule: a task is done once its handler returns; a victim killed inside the handler
    of the task in its hand leaves that task, and only it, to go to another member too."""
    handed = collections.Counter(t for tasks_ in records.values() for t in tasks_)
    assert set(handed) == expected, "a task was lost"
    twice = {task for task, n in handed.items() if n > 1}
    assert twice == {in_hand} and handed[in_hand] == 2
    assert len(records[victim]) == victim_tasks
    # what was handed on: the task in hand and the rest of the victim's claim
    assert redelivered and redelivered[0] >= 1


def start_group(start_process: Callable[..., Any], contexts: tuple[shmbus.Context,
                                                                   shmbus.Context],
                tmp_path: Path, *, members: int, publishers: int, tasks: int,
                lengths: tuple[int, int], channel: str = gw.CHANNEL, fragment_limit: int = 16,
                options: dict[int, dict[str, Any]] | None = None, **publisher_options: Any,
                ) -> tuple[Any, Any, list[Path], list[Any], list[Any]]:
    """Start ``members`` members on the bus of ``contexts[1]`` (waiting until each joined;
    ``options`` by member index), then ``publishers`` publishers of ``tasks`` tasks each on
    the bus of ``contexts[0]`` (the same bus for IPC), all on ``channel``: (the stop Event,
    the results queue, the members' record files, the members, the publishers)."""
    publishing, working = contexts
    stop, results = CTX.Event(), CTX.Queue()
    paths = [tmp_path / f"member-{i}.rec" for i in range(members)]
    processes = []
    for i, path in enumerate(paths):
        joined = CTX.Event()
        processes.append(start_process(gw.work, working, STREAM, "workers", str(path), stop,
                                       lengths, results, fragment_limit=fragment_limit,
                                       joined=joined, channel=channel,
                                       **(options or {}).get(i, {})))
        assert joined.wait(30), f"member {i} did not join"
    publisher_processes = [start_process(gw.publish, publishing, STREAM, p, tasks, lengths,
                                         results, stop, channel=channel, **publisher_options)
                           for p in range(publishers)]
    return stop, results, paths, processes, publisher_processes


def assert_each_task_once_in_order(records: dict[Path, list[tuple[int, int]]],
                                   reports: list[dict[str, Any]], publishers: int,
                                   tasks: int) -> None:
    """Every task of every publisher was handed to exactly one member (by the members'
    records and by their reports), and within one member each publisher's tasks came in
    publication order."""
    handed = collections.Counter(t for tasks_ in records.values() for t in tasks_)
    assert set(handed) == all_tasks(publishers, tasks)
    assert max(handed.values()) == 1, "a task was handed to two members"
    assert sum(r["tasks"] for r in reports if "tasks" in r) == publishers * tasks
    for tasks_ in records.values():
        for p in range(publishers):
            seqs = [s for q, s in tasks_ if q == p]
            assert seqs == sorted(seqs)


#: how long a publisher's offers must all be refused before it counts as held
HELD_FOR_S = 1.0


def offer_until_held(publication: Any, lengths: tuple[int, int], first: int,
                     timeout: float) -> int:
    """Offer publisher 0's tasks from ``first`` on until every offer for ``HELD_FOR_S``
    seconds was refused (the check's window: the flow control holds the publication); the
    next task's seq. Fails the test if it was not held within ``timeout`` seconds."""
    seq, deadline = first, time.monotonic() + timeout
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < HELD_FOR_S:
        assert time.monotonic() < deadline, (
            f"the publication was not held: {seq - first} tasks taken in {timeout:g} s")
        if publication.offer(gw.make_task(0, seq, lengths)) > 0:
            seq += 1
            quiet_since = time.monotonic()
        else:
            time.sleep(0.01)  # a pause between refused offers, within the window
    return seq


def start_slow_and_fast(start_process: Callable[..., Any], context: shmbus.Context,
                        publication: Any, lengths: tuple[int, int], tmp_path: Path,
                        channel: str = gw.CHANNEL) -> tuple[Any, Any, Any, list[Path], list[Any]]:
    """Start two members on the bus of ``context``: a slow one that alone gets task 0 (of
    ``publication``, on ``channel``) and holds it, and its claim, unfinished until the release
    Event is set, then a fast one: (stop, release, results, their record files, the two)."""
    stop, release, holding, results = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Queue()
    paths = [tmp_path / "slow.rec", tmp_path / "fast.rec"]
    processes = []
    for path, options in zip(paths, ({"hold_at": 1, "holding": holding, "release": release,
                                      "fragment_limit": 4}, {}), strict=True):
        joined = CTX.Event()
        processes.append(start_process(gw.work, context, STREAM, "workers", str(path), stop,
                                       lengths, results, joined=joined, channel=channel,
                                       **options))
        assert joined.wait(30)
        if not holding.is_set():
            wait_until(lambda: publication.offer(gw.make_task(0, 0, lengths)) >= 0, 30,
                       "the publication to take task 0")
            assert holding.wait(30)
    return stop, release, results, paths, processes
